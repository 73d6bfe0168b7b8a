// Helpers shared by the dashboards of `pagellm serve` (app.js) and `pagellm gateway`
// (gateway.js): DOM and number formatting, reading a server-sent-events body, and the
// line charts. Plain scripts, no dependencies: the pages must work offline.
"use strict";

const $ = (id) => document.getElementById(id);
const WINDOW_S = 300; // charts show the last five minutes
const LINE_COLORS = ["#3fb37f", "#3d7fd9", "#e39b2d", "#c56cf0", "#e05d5d", "#4fc1c9", "#b8c25a", "#8a96a3"];
const CHART_GRID = "#2a313b";
const CHART_TEXT = "#8a96a3";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const fmt = (v, d = 0) => (v == null || !isFinite(v) ? "–" : v.toFixed(d));
function setStatus(cls, title) {
  const d = $("status");
  d.className = `dot ${cls}`;
  d.title = title;
}

// Reads a server-sent-events body and calls `onData` with each event's data.
async function readEvents(response, onData) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value.replace(/\r\n/g, "\n");
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = ev
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) onData(data);
    }
  }
}

// Follows a dashboard's live stream (GET /dashboard/events) for good: `headers()` gives
// the request's auth headers, `onFrame` gets each parsed frame, and `onUnauthorized`
// runs on a 401 (the page asks for its key) before the next try.
async function followEvents(headers, onFrame, onUnauthorized) {
  for (;;) {
    try {
      const r = await fetch("/dashboard/events", { headers: headers() });
      if (r.status === 401) {
        $("keybox").hidden = false;
        onUnauthorized();
        await sleep(2000);
        continue;
      }
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      await readEvents(r, (d) => onFrame(JSON.parse(d)));
    } catch (e) {
      // the server restarted or went away: retry below
    }
    setStatus("", "disconnected; retrying");
    await sleep(1000);
  }
}

// Sizes a canvas's backing store to its CSS box; returns the context and CSS size.
function fit(canvas, cssHeight) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth;
  if (cssHeight) canvas.style.height = `${cssHeight}px`;
  const h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return { ctx, w, h };
}

// A line chart of the fields `keys` of the points `pts` ({t: seconds, ...}) over the
// last WINDOW_S seconds; `top` fixes the y range. Line i is drawn in LINE_COLORS[i].
function drawChart(canvas, pts, keys, label, top) {
  const { ctx, w, h } = fit(canvas);
  const now = pts.length ? pts[pts.length - 1].t : 0;
  // The time axis grows with the data, from half a minute up to the whole window.
  const span = pts.length ? Math.min(WINDOW_S, Math.max(30, now - pts[0].t)) : 30;
  const left = 40;
  const bottom = h - 16;
  let max = top || 0;
  if (!top) for (const p of pts) for (const k of keys) if (p[k] != null) max = Math.max(max, p[k]);
  max = max > 0 ? max * (top ? 1 : 1.1) : 1;
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = CHART_TEXT;
  ctx.strokeStyle = CHART_GRID;
  ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = Math.round(bottom - (i / 4) * (bottom - 6)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(left, y);
    ctx.lineTo(w, y);
    ctx.stroke();
    ctx.fillText(label((i / 4) * max), 2, y + 4);
  }
  for (let i = 0; i <= 4; i++) {
    const ago = (i / 4) * span;
    const x = left + ((span - ago) / span) * (w - left);
    const text = i === 0 ? "now" : ago < 120 ? `-${Math.round(ago)}s` : `-${(ago / 60).toFixed(1)}m`;
    ctx.fillText(text, Math.max(left, Math.min(x - 10, w - 24)), h - 3);
  }
  let drawn = 0;
  keys.forEach((k, i) => {
    ctx.strokeStyle = LINE_COLORS[i % LINE_COLORS.length];
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let pen = false;
    for (const p of pts) {
      const v = p[k];
      if (v == null) {
        pen = false;
        continue;
      }
      if (p.t < now - span) continue;
      const x = left + ((p.t - (now - span)) / span) * (w - left);
      const y = bottom - (Math.min(v, max) / max) * (bottom - 6);
      if (pen) ctx.lineTo(x, y);
      else ctx.moveTo(x, y);
      pen = true;
      drawn++;
    }
    ctx.stroke();
  });
  const lastVals = keys.map((k) => {
    for (let i = pts.length - 1; i >= 0; i--) if (pts[i][k] != null) return pts[i][k];
    return null;
  });
  canvas.dataset.points = drawn;
  canvas.dataset.max = Math.max(0, ...pts.flatMap((p) => keys.map((k) => p[k] || 0)));
  canvas.dataset.last = JSON.stringify(lastVals);
}
