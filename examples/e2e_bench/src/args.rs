//! The command line: a benchmark run (the default) or `plot`. Pure, so it is tested without a
//! server.

use std::path::PathBuf;

/// Where PostgreSQL is when neither `--postgres-url` nor `DATABASE_URL` says (trust
/// authentication on the address).
pub const POSTGRES_URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";
/// Where Redis is when neither `--redis-url` nor `REDIS_URL` says.
pub const REDIS_URL_DEFAULT: &str = "redis://127.0.0.1:6379";
/// Burst size on the in-memory store.
pub const WORKFLOWS_DEFAULT: usize = 2_000;
/// Burst size on a store that is a functional imitation (the Mongo-wire test server): small,
/// since its figures are not compared with anything.
pub const WORKFLOWS_SMALL_DEFAULT: usize = 50;
/// One-at-a-time workflows per side for the latency percentiles.
pub const SINGLES_DEFAULT: usize = 200;
/// Singles on a store that is a functional imitation.
pub const SINGLES_SMALL_DEFAULT: usize = 20;
/// Engine worker slots, and floor worker tasks.
pub const SLOTS_DEFAULT: usize = 8;
/// Separate Redis connections of the floor.
pub const FLOOR_CONNECTIONS_DEFAULT: usize = 8;
/// Alternating engine/floor pairs.
pub const RUNS_DEFAULT: usize = 3;
/// Start batches (of up to `Publisher::START_MANY_MAX` workflows) in flight at once, on both sides.
pub const START_BATCHES_DEFAULT: usize = 4;
/// Untimed workflows per side before the first run (connections, scripts, allocator).
pub const WARMUP_DEFAULT: usize = 200;
/// Upper bound of every count flag: a typo must not start a run of hours.
pub const COUNT_MAX: usize = 1_000_000;

/// The stores the bench can put under the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// kernel-memory's in-memory store: stands in for a store that costs nothing.
    Memory,
    /// store-mongo against the project's Mongo-wire test server (a functional imitation:
    /// its figures are printed, never compared).
    MongoWire,
    /// store-postgres on a real PostgreSQL server, measured against the raw PostgreSQL
    /// floor (`pgfloor`) instead of the Lua floor.
    Postgres,
    /// store-sqlite with coord-local's lanes, wakeup and permits in the same file (the
    /// embedded default, `--store sqlite:… --queue local`, durable commits): no server and
    /// no floor to compare with; its figures are printed, never compared.
    Sqlite,
}

impl StoreKind {
    /// The label of `store=` in the output lines.
    pub fn label(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::MongoWire => "mongo-wire",
            StoreKind::Postgres => "postgres",
            StoreKind::Sqlite => "sqlite",
        }
    }

    fn parse(s: &str) -> Result<StoreKind, String> {
        match s {
            "memory" => Ok(StoreKind::Memory),
            "mongo-wire" => Ok(StoreKind::MongoWire),
            "postgres" => Ok(StoreKind::Postgres),
            "sqlite" => Ok(StoreKind::Sqlite),
            other => Err(format!("--store `{other}`: expected memory, mongo-wire, postgres or sqlite")),
        }
    }
}

/// Settings of a benchmark run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchArgs {
    /// The engine's store.
    pub store: StoreKind,
    /// Burst size N.
    pub workflows: usize,
    /// Engine worker slots = floor worker tasks.
    pub slots: usize,
    /// One-at-a-time workflows per side.
    pub singles: usize,
    /// Alternating engine/floor pairs.
    pub runs: usize,
    /// Separate connections of the floor.
    pub floor_connections: usize,
    /// Starts in flight at once (both sides).
    pub start_batches: usize,
    /// Untimed workflows per side before the first run.
    pub warmup: usize,
    /// Whether the floor runs (default: only next to the in-memory store).
    pub floor: bool,
    /// Redis, shared by the engine's lanes and the floor.
    pub redis_url: String,
    /// The Mongo-wire server (`--store mongo-wire`).
    pub mongo_url: Option<String>,
    /// The PostgreSQL server (`--store postgres`); the bench runs in a fresh database on it.
    pub postgres_url: String,
}

