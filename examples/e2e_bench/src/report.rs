//! The printed lines: one `e2e-bench:` line per run, a `median:` line, and their parser
//! (the plot reads the lines back).

use std::fmt::Write as _;

/// The prefix of a run line.
pub const RUN_PREFIX: &str = "e2e-bench:";
/// The prefix of the median line.
pub const MEDIAN_PREFIX: &str = "median:";

/// What one side measured in one run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Side {
    /// Burst throughput: N over first start → last completion.
    pub wf_s: f64,
    /// Process CPU plus the Redis server's CPU during the burst, per workflow.
    pub cpu_us_per_wf: f64,
    /// Process CPU alone during the burst, per workflow.
    pub proc_cpu_us_per_wf: f64,
    /// Single-workflow latency, start → terminal write.
    pub single_p50_ms: f64,
    /// Single-workflow latency, 99th percentile.
    pub single_p99_ms: f64,
    /// Applied guarded writes per workflow (claim or pop lease and steps; not the create).
    pub writes_per_wf: f64,
    /// Statements sent per step during the burst, counted client side (PostgreSQL only).
    pub stmts_per_step: Option<f64>,
    /// Transactions committed per step during the burst, from the server (PostgreSQL only).
    pub commits_per_step: Option<f64>,
}

/// One run: the engine on `store` and, when it ran, the floor.
#[derive(Debug, Clone, PartialEq)]
pub struct RunLine {
    /// `store=` label.
    pub store: String,
    /// Burst size.
    pub workflows: usize,
    /// Steps per workflow.
    pub steps: usize,
    /// Engine slots = floor workers.
    pub slots: usize,
    /// The engine.
    pub engine: Side,
    /// The floor, when it ran.
    pub floor: Option<Side>,
}

fn num(v: f64, decimals: usize) -> String {
    format!("{v:.decimals$}")
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| num(v, decimals))
}

impl RunLine {
    /// The fields in print order: those the issue names first, extras after.
    fn fields(&self) -> Vec<(&'static str, String)> {
        let (e, f) = (&self.engine, self.floor.as_ref());
        let ratio = f.map(|f| e.wf_s / f.wf_s);
        let cpu_ratio = f.map(|f| e.cpu_us_per_wf / f.cpu_us_per_wf);
        let mut fields = vec![
            ("store", self.store.clone()),
            ("workflows", self.workflows.to_string()),
            ("steps", self.steps.to_string()),
            ("slots", self.slots.to_string()),
            ("wf_s", num(e.wf_s, 0)),
            ("floor_wf_s", opt(f.map(|f| f.wf_s), 0)),
            ("ratio", opt(ratio, 2)),
            ("cpu_us_per_wf", num(e.cpu_us_per_wf, 1)),
            ("floor_cpu_us_per_wf", opt(f.map(|f| f.cpu_us_per_wf), 1)),
            ("single_p50_ms", num(e.single_p50_ms, 3)),
            ("floor_single_p50_ms", opt(f.map(|f| f.single_p50_ms), 3)),
            ("writes_per_wf", num(e.writes_per_wf, 2)),
            ("cpu_ratio", opt(cpu_ratio, 2)),
            ("single_p99_ms", num(e.single_p99_ms, 3)),
            ("floor_single_p99_ms", opt(f.map(|f| f.single_p99_ms), 3)),
            ("proc_cpu_us_per_wf", num(e.proc_cpu_us_per_wf, 1)),
            ("floor_proc_cpu_us_per_wf", opt(f.map(|f| f.proc_cpu_us_per_wf), 1)),
            ("floor_writes_per_wf", opt(f.map(|f| f.writes_per_wf), 2)),
        ];
        // Only where counted (PostgreSQL), so the other stores' lines stay as they were.
        if e.stmts_per_step.is_some() || e.commits_per_step.is_some() {
            fields.extend([
                ("stmts_per_step", opt(e.stmts_per_step, 2)),
                ("floor_stmts_per_step", opt(f.and_then(|f| f.stmts_per_step), 2)),
                ("commits_per_step", opt(e.commits_per_step, 2)),
                ("floor_commits_per_step", opt(f.and_then(|f| f.commits_per_step), 2)),
            ]);
        }
        fields
    }

