-- Version 12: an operator's request to the holder of a live claim (K-6.8), written under
-- the holder's claim token (which it replaces) and cleared when the request is applied;
-- the kernel type's own serde form. NULL when no request is pending, as on every row
-- written before this version. Bounded by kernel-core (an id, a token, a step name), so
-- the document size trigger does not measure it.

ALTER TABLE {schema}.workflow_instances ADD COLUMN operator_request jsonb;
