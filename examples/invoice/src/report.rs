//! The evaluation's Markdown report and PNG chart.
//!
//! The chart is drawn with `plotters` on its bitmap backend; text goes through `ab_glyph`
//! from a TTF read at run time (`--font`, else the first of [`FONT_CANDIDATES`] present).
//! Without a font the chart is drawn without text, and the report says so.

use crate::eval::{Evaluation, Figures};
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Where a sans-serif TTF font usually is (Debian/Ubuntu, Fedora, Arch, macOS).
pub const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/Library/Fonts/Arial.ttf",
];

const FONT: &str = "sans-serif";

/// One chart panel: its area, title and the value it plots.
type Panel<'a, 'b> =
    (&'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>, &'static str, Box<dyn Fn(&Figures) -> f64>);

/// Register the TTF at `given` (or the first candidate present); false when there is none
/// (or it is not a usable font).
pub fn load_font(given: Option<&Path>) -> bool {
    let path = given.map(Path::to_path_buf).or_else(|| FONT_CANDIDATES.iter().map(PathBuf::from).find(|p| p.is_file()));
    let Some(bytes) = path.and_then(|p| std::fs::read(p).ok()) else { return false };
    // plotters keeps registered fonts for the whole process.
    plotters::style::register_font(FONT, FontStyle::Normal, Box::leak(bytes.into_boxed_slice())).is_ok()
}

fn row(name: &str, f: &Figures, baseline: bool) -> String {
    let stops = if f.stops.is_empty() {
        "–".to_string()
    } else {
        f.stops.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(" ")
    };
    let per = f.invoices.max(1) as f64 * 1000.0;
    let timing = if baseline {
        "–".to_string()
    } else {
        format!("{:.1} / {:.0}", f.exec_ms as f64 / per, f.wait_ms as f64 / per)
    };
    let backlog = if baseline { "–".to_string() } else { f.backlog_peak.to_string() };
    format!(
        "| {name} | {} | {} | {} | {} | {} | {} | {}/{}/{} | {} | {backlog} | {} | {} | {timing} | {} | {:.1} | {} | {stops} |",
        f.invoices,
        f.injected,
        f.success,
        f.refused + f.rejected + f.approval_timed_out,
        f.retries,
        f.duplicate_side_effects,
        f.compensated,
        f.compensation_escalated,
        f.compensation_failed,
        f.unknown_states,
        f.restarts,
        f.migrated,
        f.cost_per_success(),
        f.sla_met_pct(),
        f.escalated,
    )
}

const HEADER: &str = "| class | invoices | faults injected | success | refused / rejected / timed out | retries | duplicate side effects | compensated / escalated / failed | unknown states | backlog peak | restarts | old outputs migrated | mean exec / wait per invoice (s) | cost per success (µ) | human SLA met % | approvals escalated | stopped at |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

/// The Markdown report of `e`, made by `command`.
pub fn markdown(e: &Evaluation, command: &str, font: bool) -> String {
    let mut s = String::new();
    let t = e.total();
    let _ = writeln!(s, "# Invoice pipeline under injected faults\n");
    let _ = writeln!(s, "Made by:\n\n```bash\n{command}\n```\n");
    let _ = writeln!(
        s,
        "{} invoices (seed {}), split evenly over the seven fault classes and all of them together, on the **{}** store, with the manual clock: the same seed replays exactly. Kernel runs took {:.1} s of wall time.\n",
        e.invoices, e.seed, e.store, e.kernel_seconds
    );
    let _ = writeln!(s, "```text\n{}\n```\n", e.line());
    let _ = writeln!(s, "## The kernel\n\n{HEADER}");
    for (c, r) in &e.classes {
        let _ = writeln!(s, "{}", row(c.name(), &r.kernel, false));
    }
    let _ = writeln!(s, "{}", row("**overall**", &t.kernel, false));
    let _ = writeln!(
        s,
        "\n## The all-agent baseline, same invoices and fault schedule\n\nOne loop per upload keeps its progress in its own context, calls the same fake model, ledger and mailer with a fresh key it invents per attempt, loses its context on a restart and re-plans from the start. Its figures are reported, not asserted. It runs the invoices of a batch one after another on fresh fakes, as the kernel's batch had, so the permit ceiling of `full_queue` does not bind it (no backlog, no exec/wait split); and where two invoices of a batch share an invoice number, the one refused as the duplicate can differ from the kernel's, which runs the batch concurrently.\n\n{HEADER}"
    );
    for (c, r) in &e.classes {
        let _ = writeln!(s, "{}", row(c.name(), &r.baseline, true));
    }
    let _ = writeln!(s, "{}", row("**overall**", &t.baseline, true));
    let _ = writeln!(
        s,
        r#"
## What each fault is and how it is injected

| class | injection (counted by) |
|---|---|
| lost_reply | the fake ledger applies the posting and loses its reply (ledger); the kernel's post step ends `unknown outcome` and asks the ledger by its idempotency key before any retry |
| restart | the engine dies right after the side effect of extract, post or notify — a crash switch (`testkit::faults::CrashSwitch::crash_now`) parks every later port call — and a fresh engine recovers on the surviving state after the lease (restart switch) |
| duplicate_callback | the same upload is started twice at once and once more after the end; the approval is rung again, decided again with the same token, and signalled under a new id (driver, approver) |
| old_schema | the fake model answers in `invoice@1` one to three times before answering in `invoice@2`; the kernel re-samples at most twice. In every other batch the first engine runs the previous build (extraction schema `invoice@1`) and dies right after the first extraction; the current build resumes from the recorded `invoice@1` output through the registered migration, without asking the model again (model) |
| compensation_failure | the invoice is in a closed period, so reconcile fails after posting; the reversal fails one, two or four times (compensation attempts: 3, then a human task for the controller) (ledger) |
| full_queue | a permit ceiling on the ledger (1 at a time, 1 start a second) under a burst of 25 invoices (permit denials, counted by a decorator of the permit port) |
| slow_approver | finance decides after 3 h (after the reminder), or never (the CFO decides 2 h into the escalation), or nobody decides (approver) |

Every class also sees the seeded business: about 3 % unknown vendors, 3 % duplicate invoice numbers, 4 % closed periods, 10 % of approvals rejected.

**Columns.** *Duplicate side effects*: a second posting or reversal of an invoice in the fake ledger (which dedupes by key, so only a second *effect* counts) plus a second mail for an invoice from the fake mailer — counted by the fakes, not by the kernel. *Unknown states*: invoices not terminal, or whose ledger and mailer disagree with how the workflow ended, or posted and neither kept nor reversed nor handed to a person. *Compensated*: failed after posting and reversed; *escalated*: the reversal kept failing and a human task was opened. *Exec / wait*: mean simulated time per invoice of step execution vs. the rest of end-to-end time (human waits, backoff, permit waits, lease expiry after a restart). *Cost per success*: fake model cost (µ-units) of all invoices over the successes. *Human SLA met*: approvals decided by finance within its 4 h SLA. *Stopped at*: the step where failed invoices stopped (validate: business refusals; extract: the model kept answering in the old schema past the re-sampling bound; reconcile: a closed period, compensated).
"#
    );
    if !font {
        let _ = writeln!(s, "The chart was drawn without text: no TTF font was found (pass `--font`).\n");
    }
    let _ = writeln!(
        s,
        "![success and duplicate side effects per fault class](invoice-eval.png)\n\nLeft: end-to-end success, % of invoices, kernel (blue) and baseline (red), per class. Right: duplicate side effects per class, same colours."
    );
    s
}

