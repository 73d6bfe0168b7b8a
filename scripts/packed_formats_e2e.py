#!/usr/bin/env python3
"""The quantized checkpoint layouts as other tools write them load in pagellm and mean
what they say: smollm2-135m (BF16 via `pagellm convert --to hf`) is packed by
scripts/pack_reference.py, an independent packer written from AutoAWQ's, AutoGPTQ's and
compressed-tensors' own packing code, into every layout pagellm reads; each packed model
is evaluated against its float twin (the very weights the packed one encodes, in f32)
with `pagellm eval perplexity --base-model`. A correct reader leaves only the
activation rounding of the integer kernels (mean KL divergence ~1e-4); a wrong nibble
order, offset or transpose gives a KL divergence of order one. A deliberately broken
file (AWQ packed without its output interleaving) must be caught.

Usage: packed_formats_e2e.py --pagellm target/release/pagellm [--model smollm2-135m]
Needs numpy (installed by scripts/test.sh).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FORMATS = ["awq", "gptq", "gptq-act", "ct-w4-sym", "ct-w4-asym", "ct-w8a16", "ct-w8a8", "ct-fp8"]
# Mean KL divergence allowed between a packed model and its float twin: activation
# rounding only (8-bit activations per block of 32, or per token for W8A8).
MAX_KLD = {"ct-w8a8": 0.1}
DEFAULT_MAX_KLD = 0.01


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return r.stdout


def kld(pagellm, packed, float_dir, text):
    out = run([pagellm, "eval", "perplexity", "-m", packed, "--base-model", float_dir,
               "-f", text, "--ctx", "128", "--chunks", "3", "--json", "-", "-q"])
    r = json.loads(out)
    r = r[0] if isinstance(r, list) else r
    return r["kl"]["mean"]["mean"], r["kl"]["top1_agreement"]["mean"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    a = ap.parse_args()
    # A real code corpus present wherever Python is: the standard library.
    text = os.path.join(os.path.dirname(json.__file__), "decoder.py")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        run([a.pagellm, "convert", "--to", "hf", "--dtype", "bf16", a.model, src])
        failures = []
        for fmt in FORMATS + ["awq-broken"]:
            out = os.path.join(tmp, fmt)
            extra = ["--no-awq-order"] if fmt == "awq-broken" else []
            run([sys.executable, os.path.join(HERE, "pack_reference.py"), src, out,
                 fmt.replace("-broken", "")] + extra)
            k, top1 = kld(a.pagellm, os.path.join(out, "packed"), os.path.join(out, "float"), text)
            limit = MAX_KLD.get(fmt, DEFAULT_MAX_KLD)
            ok = k > 0.1 if fmt == "awq-broken" else k <= limit
            print(f"{fmt:12} mean KLD {k:.6f}  top-1 {top1:.4f}  "
                  f"{'ok' if ok else 'FAIL'} ({'>' if fmt == 'awq-broken' else '<='} "
                  f"{0.1 if fmt == 'awq-broken' else limit})")
            if not ok:
                failures.append(fmt)
            subprocess.run(["rm", "-rf", out])
        if failures:
            sys.exit(f"packed formats failed: {failures}")


if __name__ == "__main__":
    main()
