"""The operator: kopf watches feed one driver per saga, which applies the pure decisions.

ledger: conditional reads and writes of Sagas and UndoEntries. timeline: Kubernetes Events.
compensation: one entry's undo over HTTP. driver: one saga's loop. engine: the drivers.
main: kopf wiring and the `undolog operator` process.
"""
