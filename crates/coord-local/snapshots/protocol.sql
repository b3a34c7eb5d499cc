## migration 1
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

## migration 2
-- coord-local schema version 2: the per-lane pop counters (K-13, `LaneStats::pops`).

-- Members popped per lane since the row was created (missing = 0); a pop bumps it in its
-- own transaction.
CREATE TABLE coord_lane_pops (
  lane INTEGER NOT NULL PRIMARY KEY CHECK (lane BETWEEN 0 AND 3),
  pops INTEGER NOT NULL CHECK (pops >= 0)
);

## queue.enqueue (and each entry of enqueue_many)
INSERT INTO coord_lane (workflow_id, lane, claimable_at) VALUES (?1, ?2, ?3) ON CONFLICT (workflow_id) DO UPDATE SET lane = excluded.lane, claimable_at = excluded.claimable_at WHERE excluded.lane <= coord_lane.lane

## queue.pop_due: due members of one lane
SELECT workflow_id FROM coord_lane WHERE lane = ?1 AND claimable_at <= ?2 ORDER BY claimable_at, workflow_id LIMIT ?3

## queue.pop_due: take one
DELETE FROM coord_lane WHERE workflow_id = ?1

## queue.pop_due: rotation
SELECT current, served, burst_left FROM coord_lane_rotation WHERE id = 0

## queue.pop_due: save rotation
INSERT INTO coord_lane_rotation (id, current, served, burst_left) VALUES (0, ?1, ?2, ?3) ON CONFLICT (id) DO UPDATE SET current = excluded.current, served = excluded.served, burst_left = excluded.burst_left

## queue.stats
SELECT lane, count(*), coalesce(sum(claimable_at <= ?1), 0), min(claimable_at) FROM coord_lane GROUP BY lane

## queue.pop_due: count pops
INSERT INTO coord_lane_pops (lane, pops) VALUES (?1, ?2) ON CONFLICT (lane) DO UPDATE SET pops = pops + excluded.pops

## queue.stats: pops
SELECT lane, pops FROM coord_lane_pops

## wakeup.notify
UPDATE coord_wakeup SET seq = CASE WHEN seq >= 4611686018427387904 THEN 0 ELSE seq + 1 END WHERE id = 0 RETURNING seq

## wakeup poll
SELECT seq FROM coord_wakeup WHERE id = 0

## permits: purge holders
DELETE FROM coord_permit_holder WHERE lease_until <= ?1

## permits: purge starts
DELETE FROM coord_permit_start WHERE started_at <= ?1

## permits: renew
UPDATE coord_permit_holder SET lease_until = ?3 WHERE resource = ?1 AND owner = ?2

## permits: insert holder
INSERT INTO coord_permit_holder (resource, owner, lease_until) VALUES (?1, ?2, ?3)

## permits: live limits
SELECT max_concurrency, max_starts_per_second FROM coord_permit_limits WHERE resource = ?1

## permits: holders
SELECT count(*), min(lease_until) FROM coord_permit_holder WHERE resource = ?1

## permits: starts
SELECT count(*), min(started_at) FROM coord_permit_start WHERE resource = ?1

## permits: insert start
INSERT INTO coord_permit_start (resource, started_at, owner) VALUES (?1, ?2, ?3)

## permits.release
DELETE FROM coord_permit_holder WHERE resource = ?1 AND owner = ?2

## permits.set_limits
INSERT INTO coord_permit_limits (resource, max_concurrency, max_starts_per_second) VALUES (?1, ?2, ?3) ON CONFLICT (resource) DO UPDATE SET max_concurrency = excluded.max_concurrency, max_starts_per_second = excluded.max_starts_per_second

## permits.usage: holders
SELECT owner, lease_until FROM coord_permit_holder WHERE resource = ?1 AND lease_until > ?2 ORDER BY lease_until, owner LIMIT ?3

## permits.usage: starts
SELECT count(*) FROM coord_permit_start WHERE resource = ?1 AND started_at > ?2

## permits.resources
SELECT resource FROM coord_permit_limits UNION SELECT resource FROM coord_permit_holder WHERE lease_until > ?1 ORDER BY resource LIMIT ?2

## dispatch.add
INSERT INTO coord_dispatch (object_id, due) VALUES (?1, ?2) ON CONFLICT (object_id) DO UPDATE SET due = excluded.due

## dispatch.pop_due: due
SELECT object_id FROM coord_dispatch WHERE due <= ?1 ORDER BY due, object_id LIMIT ?2

## dispatch.pop_due: take one
DELETE FROM coord_dispatch WHERE object_id = ?1

