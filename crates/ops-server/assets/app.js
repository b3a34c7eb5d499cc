"use strict";
// The console: a hash-routed page over the JSON API. Every text is set with textContent
// (never parsed as HTML); every POST carries the session's CSRF token.

const STATUSES = ["running", "waiting", "failing", "completed", "failed", "canceled"];
const TERMINAL = ["completed", "failed", "canceled"];
const POLL_MS = 2000;

let session = null;
let pollTimer = null;
let renderSeq = 0;

// ---- helpers ---------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick" || k === "onsubmit" || k === "onchange") el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return el;
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    el.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return el;
}

function when(ms) {
  if (ms === null || ms === undefined) return "—";
  return new Date(ms).toISOString().replace("T", " ").replace("Z", "");
}

function span(ms) {
  if (ms < 1000) return ms + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
  if (ms < 3600000) return (ms / 60000).toFixed(1) + " min";
  return (ms / 3600000).toFixed(1) + " h";
}

function badge(status) {
  return h("span", { class: "badge st-" + status, "data-status": status }, status);
}

function flash(msg, kind) {
  const f = document.getElementById("flash");
  f.className = kind || "info";
  f.textContent = msg;
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || ("HTTP " + status));
    this.status = status;
    this.kind = body && body.error;
  }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    if (session && session.csrf_token) headers["X-CSRF-Token"] = session.csrf_token;
  }
  const res = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: method === "GET" ? undefined : JSON.stringify(body || {}),
  });
  const data = await res.json().catch(() => null);
  if (res.status === 401) {
    window.location.assign("/login");
    throw new ApiError(401, data);
  }
  if (!res.ok) throw new ApiError(res.status, data);
  return data;
}

// An action button: POST, show the summary or the refusal, then redraw.
function actionButton(label, id, path, bodyFn, confirmText) {
  return h("button", {
    type: "button",
    id,
    class: "action",
    disabled: session && session.role !== "operator",
    title: session && session.role !== "operator" ? "needs the operator role" : null,
    onclick: async (ev) => {
      ev.target.disabled = true;
      try {
        const body = bodyFn ? bodyFn() : {};
        if (body === null) return;
        if (confirmText && !window.confirm(confirmText)) return;
        const done = await api("POST", path, body);
        flash(done.summary, "ok");
      } catch (e) {
        flash(label + ": " + e.message + (e.status ? " (" + e.status + ")" : ""), "error");
      } finally {
        ev.target.disabled = false;
        route();
      }
    },
  }, label);
}

function enc(s) {
  return encodeURIComponent(s);
}

function hashParams() {
  const q = window.location.hash.split("?")[1] || "";
  return new URLSearchParams(q);
}

// ---- pages -----------------------------------------------------------------------------

async function pageList(main) {
  const p = hashParams();
  const form = h("form", { id: "filters", class: "filters" },
    h("label", {}, "Type ", h("input", { name: "type", value: p.get("type") || "", size: 14 })),
    h("label", {}, "Status ", h("select", { name: "status" },
      h("option", { value: "" }, "any"),
      STATUSES.map((s) => h("option", { value: s, selected: p.get("status") === s }, s)))),
    h("label", {}, "Business key prefix ", h("input", { name: "biz_key_prefix", value: p.get("biz_key_prefix") || "", size: 16 })),
    h("label", {}, "Waiting on signal ", h("input", { name: "waiting_on", value: p.get("waiting_on") || "", size: 14 })),
    h("button", { type: "submit", id: "apply-filters" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form).entries()) if (v) q.set(k, v);
    window.location.hash = "#/list?" + q.toString();
  });
  const q = new URLSearchParams();
  for (const k of ["type", "status", "biz_key_prefix", "waiting_on", "cursor", "limit"]) if (p.get(k)) q.set(k, p.get(k));
  const page = await api("GET", "/api/instances?" + q.toString());
  const rows = page.items.map((s) => h("tr", { class: "wf-row", "data-biz-key": s.biz_key },
    h("td", {}, h("a", { href: "#/instance/" + enc(s.workflow_id), class: "wf-link" }, s.workflow_id)),
    h("td", {}, s.workflow_type),
    h("td", {}, s.biz_key),
    h("td", {}, badge(s.status)),
    h("td", {}, s.step_name ? s.step_name + " #" + s.attempt : "—"),
    h("td", {}, s.last_kind || ""),
    h("td", {}, when(s.updated_at))));
  const nav = h("p", { class: "pager" },
    p.get("cursor") ? h("a", { href: "#/list?" + withParam(p, "cursor", null) }, "« first page") : null,
    " ",
    page.next ? h("a", { id: "next-page", href: "#/list?" + withParam(p, "cursor", page.next) }, "next page »") : null);
  put(main,
    h("h1", {}, "Workflows"),
    form,
    h("table", { id: "instances" },
      h("thead", {}, h("tr", {}, ["Id", "Type", "Business key", "Status", "Step", "Last transition", "Updated"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 7 }, "No workflows match.")))),
    nav);
}