/// Draw the chart of `e` into `out`.
///
/// # Errors
/// The drawing's error, as text.
pub fn png(e: &Evaluation, out: &Path, font: bool) -> Result<(), String> {
    let err = |x: &dyn std::fmt::Display| x.to_string();
    let root = BitMapBackend::new(out, (1400, 660)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| err(&x))?;
    let (left, right) = root.split_horizontally(700);
    let names: Vec<&str> = e.classes.iter().map(|(c, _)| c.name()).collect();
    let n = names.len();
    let panels: [Panel<'_, '_>; 2] = [
        (&left, "end-to-end success, % (kernel blue, baseline red)", Box::new(|f: &Figures| f.success_pct())),
        (
            &right,
            "duplicate side effects (kernel blue, baseline red)",
            Box::new(|f: &Figures| f.duplicate_side_effects as f64),
        ),
    ];
    for (area, title, value) in panels {
        let ymax =
            e.classes.iter().flat_map(|(_, r)| [value(&r.kernel), value(&r.baseline)]).fold(1.0_f64, f64::max) * 1.15;
        let mut b = ChartBuilder::on(area);
        b.margin(20);
        if font {
            b.caption(title, (FONT, 22)).x_label_area_size(170).y_label_area_size(50);
        }
        let mut chart = b.build_cartesian_2d(0.0..n as f64, 0.0..ymax).map_err(|x| err(&x))?;
        if font {
            chart.configure_mesh().disable_x_mesh().x_labels(0).label_style((FONT, 14)).draw().map_err(|x| err(&x))?;
        }
        for (i, (_, r)) in e.classes.iter().enumerate() {
            let x = i as f64;
            if font {
                let (px, py) = chart.backend_coord(&(x + 0.42, 0.0));
                let style = (FONT, 14).into_font().transform(FontTransform::Rotate90).color(&BLACK);
                area.draw(&Text::new(
                    names[i].to_string(),
                    (px - area.get_base_pixel().0, py - area.get_base_pixel().1 + 8),
                    style,
                ))
                .map_err(|x| err(&x))?;
            }
            let (k, bl) = (value(&r.kernel), value(&r.baseline));
            chart
                .draw_series([
                    Rectangle::new([(x + 0.12, 0.0), (x + 0.5, k)], BLUE.filled()),
                    Rectangle::new([(x + 0.5, 0.0), (x + 0.88, bl)], RED.mix(0.8).filled()),
                ])
                .map_err(|x| err(&x))?;
        }
    }
    root.present().map_err(|x| err(&x))?;
    Ok(())
}

/// Write `DIR/invoice-eval.md` and `DIR/invoice-eval.png`; returns their paths.
///
/// # Errors
/// The file system's or the drawing's error, as text.
pub fn write(e: &Evaluation, dir: &Path, command: &str, font: Option<&Path>) -> Result<(PathBuf, PathBuf), String> {
    std::fs::create_dir_all(dir).map_err(|x| format!("create {}: {x}", dir.display()))?;
    let font = load_font(font);
    let (md, png_path) = (dir.join("invoice-eval.md"), dir.join("invoice-eval.png"));
    png(e, &png_path, font)?;
    std::fs::write(&md, markdown(e, command, font)).map_err(|x| format!("write {}: {x}", md.display()))?;
    Ok((md, png_path))
}
