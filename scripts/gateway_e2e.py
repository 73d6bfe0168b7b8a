#!/usr/bin/env python3
"""`pagellm gateway` end to end, as an OpenAI SDK user sees it, with real replicas.

Starts `pagellm serve` replicas (REPLICAS of smollm2-135m and one of
qwen2.5-coder-0.5b) and one gateway in front of them, then checks:

* many models, one URL: the official `openai` SDK reaches both smollm2 replicas and the
  qwen replica through the gateway; an unknown model gets 404 listing the known ones;
* a replica killed under load loses nothing: a greedy load (half streamed, half not) at
  CONCURRENCY runs once undisturbed, then again while one replica is killed with
  SIGKILL mid-run. Zero failed requests, every text equal to the undisturbed run's,
  no request hangs; the killed replica, restarted on its port, serves again within 5 s
  of being healthy.

Each check prints `ok NAME` or `FAIL NAME: reason`; the exit status is non-zero if any
failed. `--requests`, `--max-tokens` and `--concurrency` scale the load (CI runs a
small version; BENCHMARKS.md records a full one).

Usage:
    python3 scripts/gateway_e2e.py --pagellm target/release/pagellm
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

SMOLLM = "smollm2-135m"
QWEN = "qwen2.5-coder-0.5b"
FAILS = []


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait_healthy(url: str, timeout: float = 120) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if http_status(url + "/health") == 200:
            return True
        time.sleep(0.1)
    return False


class Proc:
    def __init__(self, name: str, cmd: list, logdir: str):
        self.name, self.cmd = name, cmd
        self.log_path = os.path.join(logdir, name + ".log")
        self.start()

    def start(self):
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def tail(self) -> str:
        with open(self.log_path) as f:
            return "".join(f.readlines()[-20:])


def check(name, fn):
    try:
        fn()
        print(f"ok {name}", flush=True)
    except Exception as e:  # noqa: BLE001 - report every failure, keep going
        FAILS.append(name)
        print(f"FAIL {name}: {e}", flush=True)
        traceback.print_exc()


def prompts(n: int) -> list:
    topics = ["the sea", "a mountain", "the city at night", "an old library", "rain", "a fox",
              "the moon", "a garden", "winter", "a train station", "bread", "the desert"]
    return [f"Write two sentences about {topics[i % len(topics)]} (story {i})." for i in range(n)]


def one(client, i: int, prompt: str, max_tokens: int) -> dict:
    """Request i: streamed when i is even; chat for half of each kind."""
    stream = i % 2 == 0
    chat = (i // 2) % 2 == 0
    t0 = time.time()
    if chat:
        args = dict(model=SMOLLM, messages=[{"role": "user", "content": prompt}],
                    max_tokens=max_tokens, temperature=0)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(stream=True, **args) if c.choices)
        else:
            text = client.chat.completions.create(**args).choices[0].message.content
    else:
        args = dict(model=SMOLLM, prompt=prompt, max_tokens=max_tokens, temperature=0)
        if stream:
            text = "".join(c.choices[0].text for c in
                           client.completions.create(stream=True, **args) if c.choices)
        else:
            text = client.completions.create(**args).choices[0].text
    return {"i": i, "text": text, "s": time.time() - t0}


def run_load(client, ps, max_tokens, concurrency, during=None):
    results, errors = {}, {}
    with ThreadPoolExecutor(concurrency) as ex:
        futs = {ex.submit(one, client, i, p, max_tokens): i for i, p in enumerate(ps)}
        if during:
            during()
        for f, i in futs.items():
            try:
                results[i] = f.result(timeout=600)
            except Exception as e:  # noqa: BLE001
                errors[i] = repr(e)
    return results, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", default="target/release/pagellm")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--kill-after", type=float, default=0.25,
                    help="fraction of the undisturbed run's duration after which to kill")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    logdir = tempfile.mkdtemp(prefix="pagellm-gw-e2e-")
    procs = []
    try:
        ports = [free_port() for _ in range(a.replicas)]
        serve = lambda model, port: [a.pagellm, "serve", "-m", model, "-t", "1", "--port", str(port),
                                     "--kv-cache-memory", "512MiB", "--max-model-len", "2048"]
        reps = [Proc(f"r{i + 1}", serve(SMOLLM, p), logdir) for i, p in enumerate(ports)]
        qport = free_port()
        q = Proc("q1", serve(QWEN, qport), logdir)
        procs += reps + [q]
        cfg = {"model_list": [
            {"model_name": SMOLLM, "litellm_params": {"model": f"openai/{SMOLLM}",
             "api_base": f"http://127.0.0.1:{p}/v1"}, "model_info": {"id": f"r{i + 1}"}}
            for i, p in enumerate(ports)] + [
            {"model_name": QWEN, "litellm_params": {"model": f"openai/{QWEN}",
             "api_base": f"http://127.0.0.1:{qport}/v1"}, "model_info": {"id": "q1"}}],
            "litellm_settings": {"num_retries": 2, "request_timeout": 60},
            "pagellm_settings": {"tokenizers": {SMOLLM: SMOLLM, QWEN: QWEN},
                                 "health_check": {"interval": 0.25, "timeout": 1, "failure_threshold": 1}}}
        cfg_path = os.path.join(logdir, "gateway.yaml")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)  # JSON is YAML
        gport = free_port()
        gw = Proc("gateway", [a.pagellm, "gateway", "--config", cfg_path, "--port", str(gport)], logdir)
        procs.append(gw)
        base = f"http://127.0.0.1:{gport}"
        for p in reps + [q]:
            port = ports[reps.index(p)] if p in reps else qport
            if not wait_healthy(f"http://127.0.0.1:{port}"):
                raise SystemExit(f"{p.name} did not start:\n{p.tail()}")
        if not wait_healthy(base, 30):
            raise SystemExit(f"gateway did not become healthy:\n{gw.tail()}")
        time.sleep(1)  # let the gateway's KV-event subscriptions connect
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)

        def many_models():
            ids = sorted(m.id for m in client.models.list())
            assert ids == sorted([SMOLLM, QWEN]), ids
            # Prompts that differ from their first block on (their own system
            # message) share no prefix, so prefix-aware routing spreads them by load.
            def hi(i):
                raw = client.chat.completions.with_raw_response.create(
                    model=SMOLLM, max_tokens=16,
                    messages=[{"role": "system", "content": f"{i}: you are assistant number {i}."},
                              {"role": "user", "content": "Say hi"}])
                assert raw.parse().choices[0].message.content
                return raw.headers["x-pagellm-replica"]
            with ThreadPoolExecutor(12) as ex:
                seen = set(ex.map(hi, range(12)))
            assert len(seen) >= 2, f"only {seen} served smollm2"
            raw = client.completions.with_raw_response.create(model=QWEN, prompt="def add(a, b):", max_tokens=8,
                                                              temperature=0)
            assert raw.headers["x-pagellm-replica"] == "q1"
            assert raw.parse().choices[0].text
            try:
                client.completions.create(model="gpt-9", prompt="x", max_tokens=1)
                raise AssertionError("unknown model accepted")
            except openai.NotFoundError as e:
                msg = str(e)
                assert SMOLLM in msg and QWEN in msg, msg

        check("many models through one URL; 404 lists the known ones", many_models)

        ps = prompts(a.requests)
        figures = {}

        def kill_under_load():
            t0 = time.time()
            base_res, base_err = run_load(client, ps, a.max_tokens, a.concurrency)
            undisturbed = time.time() - t0
            assert not base_err, f"undisturbed run failed: {base_err}"
            killed = {}

            def busiest():
                """The replica with the most requests in flight, by the gateway's gauge."""
                text = urllib.request.urlopen(base + "/metrics").read().decode()
                load = {p.name: 0.0 for p in reps}
                for l in text.splitlines():
                    if l.startswith("pagellm_gateway_in_flight{"):
                        name = l.split('replica="')[1].split('"')[0]
                        if name in load:
                            load[name] = float(l.rsplit(" ", 1)[1])
                return max(reps, key=lambda p: load[p.name]), load

            def killer():
                time.sleep(undisturbed * a.kill_after)
                victim, load = busiest()
                victim.kill9()
                killed.update(t=time.time(), victim=victim, load=load)

            t0 = time.time()
            res, err = run_load(client, ps, a.max_tokens, a.concurrency,
                                during=lambda: threading.Thread(target=killer, daemon=True).start())
            disturbed = time.time() - t0
            assert "t" in killed, "the replica was not killed during the run"
            victim = killed["victim"]
            assert not err, f"{len(err)} requests failed: {list(err.items())[:3]}"
            diff = [i for i in base_res if base_res[i]["text"] != res[i]["text"]]
            assert not diff, (f"{len(diff)} texts differ, e.g. #{diff[0]}: "
                              f"{base_res[diff[0]]['text']!r} vs {res[diff[0]]['text']!r}")
            assert max(r["s"] for r in res.values()) < 120, "a request hung"
            metrics = urllib.request.urlopen(base + "/metrics").read().decode()
            failovers = sum(float(l.rsplit(" ", 1)[1]) for l in metrics.splitlines()
                            if l.startswith("pagellm_gateway_failovers_total"))
            retries = sum(float(l.rsplit(" ", 1)[1]) for l in metrics.splitlines()
                          if l.startswith("pagellm_gateway_retries_total"))
            assert failovers + retries > 0, f"the kill hit no request in flight: {killed['load']}"
            # Restart it on its port; once its /health answers, it must serve within 5 s.
            victim.start()
            port = ports[reps.index(victim)]
            assert wait_healthy(f"http://127.0.0.1:{port}"), victim.tail()
            healthy_at = time.time()
            served = None
            while time.time() - healthy_at < 5 and served is None:
                for _ in range(a.replicas):
                    raw = client.completions.with_raw_response.create(model=SMOLLM, prompt="Hello", max_tokens=1)
                    if raw.headers["x-pagellm-replica"] == victim.name:
                        served = time.time() - healthy_at
                        break
                time.sleep(0.05)
            assert served is not None, "the restarted replica took no traffic within 5 s of being healthy"
            figures.update(requests=len(ps), undisturbed_s=round(undisturbed, 2), disturbed_s=round(disturbed, 2),
                           failovers=failovers, retries=retries, readmitted_after_s=round(served, 2),
                           killed=victim.name, in_flight_at_kill=killed["load"])
            print(f"   {json.dumps(figures)}", flush=True)

        check(f"{a.requests} requests at concurrency {a.concurrency}, one of {a.replicas} replicas killed: "
              "nothing lost, texts unchanged, readmitted", kill_under_load)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(figures, f, indent=2)
    finally:
        for p in procs:
            p.stop()
        if FAILS:
            for p in procs:
                print(f"--- {p.name} log (last lines)\n{p.tail()}")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
