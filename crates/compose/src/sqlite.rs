//! The `sqlite:<path>` store driver: instances, the signal inbox, dead letters, the result
//! cache, the dispatch outbox and the observation repository in one SQLite file, migrated
//! on open (store-sqlite).

use crate::{ComposeError, Role, StoreHandle, StoreSide, Target};
use std::path::{Path, PathBuf};

pub(crate) use crate::local::remove_files;
use std::sync::Arc;
use store_sqlite::{
    OutboxTable, SqliteConfig, SqliteDb, SqliteDeadLetters, SqliteObservationRepository, SqliteOutbox,
    SqliteResultCache, SqliteSignalInbox, SqliteWorkflowStore, Synchronous,
};

fn store_error(file: &Path, what: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> ComposeError {
    ComposeError::Connect { role: Role::Store, url: format!("sqlite:{}", file.display()), what, source: Box::new(e) }
}

/// The settings a `sqlite:` URL gives: `?synchronous=full|normal` (default `full`; the
/// parser refused any other value).
pub(crate) fn config(target: &Target) -> SqliteConfig {
    let normal = target.url.split_once('?').is_some_and(|(_, q)| q.eq_ignore_ascii_case("synchronous=normal"));
    let synchronous = if normal { Synchronous::Normal } else { Synchronous::Full };
    SqliteConfig { synchronous, ..SqliteConfig::default() }
}

pub(crate) async fn store(target: &Target) -> Result<StoreSide, ComposeError> {
    let path = PathBuf::from(&target.namespace);
    let db = SqliteDb::open(&path, config(target)).await.map_err(|e| store_error(&path, "open", e))?;
    let store = SqliteWorkflowStore::new(db.clone());
    Ok(StoreSide {
        store: Arc::new(store),
        inbox: Arc::new(SqliteSignalInbox::new(db.clone())),
        dead_letters: Arc::new(SqliteDeadLetters::new(db.clone())),
        task_inbox: Arc::new(store_sqlite::SqliteTaskInbox::new(db.clone())),
        result_cache: Arc::new(SqliteResultCache::new(db.clone())),
        scheme: target.scheme,
        handle: StoreHandle::Sqlite(db, path),
    })
}

/// The default business table (`business_objects`, `OutboxTable::default`'s columns) in
/// the store's file, created when absent.
pub(crate) async fn outbox(db: &SqliteDb, path: &Path) -> Result<Arc<kernel_core::ports::DynOutbox>, ComposeError> {
    let open = |e| store_error(path, "open the dispatch outbox", e);
    let outbox = SqliteOutbox::new(db.clone(), OutboxTable::default()).map_err(open)?;
    outbox.ensure_table().await.map_err(open)?;
    Ok(Arc::new(outbox))
}

/// The observer's repository in the store's file (its tables come with the migrations).
pub(crate) fn observation_repository(db: &SqliteDb) -> Arc<observer::DynRepository> {
    Arc::new(SqliteObservationRepository::new(db.clone()))
}
