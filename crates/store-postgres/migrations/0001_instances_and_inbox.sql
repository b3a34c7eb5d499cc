-- Version 1: the workflow instances and the signal inbox.
-- Times are milliseconds since the Unix epoch (bigint: every kernel Instant, exactly).
-- Ids are compared and ordered byte-wise (COLLATE "C"), as every other store orders them.

CREATE TABLE {schema}.workflow_instances (
    workflow_id            text COLLATE "C" PRIMARY KEY,
    biz_key                text COLLATE "C" NOT NULL,
    workflow_type          text COLLATE "C" NOT NULL,
    status                 text NOT NULL,
    claimable_time         bigint,
    claim_token            text COLLATE "C",
    business_priority      smallint NOT NULL CHECK (business_priority BETWEEN 0 AND 3),
    revision               bigint NOT NULL CHECK (revision >= 0),
    retry_count            bigint NOT NULL,
    prepare_failures       bigint NOT NULL,
    definition_fingerprint text NOT NULL,
    created_at             bigint NOT NULL,
    updated_at             bigint NOT NULL,
    finished_at            bigint,
    steps                  jsonb NOT NULL,
    input                  jsonb NOT NULL,
    output                 jsonb NOT NULL,
    wait                   jsonb,
    resume                 jsonb,
    fingerprint_mismatch   jsonb,
    CONSTRAINT workflow_instances_biz_key_unique UNIQUE (biz_key)
);

-- claim_any (K-6.7): claimable instances, longest due first.
CREATE INDEX workflow_instances_claim
    ON {schema}.workflow_instances (claimable_time, workflow_id)
    WHERE status IN ('running', 'failing');

-- scan_due_waits (K-9.2): waiting instances by (claimable_time, workflow_id), the DueCursor.
CREATE INDEX workflow_instances_due_wait
    ON {schema}.workflow_instances (claimable_time, workflow_id)
    WHERE status = 'waiting';

-- scan_claimable (rebuild, K-13): claimable instances paged by workflow_id.
CREATE INDEX workflow_instances_rebuild
    ON {schema}.workflow_instances (workflow_id)
    WHERE status IN ('running', 'failing') AND claimable_time IS NOT NULL;

CREATE TABLE {schema}.signal_inbox (
    signal_id   text COLLATE "C" PRIMARY KEY,
    workflow_id text COLLATE "C" NOT NULL,
    signal_type text COLLATE "C" NOT NULL,
    wait_key    text COLLATE "C" NOT NULL,
    generation  bigint NOT NULL CHECK (generation >= 0),
    status      text NOT NULL CHECK (status IN ('pending', 'matched')),
    created_at  bigint NOT NULL,
    match_time  bigint,
    orphan      boolean NOT NULL DEFAULT false
);

-- scan_pending (repair, K-9.4), paged by signal_id.
CREATE INDEX signal_inbox_pending ON {schema}.signal_inbox (signal_id) WHERE status = 'pending';
-- find_pending (early signals) and scan_workflow (newest first).
CREATE INDEX signal_inbox_workflow ON {schema}.signal_inbox (workflow_id, status, created_at, signal_id);
-- scan_created_before (retention).
CREATE INDEX signal_inbox_created_at ON {schema}.signal_inbox (created_at);
-- count_pending_orphans, clear_orphans: only orphans are indexed.
CREATE INDEX signal_inbox_orphan ON {schema}.signal_inbox (workflow_id) WHERE orphan;
