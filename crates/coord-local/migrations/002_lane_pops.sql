-- coord-local schema version 2: the per-lane pop counters (K-13, `LaneStats::pops`).

-- Members popped per lane since the row was created (missing = 0); a pop bumps it in its
-- own transaction.
CREATE TABLE coord_lane_pops (
  lane INTEGER NOT NULL PRIMARY KEY CHECK (lane BETWEEN 0 AND 3),
  pops INTEGER NOT NULL CHECK (pops >= 0)
);
