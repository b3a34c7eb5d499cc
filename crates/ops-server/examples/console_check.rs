//! The console in a real browser: a fresh SQLite deployment with an invoice workflow whose
//! `review` step is a human task (K-17.5), an engine running in this process on the wall
//! clock, the ops server on a free port, and headless Chromium driven through chromedriver
//! (WebDriver): log in, open the list, open the workflow waiting on the task, approve it,
//! and wait until the page shows it completed; then the inbox (empty), the audit log (the
//! approval recorded), the lanes and the dead letters draw. Screenshots of the list and of the detail
//! page go to `--out`; the workflow's status is then read from the store itself, and
//!
//! ```text
//! browser-console: pages=<n> approved_in_browser=true store_status=completed screenshots=<n>
//! ```
//!
//! is printed. Any failure exits non-zero; every wait is bounded; the chromedriver (and the
//! browser it started) are ended on the way out.
//!
//! ```text
//! cargo run -p ops-server --example console_check -- --out <dir>
//!     [--chromium /usr/bin/chromium] [--chromedriver /usr/bin/chromedriver] [--timeout-s 120]
//! ```

use fantoccini::{ClientBuilder, Locator};
use kernel_core::engine::Engine;
use kernel_core::*;
use kernel_tasks::{HumanTask, Level};
use observer::{Observer, ObserverConfig};
use ops::{Ops, OpsParts};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "console-check-operator-token-7f3a91";
const PNG_MAGIC: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
/// One wait in the page (an element, a status).
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

struct Args {
    out: PathBuf,
    chromium: String,
    chromedriver: String,
    timeout_s: u64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        out: PathBuf::new(),
        chromium: std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()),
        chromedriver: std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into()),
        timeout_s: 120,
    };
    let mut out = None;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--out" => out = Some(PathBuf::from(v()?)),
            "--chromium" => a.chromium = v()?,
            "--chromedriver" => a.chromedriver = v()?,
            "--timeout-s" => a.timeout_s = v()?.parse().map_err(|_| "--timeout-s: seconds".to_string())?,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    a.out = out.ok_or("--out <dir> is required")?;
    Ok(a)
}

/// The chromedriver process (its own process group, so the browser it starts ends with it).
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let pgid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", "--", &format!("-{pgid}")]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn is_png(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.len() > PNG_MAGIC.len() && b[..8] == PNG_MAGIC)
}

#[tokio::main]
async fn main() {
    match run().await {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("console-check: {e}");
            println!("browser-console: failed");
            std::process::exit(1);
        }
    }
}

