// The pagellm gateway's dashboard: reads the gateway's live stream (GET
// /dashboard/events, one JSON frame every half second, see crates/gateway/src/dashboard.rs)
// and shows each replica's health and load, charts of the traffic each one takes, and
// the routing decisions as they are made. Helpers (charts, SSE reading) are common.js.
"use strict";

const MAX_DECISIONS = 60;

// Everything the page knows; exposed for the end-to-end test and for curious users.
const state = {
  frame: null,
  series: [], // one point per frame: {t, "rps:ID", "inflight:ID"}
  decisions: new Map(), // seq -> decision, the newest MAX_DECISIONS seen
  key: localStorage.getItem("pagellm.gateway.key") || "",
  frames: 0,
};
window.gateway = state;

const authHeaders = () => (state.key ? { Authorization: `Bearer ${state.key}` } : {});

function connect() {
  return followEvents(authHeaders, onFrame, () => {
    setStatus("", "the gateway needs its master key");
    $("policy").textContent = "enter the gateway's master key";
  });
}

function onFrame(f) {
  state.frames++;
  setStatus("live", "live");
  $("policy").textContent = `routing: ${f.policy.replace(/_/g, " ")}`;
  const p = state.frame;
  state.frame = f;
  const point = { t: f.t / 1000 };
  for (const r of f.replicas) {
    point[`inflight:${r.id}`] = r.in_flight;
    const q = p && p.replicas.find((x) => x.id === r.id);
    if (q && f.t > p.t) point[`rps:${r.id}`] = (r.routed - q.routed) / ((f.t - p.t) / 1000);
  }
  state.series.push(point);
  while (state.series.length && state.series[0].t < point.t - WINDOW_S) state.series.shift();
  for (const d of f.decisions) state.decisions.set(d.seq, d);
  const seqs = [...state.decisions.keys()].sort((a, b) => a - b);
  for (const s of seqs.slice(0, Math.max(0, seqs.length - MAX_DECISIONS))) state.decisions.delete(s);
  render();
}

function render() {
  const f = state.frame;
  const rs = f.replicas;
  const up = rs.filter((r) => r.state === "up").length;
  $("t-up").textContent = `${up} / ${rs.length}`;
  $("t-inflight").textContent = rs.reduce((a, r) => a + r.in_flight, 0);
  const last = state.series[state.series.length - 1];
  const rps = rs.map((r) => last[`rps:${r.id}`]).filter((v) => v != null);
  $("t-rps").textContent = rps.length ? fmt(rps.reduce((a, b) => a + b, 0), 1) : "–";
  const total = Object.values(f.reasons).reduce((a, b) => a + b, 0);
  $("t-hit").textContent = total ? `${fmt((100 * (f.reasons.prefix_hit || 0)) / total, 1)}%` : "–";
  const ds = [...state.decisions.values()];
  const failed = ds.filter((d) => d.outcome && d.outcome.startsWith("failed")).length;
  $("t-failover").textContent = `${failed}, ${ds.filter((d) => d.resume).length}`;
  $("t-errors").textContent = ds.filter((d) => d.outcome && /^[45]/.test(d.outcome)).length;
  $("reasons").textContent = Object.entries(f.reasons)
    .map(([k, v]) => `${k.replace(/_/g, " ")} ${v}`)
    .join(" · ");
  drawReplicas();
  drawDecisions();
  const ids = rs.map((r) => r.id);
  drawChart($("c-rps"), state.series, ids.map((id) => `rps:${id}`), (v) => fmt(v, 1));
  drawChart($("c-inflight"), state.series, ids.map((id) => `inflight:${id}`), (v) => fmt(v, 0));
  for (const l of ["l-rps", "l-inflight"]) {
    $(l).innerHTML = ids
      .map((id, i) => `<span><i class="sw" style="background:${LINE_COLORS[i % LINE_COLORS.length]}"></i>${esc(id)}</span>`)
      .join("");
  }
}

// A horizontal gauge: `v` of `max`, labelled.
function bar(label, v, max, text) {
  const pct = max > 0 && v != null ? Math.min(100, (100 * v) / max) : 0;
  return `<div class="gauge"><span>${label}</span><div class="track"><div class="fill" style="width:${pct}%"></div></div><b>${text}</b></div>`;
}

function drawReplicas() {
  const rs = state.frame.replicas;
  const models = new Set(rs.map((r) => r.model));
  $("replica-caption").textContent = `${rs.length} replicas of ${models.size} model${models.size === 1 ? "" : "s"}`;
  $("replicas").innerHTML = rs
    .map((r) => {
      const health =
        r.state === "ejected" ? `ejected for ${fmt(r.ejected_for, 0)} s` : r.state === "down" ? "failing health checks" : "healthy";
      const cap = r.max_concurrency || Math.max(4, ...rs.map((x) => x.in_flight));
      const load = r.load_age == null
        ? `<p class="muted">no load figures (metrics not scraped)</p>`
        : bar("KV cache", r.kv_usage, 1, `${fmt(100 * r.kv_usage, 1)}%`) +
          `<p class="muted">running ${fmt(r.running)} · waiting ${fmt(r.waiting)}</p>`;
      const prefix = r.kv_events
        ? `${r.blocks_exact} cached blocks (KV events)${r.num_blocks ? ` of ${r.num_blocks}` : ""}`
        : `${r.blocks_routed} blocks routed here (no KV events)`;
      return `<div class="replica ${r.state}" data-id="${esc(r.id)}" data-state="${r.state}">` +
        `<div class="rhead"><span class="dot ${r.state === "up" ? "live" : r.state === "ejected" ? "loading" : ""}"></span>` +
        `<b>${esc(r.id)}</b><span class="muted">${esc(r.model)} · ${r.kind}</span></div>` +
        `<p class="muted">${esc(r.api_base)} · ${health}${r.failures ? ` · ${r.failures} failures in a row` : ""}</p>` +
        bar("in flight", r.in_flight, cap, `${r.in_flight}${r.max_concurrency ? ` / ${r.max_concurrency}` : ""}`) +
        load +
        `<p class="muted">${prefix} · routed ${r.routed}</p></div>`;
    })
    .join("");
}

function drawDecisions() {
  const ds = [...state.decisions.values()].sort((a, b) => b.seq - a.seq);
  $("no-decisions").hidden = ds.length > 0;
  $("decisions").tBodies[0].innerHTML = ds
    .map((d) => {
      const time = new Date(d.t).toLocaleTimeString([], { hour12: false });
      const outcome = d.outcome == null ? "in flight" : d.outcome;
      const cls = d.outcome == null ? "waiting" : /^2/.test(d.outcome) ? "decode" : "preempted";
      const reason = d.resume ? `${d.reason}, resumed stream` : d.reason;
      return `<tr data-seq="${d.seq}"><td>${time}</td><td>${esc(d.model)}</td><td>${esc(d.replica)}</td>` +
        `<td><span class="phase reason">${esc(reason.replace(/_/g, " "))}</span></td>` +
        `<td>${d.blocks ? `${d.matched} / ${d.blocks}` : "–"}</td><td><span class="phase ${cls}">${esc(outcome)}</span></td></tr>`;
    })
    .join("");
}

$("apikey").value = state.key;
$("apikey").addEventListener("change", (e) => {
  state.key = e.target.value.trim();
  localStorage.setItem("pagellm.gateway.key", state.key);
});
window.addEventListener("resize", () => state.frame && render());
connect();
