-- Version 2: a stored instance holds at most 16 MiB (kernel-core's DOCUMENT_BYTES_MAX,
-- MongoDB's document limit) in its JSON columns, measured on the row a write would leave,
-- so a workflow cannot outgrow what every other store accepts. A write that would pass it
-- fails whole (check_violation, constraint `workflow_instances_document_size`), nothing
-- written.
--
-- A trigger, not a CHECK constraint: it fires only when a write sets one of the JSON
-- columns, so claims, heartbeats and status changes do not re-render the documents.
--
-- The measure is a lower bound of kernel-core's `validate::document` (the compact serde
-- JSON of the whole instance), so it never refuses what kernel-core accepts: each column's
-- JSONB text with the separator spaces JSONB adds (`, ` and `": `) removed — also where
-- they occur inside strings, which only lowers the measure — and without the scalar
-- fields (ids, status, times), which kernel-core counts. One exception: a number
-- serde writes with an exponent (`1e300`) is printed by PostgreSQL in full, so a document
-- made mostly of such numbers measures larger here.

CREATE FUNCTION {schema}.workflow_instances_document_size() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    bytes bigint := 0;
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY[NEW.steps::text, NEW.input::text, NEW.output::text, NEW.wait::text, NEW.resume::text]
    LOOP
        IF t IS NOT NULL THEN
            bytes := bytes + octet_length(replace(replace(t, ', ', ','), '": ', '":'));
        END IF;
    END LOOP;
    IF bytes > 16777216 THEN
        RAISE EXCEPTION 'the instance would hold % bytes of JSON, over the limit of 16777216', bytes
            USING ERRCODE = 'check_violation', CONSTRAINT = 'workflow_instances_document_size';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER workflow_instances_document_size
    BEFORE INSERT OR UPDATE OF steps, input, output, wait, resume ON {schema}.workflow_instances
    FOR EACH ROW EXECUTE FUNCTION {schema}.workflow_instances_document_size();
