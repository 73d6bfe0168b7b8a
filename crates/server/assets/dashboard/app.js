// The pagellm dashboard: reads the server's live stream (GET /dashboard/events, one JSON
// frame every half second, see crates/server/src/dashboard.rs), draws the KV block map,
// the requests in flight and charts of the last minutes, and runs a streaming chat
// against /v1/chat/completions. No dependencies: the page must work offline; the
// helpers it shares with the gateway's page are in common.js.
"use strict";

const BLOCK_COLORS = { ".": "#2b323c", c: "#3d7fd9", u: "#3fb37f", s: "#e39b2d" };

// Everything the page knows; exposed for the end-to-end test and for curious users.
const state = {
  frame: null, // the last frame
  prev: null, // the frame before it, for rates
  series: [], // one point per frame: {t, gen, prompt, ttft, tpot, running, waiting, kv, hit}
  hover: null, // id of the request whose blocks are highlighted
  key: localStorage.getItem("pagellm.apikey") || "",
  frames: 0,
  messages: [], // the chat so far
};
window.pagellm = state;

const authHeaders = () => (state.key ? { Authorization: `Bearer ${state.key}` } : {});

// ---- the live stream -------------------------------------------------------------

function connect() {
  return followEvents(authHeaders, onFrame, () => {
    setStatus("", "the server needs an API key");
    $("model").textContent = "enter the server's API key";
  });
}

function onFrame(f) {
  state.frames++;
  $("model").textContent = f.model;
  if (f.loading) {
    setStatus("loading", "the model is loading");
    $("model").textContent = `${f.model} (loading)`;
    return;
  }
  setStatus("live", "live");
  const p = state.frame;
  state.prev = p;
  state.frame = f;
  const s = f.stats;
  const point = { t: f.t / 1000, running: s.running, waiting: s.waiting, kv: 100 * s.kv_usage };
  if (p && !p.loading && f.t > p.t) {
    const q = p.stats;
    const dt = (f.t - p.t) / 1000;
    const mean = (sum, n, psum, pn) => (n > pn ? (1000 * (sum - psum)) / (n - pn) : null);
    point.gen = (s.generation_tokens - q.generation_tokens) / dt;
    point.prompt = (s.prompt_tokens - q.prompt_tokens) / dt;
    point.ttft = mean(s.ttft_sum, s.ttft_count, q.ttft_sum, q.ttft_count);
    point.tpot = mean(s.itl_sum, s.itl_count, q.itl_sum, q.itl_count);
    const dq = s.prefix_queries - q.prefix_queries;
    point.hit = dq > 0 ? (100 * (s.prefix_hits - q.prefix_hits)) / dq : null;
  }
  state.series.push(point);
  while (state.series.length && state.series[0].t < point.t - WINDOW_S) state.series.shift();
  render();
}

// ---- drawing ---------------------------------------------------------------------

function render() {
  const f = state.frame;
  const s = f.stats;
  const last = state.series[state.series.length - 1];
  $("t-running").textContent = s.running;
  $("t-waiting").textContent = s.waiting;
  $("t-kv").textContent = `${fmt(100 * s.kv_usage, 1)}%`;
  $("t-hit").textContent =
    s.prefix_queries > 0 ? `${fmt((100 * s.prefix_hits) / s.prefix_queries, 1)}%` : "–";
  $("t-gen").textContent = fmt(last.gen, 1);
  $("t-preempt").textContent = s.preemptions;
  drawBlocks();
  drawRequests();
  const ms = (v) => fmt(v, 0);
  const pts = state.series;
  drawChart($("c-tput"), pts, ["gen", "prompt"], ms);
  drawChart($("c-lat"), pts, ["ttft", "tpot"], ms);
  drawChart($("c-batch"), pts, ["running", "waiting"], ms);
  drawChart($("c-cache"), pts, ["kv", "hit"], ms, 100);
}

function drawBlocks() {
  const f = state.frame;
  const canvas = $("blockmap");
  const n = f.blocks.length;
  const w = canvas.clientWidth;
  // Square cells as large as fit the width in at most ~160 px of height.
  let cell = Math.floor(Math.sqrt((w * 160) / Math.max(n, 1)));
  cell = Math.max(3, Math.min(16, cell));
  const cols = Math.max(1, Math.floor(w / cell));
  const rows = Math.ceil(n / cols);
  const { ctx } = fit(canvas, Math.max(rows * cell, cell));
  const gap = cell >= 6 ? 1 : 0;
  const counts = { ".": 0, c: 0, u: 0, s: 0 };
  for (let i = 0; i < n; i++) {
    const code = f.blocks[i];
    counts[code]++;
    ctx.fillStyle = BLOCK_COLORS[code] || "#f0f";
    ctx.fillRect((i % cols) * cell, Math.floor(i / cols) * cell, cell - gap, cell - gap);
  }
  const hovered = f.requests.find((r) => r.id === state.hover);
  if (hovered) {
    ctx.strokeStyle = "#ffffff";
    ctx.lineWidth = 1.5;
    for (const b of hovered.blocks) {
      ctx.strokeRect((b % cols) * cell + 0.75, Math.floor(b / cols) * cell + 0.75, cell - gap - 1.5, cell - gap - 1.5);
    }
  }
  Object.assign(canvas.dataset, { free: counts["."], cached: counts.c, used: counts.u, shared: counts.s });
  $("n-free").textContent = counts["."];
  $("n-cached").textContent = counts.c;
  $("n-used").textContent = counts.u;
  $("n-shared").textContent = counts.s;
  $("kv-caption").textContent =
    `${n} blocks of ${f.block_size} tokens · step ${f.step} · context up to ${f.max_model_len} tokens`;
}