// Replace an element's children, leaving out the absent ones.
function put(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

function withParam(p, k, v) {
  const q = new URLSearchParams(p);
  if (v === null) q.delete(k);
  else q.set(k, v);
  return q.toString();
}

// The Gantt chart: one row per attempt, segments queue → permit → execution → external.
function gantt(view) {
  const bars = view.timeline || [];
  if (!bars.length) return h("p", { class: "muted" }, "No attempts recorded yet.");
  const start = Math.min(...bars.map((b) => b.ready_at));
  const end = Math.max(...bars.map((b) => b.ready_at + b.queue_ms + b.permit_ms + b.execution_ms + b.external_ms), start + 1);
  const total = end - start;
  const labelW = 190, chartW = 620, rowH = 22, top = 22;
  const x = (ms) => labelW + (ms / total) * chartW;
  const kinds = [["queue_ms", "queue", "queue wait"], ["permit_ms", "permit", "permit wait"],
    ["execution_ms", "exec", "execution"], ["external_ms", "external", "external wait"]];
  const g = svg("svg", { id: "gantt", width: labelW + chartW + 10, height: top + bars.length * rowH + 8,
    role: "img", "aria-label": "attempt timeline" });
  g.appendChild(svg("text", { x: labelW, y: 14, class: "axis" }, "0"));
  g.appendChild(svg("text", { x: labelW + chartW, y: 14, class: "axis", "text-anchor": "end" }, span(total)));
  bars.forEach((b, i) => {
    const y = top + i * rowH;
    g.appendChild(svg("text", { x: 4, y: y + 15, class: "bar-label" }, b.step + " #" + b.attempt + (b.run ? " (run " + b.run + ")" : "") + " " + b.outcome));
    let t = b.ready_at - start;
    for (const [field, cls, name] of kinds) {
      const ms = b[field];
      if (ms > 0) {
        const w = Math.max(x(t + ms) - x(t), 1.5);
        g.appendChild(svg("rect", { x: x(t), y: y + 3, width: w, height: rowH - 6, class: "seg " + cls },
          svg("title", {}, b.step + " #" + b.attempt + " " + name + ": " + span(ms))));
      }
      t += ms;
    }
  });
  const legend = h("p", { class: "legend" }, kinds.map(([, cls, name]) => h("span", {}, h("i", { class: "sw " + cls }), " " + name + " ")));
  return h("div", { class: "gantt" }, g, legend);
}

async function pageInstance(main, id) {
  // Links carry workflow ids; `id:` says so, so a business key equal to an id never
  // redirects the page (or its actions) to another workflow.
  const view = await api("GET", "/api/instances/" + enc("id:" + id));
  let tasks = [];
  if (view.status === "waiting") {
    // The inbox pages by the desk's cursor: a page thinned by closed tasks may have a next.
    let after = "";
    for (let pages = 0; pages < 10; pages++) {
      const page = await api("GET", "/api/tasks?limit=200" + (after ? "&after=" + enc(after) : ""));
      tasks = tasks.concat(page.items.filter((t) => t.workflow_id === view.workflow_id));
      if (!page.next) break;
      after = page.next;
    }
  }
  const wid = enc("id:" + view.workflow_id);
  // Only the actions the state allows are offered; the server's guards decide anyway.
  const actions = h("div", { class: "actions" },
    TERMINAL.includes(view.status) ? null
      : actionButton("Cancel", "act-cancel", "/api/instances/" + wid + "/cancel", null, "Cancel " + view.workflow_id + "?"),
    view.status !== "failed" ? null
      : actionButton("Replay", "act-replay", "/api/instances/" + wid + "/replay", null, "Replay " + view.workflow_id + "?"),
    view.status !== "waiting" ? null : actionButton("Signal…", "act-signal", "/api/instances/" + wid + "/signal", () => {
      const t = window.prompt("Signal type", view.wait && view.wait.signal_type || "");
      if (!t) return null;
      const key = window.prompt("Wait key (empty: the current wait's)", "");
      return { signal_type: t, wait_key: key || null };
    }));
  const taskBox = tasks.length ? h("section", { id: "human-tasks", class: "tasks" },
    h("h2", {}, "Waiting on a person"),
    tasks.map((t) => taskCard(t))) : null;
  const steps = view.steps.map((s) => h("tr", { class: "step-row" },
    h("td", {}, s.name),
    h("td", {}, badge(s.status)),
    h("td", {}, String(s.attempt)),
    h("td", {}, String(s.epoch)),
    h("td", {}, when(s.started_at)),
    h("td", {}, when(s.finished_at)),
    h("td", { class: "error" }, s.error ? s.error.class + ": " + s.error.message : ""),
    h("td", {}, s.model_calls.length ? h("ul", {}, s.model_calls.map((c) =>
      h("li", {}, c.label + " — " + c.model + ", " + c.prompt + ", " + c.samples + " sample(s)"))) : "—"),
    h("td", {}, s.status === "completed" && !TERMINAL.includes(view.status)
      ? actionButton("Regenerate", "act-regenerate-" + s.name, "/api/instances/" + wid + "/regenerate", () => ({ step: s.name }),
        "Regenerate step " + s.name + " and its dependents?")
      : null)));
  const facts = h("dl", { class: "facts" },
    h("dt", {}, "Type"), h("dd", {}, view.workflow_type),
    h("dt", {}, "Business key"), h("dd", {}, view.biz_key),
    h("dt", {}, "Run / revision"), h("dd", {}, view.run + " / " + view.revision),
    h("dt", {}, "Created"), h("dd", {}, when(view.created_at)),
    h("dt", {}, "Updated"), h("dd", {}, when(view.updated_at)),
    h("dt", {}, "Finished"), h("dd", {}, when(view.finished_at)),
    h("dt", {}, "Wait"), h("dd", { id: "wait" }, view.wait ? (view.wait.kind === "signal"
      ? "signal " + view.wait.signal_type + " / " + view.wait.wait_key + (view.wait.poll_time ? ", poll at " + when(view.wait.poll_time) : "")
      : "timer until " + when(view.wait.poll_time)) : "—"),
    h("dt", {}, "Lease"), h("dd", {}, view.lease ? (view.lease.owner || "?") + " …" + view.lease.claim + " until " + when(view.lease.expires_at) : "—"),
    view.pending_request ? [h("dt", {}, "Pending request"), h("dd", { id: "pending-request" },
      view.pending_request.action + (view.pending_request.step ? " of step " + view.pending_request.step : "") +
      " (" + view.pending_request.id + ") for claim …" + view.pending_request.holder + ", requested " + when(view.pending_request.requested_at))] : null,
    view.fingerprint_mismatch ? [h("dt", {}, "Parked"), h("dd", { class: "error" }, JSON.stringify(view.fingerprint_mismatch))] : null,
    view.compensation ? [h("dt", {}, "Compensation"), h("dd", {}, JSON.stringify(view.compensation))] : null);
  put(main,
    h("h1", {}, "Workflow ", h("code", {}, view.workflow_id), " ", h("span", { id: "wf-status", "data-status": view.status }, badge(view.status))),
    actions,
    taskBox,
    facts,
    h("h2", {}, "Timeline"),
    gantt(view),
    h("h2", {}, "Steps"),
    h("table", { id: "steps" },
      h("thead", {}, h("tr", {}, ["Step", "Status", "Attempt", "Epoch", "Started", "Finished", "Error", "Model calls", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, steps)));
  if (!TERMINAL.includes(view.status)) schedule(POLL_MS);
}

function taskCard(t) {
  const reason = h("input", { class: "reason", placeholder: "reason (optional)", size: 30 });
  const tid = enc(t.id);
  return h("div", { class: "task", "data-task-id": t.id },
    h("p", {}, h("strong", {}, t.title)),
    h("p", { class: "muted" }, "workflow ", h("a", { href: "#/instance/" + enc(t.workflow_id) }, t.workflow_id),
      ", step " + t.step + ", level " + t.level + ", due " + when(t.due_at)),
    t.evidence && t.evidence.length ? h("ul", {}, t.evidence.map((e) => h("li", {}, e.label + ": " + e.reference))) : null,
    reason,
    actionButton("Approve", "approve-" + t.id, "/api/tasks/" + tid + "/decide", () => ({ outcome: "approve", reason: reason.value || null })),
    actionButton("Reject", "reject-" + t.id, "/api/tasks/" + tid + "/decide", () => ({ outcome: "reject", reason: reason.value || null })));
}

async function pageTasks(main) {
  const p = hashParams();
  const q = p.get("after") ? "?after=" + enc(p.get("after")) : "";
  const page = await api("GET", "/api/tasks" + q);
  put(main,
    h("h1", {}, "Tasks for ", session.name),
    page.items.length ? h("div", { id: "task-list" }, page.items.map(taskCard)) : h("p", {}, "Nothing to decide."),
    page.next ? h("p", {}, h("a", { href: "#/tasks?after=" + enc(page.next) }, "next page »")) : null);
}

async function pageDeadLetters(main) {
  const p = hashParams();
  const q = new URLSearchParams();
  q.set("status", p.get("status") || "open");
  if (p.get("after")) q.set("after", p.get("after"));
  const page = await api("GET", "/api/dead-letters?" + q.toString());
  const rows = page.items.map((d) => {
    const did = enc(d.id);
    return h("tr", { class: "dl-row" },
      h("td", {}, d.id),
      h("td", {}, h("a", { href: "#/instance/" + enc(d.workflow_id) }, d.workflow_id)),
      h("td", {}, d.step),
      h("td", { class: "error" }, d.error.class + ": " + d.error.message),
      h("td", {}, badge(d.status)),
      h("td", {}, when(d.created_at)),
      h("td", {}, d.status === "open" ? [
        actionButton("Retry", "dl-retry-" + d.id, "/api/dead-letters/" + did + "/decide", () => ({ action: "retry" })),
        actionButton("Complete…", "dl-complete-" + d.id, "/api/dead-letters/" + did + "/decide", () => {
          const out = window.prompt("The step's output (JSON)", "{}");
          return out === null ? null : { action: "complete", output: JSON.parse(out) };
        }),
        actionButton("Fail", "dl-fail-" + d.id, "/api/dead-letters/" + did + "/decide", () => ({ action: "fail" }), "Fail the step?"),
      ] : (d.decision ? d.decision.action.kind + " by " + d.decision.actor : "")));
  });
  put(main,
    h("h1", {}, "Dead letters"),
    h("p", {}, ["open", "decided", "closed"].map((s) => [h("a", { href: "#/dead-letters?status=" + s }, s), " "])),
    h("table", { id: "dead-letters" },
      h("thead", {}, h("tr", {}, ["Id", "Workflow", "Step", "Error", "Status", "Recorded", "Decide"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 7 }, "None.")))),
    page.next ? h("p", {}, h("a", { href: "#/dead-letters?" + withParam(p, "after", page.next) }, "next page »")) : null);
}

async function pageLanes(main) {
  const lanes = await api("GET", "/api/lanes");
  const permits = await api("GET", "/api/permits");
  put(main,
    h("h1", {}, "Lanes"),
    h("table", { id: "lanes" },
      h("thead", {}, h("tr", {}, ["Lane", "Depth", "Due", "Delayed", "Popped", "Oldest due wait"].map((t) => h("th", {}, t)))),
      h("tbody", {}, lanes.map((l) => h("tr", {}, h("td", {}, l.lane), h("td", {}, String(l.depth)), h("td", {}, String(l.ready)),
        h("td", {}, String(l.delayed)), h("td", {}, l.pops === undefined ? "—" : String(l.pops)), h("td", {}, span(l.oldest_due_ms)))))),
    actionButton("Rebuild lanes from the store", "act-rebuild", "/api/lanes/rebuild", null, "Offer every claimable workflow again?"),
    permitsTable(permits),
    h("p", { class: "muted" }, "Refreshed every " + POLL_MS / 1000 + " s; last at " + new Date().toLocaleTimeString()));
  schedule(POLL_MS);
}

function limitsButton(resource, label, id) {
  return actionButton(label, id, "/api/permits/" + enc(resource) + "/limits", () => {
    const c = window.prompt("Holders at once for " + resource + " (0 = unlimited)", "0");
    if (c === null) return null;
    const r = window.prompt("Starts per second for " + resource + " (0 = unlimited)", "0");
    if (r === null) return null;
    return { max_concurrency: Number(c), max_starts_per_second: Number(r) };
  });
}

function permitsTable(permits) {
  const rows = permits.map((r) => h("tr", { class: "permit-row" },
    h("td", {}, r.resource),
    h("td", {}, r.max_concurrency ? String(r.max_concurrency) : "unlimited"),
    h("td", {}, r.max_starts_per_second ? String(r.max_starts_per_second) : "unlimited"),
    h("td", {}, r.overridden ? "operator" : "default"),
    h("td", {}, String(r.holders.length) + (r.truncated ? "+" : "")),
    h("td", {}, r.holders.length ? h("ul", {}, r.holders.map((x) =>
      h("li", {}, h("a", { href: "#/instance/" + enc(x.workflow_id) }, x.workflow_id), " " + x.step + " …" + x.claim))) : "—"),
    h("td", {}, String(r.starts_this_second)),
    h("td", {}, limitsButton(r.resource, "Set limits…", "permit-limits-" + r.resource))));
  const other = h("input", { id: "permit-resource", placeholder: "resource", size: 16 });
  return [h("h1", {}, "Permits"),
    h("table", { id: "permits" },
      h("thead", {}, h("tr", {}, ["Resource", "Max at once", "Max starts/s", "Limits", "Holders", "Held by", "Starts this second", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 8 }, "No resource has a limit or a holder.")))),
    h("p", {}, other, " ", h("button", { type: "button", class: "action", disabled: session.role !== "operator", onclick: () => {
      if (other.value) limitsButton(other.value, "set", "permit-limits-new").click();
    } }, "Set limits of another resource…"))];
}

async function pageAudit(main) {
  const p = hashParams();
  const q = new URLSearchParams();
  for (const k of ["actor", "action", "limit"]) if (p.get(k)) q.set(k, p.get(k));
  const page = await api("GET", "/api/audit?" + q.toString());
  const items = page.items;
  const form = h("form", { class: "filters" },
    h("label", {}, "Actor ", h("input", { name: "actor", value: p.get("actor") || "", size: 14 })),
    h("label", {}, "Action ", h("input", { name: "action", value: p.get("action") || "", size: 14 })),
    h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = new URLSearchParams();
    for (const [k, v] of new FormData(form).entries()) if (v) f.set(k, v);
    window.location.hash = "#/audit?" + f.toString();
  });
  put(main,
    h("h1", {}, "Audit log"),
    form,
    h("table", { id: "audit" },
      h("thead", {}, h("tr", {}, ["When", "Actor", "Role", "Action", "Target", "Result", "Detail"].map((t) => h("th", {}, t)))),
      h("tbody", {}, items.length ? items.map((a) => h("tr", { class: "audit-row" },
        h("td", {}, when(a.at)),
        h("td", {}, a.actor || ""),
        h("td", {}, a.role || ""),
        h("td", {}, a.action || ""),
        h("td", {}, a.target || ""),
        h("td", { class: a.result === "ok" ? "" : "error" }, a.result + (a.reason ? ": " + a.reason : "")),
        h("td", {}, a.detail ? JSON.stringify(a.detail) : ""))) : h("tr", {}, h("td", { colspan: 7 }, "Nothing recorded.")))));
}

