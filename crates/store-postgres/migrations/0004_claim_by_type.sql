-- Version 4: claim_any walks the due instances of each claimed type in its own index range.
-- The index of version 1 was ordered by due time across all types, so a claimer serving some
-- types read (and fetched from the heap) every due instance of the other types due before
-- its own; with the type leading, each type's range is walked from its longest-due entry.

DROP INDEX {schema}.workflow_instances_claim;

CREATE INDEX workflow_instances_claim_by_type
    ON {schema}.workflow_instances (workflow_type, claimable_time, workflow_id)
    WHERE status IN ('running', 'failing');

-- The candidate of claim_any: per claimed type, its longest-due instance that no other
-- claimer holds locked (locked here until the calling statement ends); of those, the
-- longest due. A function so that its plan is prepared once per connection and kept
-- generic: planned per call, the per-type join costs more than it runs.
CREATE FUNCTION {schema}.claim_candidate(now_ms bigint, claim_types text[]) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    candidate text;
BEGIN
    SELECT c.workflow_id INTO candidate
      FROM (SELECT DISTINCT unnest(claim_types)) AS ty(t)
      CROSS JOIN LATERAL (
          SELECT i.workflow_id, i.claimable_time
            FROM {schema}.workflow_instances AS i
           WHERE i.status IN ('running', 'failing') AND i.claimable_time <= now_ms AND i.workflow_type = ty.t
           ORDER BY i.claimable_time, i.workflow_id
           LIMIT 1
             FOR UPDATE OF i SKIP LOCKED) AS c
     ORDER BY c.claimable_time, c.workflow_id
     LIMIT 1;
    RETURN candidate;
END
$fn$;
