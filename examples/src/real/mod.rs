//! Real worker processes on a durable store: the pieces the real-process demo
//! ([`demo`], the README's first command) and the real-crash run ([`crash`]) share.
//!
//! A supervisor process re-executes its own binary with the argument `worker` as worker
//! processes on the store and queue its URLs name (through [`compose`], the one place
//! that picks adapters), kills them with `SIGKILL`, stops them with `SIGSTOP` past their
//! lease and resumes them with `SIGCONT`. Workers tell the supervisor what happened by
//! appending JSON lines to a file of their own ([`EventLog`]): every committed transition
//! (an [`ObservationSink`]), every write the store refused ([`WatchStore`]) and the
//! markers their activities set. The supervisor never takes a worker's word for a result:
//! it reads the store, the business objects and the oracle file after every worker stopped.
//!
//! Which drivers are compiled in is this package's `durable` cargo feature; which URLs are
//! used when none is given is [`DEFAULT_STORE_URL`] and [`DEFAULT_QUEUE_URL`].

pub mod crash;
pub mod demo;
pub mod oracle;
#[cfg(feature = "durable")]
pub mod steps;

use compose::{Deployment, QueueOptions, Urls};
use kernel_core::domain::DurationMs;
use kernel_core::engine::EngineConfig;
use kernel_core::ports::{
    Candidate, ClaimSpec, CreateOutcome, DueCursor, DueWait, DynStore, Observation, ObservationSink, ScanPage,
    WorkflowStore, WriteOutcome,
};
use kernel_core::transition::{Guard, Transition};
use kernel_core::{Instant, WorkflowId, WorkflowInstance};
use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The store URL when neither `--store` nor `WFK_STORE` names one: `sqlite:` alone, which
/// [`fresh_store_url`] turns into a new file `workflows.db` in the run's directory. Any
/// `sqlite:<path>`, `postgres://…` or `mongodb://…` URL works where compose has the driver.
pub const DEFAULT_STORE_URL: &str = "sqlite:";
/// The queue URL when neither `--queue` nor `WFK_QUEUE` names one: `local`, coord-local's
/// lanes, wakeup and permits in the store's own file, shared by every worker process.
pub const DEFAULT_QUEUE_URL: &str = "local";

/// The argument that makes the demo's binary a worker process.
pub const WORKER_ARG: &str = "worker";
/// Claim lease of the workers: short, so a takeover after a kill or a stop takes seconds.
pub const LEASE_MS: i64 = 2_000;
/// Lease of a traffic permit (renewed every 500 ms while an activity holds it).
pub const PERMIT_LEASE_MS: i64 = 2_000;

/// The workers' engine settings: a [`LEASE_MS`] lease renewed every 500 ms, polling every
/// 250 ms and a maintenance pass (timers, expired leases) every 400 ms, so everything the
/// runs show happens within seconds.
pub fn engine_config(worker_id: &str) -> EngineConfig {
    EngineConfig {
        worker_id: worker_id.to_string(),
        lease_ms: DurationMs::from_millis(LEASE_MS),
        heartbeat_ms: DurationMs::from_millis(500),
        heartbeat_deadline_ms: DurationMs::from_millis(900),
        poll_interval_ms: DurationMs::from_millis(250),
        rebuild_interval_ms: DurationMs::from_millis(400),
        signal_repair_interval_ms: DurationMs::from_millis(1_000),
        permit_retry_ms: DurationMs::from_millis(400),
        permit_renew_ms: DurationMs::from_millis(500),
        finalizer_retry_ms: DurationMs::from_millis(500),
        store_call_deadline_ms: DurationMs::from_millis(5_000),
        shutdown_timeout_ms: DurationMs::from_millis(3_000),
        ..EngineConfig::default()
    }
}

/// Queue settings of every process of a run: `permits` as the configured limits, permits
/// leased for [`PERMIT_LEASE_MS`].
pub fn queue_options(permits: std::collections::HashMap<String, kernel_core::ports::PermitLimits>) -> QueueOptions {
    QueueOptions {
        permit_defaults: permits,
        permit_lease_ms: DurationMs::from_millis(PERMIT_LEASE_MS),
        ..QueueOptions::default()
    }
}

