//! Fake business systems for the scenarios and the examples: a business collection with fencing tokens
//! (K-11.5, K-12) and an asynchronous speech-recognition service that deduplicates by the
//! kernel's idempotency key (K-17.1).

use kernel_core::ports::DynStore;
use kernel_core::WorkflowId;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;

/// One business object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BusinessObject {
    /// Current round.
    pub fencing_token: String,
    /// `initial`, `processing`, `done`, `failed`.
    pub status: String,
    /// The round's result.
    pub result: Option<String>,
    /// Quota held by the current round.
    pub quota_held: bool,
}

/// A fake business collection. Every write is fenced by the round's token: a write with an
/// old token changes nothing (the `WHERE fencing_token = f` of K-11.5).
#[derive(Debug, Default)]
pub struct Business {
    objects: Mutex<BTreeMap<String, BusinessObject>>,
    facts: Mutex<BTreeMap<String, bool>>,
    subscribers: Mutex<BTreeMap<String, Vec<String>>>,
    late_writes_rejected: AtomicU64,
    notifications: AtomicU64,
}

impl Business {
    /// Accept a request: the object at round `token`.
    pub fn accept(&self, object_id: &str, token: &str) {
        self.objects.lock().expect("biz lock").insert(
            object_id.to_string(),
            BusinessObject { fencing_token: token.to_string(), status: "initial".into(), ..Default::default() },
        );
    }
    /// Start a new round after a failure (the CAS of K-11.4): `failed + prev → initial + next`.
    pub fn new_round(&self, object_id: &str, prev: &str, next: &str) -> bool {
        let mut o = self.objects.lock().expect("biz lock");
        match o.get_mut(object_id) {
            Some(obj) if obj.status == "failed" && obj.fencing_token == prev => {
                *obj =
                    BusinessObject { fencing_token: next.to_string(), status: "initial".into(), ..Default::default() };
                true
            }
            _ => false,
        }
    }
    /// Read an object.
    pub fn get(&self, object_id: &str) -> Option<BusinessObject> {
        self.objects.lock().expect("biz lock").get(object_id).cloned()
    }
    /// All objects.
    pub fn all(&self) -> BTreeMap<String, BusinessObject> {
        self.objects.lock().expect("biz lock").clone()
    }
    /// Apply `f` only while the object's round is `token`. Returns whether it changed.
    pub fn fenced(&self, object_id: &str, token: &str, f: impl FnOnce(&mut BusinessObject)) -> bool {
        let mut o = self.objects.lock().expect("biz lock");
        match o.get_mut(object_id) {
            Some(obj) if obj.fencing_token == token => {
                f(obj);
                true
            }
            _ => {
                self.late_writes_rejected.fetch_add(1, Ordering::SeqCst);
                false
            }
        }
    }
    /// Writes refused because the round had moved on.
    pub fn late_writes_rejected(&self) -> u64 {
        self.late_writes_rejected.load(Ordering::SeqCst)
    }
    /// Set a business fact (e.g. "live-7 is ready").
    pub fn set_fact(&self, key: &str) {
        self.facts.lock().expect("biz lock").insert(key.to_string(), true);
    }
    /// Read a business fact.
    pub fn fact(&self, key: &str) -> bool {
        self.facts.lock().expect("biz lock").get(key).copied().unwrap_or(false)
    }
    /// Register a subscriber workflow of a live.
    pub fn subscribe(&self, live_id: &str, workflow_id: &str) {
        let mut s = self.subscribers.lock().expect("biz lock");
        let v = s.entry(live_id.to_string()).or_default();
        if !v.iter().any(|w| w == workflow_id) {
            v.push(workflow_id.to_string());
            v.sort();
        }
    }
    /// Subscriber workflows of a live, sorted.
    pub fn subscribers(&self, live_id: &str) -> Vec<String> {
        self.subscribers.lock().expect("biz lock").get(live_id).cloned().unwrap_or_default()
    }
    /// Count a (best-effort) notification.
    pub fn notify(&self) {
        self.notifications.fetch_add(1, Ordering::SeqCst);
    }
    /// Notifications sent.
    pub fn notifications(&self) -> u64 {
        self.notifications.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Clone)]
struct Job {
    owner: (String, u32),
    polls: u32,
}

/// A fake asynchronous ASR service. `submit` deduplicates by idempotency key; a job is done
/// after `polls_to_finish` polls.
pub struct FakeAsr {
    jobs: Mutex<BTreeMap<String, Job>>,
    by_key: Mutex<BTreeMap<String, String>>,
    submissions: AtomicU64,
    late_submissions: AtomicU64,
    polls_to_finish: u32,
    store: Option<Arc<DynStore>>,
    step_name: String,
}

