-- Version 1: the workflow instances and the signal inbox.
-- Times are INTEGER milliseconds since the Unix epoch (every kernel Instant, exactly).
-- Text compares byte-wise (SQLite's BINARY collation), as every other store orders ids.
-- JSON columns hold the kernel types' own serde form as JSON text. STRICT tables: a value
-- of the wrong type is refused, never converted.

CREATE TABLE workflow_instances (
    workflow_id            TEXT PRIMARY KEY NOT NULL,
    biz_key                TEXT NOT NULL UNIQUE,
    workflow_type          TEXT NOT NULL,
    status                 TEXT NOT NULL,
    claimable_time         INTEGER,
    claim_token            TEXT,
    business_priority      INTEGER NOT NULL CHECK (business_priority BETWEEN 0 AND 3),
    revision               INTEGER NOT NULL CHECK (revision >= 0),
    retry_count            INTEGER NOT NULL,
    prepare_failures       INTEGER NOT NULL,
    definition_fingerprint TEXT NOT NULL,
    created_at             INTEGER NOT NULL,
    updated_at             INTEGER NOT NULL,
    finished_at            INTEGER,
    steps                  TEXT NOT NULL,
    input                  TEXT NOT NULL,
    output                 TEXT NOT NULL,
    wait                   TEXT,
    resume                 TEXT,
    fingerprint_mismatch   TEXT,
    -- A stored instance holds at most 16 MiB (kernel-core's DOCUMENT_BYTES_MAX, MongoDB's
    -- document limit) in its JSON columns, measured on the row a write would leave: a
    -- write past it fails whole (SQLITE_CONSTRAINT_CHECK), nothing written.
    CONSTRAINT workflow_instances_document_size CHECK (
        octet_length(steps) + octet_length(input) + octet_length(output)
        + COALESCE(octet_length(wait), 0) + COALESCE(octet_length(resume), 0) <= 16777216)
) STRICT;

-- claim_any (K-6.7): per claimed type, claimable instances longest due first.
CREATE INDEX workflow_instances_claim_by_type
    ON workflow_instances (workflow_type, claimable_time, workflow_id)
    WHERE status IN ('running', 'failing');

-- scan_due_waits (K-9.2): waiting instances by (claimable_time, workflow_id), the DueCursor.
CREATE INDEX workflow_instances_due_wait
    ON workflow_instances (claimable_time, workflow_id)
    WHERE status = 'waiting';

-- scan_claimable (rebuild, K-13): claimable instances paged by workflow_id.
CREATE INDEX workflow_instances_rebuild
    ON workflow_instances (workflow_id)
    WHERE status IN ('running', 'failing') AND claimable_time IS NOT NULL;

CREATE TABLE signal_inbox (
    signal_id   TEXT PRIMARY KEY NOT NULL,
    workflow_id TEXT NOT NULL,
    signal_type TEXT NOT NULL,
    wait_key    TEXT NOT NULL,
    generation  INTEGER NOT NULL CHECK (generation >= 0),
    status      TEXT NOT NULL CHECK (status IN ('pending', 'matched')),
    created_at  INTEGER NOT NULL,
    match_time  INTEGER,
    orphan      INTEGER NOT NULL DEFAULT 0 CHECK (orphan IN (0, 1))
) STRICT;

-- scan_pending (repair, K-9.4), paged by signal_id.
CREATE INDEX signal_inbox_pending ON signal_inbox (signal_id) WHERE status = 'pending';
-- find_pending (early signals) and scan_workflow (newest first).
CREATE INDEX signal_inbox_workflow ON signal_inbox (workflow_id, status, created_at, signal_id);
-- scan_created_before (retention).
CREATE INDEX signal_inbox_created_at ON signal_inbox (created_at);
-- count_pending_orphans, clear_orphans: only orphans are indexed.
CREATE INDEX signal_inbox_orphan ON signal_inbox (workflow_id) WHERE orphan = 1;
