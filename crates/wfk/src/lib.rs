//! # wfk
//!
//! The operator's command line of the durable workflow kernel, on the `ops` crate. The
//! stock binary knows no workflow definitions, which every verb but `regenerate` and
//! `retry-failed` does without; a deployment that wants those builds its own `wfk` in a few
//! lines with [`run`] and its definitions:
//!
//! ```no_run
//! # fn my_definitions() -> Vec<kernel_core::Definition> { vec![] }
//! #[tokio::main]
//! async fn main() {
//!     let code = wfk::run(std::env::args().skip(1), my_definitions(), &mut std::io::stdout(), &mut std::io::stderr()).await;
//!     std::process::exit(code.into());
//! }
//! ```
//!
//! Exit codes: 0 ok, 1 not found, 2 bad input (usage errors included), 3 refused by a guard
//! (or a bulk action shown but not confirmed with `--yes`: nothing was done), 4 unavailable.

mod table;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kernel_core::ports::{DeadLetterAction, DeadLetterStatus, PermitLimits, TaskOutcome};
use kernel_core::{Definition, Instant, WorkflowStatus};
use ops::{Actor, DeployManifest, ListFilter, Ops, OpsError};
use serde::Serialize;
use serde_json::Value;
use std::io::{IsTerminal, Write};
use table::Table;

/// Environment variable naming the acting person (default `wfk`).
pub const ACTOR_ENV: &str = "WFK_ACTOR";
/// Environment variable with the acting person's task roles, comma-separated.
pub const ROLES_ENV: &str = "WFK_ROLES";

/// Most workflows one bulk action touches.
pub const BULK_MAX: usize = 10_000;

