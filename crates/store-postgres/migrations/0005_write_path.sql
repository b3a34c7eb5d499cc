-- Version 5: cheaper step writes, the same refusals.
--
-- 1. Room for HOT updates. A step write (mark running, complete a step) changes no indexed
--    column, so PostgreSQL can write the new row version on the same page without touching
--    any of the five indexes (a heap-only tuple), if the page has room. With the default
--    fillfactor of 100 a page is filled by inserts and every update moved the row and added
--    an entry to every index. Pages written from now on are filled to 75 % by inserts; the
--    rest holds the versions of updates until pruning reclaims them. Existing pages keep
--    their layout until rewritten.
ALTER TABLE {schema}.workflow_instances SET (fillfactor = 75);

-- 2. The size trigger of version 2 runs only when the row could be near its limit. Its
--    function renders every JSON column as text (a PL/pgSQL call per step write, about a
--    tenth of the server's work on a small instance); the WHEN condition, evaluated by the
--    executor without calling it, skips it when the JSON columns together hold at most
--    8 KiB as stored (pg_column_size: the binary JSONB size, or the compressed size of a
--    value kept from the old row). Such a row cannot exceed 16 MiB by kernel-core's measure
--    (compact serde JSON): its text is at most 6 times its JSONB form (a control character
--    escaped as \u0001), and no compression PostgreSQL offers (pglz, lz4) shrinks data more
--    than 255 times, so 8 KiB stored is at most 12.5 MB of compact JSON. A row over 8 KiB is
--    measured exactly as before.
DROP TRIGGER workflow_instances_document_size ON {schema}.workflow_instances;

CREATE TRIGGER workflow_instances_document_size
    BEFORE INSERT OR UPDATE OF steps, input, output, wait, resume ON {schema}.workflow_instances
    FOR EACH ROW
    WHEN (COALESCE(pg_column_size(NEW.steps), 0) + COALESCE(pg_column_size(NEW.input), 0)
          + COALESCE(pg_column_size(NEW.output), 0) + COALESCE(pg_column_size(NEW.wait), 0)
          + COALESCE(pg_column_size(NEW.resume), 0) > 8192)
    EXECUTE FUNCTION {schema}.workflow_instances_document_size();
