#!/usr/bin/env python3
"""Online serving benchmark: `pagellm serve` against llama.cpp's `llama-server`, one at a time.

For each model and each concurrency C, starts one server, measures it with pagellm's own
client `pagellm bench serve` (vLLM `bench serve` metrics: TTFT, TPOT, ITL, E2EL,
throughput), stops it, then does the same for the other engine. The two servers never run
at the same time; the engine that goes first alternates between concurrency levels and
rounds, so the noise of a shared machine falls on both alike. The workload is the random
dataset with prompts of exactly --input-len tokens (made with the model's own tokenizer:
both servers load the same GGUF, so token counts agree), --output-len tokens generated
with end-of-sequence ignored, --max-concurrency C, all requests sent at once
(--request-rate inf), and max(8, 2*C) prompts.

Both servers get the same threads and the same total KV cache. A request needs
CTX = input + output + 16 tokens; llama.cpp rounds each slot's context up to a multiple of
256 tokens (SLOT = 512 for CTX = 272), so the KV cache is C*SLOT tokens on both:
    pagellm serve      --threads T --max-model-len CTX --num-kv-blocks C*SLOT/16
    llama-server       -t T -tb T -np C -c C*SLOT     (C slots of SLOT tokens each)
llama-server keeps its defaults otherwise (continuous batching, per-slot prompt cache);
pagellm keeps its defaults otherwise (prefix caching, chunked prefill).

A second workload runs on pagellm only: a shared 512-token prefix (one prefix) plus 64
distinct tokens per prompt, 32 output tokens, concurrency 4, 32 prompts, once with prefix
caching on (the server default) and once with --no-enable-prefix-caching; the report gives
TTFT and throughput of both and their ratio.

Writes Markdown tables for BENCHMARKS.md (to --out, or stdout) with medians per cell over
--rounds, and keeps every raw `bench serve` JSON (vLLM field names) and server log under
--results-dir, plus summary.json with everything. Progress goes to stderr. Not run by CI.
Run it on an otherwise idle machine: llama.cpp's worker threads spin while waiting, so
other processes on the same cores slow llama-server far more than pagellm (seen: 3 s per
token with two compilers running on 2 cores, against ~0.1 s idle). The load average at the
start is printed in the report.

Usage:
    scripts/bench_serve_vs_llamacpp.py --llama-server PATH/TO/llama-server
        [--models smollm2-135m,qwen2.5-coder-1.5b] [--concurrency 1,4,16,64 | NAME=1,8 ...]
        [--rounds 3] [--threads 2] [--input-len 128] [--output-len 128]
        [--out serve.md] [--results-dir bench-results/] [--dry-run]
    scripts/bench_serve_vs_llamacpp.py --build-llama-server ~/llama-build ...
    scripts/bench_serve_vs_llamacpp.py --dry-run          # print the commands only

Defaults: --models smollm2-135m; concurrency per model smollm2-135m 1,4,16,64,
qwen2.5-coder-1.5b 1,8, anything else 1,4. pagellm is target/release/pagellm
(`cargo build --release -p pagellm`); the models come from `pagellm models pull NAME`.

Getting llama-server (the llama.cpp that llama-cpp-python 0.3.36 vendors, commit 0c1e570),
which is what --build-llama-server DIR does inside DIR (skipping steps already done):
    pip download --no-deps --no-binary=llama-cpp-python llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=ON
    cmake --build build -j2 --target llama-server
    # binary: llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server
-DLLAMA_BUILD_SERVER=ON is already the default for this standalone build, but a build
directory once configured with it OFF keeps OFF in CMakeCache.txt ("No rule to make target
'llama-server'"); naming it makes reusing the llama-bench build directory work. The build
tries to fetch the prebuilt web UI from Hugging Face; offline it warns and builds without
the UI, which the benchmark does not need (the server runs with --no-webui).
"""

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGELLM = os.path.join(ROOT, "target", "release", "pagellm")

