-- Version 8: human tasks (K-17.5), one row per task, keyed by the caller's id (the step's
-- idempotency key and the escalation level). What is queried is a real column: the roles
-- a text[] (eligibility is `assignee = actor OR roles && actor roles`), the evidence and
-- the decision jsonb in the kernel types' own serde form. `decided_at` and
-- `sensitive_text` are derived from the decision, for the retention purge of sensitive
-- reasons.

CREATE TABLE {schema}.task_inbox (
    id             text COLLATE "C" PRIMARY KEY,
    workflow_id    text COLLATE "C" NOT NULL,
    workflow_type  text COLLATE "C" NOT NULL,
    step           text COLLATE "C" NOT NULL,
    level          bigint NOT NULL CHECK (level >= 0),
    title          text NOT NULL,
    assignee       text COLLATE "C",
    roles          text[] COLLATE "C" NOT NULL,
    evidence       jsonb NOT NULL,
    token          text COLLATE "C" NOT NULL,
    created_at     bigint NOT NULL,
    due_at         bigint NOT NULL,
    status         text NOT NULL CHECK (status IN ('open', 'decided', 'closed')),
    decision       jsonb,
    closed_at      bigint,
    decided_at     bigint GENERATED ALWAYS AS ((decision ->> 'decided_at')::bigint) STORED,
    sensitive_text boolean GENERATED ALWAYS AS (
        coalesce((decision -> 'reason' ->> 'sensitive')::boolean
                 AND jsonb_typeof(decision -> 'reason' -> 'text') = 'string', false)) STORED,
    CHECK (status <> 'open' OR decision IS NULL),
    CHECK (status <> 'decided' OR decision IS NOT NULL),
    CHECK ((status = 'closed') = (closed_at IS NOT NULL))
);

-- list_open: the open tasks, paged by id (eligibility filters the rows of the range).
CREATE INDEX task_inbox_status_id ON {schema}.task_inbox (status, id);
-- purge_closed: closed rows by closed_at.
CREATE INDEX task_inbox_closed_at ON {schema}.task_inbox (closed_at) WHERE status = 'closed';
-- purge_sensitive_reasons: decisions still holding a sensitive reason's text.
CREATE INDEX task_inbox_sensitive ON {schema}.task_inbox (decided_at) WHERE sensitive_text;
