#!/usr/bin/env bash
# The whole test suite. Builds pagellm, pulls the models the tests run on into the model
# cache ($PAGELLM_HOME, default ~/.cache/pagellm; a no-op when present), then runs every
# test of the workspace and the OpenAI SDK conformance test against `pagellm serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
# What the tests run against besides the workspace: the official OpenAI SDK, a real
# redis-server (the gateway's shared rate limits), and Debian's chromium driven by
# playwright (the dashboard). numpy for the independent packer of the quantized
# checkpoint layouts, jsonschema to validate structured outputs.
PIP_PACKAGES="openai numpy jsonschema playwright"
python3 -m pip install --quiet --disable-pip-version-check $PIP_PACKAGES \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages $PIP_PACKAGES
if ! command -v redis-server >/dev/null || ! command -v chromium >/dev/null; then
    apt-get update -qq && apt-get install -y -qq redis-server chromium >/dev/null
fi
# One build for everything: `cargo test --release` also builds the `pagellm` binary
# (target/release/pagellm) that the pulls and the scripts below run; a separate
# `cargo build --release` would compile the whole graph a second time with the
# release profile's settings.
cargo test --workspace --release --no-run
for m in smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
    target/release/pagellm models pull "$m"
done
cargo test --workspace --release
# AutoAWQ, GPTQ and compressed-tensors checkpoints packed by an independent script
# (scripts/pack_reference.py) load and equal their dequantized weights.
python3 scripts/packed_formats_e2e.py --pagellm target/release/pagellm
# The OpenAI API as the official Python SDK sees it (pip install openai).
python3 scripts/openai_conformance.py --pagellm target/release/pagellm --model smollm2-135m
# Structured outputs through the SDK: 22 JSON schemas, regexes, choices and a grammar at
# two temperatures, every reply validated; bad constraints and unsupported fields refused.
python3 scripts/structured_e2e.py --pagellm target/release/pagellm \
    --model smollm2-135m --model qwen2.5-coder-0.5b
# Tool calling through the SDK: required and named calls (streamed and not) whose
# arguments validate, auto and none, a round trip through a tool result.
python3 scripts/tools_e2e.py --pagellm target/release/pagellm \
    --model qwen2.5-coder-0.5b --model qwen2.5-coder-1.5b
# The dashboard in headless chromium: no console errors, a streamed chat reply, and the
# block map, request table and charts following a `pagellm bench serve` load; then the
# gateway's twin page: replicas, their health and the routing decisions under load.
python3 scripts/dashboard_e2e.py --pagellm target/release/pagellm --model smollm2-135m
# The gateway in front of real replicas: many models through one URL with the SDK, and a
# replica killed under load (small version of the benchmark in BENCHMARKS.md).
python3 scripts/gateway_e2e.py --pagellm target/release/pagellm
