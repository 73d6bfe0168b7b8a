#!/usr/bin/env python3
"""OpenAI API conformance test for `pagellm serve`, driven by the official `openai` SDK.

Starts the server as a subprocess (API key, 2 running + 2 waiting requests at most),
then checks with the SDK (and raw HTTP where the SDK cannot express the request):
models list; chat and completions, plain and streamed, agreeing token for token under
greedy decoding; usage counts; list prompts with n > 1; stop strings; seeded sampling;
logprobs in the legacy completions and the chat formats; OpenAI error bodies and
statuses (404, 401, 400, 413, 429 with Retry-After); that an overloaded or bad request
never disturbs the others; the `pagellm_timings` extra field; Prometheus `/metrics`;
and that SIGTERM stops the server with exit code 0.

Each check prints `ok NAME` or `FAIL NAME: reason`; the script exits non-zero if any
failed, printing the server's log.

Usage:
    python3 scripts/openai_conformance.py --pagellm target/release/pagellm --model smollm2-135m
"""

import argparse
import json
import re
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection

import openai

API_KEY = "conformance-key"
STARTUP_TIMEOUT_S = 120
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
FOX = "The quick brown fox"


class Server:
    """A `pagellm serve` subprocess whose output is collected by a thread."""

    def __init__(self, binary: str, model: str, limits=("--max-waiting-requests", "2", "--max-num-seqs", "2")):
        cmd = [binary, "serve", "--model", model, "--port", "0", "--api-key", API_KEY,
               *limits, "--threads", "2", "--enable-prompt-tokens-details"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")
        self.log: list = []
        self.port = None
        self.listening = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.log.append(line)
            m = re.search(r"pagellm listening on http://[^\s:]+:(\d+)", line)
            if m and self.port is None:
                self.port = int(m.group(1))
                self.listening.set()
        self.listening.set()  # the process ended: stop waiting for the port

    def wait_ready(self) -> str:
        """Waits for the port, then for `/health` to answer 200; returns the base URL."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        self.listening.wait(STARTUP_TIMEOUT_S)
        if self.port is None:
            try:
                code = self.proc.wait(5)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"the server printed no port within {STARTUP_TIMEOUT_S} s") from None
            raise AssertionError(f"the server exited with code {code} before printing its port")
        base = f"http://127.0.0.1:{self.port}"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with code {self.proc.returncode} while loading")
            try:
                if http("GET", base + "/health", timeout=5)[0] == 200:  # 503 while the model loads
                    return base
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"/health did not return 200 within {STARTUP_TIMEOUT_S} s")

    def print_log(self):
        print("---- server log ----\n" + "".join(self.log) + "---- end of server log ----")


def check_models(binary: str, models: list, max_num_seqs: int, run) -> bool:
    """For each model: starts a server, calls `run(client, base_url, model)`, which returns
    a list of failures, and prints them with the server's log. True if all passed."""
    ok = True
    for model in models:
        server = Server(binary, model, limits=("--max-num-seqs", str(max_num_seqs)))
        try:
            base = server.wait_ready()
            client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=600)
            fails = run(client, base, model)
        except Exception as e:  # noqa: BLE001 - a setup failure is reported like the others
            fails = [f"setup: {type(e).__name__}: {e}"]
        finally:
            server.proc.terminate()
            server.proc.wait(30)
        for f in fails:
            print(f"FAIL {model}: {f}")
        if fails:
            ok = False
            server.print_log()
    return ok


def http(method: str, url: str, body=None, key=API_KEY, timeout=60):
    """A raw request; returns (status, headers, body bytes) whatever the status."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


class Ctx:
    """What every test gets: the server's URL, the model name and SDK clients."""

    def __init__(self, base: str, model: str):
        self.base, self.model = base, model
        # No retries: a 429 or 5xx must show as it is, not be papered over.
        self.client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)

    def complete(self, **kw):
        return self.client.completions.create(model=self.model, **kw)

    def chat(self, **kw):
        return self.client.chat.completions.create(model=self.model, **kw)

    def count_tokens(self, prompt: str) -> int:
        status, _, body = http("POST", self.base + "/tokenize", {"prompt": prompt})
        assert status == 200, f"/tokenize returned {status}: {body[:200]!r}"
        return json.loads(body)["count"]