impl std::fmt::Debug for FakeAsr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeAsr").field("submissions", &self.submissions()).finish_non_exhaustive()
    }
}

impl FakeAsr {
    /// A service finishing each job after `polls_to_finish` polls. With `store`, every
    /// submission checks that no task id is committed yet for that run.
    pub fn new(polls_to_finish: u32, store: Option<Arc<DynStore>>, step_name: &str) -> Self {
        FakeAsr {
            jobs: Mutex::default(),
            by_key: Mutex::default(),
            submissions: AtomicU64::new(0),
            late_submissions: AtomicU64::new(0),
            polls_to_finish,
            store,
            step_name: step_name.to_string(),
        }
    }

    /// Submit a job; the same key returns the same task id.
    pub async fn submit(&self, idempotency_key: &str, workflow_id: &str, workflow_run: u32) -> String {
        self.submissions.fetch_add(1, Ordering::SeqCst);
        if let Some(store) = &self.store {
            if let Some(inst) = store.get(&WorkflowId::from(workflow_id)).await.ok().flatten() {
                let committed = inst.retry_count == workflow_run
                    && inst.steps.iter().any(|s| {
                        s.name == self.step_name && s.checkpoint.as_ref().is_some_and(|c| c.get("task_id").is_some())
                    });
                if committed {
                    self.late_submissions.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let mut keys = self.by_key.lock().expect("asr lock");
        if let Some(id) = keys.get(idempotency_key) {
            return id.clone();
        }
        let mut jobs = self.jobs.lock().expect("asr lock");
        let id = format!("asr-{}", jobs.len() + 1);
        jobs.insert(id.clone(), Job { owner: (workflow_id.to_string(), workflow_run), polls: 0 });
        keys.insert(idempotency_key.to_string(), id.clone());
        id
    }

    /// Poll a job: `Some(transcript)` once done.
    pub fn poll(&self, task_id: &str) -> Option<String> {
        let mut jobs = self.jobs.lock().expect("asr lock");
        let job = jobs.get_mut(task_id)?;
        job.polls += 1;
        (job.polls >= self.polls_to_finish).then(|| format!("transcript of {task_id}"))
    }

    /// Most jobs created for one (workflow, run).
    pub fn effective_jobs_max(&self) -> u64 {
        let mut per: BTreeMap<(String, u32), u64> = BTreeMap::new();
        for j in self.jobs.lock().expect("asr lock").values() {
            *per.entry(j.owner.clone()).or_insert(0) += 1;
        }
        per.values().copied().max().unwrap_or(0)
    }
    /// Submissions seen after the task id was committed.
    pub fn late_submissions(&self) -> u64 {
        self.late_submissions.load(Ordering::SeqCst)
    }
    /// Submissions seen.
    pub fn submissions(&self) -> u64 {
        self.submissions.load(Ordering::SeqCst)
    }
}

/// A fake language model for the compose step: deterministic, no network. It streams its
/// answer in small chunks to a streaming step's readers (K-16) and counts its calls; the
/// kernel records every call with the step (K-17.3), so a compose re-run after a crash
/// reads the recorded summary instead of calling it again.
#[derive(Debug, Default)]
pub struct FakeSummarizer {
    calls: AtomicU64,
}

impl FakeSummarizer {
    /// Calls it answered.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl kernel_core::model_call::Model for FakeSummarizer {
    fn version(&self) -> kernel_core::record::VersionRef {
        kernel_core::record::VersionRef::new("fake-summarizer", "1")
    }
    async fn generate(
        &self,
        request: &kernel_core::model_call::ModelRequest,
        ctx: &kernel_core::ActivityContext,
    ) -> Result<kernel_core::model_call::ModelAnswer, kernel_core::ActivityError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let transcript = request.input.get("transcript").and_then(|t| t.as_str()).unwrap_or_default();
        let summary = format!("summary({transcript})");
        if let Some(s) = ctx.stream() {
            for chunk in summary.as_bytes().chunks(8) {
                let _ = s.text(String::from_utf8_lossy(chunk)).await;
            }
        }
        let raw = serde_json::json!({ "summary": summary }).to_string();
        let usage = kernel_core::record::Usage {
            input_tokens: transcript.len() as u64 / 4 + 1,
            output_tokens: raw.len() as u64 / 4 + 1,
            cost_micros: 0,
        };
        Ok(kernel_core::model_call::ModelAnswer { raw, usage })
    }
}
