#!/usr/bin/env python3
"""A gateway's added latency, pagellm against LiteLLM proxy and SGLang's gateway (smg).

One mock OpenAI upstream (`pagellm bench mock-upstream`, answers at once) sits behind
each gateway in turn. `pagellm bench overhead` sends open-loop chat requests at fixed
rates (plain and streamed) to the gateway, and, right before, to the mock directly:
the added latency is the difference of the two percentiles in the same run. The
gateway runs pinned to CPU 1, the load generator and the mock to CPU 0.

Then pagellm's gateway takes 100,000 requests and its resident memory is read after
the first 10,000 (warm-up) and at the end.

Peers (each in its own venv, not installed by this script):
    python3 -m venv /opt/venv-litellm && /opt/venv-litellm/bin/pip install "litellm[proxy]==1.108.7"
    python3 -m venv /opt/venv-smg && /opt/venv-smg/bin/pip install smg

Usage:
    python3 scripts/bench_gateway_overhead.py --pagellm target/release/pagellm --out docs/bench/gateway-overhead
"""

import argparse
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request

MASTER = "sk-bench-0123456789abcdef"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def ready(url, timeout=120, headers=None):
    end = time.time() + timeout
    while time.time() < end:
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def overhead(a, base, label, rates, mode, out, key=None, model="mock"):
    cmd = ["taskset", "-c", "0", a.pagellm, "bench", "overhead", "--base-url", base, "--label", label,
           "--rates", ",".join(str(r) for r in rates), "--duration", str(a.duration), "--mode", mode,
           "--json", out, "--model", model]
    if key:
        cmd += ["--api-key", key]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def start_gateway(a, name, mock_port, tmp):
    port = free_port()
    upstream = f"http://127.0.0.1:{mock_port}/v1"
    if name == "pagellm":
        cfg = os.path.join(tmp, "pagellm.yaml")
        with open(cfg, "w") as f:
            json.dump({"model_list": [{"model_name": "mock", "litellm_params": {"model": "openai/mock",
                       "api_base": upstream}}], "general_settings": {"master_key": MASTER},
                       "pagellm_settings": {"key_store": {"type": "memory"}}}, f)
        cmd = [a.pagellm, "gateway", "--config", cfg, "--port", str(port)]
        env = {}
        health = f"http://127.0.0.1:{port}/health"
    elif name == "litellm":
        cfg = os.path.join(tmp, "litellm.yaml")
        with open(cfg, "w") as f:
            json.dump({"model_list": [{"model_name": "mock", "litellm_params": {"model": "openai/mock",
                       "api_base": upstream, "api_key": "none"}}],
                       "litellm_settings": {"num_retries": 0, "callbacks": []},
                       "general_settings": {"master_key": MASTER}}, f)
        cmd = [a.litellm, "--config", cfg, "--port", str(port), "--host", "127.0.0.1", "--num_workers", "1",
               "--telemetry", "False"]
        env = {"LITELLM_OFFLINE_MODE": "true"}
        health = f"http://127.0.0.1:{port}/health/liveliness"
    else:
        cmd = [a.smg, "launch", "--worker-urls", f"http://127.0.0.1:{mock_port}", "--port", str(port),
               "--host", "127.0.0.1", "--policy", "round_robin", "--log-level", "warn",
               "--prometheus-port", str(free_port())]
        env = {}
        health = f"http://127.0.0.1:{port}/health"
    log = open(os.path.join(tmp, f"{name}.log"), "w")
    p = subprocess.Popen(["taskset", "-c", "1"] + cmd, stdout=log, stderr=subprocess.STDOUT,
                         env={**os.environ, **env})
    if not ready(health):
        p.kill()
        raise SystemExit(f"{name} did not start; see {log.name}")
    time.sleep(1)
    return p, f"http://127.0.0.1:{port}"


