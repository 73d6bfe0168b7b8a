#!/usr/bin/env python3
"""The dashboard at `/` in a real browser: Debian's headless Chromium, driven by Playwright,
against `pagellm serve` on loopback.

Checks that the page loads with no console errors and shows the live stream; that a chat
message streams a reply (the text grows over several updates) with its timing line; and
that while `pagellm bench serve` runs a load with shared prefixes the block map changes
(blocks in use, then shared, then cached for reuse once the load ends), the request table
fills and the charts draw non-zero throughput. Then the gateway's twin page: a second
replica and `pagellm gateway` (prefix-aware) in front of both; while a load with shared
prefixes runs through the gateway, the page shows both replicas up, taking traffic, and
the routing decisions with their reasons and outcomes; when a replica is killed, its card
turns to ejected or down and the failed attempt is shown. `--screenshots DIR` saves the
pages during the chat and under load (the pictures in docs/ and the README were made
this way).

    python3 scripts/dashboard_e2e.py --pagellm target/release/pagellm --model smollm2-135m
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from playwright.sync_api import sync_playwright

from openai_conformance import API_KEY, Server

STATE = """() => {
  const c = document.getElementById('blockmap').dataset;
  const f = window.pagellm.frame;
  return {frames: window.pagellm.frames, model: document.getElementById('model').textContent,
          used: +c.used, shared: +c.shared, cached: +c.cached, free: +c.free,
          map: f ? f.blocks : '', rows: document.querySelectorAll('#requests tbody tr').length,
          running: f ? f.stats.running : 0,
          tput: +(document.getElementById('c-tput').dataset.max || 0),
          batch: +(document.getElementById('c-batch').dataset.max || 0),
          lat_points: +(document.getElementById('c-lat').dataset.points || 0)};
}"""


def chat(page, fails, shots):
    # Count the reply's updates as they happen: a reply that arrives in one piece is not
    # streamed.
    page.evaluate("""() => {
      window.__updates = 0;
      new MutationObserver(() => window.__updates++).observe(
        document.getElementById('chat-log'), {subtree: true, childList: true, characterData: true});
    }""")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "96")
    page.fill("#chat-input", "Write a short poem about the sea.")
    page.press("#chat-input", "Enter")
    page.wait_for_selector(".msg.assistant[data-done='1']", timeout=120_000)
    reply = page.inner_text(".msg.assistant .body")
    timing = page.inner_text(".msg.assistant .timing")
    updates = page.evaluate("window.__updates")
    print(f"chat: {len(reply)} characters in {updates} updates; {timing}")
    if not reply.strip():
        fails.append("the chat reply is empty")
    if updates < 5:
        fails.append(f"the chat reply came in {updates} updates, not streamed")
    if "TTFT" not in timing or "tokens in" not in timing:
        fails.append(f"the timing line is incomplete: {timing!r}")
    if page.locator(".msg.error").count():
        fails.append("the chat shows an error: " + page.inner_text(".msg.error"))
    # A JSON schema constrains the next reply: it must parse.
    page.check("#use-schema")
    page.fill("#chat-input", "How sure are you that the sea is blue?")
    page.press("#chat-input", "Enter")
    page.wait_for_selector(".msg.assistant:nth-of-type(4)[data-done='1']", timeout=120_000)
    constrained = page.locator(".msg.assistant .body").nth(1).inner_text()
    try:
        v = json.loads(constrained)
        if not isinstance(v, dict) or set(v) != {"answer", "confidence"}:
            fails.append(f"the schema reply has the wrong keys: {constrained}")
    except ValueError:
        fails.append(f"the schema reply does not parse as JSON: {constrained!r}")
    print(f"chat with a schema: {constrained}")
    if shots:
        page.screenshot(path=os.path.join(shots, "dashboard-chat.png"), full_page=True)


def load(page, binary, base, model, fails, shots):
    before = page.evaluate(STATE)
    cmd = [binary, "bench", "serve", "--base-url", base, "--model", model, "--api-key", API_KEY,
           "--dataset", "prefix-repetition", "--num-prefixes", "2", "--prefix-len", "256",
           "--input-len", "32", "--output-len", "48", "--num-prompts", "40",
           "--max-concurrency", "8", "--ignore-eos", "--quiet"]
    bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    shot_taken = False
    while bench.poll() is None:
        s = page.evaluate(STATE)
        seen.append(s)
        if shots and not shot_taken and s["shared"] > 0 and s["rows"] >= 4 and len(seen) > 8:
            page.screenshot(path=os.path.join(shots, "dashboard.png"), full_page=True)
            shot_taken = True
        time.sleep(0.25)
    out = bench.stdout.read()
    if bench.returncode != 0:
        fails.append(f"bench serve exited with {bench.returncode}:\n{out}")
    time.sleep(1.5)  # the stream's next frames show the engine idle
    after = page.evaluate(STATE)
    maps = {s["map"] for s in seen}
    peak = {k: max(s[k] for s in seen) for k in ("used", "shared", "rows", "running", "tput", "batch")}
    print(f"load: {len(seen)} samples, {len(maps)} distinct block maps, peaks {peak}")
    print(f"before: used {before['used']} cached {before['cached']}; "
          f"after: used {after['used']} shared {after['shared']} cached {after['cached']}")
    if len(maps) < 5:
        fails.append(f"the block map changed only {len(maps)} times under load")
    if peak["used"] + peak["shared"] == 0:
        fails.append("no block was ever shown in use")
    if peak["shared"] == 0:
        fails.append("requests with a common prefix never showed shared blocks")
    if peak["rows"] < 2:
        fails.append("the request table never showed the load")
    if peak["tput"] <= 0:
        fails.append("the throughput chart stayed at zero")
    if peak["batch"] < 2:
        fails.append("the batch chart never showed two requests running")
    if after["lat_points"] == 0:
        fails.append("the latency chart drew nothing")
    if after["used"] or after["shared"] or after["rows"]:
        fails.append(f"blocks or requests still shown after the load ended: {after}")
    if after["cached"] <= before["cached"]:
        fails.append("no block was left cached for reuse after the load")


GATEWAY_STATE = """() => {
  const f = window.gateway.frame;
  const cards = [...document.querySelectorAll('#replicas .replica')];
  return {frames: window.gateway.frames,
          states: Object.fromEntries(cards.map((c) => [c.dataset.id, c.dataset.state])),
          routed: f ? Object.fromEntries(f.replicas.map((r) => [r.id, r.routed])) : {},
          rows: document.querySelectorAll('#decisions tbody tr').length,
          reasons: f ? f.reasons : {},
          outcomes: [...window.gateway.decisions.values()].map((d) => d.outcome),
          rps: +(document.getElementById('c-rps').dataset.max || 0),
          inflight: +(document.getElementById('c-inflight').dataset.max || 0)};
}"""
MASTER = "sk-dashboard-test"


def gateway(browser, binary, model, first_base, fails, errors, shots, tmp):
    """The gateway's dashboard, in front of the running server and a second replica."""
    second = Server(binary, model, limits=("--max-num-seqs", "8"))
    gw = None
    try:
        second_base = second.wait_ready()
        cfg = os.path.join(tmp, "gateway.yaml")
        with open(cfg, "w") as f:
            f.write("model_list:\n")
            for rid, base in (("replica-a", first_base), ("replica-b", second_base)):
                f.write(f"  - {{model_name: {model}, litellm_params: {{model: openai/{model}, "
                        f"api_base: \"{base}/v1\", api_key: {API_KEY}}}, model_info: {{id: {rid}}}}}\n")
            f.write(f"general_settings: {{master_key: {MASTER}}}\n"
                    f"pagellm_settings: {{tokenizers: {{{model}: {model}}}, "
                    f"health_check: {{interval: 0.5}}, metrics_interval: 0.5, key_store: {{type: memory}}}}\n")
        port = free_port()
        gw = subprocess.Popen([binary, "gateway", "--config", cfg, "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        gw_base = f"http://127.0.0.1:{port}"
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: errors.append(f"gateway page: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"gateway page uncaught: {e}"))
        page.add_init_script(f"localStorage.setItem('pagellm.gateway.key', {json.dumps(MASTER)})")
        for _ in range(100):
            try:
                page.goto(gw_base + "/")
                break
            except Exception:  # noqa: BLE001 - the gateway is still starting
                time.sleep(0.1)
        page.wait_for_function("window.gateway.frames >= 2", timeout=15_000)
        s = page.evaluate(GATEWAY_STATE)
        if s["states"] != {"replica-a": "up", "replica-b": "up"}:
            fails.append(f"gateway page: the replicas are not shown up: {s['states']}")
        cmd = [binary, "bench", "serve", "--base-url", gw_base, "--model", model, "--api-key", MASTER,
               "--dataset", "prefix-repetition", "--num-prefixes", "4", "--prefix-len", "128",
               "--input-len", "16", "--output-len", "32", "--num-prompts", "48",
               "--max-concurrency", "8", "--ignore-eos", "--quiet"]
        bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen, shot = [], False
        while bench.poll() is None:
            s = page.evaluate(GATEWAY_STATE)
            seen.append(s)
            if shots and not shot and s["outcomes"].count("200") >= 24 and s["inflight"] >= 2:
                page.screenshot(path=os.path.join(shots, "gateway-dashboard.png"), full_page=True)
                shot = True
            time.sleep(0.25)
        if bench.returncode != 0:
            fails.append(f"bench serve through the gateway exited with {bench.returncode}:\n{bench.stdout.read()}")
        time.sleep(1.5)
        after = page.evaluate(GATEWAY_STATE)
        print(f"gateway: {len(seen)} samples; routed {after['routed']}; reasons {after['reasons']}; "
              f"{after['rows']} decision rows; peak in flight {max(x['inflight'] for x in seen)}")
        if min(after["routed"].values(), default=0) < 4:
            fails.append(f"gateway page: a replica took almost no traffic: {after['routed']}")
        if after["reasons"].get("prefix_hit", 0) < 8:
            fails.append(f"gateway page: few prefix hits among the decisions: {after['reasons']}")
        if after["rows"] < 20 or after["outcomes"].count("200") < 20:
            fails.append(f"gateway page: the decision log is short or lacks outcomes: {after['rows']} rows")
        if after["rps"] <= 0 or max(x["inflight"] for x in seen) < 2:
            fails.append("gateway page: the traffic charts stayed flat")
        # A replica dies: its card leaves the `up` state, and requests still succeed.
        second.proc.kill()
        second.proc.wait(10)
        for i in range(4):
            r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H",
                                f"authorization: Bearer {MASTER}", "-H", "content-type: application/json",
                                "-d", json.dumps({"model": model, "prompt": f"Count to {i}", "max_tokens": 4}),
                                gw_base + "/v1/completions"], capture_output=True, text=True)
            if r.stdout != "200":
                fails.append(f"a request after the replica died got {r.stdout}")
        page.wait_for_function(
            "document.querySelector('#replicas .replica[data-id=\"replica-b\"]').dataset.state !== 'up'",
            timeout=15_000)
        down = page.evaluate(GATEWAY_STATE)
        print(f"after killing replica-b: {down['states']}")
        if down["states"].get("replica-a") != "up":
            fails.append(f"the live replica is not shown up: {down['states']}")
        page.close()
    finally:
        if gw:
            gw.terminate()
            gw.wait(30)
        if second.proc.poll() is None:
            second.proc.terminate()
            second.proc.wait(30)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--screenshots", help="directory to save screenshots in")
    a = ap.parse_args()
    server = Server(a.pagellm, a.model, limits=("--max-num-seqs", "8"))
    fails, errors = [], []
    try:
        base = server.wait_ready()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=a.chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            # The server has an API key; the page reads it from where its key box saves it.
            page.add_init_script(f"localStorage.setItem('pagellm.apikey', {json.dumps(API_KEY)})")
            page.goto(base + "/")
            page.wait_for_function("window.pagellm.frames >= 2", timeout=15_000)
            s = page.evaluate(STATE)
            if s["model"] != a.model:
                fails.append(f"the header shows {s['model']!r}, not the model")
            if s["free"] + s["cached"] == 0 or s["used"]:
                fails.append(f"an idle server's block map is not all free: {s}")
            chat(page, fails, a.screenshots)
            load(page, a.pagellm, base, a.model, fails, a.screenshots)
            with tempfile.TemporaryDirectory() as tmp:
                gateway(browser, a.pagellm, a.model, base, fails, errors, a.screenshots, tmp)
            browser.close()
    except Exception as e:  # noqa: BLE001 - reported with the server's log
        fails.append(f"{type(e).__name__}: {e}")
    finally:
        server.proc.terminate()
        server.proc.wait(30)
    fails += [f"console error: {e}" for e in errors]
    for f in fails:
        print("FAIL", f)
    if fails:
        server.print_log()
        sys.exit(1)
    print("dashboard e2e: all checks passed")


if __name__ == "__main__":
    main()
