#!/usr/bin/env python3
"""Run vLLM's own OpenAI-server tests against `pagellm serve`.

vLLM's test suite (tests/entrypoints/...) exercises its OpenAI-compatible server
through the openai SDK and plain HTTP. This script runs the model-agnostic part of
it against pagellm, to measure how closely pagellm's API follows vLLM's:

  1. downloads vLLM's source distribution from PyPI (cached under
     ~/.cache/pagellm/vllm-tests/) and extracts the selected test files;
  2. applies SUBSTITUTIONS: textual edits of model-specific strings only (an
     expected token that depends on the model, ...), each with its reason;
  3. runs pytest with scripts/vllm_compat/ first on the path: its tests/utils.py
     makes RemoteOpenAIServer start `pagellm serve`, and its small `vllm` package
     provides the helpers the tests import (a tokenizer built from the served GGUF,
     ...). Which pagellm model stands for each checkpoint a test names is in
     vllm_compat/pagellm_compat.py;
  4. prints passed / failed / skipped per file and each failing test with the
     first line of its failure.

Out of scope, and so not selected: LoRA, multimodal, prompt embeddings, the
Responses API, harmony, reasoning parsers, tensorizer, beam-search internals and
unit tests of vLLM's own Python classes (DESELECTED lists each with its reason).

Usage:
    python3 scripts/vllm_openai_tests.py --pagellm target/release/pagellm [--keep DIR]
        [-k EXPR] [--timeout SECONDS]

The exit code is 0 when every failing test is listed in EXPECTED_FAILURES, 1
otherwise. --keep DIR keeps the assembled test tree, the server logs and the
JUnit report in DIR (a temporary directory is used and removed otherwise).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

VLLM_VERSION = "0.34.0"
PYPI_JSON = f"https://pypi.org/pypi/vllm/{VLLM_VERSION}/json"
PYPI_PROJECT_JSON = "https://pypi.org/pypi/vllm/json"
CACHE_DIR = Path.home() / ".cache" / "pagellm" / "vllm-tests"
COMPAT_DIR = Path(__file__).resolve().parent / "vllm_compat"

PIP_PACKAGES = [
    "pytest", "pytest-asyncio", "pytest-timeout", "openai", "requests", "regex",
    "jsonschema", "transformers", "tokenizers", "gguf", "numpy", "prometheus-client",
    "pybase64",
]

# Test files run, relative to the sdist's tests/ directory.
SELECTED_FILES = [
    "entrypoints/openai/completion/test_completion.py",
    "entrypoints/openai/completion/test_prompt_validation.py",
    "entrypoints/openai/completion/test_token_in_token_out.py",
    "entrypoints/openai/chat_completion/test_chat.py",
    "entrypoints/openai/chat_completion/test_chat_completion.py",
    "entrypoints/openai/chat_completion/test_chat_echo.py",
    "entrypoints/openai/chat_completion/test_chat_logit_bias_validation.py",
    "entrypoints/openai/chat_completion/test_logprob_token_ids.py",
    "entrypoints/openai/chat_completion/test_enable_force_include_usage.py",
    "entrypoints/openai/test_return_token_ids.py",
    "entrypoints/openai/test_return_tokens_as_ids.py",
    "entrypoints/openai/test_chunked_prompt.py",
    "entrypoints/openai/models/test_models.py",
    "entrypoints/serve/tokenize/test_tokenization.py",
    "entrypoints/serve/instrumentator/test_metrics.py",
]
# Support files extracted along with them (fixtures, package markers).
SUPPORT_FILES = [
    "entrypoints/__init__.py",
    "entrypoints/conftest.py",
    "entrypoints/openai/__init__.py",
    "entrypoints/openai/completion/__init__.py",
    "entrypoints/openai/chat_completion/__init__.py",
    "entrypoints/openai/models/__init__.py",
]
# Files of the same directories left out on purpose (they test vLLM's Python
# internals with mocks, or features out of scope), for the record:
#   chat_completion/test_chat_error.py, completion/test_completion_error.py,
#   test_stop_token_ids.py, chat_completion/test_non_object_body_validation.py,
#   completion/test_completion_text_offset.py, completion/test_stream_frame_template.py:
#     unit tests of vLLM's serving classes, no server;
#   chat_completion/test_batched_chat_completions.py: imports vLLM's serving
#     internals (test_serving_chat) at module level;
#   *_with_prompt_embeds.py, test_lora_resolvers.py, test_tensorizer_entrypoint.py,
#   responses/, parser/ (harmony), test_include_reasoning.py, test_thinking_*,
#   test_reasoning_enable_thinking.py, test_openai_schema.py (multimodal model).

# Deselected tests: node id prefix (relative to the tests/ dir) -> reason.
DESELECTED = {
    # Unit tests of vLLM's Python request classes, not of the HTTP API.
    "entrypoints/openai/completion/test_completion.py::test_completion_request_":
        "unit test of vLLM's CompletionRequest.to_sampling_params",
    "entrypoints/openai/chat_completion/test_chat.py::test_chat_completion_request_":
        "unit test of vLLM's ChatCompletionRequest",
    "entrypoints/openai/chat_completion/test_chat.py::test_null_top_logprobs_is_same_as_omitted":
        "unit test of vLLM's ChatCompletionRequest",
    "entrypoints/openai/chat_completion/test_logprob_token_ids.py::test_chat_request_":
        "unit test of vLLM's ChatCompletionRequest",
    "entrypoints/openai/chat_completion/test_logprob_token_ids.py::test_completion_request_":
        "unit test of vLLM's CompletionRequest",
    "entrypoints/openai/chat_completion/test_logprob_token_ids.py::test_completion_rejects_":
        "unit test of vLLM's CompletionRequest",
    "entrypoints/openai/chat_completion/test_logprob_token_ids.py::test_requests_reject_":
        "unit test of vLLM's request classes",
    "entrypoints/openai/test_return_tokens_as_ids.py::test_responses_api_":
        "Responses API",
    # Prompt embeddings: torch tensors and vLLM's loader.
    "entrypoints/openai/completion/test_prompt_validation.py::test_load_prompt_embeds":
        "prompt embeddings",
    "entrypoints/openai/completion/test_prompt_validation.py::test_disable_prompt_embeds":
        "prompt embeddings",
    # LoRA: pagellm serves no adapters.
    "entrypoints/openai/models/test_models.py::test_check_models":
        "lists the LoRA adapter next to the base model",
    # The metrics test's batch variant runs vLLM's own `run_batch` CLI.
    "entrypoints/serve/instrumentator/test_metrics.py::test_metrics_exist_run_batch":
        "vLLM's run_batch command",
}
# Deselected by -k keyword, with reasons.
DESELECTED_KEYWORDS = {
    "zephyr-lora": "requests addressed to a LoRA adapter",
    "multimodal": "multimodal model (SmolVLM) in the metrics tests",
}

# Textual substitutions applied to the extracted files: (file, old, new, why).
# Only model names and model-specific strings may be changed.
SUBSTITUTIONS: list[tuple[str, str, str, str]] = [
]

# Failing test id -> reason; a failure listed here does not fail the run.
EXPECTED_FAILURES: dict[str, str] = {
    'entrypoints/serve/instrumentator/test_metrics.py::test_metrics_counts[-text]':
        'model-specific and random: the requests sample at temperature 1 without ignore_eos, and the test expects each to generate all 10 tokens; when the stand-in model samples its end token early (one request stopped after 2 in one run), vllm:iteration_tokens_total_sum is short by the tokens not generated (it stays equal to the prompt plus generation tokens reported)',
    'entrypoints/serve/instrumentator/test_metrics.py::test_metrics_counts[--enable-chunked-prefill-text]':
        'model-specific and random: the requests sample at temperature 1 without ignore_eos, and the test expects each to generate all 10 tokens; when the stand-in model samples its end token early (one request stopped after 2 in one run), vllm:iteration_tokens_total_sum is short by the tokens not generated (it stays equal to the prompt plus generation tokens reported)',
    'entrypoints/serve/instrumentator/test_metrics.py::test_metrics_counts[--show-hidden-metrics-for-version=0.33-text]':
        'model-specific and random: the requests sample at temperature 1 without ignore_eos, and the test expects each to generate all 10 tokens; when the stand-in model samples its end token early (one request stopped after 2 in one run), vllm:iteration_tokens_total_sum is short by the tokens not generated (it stays equal to the prompt plus generation tokens reported)',
    'entrypoints/openai/chat_completion/test_chat.py::test_structured_outputs_regex_chat':
        'model-specific and random: the stand-in smollm2-135m, sampling at the default temperature, sometimes repeats the same address when asked for a different one (the regex itself is always matched)',
    'entrypoints/openai/test_return_token_ids.py::test_comparison_with_prompt_logprobs_and_logprobs':
        'model-specific: the stand-in model (qwen2.5-coder-0.5b for Qwen3-0.6B) ends its reply at once, and the test needs reply text',
    'entrypoints/openai/chat_completion/test_chat.py::test_more_than_one_prompt_logprobs_chat[HuggingFaceH4/zephyr-7b-beta]':
        "model-specific: asserts the 4th prompt token is zephyr's most likely one (a map of 1 entry); under the stand-in model's chat template it is not",
    'entrypoints/openai/completion/test_completion.py::test_batch_completions[Qwen/Qwen3-0.6B]':
        'beam search (use_beam_search) is not supported',
    'entrypoints/openai/chat_completion/test_chat.py::test_single_chat_session[HuggingFaceH4/zephyr-7b-beta]':
        "model-specific: asserts the usage of zephyr-7b's prompt (37 tokens); the stand-in model's template makes another length",
    'entrypoints/openai/chat_completion/test_chat.py::test_response_format_json_object':
        'the stand-in model (qwen2.5-coder-0.5b for Qwen3-0.6B) gives a different, valid answer than the one the test expects',
    'entrypoints/openai/chat_completion/test_chat.py::test_response_format_json_schema':
        'the stand-in model (qwen2.5-coder-0.5b for Qwen3-0.6B) gives a different, valid answer than the one the test expects',
    'entrypoints/openai/chat_completion/test_chat.py::test_complex_message_content':
        'the stand-in model (smollm2-135m for zephyr-7b) does not answer the arithmetic question',
    'entrypoints/openai/test_return_token_ids.py::test_chat_completion_with_tool_use':
        "model-specific: checks the reply's raw tokens for Qwen3's `<tool_call>` tags; the stand-in model (qwen2.5-coder-0.5b) writes the call as bare JSON, which pagellm parses as a call all the same",
    'entrypoints/openai/chat_completion/test_chat.py::test_structured_outputs_choice_chat':
        'model-specific and random: asked at temperature 0.7 to pick another choice, the stand-in smollm2-135m may pick the same one (the choice itself is always one of the list)',
    'entrypoints/openai/chat_completion/test_chat.py::test_structured_outputs_json_chat':
        'model-specific and random: sampling at temperature 1, the stand-in smollm2-135m may write one string until max_completion_tokens (1000) runs out, so the reply is a valid but unfinished JSON prefix',
}


def pip_install(packages: list[str]) -> None:
    base = [sys.executable, "-m", "pip", "install", "--quiet", *packages]
    if subprocess.run(base).returncode != 0:
        subprocess.run(base + ["--break-system-packages"], check=True)


def sdist_tarball() -> Path:
    """vLLM's source distribution, downloaded once into CACHE_DIR."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tarball = CACHE_DIR / f"vllm-{VLLM_VERSION}.tar.gz"
    if tarball.exists():
        return tarball
    try:
        json_url = PYPI_JSON
        files = fetch_json(json_url)["urls"]
    except urllib.error.HTTPError as err:
        if err.code != 404:
            raise
        # Some PyPI mirrors serve only the project document, with every release.
        json_url = PYPI_PROJECT_JSON
        files = fetch_json(json_url)["releases"][VLLM_VERSION]
    sdist = next(u for u in files if u["packagetype"] == "sdist")
    # The file URL may be relative to the JSON document; urljoin handles both.
    url = urllib.parse.urljoin(json_url, sdist["url"])
    print(f"downloading {url}", flush=True)
    part = tarball.with_suffix(".part")
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=600) as resp, open(part, "wb") as out:
        while chunk := resp.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    expected = sdist.get("digests", {}).get("sha256")
    if expected and digest.hexdigest() != expected:
        part.unlink()
        raise SystemExit(f"sha256 mismatch for {url}")
    part.rename(tarball)
    return tarball


