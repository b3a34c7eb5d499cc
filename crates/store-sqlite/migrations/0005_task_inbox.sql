-- Version 5: human tasks (K-17.5), one row per task, keyed by the caller's id (the step's
-- idempotency key and the escalation level). What is queried is a real column; the roles
-- (read with json_each: eligibility is `assignee = actor OR a role in the actor's`), the
-- evidence and the decision are JSON text in the kernel types' own serde form.
-- `decided_at` and `sensitive_text` are derived from the decision, for the retention
-- purge of sensitive reasons.

CREATE TABLE task_inbox (
    id             TEXT PRIMARY KEY NOT NULL,
    workflow_id    TEXT NOT NULL,
    workflow_type  TEXT NOT NULL,
    step           TEXT NOT NULL,
    level          INTEGER NOT NULL CHECK (level >= 0),
    title          TEXT NOT NULL,
    assignee       TEXT,
    roles          TEXT NOT NULL,
    evidence       TEXT NOT NULL,
    token          TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    due_at         INTEGER NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('open', 'decided', 'closed')),
    decision       TEXT,
    closed_at      INTEGER,
    decided_at     INTEGER GENERATED ALWAYS AS (decision ->> '$.decided_at') STORED,
    sensitive_text INTEGER GENERATED ALWAYS AS (
        coalesce(decision ->> '$.reason.sensitive', 0) = 1
        AND coalesce(json_type(decision, '$.reason.text'), '') = 'text') STORED,
    CHECK (status <> 'open' OR decision IS NULL),
    CHECK (status <> 'decided' OR decision IS NOT NULL),
    CHECK ((status = 'closed') = (closed_at IS NOT NULL))
) STRICT;

-- list_open: the open tasks, paged by id (eligibility filters the rows of the range).
CREATE INDEX task_inbox_status_id ON task_inbox (status, id);
-- purge_closed: closed rows by closed_at.
CREATE INDEX task_inbox_closed_at ON task_inbox (closed_at) WHERE status = 'closed';
-- purge_sensitive_reasons: decisions still holding a sensitive reason's text.
CREATE INDEX task_inbox_sensitive ON task_inbox (decided_at) WHERE sensitive_text;