def svg(rows, path):
    """p99 added latency against rate, one line per gateway and mode, log scale."""
    import math
    W, H, L, B = 640, 360, 60, 40
    series = {}
    for r in rows:
        series.setdefault((r["gateway"], r["stream"]), []).append((r["rate"], r["added_p99_ms"]))
    lo, hi = -1, 5  # 0.1 ms to 100 s
    rates = sorted({r["rate"] for r in rows})
    xs = lambda rate: L + (W - L - 20) * rates.index(rate) / max(1, len(rates) - 1)
    ysc = lambda y: H - B - (H - B - 20) * (min(max(math.log10(max(y, 1e-9)), lo), hi) - lo) / (hi - lo)
    colors = {"pagellm": "#1f77b4", "litellm": "#d62728", "smg": "#2ca02c"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{H-B}" x2="{W-20}" y2="{H-B}" stroke="black"/>',
           f'<line x1="{L}" y1="20" x2="{L}" y2="{H-B}" stroke="black"/>',
           f'<text x="{W/2}" y="{H-8}" text-anchor="middle">requests/s</text>',
           f'<text x="14" y="{H/2}" transform="rotate(-90 14 {H/2})" text-anchor="middle">p99 added latency (ms, log scale)</text>']
    for rate in rates:
        out.append(f'<text x="{xs(rate)}" y="{H-B+16}" text-anchor="middle">{rate:g}</text>')
    for e in range(lo, hi + 1):
        y = 10.0 ** e
        out.append(f'<text x="{L-6}" y="{ysc(y)+4}" text-anchor="end">{y:g}</text>')
        out.append(f'<line x1="{L}" y1="{ysc(y)}" x2="{W-20}" y2="{ysc(y)}" stroke="#ddd"/>')
    for k, ((gw, stream), pts) in enumerate(sorted(series.items())):
        pts = sorted(pts)
        d = " ".join(f"{xs(x):.1f},{ysc(y):.1f}" for x, y in pts if y == y)
        dash = ' stroke-dasharray="5,4"' if stream else ""
        out.append(f'<polyline fill="none" stroke="{colors.get(gw, "gray")}" stroke-width="2"{dash} points="{d}"/>')
        out.append(f'<text x="{W-200}" y="{30+16*k}" fill="{colors.get(gw, "gray")}">{gw} {"stream (dashed)" if stream else "plain"}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", default="target/release/pagellm")
    ap.add_argument("--litellm", default="/opt/venv-litellm/bin/litellm")
    ap.add_argument("--smg", default="/opt/venv-smg/bin/smg")
    ap.add_argument("--gateways", default="pagellm,litellm,smg")
    ap.add_argument("--rates", default="100,500,1000")
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--soak", type=int, default=100_000, help="requests of the memory soak (0 = skip)")
    ap.add_argument("--out", default="gateway-overhead", help="prefix of the .json, .md and .svg written")
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]
    tmp = tempfile.mkdtemp(prefix="pagellm-gw-bench-")
    mock_port = free_port()
    mock = subprocess.Popen(["taskset", "-c", "0", a.pagellm, "bench", "mock-upstream", "--port", str(mock_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    direct = f"http://127.0.0.1:{mock_port}"
    assert ready(direct + "/health")
    rows = []
    try:
        for name in a.gateways.split(","):
            gw, base = start_gateway(a, name, mock_port, tmp)
            key = None if name == "smg" else MASTER
            try:
                for rate in rates:
                    for mode in ["plain", "stream"]:
                        res = os.path.join(tmp, f"{name}-{rate}-{mode}.jsonl")
                        if name != "pagellm":
                            # Let a peer finish the backlog of the previous load first.
                            time.sleep(10)
                        overhead(a, direct, "direct", [rate], mode, res)
                        overhead(a, base, name, [rate], mode, res, key=key)
                        with open(res) as f:
                            d, g = [json.loads(line) for line in f]
                        rows.append({"gateway": name, "rate": rate, "stream": mode == "stream",
                                     "sent": g["sent"], "failed": g["failed"],
                                     "direct_p50_ms": d["p50_ms"], "direct_p99_ms": d["p99_ms"],
                                     "p50_ms": g["p50_ms"], "p99_ms": g["p99_ms"],
                                     "added_p50_ms": g["p50_ms"] - d["p50_ms"],
                                     "added_p99_ms": g["p99_ms"] - d["p99_ms"]})
                        print(json.dumps(rows[-1]), flush=True)
                if name == "pagellm" and a.soak:
                    warm = max(1, a.soak // 10)
                    res = os.path.join(tmp, "soak.jsonl")
                    subprocess.run(["taskset", "-c", "0", a.pagellm, "bench", "overhead", "--base-url", base,
                                    "--api-key", MASTER, "--model", "mock", "--rates", "1000", "--mode", "both",
                                    "--duration", str(warm / 2000)], check=True, stdout=subprocess.DEVNULL)
                    rss_warm = rss_kb(gw.pid)
                    subprocess.run(["taskset", "-c", "0", a.pagellm, "bench", "overhead", "--base-url", base,
                                    "--api-key", MASTER, "--model", "mock", "--rates", "1000", "--mode", "both",
                                    "--duration", str((a.soak - warm) / 2000), "--json", res],
                                   check=True, stdout=subprocess.DEVNULL)
                    rss_end = rss_kb(gw.pid)
                    with open(res) as f:
                        failed = sum(json.loads(line)["failed"] for line in f)
                    soak = {"requests": a.soak, "rss_after_warmup_kb": rss_warm, "rss_end_kb": rss_end,
                            "growth": rss_end / rss_warm - 1, "failed": failed}
                    print(json.dumps(soak), flush=True)
                    rows.append({"gateway": "pagellm", "soak": soak})
            finally:
                gw.terminate()
                gw.wait()
    finally:
        mock.terminate()
    table = [r for r in rows if "rate" in r]
    with open(a.out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    lines = ["| gateway | rate (req/s) | mode | failed | direct p50 / p99 (ms) | through p50 / p99 (ms) | added p50 | added p99 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['gateway']} | {r['rate']:g} | {'stream' if r['stream'] else 'plain'} | {r['failed']} of {r['sent']} | "
                     f"{r['direct_p50_ms']:.3f} / {r['direct_p99_ms']:.3f} | {r['p50_ms']:.3f} / {r['p99_ms']:.3f} | "
                     f"{r['added_p50_ms']:.3f} | {r['added_p99_ms']:.3f} |")
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    svg(table, a.out + ".svg")


if __name__ == "__main__":
    main()