def fetch_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.load(resp)


def extract_tests(tarball: Path, dest: Path) -> None:
    """Extracts SELECTED_FILES and SUPPORT_FILES into dest/tests/."""
    wanted = {f"tests/{f}" for f in SELECTED_FILES + SUPPORT_FILES}
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            rel = member.name.split("/", 1)[-1]
            if rel in wanted and member.isfile():
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
                wanted.discard(rel)
    if wanted:
        raise SystemExit(f"not in the sdist: {sorted(wanted)}")


def apply_substitutions(tests_root: Path) -> None:
    for file, old, new, why in SUBSTITUTIONS:
        path = tests_root / file
        text = path.read_text()
        if old not in text:
            raise SystemExit(f"substitution no longer applies to {file}: {old!r} ({why})")
        path.write_text(text.replace(old, new))


def assemble(work: Path) -> Path:
    """The test tree: vLLM's extracted tests beside the compat tests/ files."""
    tree = work / "tree"
    extract_tests(sdist_tarball(), tree)
    for name in ("__init__.py", "conftest.py", "utils.py"):
        shutil.copy(COMPAT_DIR / "tests" / name, tree / "tests" / name)
    apply_substitutions(tree / "tests")
    (tree / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = strict\n"
        "asyncio_default_fixture_loop_scope = function\n"
        "filterwarnings = ignore::DeprecationWarning\n")
    return tree


