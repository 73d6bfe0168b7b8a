#!/usr/bin/env python3
"""Side-by-side speed of pagellm and llama.cpp on the same machine, in one run.

Alternates `pagellm bench` and llama.cpp's `llama-bench` (same test: pp = a prompt of
P tokens in one pass, tg = N tokens generated one by one, T threads) for several rounds
and reports per-engine medians over rounds and the pagellm/llama.cpp ratio. Alternating
spreads the noise of shared machines evenly over both engines.

Usage:
    scripts/bench_vs_llamacpp.py --llama-bench PATH/TO/llama-bench [--rounds 5]
        [--model smollm2-135m] [-p 512] [-n 128] [-t 2]

Getting llama-bench (the llama.cpp that llama-cpp-python 0.3.36 vendors, commit 0c1e570):
    pip download --no-deps --no-binary=llama-cpp-python llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
    cmake --build build -j2 --target llama-bench
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGELLM = os.path.join(ROOT, "target", "release", "pagellm")


def model_path(name: str) -> str:
    out = subprocess.run([PAGELLM, "models", "pull", name], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def run_pagellm(model: str, p: int, n: int, t: int, reps: int) -> dict:
    out = subprocess.run(
        [PAGELLM, "bench", "-m", model, "-p", str(p), "-n", str(n), "-t", str(t), "-r", str(reps), "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    res = {}
    for line in out.splitlines():
        row = json.loads(line)
        res[row["test"]] = row["tokens_per_s_mean"]
    return res


def run_llama(bench: str, path: str, p: int, n: int, t: int, reps: int) -> dict:
    out = subprocess.run(
        [bench, "-m", path, "-p", str(p), "-n", str(n), "-t", str(t), "-r", str(reps), "-o", "json"],
        check=True, capture_output=True, text=True,
    ).stdout
    res = {}
    for row in json.loads(out):
        test = f"pp{row['n_prompt']}" if row["n_prompt"] > 0 else f"tg{row['n_gen']}"
        res[test] = row["avg_ts"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=3, help="repetitions inside each engine's run")
    a = ap.parse_args()
    path = model_path(a.model)
    ours, theirs = {}, {}
    for i in range(a.rounds):
        for name, fn, acc in (
            ("pagellm", lambda: run_pagellm(a.model, a.p, a.n, a.t, a.r), ours),
            ("llama.cpp", lambda: run_llama(a.llama_bench, path, a.p, a.n, a.t, a.r), theirs),
        ):
            res = fn()
            for k, v in res.items():
                acc.setdefault(k, []).append(v)
            print(f"round {i + 1} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in res.items()), file=sys.stderr)
    print(f"| model | test | threads | pagellm tok/s (median) | llama.cpp tok/s (median) | ratio |")
    print(f"|---|---|---|---|---|---|")
    for test in ours:
        m1, m2 = statistics.median(ours[test]), statistics.median(theirs[test])
        print(f"| {a.model} | {test} | {a.t} | {m1:.1f} | {m2:.1f} | {m1 / m2:.2f}x |")


if __name__ == "__main__":
    main()
