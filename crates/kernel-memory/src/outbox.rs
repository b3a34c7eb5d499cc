use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result};
use kernel_core::{FencingToken, LeaseToken, ObjectId};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
struct Obj {
    fields: Map<String, Value>,
    status: Option<String>,
    dispatch: Option<DispatchIntent>,
}

#[derive(Debug, Default)]
struct State {
    objects: BTreeMap<String, Obj>,
    locks: BTreeMap<String, (String, Instant)>,
}

/// In-memory business collection with its dispatch outbox; one lock per call, so every
/// write is one atomic conditional update, as on a document store.
///
/// The business status is kept beside the user's fields; the previous-error field (default
/// `previous_error`) is a user field that a new round clears.
#[derive(Debug, Clone)]
pub struct InMemoryOutbox {
    state: Arc<Mutex<State>>,
    error_field: String,
    failed_status: String,
}

impl Default for InMemoryOutbox {
    fn default() -> Self {
        InMemoryOutbox { state: Arc::default(), error_field: "previous_error".into(), failed_status: "failed".into() }
    }
}

fn record(id: &str, o: &Obj) -> DispatchRecord {
    DispatchRecord {
        object_id: id.to_string().into(),
        business_status: o.status.clone(),
        dispatch: o.dispatch.clone(),
        fields: Value::Object(o.fields.clone()),
    }
}

/// Validate a dotted path of the user's document by the one K-2.0 rule of every store
/// ([`validate::field_path`]), refused naming `fields` as every outbox does.
pub(crate) fn field_path(path: &str) -> Result<()> {
    validate::field_path("fields", path).map(drop)
}

impl InMemoryOutbox {
    /// An empty collection.
    pub fn new() -> Self {
        Self::default()
    }
    /// Every object.
    pub fn all(&self) -> Vec<DispatchRecord> {
        self.state.lock().expect("outbox lock").objects.iter().map(|(k, o)| record(k, o)).collect()
    }
    /// Insert an object as it was before input snapshots existed (a legacy intent).
    pub fn insert_legacy(&self, object_id: &str, fields: Value, status: &str, mut intent: DispatchIntent) {
        intent.input = None;
        let fields = fields.as_object().cloned().unwrap_or_default();
        self.state
            .lock()
            .expect("outbox lock")
            .objects
            .insert(object_id.to_string(), Obj { fields, status: Some(status.into()), dispatch: Some(intent) });
    }
    fn with<T>(&self, object_id: &str, f: impl FnOnce(&mut Obj) -> T) -> Result<Option<T>> {
        validate::identifier("object_id", object_id)?;
        let mut st = self.state.lock().expect("outbox lock");
        Ok(st.objects.get_mut(object_id).map(f))
    }
}

/// The round and lease tokens of a lease holder's write (K-2.0), checked as every outbox
/// adapter checks them.
fn lease_tokens(f: &str, lease_token: &str) -> Result<()> {
    validate::identifier("fencing_token", f)?;
    validate::identifier("lease_token", lease_token)
}

/// `$set` of a dotted path: intermediate objects are created, non-objects replaced.
fn set_path(map: &mut Map<String, Value>, path: &str, v: Value) {
    match path.split_once('.') {
        None => {
            map.insert(path.to_string(), v);
        }
        Some((head, rest)) => {
            let child = map.entry(head.to_string()).or_insert_with(|| Value::Object(Map::new()));
            if !child.is_object() {
                *child = Value::Object(Map::new());
            }
            if let Value::Object(m) = child {
                set_path(m, rest, v);
            }
        }
    }
}

fn is(o: &Obj, f: &str, status: DispatchStatus) -> bool {
    o.dispatch.as_ref().is_some_and(|d| d.fencing_token == f && d.status == status)
}

fn leased(o: &Obj, f: &str, lease: &str) -> bool {
    is(o, f, DispatchStatus::Processing) && o.dispatch.as_ref().is_some_and(|d| d.lease_token.as_deref() == Some(lease))
}