def expect_error(exc_type, status: int, err_type: str, fn):
    """Runs `fn`, which must raise `exc_type` with an OpenAI error body; returns the error."""
    try:
        fn()
    except exc_type as e:
        assert e.status_code == status, f"status {e.status_code}, expected {status}"
        err = e.response.json().get("error")
        assert isinstance(err, dict), f"no `error` object in {e.response.text[:200]!r}"
        assert {"message", "type", "param", "code"} <= err.keys(), f"error keys {sorted(err)}"
        assert err["type"] == err_type, f"error type {err['type']!r}, expected {err_type!r}"
        return err
    except openai.APIStatusError as e:
        raise AssertionError(f"got {type(e).__name__} {e.status_code} {e.response.text[:200]!r}, "
                             f"expected {exc_type.__name__} {status}") from None
    raise AssertionError(f"the request succeeded; expected {exc_type.__name__} {status}")


def expect_raw_error(response, status: int) -> dict:
    """Checks a raw (status, headers, body) response is an OpenAI error; returns it."""
    status_got, _, body = response
    assert status_got == status, f"status {status_got}, expected {status}; body {body[:200]!r}"
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"not an OpenAI JSON error body: {body[:200]!r}") from None
    assert {"message", "type", "param", "code"} <= err.keys(), f"error keys {sorted(err)}"
    return err


# ---- the tests, run in this order ----

def test_models_list(c: Ctx):
    ids = [m.id for m in c.client.models.list().data]
    assert ids == [c.model], f"models {ids}, expected [{c.model!r}]"


def test_chat_completion(c: Ctx):
    r = c.chat(messages=CHAT, max_tokens=16, temperature=0)
    assert len(r.choices) == 1, f"{len(r.choices)} choices"
    ch = r.choices[0]
    assert ch.message.role == "assistant", f"role {ch.message.role!r}"
    assert ch.message.content, "empty content"
    assert ch.finish_reason in ("stop", "length"), f"finish_reason {ch.finish_reason!r}"
    u = r.usage
    assert u.prompt_tokens > 0, f"prompt_tokens {u.prompt_tokens}"
    assert 1 <= u.completion_tokens <= 16, f"completion_tokens {u.completion_tokens}"
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}"
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else None
    assert isinstance(cached, int) and cached >= 0, f"cached_tokens {cached!r}"


def test_chat_stream_matches_plain(c: Ctx):
    plain = c.chat(messages=CHAT, max_tokens=16, temperature=0)
    chunks = list(c.chat(messages=CHAT, max_tokens=16, temperature=0, stream=True,
                         stream_options={"include_usage": True}))
    text = "".join(ch.delta.content or "" for k in chunks for ch in k.choices)
    assert text == plain.choices[0].message.content, f"streamed {text!r} != {plain.choices[0].message.content!r}"
    finished = [ch.finish_reason for k in chunks for ch in k.choices if ch.finish_reason]
    assert finished == [plain.choices[0].finish_reason], f"finish reasons {finished}"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None, f"last chunk is not the usage chunk: {last}"
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == \
        (plain.usage.prompt_tokens, plain.usage.completion_tokens), f"{last.usage} vs {plain.usage}"


def test_completion_stream_matches_plain(c: Ctx):
    plain = c.complete(prompt=FOX, max_tokens=12, temperature=0)
    assert len(plain.choices) == 1 and plain.choices[0].text, f"choices {plain.choices}"
    chunks = list(c.complete(prompt=FOX, max_tokens=12, temperature=0, stream=True))
    text = "".join(ch.text for k in chunks for ch in k.choices)
    assert text == plain.choices[0].text, f"streamed {text!r} != {plain.choices[0].text!r}"