LLAMA_CPP_PYTHON = "0.3.36"
ENGINES = ("pagellm", "llama-server")
DEFAULT_CONCURRENCY = {"smollm2-135m": [1, 4, 16, 64], "qwen2.5-coder-1.5b": [1, 8]}
FALLBACK_CONCURRENCY = [1, 4]
BLOCK = 16  # pagellm's KV block size in tokens (its --block-size default)
CTX_SLACK = 16  # extra tokens of context per request beyond input + output
LLAMA_CTX_PAD = 256  # llama.cpp pads each slot's context (n_ctx_seq) to a multiple of this


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def num_prompts(c: int, per_concurrency: int = 2, floor: int = 8) -> int:
    """Prompts sent at concurrency c: enough for every slot to be refilled at least once."""
    return max(floor, per_concurrency * c)


def ctx_per_request(input_len: int, output_len: int) -> int:
    return input_len + output_len + CTX_SLACK


def slot_ctx(ctx: int) -> int:
    """The context llama-server gives each slot when asked for ctx tokens per slot."""
    return math.ceil(ctx / LLAMA_CTX_PAD) * LLAMA_CTX_PAD


def kv_blocks(c: int, ctx: int) -> int:
    """pagellm KV blocks holding as many tokens as llama-server's C slots."""
    return math.ceil(c * slot_ctx(ctx) / BLOCK)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def q(cmd) -> str:
    # dry-run placeholders like "$GGUF_x" stay expandable by a shell
    return " ".join(f'"{x}"' if str(x).startswith("$GGUF_") else shlex.quote(str(x)) for x in cmd)


