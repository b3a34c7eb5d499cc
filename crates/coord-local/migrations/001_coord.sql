-- coord-local schema version 1: the ready lanes, the wakeup counter, the permits and the
-- dispatch candidates (K-11.3, K-13, K-14). Every table name starts with `coord_`, so the
-- file may also hold a store's tables.

-- One row per lane member: the primary key makes "never in two lanes" structural.
CREATE TABLE coord_lane (
  workflow_id  TEXT    NOT NULL PRIMARY KEY,
  lane         INTEGER NOT NULL CHECK (lane BETWEEN 0 AND 3),
  claimable_at INTEGER NOT NULL
) WITHOUT ROWID;
-- A pop takes a lane's due members by (score, member bytes), like a Redis ZSET.
CREATE INDEX coord_lane_due ON coord_lane (lane, claimable_at, workflow_id);

-- The rotation and burst state every worker shares (one row; missing = all zero).
CREATE TABLE coord_lane_rotation (
  id         INTEGER NOT NULL PRIMARY KEY CHECK (id = 0),
  current    INTEGER NOT NULL,
  served     INTEGER NOT NULL,
  burst_left INTEGER NOT NULL
);

-- The doorbell: `notify` bumps `seq`, subscribers in other processes poll it.
CREATE TABLE coord_wakeup (
  id  INTEGER NOT NULL PRIMARY KEY CHECK (id = 0),
  seq INTEGER NOT NULL
);
INSERT INTO coord_wakeup (id, seq) VALUES (0, 0);

-- Live limits an operator writes; a missing row means the application's configured ones.
CREATE TABLE coord_permit_limits (
  resource              TEXT    NOT NULL PRIMARY KEY,
  max_concurrency       INTEGER NOT NULL CHECK (max_concurrency BETWEEN 0 AND 4294967295),
  max_starts_per_second INTEGER NOT NULL CHECK (max_starts_per_second BETWEEN 0 AND 4294967295)
) WITHOUT ROWID;

-- Holders: owner key (PermitOwner::key) and lease end (ms).
CREATE TABLE coord_permit_holder (
  resource    TEXT    NOT NULL,
  owner       TEXT    NOT NULL,
  lease_until INTEGER NOT NULL,
  PRIMARY KEY (resource, owner)
) WITHOUT ROWID;
CREATE INDEX coord_permit_holder_lease ON coord_permit_holder (lease_until);

-- Starts of the last second (ms), for max_starts_per_second.
CREATE TABLE coord_permit_start (
  resource   TEXT    NOT NULL,
  started_at INTEGER NOT NULL,
  owner      TEXT    NOT NULL
);
CREATE INDEX coord_permit_start_window ON coord_permit_start (resource, started_at);
CREATE INDEX coord_permit_start_age ON coord_permit_start (started_at);

-- The recovery dispatcher's candidate index: identity and due time only.
CREATE TABLE coord_dispatch (
  object_id TEXT    NOT NULL PRIMARY KEY,
  due       INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX coord_dispatch_due ON coord_dispatch (due, object_id);
