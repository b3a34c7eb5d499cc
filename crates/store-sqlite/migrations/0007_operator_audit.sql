-- Version 7: what an operator console needs from the observation projection (K-15). The
-- snapshot's `wait_signal` (the signal type a waiting workflow waits for; also inside
-- `doc`), and the operator audit log: one row per action, keyed by the caller's id, the
-- queried fields real columns, `doc` the entry's own serde form, returned as is. Never
-- joined with workflow_instances. Text compares as bytes (BINARY), the order every
-- repository pages in.

ALTER TABLE observation_snapshots ADD COLUMN wait_signal TEXT;

-- find_snapshots by waiting_on: newest first.
CREATE INDEX observation_snapshots_wait_signal_updated
    ON observation_snapshots (wait_signal, updated_at DESC, biz_key) WHERE wait_signal IS NOT NULL;

CREATE TABLE observation_audit (
    id     TEXT PRIMARY KEY NOT NULL,
    at     INTEGER NOT NULL,
    actor  TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    doc    TEXT NOT NULL
) STRICT;

-- find_audit: all, or by actor, action or target; newest first, ties by id. purge_audit
-- reads the first index oldest first.
CREATE INDEX observation_audit_at ON observation_audit (at DESC, id);
CREATE INDEX observation_audit_actor_at ON observation_audit (actor, at DESC, id);
CREATE INDEX observation_audit_action_at ON observation_audit (action, at DESC, id);
CREATE INDEX observation_audit_target_at ON observation_audit (target, at DESC, id);
