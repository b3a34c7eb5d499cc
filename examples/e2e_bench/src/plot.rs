//! `e2e-bench plot`: a PNG of printed `e2e-bench:` lines — burst workflows/s per run, and
//! single-workflow p50/p99 per run, one series per store and one for the floor.
//!
//! Drawn with `plotters` on its bitmap backend; text goes through `ab_glyph` from a TTF file
//! read at run time (`--font`, else the first of [`FONT_CANDIDATES`] present), so no system
//! font library is needed to build or run.

use crate::args::PlotArgs;
use crate::report::RunLine;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Where a sans-serif TTF font usually is (Debian/Ubuntu, Fedora, Arch, macOS).
pub const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/Library/Fonts/Arial.ttf",
];

/// The family the loaded font is registered under.
pub(crate) const FONT: &str = "sans-serif";
const SIZE: (u32, u32) = (1400, 560);

/// One plotted series: per-run values in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Burst workflows/s per run.
    pub wf_s: Vec<f64>,
    /// Single-workflow p50 (ms) per run.
    pub p50_ms: Vec<f64>,
    /// Single-workflow p99 (ms) per run.
    pub p99_ms: Vec<f64>,
}

/// Group run lines into series: the engine per store, and the floor per store it ran next to.
pub fn series(lines: &[RunLine]) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    let mut push = |label: String, s: &crate::report::Side| {
        let at = match out.iter().position(|x| x.label == label) {
            Some(at) => at,
            None => {
                out.push(Series { label, wf_s: Vec::new(), p50_ms: Vec::new(), p99_ms: Vec::new() });
                out.len() - 1
            }
        };
        out[at].wf_s.push(s.wf_s);
        out[at].p50_ms.push(s.single_p50_ms);
        out[at].p99_ms.push(s.single_p99_ms);
    };
    for l in lines {
        push(format!("engine, store={}", l.store), &l.engine);
        if let Some(f) = &l.floor {
            let label = if l.store == "memory" {
                "raw Lua floor".to_string()
            } else if l.store == "postgres" {
                // Next to store-postgres the floor is the raw PostgreSQL one.
                "raw PostgreSQL floor".to_string()
            } else {
                format!("raw Lua floor (with {})", l.store)
            };
            push(label, f);
        }
    }
    out
}

fn font_path(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    FONT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| format!("no TTF font found at {FONT_CANDIDATES:?}: pass --font <path to a .ttf>"))
}

/// Register the TTF at `path` (or a default one) as the plot's font.
pub fn load_font(path: Option<&Path>) -> Result<(), String> {
    let path = font_path(path)?;
    let bytes = std::fs::read(&path).map_err(|e| format!("read font {}: {e}", path.display()))?;
    // plotters keeps registered fonts for the whole process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FONT, FontStyle::Normal, bytes)
        .map_err(|_| format!("{} is not a usable TTF font", path.display()))
}

fn bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) =
        values.filter(|v| v.is_finite() && *v > 0.0).fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    // A decade of headroom on the log axis keeps the legend (upper corner) off the data.
    (lo <= hi).then(|| (lo / 1.6, hi * 12.0))
}

/// Category colours (matplotlib's "tab10"), readable on white, unlike the default palette's
/// yellow.
pub(crate) const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
];

/// A tick label: no decimals from 10 up, one from 1, two below.
pub(crate) fn tick(v: &f64) -> String {
    match *v {
        v if v >= 10.0 => format!("{v:.0}"),
        v if v >= 1.0 => format!("{v:.1}"),
        v => format!("{v:.2}"),
    }
}

/// A drawing error as the command's error.
pub(crate) fn de<E: std::fmt::Debug>(e: E) -> String {
    format!("plot: {e:?}")
}

/// The legend of `chart`: upper right, on a light box.
pub(crate) fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(de)
}

