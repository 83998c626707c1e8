-- Whether a row holds every entry its saga's status counts (decisions/archive.py): true for every
-- row this release writes; NULL for a row an earlier release wrote, until checked at start or by
-- `undolog archive check`; false for one found partial whose saga is gone (reported, kept).
ALTER TABLE undolog_sagas ADD COLUMN whole boolean;
CREATE INDEX undolog_sagas_not_whole ON undolog_sagas (uid) WHERE whole IS NOT TRUE;
