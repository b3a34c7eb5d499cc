-- Version 6: the result cache of read-only activities (ResultCache, K-17.7). `key` is the
-- lowercase hex SHA-256 content hash; times are bigint milliseconds of the caller's clock.

CREATE TABLE {schema}.result_cache (
    key        text COLLATE "C" PRIMARY KEY,
    value      jsonb NOT NULL,
    stored_at  bigint NOT NULL,
    expires_at bigint NOT NULL
);

-- purge_expired: the oldest expiries first.
CREATE INDEX result_cache_expires_at ON {schema}.result_cache (expires_at);