/// Settings of `plot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlotArgs {
    /// A file holding `e2e-bench:` lines (other lines are ignored).
    pub input: PathBuf,
    /// The PNG to write.
    pub out: PathBuf,
    /// A TTF font for the labels; default: the first of [`crate::plot::FONT_CANDIDATES`]
    /// that exists.
    pub font: Option<PathBuf>,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Measure and print.
    Bench(BenchArgs),
    /// Draw a PNG from printed lines.
    Plot(PlotArgs),
    /// Draw a PNG of a soak run from its CSV (and scaling lines).
    PlotSoak(crate::soakplot::PlotSoakArgs),
    /// Claim latency against the size of the instance table on PostgreSQL.
    ClaimLatency(crate::claimlat::ClaimLatencyArgs),
    /// Print the usage.
    Help,
}

/// The usage text.
pub const USAGE: &str = "\
usage: e2e-bench [--store memory|mongo-wire|postgres|sqlite] [--workflows N] [--slots S] [--singles K] [--runs R]
                 [--floor-connections C] [--start-batches B] [--warmup W] [--floor|--no-floor]
                 [--redis-url URL] [--mongo-url URL] [--postgres-url URL]
       e2e-bench plot --input <file with e2e-bench lines> --out <png> [--font <ttf>]
       e2e-bench plot-soak --input <soak CSV> [--scaling <file with soak lines>] --out <png> [--font <ttf>]
       e2e-bench claim-latency [--sizes 1000,100000,1000000] [--claims N] [--postgres-url URL]

REDIS_URL (default redis://127.0.0.1:6379), MONGODB_URI and DATABASE_URL (default
postgres://postgres@127.0.0.1:5432/test) are read when the flags are absent. With
--store postgres the floor is the raw PostgreSQL floor, in a fresh database dropped at the end.
";

/// Read the command line (`args` without the program name); `env` reads a variable.
pub fn parse(args: &[String], env: impl Fn(&str) -> Option<String>) -> Result<Command, String> {
    let mut it = args.iter().peekable();
    let plot = it.peek().is_some_and(|a| *a == "plot");
    let plot_soak = it.peek().is_some_and(|a| *a == "plot-soak");
    let claim_latency = it.peek().is_some_and(|a| *a == "claim-latency");
    if plot || plot_soak || claim_latency {
        it.next();
    }
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Command::Help);
        }
        let Some(name) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument `{arg}`"));
        };
        let (name, value) = match name.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None if is_switch(name) => (name.to_string(), None),
            None => {
                let v = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
                (name.to_string(), Some(v.clone()))
            }
        };
        flags.push((name, value));
    }
    if plot {
        parse_plot(flags).map(Command::Plot)
    } else if plot_soak {
        parse_plot_soak(flags).map(Command::PlotSoak)
    } else if claim_latency {
        parse_claim_latency(flags, env).map(Command::ClaimLatency)
    } else {
        parse_bench(flags, env).map(Command::Bench)
    }
}

fn is_switch(name: &str) -> bool {
    matches!(name, "floor" | "no-floor")
}

/// The path flags of a plot command (`allowed` of them), by name.
fn path_flags(
    command: &str,
    flags: Vec<(String, Option<String>)>,
    allowed: &[&str],
) -> Result<std::collections::HashMap<String, PathBuf>, String> {
    let mut out = std::collections::HashMap::new();
    for (name, value) in flags {
        let value = value.ok_or_else(|| format!("--{name} needs a value"))?;
        if !allowed.contains(&name.as_str()) {
            return Err(format!("{command}: unknown flag --{name}"));
        }
        out.insert(name, PathBuf::from(value));
    }
    Ok(out)
}

fn parse_plot(flags: Vec<(String, Option<String>)>) -> Result<PlotArgs, String> {
    let mut f = path_flags("plot", flags, &["input", "out", "font"])?;
    Ok(PlotArgs {
        input: f.remove("input").ok_or("plot needs --input <file>")?,
        out: f.remove("out").ok_or("plot needs --out <png>")?,
        font: f.remove("font"),
    })
}

