use crate::db::{self, Db, Kind};
use kernel_core::domain::{DurationMs, Instant, Priority};
use kernel_core::ports::{check_enqueue_many, check_pop_max, LaneEntry, LaneStats, LaneWeights, ReadyQueue};
use kernel_core::{validate, Result, WorkflowId};
use rusqlite::{params, OptionalExtension, Transaction};
use std::collections::VecDeque;
use std::sync::Arc;

/// Promote-only upsert of one member (K-13), one statement: a new member is inserted; a
/// member in a less urgent lane (or its own) takes the requested lane and score; a member
/// in a more urgent lane is left alone (the `WHERE` of the update misses). The primary key
/// keeps a member in one lane.
pub(crate) const ENQUEUE: &str = "INSERT INTO coord_lane (workflow_id, lane, claimable_at) VALUES (?1, ?2, ?3) \
     ON CONFLICT (workflow_id) DO UPDATE SET lane = excluded.lane, claimable_at = excluded.claimable_at \
     WHERE excluded.lane <= coord_lane.lane";

/// A lane's due members in pop order: (score, member bytes), like a Redis ZSET.
pub(crate) const DUE: &str = "SELECT workflow_id FROM coord_lane WHERE lane = ?1 AND claimable_at <= ?2 \
     ORDER BY claimable_at, workflow_id LIMIT ?3";

pub(crate) const TAKE: &str = "DELETE FROM coord_lane WHERE workflow_id = ?1";

pub(crate) const ROTATION: &str = "SELECT current, served, burst_left FROM coord_lane_rotation WHERE id = 0";

pub(crate) const SAVE_ROTATION: &str =
    "INSERT INTO coord_lane_rotation (id, current, served, burst_left) VALUES (0, ?1, ?2, ?3) \
     ON CONFLICT (id) DO UPDATE SET current = excluded.current, served = excluded.served, \
     burst_left = excluded.burst_left";

pub(crate) const STATS: &str = "SELECT lane, count(*), coalesce(sum(claimable_at <= ?1), 0), min(claimable_at) \
     FROM coord_lane GROUP BY lane";

/// Add a batch's pops of one lane to its counter.
pub(crate) const COUNT_POPS: &str = "INSERT INTO coord_lane_pops (lane, pops) VALUES (?1, ?2) \
     ON CONFLICT (lane) DO UPDATE SET pops = pops + excluded.pops";

/// The pop counters.
pub(crate) const POPS: &str = "SELECT lane, pops FROM coord_lane_pops";

/// The ready lanes (K-13) in the SQLite file: table `coord_lane` (one row per member:
/// `workflow_id` primary key, `lane` 0–3, `claimable_at` in ms), the rotation row
/// `coord_lane_rotation` (`current`, `served`, `burst_left`) that every process shares, and
/// the per-lane pop counters `coord_lane_pops` that a batch pop bumps in its own
/// transaction ([`LaneStats::pops`]).
///
/// Semantics are exactly those of `kernel_memory::InMemoryQueue` and the Redis adapter;
/// all three run the same conformance suite. Each call is one transaction: `enqueue` (one
/// upsert), `enqueue_many` (its entries' upserts in order) and `pop_due` are one `BEGIN
/// IMMEDIATE` transaction each (so a batch pop sees no other writer between its pops, in
/// this process or another), `stats` one read transaction (the four lanes consistent with
/// each other).
///
/// Due-ness compares scores with the caller's `now` (K-13), so a manual clock drives it.
/// Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct LocalQueue {
    pub(crate) db: Arc<Db>,
    pub(crate) weights: LaneWeights,
}

impl LocalQueue {
    /// Weights in use.
    pub fn weights(&self) -> LaneWeights {
        self.weights
    }