const MAX_ROWS = 40;

function drawRequests() {
  const reqs = state.frame.requests;
  $("no-requests").hidden = reqs.length > 0;
  const rows = reqs.slice(0, MAX_ROWS).map((r) => {
    const pct = r.prompt > 0 ? Math.min(100, (100 * r.computed) / r.prompt) : 100;
    return `<tr data-id="${r.id}"><td>${r.id}</td><td><span class="phase ${esc(r.phase)}">${esc(r.phase)}</span></td>` +
      `<td>${r.prompt}</td><td>${r.cached}</td><td>${r.phase === "prefill" ? `${fmt(pct)}%` : r.computed}</td>` +
      `<td>${r.output} / ${r.max}</td><td>${r.blocks.length}</td><td>${fmt(r.age, 1)} s</td>` +
      `<td>${r.ttft == null ? "–" : `${fmt(1000 * r.ttft)} ms`}</td></tr>`;
  });
  if (reqs.length > MAX_ROWS) rows.push(`<tr><td colspan="9">and ${reqs.length - MAX_ROWS} more</td></tr>`);
  $("requests").tBodies[0].innerHTML = rows.join("");
}

$("requests").tBodies[0].addEventListener("mouseover", (e) => {
  const tr = e.target.closest("tr[data-id]");
  state.hover = tr ? Number(tr.dataset.id) : null;
  if (state.frame) drawBlocks();
});
$("requests").addEventListener("mouseleave", () => {
  state.hover = null;
  if (state.frame) drawBlocks();
});
window.addEventListener("resize", () => state.frame && render());

// ---- the chat playground ---------------------------------------------------------

let controller = null;

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  const body = document.createElement("div");
  body.className = "body";
  body.textContent = text;
  div.appendChild(body);
  $("chat-log").appendChild(div);
  $("chat-log").scrollTop = $("chat-log").scrollHeight;
  return div;
}

function chatRequest() {
  const body = {
    model: state.frame ? state.frame.model : undefined,
    messages: state.messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value),
  };
  if ($("use-schema").checked) {
    let schema;
    try {
      schema = JSON.parse($("schema").value);
    } catch (e) {
      throw new Error(`the JSON schema does not parse: ${e.message}`);
    }
    body.response_format = { type: "json_schema", json_schema: { name: "reply", schema, strict: true } };
  }
  return body;
}

async function send(text) {
  state.messages.push({ role: "user", content: text });
  addMessage("user", text);
  const div = addMessage("assistant", "");
  const out = div.querySelector(".body");
  const timing = document.createElement("div");
  timing.className = "timing";
  div.appendChild(timing);
  let reply = "";
  let usage = null;
  let finish = null;
  const t0 = performance.now();
  let tFirst = null;
  let tLast = null;
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(chatRequest()),
      signal: controller.signal,
    });
    if (!r.ok) {
      const err = await r.json().catch(() => null);
      throw new Error(err && err.error ? err.error.message : `HTTP ${r.status}`);
    }
    await readEvents(r, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices || []) {
        if (c.delta && c.delta.content) {
          const now = performance.now();
          if (tFirst == null) tFirst = now;
          tLast = now;
          reply += c.delta.content;
          out.textContent = reply;
          $("chat-log").scrollTop = $("chat-log").scrollHeight;
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
    });
    state.messages.push({ role: "assistant", content: reply });
  } catch (e) {
    if (e.name === "AbortError") {
      finish = "stopped";
      if (reply) state.messages.push({ role: "assistant", content: reply });
    } else {
      state.messages.pop(); // the turn failed: do not send it again
      div.classList.add("error");
      out.textContent = e.message;
    }
  } finally {
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
  if (tFirst != null) {
    const n = usage ? usage.completion_tokens : null;
    const decode = tLast - tFirst;
    const parts = [`TTFT ${fmt(tFirst - t0)} ms`];
    if (n != null) {
      parts.push(`${n} tokens in ${fmt((tLast - t0) / 1000, 2)} s`);
      if (n > 1) parts.push(`TPOT ${fmt(decode / (n - 1), 1)} ms`, `${fmt(((n - 1) * 1000) / decode, 1)} tok/s`);
      parts.push(`prompt ${usage.prompt_tokens} tokens`);
    }
    if (finish) parts.push(`finish: ${finish}`);
    timing.textContent = parts.join(" · ");
    div.dataset.ttftMs = fmt(tFirst - t0);
  }
  div.dataset.done = "1";
}

$("chat-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text || controller) return;
  $("chat-input").value = "";
  send(text);
});
$("chat-input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("chat-form").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  state.messages = [];
  $("chat-log").innerHTML = "";
});
$("use-schema").addEventListener("change", () => {
  $("schema").hidden = !$("use-schema").checked;
});
$("apikey").value = state.key;
$("apikey").addEventListener("change", () => {
  state.key = $("apikey").value;
  localStorage.setItem("pagellm.apikey", state.key);
});

connect();