fn parse_plot_soak(flags: Vec<(String, Option<String>)>) -> Result<crate::soakplot::PlotSoakArgs, String> {
    let mut f = path_flags("plot-soak", flags, &["input", "scaling", "out", "font"])?;
    Ok(crate::soakplot::PlotSoakArgs {
        input: f.remove("input").ok_or("plot-soak needs --input <soak CSV>")?,
        scaling: f.remove("scaling"),
        out: f.remove("out").ok_or("plot-soak needs --out <png>")?,
        font: f.remove("font"),
    })
}

/// Table sizes of `claim-latency` by default.
pub const CLAIM_LATENCY_SIZES_DEFAULT: [usize; 3] = [1_000, 100_000, 1_000_000];
/// Timed claims of each kind per size by default.
pub const CLAIM_LATENCY_CLAIMS_DEFAULT: usize = 3_000;

fn parse_claim_latency(
    flags: Vec<(String, Option<String>)>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<crate::claimlat::ClaimLatencyArgs, String> {
    let mut sizes = CLAIM_LATENCY_SIZES_DEFAULT.to_vec();
    let mut claims = CLAIM_LATENCY_CLAIMS_DEFAULT;
    let mut postgres_url =
        env("DATABASE_URL").filter(|v| !v.is_empty()).unwrap_or_else(|| POSTGRES_URL_DEFAULT.to_string());
    for (name, value) in flags {
        let value = value.ok_or_else(|| format!("--{name} needs a value"))?;
        match name.as_str() {
            "sizes" => {
                sizes = value.split(',').map(|v| count(&name, v.trim(), 1)).collect::<Result<_, _>>()?;
            }
            "claims" => claims = count(&name, &value, 1)?,
            "postgres-url" => postgres_url = value,
            other => return Err(format!("claim-latency: unknown flag --{other}")),
        }
    }
    Ok(crate::claimlat::ClaimLatencyArgs { sizes, claims, postgres_url })
}

fn count(name: &str, value: &str, min: usize) -> Result<usize, String> {
    let n: usize = value.parse().map_err(|_| format!("--{name} `{value}`: not a count"))?;
    if n < min || n > COUNT_MAX {
        return Err(format!("--{name} {n}: expected {min}..={COUNT_MAX}"));
    }
    Ok(n)
}

fn parse_bench(
    flags: Vec<(String, Option<String>)>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<BenchArgs, String> {
    let read = |k: &str| env(k).filter(|v| !v.is_empty());
    let mut store = StoreKind::Memory;
    let (mut workflows, mut singles, mut floor) = (None, None, None);
    let mut slots = SLOTS_DEFAULT;
    let mut runs = RUNS_DEFAULT;
    let mut floor_connections = FLOOR_CONNECTIONS_DEFAULT;
    let mut start_batches = START_BATCHES_DEFAULT;
    let mut warmup = WARMUP_DEFAULT;
    let mut redis_url = read("REDIS_URL").unwrap_or_else(|| REDIS_URL_DEFAULT.to_string());
    let mut mongo_url = read("MONGODB_URI");
    let mut postgres_url = read("DATABASE_URL").unwrap_or_else(|| POSTGRES_URL_DEFAULT.to_string());
    for (name, value) in flags {
        if is_switch(&name) {
            if value.is_some() {
                return Err(format!("--{name} takes no value"));
            }
            floor = Some(name == "floor");
            continue;
        }
        let value = value.ok_or_else(|| format!("--{name} needs a value"))?;
        match name.as_str() {
            "store" => store = StoreKind::parse(&value)?,
            "workflows" => workflows = Some(count(&name, &value, 1)?),
            "slots" => slots = count(&name, &value, 1)?,
            "singles" => singles = Some(count(&name, &value, 0)?),
            "runs" => runs = count(&name, &value, 1)?,
            "floor-connections" => floor_connections = count(&name, &value, 1)?,
            "start-batches" => start_batches = count(&name, &value, 1)?,
            "warmup" => warmup = count(&name, &value, 0)?,
            "redis-url" => redis_url = value,
            "mongo-url" => mongo_url = Some(value),
            "postgres-url" => postgres_url = value,
            other => return Err(format!("unknown flag --{other}\n{USAGE}")),
        }
    }
    let small = store == StoreKind::MongoWire;
    if store == StoreKind::Sqlite && floor == Some(true) {
        return Err("--store sqlite has no floor (there is no raw SQLite protocol to compare with)".to_string());
    }
    if store == StoreKind::MongoWire && mongo_url.is_none() {
        return Err("--store mongo-wire needs --mongo-url or MONGODB_URI \
                    (eval \"$(bash scripts/mongo-wire.sh start)\"; export MONGODB_URI)"
            .to_string());
    }
    Ok(BenchArgs {
        store,
        workflows: workflows.unwrap_or(if small { WORKFLOWS_SMALL_DEFAULT } else { WORKFLOWS_DEFAULT }),
        slots,
        singles: singles.unwrap_or(if small { SINGLES_SMALL_DEFAULT } else { SINGLES_DEFAULT }),
        runs,
        floor_connections,
        start_batches,
        warmup,
        floor: floor.unwrap_or(!small && store != StoreKind::Sqlite),
        redis_url,
        mongo_url,
        postgres_url,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Command, String> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        parse(&args, |k| env.get(k).cloned())
    }

    fn bench(args: &[&str], env: &[(&str, &str)]) -> BenchArgs {
        match run(args, env) {
            Ok(Command::Bench(b)) => b,
            other => panic!("expected a bench command, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_the_issue_s_load() {
        let b = bench(&[], &[]);
        assert_eq!(b.store, StoreKind::Memory);
        assert_eq!((b.workflows, b.slots, b.singles, b.runs), (2_000, 8, 200, 3));
        assert_eq!(b.floor_connections, 8);
        assert!(b.floor);
        assert_eq!(b.redis_url, REDIS_URL_DEFAULT);
    }

    #[test]
    fn flags_override_defaults_and_environment() {
        let b = bench(
            &["--workflows", "10", "--slots=4", "--runs", "1", "--floor-connections", "2", "--redis-url", "redis://x"],
            &[("REDIS_URL", "redis://env")],
        );
        assert_eq!((b.workflows, b.slots, b.runs, b.floor_connections), (10, 4, 1, 2));
        assert_eq!(b.redis_url, "redis://x");
        assert_eq!(bench(&[], &[("REDIS_URL", "redis://env")]).redis_url, "redis://env");
        assert_eq!(bench(&[], &[("REDIS_URL", "")]).redis_url, REDIS_URL_DEFAULT);
    }

    #[test]
    fn mongo_wire_is_small_needs_a_url_and_has_no_floor_by_default() {
        let e = run(&["--store", "mongo-wire"], &[]).unwrap_err();
        assert!(e.contains("MONGODB_URI"), "{e}");
        let b = bench(&["--store", "mongo-wire"], &[("MONGODB_URI", "mongodb://127.0.0.1:1")]);
        assert_eq!((b.workflows, b.singles, b.floor), (WORKFLOWS_SMALL_DEFAULT, SINGLES_SMALL_DEFAULT, false));
        assert_eq!(b.store.label(), "mongo-wire");
        let b = bench(&["--store", "mongo-wire", "--mongo-url", "mongodb://m", "--floor", "--workflows", "7"], &[]);
        assert_eq!((b.workflows, b.floor), (7, true));
        assert!(!bench(&["--no-floor"], &[]).floor);
    }

    #[test]
    fn postgres_is_full_size_with_its_floor_and_reads_database_url() {
        let b = bench(&["--store", "postgres"], &[]);
        assert_eq!((b.store, b.store.label()), (StoreKind::Postgres, "postgres"));
        assert_eq!((b.workflows, b.singles, b.floor), (WORKFLOWS_DEFAULT, SINGLES_DEFAULT, true));
        assert_eq!(b.postgres_url, POSTGRES_URL_DEFAULT);
        assert_eq!(bench(&[], &[("DATABASE_URL", "postgres://env/db")]).postgres_url, "postgres://env/db");
        let b =
            bench(&["--store=postgres", "--postgres-url", "postgres://x/y"], &[("DATABASE_URL", "postgres://env/db")]);
        assert_eq!(b.postgres_url, "postgres://x/y");
    }

    #[test]
    fn bad_input_is_refused_with_the_flag_named() {
        for (args, needle) in [
            (&["--workflows", "0"][..], "--workflows 0"),
            (&["--workflows", "x"][..], "--workflows `x`"),
            (&["--slots"][..], "--slots needs a value"),
            (&["--store", "cassandra"][..], "--store `cassandra`"),
            (&["--store", "sqlite", "--floor"][..], "--store sqlite has no floor"),
            (&["--bogus", "1"][..], "unknown flag --bogus"),
            (&["stray"][..], "unexpected argument `stray`"),
            (&["--no-floor=1"][..], "takes no value"),
        ] {
            let e = run(args, &[]).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }

    #[test]
    fn sqlite_runs_without_a_floor() {
        let b = bench(&["--store", "sqlite"], &[]);
        assert_eq!((b.store, b.store.label(), b.floor), (StoreKind::Sqlite, "sqlite", false));
    }

    #[test]
    fn plot_takes_input_out_and_an_optional_font() {
        let Ok(Command::Plot(p)) = run(&["plot", "--input", "runs.txt", "--out=e2e.png"], &[]) else {
            panic!("expected plot")
        };
        assert_eq!(p, PlotArgs { input: "runs.txt".into(), out: "e2e.png".into(), font: None });
        assert!(run(&["plot", "--input", "a"], &[]).unwrap_err().contains("--out"));
        assert!(run(&["plot", "--workflows", "1"], &[]).unwrap_err().contains("unknown flag --workflows"));
        assert_eq!(run(&["--help"], &[]).unwrap(), Command::Help);
    }

    #[test]
    fn plot_soak_takes_input_out_and_optional_scaling_and_font() {
        let Ok(Command::PlotSoak(p)) =
            run(&["plot-soak", "--input", "s.csv", "--scaling=s.txt", "--out", "s.png"], &[])
        else {
            panic!("expected plot-soak")
        };
        assert_eq!((p.input, p.scaling, p.out, p.font), ("s.csv".into(), Some("s.txt".into()), "s.png".into(), None));
        assert!(run(&["plot-soak", "--input", "a"], &[]).unwrap_err().contains("--out"));
        assert!(run(&["plot-soak", "--out", "a", "--input", "b", "--runs", "3"], &[])
            .unwrap_err()
            .contains("plot-soak: unknown flag --runs"));
    }

    #[test]
    fn claim_latency_takes_sizes_claims_and_the_database_url() {
        let Ok(Command::ClaimLatency(c)) = run(&["claim-latency"], &[("DATABASE_URL", "postgres://env/db")]) else {
            panic!("expected claim-latency")
        };
        assert_eq!(c.sizes, vec![1_000, 100_000, 1_000_000]);
        assert_eq!((c.claims, c.postgres_url.as_str()), (CLAIM_LATENCY_CLAIMS_DEFAULT, "postgres://env/db"));
        let Ok(Command::ClaimLatency(c)) = run(&["claim-latency", "--sizes", "10, 20", "--claims=5"], &[]) else {
            panic!("expected claim-latency")
        };
        assert_eq!((c.sizes, c.claims, c.postgres_url.as_str()), (vec![10, 20], 5, POSTGRES_URL_DEFAULT));
        assert!(run(&["claim-latency", "--sizes", "10,x"], &[]).unwrap_err().contains("--sizes `x`"));
        assert!(run(&["claim-latency", "--workflows", "1"], &[]).unwrap_err().contains("unknown flag --workflows"));
    }
}
