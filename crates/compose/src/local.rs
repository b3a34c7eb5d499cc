//! The `local` and `sqlite:<path>` queue driver (coord-local): ready lanes, wakeup, permits
//! and dispatch candidates for workers on one machine without Redis. `sqlite:<path>` keeps
//! them in that file, shared by every process that opens it (a worker's store file is the
//! natural place: `--store sqlite:wf.db --queue local`); `local` alone, with a store that is
//! not a SQLite file, keeps them in this process only.

use crate::{ComposeError, QueueHandle, QueueOptions, QueueSide, Role, Scheme};
use coord_local::{LocalConfig, LocalCoord, LocalPermitsConfig};
use kernel_core::ports::SystemClock;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn queue_error(url: String, what: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> ComposeError {
    ComposeError::Connect { role: Role::Queue, url, what, source: Box::new(e) }
}

/// Coordination in the SQLite file at `path` (`Some`), or in this process (`None`).
pub(crate) async fn queue(
    path: Option<&Path>,
    scheme: Scheme,
    options: &QueueOptions,
) -> Result<QueueSide, ComposeError> {
    let config = LocalConfig { weights: options.lane_weights, ..LocalConfig::default() };
    let url = path.map_or_else(|| "local".to_string(), |p| format!("sqlite:{}", p.display()));
    let coord = match path {
        Some(p) => LocalCoord::open(p, config).await,
        None => LocalCoord::in_memory(config).await,
    }
    .map_err(|e| queue_error(url.clone(), "open", e))?;
    let permits_config = LocalPermitsConfig {
        lease_ms: options.permit_lease_ms,
        defaults: options.permit_defaults.clone(),
        fallback: options.permit_fallback,
    };
    let permits =
        coord.permits(Arc::new(SystemClock), permits_config).map_err(|e| queue_error(url, "open the permits", e))?;
    Ok(QueueSide {
        queue: Arc::new(coord.queue()),
        wakeup: Arc::new(coord.wakeup()),
        permits: Arc::new(permits),
        scheme,
        handle: QueueHandle::Local(coord, path.map(PathBuf::from)),
    })
}

/// Remove the database file and its WAL and shared-memory files. Open connections keep
/// reading the unlinked file until they close; nothing else is touched.
pub(crate) fn remove_files(path: &Path, role: Role) -> Result<(), ComposeError> {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ComposeError::Connect {
                    role,
                    url: format!("sqlite:{}", path.display()),
                    what: "remove the database file",
                    source: Box::new(e),
                })
            }
        }
    }
    Ok(())
}
