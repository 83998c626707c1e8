"""The operator: each shard's informer feeds one driver per saga, which applies the pure decisions.

informer: a shard's watches and what subscribed to them. engine: a shard led or followed.
driver: one saga's loop. compensation: one entry's undo. timeline: Kubernetes Events.
main: the wiring and the `undolog operator` process.
"""