#[async_trait::async_trait]
impl DispatchOutbox for InMemoryOutbox {
    async fn accept(
        &self,
        object_id: &ObjectId,
        fields: Value,
        initial_status: &str,
        intent: DispatchIntent,
    ) -> Result<AcceptOutcome> {
        // The shared K-2.0 rule, so this fake refuses exactly what a real outbox refuses.
        OutboxAccept { object_id, fields: &fields, initial_status, intent: &intent }
            .validate(validate::STORE_PAYLOAD_BYTES_MAX)?;
        let Value::Object(fields) = fields else { return Err(Error::invalid("fields", "must be a JSON object")) };
        let mut st = self.state.lock().expect("outbox lock");
        if st.objects.contains_key(object_id.as_str()) {
            return Ok(AcceptOutcome::Exists);
        }
        st.objects
            .insert(object_id.to_string(), Obj { fields, status: Some(initial_status.into()), dispatch: Some(intent) });
        Ok(AcceptOutcome::Accepted)
    }

    async fn get(&self, object_id: &ObjectId) -> Result<Option<DispatchRecord>> {
        validate::identifier("object_id", object_id)?;
        Ok(self.state.lock().expect("outbox lock").objects.get(object_id.as_str()).map(|o| record(object_id, o)))
    }

    async fn confirm_dispatched(&self, object_id: &ObjectId, f: &FencingToken) -> Result<bool> {
        validate::identifier("fencing_token", f)?;
        Ok(self
            .with(object_id, |o| {
                if !is(o, f, DispatchStatus::Pending) {
                    return false;
                }
                o.dispatch.as_mut().expect("checked").status = DispatchStatus::Dispatched;
                true
            })?
            .unwrap_or(false))
    }

    async fn defer_pending(&self, object_id: &ObjectId, f: &FencingToken, at: Instant) -> Result<bool> {
        validate::identifier("fencing_token", f)?;
        Ok(self
            .with(object_id, |o| {
                if !is(o, f, DispatchStatus::Pending) {
                    return false;
                }
                o.dispatch.as_mut().expect("checked").next_attempt_time = at;
                true
            })?
            .unwrap_or(false))
    }

    async fn try_lease(
        &self,
        object_id: &ObjectId,
        now: Instant,
        lease_token: &LeaseToken,
        lease_until: Instant,
    ) -> Result<Option<DispatchRecord>> {
        validate::identifier("lease_token", lease_token)?;
        Ok(self
            .with(object_id, |o| {
                let d = o.dispatch.as_mut()?;
                let due = (d.status == DispatchStatus::Pending && d.next_attempt_time <= now)
                    || (d.status == DispatchStatus::Processing && d.lease_until.is_some_and(|u| u < now));
                if !due {
                    return None;
                }
                d.status = DispatchStatus::Processing;
                d.lease_token = Some(lease_token.into());
                d.lease_until = Some(lease_until);
                Some(())
            })?
            .flatten()
            .and_then(|_| {
                self.state.lock().expect("outbox lock").objects.get(object_id.as_str()).map(|o| record(object_id, o))
            }))
    }

    async fn renew_lease(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        lease_token: &LeaseToken,
        lease_until: Instant,
    ) -> Result<bool> {
        lease_tokens(f, lease_token)?;
        Ok(self
            .with(object_id, |o| {
                if !leased(o, f, lease_token) {
                    return false;
                }
                o.dispatch.as_mut().expect("checked").lease_until = Some(lease_until);
                true
            })?
            .unwrap_or(false))
    }

    async fn confirm_leased(&self, object_id: &ObjectId, f: &FencingToken, lease_token: &LeaseToken) -> Result<bool> {
        lease_tokens(f, lease_token)?;
        Ok(self
            .with(object_id, |o| {
                if !leased(o, f, lease_token) {
                    return false;
                }
                let d = o.dispatch.as_mut().expect("checked");
                d.status = DispatchStatus::Dispatched;
                d.lease_token = None;
                d.lease_until = None;
                true
            })?
            .unwrap_or(false))
    }

    async fn revert_leased(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        lease_token: &LeaseToken,
        at: Instant,
    ) -> Result<bool> {
        lease_tokens(f, lease_token)?;
        Ok(self
            .with(object_id, |o| {
                if !leased(o, f, lease_token) {
                    return false;
                }
                let d = o.dispatch.as_mut().expect("checked");
                d.status = DispatchStatus::Pending;
                d.lease_token = None;
                d.lease_until = None;
                d.next_attempt_time = at;
                true
            })?
            .unwrap_or(false))
    }