#[derive(Debug, Parser)]
#[command(name = "wfk", version, about = "Operate durable workflows: inspect and act on any store by URL.")]
struct Cli {
    /// Store URL (`sqlite:<path>`, `postgres://…`, `mongodb://…`).
    #[arg(long, env = "WFK_STORE", global = true, hide_env_values = true)]
    store: Option<String>,
    /// Queue URL (`local`, `sqlite:<path>`, `redis://…`).
    #[arg(long, env = "WFK_QUEUE", global = true, hide_env_values = true)]
    queue: Option<String>,
    /// JSON instead of tables, for scripts.
    #[arg(long, global = true)]
    json: bool,
    /// Who acts (recorded in the audit log; default: the login name, `$USER`).
    #[arg(long, env = ACTOR_ENV, global = true)]
    actor: Option<String>,
    /// The actor's roles for human tasks, comma-separated.
    #[arg(long, env = ROLES_ENV, global = true, value_delimiter = ',')]
    roles: Vec<String>,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// Workflows from the projection, newest change first, a page at a time.
    List(ListArgs),
    /// One workflow: steps, attempts, errors, model calls, wait, lease and timeline.
    Show {
        /// Workflow id or business key.
        id: String,
    },
    /// Deliver a signal (a doorbell: write the fact it announces first).
    Signal {
        /// Workflow id or business key.
        id: String,
        /// Signal type.
        signal_type: String,
        /// The wait key (default: the workflow's current wait's).
        #[arg(long)]
        wait_key: Option<String>,
        /// The wait generation (default: the current wait's).
        #[arg(long)]
        generation: Option<u64>,
        /// The signal id; repeat it to retry without a second delivery (default: fresh).
        #[arg(long)]
        signal_id: Option<String>,
    },
    /// Cancel one workflow, or every one a filter matches (`--yes` to do it).
    Cancel(ActionArgs),
    /// Replay a failed workflow as a new run (not one of a dispatch round: retry-failed).
    Replay(ActionArgs),
    /// Dispatch a new round for a business object whose round failed (K-11.4).
    RetryFailed {
        /// The business object's id.
        object_id: String,
    },
    /// Regenerate a completed (model) step: a new epoch of it and its dependents.
    Regenerate {
        /// Workflow id or business key.
        id: String,
        /// Step name.
        step: String,
    },
    /// Dead letters.
    #[command(subcommand)]
    Dlq(DlqVerb),
    /// Human tasks.
    #[command(subcommand)]
    Tasks(TaskVerb),
    /// The ready lanes: depth, due, delayed, oldest due.
    Lanes,
    /// Permits: holders and limits; `set` a limit.
    Permits {
        #[command(subcommand)]
        verb: Option<PermitVerb>,
    },
    /// The operator audit log, newest first.
    Audit {
        /// Only this actor.
        #[arg(long)]
        by: Option<String>,
        /// Only this action.
        #[arg(long)]
        action: Option<String>,
        /// Rows.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Apply the store's migrations (SQL stores; connecting migrates) and print its version.
    Migrate,
    /// Rebuild the ready lanes from the store.
    Rebuild,
    /// Before a deploy: which workflows in flight would park under the new definitions.
    CheckDeploy {
        /// The new definitions' manifest (JSON, from `ops::DeployManifest::of`).
        manifest: std::path::PathBuf,
    },
}

#[derive(Debug, Args, Default)]
struct FilterArgs {
    /// Workflow type.
    #[arg(long = "type")]
    workflow_type: Option<String>,
    /// Status: running, waiting, failing, completed, failed, canceled.
    #[arg(long, value_enum)]
    status: Option<StatusArg>,
    /// Business keys starting with this.
    #[arg(long)]
    biz_key_prefix: Option<String>,
    /// Failed since: a time ago (`90s`, `30m`, `2h`, `7d`) or epoch milliseconds.
    #[arg(long)]
    failed_since: Option<String>,
    /// Waiting on a signal of this type.
    #[arg(long)]
    waiting_on: Option<String>,
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// Rows per page.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// The cursor a previous page printed.
    #[arg(long)]
    cursor: Option<String>,
}

#[derive(Debug, Args)]
struct ActionArgs {
    /// Workflow id or business key (or none, with filters, for a bulk action).
    id: Option<String>,
    #[command(flatten)]
    filter: FilterArgs,
    /// Do the bulk action: the confirmation code a run without it printed for exactly
    /// the workflows it listed (a changed set refuses, nothing done).
    #[arg(long, value_name = "CODE")]
    yes: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StatusArg {
    Running,
    Waiting,
    Failing,
    Completed,
    Failed,
    Canceled,
}

impl From<StatusArg> for WorkflowStatus {
    fn from(s: StatusArg) -> Self {
        match s {
            StatusArg::Running => WorkflowStatus::Running,
            StatusArg::Waiting => WorkflowStatus::Waiting,
            StatusArg::Failing => WorkflowStatus::Failing,
            StatusArg::Completed => WorkflowStatus::Completed,
            StatusArg::Failed => WorkflowStatus::Failed,
            StatusArg::Canceled => WorkflowStatus::Canceled,
        }
    }
}

#[derive(Debug, Subcommand)]
enum DlqVerb {
    /// Dead letters by id.
    List {
        /// open, decided or closed.
        #[arg(long, value_enum)]
        status: Option<DlqStatusArg>,
        /// After this id.
        #[arg(long)]
        after: Option<String>,
        /// Rows.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Run the step again in its next epoch.
    Retry(DlqDecide),
    /// Complete the step with an output.
    Complete {
        #[command(flatten)]
        d: DlqDecide,
        /// The step's output (JSON).
        #[arg(long)]
        output: String,
    },
    /// Fail the step (and the workflow).
    Fail(DlqDecide),
}

#[derive(Debug, Args)]
struct DlqDecide {
    /// Dead letter id.
    id: String,
    /// Why (recorded with the decision).
    #[arg(long)]
    reason: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DlqStatusArg {
    Open,
    Decided,
    Closed,
}

#[derive(Debug, Subcommand)]
enum TaskVerb {
    /// Open tasks the actor may decide.
    List {
        /// After this id.
        #[arg(long)]
        after: Option<String>,
        /// Rows.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// One task with its evidence.
    Show {
        /// Task id.
        id: String,
    },
    /// Approve.
    Approve(TaskDecide),
    /// Reject.
    Reject(TaskDecide),
}

#[derive(Debug, Args)]
struct TaskDecide {
    /// Task id.
    id: String,
    /// Why.
    #[arg(long)]
    reason: Option<String>,
}

#[derive(Debug, Subcommand)]
enum PermitVerb {
    /// Every resource with a limit or a holder (the default).
    List,
    /// Set a resource's limits (0 = unlimited); holders above a lowered limit keep theirs.
    Set {
        /// Resource name.
        resource: String,
        /// Holders at once.
        #[arg(long)]
        max_concurrency: u32,
        /// Starts per second.
        #[arg(long, default_value_t = 0)]
        max_starts_per_second: u32,
    },
}

/// Run `wfk` with `args` (without the program name) and `definitions`, writing results to
/// `out` and messages to `err`; returns the exit code.
pub async fn run(
    args: impl IntoIterator<Item = String>,
    definitions: Vec<Definition>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let cli = match Cli::try_parse_from(std::iter::once("wfk".to_string()).chain(args)) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = if e.use_stderr() { write!(err, "{e}") } else { write!(out, "{e}") };
            return code;
        }
    };
    let json = cli.json;
    match execute(cli, definitions, out, err).await {
        Ok(code) => code,
        Err(e) => {
            if json {
                let _ = writeln!(out, "{}", serde_json::to_string(&e).unwrap_or_default());
            }
            let _ = writeln!(err, "wfk: {e}");
            e.exit_code()
        }
    }
}

async fn execute(
    cli: Cli,
    definitions: Vec<Definition>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, OpsError> {
    let store =
        cli.store.clone().ok_or_else(|| OpsError::BadInput("no store: pass --store <url> or set WFK_STORE".into()))?;
    // `local` coordination is shared through a `sqlite:` store's file only; with another
    // store it would live in this process and vanish with it (permits set, lanes rebuilt
    // and wakeups rung into nothing), so the queue must be named.
    let queue =
        match (&cli.queue, store.starts_with("sqlite:")) {
            (Some(q), _) => q.clone(),
            (None, true) => "local".into(),
            (None, false) => return Err(OpsError::BadInput(
                "no queue: pass --queue <url> or set WFK_QUEUE (the workers' queue URL; `local` is shared only with a \
                 sqlite: store)"
                    .into(),
            )),
        };
    let ops = Ops::connect(&store, &queue, definitions).await?;
    let name = cli
        .actor
        .clone()
        .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "wfk".into());
    let actor = Actor::operator(name).with_task_roles(cli.roles.clone());
    let ui = Ui { json: cli.json, progress: std::io::stderr().is_terminal() && !cli.json };
    let result = verb(&ops, &actor, &ui, cli.verb, out, err).await;
    ops.close().await;
    result
}

struct Ui {
    json: bool,
    progress: bool,
}

impl Ui {
    fn emit<T: Serialize>(
        &self,
        out: &mut dyn Write,
        value: &T,
        table: impl FnOnce() -> String,
    ) -> Result<(), OpsError> {
        let text = if self.json {
            serde_json::to_string_pretty(value).map_err(|e| OpsError::Unavailable(e.to_string()))?
        } else {
            table()
        };
        writeln!(out, "{}", text.trim_end()).map_err(|e| OpsError::Unavailable(format!("stdout: {e}")))
    }

