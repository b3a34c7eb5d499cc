//! The `postgres://` store driver: instances, the signal inbox, dead letters, the result
//! cache and the dispatch outbox in one schema of one database, migrated on connect.

use crate::{ComposeError, Role, StoreHandle, StoreSide, Target};
use std::sync::Arc;
use store_postgres::{
    OutboxTable, PostgresConfig, PostgresDeadLetters, PostgresOutbox, PostgresResultCache, PostgresSignalInbox,
    PostgresWorkflowStore,
};

fn store_error(url: String, what: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> ComposeError {
    ComposeError::Connect { role: Role::Store, url, what, source: Box::new(e) }
}

fn in_schema(schema: &str) -> String {
    format!("schema {schema}")
}

pub(crate) async fn store(target: &Target) -> Result<StoreSide, ComposeError> {
    let url = crate::redact(&target.url);
    let config = PostgresConfig { schema: target.namespace.clone(), ..PostgresConfig::default() };
    let pool = store_postgres::connect(&target.url, &config).map_err(|e| store_error(url.clone(), "connect", e))?;
    // The first round trip: an unreachable server is reported here, not at the first call.
    store_postgres::migrate(&pool, &config.schema).await.map_err(|e| store_error(url.clone(), "migrate", e))?;
    let store = PostgresWorkflowStore::new(pool.clone(), config.clone())
        .map_err(|e| store_error(url.clone(), "open the store", e))?;
    let inbox = PostgresSignalInbox::new(pool.clone(), config.clone())
        .map_err(|e| store_error(url.clone(), "open the inbox", e))?;
    let dead_letters = PostgresDeadLetters::new(pool.clone(), config.clone())
        .map_err(|e| store_error(url.clone(), "open the dead letters", e))?;
    let task_inbox = store_postgres::PostgresTaskInbox::new(pool.clone(), config.clone())
        .map_err(|e| store_error(url.clone(), "open the task inbox", e))?;
    let result_cache = PostgresResultCache::new(pool.clone(), config.clone())
        .map_err(|e| store_error(url, "open the result cache", e))?;
    Ok(StoreSide {
        store: Arc::new(store.clone()),
        inbox: Arc::new(inbox),
        dead_letters: Arc::new(dead_letters),
        task_inbox: Arc::new(task_inbox),
        result_cache: Arc::new(result_cache),
        scheme: target.scheme,
        handle: StoreHandle::Postgres(pool, config, store),
    })
}

/// The default business table (`business_objects`, `OutboxTable::default`'s columns) in
/// the store's own schema, created when absent.
pub(crate) async fn outbox(
    pool: &store_postgres::Pool,
    config: &PostgresConfig,
) -> Result<Arc<kernel_core::ports::DynOutbox>, ComposeError> {
    let table = OutboxTable { schema: config.schema.clone(), ..OutboxTable::default() };
    let open = |e| store_error(in_schema(&config.schema), "open the dispatch outbox", e);
    let outbox = PostgresOutbox::new(pool.clone(), config.clone(), table).map_err(open)?;
    outbox.ensure_table().await.map_err(open)?;
    Ok(Arc::new(outbox))
}

/// The observer's repository in the store's own schema (its tables come with the
/// store's migrations).
pub(crate) fn observation_repository(
    pool: &store_postgres::Pool,
    config: &PostgresConfig,
) -> Result<Arc<observer::DynRepository>, ComposeError> {
    let repo = store_postgres::PostgresObservationRepository::new(pool.clone(), config.clone())
        .map_err(|e| store_error(in_schema(&config.schema), "open the observation repository", e))?;
    Ok(Arc::new(repo))
}

pub(crate) async fn destroy(pool: store_postgres::Pool, config: PostgresConfig) -> Result<(), ComposeError> {
    let url = in_schema(&config.schema);
    let client = pool.get().await.map_err(|e| store_error(url.clone(), "connect to drop the schema", e))?;
    // The name passed store-postgres's identifier check (`[a-z0-9_]`), so quoting is enough.
    let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", config.schema);
    client.batch_execute(&sql).await.map_err(|e| store_error(url, "drop the schema", e))
}
