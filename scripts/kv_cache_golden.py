#!/usr/bin/env python3
"""Greedy outputs of the golden prompts (tests/golden/generate_<model>.json) with each KV
cache type: how many prompts give the f16 cache's tokens, and how many llama.cpp's.

Usage: kv_cache_golden.py --pagellm target/release/pagellm [--model M ...]
       [--dtypes f16,fp8,int8]
"""
import argparse
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def generate(pagellm, model, prompt, n, dtype):
    r = subprocess.run([pagellm, "generate", "-m", model, "-p", prompt, "-n", str(n),
                        "--temperature", "0", "--ignore-eos", "--kv-cache-dtype", dtype],
                       capture_output=True, text=True, check=True)
    # `generate` ends its output with a newline.
    return r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--model", action="append")
    ap.add_argument("--dtypes", default="f16,fp8,int8")
    a = ap.parse_args()
    dtypes = a.dtypes.split(",")
    print("| model | KV cache | same text as f16 | same text as llama.cpp |")
    print("|---|---|---|---|")
    for model in a.model or ["smollm2-135m", "qwen2.5-coder-0.5b"]:
        g = json.load(open(os.path.join(ROOT, "tests", "golden", f"generate_{model}.json")))
        n = g["n_generate"]
        outs = {d: [generate(a.pagellm, model, p["prompt"], n, d) for p in g["prompts"]]
                for d in dtypes}
        for d in dtypes:
            same_f16 = sum(x == y for x, y in zip(outs[d], outs[dtypes[0]]))
            same_ref = sum(x == p["generated_text"] for x, p in zip(outs[d], g["prompts"]))
            total = len(g["prompts"])
            print(f"| {model} | {d} | {same_f16}/{total} | {same_ref}/{total} |")


if __name__ == "__main__":
    main()
