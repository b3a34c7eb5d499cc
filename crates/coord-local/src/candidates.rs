use crate::db::{self, Db, Kind};
use kernel_core::domain::Instant;
use kernel_core::ports::DispatchCandidates;
use kernel_core::{validate, ObjectId, Result};
use rusqlite::params;
use std::sync::Arc;

pub(crate) const ADD: &str = "INSERT INTO coord_dispatch (object_id, due) VALUES (?1, ?2) \
     ON CONFLICT (object_id) DO UPDATE SET due = excluded.due";
pub(crate) const DUE: &str = "SELECT object_id FROM coord_dispatch WHERE due <= ?1 ORDER BY due, object_id LIMIT ?2";
pub(crate) const TAKE: &str = "DELETE FROM coord_dispatch WHERE object_id = ?1";

/// Most candidates one [`LocalCandidates`] pop returns (a larger `max` is capped).
pub const DISPATCH_BATCH_MAX: usize = 1_000;

/// The recovery dispatcher's candidate index (K-11.3) in the SQLite file: table
/// `coord_dispatch` (`object_id` primary key, `due` in ms). Identity and due time only,
/// never tokens; losing it costs latency only (the store scan refills it).
///
/// `add` is one upsert; `pop_due` one `BEGIN IMMEDIATE` transaction that reads
/// the earliest due candidates (by due time, then id) and deletes them, so two
/// dispatchers — in one process or several — never pop the same one.
#[derive(Debug, Clone)]
pub struct LocalCandidates {
    pub(crate) db: Arc<Db>,
}

impl LocalCandidates {
    /// Number of candidates (due or not).
    pub async fn len(&self) -> Result<u64> {
        self.db
            .call("dispatch.len", Kind::Read, |c, ctx| {
                db::read(c, ctx, "dispatch.len", |tx| {
                    tx.query_row("SELECT count(*) FROM coord_dispatch", [], |r| r.get::<_, i64>(0))
                })
            })
            .await
            .map(|n| n.max(0) as u64)
    }

    /// Whether no candidate is stored.
    pub async fn is_empty(&self) -> Result<bool> {
        Ok(self.len().await? == 0)
    }
}

#[async_trait::async_trait]
impl DispatchCandidates for LocalCandidates {
    async fn add(&self, object_id: &ObjectId, due: Instant) -> Result<()> {
        validate::identifier("object_id", object_id.as_str())?;
        let id = object_id.to_string();
        self.db
            .call("dispatch.add", Kind::Write, move |c, ctx| {
                db::write(c, ctx, "dispatch.add", |tx| tx.prepare_cached(ADD)?.execute(params![id, due.as_millis()]))
            })
            .await?;
        Ok(())
    }

    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<ObjectId>> {
        if max == 0 {
            return Ok(vec![]);
        }
        let max = max.min(DISPATCH_BATCH_MAX);
        let ids = self
            .db
            .call("dispatch.pop_due", Kind::Write, move |c, ctx| {
                db::write(c, ctx, "dispatch.pop_due", |tx| {
                    let ids: Vec<String> = tx
                        .prepare_cached(DUE)?
                        .query_map(params![now.as_millis(), max as i64], |r| r.get(0))?
                        .collect::<rusqlite::Result<_>>()?;
                    let mut del = tx.prepare_cached(TAKE)?;
                    for id in &ids {
                        del.execute([id])?;
                    }
                    Ok(ids)
                })
            })
            .await?;
        Ok(ids.into_iter().map(ObjectId::from).collect())
    }
}
