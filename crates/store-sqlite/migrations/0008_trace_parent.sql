-- Version 8: the W3C `traceparent` of the request that created an instance, so its
-- activities join the caller's trace. Written only by the create (55 characters, checked
-- by kernel-core), never by a transition; NULL when the request carried none.

ALTER TABLE workflow_instances ADD COLUMN trace_parent TEXT;