/// Wall-clock milliseconds since the epoch (comparable across the processes of a run).
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A new directory for one run under the system's temporary directory.
pub fn run_dir(tag: &str) -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("wfk-{tag}-{}-{:x}", std::process::id(), wall_ms()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Set `key=value` in the query of `url`, replacing a value it had.
fn with_param(url: &str, key: &str, value: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut pairs: Vec<String> =
        query.split('&').filter(|p| !p.is_empty() && p.split('=').next() != Some(key)).map(str::to_string).collect();
    pairs.push(format!("{key}={value}"));
    format!("{base}?{}", pairs.join("&"))
}

/// Whether a URL names a server the run shares with others (its namespace is made fresh
/// and deleted at the end) rather than a file of the run's own.
pub fn is_server(url: &str) -> bool {
    ["postgres:", "postgresql:", "redis:", "rediss:", "mongodb:", "mongodb+srv:"].iter().any(|s| url.starts_with(s))
}

/// The store URL the processes of one run share: a server URL in a fresh schema
/// (`?schema=<tag>_<hex>`), `sqlite:` alone as a new file `workflows.db` in `dir`, any other
/// URL as given.
pub fn fresh_store_url(url: &str, dir: &Path, tag: &str) -> String {
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        with_param(url, "schema", &format!("{tag}_{:x}", wall_ms() ^ i64::from(std::process::id())))
    } else if url == "sqlite:" {
        format!("sqlite:{}", dir.join("workflows.db").display())
    } else {
        url.to_string()
    }
}

/// The queue URL of one run: a Redis URL under a fresh key prefix, `sqlite:` alone as the
/// store's own file (`store` as made by [`fresh_store_url`]), any other URL as given.
pub fn fresh_queue_url(url: &str, store: &str, tag: &str) -> String {
    if url.starts_with("redis:") || url.starts_with("rediss:") {
        with_param(url, "prefix", &format!("{tag}_{:x}", wall_ms() ^ i64::from(std::process::id())))
    } else if url == "sqlite:" && store.starts_with("sqlite:") {
        store.to_string()
    } else {
        url.to_string()
    }
}

/// The URLs of a supervisor: `--store`/`--queue`, `WFK_STORE`/`WFK_QUEUE`, else the
/// defaults. Returns the other arguments.
pub fn urls_from_args(args: Vec<String>) -> Result<(Urls, Vec<String>), compose::ComposeError> {
    let env = |k: &str| std::env::var(k).ok();
    let (store, rest) = compose::url_from_args(compose::Role::Store, args, env, &[])?;
    let (queue, rest) = compose::url_from_args(compose::Role::Queue, rest, env, &[])?;
    Ok((
        Urls {
            store: store.unwrap_or_else(|| DEFAULT_STORE_URL.to_string()),
            queue: queue.unwrap_or_else(|| DEFAULT_QUEUE_URL.to_string()),
        },
        rest,
    ))
}

/// Read `--<name> <value>` (or `--<name>=<value>`) out of `args`.
pub fn take_flag(args: &mut Vec<String>, name: &str) -> Option<String> {
    let flag = format!("--{name}");
    let at = args.iter().position(|a| *a == flag || a.starts_with(&format!("{flag}=")))?;
    let arg = args.remove(at);
    match arg.split_once('=') {
        Some((_, v)) => Some(v.to_string()),
        None if at < args.len() => Some(args.remove(at)),
        None => None,
    }
}

/// Remove `--<name>` from `args`; whether it was there.
pub fn take_switch(args: &mut Vec<String>, name: &str) -> bool {
    let flag = format!("--{name}");
    let before = args.len();
    args.retain(|a| *a != flag);
    args.len() != before
}

