#!/usr/bin/env python3
"""Prefix-aware routing against round robin and SGLang's cache-aware gateway (smg).

Three `pagellm serve` replicas of smollm2-135m (one thread each, fresh for every run so
no cache carries over); `pagellm bench serve` sends 64 requests built on 8 distinct
512-token shared prefixes (prefix-repetition dataset, 32-token suffixes, 16 output
tokens, concurrency 16) through each gateway in turn:

* `pagellm gateway`, routing_policy prefix-aware (exact: the replicas' KV events);
* `pagellm gateway`, round-robin;
* `smg launch --policy cache_aware` (approximate radix tree of prompt text).

Reported per run: p50 and p99 TTFT, output throughput, the replicas' aggregate prefix
cache hit rate (sum of `vllm:prefix_cache_hits_total` over `queries_total`), and the
largest replica's share of requests relative to the mean.

Usage:
    python3 scripts/bench_gateway_prefix.py --pagellm target/release/pagellm --out docs/bench/gateway-prefix
"""

import argparse
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request

MODEL = "smollm2-135m"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def ready(url, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith(name) and l[len(name)] in "{ ")


def run(a, label, tmp):
    ports = [free_port() for _ in range(a.replicas)]
    reps = [subprocess.Popen([a.pagellm, "serve", "-m", MODEL, "-t", "1", "--port", str(p),
                              "--kv-cache-memory", "1GiB"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    gport = free_port()
    try:
        for u in urls:
            assert ready(u + "/health"), u
        if label == "smg cache_aware":
            cmd = [a.smg, "launch", "--worker-urls", *urls, "--port", str(gport), "--host", "127.0.0.1",
                   "--policy", "cache_aware", "--log-level", "warn", "--prometheus-port", str(free_port())]
            health = f"http://127.0.0.1:{gport}/health"
        else:
            policy = label.split()[-1]
            cfg = os.path.join(tmp, f"{policy}.yaml")
            with open(cfg, "w") as f:
                json.dump({"model_list": [{"model_name": MODEL, "litellm_params": {
                    "model": f"openai/{MODEL}", "api_base": u + "/v1"}} for u in urls],
                    "pagellm_settings": {"routing_policy": policy, "tokenizers": {MODEL: MODEL},
                                         **json.loads(a.settings)}}, f)
            cmd = [a.pagellm, "gateway", "--config", cfg, "--port", str(gport)]
            health = f"http://127.0.0.1:{gport}/health"
        gw = subprocess.Popen(cmd, stdout=open(os.path.join(tmp, label.replace(" ", "_") + ".log"), "w"),
                              stderr=subprocess.STDOUT)
        assert ready(health, 60), label
        time.sleep(2)  # KV-event subscriptions and tokenizers
        out = os.path.join(tmp, label.replace(" ", "_") + ".json")
        subprocess.run([a.pagellm, "bench", "serve", "--base-url", f"http://127.0.0.1:{gport}", "--model", MODEL,
                        "--dataset", "prefix-repetition", "--prefix-len", "512", "--num-prefixes", "8",
                        "--num-prompts", str(a.num_prompts), "--input-len", "32", "--output-len", "16",
                        "--max-concurrency", "16", "--tokenizer", MODEL, "--ignore-eos", "--seed", "1",
                        "--json", out], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = json.load(open(out))
        hits = sum(metric(u, "vllm:prefix_cache_hits_total") for u in urls)
        queries = sum(metric(u, "vllm:prefix_cache_queries_total") for u in urls)
        served = [metric(u, "vllm:request_success_total") for u in urls]
        reasons = {}
        if label.startswith("pagellm"):
            text = urllib.request.urlopen(f"http://127.0.0.1:{gport}/metrics").read().decode()
            for l in text.splitlines():
                if l.startswith("pagellm_gateway_routing_decisions_total{"):
                    reason = l.split('reason="')[1].split('"')[0]
                    reasons[reason] = reasons.get(reason, 0) + int(float(l.rsplit(" ", 1)[1]))
        gw.terminate()
        gw.wait()
        return {"gateway": label, "completed": r["completed"], "failed": r["failed"],
                "median_ttft_ms": r["median_ttft_ms"], "p99_ttft_ms": r["p99_ttft_ms"],
                "output_throughput": r["output_throughput"], "hit_rate": hits / queries if queries else 0,
                "requests_per_replica": served, "max_over_mean": max(served) / (sum(served) / len(served)),
                "routing_reasons": reasons}
    finally:
        for p in reps:
            p.terminate()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", default="target/release/pagellm")
    ap.add_argument("--smg", default="/opt/venv-smg/bin/smg")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--runs", default="pagellm prefix-aware,pagellm round-robin,smg cache_aware")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="gateway-prefix")
    ap.add_argument("--settings", default="{}", help="extra pagellm_settings for pagellm's gateway, as JSON")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pagellm-gw-prefix-")
    rows = []
    # The gateways take turns in each repetition, so that drift of a shared machine
    # spreads over all of them.
    for rep in range(a.repeat):
        for label in a.runs.split(","):
            try:
                rows.append({"run": rep + 1, **run(a, label, tmp)})
            except Exception as e:  # noqa: BLE001 - report and go on with the other gateways
                rows.append({"run": rep + 1, "gateway": label, "error": repr(e)})
            print(json.dumps(rows[-1]), flush=True)
    with open(a.out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    lines = ["| run | gateway | completed | p50 TTFT (ms) | p99 TTFT (ms) | output tok/s | prefix hit rate | requests per replica | max / mean |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['run']} | {r['gateway']} | error: {r['error']} | | | | | | |")
            continue
        lines.append(f"| {r['run']} | {r['gateway']} | {r['completed']} ({r['failed']} failed) | {r['median_ttft_ms']:.0f} | "
                     f"{r['p99_ttft_ms']:.0f} | {r['output_throughput']:.1f} | {100 * r['hit_rate']:.1f}% | "
                     f"{'/'.join(str(int(x)) for x in r['requests_per_replica'])} | {r['max_over_mean']:.2f} |")
    # Medians over the repetitions, and p50 TTFT against round robin's.
    med = lambda xs: sorted(xs)[len(xs) // 2]
    ok = [r for r in rows if "error" not in r]
    by = {g: [r for r in ok if r["gateway"] == g] for g in a.runs.split(",")}
    rr = [r["median_ttft_ms"] for r in by.get("pagellm round-robin", [])]
    lines += ["", f"Medians over {a.repeat} runs:", "",
              "| gateway | p50 TTFT (ms) | vs round robin | prefix hit rate | max / mean |", "|---|---|---|---|---|"]
    for g, rs in by.items():
        if not rs:
            continue
        p50 = med([r["median_ttft_ms"] for r in rs])
        ratio = f"{p50 / med(rr):.2f}x" if rr else "-"
        lines.append(f"| {g} | {p50:.0f} | {ratio} | {100 * med([r['hit_rate'] for r in rs]):.1f}% | "
                     f"{med([r['max_over_mean'] for r in rs]):.2f} |")
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
