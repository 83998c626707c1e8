-- Finished sagas with their entries (jsonb, as the API had them) and the columns history is searched by.
CREATE TABLE undolog_sagas (
    uid uuid PRIMARY KEY,
    namespace text NOT NULL,
    name text NOT NULL,
    phase text NOT NULL,
    reason text,
    message text,
    failure text,
    org text,
    functions text[] NOT NULL DEFAULT '{}',
    failed_step text,
    created_at timestamptz,
    started_at timestamptz,
    finished_at timestamptz NOT NULL,
    labels jsonb NOT NULL DEFAULT '{}',
    revision bigint NOT NULL,
    entries_revision bigint NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now(),
    saga jsonb NOT NULL,
    entries jsonb NOT NULL
);
CREATE INDEX undolog_sagas_by_namespace ON undolog_sagas (namespace, finished_at DESC, uid);
CREATE INDEX undolog_sagas_by_name ON undolog_sagas (namespace, name, finished_at DESC);
CREATE INDEX undolog_sagas_by_phase ON undolog_sagas (phase, finished_at DESC);
CREATE INDEX undolog_sagas_by_org ON undolog_sagas (org, finished_at DESC) WHERE org IS NOT NULL;
CREATE INDEX undolog_sagas_by_failed_step ON undolog_sagas (failed_step) WHERE failed_step IS NOT NULL;
CREATE INDEX undolog_sagas_by_function ON undolog_sagas USING gin (functions);
CREATE INDEX undolog_sagas_by_label ON undolog_sagas USING gin (labels jsonb_path_ops);
CREATE INDEX undolog_sagas_by_finish ON undolog_sagas (finished_at);

-- The Events the operator emitted about a saga and its entries, captured as emitted.
CREATE TABLE undolog_events (
    saga_uid uuid NOT NULL,
    sequence bigint NOT NULL,
    at timestamptz NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    reason text NOT NULL,
    message text NOT NULL,
    warning boolean NOT NULL,
    PRIMARY KEY (saga_uid, sequence)
);
CREATE INDEX undolog_events_by_time ON undolog_events (at);