/// Delete what a run created on shared servers (the fresh schema, the key prefix); a
/// file store is left alone (the caller says where it is or removes the directory).
pub async fn cleanup(deployment: Deployment, urls: &Urls) -> Result<(), compose::ComposeError> {
    if is_server(&urls.store) {
        deployment.store.destroy().await?;
    }
    if is_server(&urls.queue) {
        deployment.queue.destroy().await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Worker side
// ---------------------------------------------------------------------------------------

/// A worker's log of what it saw, one JSON line per event (`{"t", "w", "kind", …}`) in a
/// file of its own, written by a thread of its own: recording never blocks the engine (a
/// full buffer drops the newest line and counts it).
pub struct EventLog {
    worker: String,
    tx: SyncSender<String>,
    dropped: AtomicU64,
}

/// Lines an [`EventLog`] buffers before it drops.
pub const EVENT_BUFFER_MAX: usize = 65_536;

impl EventLog {
    /// Append to `path` (created when absent) as `worker`.
    pub fn open(path: &Path, worker: &str) -> std::io::Result<Arc<EventLog>> {
        let mut file = OpenOptions::new().create(true).append(true).open(path)?;
        let (tx, rx) = sync_channel::<String>(EVENT_BUFFER_MAX);
        std::thread::spawn(move || {
            for line in rx {
                if file.write_all(line.as_bytes()).is_err() {
                    return;
                }
            }
        });
        Ok(Arc::new(EventLog { worker: worker.to_string(), tx, dropped: AtomicU64::new(0) }))
    }

    /// Record one event of `kind` with the fields of `body` (a JSON object).
    pub fn record(&self, kind: &str, body: Value) {
        let mut line = json!({ "t": wall_ms(), "w": self.worker, "kind": kind });
        if let (Some(l), Value::Object(b)) = (line.as_object_mut(), body) {
            l.extend(b);
        }
        match self.tx.try_send(format!("{line}\n")) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The timeline sink: every committed transition as an `obs` line of the worker's log.
pub struct FileSink(pub Arc<EventLog>);

impl ObservationSink for FileSink {
    fn enabled(&self) -> bool {
        true
    }
    fn emit(&self, obs: Observation) {
        self.0.record("obs", json!({ "obs": obs }));
    }
}

/// The worker's store, recording every guarded write the store refused (`missed`: the
/// workflow, the transition kinds and the claim token the write carried). Everything
/// else is passed through unchanged.
pub struct WatchStore {
    inner: Arc<DynStore>,
    log: Arc<EventLog>,
}

impl WatchStore {
    /// Watch `inner`, recording into `log`.
    pub fn new(inner: Arc<DynStore>, log: Arc<EventLog>) -> Self {
        WatchStore { inner, log }
    }
}

fn guard_token(g: &Guard) -> Option<&str> {
    match g {
        Guard::Running { token } | Guard::Failing { token } | Guard::Token { token } => Some(token.as_str()),
        _ => None,
    }
}

#[async_trait::async_trait]
impl WorkflowStore for WatchStore {
    async fn create(&self, instance: WorkflowInstance) -> kernel_core::Result<CreateOutcome> {
        self.inner.create(instance).await
    }
    async fn get(&self, workflow_id: &WorkflowId) -> kernel_core::Result<Option<WorkflowInstance>> {
        self.inner.get(workflow_id).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> kernel_core::Result<Option<WorkflowInstance>> {
        self.inner.get_by_biz_key(biz_key).await
    }
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> kernel_core::Result<Option<WorkflowInstance>> {
        self.inner.claim(workflow_id, spec).await
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> kernel_core::Result<Option<WorkflowInstance>> {
        self.inner.claim_any(spec).await
    }
    async fn apply(
        &self,
        workflow_id: &WorkflowId,
        guard: &Guard,
        transition: &Transition,
    ) -> kernel_core::Result<WriteOutcome> {
        let out = self.inner.apply(workflow_id, guard, transition).await;
        if let Ok(WriteOutcome::Missed) = &out {
            let kinds: Vec<String> = transition.kinds().map(|k| format!("{k:?}")).collect();
            self.log
                .record("missed", json!({ "wf": workflow_id.as_str(), "kinds": kinds, "token": guard_token(guard) }));
        }
        out
    }
    async fn scan_due_waits(
        &self,
        now: Instant,
        after: Option<&DueCursor>,
        limit: usize,
    ) -> kernel_core::Result<ScanPage<DueWait>> {
        self.inner.scan_due_waits(now, after, limit).await
    }
    async fn scan_claimable(
        &self,
        after: Option<&WorkflowId>,
        limit: usize,
    ) -> kernel_core::Result<ScanPage<Candidate>> {
        self.inner.scan_claimable(after, limit).await
    }
}

/// The oracle file: activities append one JSON line per side effect, synchronously (the
/// line *is* the effect), as one `write` on a file opened for appending.
pub struct Oracle {
    file: Mutex<File>,
}

impl Oracle {
    /// Append to `path` (created when absent).
    pub fn open(path: &Path) -> std::io::Result<Arc<Oracle>> {
        Ok(Arc::new(Oracle { file: Mutex::new(OpenOptions::new().create(true).append(true).open(path)?) }))
    }
    /// Append one line.
    pub fn append(&self, line: &Value) -> std::io::Result<()> {
        let text = format!("{line}\n");
        self.file.lock().map_err(|_| std::io::Error::other("oracle lock poisoned"))?.write_all(text.as_bytes())
    }
}

/// Read every complete JSON line of `path` (a missing file has none).
pub fn read_lines(path: &Path) -> std::io::Result<Vec<Value>> {
    let mut tail = Tail::new(path);
    tail.read_new()
}

/// Follows a JSON-lines file another process appends to.
pub struct Tail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl Tail {
    /// Follow `path` from its beginning.
    pub fn new(path: &Path) -> Self {
        Tail { path: path.to_path_buf(), offset: 0, partial: Vec::new() }
    }
    /// The complete lines appended since the last call; unreadable lines are skipped.
    pub fn read_new(&mut self) -> std::io::Result<Vec<Value>> {
        let mut f = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        self.partial.extend_from_slice(&buf);
        let mut out = Vec::new();
        while let Some(nl) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=nl).collect();
            if let Ok(v) = serde_json::from_slice::<Value>(&line[..line.len() - 1]) {
                out.push(v);
            }
        }
        Ok(out)
    }
}

/// What a worker process is given on its command line.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// Store and queue.
    pub urls: Urls,
    /// Its name in the timeline.
    pub worker_id: String,
    /// Its event log.
    pub events: PathBuf,
    /// The run's oracle file.
    pub oracle: PathBuf,
    /// What its activities should hold on (the demo's deterministic kill and stop points).
    pub hold: Option<String>,
    /// Leave the committed transitions out of its event log (`--quiet`): a long run's log
    /// stays small; refused writes and markers are still recorded.
    pub quiet: bool,
}

impl WorkerArgs {
    /// Worker `name` of a run in `dir` on `urls`: its event log `events-<name>.jsonl` in
    /// `dir`, the run's `oracle` file, no hold, its transitions recorded.
    pub fn in_run(urls: &Urls, dir: &Path, oracle: &Path, name: &str) -> WorkerArgs {
        WorkerArgs {
            urls: urls.clone(),
            worker_id: name.to_string(),
            events: dir.join(format!("events-{name}.jsonl")),
            oracle: oracle.to_path_buf(),
            hold: None,
            quiet: false,
        }
    }

    /// Parse the arguments after [`WORKER_ARG`].
    pub fn parse(args: Vec<String>) -> Result<WorkerArgs, Box<dyn std::error::Error>> {
        let (urls, mut rest) = compose::Urls::from_args(args, |_| None)?;
        let mut need = |name: &str| take_flag(&mut rest, name).ok_or(format!("worker: --{name} is required"));
        let worker_id = need("worker-id")?;
        let events = PathBuf::from(need("events")?);
        let oracle = PathBuf::from(need("oracle")?);
        let hold = take_flag(&mut rest, "hold");
        let quiet = take_switch(&mut rest, "quiet");
        if let Some(unknown) = rest.first() {
            return Err(format!("worker: unknown argument {unknown}").into());
        }
        Ok(WorkerArgs { urls, worker_id, events, oracle, hold, quiet })
    }

    fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            WORKER_ARG.to_string(),
            "--store".into(),
            self.urls.store.clone(),
            "--queue".into(),
            self.urls.queue.clone(),
            "--worker-id".into(),
            self.worker_id.clone(),
            "--events".into(),
            self.events.display().to_string(),
            "--oracle".into(),
            self.oracle.display().to_string(),
        ];
        if let Some(h) = &self.hold {
            a.extend(["--hold".to_string(), h.clone()]);
        }
        if self.quiet {
            a.push("--quiet".to_string());
        }
        a
    }
}

/// What a worker's definitions may use.
pub struct WorkerEnv {
    /// The deployment the worker connected to.
    pub deployment: Deployment,
    /// The worker's event log.
    pub events: Arc<EventLog>,
    /// The run's oracle file.
    pub oracle: Arc<Oracle>,
    /// Its arguments.
    pub args: WorkerArgs,
}

/// Run a worker process until SIGTERM (graceful shutdown, K-6.6) or until its supervisor
/// is gone: `definitions` builds what it registers.
pub async fn run_worker<F>(
    args: WorkerArgs,
    options: QueueOptions,
    definitions: F,
) -> Result<(), Box<dyn std::error::Error>>
where
    F: FnOnce(&WorkerEnv) -> futures::future::BoxFuture<'_, Result<Vec<kernel_core::Definition>, String>>,
{
    let parent = std::os::unix::process::parent_id();
    let deployment = Deployment::from_urls(&args.urls, &options).await?;
    let events = EventLog::open(&args.events, &args.worker_id)?;
    let oracle = Oracle::open(&args.oracle)?;
    let env = WorkerEnv { deployment, events: events.clone(), oracle, args: args.clone() };
    let defs = definitions(&env).await?;
    let store: Arc<DynStore> = Arc::new(WatchStore::new(env.deployment.store.store.clone(), events.clone()));
    let mut ports = env.deployment.ports().store(store);
    if !args.quiet {
        ports = ports.observer(Arc::new(FileSink(events.clone())));
    }
    let ports = ports.build()?;
    let mut builder = kernel_core::Engine::builder(ports).config(engine_config(&args.worker_id));
    for d in defs {
        builder = builder.register(d);
    }
    let running = builder.build()?.spawn();
    events.record("started", json!({ "pid": std::process::id() }));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::time::sleep(Duration::from_millis(300)) => {
                // Orphaned (the supervisor died): stop rather than run on unsupervised.
                if std::os::unix::process::parent_id() != parent {
                    break;
                }
            }
        }
    }
    let clean = running.shutdown().await;
    events.record("stopped", json!({ "clean": clean }));
    // Let the log's thread write the last lines.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Supervisor side
