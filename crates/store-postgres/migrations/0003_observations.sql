-- Version 3: the observation projection (observer's ObservationRepository, K-15): attempt
-- rows and one snapshot per biz_key. Never joined with workflow_instances. The queried
-- fields are real columns; `doc` holds the record's own serde form, returned as is.

CREATE TABLE {schema}.observation_attempts (
    biz_key       text COLLATE "C" NOT NULL,
    workflow_run  bigint NOT NULL,
    step_name     text COLLATE "C" NOT NULL,
    attempt       bigint NOT NULL,
    workflow_type text COLLATE "C" NOT NULL,
    outcome       text NOT NULL,
    revision      bigint NOT NULL,
    updated_at    bigint NOT NULL,
    doc           jsonb NOT NULL,
    PRIMARY KEY (biz_key, workflow_run, step_name, attempt)
);

-- find_attempts: by type (and step, outcome), by step (and outcome), or none; newest first.
CREATE INDEX observation_attempts_type_step_outcome
    ON {schema}.observation_attempts (workflow_type, step_name, outcome, updated_at DESC);
CREATE INDEX observation_attempts_step_outcome
    ON {schema}.observation_attempts (step_name, outcome, updated_at DESC);
CREATE INDEX observation_attempts_updated
    ON {schema}.observation_attempts (updated_at DESC, biz_key, workflow_run, step_name, attempt);

CREATE TABLE {schema}.observation_snapshots (
    biz_key       text COLLATE "C" PRIMARY KEY,
    workflow_type text COLLATE "C" NOT NULL,
    status        text NOT NULL,
    step_name     text COLLATE "C",
    revision      bigint NOT NULL,
    updated_at    bigint NOT NULL,
    doc           jsonb NOT NULL
);

-- find_snapshots (OpsView by_type, by_status, by_step, in_window): newest first.
CREATE INDEX observation_snapshots_type_updated
    ON {schema}.observation_snapshots (workflow_type, updated_at DESC, biz_key);
CREATE INDEX observation_snapshots_status_updated
    ON {schema}.observation_snapshots (status, updated_at DESC, biz_key);
CREATE INDEX observation_snapshots_step_updated
    ON {schema}.observation_snapshots (step_name, updated_at DESC, biz_key);
CREATE INDEX observation_snapshots_updated
    ON {schema}.observation_snapshots (updated_at DESC, biz_key);