// ---- router ----------------------------------------------------------------------------

function schedule(ms) {
  clearTimeout(pollTimer);
  const seq = renderSeq;
  pollTimer = setTimeout(() => {
    if (seq === renderSeq) route(true);
  }, ms);
}

async function route(quiet) {
  clearTimeout(pollTimer);
  const seq = ++renderSeq;
  const main = document.getElementById("main");
  const hash = (window.location.hash || "#/list").split("?")[0];
  const parts = hash.slice(2).split("/");
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("here", a.getAttribute("href") === "#/" + parts[0]));
  const target = document.createElement("div");
  try {
    switch (parts[0]) {
      case "instance": await pageInstance(target, decodeURIComponent(parts.slice(1).join("/"))); break;
      case "tasks": await pageTasks(target); break;
      case "dead-letters": await pageDeadLetters(target); break;
      case "lanes": await pageLanes(target); break;
      case "audit": await pageAudit(target); break;
      default: await pageList(target);
    }
    if (seq !== renderSeq) return;
    main.replaceChildren(...target.childNodes);
    document.body.dataset.page = parts[0] || "list";
  } catch (e) {
    if (seq !== renderSeq) return;
    if (!quiet) put(main, h("p", { class: "error" }, e.message + (e.status ? " (" + e.status + ")" : "")));
    else schedule(POLL_MS);
  }
}

async function boot() {
  try {
    session = await api("GET", "/api/session");
  } catch (e) {
    return;
  }
  document.getElementById("who").textContent = session.name + " (" + session.role + ")";
  document.getElementById("logout").addEventListener("click", async () => {
    try { await api("POST", "/api/logout"); } catch (e) { /* the cookie is gone anyway */ }
    window.location.assign("/login");
  });
  window.addEventListener("hashchange", () => { flash("", "info"); route(); });
  route();
}

boot();
