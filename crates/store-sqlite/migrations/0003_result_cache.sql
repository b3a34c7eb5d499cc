-- Version 3: the result cache of read-only activities (ResultCache, K-17.7). `key` is the
-- lowercase hex SHA-256 content hash; `value` the JSON text; times are milliseconds of the
-- caller's clock.

CREATE TABLE result_cache (
    key        TEXT PRIMARY KEY NOT NULL,
    value      TEXT NOT NULL,
    stored_at  INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT;

-- purge_expired: the oldest expiries first.
CREATE INDEX result_cache_expires_at ON result_cache (expires_at);