    /// `e2e-bench: store=… workflows=… …`.
    pub fn line(&self) -> String {
        let mut out = RUN_PREFIX.to_string();
        for (k, v) in self.fields() {
            write!(out, " {k}={v}").expect("write to a String");
        }
        out
    }

    /// `median: store=… runs=R …`: every figure the median of `runs` lines (ratios are the
    /// medians of the per-run ratios, not ratios of medians).
    pub fn median_line(runs: &[RunLine]) -> Option<String> {
        let first = runs.first()?;
        let pick = |get: &dyn Fn(&RunLine) -> Option<f64>| median(runs.iter().filter_map(get).collect());
        let side = |get: &dyn Fn(&RunLine) -> Option<&Side>| -> Option<Side> {
            Some(Side {
                wf_s: pick(&|r| get(r).map(|s| s.wf_s))?,
                cpu_us_per_wf: pick(&|r| get(r).map(|s| s.cpu_us_per_wf))?,
                proc_cpu_us_per_wf: pick(&|r| get(r).map(|s| s.proc_cpu_us_per_wf))?,
                single_p50_ms: pick(&|r| get(r).map(|s| s.single_p50_ms))?,
                single_p99_ms: pick(&|r| get(r).map(|s| s.single_p99_ms))?,
                writes_per_wf: pick(&|r| get(r).map(|s| s.writes_per_wf))?,
                stmts_per_step: pick(&|r| get(r).and_then(|s| s.stmts_per_step)),
                commits_per_step: pick(&|r| get(r).and_then(|s| s.commits_per_step)),
            })
        };
        let m = RunLine { engine: side(&|r| Some(&r.engine))?, floor: side(&|r| r.floor.as_ref()), ..first.clone() };
        let mut fields = m.fields();
        // Median of the per-run ratios.
        for (key, get) in [
            ("ratio", (&|r: &RunLine| r.floor.map(|f| r.engine.wf_s / f.wf_s)) as &dyn Fn(&RunLine) -> Option<f64>),
            ("cpu_ratio", &|r: &RunLine| r.floor.map(|f| r.engine.cpu_us_per_wf / f.cpu_us_per_wf)),
        ] {
            if let Some(slot) = fields.iter_mut().find(|(k, _)| *k == key) {
                slot.1 = opt(pick(get), 2);
            }
        }
        let mut out = format!("{MEDIAN_PREFIX} store={} runs={}", m.store, runs.len());
        for (k, v) in fields.into_iter().skip(1) {
            write!(out, " {k}={v}").expect("write to a String");
        }
        Some(out)
    }

    /// Read an `e2e-bench:` line back; `None` for any other line.
    pub fn parse(line: &str) -> Option<RunLine> {
        let rest = line.trim().strip_prefix(RUN_PREFIX)?;
        let kv: Vec<(&str, &str)> = rest.split_whitespace().filter_map(|t| t.split_once('=')).collect();
        let get = |k: &str| kv.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
        let f = |k: &str| get(k).and_then(|v| v.parse::<f64>().ok());
        let side = |p: &str| -> Option<Side> {
            Some(Side {
                wf_s: f(&format!("{p}wf_s"))?,
                cpu_us_per_wf: f(&format!("{p}cpu_us_per_wf"))?,
                proc_cpu_us_per_wf: f(&format!("{p}proc_cpu_us_per_wf")).unwrap_or(f64::NAN),
                single_p50_ms: f(&format!("{p}single_p50_ms"))?,
                single_p99_ms: f(&format!("{p}single_p99_ms")).unwrap_or(f64::NAN),
                writes_per_wf: f(&format!("{p}writes_per_wf")).unwrap_or(f64::NAN),
                stmts_per_step: f(&format!("{p}stmts_per_step")),
                commits_per_step: f(&format!("{p}commits_per_step")),
            })
        };
        Some(RunLine {
            store: get("store")?.to_string(),
            workflows: get("workflows")?.parse().ok()?,
            steps: get("steps")?.parse().ok()?,
            slots: get("slots")?.parse().ok()?,
            engine: side("")?,
            floor: side("floor_"),
        })
    }
}