async fn run() -> Result<String, String> {
    let args = args()?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let db = work.path().join("wf.db");
    let store_url = format!("sqlite:{}", db.display());

    // The deployment, its projection, an engine on the wall clock.
    let d = compose::Deployment::connect(&store_url, "local", &compose::QueueOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let repo = d.store.observation_repository().await.map_err(|e| e.to_string())?;
    let base = d.ports().build().map_err(|e| e.to_string())?;
    let config = ObserverConfig { flush_interval_ms: DurationMs::from_millis(100), ..ObserverConfig::default() };
    let (sink, writer) = Observer::start(repo.clone(), base.clock.clone(), config).map_err(|e| e.to_string())?;
    let ports = d.ports().observer(Arc::new(sink)).build().map_err(|e| e.to_string())?;
    let review = HumanTask::builder("Approve invoice INV-7 (12 400 EUR)")
        .level(Level::roles(["finance"]))
        .evidence(|ctx| vec![ports::Evidence { label: "scan".into(), reference: format!("doc:{}", ctx.biz_key()) }])
        .build(d.store.task_inbox.clone())
        .map_err(|e| e.to_string())?;
    let work_step = |name: &str, ms: u64| {
        StepDef::new(name, move |_c: ActivityContext| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(StepOutcome::complete(json!({"ok": true})))
        })
    };
    let defs = vec![
        Definition::builder("invoice")
            .step(work_step("extract", 300))
            .step(StepDef::new("review", review).max_retry(3).depends_on(["extract"]))
            .step(work_step("post", 200).depends_on(["review"]))
            .build()
            .map_err(|e| e.to_string())?,
        Definition::builder("receipt").step(work_step("file", 100)).build().map_err(|e| e.to_string())?,
        Definition::builder("payment")
            .step(
                StepDef::new("charge", |_c: ActivityContext| async {
                    Err::<StepOutcome, _>(ActivityError::permanent("card declined"))
                })
                .on_failed(OnFailed::DeadLetter),
            )
            .build()
            .map_err(|e| e.to_string())?,
    ];
    let mut b = Engine::builder(ports.clone());
    for def in defs.clone() {
        b = b.register(def);
    }
    let engine = b.build().map_err(|e| e.to_string())?;
    let running = engine.spawn();
    let publisher = engine.publisher();
    for n in 1..=3 {
        let req =
            StartRequest::new("receipt", format!("rcpt-{n}"), json!({"n": n})).workflow_id(format!("wf-rcpt-{n}"));
        publisher.start_or_resume(req).await.map_err(|e| e.to_string())?;
    }
    let req = StartRequest::new("payment", "pay-1", json!({"cents": 990})).workflow_id("wf-pay-1");
    publisher.start_or_resume(req).await.map_err(|e| e.to_string())?;
    let wf = WorkflowId::from("wf-inv-7");
    let req = StartRequest::new("invoice", "inv-7", json!({"amount_cents": 1_240_000})).workflow_id(wf.as_str());
    publisher.start_or_resume(req).await.map_err(|e| e.to_string())?;

    // The console.
    let ops = Arc::new(
        Ops::from_parts(OpsParts { ports, repo, definitions: defs, dispatch: None, schema: "sqlite".into() })
            .map_err(|e| e.to_string())?,
    );
    let server_config = ops_server::ServerConfig::from_json(&format!(
        r#"{{"tokens":[{{"token":"{TOKEN}","name":"ana","role":"operator","task_roles":["finance"]}}]}}"#
    ))
    .map_err(|e| e.to_string())?;
    let app = ops_server::router(ops.clone(), &server_config).map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let base_url = format!("http://{}", listener.local_addr().map_err(|e| e.to_string())?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // Wait until the invoice waits on its task and the projection lists it.
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let inst = d.store.store.get(&wf).await.map_err(|e| e.to_string())?;
        let listed = ops
            .list(&ops::ListFilter { biz_key_prefix: Some("inv-".into()), ..Default::default() })
            .await
            .map_err(|e| e.to_string())?;
        if inst.is_some_and(|i| i.status == WorkflowStatus::Waiting)
            && listed.items.iter().any(|s| s.status == WorkflowStatus::Waiting)
        {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err("the invoice never waited on its human task".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let browser =
        tokio::time::timeout(Duration::from_secs(args.timeout_s), drive(&args, work.path(), &base_url, wf.as_str()))
            .await
            .map_err(|_| format!("the browser did not finish within {} s", args.timeout_s))
            .and_then(|r| r);

    let status = d.store.store.get(&wf).await.map_err(|e| e.to_string())?.map(|i| i.status);
    server.abort();
    running.shutdown().await;
    let _ = writer.close().await;
    let (pages, approved, shots) = browser?;
    let status = status.ok_or("the invoice is gone from the store")?;
    if status != WorkflowStatus::Completed {
        return Err(format!("the store says {}", status.as_str()));
    }
    for s in &shots {
        if !is_png(s) {
            return Err(format!("{} is not a PNG", s.display()));
        }
    }
    Ok(format!(
        "browser-console: pages={pages} approved_in_browser={approved} store_status={} screenshots={}",
        status.as_str(),
        shots.len()
    ))
}

/// The browser part: pages visited, whether the approval was clicked and shown, screenshots.
async fn drive(args: &Args, work: &Path, base: &str, wf: &str) -> Result<(u32, bool, Vec<PathBuf>), String> {
    let port = free_port()?;
    let mut cmd = Command::new(&args.chromedriver);
    cmd.arg(format!("--port={port}")).stdout(Stdio::null()).stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let _driver = Driver(cmd.spawn().map_err(|e| format!("{}: {e}", args.chromedriver))?);
    let profile = work.join("profile");
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": args.chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,1000",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    let webdriver = format!("http://127.0.0.1:{port}");
    let client = {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&webdriver)
                .await
            {
                Ok(c) => break c,
                Err(e) if tokio::time::Instant::now() > deadline => return Err(format!("webdriver session: {e}")),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    };
    let result = steps(&client, args, base, wf).await;
    let _ = client.close().await;
    result
}

fn wait(c: &fantoccini::Client) -> fantoccini::wait::Wait<'_> {
    c.wait().at_most(STEP_TIMEOUT).every(Duration::from_millis(100))
}

async fn steps(c: &fantoccini::Client, args: &Args, base: &str, wf: &str) -> Result<(u32, bool, Vec<PathBuf>), String> {
    let e = |what: &'static str| move |err: fantoccini::error::CmdError| format!("{what}: {err}");
    let mut pages = 0;
    let mut shots = vec![];

    // 1. The login page.
    c.goto(&format!("{base}/login")).await.map_err(e("open the login page"))?;
    pages += 1;
    wait(c)
        .for_element(Locator::Id("token"))
        .await
        .map_err(e("the token field"))?
        .send_keys(TOKEN)
        .await
        .map_err(e("type the token"))?;
    c.find(Locator::Id("login-submit")).await.map_err(e("the login button"))?.click().await.map_err(e("log in"))?;

    // 2. The list, with the invoice waiting.
    let row = "//table[@id='instances']//tr[@data-biz-key='inv-7']";
    wait(c)
        .for_element(Locator::XPath(&format!("{row}//span[@data-status='waiting']")))
        .await
        .map_err(e("the list"))?;
    pages += 1;
    let list_png = args.out.join("console-list.png");
    std::fs::write(&list_png, c.screenshot().await.map_err(e("screenshot the list"))?).map_err(|e| e.to_string())?;
    shots.push(list_png);

    // 3. The detail page, waiting on a person.
    c.find(Locator::XPath(&format!("{row}//a[@class='wf-link']")))
        .await
        .map_err(e("the invoice's link"))?
        .click()
        .await
        .map_err(e("open the invoice"))?;
    wait(c).for_element(Locator::Css("#wf-status[data-status='waiting']")).await.map_err(e("the detail page"))?;
    pages += 1;
    let approve = wait(c)
        .for_element(Locator::XPath("//section[@id='human-tasks']//button[normalize-space(text())='Approve']"))
        .await
        .map_err(e("the approve button"))?;
    approve.click().await.map_err(e("approve"))?;

    // 4. The page shows the workflow completed (it refreshes itself).
    let shown = wait(c).for_element(Locator::Css("#wf-status[data-status='completed']")).await.is_ok();
    if !shown {
        let flash = match c.find(Locator::Id("flash")).await {
            Ok(f) => f.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        return Err(format!("the detail page of {wf} never showed completed (flash: `{flash}`)"));
    }
    wait(c).for_element(Locator::Css("#gantt rect")).await.map_err(e("the timeline"))?;
    let detail_png = args.out.join("console-detail.png");
    std::fs::write(&detail_png, c.screenshot().await.map_err(e("screenshot the detail"))?)
        .map_err(|e| e.to_string())?;
    shots.push(detail_png);

    // 5. The other pages draw: the inbox is empty now, the audit log holds the approval.
    let others = [
        ("tasks", "//main[.//h1[starts-with(text(),'Tasks for')]]//p[text()='Nothing to decide.']"),
        ("audit", "//table[@id='audit']//tr[td[text()='ana'] and td[text()='task-approve'] and td[text()='ok']]"),
        ("lanes", "//table[@id='lanes']/tbody/tr[4]"),
        ("dead-letters", "//table[@id='dead-letters']//tr[td[text()='wf-pay-1'] or td/a[text()='wf-pay-1']][.//button[text()='Retry']]"),
    ];
    for (page, check) in others {
        c.goto(&format!("{base}/#/{page}")).await.map_err(e("open a page"))?;
        if let Err(err) = wait(c).for_element(Locator::XPath(check)).await {
            let shown = match c.find(Locator::Id("main")).await {
                Ok(m) => m.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            return Err(format!("the {page} page: {err}; it shows: {shown}"));
        }
        pages += 1;
    }
    Ok((pages, shown, shots))
}
