//! `e2e-bench plot-soak`: a PNG of a soak run (`cargo run -p soak`)
//! — workflows/s per window over the run and the step latency p50/p99 per window, from
//! the CSV the soak writes (`--csv`), and, with `--scaling`, the workflows/s of soak runs
//! at several process counts from their printed lines (`soak:` for `processes=`, the
//! `soak detail:` line after it for `wf_s=`).
//!
//! Drawn like [`crate::plot`] (its font and colours).

use crate::plot::{de, legend, load_font, tick, COLORS, FONT};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const SIZE: (u32, u32) = (1800, 560);

/// Settings of `plot-soak`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlotSoakArgs {
    /// The soak's CSV of windows.
    pub input: PathBuf,
    /// A file holding `soak:` and `soak detail:` lines of runs at several process counts.
    pub scaling: Option<PathBuf>,
    /// The PNG to write.
    pub out: PathBuf,
    /// A TTF font for the labels (as for `plot`).
    pub font: Option<PathBuf>,
}

/// One row of the soak's CSV.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    /// Window start, s.
    pub start_s: f64,
    /// Workflows completed per second in it.
    pub wf_s: f64,
    /// `[count, p50 ms, p99 ms]` of the steps without a permit completed in it.
    pub steps: [f64; 3],
    /// The same of the steps holding a permit.
    pub permit_steps: [f64; 3],
    /// Kills, stops and Redis restarts begun in it.
    pub chaos: [f64; 3],
}

/// The rows of the CSV (`window_start_s,workflows,workflows_per_s,steps,step_p50_ms,
/// step_p99_ms,permit_steps,permit_step_p50_ms,permit_step_p99_ms,kills,stops,redis_restarts`).
pub fn parse_csv(text: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1).filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        let num = |i: usize| -> Result<f64, String> {
            let v = f.get(i).and_then(|v| v.trim().parse().ok());
            v.ok_or(format!("line {}: column {} is not a number", n + 1, i + 1))
        };
        rows.push(Row {
            start_s: num(0)?,
            wf_s: num(2)?,
            steps: [num(3)?, num(4)?, num(5)?],
            permit_steps: [num(6)?, num(7)?, num(8)?],
            chaos: [num(9)?, num(10)?, num(11)?],
        });
    }
    Ok(rows)
}

fn field(line: &str, key: &str) -> Option<f64> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// `(processes, workflows/s)` of each run in printed soak output, in file order.
pub fn parse_scaling(text: &str) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut processes = None;
    for line in text.lines() {
        if line.starts_with("soak: ") {
            processes = field(line, "processes");
        } else if line.starts_with("soak detail: ") {
            if let (Some(p), Some(w)) = (processes.take(), field(line, "wf_s")) {
                out.push((p, w));
            }
        }
    }
    out
}

fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let hi = values.filter(|v| v.is_finite()).fold(0.0f64, f64::max);
    (0.0, if hi > 0.0 { hi * 1.15 } else { 1.0 })
}

/// Draw the rows (and the scaling runs) into a PNG at `out` (the font must be loaded).
pub fn draw(rows: &[Row], scaling: &[(f64, f64)], out: &Path) -> Result<(), String> {
    let end = rows.iter().map(|r| r.start_s).fold(0.0f64, f64::max) + 10.0;
    let root = BitMapBackend::new(out, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(de)?;
    let panels = root.split_evenly((1, 3));
    let color = |i: usize| COLORS[i % COLORS.len()].to_rgba();

    let (lo, hi) = range(rows.iter().map(|r| r.wf_s));
    let mut chart = ChartBuilder::on(&panels[0])
        .caption("Workflows completed per second, per window", (FONT, 22))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, lo..hi)
        .map_err(de)?;
    chart
        .configure_mesh()
        .x_desc("s into the run")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("workflows/s")
        .y_label_formatter(&tick)
        .label_style((FONT, 14))
        .draw()
        .map_err(de)?;
    let c = color(0);
    chart.draw_series(LineSeries::new(rows.iter().map(|r| (r.start_s, r.wf_s)), c.stroke_width(2))).map_err(de)?;
    // The chaos on the line, at the window it began in: a kill, a stop, a Redis restart.
    let at = |k: usize| rows.iter().filter(move |r| r.chaos[k] > 0.0).map(|r| (r.start_s, r.wf_s));
    let (kill, stop, redis) = (color(2), color(3), color(4));
    chart
        .draw_series(at(0).map(|p| Cross::new(p, 6, kill.stroke_width(2))))
        .map_err(de)?
        .label("kill")
        .legend(move |(x, y)| Cross::new((x + 10, y), 6, kill.stroke_width(2)));
    chart
        .draw_series(at(1).map(|p| TriangleMarker::new(p, 7, stop.filled())))
        .map_err(de)?
        .label("stop")
        .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 7, stop.filled()));
    chart
        .draw_series(at(2).map(|(x, y)| Rectangle::new([(x - 3.0, y - 6.0), (x + 3.0, y + 6.0)], redis.filled())))
        .map_err(de)?
        .label("Redis restart")
        .legend(move |(x, y)| Rectangle::new([(x + 5, y - 5), (x + 15, y + 5)], redis.filled()));
    legend(&mut chart)?;

    // p50 and p99 of both kinds of step, where the window completed any.
    type Pick = fn(&Row) -> Option<f64>;
    let lines: [(&str, Pick); 4] = [
        ("steps p50", |r| (r.steps[0] > 0.0).then_some(r.steps[1])),
        ("steps p99", |r| (r.steps[0] > 0.0).then_some(r.steps[2])),
        ("permit step p50", |r| (r.permit_steps[0] > 0.0).then_some(r.permit_steps[1])),
        ("permit step p99", |r| (r.permit_steps[0] > 0.0).then_some(r.permit_steps[2])),
    ];
    let values = || lines.iter().flat_map(|(_, pick)| rows.iter().filter_map(pick)).filter(|v| *v > 0.0);
    let lo = values().fold(f64::MAX, f64::min);
    let hi = values().fold(0.0f64, f64::max);
    // Room above the data for the legend on the log axis.
    let (lo, hi) = if lo <= hi { (lo / 1.6, hi * 40.0) } else { (1.0, 10.0) };
    let mut chart = ChartBuilder::on(&panels[1])
        .caption("Step latency, ready to completed (ms)", (FONT, 22))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, (lo..hi).log_scale())
        .map_err(de)?;
    chart
        .configure_mesh()
        .x_desc("s into the run")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("ms")
        .y_label_formatter(&tick)
        .label_style((FONT, 14))
        .draw()
        .map_err(de)?;
    for (i, (label, pick)) in lines.into_iter().enumerate() {
        // Solid for p50, thinner and lighter for p99; one colour per kind of step.
        let c = if i % 2 == 0 { color(i / 2) } else { color(i / 2).mix(0.6) };
        let width = if i % 2 == 0 { 2 } else { 1 };
        let pts: Vec<(f64, f64)> = rows.iter().filter_map(|r| pick(r).map(|v| (r.start_s, v.max(lo)))).collect();
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(width)))
            .map_err(de)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width)));
    }
    legend(&mut chart)?;

    let most = scaling.iter().map(|(p, _)| *p).fold(1.0f64, f64::max);
    let (lo, hi) = range(scaling.iter().map(|(_, w)| *w));
    let mut chart = ChartBuilder::on(&panels[2])
        .caption("Throughput by worker processes (2 cores)", (FONT, 22))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5..most + 0.5, lo..hi)
        .map_err(de)?;
    chart
        .configure_mesh()
        .x_desc("worker processes")
        .y_desc("workflows/s")
        .x_labels(most as usize)
        .x_label_formatter(&|x| format!("{}", x.round()))
        .y_label_formatter(&tick)
        .label_style((FONT, 14))
        .draw()
        .map_err(de)?;
    let c = color(0);
    chart.draw_series(scaling.iter().map(|(p, w)| Circle::new((*p, *w), 6, c.filled()))).map_err(de)?;
    let label = |(p, w): &(f64, f64)| Text::new(format!("{w:.0}/s"), (*p + 0.08, *w), (FONT, 16));
    chart.draw_series(scaling.iter().map(label)).map_err(de)?;
    root.present().map_err(de)
}

