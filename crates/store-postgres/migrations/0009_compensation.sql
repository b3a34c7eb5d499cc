-- Version 9: the compensation report of a failed workflow (K-17.6), written with its
-- `failed` transition and cleared by replay; the kernel type's own serde form. Bounded by
-- kernel-core (one entry per step of a definition, short error texts), so the document
-- size trigger does not measure it.

ALTER TABLE {schema}.workflow_instances ADD COLUMN compensation jsonb;
