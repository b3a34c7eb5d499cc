//! The `redis://` queue driver: lanes, wakeup and permits on one shared connection under
//! one key prefix.

use crate::{ComposeError, QueueHandle, QueueOptions, QueueSide, Role, Target};
use permit_redis::{RedisPermits, RedisPermitsConfig};
use queue_redis::RedisConnection;
use std::sync::Arc;

fn error(target: &Target, what: &'static str, e: kernel_core::Error) -> ComposeError {
    ComposeError::Connect { role: Role::Queue, url: crate::redact(&target.url), what, source: Box::new(e) }
}

pub(crate) async fn queue(target: &Target, options: &QueueOptions) -> Result<QueueSide, ComposeError> {
    let conn = RedisConnection::open(&target.url).await.map_err(|e| error(target, "connect", e))?;
    let prefix = target.namespace.as_str();
    let lanes = conn.ready_queue(prefix, options.lane_weights).map_err(|e| error(target, "lanes", e))?;
    let wakeup = conn.wakeup(prefix).map_err(|e| error(target, "wakeup", e))?;
    let mut config = RedisPermitsConfig::new(prefix, options.permit_fallback).lease_ms(options.permit_lease_ms);
    for (resource, limits) in &options.permit_defaults {
        config = config.default_limits(resource.clone(), *limits);
    }
    let permits = RedisPermits::new(conn.connection().clone(), config).map_err(|e| error(target, "permits", e))?;
    Ok(QueueSide {
        queue: Arc::new(lanes),
        wakeup: Arc::new(wakeup),
        permits: Arc::new(permits),
        scheme: target.scheme,
        handle: QueueHandle::Redis(conn, prefix.to_string()),
    })
}

pub(crate) async fn destroy(conn: RedisConnection, prefix: String) -> Result<(), ComposeError> {
    conn.purge_prefix(&prefix).await.map(drop).map_err(|e| ComposeError::Connect {
        role: Role::Queue,
        url: format!("prefix {prefix}"),
        what: "purge the key prefix",
        source: Box::new(e),
    })
}

fn prefix_error(prefix: &str, what: &'static str, e: kernel_core::Error) -> ComposeError {
    ComposeError::Connect { role: Role::Queue, url: format!("prefix {prefix}"), what, source: Box::new(e) }
}

pub(crate) fn candidates(
    conn: &RedisConnection,
    prefix: &str,
) -> Result<Arc<kernel_core::ports::DynCandidates>, ComposeError> {
    let candidates = conn.dispatch_candidates(prefix).map_err(|e| prefix_error(prefix, "dispatch candidates", e))?;
    Ok(Arc::new(candidates))
}

pub(crate) fn stream_sink(
    conn: &RedisConnection,
    prefix: &str,
    clock: Arc<kernel_core::ports::DynClock>,
    secret: sse_stream::StreamSecret,
) -> Result<sse_stream::RedisStreamSink, ComposeError> {
    let config = sse_stream::StreamConfig::new(prefix, secret);
    sse_stream::RedisStreamSink::new(conn.connection().clone(), clock, config)
        .map_err(|e| prefix_error(prefix, "stream sink", e))
}
