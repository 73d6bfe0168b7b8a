#!/usr/bin/env bash
# The whole test suite. Builds pagellm, pulls the models the tests run on into the model
# cache ($PAGELLM_HOME, default ~/.cache/pagellm; a no-op when present), then runs every
# test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
for m in smollm2-135m qwen2.5-coder-0.5b; do
    cargo run --release --quiet -p pagellm -- models pull "$m"
done
cargo test --workspace --release