def run_pytest(tree: Path, work: Path, pagellm: Path, timeout: int, keyword: str | None
               ) -> Path:
    env = dict(os.environ)
    env["PAGELLM_BIN"] = str(pagellm)
    env["PAGELLM_VLLM_WORKDIR"] = str(work)
    env["HF_HUB_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    paths = [str(COMPAT_DIR), str(tree)]
    if subprocess.run([sys.executable, "-c", "import torch"],
                      capture_output=True).returncode != 0:
        paths.append(str(COMPAT_DIR / "torch_standin"))
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    # Tokenizers of every mapped checkpoint, written under work/hf/<Org>/<Name>:
    # pytest runs from there, so AutoTokenizer.from_pretrained("Org/Name") finds them.
    hf = work / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c",
                    "import pagellm_compat as p\n"
                    "for name in p.MODEL_MAP: p.tokenizer_dir(name)"],
                   env=env, check=True)

    junit = work / "junit.xml"
    keywords = [f"not {k}" for k in DESELECTED_KEYWORDS]
    if keyword:
        keywords.append(f"({keyword})")
    cmd = [sys.executable, "-m", "pytest", "-c", str(tree / "pytest.ini"),
           "--rootdir", str(tree), "-p", "no:cacheprovider", "-q", "-rN",
           f"--timeout={timeout}", f"--junitxml={junit}", "-k", " and ".join(keywords)]
    for prefix in DESELECTED:
        cmd += ["--deselect", f"tests/{prefix}"]  # node ids are relative to --rootdir
    cmd += [str(tree / "tests" / f) for f in SELECTED_FILES]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, env=env, cwd=hf)
    return junit