class Runner:
    """Runs commands and servers, or only prints them with --dry-run."""

    def __init__(self, dry_run: bool, results_dir: str, health_timeout: float):
        self.dry_run = dry_run
        self.results_dir = results_dir
        self.health_timeout = health_timeout

    def run(self, cmd, cwd=None, capture=False) -> str:
        where = f"(cd {shlex.quote(cwd)} && {q(cmd)})" if cwd else q(cmd)
        if self.dry_run:
            print(where)
            return ""
        log(f"$ {where}")
        out = subprocess.run([str(x) for x in cmd], cwd=cwd, check=True, text=True,
                             stdout=subprocess.PIPE if capture else None)
        return out.stdout if capture else ""

    def bench(self, cmd, json_path: str):
        """Runs one `pagellm bench serve`; returns its JSON, or None if it failed."""
        if self.dry_run:
            print(q(cmd))
            return None
        log(f"$ {q(cmd)}")
        p = subprocess.run([str(x) for x in cmd], text=True, capture_output=True)
        if p.returncode != 0:
            log(f"bench serve failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
            return None
        with open(json_path) as f:
            return json.load(f)

    def start_server(self, cmd, port: int, log_name: str):
        if self.dry_run:
            print(q(cmd) + " &")
            print(f"# wait for GET http://127.0.0.1:{port}/health -> 200")
            return None
        path = os.path.join(self.results_dir, log_name)
        log(f"$ {q(cmd)} > {path}")
        logf = open(path, "w")
        proc = subprocess.Popen([str(x) for x in cmd], stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        proc.log_file, proc.log_path = logf, path
        t0 = time.monotonic()
        url = f"http://127.0.0.1:{port}/health"
        while True:
            if proc.poll() is not None:
                logf.close()
                raise RuntimeError(f"server exited with {proc.returncode} while loading:\n{tail(path)}")
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass  # not listening yet, or 503 while the model loads
            if time.monotonic() - t0 > self.health_timeout:
                self.stop_server(proc)
                raise RuntimeError(f"server not healthy after {self.health_timeout:.0f} s:\n{tail(path)}")
            time.sleep(0.5)
        log(f"healthy after {time.monotonic() - t0:.1f} s")
        return proc

    def stop_server(self, proc) -> None:
        if self.dry_run:
            print("# stop the server: SIGTERM, SIGKILL after 30 s")
            return
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log("server ignored SIGTERM for 30 s; killing it")
                proc.kill()
                proc.wait()
        proc.log_file.close()


def tail(path: str, n: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def model_path(runner: Runner, pagellm: str, name: str) -> str:
    """The cached GGUF of a registry model (`pagellm models pull` prints it last)."""
    cmd = [pagellm, "models", "pull", name]
    if runner.dry_run:
        print(q(cmd) + f"   # GGUF path on the last stdout line -> $GGUF_{safe(name)}")
        return f"$GGUF_{safe(name)}"
    out = runner.run(cmd, capture=True)
    return out.strip().splitlines()[-1]


def safe(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def build_llama_server(runner: Runner, dest: str, jobs: int) -> str:
    dest = os.path.abspath(dest)
    src = os.path.join(dest, f"llama_cpp_python-{LLAMA_CPP_PYTHON}", "vendor", "llama.cpp")
    binary = os.path.join(src, "build", "bin", "llama-server")
    tarball = os.path.join(dest, f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz")
    if not runner.dry_run:
        os.makedirs(dest, exist_ok=True)
    if runner.dry_run or not os.path.exists(tarball):
        runner.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=llama-cpp-python",
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", dest])
    if runner.dry_run or not os.path.isdir(src):
        runner.run(["tar", "xzf", tarball], cwd=dest)
    runner.run(["cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON",
                "-DLLAMA_BUILD_SERVER=ON"], cwd=src)
    runner.run(["cmake", "--build", "build", f"-j{jobs}", "--target", "llama-server"], cwd=src)
    if not runner.dry_run and not os.access(binary, os.X_OK):
        sys.exit(f"build finished but {binary} is missing")
    return binary


def llama_server_flags(runner: Runner, binary: str) -> set:
    """Flag names llama-server's --help lists (all assumed present with --dry-run)."""
    if runner.dry_run:
        return {"--no-webui", "--alias", "-tb"}
    p = subprocess.run([binary, "--help"], text=True, capture_output=True)
    text = p.stdout + p.stderr
    return {tok.strip(",") for tok in text.split() if tok.startswith("-")}


def llama_server_version(binary: str) -> str:
    try:
        p = subprocess.run([binary, "--version"], text=True, capture_output=True, timeout=30)
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith("version")]
        return lines[0].strip() if lines else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def pagellm_serve_cmd(a, model: str, port: int, ctx: int, blocks: int, prefix_caching: bool = True) -> list:
    cmd = [a.pagellm, "serve", "--model", model, "--port", port, "--threads", a.threads,
           "--max-model-len", ctx, "--num-kv-blocks", blocks]
    if not prefix_caching:
        cmd.append("--no-enable-prefix-caching")
    return cmd


def llama_server_cmd(a, flags: set, gguf: str, model: str, port: int, c: int, ctx: int) -> list:
    cmd = [a.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", port, "-t", a.threads]
    if "-tb" in flags or "--threads-batch" in flags:
        cmd += ["-tb", a.threads]
    cmd += ["-np", c, "-c", c * slot_ctx(ctx)]
    if "--alias" in flags:
        cmd += ["--alias", model]  # so /v1/models and responses name the model like pagellm does
    if "--no-webui" in flags:
        cmd.append("--no-webui")
    return cmd + a.llama_server_arg


def bench_cmd(a, port: int, model: str, label: str, json_path: str, c: int, n: int, workload: dict) -> list:
    cmd = [a.pagellm, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--model", model,
           "--endpoint", "completions", "--tokenizer", model, "--ignore-eos",
           "--max-concurrency", c, "--num-prompts", n, "--request-rate", "inf", "--seed", a.seed,
           "--json", json_path, "--quiet", "--label", label]
    for k, v in workload.items():
        cmd += [f"--{k}", v]
    return cmd


def serve_and_bench(runner: Runner, server_cmd: list, port: int, log_name: str, bench: list, json_path: str):
    proc = runner.start_server(server_cmd, port, log_name)
    try:
        return runner.bench(bench, json_path)
    finally:
        runner.stop_server(proc)


def summarize(res) -> str:
    if res is None:
        return "failed"
    return (f"{res['output_throughput']:.1f} out tok/s, TTFT p50 {res['median_ttft_ms']:.0f} ms "
            f"p99 {res['p99_ttft_ms']:.0f} ms, TPOT p50 {res['median_tpot_ms']:.1f} ms, "
            f"{res['completed']} ok / {res['failed']} failed")


def parse_concurrency(items, models) -> dict:
    """Defaults per model, then `C1,C2` items for every model, then `NAME=C1,C2` items for NAME."""
    conc = {m: DEFAULT_CONCURRENCY.get(m, FALLBACK_CONCURRENCY) for m in models}
    parsed = []
    for item in items or []:
        name, _, lst = item.rpartition("=")
        parsed.append((name, [int(x) for x in lst.split(",") if x]))
    for name, values in parsed:
        if not name:
            conc = {m: values for m in models}
    for name, values in parsed:
        if name:
            conc[name] = values
    return conc


def median_of(runs, key):
    vals = [r[key] for r in runs if r is not None and r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, digits=1) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def ratio(x, y) -> str:
    return "–" if x is None or y is None or y == 0 else f"{x / y:.2f}x"


def done_failed(runs) -> str:
    ok = [r for r in runs if r is not None]
    if not ok:
        return f"error ({len(runs)} runs)"
    s = f"{sum(r['completed'] for r in ok)}/{sum(r['failed'] for r in ok)}"
    if len(ok) < len(runs):
        s += f" ({len(runs) - len(ok)} runs errored)"
    return s


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def nproc() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 0


def git_rev() -> str:
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True,
                              capture_output=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write_plots(a, conc, results) -> list:
    """One SVG per model: throughput against TTFT and TPOT, one line per engine (the
    first round's runs), drawn by `pagellm bench plot`. Returns (model, path) pairs."""
    plots = []
    for model in a.models:
        inputs = []
        for eng in a.engines:
            runs = [rs[0] for c in conc[model] if (rs := results.get((model, c, eng))) and rs[0]]
            if not runs:
                continue
            path = os.path.join(a.results_dir, f"sweep-{safe(model)}-{eng}.json")
            with open(path, "w") as f:
                json.dump({"sweep": "max_concurrency", "label": eng, "runs": runs}, f)
            inputs.append(path)
        if not inputs:
            continue
        out = os.path.join(a.results_dir, f"serve-{safe(model)}.svg")
        title = f"{model}: {a.input_len} in / {a.output_len} out, concurrency {','.join(map(str, conc[model]))}"
        subprocess.run([a.pagellm, "bench", "plot", "--out", out, "--title", title, *inputs], check=True)
        plots.append((model, out))
    return plots


def markdown(a, conc, results, prefix, json_paths, llama_version) -> str:
    rounds = a.rounds
    across = f"median over {rounds} rounds" if rounds > 1 else "a single round"
    out = []
    out.append("## Online serving: pagellm serve vs llama-server\n")
    out.append(f"- command: `{shlex.join(sys.argv)}`")
    out.append(f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
    out.append(f"- machine: {cpu_model()}, nproc {nproc()}, {platform.system()} {platform.release()}")
    out.append(f"- pagellm: git {git_rev()}; llama-server: {llama_version}")
    out.append(f"- client: `pagellm bench serve --endpoint completions --dataset random --input-len {a.input_len} "
               f"--output-len {a.output_len} --ignore-eos --request-rate inf --max-concurrency C "
               f"--num-prompts max(8, {a.prompts_per_concurrency}*C) --seed {a.seed}`; threads {a.threads}; "
               f"KV cache of C x {slot_ctx(ctx_per_request(a.input_len, a.output_len))} tokens on both servers")
    cells = "each cell is the median over rounds" if rounds > 1 else "one run per cell"
    out.append(f"- rounds: {rounds} ({cells}; completed/failed are summed over rounds)")
    out.append(f"- load average (1 min) when the run started: {a.load_at_start:.2f}\n")
    for model in a.models:
        out.append(f"### {model}\n")
        out.append("| concurrency | engine | output tok/s | p50 TTFT ms | p99 TTFT ms | p50 TPOT ms | p50 ITL ms "
                   "| completed/failed |")
        out.append("|---|---|---|---|---|---|---|---|")
        for c in conc[model]:
            for eng in a.engines:
                runs = results.get((model, c, eng), [])
                out.append(f"| {c} | {eng} | {fmt(median_of(runs, 'output_throughput'))} "
                           f"| {fmt(median_of(runs, 'median_ttft_ms'), 0)} | {fmt(median_of(runs, 'p99_ttft_ms'), 0)} "
                           f"| {fmt(median_of(runs, 'median_tpot_ms'))} | {fmt(median_of(runs, 'median_itl_ms'))} "
                           f"| {done_failed(runs)} |")
        out.append("")
        if set(ENGINES) <= set(a.engines):
            out.append("| concurrency | pagellm/llama-server output tok/s | p99 TTFT ratio | p50 TPOT ratio |")
            out.append("|---|---|---|---|")
            for c in conc[model]:
                p = results.get((model, c, "pagellm"), [])
                l = results.get((model, c, "llama-server"), [])
                out.append(f"| {c} | {ratio(median_of(p, 'output_throughput'), median_of(l, 'output_throughput'))} "
                           f"| {ratio(median_of(p, 'p99_ttft_ms'), median_of(l, 'p99_ttft_ms'))} "
                           f"| {ratio(median_of(p, 'median_tpot_ms'), median_of(l, 'median_tpot_ms'))} |")
            out.append("\nThroughput ratio above 1 = pagellm faster; latency ratios below 1 = pagellm lower.\n")
    if prefix:
        on, off = prefix.get("on", []), prefix.get("off", [])
        out.append(f"### Prefix caching (pagellm, {a.prefix_model})\n")
        out.append(f"`--dataset prefix-repetition --prefix-len {a.prefix_len} --input-len {a.prefix_input_len} "
                   f"--output-len {a.prefix_output_len} --num-prefixes 1 --max-concurrency {a.prefix_concurrency} "
                   f"--num-prompts {a.prefix_prompts}`, {across}.\n")
        out.append("| prefix caching | output tok/s | total tok/s | p50 TTFT ms | p99 TTFT ms | completed/failed |")
        out.append("|---|---|---|---|---|---|")
        for name, runs in (("on (default)", on), ("off (--no-enable-prefix-caching)", off)):
            out.append(f"| {name} | {fmt(median_of(runs, 'output_throughput'))} "
                       f"| {fmt(median_of(runs, 'total_token_throughput'))} "
                       f"| {fmt(median_of(runs, 'median_ttft_ms'), 0)} | {fmt(median_of(runs, 'p99_ttft_ms'), 0)} "
                       f"| {done_failed(runs)} |")
        out.append(f"\nOn/off: output tok/s {ratio(median_of(on, 'output_throughput'), median_of(off, 'output_throughput'))}, "
                   f"p50 TTFT {ratio(median_of(on, 'median_ttft_ms'), median_of(off, 'median_ttft_ms'))}, "
                   f"p99 TTFT {ratio(median_of(on, 'p99_ttft_ms'), median_of(off, 'p99_ttft_ms'))}.\n")
    out.append(f"Raw `pagellm bench serve` JSON (vLLM field names), server logs and summary.json: "
               f"`{a.results_dir}` ({len(json_paths)} runs).")
    out.append("<details><summary>files</summary>\n")
    out.extend(f"- `{p}`" for p in json_paths)
    out.append("\n</details>\n")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--llama-server", help="an existing llama-server binary")
    src.add_argument("--build-llama-server", metavar="DIR",
                     help="download llama-cpp-python's llama.cpp into DIR, build llama-server there, use it")
    ap.add_argument("--build-jobs", type=int, default=2, help="cmake --build -j for --build-llama-server")
    ap.add_argument("--pagellm", default=PAGELLM, help="the pagellm binary (default: target/release/pagellm)")
    ap.add_argument("--models", default="smollm2-135m", help="comma-separated registry names")
    ap.add_argument("--concurrency", action="append", metavar="[NAME=]C1,C2,...",
                    help="concurrency levels for every model, or for model NAME; repeatable "
                         "(default: smollm2-135m 1,4,16,64; qwen2.5-coder-1.5b 1,8; others 1,4)")
    ap.add_argument("--prompts-per-concurrency", type=int, default=2,
                    help="prompts per run = max(8, this * concurrency)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1, help="repeat everything; report medians per cell")
    ap.add_argument("--engines", default=",".join(ENGINES), help="subset of pagellm,llama-server")
    ap.add_argument("--llama-server-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for llama-server (repeatable), e.g. --llama-server-arg=--cache-ram "
                         "--llama-server-arg=0")
    ap.add_argument("--no-prefix", action="store_true", help="skip the prefix-caching workload")
    ap.add_argument("--prefix-model", help="model of the prefix workload (default: the first of --models)")
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--prefix-input-len", type=int, default=64)
    ap.add_argument("--prefix-output-len", type=int, default=32)
    ap.add_argument("--prefix-concurrency", type=int, default=4)
    ap.add_argument("--prefix-prompts", type=int, default=32)
    ap.add_argument("--health-timeout", type=float, default=900, help="seconds to wait for GET /health 200")
    ap.add_argument("--results-dir", default="bench-results/")
    ap.add_argument("--out", help="write the Markdown here (default: stdout)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    a = ap.parse_args()

    a.models = [m for m in a.models.split(",") if m]
    a.engines = [e for e in a.engines.split(",") if e]
    for e in a.engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e!r}; use {','.join(ENGINES)}")
    a.prefix_model = a.prefix_model or a.models[0]
    conc = parse_concurrency(a.concurrency, a.models)
    runner = Runner(a.dry_run, a.results_dir, a.health_timeout)
    a.load_at_start = os.getloadavg()[0]
    if not a.dry_run and a.load_at_start > 0.5:
        log(f"warning: load average {a.load_at_start:.2f}: other processes use the CPU; results will be "
            f"noisy, and llama.cpp's spinning worker threads slow down far more than pagellm under contention")
    if not a.dry_run:
        os.makedirs(a.results_dir, exist_ok=True)
        if not os.access(a.pagellm, os.X_OK):
            sys.exit(f"{a.pagellm} not found: cargo build --release -p pagellm")

    flags, llama_version = set(), "not run"
    if "llama-server" in a.engines:
        if a.build_llama_server:
            a.llama_server = build_llama_server(runner, a.build_llama_server, a.build_jobs)
        elif not a.llama_server:
            if not a.dry_run:
                ap.error("give --llama-server PATH or --build-llama-server DIR (or --engines pagellm)")
            a.llama_server = "llama-server"
        flags = llama_server_flags(runner, a.llama_server)
        if not a.dry_run:
            llama_version = llama_server_version(a.llama_server)
            missing = [f for f in ("-np", "-c", "-t", "--port", "--host", "-m") if f not in flags]
            if missing:
                log(f"warning: llama-server --help does not list {missing}")
            for f in ("--no-webui", "--alias", "-tb"):
                if f not in flags:
                    log(f"llama-server has no {f}; leaving it out")

    # llama-server loads the GGUF that pagellm caches (pagellm serve takes the registry name).
    ggufs = {m: model_path(runner, a.pagellm, m) for m in a.models} if "llama-server" in a.engines else {}
    ctx = ctx_per_request(a.input_len, a.output_len)
    random_workload = {"dataset": "random", "input-len": a.input_len, "output-len": a.output_len}
    results, prefix, json_paths = {}, {}, []

    for rnd in range(a.rounds):
        if a.dry_run:
            print(f"\n# ---- round {rnd + 1}/{a.rounds} ----")
        for mi, model in enumerate(a.models):
            for ci, c in enumerate(conc[model]):
                n = num_prompts(c, a.prompts_per_concurrency)
                order = list(a.engines) if (rnd + mi + ci) % 2 == 0 else list(reversed(a.engines))
                for eng in order:
                    if a.dry_run:
                        print(f"\n# {model}, concurrency {c}, {n} prompts, {eng}")
                    tag = f"{safe(model)}-c{c}-{eng}-r{rnd + 1}"
                    json_path = os.path.join(a.results_dir, f"serve-{tag}.json")
                    port = free_port()
                    if eng == "pagellm":
                        server = pagellm_serve_cmd(a, model, port, ctx, kv_blocks(c, ctx))
                    else:
                        server = llama_server_cmd(a, flags, ggufs[model], model, port, c, ctx)
                    bench = bench_cmd(a, port, model, eng, json_path, c, n, random_workload)
                    try:
                        res = serve_and_bench(runner, server, port, f"server-{tag}.log", bench, json_path)
                    except RuntimeError as e:
                        log(f"{eng} {model} c={c}: {e}")
                        res = None
                    results.setdefault((model, c, eng), []).append(res)
                    if res is not None:
                        json_paths.append(json_path)
                    if not a.dry_run:
                        log(f"round {rnd + 1} {model} c={c} {eng}: {summarize(res)}")

        if not a.no_prefix and "pagellm" in a.engines:
            pctx = ctx_per_request(a.prefix_len + a.prefix_input_len, a.prefix_output_len)
            blocks = kv_blocks(a.prefix_concurrency, pctx)
            workload = {"dataset": "prefix-repetition", "prefix-len": a.prefix_len, "input-len": a.prefix_input_len,
                        "output-len": a.prefix_output_len, "num-prefixes": 1}
            modes = ["on", "off"] if rnd % 2 == 0 else ["off", "on"]
            for mode in modes:
                if a.dry_run:
                    print(f"\n# prefix workload, {a.prefix_model}, prefix caching {mode}")
                tag = f"prefix-{safe(a.prefix_model)}-caching-{mode}-r{rnd + 1}"
                json_path = os.path.join(a.results_dir, f"serve-{tag}.json")
                port = free_port()
                server = pagellm_serve_cmd(a, a.prefix_model, port, pctx, blocks, prefix_caching=(mode == "on"))
                bench = bench_cmd(a, port, a.prefix_model, f"pagellm-prefix-caching-{mode}", json_path,
                                  a.prefix_concurrency, a.prefix_prompts, workload)
                try:
                    res = serve_and_bench(runner, server, port, f"server-{tag}.log", bench, json_path)
                except RuntimeError as e:
                    log(f"prefix workload, caching {mode}: {e}")
                    res = None
                prefix.setdefault(mode, []).append(res)
                if res is not None:
                    json_paths.append(json_path)
                if not a.dry_run:
                    log(f"round {rnd + 1} prefix caching {mode}: {summarize(res)}")

    if a.dry_run:
        return
    with open(os.path.join(a.results_dir, "summary.json"), "w") as f:
        json.dump({
            "argv": sys.argv, "cpu": cpu_model(), "nproc": nproc(), "pagellm_git": git_rev(),
            "llama_server_version": llama_version,
            "runs": [{"model": m, "max_concurrency": c, "engine": e, "round": i + 1, "result": r}
                     for (m, c, e), rs in results.items() for i, r in enumerate(rs)],
            "prefix": [{"prefix_caching": mode, "round": i + 1, "result": r}
                       for mode, rs in prefix.items() for i, r in enumerate(rs)],
        }, f, indent=1)
    plots = write_plots(a, conc, results)
    md = markdown(a, conc, results, prefix, json_paths, llama_version)
    md += "".join(f"\nPlot ({m}): `{p}`" for m, p in plots)
    if a.out:
        with open(a.out, "w") as f:
            f.write(md + "\n")
        log(f"wrote {a.out}")
    else:
        print(md)


if __name__ == "__main__":
    main()