def test_completion_prompt_list_with_n(c: Ctx):
    prompts = [FOX, "Once upon a time there was"]
    r = c.complete(prompt=prompts, n=2, max_tokens=4, temperature=0.8, seed=7)
    assert sorted(ch.index for ch in r.choices) == [0, 1, 2, 3], f"indices {[ch.index for ch in r.choices]}"
    expected = sum(c.count_tokens(p) for p in prompts)
    assert r.usage.prompt_tokens == expected, f"prompt_tokens {r.usage.prompt_tokens}, expected {expected}"
    assert 4 <= r.usage.completion_tokens <= 16, f"completion_tokens {r.usage.completion_tokens}"
    assert r.usage.total_tokens == expected + r.usage.completion_tokens, f"usage {r.usage}"


def test_stop_string(c: Ctx):
    prompt = "Once upon a time"
    full = c.complete(prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    words = [w for w in re.findall(r"[A-Za-z]{3,}", full) if full.index(w) > 0]
    assert words, f"no usable stop word in {full!r}"
    word = words[len(words) // 2]
    r = c.complete(prompt=prompt, max_tokens=24, temperature=0, stop=[word])
    expected = full[:full.index(word)]
    assert r.choices[0].text == expected, f"stop={word!r}: got {r.choices[0].text!r}, expected {expected!r}"
    assert r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason!r}"


def test_seed_reproducible(c: Ctx):
    kw = dict(prompt=FOX, max_tokens=16, temperature=1.0)
    a, b = (c.complete(seed=1234, **kw).choices[0].text for _ in range(2))
    assert a == b, f"seed 1234 gave {a!r} then {b!r}"
    c.complete(seed=4321, **kw)  # may or may not differ
    r = c.complete(seed=1234, n=2, **kw)
    assert len(r.choices) == 2, f"n=2 gave {len(r.choices)} choices"


def test_completion_logprobs(c: Ctx):
    r = c.complete(prompt=FOX, max_tokens=8, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None, f"no logprobs: {r.choices[0]}"
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n, \
        f"{len(lp.tokens)} tokens, {len(lp.token_logprobs)} logprobs, {len(lp.top_logprobs)} tops, {n} generated"
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert isinstance(l, float) and l <= 0, f"token {tok!r} logprob {l!r}"
        assert isinstance(top, dict) and 1 <= len(top) <= 3, f"top_logprobs entry {top!r}"
        assert abs(l - max(top.values())) < 1e-4, f"greedy {tok!r} logprob {l} is not the top of {top}"


def check_chat_logprob_items(items, k: int):
    assert items, "no logprobs content"
    for it in items:
        assert isinstance(it.token, str) and isinstance(it.bytes, list), f"item {it}"
        assert it.logprob <= 0, f"token {it.token!r} logprob {it.logprob}"
        assert len(it.top_logprobs) == k, f"{len(it.top_logprobs)} top_logprobs, expected {k}"
        best = max(t.logprob for t in it.top_logprobs)
        assert it.top_logprobs[0].logprob == best, f"top_logprobs not sorted: {it.top_logprobs}"
        assert abs(it.logprob - best) < 1e-4, f"greedy {it.token!r} ({it.logprob}) is not the top: {it.top_logprobs}"


def test_chat_logprobs(c: Ctx):
    r = c.chat(messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None, f"no logprobs: {r.choices[0]}"
    assert len(lp.content) == r.usage.completion_tokens, f"{len(lp.content)} items, {r.usage.completion_tokens} tokens"
    check_chat_logprob_items(lp.content, 2)


def test_chat_stream_logprobs(c: Ctx):
    chunks = list(c.chat(messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2,
                         stream=True, stream_options={"include_usage": True}))
    items = [it for k in chunks for ch in k.choices if ch.logprobs and ch.logprobs.content
             for it in ch.logprobs.content]
    assert items, "no chunk carries logprobs"
    n = chunks[-1].usage.completion_tokens if chunks[-1].usage else None
    assert len(items) == n, f"{len(items)} logprob items over the chunks, {n} tokens generated"
    check_chat_logprob_items(items, 2)


def test_error_unknown_model(c: Ctx):
    expect_error(openai.NotFoundError, 404, "not_found_error",
                 lambda: c.client.completions.create(model="no-such-model", prompt="x", max_tokens=1))


def test_error_wrong_api_key(c: Ctx):
    bad = openai.OpenAI(base_url=c.base + "/v1", api_key="wrong", max_retries=0)
    expect_error(openai.AuthenticationError, 401, "authentication_error",
                 lambda: bad.completions.create(model=c.model, prompt="x", max_tokens=1))


def test_error_negative_temperature(c: Ctx):
    err = expect_error(openai.BadRequestError, 400, "invalid_request_error",
                       lambda: c.complete(prompt="x", max_tokens=1, temperature=-1))
    assert err["param"] == "temperature", f"param {err['param']!r}"


def test_error_max_tokens_over_context(c: Ctx):
    err = expect_error(openai.BadRequestError, 400, "invalid_request_error",
                       lambda: c.complete(prompt="x", max_tokens=10**6))
    assert "context" in err["message"].lower(), f"message {err['message']!r} does not mention the context"


def test_error_n_zero(c: Ctx):
    err = expect_error(openai.BadRequestError, 400, "invalid_request_error",
                       lambda: c.complete(prompt="x", max_tokens=1, n=0))
    assert err["param"] == "n", f"param {err['param']!r}"


def test_error_malformed_json(c: Ctx):
    expect_raw_error(http("POST", c.base + "/v1/completions", b'{"model": "x", "prompt": '), 400)


def test_error_wrong_field_type(c: Ctx):
    body = {"model": c.model, "prompt": "x", "max_tokens": "ten"}
    err = expect_raw_error(http("POST", c.base + "/v1/completions", body), 400)
    assert err["param"] == "max_tokens" or "max_tokens" in err["message"], f"error {err} does not name max_tokens"


def test_error_body_too_large(c: Ctx):
    body = json.dumps({"model": c.model, "prompt": "a" * (17 << 20), "max_tokens": 1}).encode()
    conn = HTTPConnection("127.0.0.1", urllib.parse.urlsplit(c.base).port, timeout=60)
    try:
        conn.putrequest("POST", "/v1/completions")
        for k, v in [("Content-Type", "application/json"), ("Authorization", f"Bearer {API_KEY}"),
                     ("Content-Length", str(len(body)))]:
            conn.putheader(k, v)
        conn.endheaders()
        try:
            conn.send(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer before reading the whole body: read its answer
        try:
            r = conn.getresponse()
            response = r.status, r.headers, r.read()
        except OSError as e:
            raise AssertionError(f"the connection failed instead of a 413 response: {e!r}") from None
    finally:
        conn.close()
    expect_raw_error(response, 413)


def test_overload_rejects_with_429(c: Ctx):
    """12 concurrent requests against 2 running + 2 waiting slots: the excess gets 429,
    and every admitted request runs to completion undisturbed."""
    def one(_):
        try:
            return c.complete(prompt=FOX, max_tokens=48, temperature=0, extra_body={"ignore_eos": True})
        except openai.APIError as e:
            return e

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(12)))
    limited = [r for r in results if isinstance(r, openai.RateLimitError)]
    others = [r for r in results if isinstance(r, Exception) and not isinstance(r, openai.RateLimitError)]
    done = [r for r in results if not isinstance(r, Exception)]
    assert not others, f"unexpected errors: {[repr(e) for e in others]}"
    texts = {r.choices[0].text for r in done}
    assert len(texts) <= 1, f"the admitted requests disagree: {texts}"
    bad = [r.usage.completion_tokens for r in done if r.usage.completion_tokens != 48]
    assert not bad, f"admitted requests generated {bad} tokens, expected 48"
    assert limited, f"all {len(done)} of 12 concurrent requests were admitted; expected some 429s"
    assert len(done) >= 2, f"only {len(done)} of 12 requests were admitted; 2 may wait"
    for e in limited:
        assert e.response.json()["error"]["type"] == "rate_limit_error", f"429 body {e.response.text!r}"
        assert "retry-after" in e.response.headers, f"429 without Retry-After: {dict(e.response.headers)}"


def test_server_unharmed(c: Ctx):
    r = c.complete(prompt=FOX, max_tokens=4, temperature=0)
    assert r.choices[0].text and r.usage.completion_tokens >= 1, f"response {r}"


def test_pagellm_timings(c: Ctx):
    for r in (c.complete(prompt=FOX, max_tokens=2), c.chat(messages=CHAT, max_tokens=2)):
        t = (r.model_extra or {}).get("pagellm_timings")
        assert isinstance(t, dict), f"no pagellm_timings in {r.object} response"
        missing = {"queue_ms", "prefill_ms", "decode_ms", "cached_tokens"} - t.keys()
        assert not missing, f"pagellm_timings lacks {sorted(missing)}: {t}"


def test_metrics(c: Ctx):
    status, _, body = http("GET", c.base + "/metrics")
    assert status == 200, f"/metrics returned {status}: {body[:200]!r}"
    text = body.decode()
    for needle in (f'vllm:num_requests_running{{model_name="{c.model}"}}', "vllm:generation_tokens_total",
                   "vllm:time_to_first_token_seconds_bucket"):
        assert needle in text, f"/metrics lacks {needle}"
    assert re.search(r'^vllm:request_success_total\{[^}]*finished_reason="', text, re.M), \
        "/metrics lacks vllm:request_success_total with a finished_reason label"
    gen = [float(m) for m in re.findall(r"^vllm:generation_tokens_total(?:\{[^}]*\})? (\S+)", text, re.M)]
    assert gen and sum(gen) > 0, f"vllm:generation_tokens_total is {gen}"


TESTS = [
    test_models_list, test_chat_completion, test_chat_stream_matches_plain,
    test_completion_stream_matches_plain, test_completion_prompt_list_with_n, test_stop_string,
    test_seed_reproducible, test_completion_logprobs, test_chat_logprobs, test_chat_stream_logprobs,
    test_error_unknown_model, test_error_wrong_api_key, test_error_negative_temperature,
    test_error_max_tokens_over_context, test_error_n_zero, test_error_malformed_json,
    test_error_wrong_field_type, test_error_body_too_large, test_overload_rejects_with_429,
    test_server_unharmed, test_pagellm_timings, test_metrics,
]


def report(name: str, fn) -> bool:
    try:
        fn()
    except AssertionError as e:
        print(f"FAIL {name}: {e}", flush=True)
        return False
    except Exception as e:  # an SDK or connection error: show where it came from
        where = traceback.extract_tb(e.__traceback__)[-1]
        print(f"FAIL {name}: {type(e).__name__}: {e} (at line {where.lineno})", flush=True)
        return False
    print(f"ok {name}", flush=True)
    return True


def stop_server(server: Server):
    server.proc.terminate()
    try:
        code = server.proc.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError("the server did not exit within 30 s of SIGTERM") from None
    assert code == 0, f"the server exited with code {code} after SIGTERM"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pagellm", default="target/release/pagellm", help="the pagellm binary")
    ap.add_argument("--model", default="smollm2-135m", help="the model to serve")
    a = ap.parse_args()
    server = Server(a.pagellm, a.model)
    failed = []
    base = []
    try:
        if not report("server_starts", lambda: base.append(server.wait_ready())):
            failed.append("server_starts")
        else:
            ctx = Ctx(base[0], a.model)
            for t in TESTS:
                name = t.__name__.removeprefix("test_")
                if not report(name, lambda: t(ctx)):
                    failed.append(name)
            if not report("sigterm_exits_0", lambda: stop_server(server)):
                failed.append("sigterm_exits_0")
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    if failed:
        server.print_log()
        print(f"{len(failed)} failed: {', '.join(failed)}")
        return 1
    print(f"all {len(TESTS) + 2} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
