//! Integration tests of the Redis connection against a real Redis (`REDIS_URL`, default
//! `redis://127.0.0.1:6379`, one server or a cluster; see `redis_conn::test_support`).

mod connect;
