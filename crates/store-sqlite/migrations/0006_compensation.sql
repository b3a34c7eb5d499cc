-- Version 6: the compensation report of a failed workflow (K-17.6), written with its
-- `failed` transition and cleared by replay; JSON text in the kernel type's own serde
-- form. Bounded by kernel-core (one entry per step of a definition, short error texts).

ALTER TABLE workflow_instances ADD COLUMN compensation TEXT;
