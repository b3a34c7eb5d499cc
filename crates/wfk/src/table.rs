//! Plain-text tables and detail views for people (`--json` is for scripts).

use ops::{DeployReport, InstanceView};

/// Columns padded to their widest cell.
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new<const N: usize>(header: [&str; N]) -> Table {
        Table { rows: vec![header.iter().map(|h| h.to_string()).collect()] }
    }

    pub(crate) fn row<const N: usize>(&mut self, cells: [String; N]) {
        self.rows.push(cells.into_iter().map(|c| c.replace(['\n', '\t'], " ")).collect());
    }

    pub(crate) fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols)
            .map(|c| self.rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for r in &self.rows {
            let line: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(i, cell)| format!("{cell:<w$}", w = if i + 1 == r.len() { 0 } else { widths[i] }))
                .collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
        }
        out
    }
}

/// At most `n` characters, with an ellipsis when cut.
pub(crate) fn clip(s: &str, n: usize) -> String {
    let one_line = s.replace(['\n', '\t'], " ");
    if one_line.chars().count() <= n {
        one_line
    } else {
        one_line.chars().take(n.saturating_sub(1)).collect::<String>() + "…"
    }
}

pub(crate) fn show(v: &InstanceView) -> String {
    let mut out = format!(
        "workflow  {}\ntype      {}\nbiz key   {}\nstatus    {}\nrun       {}\nrevision  {}\ncreated   {}\nupdated   {}\n",
        v.workflow_id,
        v.workflow_type,
        v.biz_key,
        v.status.as_str(),
        v.run,
        v.revision,
        v.created_at.as_millis(),
        v.updated_at.as_millis()
    );
    if let Some(w) = &v.wait {
        out.push_str(&format!("wait      {}\n", serde_json::to_string(w).unwrap_or_default()));
    }
    if let Some(l) = &v.lease {
        out.push_str(&format!(
            "lease     claim …{} held by {} until {}\n",
            l.claim,
            l.owner.as_deref().unwrap_or("?"),
            l.expires_at.as_millis()
        ));
    }
    if let Some(r) = &v.pending_request {
        out.push_str(&format!(
            "request   {} {}{} pending for claim …{} (requested at {})\n",
            r.id,
            r.action,
            r.step.as_deref().map(|s| format!(" of step {s}")).unwrap_or_default(),
            r.holder,
            r.requested_at.as_millis()
        ));
    }
    if let Some(m) = &v.fingerprint_mismatch {
        out.push_str(&format!("parked    definition changed: stored {} worker {}\n", m.persisted, m.worker));
    }
    if let Some(c) = &v.compensation {
        out.push_str(&format!("compensation {}\n", serde_json::to_string(c).unwrap_or_default()));
    }
    let mut t = Table::new(["STEP", "STATUS", "ATTEMPT", "EPOCH", "MODEL CALLS", "ERROR"]);
    for s in &v.steps {
        t.row([
            s.name.clone(),
            format!("{:?}", s.status).to_lowercase(),
            s.attempt.to_string(),
            s.epoch.to_string(),
            s.model_calls
                .iter()
                .map(|c| format!("{}:{}×{}", c.label, c.model, c.samples))
                .collect::<Vec<_>>()
                .join(" "),
            s.error.as_ref().map(|e| clip(&format!("{:?}: {}", e.class, e.message), 60)).unwrap_or_default(),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render());
    if !v.timeline.is_empty() {
        let mut t = Table::new([
            "TIMELINE STEP",
            "RUN",
            "ATTEMPT",
            "OUTCOME",
            "QUEUE ms",
            "PERMIT ms",
            "EXTERNAL ms",
            "RUN ms",
        ]);
        for b in &v.timeline {
            t.row([
                b.step.clone(),
                b.run.to_string(),
                b.attempt.to_string(),
                b.outcome.as_str().to_string(),
                b.queue_ms.to_string(),
                b.permit_ms.to_string(),
                b.external_ms.to_string(),
                b.execution_ms.to_string(),
            ]);
        }
        out.push('\n');
        out.push_str(&t.render());
    }
    out
}

pub(crate) fn permits(p: &[ops::PermitView]) -> String {
    let mut t = Table::new(["RESOURCE", "MAX CONCURRENCY", "MAX STARTS/s", "IN USE", "STARTS THIS s", "HOLDERS"]);
    for r in p {
        t.row([
            r.resource.clone(),
            r.max_concurrency.to_string(),
            r.max_starts_per_second.to_string(),
            r.holders.len().to_string(),
            r.starts_this_second.to_string(),
            clip(&r.holders.iter().map(|h| format!("{}/{}", h.workflow_id, h.step)).collect::<Vec<_>>().join(" "), 80),
        ]);
    }
    t.render()
}

pub(crate) fn audit(entries: &[ops::AuditEntry]) -> String {
    let mut t = Table::new(["AT", "ACTOR", "ROLE", "ACTION", "TARGET", "RESULT"]);
    for e in entries {
        t.row([
            e.at.as_millis().to_string(),
            e.actor.clone(),
            e.role.clone(),
            e.action.clone(),
            clip(&e.target, 40),
            clip(
                &format!("{}{}", e.result.as_str(), e.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default()),
                60,
            ),
        ]);
    }
    t.render()
}

pub(crate) fn task(k: &kernel_core::ports::TaskRecord) -> String {
    let mut out = format!(
        "task      {}\nworkflow  {}\nstep      {} (level {})\ntitle     {}\nassignee  {}\nroles     {}\ndue       {}\nstatus    {:?}\n",
        k.id,
        k.workflow_id,
        k.step,
        k.level,
        k.title,
        k.assignee.as_deref().unwrap_or("-"),
        k.roles.join(","),
        k.due_at.as_millis(),
        k.status
    );
    for e in &k.evidence {
        out.push_str(&format!("evidence  {}\n", serde_json::to_string(e).unwrap_or_default()));
    }
    out
}

pub(crate) fn deploy(r: &DeployReport) -> String {
    let mut t = Table::new(["TYPE", "FINGERPRINT", "IN FLIGHT", "WOULD PARK", "WHY"]);
    for row in &r.types {
        t.row([
            row.workflow_type.clone(),
            clip(&row.fingerprint, 16),
            row.in_flight.to_string(),
            row.would_park.to_string(),
            row.reason.clone(),
        ]);
    }
    format!("{}{} in flight, {} would park\n", t.render(), r.in_flight, r.would_park)
}