    /// A progress reporter: a bar on a terminal, plain lines otherwise.
    fn progress(&self, what: &'static str, err: &mut dyn Write) -> Progress {
        if self.progress {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_message(what);
            Progress::Bar(bar)
        } else {
            let _ = writeln!(err, "{what}: started");
            Progress::Lines(what)
        }
    }
}

enum Progress {
    Bar(indicatif::ProgressBar),
    Lines(&'static str),
}

impl Progress {
    fn callback(&self) -> Box<dyn Fn(u64) + Send + Sync> {
        match self {
            Progress::Bar(b) => {
                let b = b.clone();
                Box::new(move |n| b.set_position(n))
            }
            Progress::Lines(what) => {
                let what = *what;
                Box::new(move |n| eprintln!("{what}: {n}"))
            }
        }
    }

    fn finish(self) {
        if let Progress::Bar(b) = self {
            b.finish_and_clear();
        }
    }
}

fn parse_json(field: &str, text: &str) -> Result<Value, OpsError> {
    serde_json::from_str(text).map_err(|e| OpsError::BadInput(format!("{field} is not JSON: {e}")))
}

/// `90s`, `30m`, `2h`, `7d` ago, or epoch milliseconds.
fn parse_since(text: &str, now: Instant) -> Result<Instant, OpsError> {
    let bad =
        || OpsError::BadInput(format!("failed-since `{text}`: a time ago (90s, 30m, 2h, 7d) or epoch milliseconds"));
    if let Ok(ms) = text.parse::<i64>() {
        return if ms >= 0 { Ok(Instant::from_millis(ms)) } else { Err(bad()) };
    }
    let (cut, _) = text.char_indices().last().ok_or_else(bad)?;
    let (num, unit) = text.split_at(cut);
    let n: i64 = num.parse().map_err(|_| bad())?;
    let ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let span = n.checked_mul(ms).filter(|s| *s >= 0).ok_or_else(bad)?;
    Ok(Instant::from_millis(now.as_millis().saturating_sub(span).max(0)))
}

fn filter_of(f: &FilterArgs, ops: &Ops) -> Result<ListFilter, OpsError> {
    let now = ops.ports().clock.now();
    Ok(ListFilter {
        workflow_type: f.workflow_type.clone(),
        status: f.status.map(Into::into),
        biz_key_prefix: f.biz_key_prefix.clone(),
        failed_since: f.failed_since.as_deref().map(|s| parse_since(s, now)).transpose()?,
        waiting_on_signal: f.waiting_on.clone(),
        cursor: None,
        limit: 0,
    })
}

fn is_empty(f: &FilterArgs) -> bool {
    f.workflow_type.is_none()
        && f.status.is_none()
        && f.biz_key_prefix.is_none()
        && f.failed_since.is_none()
        && f.waiting_on.is_none()
}

fn ts(i: Instant) -> String {
    i.as_millis().to_string()
}

/// Print a done action; exit 4 when its audit entry could not be written.
fn done(ui: &Ui, d: &ops::Done, out: &mut dyn Write, err: &mut dyn Write) -> Result<u8, OpsError> {
    ui.emit(out, d, || d.summary.clone())?;
    match &d.audit_error {
        None => Ok(0),
        Some(e) => {
            let _ = writeln!(err, "wfk: done, but its audit entry was not written: {e}");
            Ok(4)
        }
    }
}

async fn verb(
    ops: &Ops,
    actor: &Actor,
    ui: &Ui,
    verb: Verb,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, OpsError> {
    match verb {
        Verb::List(a) => {
            let mut filter = filter_of(&a.filter, ops)?;
            filter.limit = a.limit;
            filter.cursor = a.cursor;
            let page = ops.list(&filter).await?;
            ui.emit(out, &page, || {
                let mut t = Table::new(["WORKFLOW", "TYPE", "BIZ KEY", "STATUS", "STEP", "ATTEMPT", "UPDATED"]);
                for s in &page.items {
                    t.row([
                        s.workflow_id.to_string(),
                        s.workflow_type.clone(),
                        s.biz_key.clone(),
                        s.status.as_str().to_string(),
                        s.step_name.clone().unwrap_or_default(),
                        s.attempt.to_string(),
                        ts(s.updated_at),
                    ]);
                }
                let mut text = t.render();
                if let Some(next) = &page.next {
                    text.push_str(&format!("next page: --cursor {next}\n"));
                }
                text
            })?;
        }
        Verb::Show { id } => {
            let v = ops.show(&id).await?;
            ui.emit(out, &v, || table::show(&v))?;
        }
        Verb::Signal { id, signal_type, wait_key, generation, signal_id } => {
            let args = ops::SignalArgs { signal_type, wait_key, generation, signal_id };
            let d = ops.signal(actor, &id, &args).await?;
            return done(ui, &d, out, err);
        }
        Verb::Cancel(a) => return bulk(ops, actor, ui, "cancel", a, out, err).await,
        Verb::Replay(a) => return bulk(ops, actor, ui, "replay", a, out, err).await,
        Verb::RetryFailed { object_id } => {
            let d = ops.retry_failed(actor, &object_id).await?;
            return done(ui, &d, out, err);
        }
        Verb::Regenerate { id, step } => {
            let d = ops.regenerate(actor, &id, &step).await?;
            return done(ui, &d, out, err);
        }
        Verb::Dlq(v) => return dlq(ops, actor, ui, v, out, err).await,
        Verb::Tasks(v) => return tasks(ops, actor, ui, v, out, err).await,
        Verb::Lanes => {
            let lanes = ops.lanes().await?;
            ui.emit(out, &lanes, || {
                let mut t = Table::new(["LANE", "DEPTH", "READY", "DELAYED", "POPS", "OLDEST DUE (ms)"]);
                for l in &lanes {
                    t.row([
                        l.lane.to_string(),
                        l.depth.to_string(),
                        l.ready.to_string(),
                        l.delayed.to_string(),
                        l.pops.to_string(),
                        l.oldest_due_ms.to_string(),
                    ]);
                }
                t.render()
            })?;
        }
        Verb::Permits { verb } => match verb.unwrap_or(PermitVerb::List) {
            PermitVerb::List => {
                let permits = ops.permits().await?;
                ui.emit(out, &permits, || table::permits(&permits))?;
            }
            PermitVerb::Set { resource, max_concurrency, max_starts_per_second } => {
                let d = ops
                    .set_permit_limits(actor, &resource, PermitLimits { max_concurrency, max_starts_per_second })
                    .await?;
                return done(ui, &d, out, err);
            }
        },
        Verb::Audit { by, action, limit } => {
            let entries = ops.audit(by.as_deref(), action.as_deref(), limit).await?;
            ui.emit(out, &entries, || table::audit(&entries))?;
        }
        Verb::Migrate => {
            let v = ops.schema_version().await?;
            ui.emit(out, &v, || format!("store schema: {v}"))?;
        }
        Verb::Rebuild => {
            let p = ui.progress("rebuild", err);
            let r = ops.rebuild(actor, &*p.callback()).await;
            p.finish();
            let d = r?;
            return done(ui, &d, out, err);
        }
        Verb::CheckDeploy { manifest } => {
            let text = std::fs::read_to_string(&manifest)
                .map_err(|e| OpsError::BadInput(format!("{}: {e}", manifest.display())))?;
            let m = DeployManifest::parse(&text)?;
            let p = ui.progress("check-deploy", err);
            let r = ops.check_deploy(&m, &*p.callback()).await;
            p.finish();
            let report = r?;
            ui.emit(out, &report, || table::deploy(&report))?;
            if report.would_park > 0 || !report.complete {
                return Ok(3);
            }
        }
    }
    Ok(0)
}

/// The confirmation code of a bulk action on `ids`: FNV-1a over the action and the sorted
/// ids, so `--yes <code>` confirms exactly the set that was printed.
fn confirmation(action: &str, ids: &[String]) -> String {
    let mut sorted: Vec<&String> = ids.iter().collect();
    sorted.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in std::iter::once(action).chain(sorted.iter().map(|s| s.as_str())) {
        for b in part.bytes().chain(std::iter::once(0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{:012x}", h & 0xffff_ffff_ffff)
}

/// Consecutive unavailable answers after which a bulk action stops.
const BULK_UNAVAILABLE_MAX: usize = 3;

async fn bulk(
    ops: &Ops,
    actor: &Actor,
    ui: &Ui,
    action: &'static str,
    a: ActionArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, OpsError> {
    match (&a.id, is_empty(&a.filter)) {
        (Some(id), true) => {
            if a.yes.is_some() {
                return Err(OpsError::BadInput("--yes confirms a bulk action; one workflow needs none".into()));
            }
            let d = if action == "cancel" { ops.cancel(actor, id).await? } else { ops.replay(actor, id).await? };
            return done(ui, &d, out, err);
        }
        (Some(_), false) => return Err(OpsError::BadInput("give an id or filters, not both".into())),
        (None, true) => {
            return Err(OpsError::BadInput(format!("{action} needs an id, or filters for a bulk {action}")))
        }
        (None, false) => {}
    }
    // The targets, every page, bounded.
    let mut filter = filter_of(&a.filter, ops)?;
    filter.limit = ops::LIST_LIMIT_MAX;
    let mut targets = vec![];
    loop {
        let page = ops.list(&filter).await?;
        targets.extend(page.items.into_iter().map(|s| (s.workflow_id, s.biz_key, s.status)));
        if targets.len() > BULK_MAX {
            return Err(OpsError::BadInput(format!("the filter matches more than {BULK_MAX} workflows: narrow it")));
        }
        match page.next {
            Some(c) => filter.cursor = Some(c),
            None => break,
        }
    }
    let ids: Vec<String> = targets.iter().map(|t| t.0.to_string()).collect();
    let code = confirmation(action, &ids);
    match a.yes.as_deref() {
        None => {
            #[derive(Serialize)]
            struct Plan<'a> {
                action: &'a str,
                would_touch: &'a [String],
                confirm: String,
            }
            let plan = Plan { action, would_touch: &ids, confirm: format!("--yes {code}") };
            ui.emit(out, &plan, || {
                let mut t = Table::new(["WORKFLOW", "BIZ KEY", "STATUS"]);
                for (id, key, status) in &targets {
                    t.row([id.to_string(), key.clone(), status.as_str().to_string()]);
                }
                format!(
                    "{}{action} would touch {} workflow(s); to do it, run the same command with --yes {code}\n",
                    t.render(),
                    targets.len()
                )
            })?;
            return Ok(3);
        }
        Some(given) if given != code => {
            return Err(OpsError::Refused(format!(
                "the workflows matching the filter changed since the code {given} was printed: nothing done; run \
                 without --yes to see the set now"
            )))
        }
        Some(_) => {}
    }
    let p = ui.progress(if action == "cancel" { "bulk cancel" } else { "bulk replay" }, err);
    let tick = p.callback();
    #[derive(Serialize)]
    struct Outcome {
        workflow_id: String,
        result: String,
    }
    let mut outcomes = vec![];
    let mut counts: std::collections::BTreeMap<&'static str, u64> = Default::default();
    let mut unavailable_in_a_row = 0;
    for (i, id) in ids.iter().enumerate() {
        // By id, never by a business key that could name another workflow.
        let reference = format!("id:{id}");
        let r =
            if action == "cancel" { ops.cancel(actor, &reference).await } else { ops.replay(actor, &reference).await };
        let result = match r {
            Ok(d) if d.audit_error.is_some() => {
                *counts.entry("done, audit entry not written").or_default() += 1;
                "ok (audit entry not written)".to_string()
            }
            Ok(_) => {
                unavailable_in_a_row = 0;
                *counts.entry("ok").or_default() += 1;
                "ok".to_string()
            }
            Err(e) => {
                unavailable_in_a_row = if matches!(e, OpsError::Unavailable(_)) { unavailable_in_a_row + 1 } else { 0 };
                *counts.entry(e.kind()).or_default() += 1;
                format!("{}: {}", e.kind(), e.message())
            }
        };
        outcomes.push(Outcome { workflow_id: id.clone(), result });
        tick(i as u64 + 1);
        if unavailable_in_a_row >= BULK_UNAVAILABLE_MAX {
            break;
        }
    }
    p.finish();
    let untouched = ids.len() - outcomes.len();
    ui.emit(out, &outcomes, || {
        let mut t = Table::new(["WORKFLOW", "RESULT"]);
        for o in &outcomes {
            t.row([o.workflow_id.clone(), o.result.clone()]);
        }
        let summary: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let stopped = if untouched > 0 {
            format!("; stopped after {BULK_UNAVAILABLE_MAX} unavailable answers in a row, {untouched} not tried")
        } else {
            String::new()
        };
        format!("{}{action}: {}{stopped}\n", t.render(), summary.join(", "))
    })?;
    let only = |k: &str| counts.keys().all(|have| *have == "ok" || *have == k);
    Ok(if counts.keys().all(|k| *k == "ok") {
        0
    } else if counts.contains_key("unavailable") || counts.contains_key("done, audit entry not written") {
        4
    } else if only("not_found") {
        1
    } else {
        3
    })
}

async fn dlq(
    ops: &Ops,
    actor: &Actor,
    ui: &Ui,
    v: DlqVerb,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, OpsError> {
    let (id, action, reason) = match v {
        DlqVerb::List { status, after, limit } => {
            let status = status.map(|s| match s {
                DlqStatusArg::Open => DeadLetterStatus::Open,
                DlqStatusArg::Decided => DeadLetterStatus::Decided,
                DlqStatusArg::Closed => DeadLetterStatus::Closed,
            });
            let list = ops.dead_letters(status, after.as_deref(), limit).await?;
            ui.emit(out, &list, || {
                let mut t = Table::new(["ID", "WORKFLOW", "STEP", "STATUS", "ERROR"]);
                for d in &list {
                    t.row([
                        d.id.clone(),
                        d.workflow_id.to_string(),
                        d.step.clone(),
                        format!("{:?}", d.status).to_lowercase(),
                        table::clip(&d.error.message, 60),
                    ]);
                }
                t.render()
            })?;
            return Ok(0);
        }
        DlqVerb::Retry(d) => (d.id, DeadLetterAction::Retry, d.reason),
        DlqVerb::Fail(d) => (d.id, DeadLetterAction::Fail, d.reason),
        DlqVerb::Complete { d, output } => {
            (d.id, DeadLetterAction::Complete { output: parse_json("output", &output)? }, d.reason)
        }
    };
    let d = ops.decide_dead_letter(actor, &id, action, reason.as_deref()).await?;
    done(ui, &d, out, err)
}

async fn tasks(
    ops: &Ops,
    actor: &Actor,
    ui: &Ui,
    v: TaskVerb,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, OpsError> {
    let (id, outcome, reason) = match v {
        TaskVerb::List { after, limit } => {
            let list = ops.tasks(actor, after.as_deref(), limit).await?;
            ui.emit(out, &list, || {
                let next = list.next.as_ref().map(|n| format!("next page: --after {n}\n")).unwrap_or_default();
                let mut t = Table::new(["ID", "WORKFLOW", "STEP", "LEVEL", "TITLE", "DUE"]);
                for k in &list.items {
                    t.row([
                        k.id.clone(),
                        k.workflow_id.to_string(),
                        k.step.clone(),
                        k.level.to_string(),
                        table::clip(&k.title, 40),
                        ts(k.due_at),
                    ]);
                }
                t.render() + &next
            })?;
            return Ok(0);
        }
        TaskVerb::Show { id } => {
            let k = ops.task(actor, &id).await?;
            ui.emit(out, &k, || table::task(&k))?;
            return Ok(0);
        }
        TaskVerb::Approve(d) => (d.id, TaskOutcome::Approve, d.reason),
        TaskVerb::Reject(d) => (d.id, TaskOutcome::Reject, d.reason),
    };
    let d = ops.decide_task(actor, &id, outcome, reason.as_deref()).await?;
    done(ui, &d, out, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_accepts_spans_ago_and_epoch_ms_and_refuses_the_rest() {
        let now = Instant::from_millis(10_000_000);
        assert_eq!(parse_since("90s", now).unwrap(), Instant::from_millis(10_000_000 - 90_000));
        assert_eq!(parse_since("2h", now).unwrap(), Instant::from_millis(10_000_000 - 7_200_000));
        assert_eq!(parse_since("5", now).unwrap(), Instant::from_millis(5));
        for bad in ["", "h", "-1", "3w", "1.5h", "99999999999999999d", "5é", "é", "2ħ"] {
            assert!(matches!(parse_since(bad, now), Err(OpsError::BadInput(_))), "{bad}");
        }
    }
}
