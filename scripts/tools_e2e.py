#!/usr/bin/env python3
"""Tool calling end to end: `pagellm serve` driven by the official `openai` SDK.

For each model given (Qwen2.5 models, whose chat template teaches the
`<tool_call>{json}</tool_call>` format), starts the server and checks that
- `tool_choice="required"` and a named function give parsed `tool_calls` of offered
  functions whose arguments validate against their schemas (Python's `jsonschema`),
  with `finish_reason: "tool_calls"`, streamed and not, for several prompts; a named
  function is the one called, and `parallel_tool_calls=False` gives exactly one call;
- a streamed call arrives as OpenAI streams them (a first delta with the call's index,
  id and name, then its arguments in several fragments) and equals the unstreamed one
  under greedy decoding;
- `tool_choice="auto"` answers with either text or well-formed calls;
- a round trip works: the call, then a `tool` message with its result, then a final
  answer in text, whose prompt shows the call and the result rendered by the template;
  `tool_choice="none"` gives text and no calls;
- malformed tools or tool choices are answered 400 naming the field.

Usage:
    python3 scripts/tools_e2e.py --pagellm target/release/pagellm \\
        --model qwen2.5-coder-0.5b --model qwen2.5-coder-1.5b
"""

import argparse
import json
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

from openai_conformance import API_KEY, check_models

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "search_books", "description": "Search a library catalogue",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "maxLength": 60}, "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["query"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
PROMPTS = [
    ("What's the weather like in Paris today?", "get_weather"),
    ("What is 1234 plus 4321?", "add"),
    ("Find me three books about sailing.", "search_books"),
    ("Is it raining in Tokyo? Use celsius.", "get_weather"),
]


def msgs(q):
    return [{"role": "user", "content": q}]


def check_calls(label, calls, finish, named=None, one=False):
    """Problems with a reply's calls, or None."""
    if finish != "tool_calls":
        return f"{label}: finish_reason {finish!r}"
    if not calls:
        return f"{label}: no tool_calls"
    if one and len(calls) != 1:
        return f"{label}: {len(calls)} calls, expected 1"
    for c in calls:
        name, args = c["name"], c["arguments"]
        if name not in SCHEMAS:
            return f"{label}: unknown function {name!r}"
        if named and name != named:
            return f"{label}: called {name!r}, not {named!r}"
        try:
            jsonschema.validate(json.loads(args), SCHEMAS[name])
        except (ValueError, jsonschema.ValidationError) as e:
            return f"{label}: arguments {args!r}: {str(e).splitlines()[0]}"
        if not c["id"]:
            return f"{label}: a call without an id"
    return None


def ask(client, model, q, choice, stream, parallel=None):
    """(calls as dicts, finish_reason, content) of one request, streamed or not."""
    args = dict(model=model, messages=msgs(q), tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=200)
    if parallel is not None:
        args["parallel_tool_calls"] = parallel
    if not stream:
        r = client.chat.completions.create(**args)
        m = r.choices[0].message
        calls = [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments} for t in m.tool_calls or []]
        return calls, r.choices[0].finish_reason, m.content
    calls, finish, content = {}, None, ""
    for ch in client.chat.completions.create(stream=True, **args):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for t in d.tool_calls or []:
            c = calls.setdefault(t.index, {"id": "", "name": "", "arguments": "", "fragments": 0})
            if t.id and c["id"]:
                raise ValueError(f"call {t.index} announced twice")
            c["id"] = t.id or c["id"]
            c["name"] += (t.function.name or "") if t.function else ""
            fragment = (t.function.arguments or "") if t.function else ""
            c["arguments"] += fragment
            c["fragments"] += bool(fragment)
        finish = ch.choices[0].finish_reason or finish
    for i, c in calls.items():
        # Arguments of a few tokens come in several fragments, not in one piece.
        if len(c["arguments"]) > 12 and c.pop("fragments") < 2:
            raise ValueError(f"call {i}'s arguments {c['arguments']!r} came in one piece")
        c.pop("fragments", None)
    return [calls[i] for i in sorted(calls)], finish, content or None


