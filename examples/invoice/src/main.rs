//! The invoice pipeline's command:
//!
//! ```bash
//! cargo run -p invoice-pipeline --bin invoice -- story
//! cargo run -p invoice-pipeline --bin invoice -- evaluate --invoices 1000 --seed 7 --store sqlite --out target/invoice-eval
//! ```

use invoice_pipeline::{eval, report, story, world::StoreKind};
use std::path::PathBuf;

const USAGE: &str = "usage: invoice story [--seed S]\n       invoice evaluate --invoices N --seed S [--store memory|sqlite|postgres://…|mongodb://…] --out DIR [--font PATH]";

struct Args {
    command: String,
    invoices: usize,
    seed: u64,
    store: String,
    out: Option<PathBuf>,
    font: Option<PathBuf>,
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args { command: String::new(), invoices: 200, seed: 7, store: "memory".into(), out: None, font: None };
    let mut it = argv.iter();
    a.command = it.next().cloned().ok_or(USAGE)?;
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"));
        match flag.as_str() {
            "--invoices" => a.invoices = value()?.parse().map_err(|e| format!("--invoices: {e}"))?,
            "--seed" => a.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--store" => a.store = value()?,
            "--out" => a.out = Some(PathBuf::from(value()?)),
            "--font" => a.font = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(a)
}

async fn run(a: Args) -> Result<(), String> {
    match a.command.as_str() {
        "story" => {
            print!("{}", story::run(a.seed).await.map_err(|e| e.to_string())?);
            Ok(())
        }
        "evaluate" => {
            let out = a.out.clone().ok_or_else(|| format!("evaluate needs --out DIR\n{USAGE}"))?;
            if a.invoices == 0 {
                return Err("--invoices must be at least 1".into());
            }
            let scratch = std::env::temp_dir().join(format!("invoice-eval-{}-{}", std::process::id(), a.seed));
            let store = match a.store.as_str() {
                "memory" => StoreKind::Memory,
                "sqlite" => StoreKind::Sqlite(scratch.clone()),
                url if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                    StoreKind::Postgres(url.to_string())
                }
                url if url.starts_with("mongodb://") => StoreKind::Mongo(url.to_string()),
                other => {
                    return Err(format!("unknown store {other}: memory, sqlite, a postgres:// URL or a mongodb:// URI"))
                }
            };
            let e = eval::evaluate(a.invoices, a.seed, &store).await.map_err(|e| e.to_string());
            let _ = std::fs::remove_dir_all(&scratch);
            invoice_pipeline::world::drop_scratch().await;
            let e = e?;
            let command = format!(
                "cargo run -p invoice-pipeline --bin invoice -- evaluate --invoices {} --seed {} --store {} --out {}",
                a.invoices,
                a.seed,
                a.store,
                out.display()
            );
            let (md, png) = report::write(&e, &out, &command, a.font.as_deref())?;
            println!("report: {}", md.display());
            println!("chart: {}", png.display());
            println!("{}", e.line());
            // The demo's verdict: a wrong count fails the command.
            e.verdict()
        }
        _ => Err(USAGE.into()),
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            std::process::exit(2);
        }
    };
    let result = parse(&argv).map(|a| rt.block_on(run(a)));
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) | Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}
