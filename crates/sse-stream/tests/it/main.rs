//! Integration tests of the stream codec and of the Redis writer and forwarder
//! (`REDIS_URL`, default `redis://127.0.0.1:6379`; see `redis_conn::test_support`).

mod codec;
mod keys;
mod stream;
mod url;