// ---------------------------------------------------------------------------------------

/// The `main` of a run's binary, which is both the supervisor and (with the argument
/// [`WORKER_ARG`], as the supervisor re-executes it) its worker processes: `worker` or
/// `run` on a multi-threaded runtime, ended by [`exit_code`].
pub fn supervisor_main<W, WF, R, RF>(name: &str, worker: W, run: R) -> std::process::ExitCode
where
    W: FnOnce(WorkerArgs) -> WF,
    WF: std::future::Future<Output = Result<(), Box<dyn std::error::Error>>>,
    R: FnOnce(Vec<String>) -> RF,
    RF: std::future::Future<Output = Result<bool, Box<dyn std::error::Error>>>,
{
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: no runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        if args.first().map(String::as_str) == Some(WORKER_ARG) {
            return worker(WorkerArgs::parse(args.split_off(1))?).await.map(|()| true);
        }
        run(args).await
    });
    exit_code(name, result)
}

/// The exit code of a run's binary: success when `result` says every count is right; an
/// error is printed with its causes after `name: `.
pub fn exit_code(name: &str, result: Result<bool, Box<dyn std::error::Error>>) -> std::process::ExitCode {
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            let mut msg = e.to_string();
            let mut cause = e.source();
            while let Some(c) = cause {
                msg.push_str(&format!(": {c}"));
                cause = c.source();
            }
            eprintln!("{name}: {msg}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A worker process the supervisor started.
pub struct Worker {
    /// Its name.
    pub name: String,
    /// Its arguments.
    pub args: WorkerArgs,
    child: Child,
    /// Its process id.
    pub pid: u32,
    /// Whether it is stopped (SIGSTOP) now.
    pub stopped: bool,
}

impl Worker {
    /// Start `args` as a process of the current executable, its stderr (logs) into
    /// `<events>.log`.
    pub fn spawn(args: WorkerArgs) -> std::io::Result<Worker> {
        let log = File::create(args.events.with_extension("log"))?;
        let child = Command::new(std::env::current_exe()?)
            .args(args.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()?;
        let pid = child.id();
        Ok(Worker { name: args.worker_id.clone(), args, child, pid, stopped: false })
    }

    fn signal(&self, sig: nix::sys::signal::Signal) -> std::io::Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid).map_err(std::io::Error::other)?);
        nix::sys::signal::kill(pid, sig).map_err(std::io::Error::from)
    }

    /// `SIGKILL`, and reap it.
    pub fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// `SIGSTOP`: the whole process freezes, heartbeats included.
    pub fn stop(&mut self) -> std::io::Result<()> {
        self.signal(nix::sys::signal::Signal::SIGSTOP)?;
        self.stopped = true;
        Ok(())
    }

    /// `SIGCONT`.
    pub fn cont(&mut self) -> std::io::Result<()> {
        self.signal(nix::sys::signal::Signal::SIGCONT)?;
        self.stopped = false;
        Ok(())
    }

    /// `SIGTERM` (graceful shutdown), then `SIGKILL` after `grace`. Returns whether it
    /// exited by itself.
    pub fn terminate(&mut self, grace: Duration) -> std::io::Result<bool> {
        if self.stopped {
            self.cont()?;
        }
        if self.child.try_wait()?.is_some() {
            return Ok(true);
        }
        self.signal(nix::sys::signal::Signal::SIGTERM)?;
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill()?;
        Ok(false)
    }

    /// Whether the process has exited (it is reaped then).
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Never leave a process behind, whatever path the supervisor left by.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.signal(nix::sys::signal::Signal::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_urls_get_their_own_namespace_and_keep_the_rest() {
        let dir = Path::new("/tmp/run");
        let pg = fresh_store_url("postgres://u@h:5432/db?schema=old&sslmode=disable", dir, "demo");
        assert!(pg.starts_with("postgres://u@h:5432/db?sslmode=disable&schema=demo_"), "{pg}");
        assert_eq!(fresh_store_url("sqlite:", dir, "demo"), "sqlite:/tmp/run/workflows.db");
        assert_eq!(fresh_store_url("sqlite:./mine.db", dir, "demo"), "sqlite:./mine.db");
        let redis = fresh_queue_url("redis://h:6379", "sqlite:x", "demo");
        assert!(redis.starts_with("redis://h:6379?prefix=demo_"), "{redis}");
        assert_eq!(fresh_queue_url("sqlite:", "sqlite:/tmp/run/workflows.db", "d"), "sqlite:/tmp/run/workflows.db");
        assert_eq!(fresh_queue_url("local", "sqlite:x", "d"), "local");
        assert!(is_server(&pg) && !is_server("sqlite:x") && !is_server("local"));
    }

    #[test]
    fn a_tail_returns_complete_lines_once() {
        let dir = run_dir("tail-test").unwrap();
        let path = dir.join("e.jsonl");
        let mut tail = Tail::new(&path);
        assert!(tail.read_new().unwrap().is_empty());
        std::fs::write(&path, "{\"a\":1}\n{\"b\":").unwrap();
        assert_eq!(tail.read_new().unwrap(), vec![json!({ "a": 1 })]);
        OpenOptions::new().append(true).open(&path).unwrap().write_all(b"2}\nnot json\n").unwrap();
        assert_eq!(tail.read_new().unwrap(), vec![json!({ "b": 2 })]);
        assert!(tail.read_new().unwrap().is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