def run(client, base, model):
    jobs = []
    for q, want in PROMPTS:
        for stream in (False, True):
            jobs.append((q, "required", stream, None, None))
            jobs.append((q, {"type": "function", "function": {"name": want}}, stream, want, None))
        jobs.append((q, "required", False, None, False))
        jobs.append((q, "auto", True, None, None))
        jobs.append((q, "none", False, None, None))

    def one(job):
        q, choice, stream, named, parallel = job
        label = f"{q!r} choice={choice if isinstance(choice, str) else named} stream={stream}"
        try:
            calls, finish, content = ask(client, model, q, choice, stream, parallel)
        except Exception as e:  # noqa: BLE001
            return label, None, f"{label}: request failed: {e}"
        if choice == "none":
            ok = not calls and finish in ("stop", "length") and content
            return label, None, None if ok else f"{label}: calls {calls}, finish {finish!r}, content {content!r}"
        if choice == "auto":
            ok = (calls and finish == "tool_calls") or (not calls and finish == "stop" and content)
            return label, None, None if ok else f"{label}: calls {calls}, finish {finish!r}, content {content!r}"
        return label, calls, check_calls(label, calls, finish, named, one=parallel is False)

    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, jobs))
    fails = [f for _, _, f in results if f]
    # Greedy: a streamed call is the unstreamed one (ids aside).
    by_label = {label: calls for label, calls, _ in results}
    for label, calls in by_label.items():
        if label.endswith("stream=True") and calls is not None:
            other = by_label.get(label[: -len("True")] + "False")
            strip = lambda cs: [(c["name"], json.loads(c["arguments"])) for c in cs]  # noqa: E731
            if other is not None and strip(other) != strip(calls):
                fails.append(f"{label}: streamed {strip(calls)} != unstreamed {strip(other)}")
    print(f"{model}: {len(jobs) - len(fails)}/{len(jobs)} tool-call checks passed")
    return fails + round_trip(client, base, model) + refusals(client, model)


def round_trip(client, base, model):
    q = "What's the weather like in Paris today?"
    r = client.chat.completions.create(model=model, messages=msgs(q), tools=TOOLS, tool_choice="required", temperature=0)
    call = r.choices[0].message.tool_calls[0]
    result = {"temperature": 18, "sky": "light rain"}
    convo = msgs(q) + [r.choices[0].message.model_dump(exclude_none=True),
                       {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}]
    # The final turn leaves the tools out, as agents do once they have what they need
    # (with the tools listed, these small models tend to write another call as text).
    final = client.chat.completions.create(model=model, messages=convo, temperature=0, max_tokens=80,
                                           extra_body={"return_token_ids": True})
    fails = []
    text = final.choices[0].message.content
    if final.choices[0].message.tool_calls or not text or not text.strip():
        fails.append(f"round trip: final answer {text!r}, calls {final.choices[0].message.tool_calls}")
    ids = final.model_extra.get("prompt_token_ids")
    req = urllib.request.Request(base + "/detokenize", data=json.dumps({"tokens": ids}).encode(),
                                 headers={"content-type": "application/json", "authorization": f"Bearer {API_KEY}"})
    prompt = json.load(urllib.request.urlopen(req))["prompt"]
    for needle in (f'"name": "{call.function.name}"', "<tool_response>\n" + json.dumps(result)):
        if needle not in prompt:
            fails.append(f"round trip: the prompt lacks {needle!r}")
    print(f"{model}: round trip final answer: {text!r}")
    return fails


def refusals(client, model):
    bad = [
        ("tool_choice", dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})),
        ("tool_choice", dict(tool_choice="required")),
        ("tools", dict(tools=[{"type": "function", "function": {"name": "bad name!"}}])),
        ("tools", dict(tools=[{"type": "retrieval"}])),
        ("response_format", dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"})),
    ]
    fails = []
    for field, args in bad:
        try:
            client.chat.completions.create(model=model, messages=msgs("hi"), max_tokens=5, **args)
            fails.append(f"{field}: accepted, expected a 400")
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            if body.get("param") != field:
                fails.append(f"{field}: 400 names {body.get('param')!r}: {body.get('message')}")
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--model", action="append", required=True)
    a = ap.parse_args()
    sys.exit(0 if check_models(a.pagellm, a.model, 8, run) else 1)


if __name__ == "__main__":
    main()