/// `e2e-bench plot-soak`: read the CSV (and the scaling lines), load the font, draw.
/// Returns the windows and scaling runs drawn.
pub fn run(args: &PlotSoakArgs) -> Result<(usize, usize), String> {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("read {}: {e}", p.display()));
    let rows = parse_csv(&read(&args.input)?)?;
    if rows.is_empty() {
        return Err(format!("{} holds no windows", args.input.display()));
    }
    let scaling = match &args.scaling {
        Some(p) => parse_scaling(&read(p)?),
        None => Vec::new(),
    };
    load_font(args.font.as_deref())?;
    draw(&rows, &scaling, &args.out)?;
    Ok((rows.len(), scaling.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str = "window_start_s,workflows,workflows_per_s,steps,step_p50_ms,step_p99_ms,permit_steps,permit_step_p50_ms,permit_step_p99_ms,kills,stops,redis_restarts\n\
                       0,120,12.0,400,55,900,30,70,2000,1,0,0\n10,300,30.0,1000,60,1500,75,80,4000,0,1,1\n20,0,0.0,0,0,0,0,0,0,0,0,0\n";

    #[test]
    fn the_csv_and_the_scaling_lines_parse() {
        let rows = parse_csv(CSV).unwrap();
        assert_eq!(rows.len(), 3);
        let row = Row {
            start_s: 10.0,
            wf_s: 30.0,
            steps: [1000.0, 60.0, 1500.0],
            permit_steps: [75.0, 80.0, 4000.0],
            chaos: [0.0, 1.0, 1.0],
        };
        assert_eq!(rows[1], row);
        assert!(parse_csv("h\n1,2,x,4,5,6\n").unwrap_err().contains("column 3"));
        let text = "soak: processes=1 workflows=10\nsoak detail: store=postgres wf_s=40.5 seed=1\n\
                    noise\nsoak: processes=2 workflows=10\nsoak detail: wf_s=61.0\nsoak detail: wf_s=99\n";
        assert_eq!(parse_scaling(text), [(1.0, 40.5), (2.0, 61.0)]);
    }

    /// Writes a real PNG (needs a TTF font on the machine, as `plot`'s test).
    #[test]
    fn plot_soak_writes_a_png() {
        let Some(font) = crate::plot::FONT_CANDIDATES.iter().map(PathBuf::from).find(|p| p.is_file()) else {
            eprintln!("skipped: no TTF font");
            return;
        };
        let dir = std::env::temp_dir().join(format!("e2e-bench-soakplot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (input, scaling) = (dir.join("soak.csv"), dir.join("scaling.txt"));
        std::fs::write(&input, CSV).unwrap();
        std::fs::write(&scaling, "soak: processes=1\nsoak detail: wf_s=40\nsoak: processes=4\nsoak detail: wf_s=70\n")
            .unwrap();
        let out = dir.join("soak.png");
        let args = PlotSoakArgs { input, scaling: Some(scaling), out: out.clone(), font: Some(font) };
        assert_eq!(run(&args), Ok((3, 2)));
        let png = std::fs::read(&out).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
