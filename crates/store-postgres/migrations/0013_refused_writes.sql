-- Version 13: the run's count of plain writes the store refused (K-6.4), set by the claim
-- that hands the instance back after one, reset to 0 by replay; at the engine's limit the
-- workflow fails. 0 on every row written before this version.

ALTER TABLE {schema}.workflow_instances ADD COLUMN refused_writes bigint NOT NULL DEFAULT 0;