    /// Lane and score of a member, if queued (a diagnostic).
    pub async fn lane_of(&self, member: &WorkflowId) -> Result<Option<(Priority, Instant)>> {
        let member = member.to_string();
        self.db
            .call("lane_of", Kind::Read, move |c, ctx| {
                db::read(c, ctx, "lane_of", |tx| {
                    tx.query_row("SELECT lane, claimable_at FROM coord_lane WHERE workflow_id = ?1", [&member], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
                    })
                    .optional()
                })
            })
            .await
            .map(|row| row.map(|(lane, at)| (Priority::ALL[lane.clamp(0, 3) as usize], Instant::from_millis(at))))
    }

    /// Delete every member, the rotation state and the pop counters (what a flushed Redis
    /// loses; the rebuild scan restores the lanes).
    pub async fn clear(&self) -> Result<()> {
        self.db
            .call("clear", Kind::Write, |c, ctx| {
                db::write(c, ctx, "clear", |tx| {
                    tx.execute_batch(
                        "DELETE FROM coord_lane; DELETE FROM coord_lane_rotation; DELETE FROM coord_lane_pops;",
                    )
                })
            })
            .await
    }
}

/// The rotation and burst state of one batch, over the lanes' due members read at its
/// start (the transaction holds the write lock, so they cannot change meanwhile).
#[derive(Debug, Default)]
struct Rotation {
    current: usize,
    served: u32,
    burst_left: u32,
}

impl Rotation {
    fn load(tx: &Transaction<'_>) -> rusqlite::Result<Rotation> {
        let row: Option<(i64, i64, i64)> =
            tx.prepare_cached(ROTATION)?.query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).optional()?;
        let (current, served, burst_left) = row.unwrap_or_default();
        // A damaged row restarts the rotation, as the Redis script does, instead of
        // failing every pop.
        Ok(Rotation {
            current: if (0..4).contains(&current) { current as usize } else { 0 },
            served: u32::try_from(served).unwrap_or(0),
            burst_left: u32::try_from(burst_left).unwrap_or(0),
        })
    }

    fn save(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.prepare_cached(SAVE_ROTATION)?.execute(params![self.current as i64, self.served, self.burst_left])?;
        Ok(())
    }

    /// One weighted pop (K-13) over `lanes` (each lane's remaining due members in order):
    /// the lane popped from and the member.
    fn pop(&mut self, weights: &LaneWeights, lanes: &mut [VecDeque<String>; 4]) -> Option<(usize, String)> {
        if self.burst_left > 0 {
            if let Some(m) = lanes[0].pop_front() {
                self.burst_left -= 1;
                return Some((0, m));
            }
            // The window ends early the first time P0 has nothing due.
            self.burst_left = 0;
        }
        // Five steps: every lane once, plus the starting lane again with a fresh block.
        for _ in 0..5 {
            let cur = self.current;
            if self.served < weights.weights[cur] {
                if let Some(m) = lanes[cur].pop_front() {
                    self.served += 1;
                    if self.served >= weights.weights[cur] {
                        self.current = (cur + 1) % 4;
                        self.served = 0;
                    }
                    return Some((cur, m));
                }
            }
            // Nothing due (or block used up): skip at once, forfeiting the rest of the block.
            self.current = (cur + 1) % 4;
            self.served = 0;
        }
        if lanes.iter().all(VecDeque::is_empty) {
            self.burst_left = weights.burst;
        }
        None
    }
}

/// Up to `max` single pops in one transaction, stopped by the first empty one.
///
/// Each lane's due members are read once, at most `max` per lane: a batch pops at most
/// `max` members in all, so a lane holding `max` due members cannot run dry within it,
/// and "this lane has nothing due" is exactly "its list is empty".
fn pop_batch(tx: &Transaction<'_>, weights: &LaneWeights, now: Instant, max: usize) -> rusqlite::Result<Vec<String>> {
    let mut lanes: [VecDeque<String>; 4] = Default::default();
    {
        let mut due = tx.prepare_cached(DUE)?;
        for (i, lane) in lanes.iter_mut().enumerate() {
            let rows = due.query_map(params![i as i64, now.as_millis(), max as i64], |r| r.get::<_, String>(0))?;
            for m in rows {
                lane.push_back(m?);
            }
        }
    }
    let mut rot = Rotation::load(tx)?;
    let mut out = Vec::with_capacity(max.min(64));
    let mut popped = [0i64; 4];
    while out.len() < max {
        match rot.pop(weights, &mut lanes) {
            Some((lane, m)) => {
                popped[lane] += 1;
                out.push(m);
            }
            // The empty pop has armed the burst window; the contract stops here.
            None => break,
        }
    }
    {
        let mut take = tx.prepare_cached(TAKE)?;
        for m in &out {
            take.execute([m])?;
        }
    }
    rot.save(tx)?;
    let mut count = tx.prepare_cached(COUNT_POPS)?;
    for (lane, n) in popped.iter().enumerate() {
        if *n > 0 {
            count.execute(params![lane as i64, n])?;
        }
    }
    Ok(out)
}

