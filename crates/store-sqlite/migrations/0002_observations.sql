-- Version 2: the observation projection (observer's ObservationRepository, K-15): attempt
-- rows and one snapshot per biz_key. Never joined with workflow_instances. The queried
-- fields are real columns; `doc` holds the record's own serde form, returned as is.

CREATE TABLE observation_attempts (
    biz_key       TEXT NOT NULL,
    workflow_run  INTEGER NOT NULL,
    step_name     TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    workflow_type TEXT NOT NULL,
    outcome       TEXT NOT NULL,
    revision      INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    doc           TEXT NOT NULL,
    PRIMARY KEY (biz_key, workflow_run, step_name, attempt)
) STRICT;

-- find_attempts: by type (and step, outcome), by step (and outcome), or none; newest first.
CREATE INDEX observation_attempts_type_step_outcome
    ON observation_attempts (workflow_type, step_name, outcome, updated_at DESC);
CREATE INDEX observation_attempts_step_outcome
    ON observation_attempts (step_name, outcome, updated_at DESC);
CREATE INDEX observation_attempts_updated
    ON observation_attempts (updated_at DESC, biz_key, workflow_run, step_name, attempt);

CREATE TABLE observation_snapshots (
    biz_key       TEXT PRIMARY KEY NOT NULL,
    workflow_type TEXT NOT NULL,
    status        TEXT NOT NULL,
    step_name     TEXT,
    revision      INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    doc           TEXT NOT NULL
) STRICT;

-- find_snapshots (OpsView by_type, by_status, by_step, in_window): newest first.
CREATE INDEX observation_snapshots_type_updated
    ON observation_snapshots (workflow_type, updated_at DESC, biz_key);
CREATE INDEX observation_snapshots_status_updated
    ON observation_snapshots (status, updated_at DESC, biz_key);
CREATE INDEX observation_snapshots_step_updated
    ON observation_snapshots (step_name, updated_at DESC, biz_key);
CREATE INDEX observation_snapshots_updated
    ON observation_snapshots (updated_at DESC, biz_key);