def report(junit: Path) -> int:
    if not junit.exists():
        print("pytest wrote no report")
        return 1
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    failures: list[tuple[str, str]] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        # classname: tests.entrypoints.<...>.test_file[.TestClass]
        parts = case.get("classname", "").split(".")[1:]
        ends = [i for i, p in enumerate(parts) if p.startswith("test_")]
        file = "/".join(parts[:ends[0] + 1] if ends else parts) + ".py"
        test_id = f"{file}::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            counts[file]["failed"] += 1
            message = (problem.get("message") or problem.text or "").strip()
            failures.append((test_id, message.splitlines()[0] if message else ""))
        elif case.find("skipped") is not None:
            counts[file]["skipped"] += 1
        else:
            counts[file]["passed"] += 1

    width = max([len(f) for f in counts] + [4])
    print(f"\n{'file':<{width}}  passed  failed  skipped")
    totals = defaultdict(int)
    for file in sorted(counts):
        c = counts[file]
        print(f"{file:<{width}}  {c['passed']:>6}  {c['failed']:>6}  {c['skipped']:>7}")
        for k in ("passed", "failed", "skipped"):
            totals[k] += c[k]
    print(f"{'total':<{width}}  {totals['passed']:>6}  {totals['failed']:>6}  "
          f"{totals['skipped']:>7}")

    unexpected = [(t, m) for t, m in failures if t not in EXPECTED_FAILURES]
    if failures:
        print("\nfailing tests:")
        for test_id, message in failures:
            mark = "expected" if test_id in EXPECTED_FAILURES else "FAILED"
            print(f"  [{mark}] {test_id}\n      {message[:300]}")
    print(f"\n{totals['passed']} passed, {totals['failed']} failed, "
          f"{totals['skipped']} skipped ({len(unexpected)} unexpected failures)")
    return 1 if unexpected or not counts else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pagellm", type=Path, default=Path("target/release/pagellm"),
                        help="the pagellm binary to test")
    parser.add_argument("--keep", type=Path, help="keep the work directory here")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression to narrow the run")
    parser.add_argument("--timeout", type=int, default=900,
                        help="seconds one test (with its server's start) may take")
    parser.add_argument("--no-install", action="store_true", help="skip pip install")
    args = parser.parse_args()

    pagellm = args.pagellm.resolve()
    if not pagellm.is_file():
        raise SystemExit(f"no pagellm binary at {pagellm}")
    if not args.no_install:
        pip_install(PIP_PACKAGES)
    if args.keep:
        work = args.keep.resolve()
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="pagellm-vllm-tests-"))
    try:
        tree = assemble(work)
        return report(run_pytest(tree, work, pagellm, args.timeout, args.keyword))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
