//! Integration tests of the SQLite coordination: the shared conformance suites (each case
//! on a fresh file, and in memory), the engine on it, opening and migrating files, and
//! several OS processes on one file.

mod conformance;
mod engine;
mod files;
mod operators;
mod processes;

use coord_local::{LocalConfig, LocalCoord};
use tempfile::TempDir;

/// A port on a fresh file in its own temporary directory (deleted on drop).
pub struct Fx<T> {
    /// The port under test.
    pub port: T,
    /// The coordination it came from.
    pub coord: LocalCoord,
    /// Keeps the directory alive.
    pub dir: TempDir,
}

impl<T> std::ops::Deref for Fx<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.port
    }
}

/// A fresh, migrated file.
pub async fn fresh(config: LocalConfig) -> (LocalCoord, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let coord = LocalCoord::open(dir.path().join("coord.db"), config).await.expect("open");
    (coord, dir)
}