#[async_trait::async_trait]
impl ReadyQueue for LocalQueue {
    async fn enqueue(&self, workflow_id: &WorkflowId, priority: Priority, claimable_at: Instant) -> Result<()> {
        validate::identifier("workflow_id", workflow_id.as_str())?;
        let id = workflow_id.to_string();
        self.db
            .call("enqueue", Kind::Write, move |c, ctx| {
                db::write(c, ctx, "enqueue", |tx| {
                    tx.prepare_cached(ENQUEUE)?.execute(params![id, priority.index() as i64, claimable_at.as_millis()])
                })
            })
            .await?;
        Ok(())
    }

    async fn enqueue_many(&self, entries: &[LaneEntry]) -> Result<()> {
        // Every entry is checked before the first write: a refused batch stores nothing.
        check_enqueue_many(entries)?;
        if entries.is_empty() {
            return Ok(());
        }
        let rows: Vec<(String, i64, i64)> = entries
            .iter()
            .map(|LaneEntry { workflow_id, priority, claimable_at }| {
                (workflow_id.to_string(), priority.index() as i64, claimable_at.as_millis())
            })
            .collect();
        self.db
            .call("enqueue_many", Kind::Write, move |c, ctx| {
                db::write(c, ctx, "enqueue_many", |tx| {
                    let mut up = tx.prepare_cached(ENQUEUE)?;
                    for (id, lane, at) in &rows {
                        up.execute(params![id, lane, at])?;
                    }
                    Ok(())
                })
            })
            .await
    }

    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<WorkflowId>> {
        check_pop_max(max)?;
        let weights = self.weights;
        let ids = self
            .db
            .call("pop_due", Kind::Write, move |c, ctx| {
                db::write(c, ctx, "pop_due", |tx| pop_batch(tx, &weights, now, max))
            })
            .await?;
        debug_assert!(ids.len() <= max);
        Ok(ids.into_iter().map(WorkflowId::from).collect())
    }

    async fn stats(&self, now: Instant) -> Result<[LaneStats; 4]> {
        let rows = self
            .db
            .call("stats", Kind::Read, move |c, ctx| {
                db::read(c, ctx, "stats", |tx| {
                    let mut st = tx.prepare_cached(STATS)?;
                    let rows = st.query_map([now.as_millis()], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, Option<i64>>(3)?))
                    })?;
                    let rows = rows.collect::<rusqlite::Result<Vec<_>>>()?;
                    let mut pops = tx.prepare_cached(POPS)?;
                    let pops = pops.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?;
                    Ok((rows, pops.collect::<rusqlite::Result<Vec<_>>>()?))
                })
            })
            .await?;
        let (rows, pops) = rows;
        let mut out = [LaneStats::default(); 4];
        for (lane, n) in pops {
            let Some(slot) = usize::try_from(lane).ok().and_then(|l| out.get_mut(l)) else { continue };
            slot.pops = n.max(0) as u64;
        }
        for (lane, depth, ready, oldest) in rows {
            let Some(slot) = usize::try_from(lane).ok().and_then(|l| out.get_mut(l)) else { continue };
            let (depth, ready) = (depth.max(0) as u64, ready.max(0) as u64);
            let oldest_wait_ms = match oldest {
                Some(at) if at <= now.as_millis() => now - Instant::from_millis(at),
                _ => DurationMs::ZERO,
            };
            *slot = LaneStats { depth, ready, delayed: depth - ready.min(depth), oldest_wait_ms, pops: slot.pops };
        }
        Ok(out)
    }
}
