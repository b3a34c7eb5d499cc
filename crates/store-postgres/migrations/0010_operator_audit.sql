-- Version 10: what an operator console needs from the observation projection (K-15). The
-- snapshot's `wait_signal` (the signal type a waiting workflow waits for; also inside
-- `doc`), and the operator audit log: one row per action, keyed by the caller's id, the
-- queried fields real columns, `doc` the entry's own serde form, returned as is. Never
-- joined with workflow_instances. Keys are COLLATE "C" (bytes), the order every repository
-- pages in.

ALTER TABLE {schema}.observation_snapshots ADD COLUMN wait_signal text COLLATE "C";

-- find_snapshots by waiting_on: newest first.
CREATE INDEX observation_snapshots_wait_signal_updated
    ON {schema}.observation_snapshots (wait_signal, updated_at DESC, biz_key) WHERE wait_signal IS NOT NULL;

CREATE TABLE {schema}.observation_audit (
    id     text COLLATE "C" PRIMARY KEY,
    at     bigint NOT NULL,
    actor  text COLLATE "C" NOT NULL,
    action text COLLATE "C" NOT NULL,
    target text COLLATE "C" NOT NULL,
    doc    jsonb NOT NULL
);

-- find_audit: all, or by actor, action or target; newest first, ties by id. purge_audit
-- reads the first index oldest first.
CREATE INDEX observation_audit_at ON {schema}.observation_audit (at DESC, id);
CREATE INDEX observation_audit_actor_at ON {schema}.observation_audit (actor, at DESC, id);
CREATE INDEX observation_audit_action_at ON {schema}.observation_audit (action, at DESC, id);
CREATE INDEX observation_audit_target_at ON {schema}.observation_audit (target, at DESC, id);