    async fn scan_due(&self, now: Instant, after: Option<&ObjectId>, limit: usize) -> Result<Vec<(ObjectId, Instant)>> {
        if let Some(a) = after {
            validate::identifier("after", a)?;
        }
        let st = self.state.lock().expect("outbox lock");
        Ok(st
            .objects
            .iter()
            .filter(|(k, _)| after.is_none_or(|a| k.as_str() > a.as_str()))
            .filter_map(|(k, o)| {
                let d = o.dispatch.as_ref()?;
                match d.status {
                    DispatchStatus::Pending if d.next_attempt_time <= now => {
                        Some((ObjectId::from(k), d.next_attempt_time))
                    }
                    DispatchStatus::Processing if d.lease_until.is_some_and(|u| u < now) => {
                        Some((ObjectId::from(k), now))
                    }
                    _ => None,
                }
            })
            .take(limit)
            .collect())
    }

    async fn retry_failed(
        &self,
        object_id: &ObjectId,
        prev: &FencingToken,
        next: DispatchIntent,
        initial_status: &str,
    ) -> Result<bool> {
        validate::identifier("fencing_token", prev)?;
        validate::identifier("initial_status", initial_status)?;
        next.validate(validate::STORE_PAYLOAD_BYTES_MAX)?;
        Ok(self
            .with(object_id, |o| {
                let failed = o.status.as_deref() == Some(self.failed_status.as_str())
                    && o.dispatch.as_ref().is_some_and(|d| d.fencing_token == *prev);
                if !failed {
                    return false;
                }
                o.status = Some(initial_status.into());
                o.dispatch = Some(next);
                o.fields.remove(&self.error_field);
                true
            })?
            .unwrap_or(false))
    }

    async fn fenced_update(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        fields: Value,
        business_status: Option<&str>,
    ) -> Result<bool> {
        validate::identifier("fencing_token", f)?;
        let Value::Object(fields) = fields else { return Err(Error::invalid("fields", "must be a JSON object")) };
        for (k, v) in &fields {
            field_path(k)?;
            if k == "workflow_dispatch" || k.starts_with("workflow_dispatch.") {
                return Err(Error::invalid("fields", "the dispatch intent is not a business field"));
            }
            validate::payload("fields", v, validate::STORE_PAYLOAD_BYTES_MAX)?;
        }
        if let Some(s) = business_status {
            validate::identifier("business_status", s)?;
        }
        Ok(self
            .with(object_id, |o| {
                if o.dispatch.as_ref().is_none_or(|d| d.fencing_token != *f) {
                    return false;
                }
                for (k, v) in fields {
                    set_path(&mut o.fields, &k, v);
                }
                if let Some(s) = business_status {
                    o.status = Some(s.into());
                }
                true
            })?
            .unwrap_or(false))
    }

    async fn try_lock(&self, name: &str, holder: &str, now: Instant, until: Instant) -> Result<bool> {
        validate::identifier("lock name", name)?;
        validate::identifier("lock holder", holder)?;
        let mut st = self.state.lock().expect("outbox lock");
        let free = st.locks.get(name).is_none_or(|(h, u)| h == holder || *u <= now);
        if free {
            st.locks.insert(name.into(), (holder.into(), until));
        }
        Ok(free)
    }
}

/// id → due, and (due, id) ordered.
type Index = (BTreeMap<String, Instant>, BTreeSet<(Instant, String)>);

/// In-memory candidate index of the recovery dispatcher.
#[derive(Debug, Clone, Default)]
pub struct InMemoryCandidates {
    state: Arc<Mutex<Index>>,
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl InMemoryCandidates {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }
    /// Lose everything (a flushed Redis).
    pub fn flush(&self) {
        *self.state.lock().expect("candidates lock") = Default::default();
    }
    /// Fail every call until called with `false`.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }
    fn up(&self) -> Result<()> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::unavailable("candidate index is down"));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl DispatchCandidates for InMemoryCandidates {
    async fn add(&self, object_id: &ObjectId, due: Instant) -> Result<()> {
        validate::identifier("object_id", object_id)?;
        self.up()?;
        let mut st = self.state.lock().expect("candidates lock");
        if let Some(old) = st.0.insert(object_id.to_string(), due) {
            st.1.remove(&(old, object_id.to_string()));
        }
        st.1.insert((due, object_id.to_string()));
        Ok(())
    }

    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<ObjectId>> {
        self.up()?;
        let mut st = self.state.lock().expect("candidates lock");
        let due: Vec<(Instant, String)> = st.1.iter().take_while(|(d, _)| *d <= now).take(max).cloned().collect();
        for (d, id) in &due {
            st.1.remove(&(*d, id.clone()));
            st.0.remove(id);
        }
        Ok(due.into_iter().map(|(_, id)| ObjectId::from(id)).collect())
    }
}
