//! The `mongodb://` store driver: instances, the signal inbox, dead letters, the result
//! cache and the observation repository in one database.

use crate::{ComposeError, Role, StoreHandle, StoreSide, Target};
use std::sync::Arc;
use store_mongo::{
    MongoConfig, MongoDeadLetters, MongoOutbox, MongoResultCache, MongoSignalInbox, MongoWorkflowStore, OutboxSchema,
    RESULT_CACHE,
};

fn connect_error(
    target: &Target,
    what: &'static str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> ComposeError {
    ComposeError::Connect { role: Role::Store, url: crate::redact(&target.url), what, source: Box::new(e) }
}

pub(crate) async fn store(target: &Target) -> Result<StoreSide, ComposeError> {
    let db =
        store_mongo::connect(&target.url, &target.namespace).await.map_err(|e| connect_error(target, "connect", e))?;
    let store = MongoWorkflowStore::open(&db, MongoConfig::default())
        .await
        .map_err(|e| connect_error(target, "open the store", e))?;
    let inbox = MongoSignalInbox::open(&db, MongoConfig::default())
        .await
        .map_err(|e| connect_error(target, "open the inbox", e))?;
    let dead_letters = MongoDeadLetters::open(&db, MongoConfig::default())
        .await
        .map_err(|e| connect_error(target, "open the dead letters", e))?;
    let task_inbox = store_mongo::MongoTaskInbox::open(&db, MongoConfig::default())
        .await
        .map_err(|e| connect_error(target, "open the task inbox", e))?;
    let result_cache = MongoResultCache::open(&db, &MongoConfig::default(), RESULT_CACHE)
        .await
        .map_err(|e| connect_error(target, "open the result cache", e))?;
    let store_for_handle = store.clone();
    Ok(StoreSide {
        store: Arc::new(store),
        inbox: Arc::new(inbox),
        dead_letters: Arc::new(dead_letters),
        task_inbox: Arc::new(task_inbox),
        result_cache: Arc::new(result_cache),
        scheme: target.scheme,
        handle: StoreHandle::Mongo(db, store_for_handle),
    })
}

pub(crate) async fn observation_repository(
    db: &mongodb::Database,
) -> Result<Arc<observer::DynRepository>, ComposeError> {
    let repo = store_mongo::MongoObservationRepository::open(db).await.map_err(|e| ComposeError::Connect {
        role: Role::Store,
        url: format!("database {}", db.name()),
        what: "open the observation repository",
        source: Box::new(e),
    })?;
    Ok(Arc::new(repo))
}

pub(crate) async fn destroy(db: mongodb::Database) -> Result<(), ComposeError> {
    let name = db.name().to_string();
    db.drop().await.map_err(|e| ComposeError::Connect {
        role: Role::Store,
        url: format!("database {name}"),
        what: "drop the database",
        source: Box::new(e),
    })
}

pub(crate) async fn outbox(db: &mongodb::Database) -> Result<Arc<kernel_core::ports::DynOutbox>, ComposeError> {
    let outbox = MongoOutbox::open(db, OutboxSchema::default(), MongoConfig::default()).await.map_err(|e| {
        ComposeError::Connect {
            role: Role::Store,
            url: format!("database {}", db.name()),
            what: "open the dispatch outbox",
            source: Box::new(e),
        }
    })?;
    Ok(Arc::new(outbox))
}