/// Draw `series` into a PNG at `out` (the font must be loaded).
pub fn draw(series: &[Series], out: &Path) -> Result<(), String> {
    let runs = series.iter().map(|s| s.wf_s.len()).max().filter(|n| *n > 0).ok_or("no e2e-bench lines to plot")?;
    let x_range = 0.5f64..runs as f64 + 0.5;
    let root = BitMapBackend::new(out, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(de)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    let color = |i: usize| COLORS[i % COLORS.len()].to_rgba();
    let points = |v: &[f64]| -> Vec<(f64, f64)> {
        v.iter().enumerate().filter(|(_, y)| y.is_finite() && **y > 0.0).map(|(i, y)| ((i + 1) as f64, *y)).collect()
    };

    let (lo, hi) = bounds(series.iter().flat_map(|s| s.wf_s.iter().copied())).ok_or("no throughput to plot")?;
    let mut chart = ChartBuilder::on(&left)
        .caption("Burst throughput (workflows/s)", (FONT, 22))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range.clone(), (lo..hi).log_scale())
        .map_err(de)?;
    chart
        .configure_mesh()
        .x_desc("run")
        .y_desc("workflows/s")
        .x_labels(runs)
        .x_label_formatter(&|x| format!("{}", x.round()))
        .y_label_formatter(&tick)
        .label_style((FONT, 14))
        .draw()
        .map_err(de)?;
    for (i, s) in series.iter().enumerate() {
        let (c, pts) = (color(i), points(&s.wf_s));
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(de)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled()))).map_err(de)?;
    }
    legend(&mut chart)?;

    let all_ms = series.iter().flat_map(|s| s.p50_ms.iter().chain(&s.p99_ms).copied());
    let (lo, hi) = bounds(all_ms).ok_or("no latency to plot")?;
    let mut chart = ChartBuilder::on(&right)
        .caption("Single workflow, start to end (ms): p50 circles, p99 triangles", (FONT, 22))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range, (lo..hi).log_scale())
        .map_err(de)?;
    chart
        .configure_mesh()
        .x_desc("run")
        .y_desc("ms")
        .x_labels(runs)
        .x_label_formatter(&|x| format!("{}", x.round()))
        .y_label_formatter(&tick)
        .label_style((FONT, 14))
        .draw()
        .map_err(de)?;
    for (i, s) in series.iter().enumerate() {
        let c = color(i);
        let (p50, p99) = (points(&s.p50_ms), points(&s.p99_ms));
        chart
            .draw_series(LineSeries::new(p50.clone(), c.stroke_width(2)))
            .map_err(de)?
            .label(format!("{} p50", s.label))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(p50.into_iter().map(|p| Circle::new(p, 4, c.filled()))).map_err(de)?;
        chart
            .draw_series(LineSeries::new(p99.clone(), c.mix(0.6).stroke_width(1)))
            .map_err(de)?
            .label(format!("{} p99", s.label))
            .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 5, c.mix(0.6).filled()));
        chart.draw_series(p99.into_iter().map(|p| TriangleMarker::new(p, 5, c.mix(0.6).filled()))).map_err(de)?;
    }
    legend(&mut chart)?;
    root.present().map_err(de)
}

/// `e2e-bench plot`: read the lines, load the font, draw.
pub fn run(args: &PlotArgs) -> Result<usize, String> {
    let text = std::fs::read_to_string(&args.input).map_err(|e| format!("read {}: {e}", args.input.display()))?;
    let lines: Vec<RunLine> = text.lines().filter_map(RunLine::parse).collect();
    if lines.is_empty() {
        return Err(format!("{} holds no e2e-bench lines", args.input.display()));
    }
    load_font(args.font.as_deref())?;
    draw(&series(&lines), &args.out)?;
    Ok(lines.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Side;

    fn side(wf_s: f64) -> Side {
        Side {
            wf_s,
            cpu_us_per_wf: 100.0,
            proc_cpu_us_per_wf: 50.0,
            single_p50_ms: 0.3,
            single_p99_ms: 1.1,
            writes_per_wf: 6.0,
            stmts_per_step: None,
            commits_per_step: None,
        }
    }

    fn sample() -> Vec<RunLine> {
        let mem = |wf_s| RunLine {
            store: "memory".into(),
            workflows: 2000,
            steps: 4,
            slots: 8,
            engine: side(wf_s),
            floor: Some(side(wf_s * 2.0)),
        };
        let mongo = RunLine { store: "mongo-wire".into(), workflows: 50, floor: None, ..mem(40.0) };
        vec![mem(7000.0), mongo.clone(), mem(8000.0), mongo, mem(7500.0)]
    }

    #[test]
    fn series_are_the_engine_per_store_and_the_floor() {
        let s = series(&sample());
        let labels: Vec<&str> = s.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["engine, store=memory", "raw Lua floor", "engine, store=mongo-wire"]);
        assert_eq!(s[0].wf_s, [7000.0, 8000.0, 7500.0]);
        assert_eq!(s[1].wf_s, [14000.0, 16000.0, 15000.0]);
        assert_eq!(s[2].wf_s, [40.0, 40.0]);
        // Next to the PostgreSQL store, the floor is the PostgreSQL one.
        let pg = RunLine { store: "postgres".into(), ..sample()[0].clone() };
        let labels: Vec<String> = series(&[pg]).into_iter().map(|s| s.label).collect();
        assert_eq!(labels, ["engine, store=postgres", "raw PostgreSQL floor"]);
    }

    /// Writes a real PNG from printed lines (needs a TTF font on the machine; the plot is
    /// unreadable without one, so its absence is reported, not papered over).
    #[test]
    fn plot_writes_a_png_of_the_printed_lines() {
        let Ok(font) = font_path(None) else {
            eprintln!("skipped: no TTF font at {FONT_CANDIDATES:?}");
            return;
        };
        let dir = std::env::temp_dir().join(format!("e2e-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("runs.txt");
        let text: String = sample().iter().map(|l| l.line() + "\nunrelated line\n").collect();
        std::fs::write(&input, text).unwrap();
        let out = dir.join("e2e.png");
        let args = PlotArgs { input, out: out.clone(), font: Some(font) };
        assert_eq!(run(&args), Ok(5));
        let png = std::fs::read(&out).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let (w, h) =
            (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap()));
        assert_eq!((w, h), SIZE);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nothing_to_plot_is_an_error() {
        let dir = std::env::temp_dir().join(format!("e2e-bench-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("none.txt");
        std::fs::write(&input, "median: store=memory runs=3\n").unwrap();
        let e = run(&PlotArgs { input, out: dir.join("x.png"), font: None }).unwrap_err();
        assert!(e.contains("no e2e-bench lines"), "{e}");
        assert!(!dir.join("x.png").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
