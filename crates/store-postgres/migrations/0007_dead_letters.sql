-- Version 7: dead letters (K-17.2), one row per dead-lettered step, keyed by the caller's
-- id (the step's idempotency key). What is queried is a real column; the error, the
-- recorded inputs and the decision are jsonb in the kernel types' own serde form.

CREATE TABLE {schema}.dead_letters (
    id            text COLLATE "C" PRIMARY KEY,
    workflow_id   text COLLATE "C" NOT NULL,
    workflow_type text COLLATE "C" NOT NULL,
    step          text COLLATE "C" NOT NULL,
    step_index    bigint NOT NULL,
    run           bigint NOT NULL,
    epoch         bigint NOT NULL,
    error         jsonb NOT NULL,
    inputs        jsonb NOT NULL,
    created_at    bigint NOT NULL,
    status        text NOT NULL CHECK (status IN ('open', 'decided', 'closed')),
    decision      jsonb,
    closed_at     bigint,
    CHECK ((status = 'open') = (decision IS NULL)),
    CHECK ((status = 'closed') = (closed_at IS NOT NULL))
);

-- list with a status filter, paged by id.
CREATE INDEX dead_letters_status_id ON {schema}.dead_letters (status, id);
-- purge_closed: closed rows by closed_at.
CREATE INDEX dead_letters_closed_at ON {schema}.dead_letters (closed_at) WHERE status = 'closed';
-- a workflow's dead letters (operator views).
CREATE INDEX dead_letters_workflow_id ON {schema}.dead_letters (workflow_id);
