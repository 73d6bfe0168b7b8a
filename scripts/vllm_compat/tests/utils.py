"""Replaces vLLM's tests/utils.py: RemoteOpenAIServer starts `pagellm serve`
instead of `vllm serve`, with the same client-facing interface (url_root,
url_for, get_client, get_async_client, host, port, show_hidden_metrics).

The checkpoint a test names is served by the pagellm model that stands for it
(pagellm_compat.MODEL_MAP) under the test's own name, via --served-model-name.
vLLM's command-line options are translated where pagellm has the same option,
dropped where they only tune vLLM's GPU engine or switch on a vLLM feature (the
tests of that feature then check the API and fail if pagellm lacks it), and
passed through otherwise, so that an option pagellm does not know stops the
server visibly instead of being ignored.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import openai
import requests

import pagellm_compat
from vllm.utils.network_utils import get_open_port

# vLLM options with the same meaning in `pagellm serve` (each takes a value).
PASSED_WITH_VALUE = {
    "--host", "--port", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
    "--block-size", "--kv-cache-dtype", "--api-key", "--served-model-name", "--max-logprobs",
}
PASSED_FLAGS = {
    "--no-enable-prefix-caching", "--no-enable-chunked-prefill",
    "--enable-prompt-tokens-details", "--enable-force-include-usage",
    "--return-tokens-as-token-ids", "--enable-tokenizer-info-endpoint",
    "--enable-per-request-metrics",
}

# vLLM options without a meaning for pagellm, dropped with their value.
DROPPED_WITH_VALUE = {
    "--dtype": "weights are served in the GGUF's own types on CPU",
    "--gpu-memory-utilization": "no GPU; the KV cache is sized by --kv-cache-memory",
    "--seed": "vLLM's engine-wide seed; requests carry their own `seed`",
    "--load-format": "pagellm loads the registry's GGUF (`dummy` weights do not apply)",
    "--hf-overrides": "Hugging Face config overrides",
    "--tool-call-parser": "pagellm parses tool calls from the chat template's format",
    "--lora-modules": "LoRA adapters are not served; adapter tests are deselected",
    "--max-lora-rank": "LoRA",
    "--max-cpu-loras": "LoRA",
    "--limit-mm-per-prompt": "multimodal",
}
DROPPED_FLAGS = {
    "--enforce-eager": "CUDA graphs",
    "--trust-remote-code": "Python model code",
    "--enable-lora": "LoRA",
    "--enable-chunked-prefill": "on by default in pagellm",
    "--enable-prefix-caching": "on by default in pagellm",
    "--enable-auto-tool-choice": "tool calls are always parsed with tool_choice=auto",
    "--skip-tokenizer-init": "pagellm always loads the GGUF's tokenizer",
}
DROPPED_PREFIXES = {
    "--show-hidden-metrics-for-version": "exposes deprecated metrics (none expected)",
}


def translate_args(args: list[str]) -> tuple[list[str], list[str]]:
    """vLLM serve options -> (pagellm serve options, dropped options)."""
    out, dropped = [], []
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        inline_value = "=" in arg
        takes_value = name in PASSED_WITH_VALUE or name in DROPPED_WITH_VALUE
        span = args[i:i + (1 if inline_value or not takes_value else 2)]
        if name in PASSED_WITH_VALUE or name in PASSED_FLAGS:
            out += span
        elif (name in DROPPED_WITH_VALUE or name in DROPPED_FLAGS
              or any(name.startswith(p) for p in DROPPED_PREFIXES)):
            dropped += span
        else:
            out.append(arg)  # unknown to this table: let pagellm refuse it
        i += len(span)
    return out, dropped


def _option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


class RemoteOpenAIServer:
    DUMMY_API_KEY = "token-abc123"  # pagellm, like vLLM, needs no key by default

    def __init__(self, model: str, vllm_serve_args: list[str], *,
                 env_dict: dict[str, str] | None = None, seed: int | None = 0,
                 auto_port: bool = True, max_wait_seconds: float | None = None,
                 override_hf_configs=None) -> None:
        if auto_port:
            if "-p" in vllm_serve_args or "--port" in vllm_serve_args:
                raise ValueError("You have manually specified the port when `auto_port=True`.")
            vllm_serve_args = vllm_serve_args + ["--port", str(get_open_port())]
        self.host = str(_option(vllm_serve_args, "--host") or "127.0.0.1")
        self.port = int(_option(vllm_serve_args, "--port") or 8000)
        self.uds = None
        self.show_hidden_metrics = any(
            a.startswith("--show-hidden-metrics-for-version") for a in vllm_serve_args)

        args, dropped = translate_args(vllm_serve_args)
        served_name = _option(args, "--served-model-name") or model
        if "--served-model-name" not in args:
            args += ["--served-model-name", served_name]
        cmd = [pagellm_compat.pagellm_bin(), "serve",
               "--model", pagellm_compat.pagellm_model(model), *args]
        logs = pagellm_compat.workdir() / "server-logs"
        logs.mkdir(exist_ok=True)
        self.log_path = logs / f"{time.strftime('%H%M%S')}-{self.port}.log"
        env = {**os.environ, **(env_dict or {})}
        with open(self.log_path, "w") as log:
            log.write(f"$ {' '.join(cmd)}\n# dropped vLLM options: {dropped}\n")
            log.flush()
            print(f"Launching pagellm: {' '.join(cmd)} (log: {self.log_path})")
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            self._wait_for_server(url=self.url_for("health"),
                                  timeout=max_wait_seconds or 480)
        except Exception:
            self._shutdown()
            raise

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self._shutdown()

    def _shutdown(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _wait_for_server(self, *, url: str, timeout: float) -> None:
        start = time.time()
        while True:
            try:
                if requests.get(url, timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                tail = Path(self.log_path).read_text()[-2000:]
                raise RuntimeError(f"Server exited unexpectedly:\n{tail}")
            if time.time() - start > timeout:
                raise RuntimeError("Server failed to start in time.")
            time.sleep(0.5)

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        path = "/".join(part.strip("/") for part in parts if part)
        return f"{self.url_root}/{path}"

    def get_client(self, **kwargs):
        kwargs.setdefault("timeout", 600)
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY,
                             max_retries=0, **kwargs)

    def get_async_client(self, **kwargs):
        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY,
                                  max_retries=0, **kwargs)