/// The median (mean of the middle two for an even count); `None` when empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// The nearest-rank percentile `p` (0 < p ≤ 1) of `samples`; `None` when empty.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = (p * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(wf_s: f64, cpu: f64) -> Side {
        Side {
            wf_s,
            cpu_us_per_wf: cpu,
            proc_cpu_us_per_wf: cpu / 2.0,
            single_p50_ms: 0.25,
            single_p99_ms: 0.9,
            writes_per_wf: 6.0,
            stmts_per_step: None,
            commits_per_step: None,
        }
    }

    fn line(wf_s: f64, floor_wf_s: f64) -> RunLine {
        RunLine {
            store: "memory".into(),
            workflows: 2000,
            steps: 4,
            slots: 8,
            engine: side(wf_s, 200.0),
            floor: Some(side(floor_wf_s, 100.0)),
        }
    }

    #[test]
    fn the_line_starts_with_the_issue_s_fields_in_order() {
        let l = line(8000.0, 16000.0).line();
        let want = "e2e-bench: store=memory workflows=2000 steps=4 slots=8 wf_s=8000 floor_wf_s=16000 ratio=0.50 \
                    cpu_us_per_wf=200.0 floor_cpu_us_per_wf=100.0 single_p50_ms=0.250 floor_single_p50_ms=0.250 \
                    writes_per_wf=6.00 cpu_ratio=2.00 ";
        assert!(l.starts_with(want), "{l}");
        assert!(l.contains(" proc_cpu_us_per_wf=100.0 ") && l.contains(" floor_single_p99_ms=0.900 "), "{l}");
    }

    #[test]
    fn a_printed_line_reads_back() {
        let l = line(7812.0, 15625.0);
        assert_eq!(RunLine::parse(&l.line()), Some(l));
        let no_floor = RunLine { floor: None, store: "mongo-wire".into(), ..line(40.0, 1.0) };
        let printed = no_floor.line();
        assert!(printed.contains(" floor_wf_s=n/a ratio=n/a "), "{printed}");
        assert_eq!(RunLine::parse(&printed), Some(no_floor));
        assert_eq!(RunLine::parse("median: store=memory runs=3 wf_s=1"), None);
        assert_eq!(RunLine::parse("something else"), None);
    }

    #[test]
    fn median_line_takes_the_median_of_each_figure_and_of_the_ratios() {
        let runs = [line(7000.0, 14000.0), line(9000.0, 10000.0), line(8000.0, 20000.0)];
        let m = RunLine::median_line(&runs).unwrap();
        assert!(m.starts_with("median: store=memory runs=3 workflows=2000 steps=4 slots=8 wf_s=8000 floor_wf_s=14000 "));
        // Ratios 0.50, 0.90, 0.40: the median ratio is 0.50, not 8000/14000.
        assert!(m.contains(" ratio=0.50 "), "{m}");
        assert_eq!(RunLine::median_line(&[]), None);
    }

    #[test]
    fn postgres_lines_carry_statements_and_commits_per_step_and_read_back() {
        let counted = |s: Side, st: f64, c: f64| Side { stmts_per_step: Some(st), commits_per_step: Some(c), ..s };
        let l = RunLine {
            store: "postgres".into(),
            engine: counted(side(900.0, 300.0), 2.25, 2.5),
            floor: Some(counted(side(3000.0, 100.0), 1.5, 1.5)),
            ..line(1.0, 1.0)
        };
        let printed = l.line();
        assert!(
            printed.ends_with(
                " stmts_per_step=2.25 floor_stmts_per_step=1.50 commits_per_step=2.50 floor_commits_per_step=1.50"
            ),
            "{printed}"
        );
        assert_eq!(RunLine::parse(&printed), Some(l.clone()));
        let m = RunLine::median_line(&[l.clone(), l]).unwrap();
        assert!(m.contains(" commits_per_step=2.50 floor_commits_per_step=1.50"), "{m}");
        // The other stores' lines carry none of them.
        assert!(!line(1.0, 1.0).line().contains("per_step"));
    }

    #[test]
    fn median_and_percentiles() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
        let s: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile(&s, 0.5), Some(100.0));
        assert_eq!(percentile(&s, 0.99), Some(198.0));
        assert_eq!(percentile(&[5.0], 0.99), Some(5.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
