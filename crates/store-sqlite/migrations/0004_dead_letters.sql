-- Version 4: dead letters (K-17.2), one row per dead-lettered step, keyed by the caller's
-- id (the step's idempotency key). What is queried is a real column; the error, the
-- recorded inputs and the decision are JSON text in the kernel types' own serde form.

CREATE TABLE dead_letters (
    id            TEXT PRIMARY KEY NOT NULL,
    workflow_id   TEXT NOT NULL,
    workflow_type TEXT NOT NULL,
    step          TEXT NOT NULL,
    step_index    INTEGER NOT NULL CHECK (step_index >= 0),
    run           INTEGER NOT NULL CHECK (run >= 0),
    epoch         INTEGER NOT NULL CHECK (epoch >= 0),
    error         TEXT NOT NULL,
    inputs        TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('open', 'decided', 'closed')),
    decision      TEXT,
    closed_at     INTEGER,
    CHECK ((status = 'open') = (decision IS NULL)),
    CHECK ((status = 'closed') = (closed_at IS NOT NULL))
) STRICT;

-- list with a status filter, paged by id.
CREATE INDEX dead_letters_status_id ON dead_letters (status, id);
-- purge_closed: closed rows by closed_at.
CREATE INDEX dead_letters_closed_at ON dead_letters (closed_at) WHERE status = 'closed';
-- a workflow's dead letters (operator views).
CREATE INDEX dead_letters_workflow_id ON dead_letters (workflow_id);
