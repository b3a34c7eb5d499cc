//! Integration tests of the composition root: the ports builder, `memory:` end to end,
//! the URL flags, connection errors, and (with `MONGODB_URI` and `REDIS_URL`) a real
//! deployment built from URLs.

mod accessors;
mod live;
mod memory;
mod ports;
mod postgres;
mod redis_queue;
mod sqlite;
mod urls;
