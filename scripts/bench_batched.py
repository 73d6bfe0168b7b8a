#!/usr/bin/env python3
"""Batched throughput of pagellm against llama.cpp's batched path, in one run.

For each round, runs `pagellm bench throughput` and llama.cpp's `llama-batched-bench`
on the same model and threads with N parallel sequences of P prompt tokens and G
generated tokens (all prompts submitted at once, end-of-generation ignored), for each
N in --parallel (1 = single stream). Reports per-engine medians over rounds of:
output tokens/s = N*G / total time (prefill included), total tokens/s, and
pagellm's batched/single-stream ratio. Rounds alternate the engines so the noise of a
shared machine falls on both alike.

Usage:
    scripts/bench_batched.py --batched-bench PATH/TO/llama-batched-bench [--rounds 3]
        [--model smollm2-135m] [-p 128] [-g 128] [--parallel 1,64] [-t 2] [--json FILE]

Getting llama-batched-bench (the llama.cpp that llama-cpp-python 0.3.36 vendors):
    pip download --no-deps --no-binary=llama-cpp-python llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
    cmake --build build -j2 --target llama-batched-bench
"""

import argparse
import json
import statistics
import subprocess
import tempfile

from bench_vs_llamacpp import PAGELLM, model_path


def run_pagellm(model: str, n: int, p: int, g: int, t: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(
            [PAGELLM, "bench", "throughput", "-m", model, "-t", str(t), "--num-prompts", str(n),
             "--input-len", str(p), "--output-len", str(g), "--max-num-seqs", str(max(n, 1)),
             "--quiet", "--json", f.name],
            check=True, capture_output=True, text=True,
        )
        r = json.load(open(f.name))
    return {"output_tps": r["output_tokens_per_s"], "total_tps": r["total_tokens_per_s"]}


def run_llama(bench: str, path: str, ns: list, p: int, g: int, t: int) -> dict:
    ctx = max(ns) * (p + g) + 64
    out = subprocess.run(
        [bench, "-m", path, "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(p), "-ntg", str(g),
         "-npl", ",".join(map(str, ns)), "-t", str(t), "--output-format", "jsonl"],
        check=True, capture_output=True, text=True,
    ).stdout
    res = {}
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        n = row["pl"]
        res[n] = {"output_tps": n * row["tg"] / row["t"], "total_tps": row["speed"]}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batched-bench", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-g", type=int, default=128)
    ap.add_argument("--parallel", default="1,64")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    ns = [int(x) for x in a.parallel.split(",")]
    path = model_path(a.model)
    runs = {("pagellm", n): [] for n in ns} | {("llama.cpp", n): [] for n in ns}
    for r in range(a.rounds):
        for n in ns:
            res = run_pagellm(a.model, n, a.p, a.g, a.t)
            runs[("pagellm", n)].append(res)
            print(f"round {r + 1} pagellm   N={n:3}: {res['output_tps']:8.2f} output tok/s", flush=True)
        lres = run_llama(a.batched_bench, path, ns, a.p, a.g, a.t)
        for n in ns:
            runs[("llama.cpp", n)].append(lres[n])
            print(f"round {r + 1} llama.cpp N={n:3}: {lres[n]['output_tps']:8.2f} output tok/s", flush=True)

    def med(engine, n, key):
        return statistics.median(x[key] for x in runs[(engine, n)])

    print()
    print(f"{a.model}, {a.t} threads, {a.p} prompt + {a.g} generated tokens per sequence, "
          f"median of {a.rounds} rounds")
    print()
    print("| parallel sequences | pagellm output tok/s | llama.cpp output tok/s | pagellm / llama.cpp | pagellm total tok/s | llama.cpp total tok/s |")
    print("|---|---|---|---|---|---|")
    for n in ns:
        po, lo = med("pagellm", n, "output_tps"), med("llama.cpp", n, "output_tps")
        print(f"| {n} | {po:.1f} | {lo:.1f} | {po / lo:.2f}× | {med('pagellm', n, 'total_tps'):.1f} | {med('llama.cpp', n, 'total_tps'):.1f} |")
    if 1 in ns:
        single = med("pagellm", 1, "output_tps")
        for n in ns:
            if n != 1:
                print(f"\npagellm batched (N={n}) / single stream: {med('pagellm', n, 'output_tps') / single:.2f}×")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{e}/{n}": v for (e, n), v in runs.items()}, f, indent=1)


if __name__ == "__main__":
    main()
