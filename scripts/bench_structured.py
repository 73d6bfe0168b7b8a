#!/usr/bin/env python3
"""What structured outputs cost the batch: time per output token with and without them.

Starts `pagellm serve` and alternates two loads of 16 concurrent streamed chat requests:
  plain - 16 unconstrained requests (128 tokens each, end-of-text ignored);
  mixed - 8 of those plus 8 that must follow a JSON schema (an array of 12 records,
          about 150 tokens).
TPOT per request is measured by the client over its first 100 streamed tokens, while
all 16 requests of a load are running: (time of token 101 - time of token 1) / 100. Prints, per round and as medians over the rounds: the plain requests' TPOT
in each load, their ratio (mixed / plain: what constrained neighbours cost the others),
and the constrained requests' TPOT against the plain ones of the same load.

Usage:
    python3 scripts/bench_structured.py --pagellm target/release/pagellm --model smollm2-135m --rounds 3
"""

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import openai

from openai_conformance import API_KEY, Server

WINDOW = 100
RECORDS = {
    "type": "array", "minItems": 12, "maxItems": 12,
    "items": {"type": "object", "additionalProperties": False, "required": ["id", "name", "score"],
              "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999},
                             "name": {"type": "string", "maxLength": 10},
                             "score": {"type": "integer", "minimum": 0, "maximum": 100}}},
}


def one(client, model, i, constrained):
    args = dict(model=model, stream=True, stream_options={"include_usage": True},
                temperature=0.8, seed=i, messages=[{"role": "user", "content": f"Tell me about topic number {i}."}])
    if constrained:
        args.update(max_tokens=400, response_format={"type": "json_schema",
                                                     "json_schema": {"name": "records", "schema": RECORDS}})
    else:
        args.update(max_tokens=128, extra_body={"ignore_eos": True})
    times = []
    for ch in client.chat.completions.create(**args):
        if ch.choices and ch.choices[0].delta.content:
            times.append(time.perf_counter())
    k = min(WINDOW, len(times) - 1)
    return constrained, (times[k] - times[0]) / k * 1000, len(times)


def load(client, model, n_constrained):
    with ThreadPoolExecutor(16) as ex:
        res = list(ex.map(lambda i: one(client, model, i, i < n_constrained), range(16)))
    plain = statistics.median(t for c, t, _ in res if not c)
    cons = [t for c, t, _ in res if c]
    return plain, (statistics.median(cons) if cons else None), [n for c, _, n in res if c]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    server = Server(a.pagellm, a.model, limits=("--max-num-seqs", "16"))
    try:
        base = server.wait_ready()
        client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=600)
        load(client, a.model, 8)  # warm-up: compiles the schema once, fills caches
        plain_a, plain_b, cons_b = [], [], []
        for r in range(a.rounds):
            pa, _, _ = load(client, a.model, 0)
            pb, cb, ns = load(client, a.model, 8)
            plain_a.append(pa)
            plain_b.append(pb)
            cons_b.append(cb)
            print(f"round {r + 1}: plain load TPOT {pa:.2f} ms; mixed load plain {pb:.2f} ms, "
                  f"constrained {cb:.2f} ms ({min(ns)}-{max(ns)} chunks)")
        ma, mb, mc = (statistics.median(x) for x in (plain_a, plain_b, cons_b))
        print(f"\n| model | plain requests' TPOT, all plain | plain requests' TPOT, half constrained | ratio "
              f"| constrained requests' TPOT | constrained / plain |")
        print("|---|---|---|---|---|---|")
        print(f"| {a.model} | {ma:.2f} ms | {mb:.2f} ms | {mb / ma:.3f} | {mc:.2f} ms | {mc / mb:.3f} |")
    finally:
        server.proc.terminate()
        server.proc.wait(30)


if __name__ == "__main__":
    main()
