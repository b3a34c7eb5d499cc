-- Version 2: a stored instance holds at most 16 MiB (kernel-core's DOCUMENT_BYTES_MAX,
-- MongoDB's document limit) in its JSON columns, measured on the row a write would leave,
-- so a workflow cannot outgrow what every other store accepts. A write that would pass it
-- fails whole (check_violation), nothing written. NOT VALID: rows written before this
-- version are not scanned now; every new write is checked.

ALTER TABLE {schema}.workflow_instances
    ADD CONSTRAINT workflow_instances_document_size CHECK (
        octet_length(steps::text) + octet_length(input::text) + octet_length(output::text)
        + coalesce(octet_length(wait::text), 0) + coalesce(octet_length(resume::text), 0)
        <= 16777216
    ) NOT VALID;
