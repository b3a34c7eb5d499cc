//! `wfk` against real stores: every verb on SQLite (in-process with the definitions, and
//! the stock binary through assert_cmd), the same walk's core on PostgreSQL, one smoke test
//! on the Mongo-wire server. Table output is pinned by snapshots (tests/snapshots/,
//! timestamps normalized; `WFK_BLESS=1` rewrites them).

mod fixture;
mod stores;
mod verbs;
