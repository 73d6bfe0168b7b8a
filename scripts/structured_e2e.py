#!/usr/bin/env python3
"""Structured outputs end to end: `pagellm serve` driven by the official `openai` SDK.

For each model given, starts the server and checks that
- every reply to 22 JSON schemas (nested objects, arrays with bounds, enums, numbers
  with ranges, required and optional fields, anyOf, consts, patterns) validates against
  its schema with Python's `jsonschema`, at temperature 0 and 0.8, through OpenAI's
  `response_format`, with a streamed request among them;
- replies to regexes (vLLM's `structured_outputs`) match them whole, and replies to
  choice lists are one of the choices (vLLM's older `guided_choice`), both temperatures;
- `json_object` gives a JSON object, and a GBNF grammar is followed;
- a schema, regex or grammar that does not compile is answered 400 naming it, and a
  field the server cannot honour (`best_of`, `suffix`) is refused, not ignored.

Requests run 16 at a time, so constrained requests share batches. Prints one line per
failure and a summary per model; exits non-zero if anything failed.

Usage:
    python3 scripts/structured_e2e.py --pagellm target/release/pagellm \\
        --model smollm2-135m --model qwen2.5-coder-0.5b
"""

import argparse
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

from openai_conformance import check_models

S = {"type": "string", "maxLength": 40}
SCHEMAS = {
    "person": {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"]},
    "book": {"type": "object", "properties": {"title": S, "author": S, "year": {"type": "integer", "minimum": 1450, "maximum": 2030},
                                              "isbn": {"type": "string", "pattern": "^[0-9]{13}$"}},
             "required": ["title", "author", "year"]},
    "point": {"type": "object", "properties": {"x": {"type": "number", "minimum": -10, "maximum": 10},
                                               "y": {"type": "number", "minimum": -10, "maximum": 10}},
              "required": ["x", "y"], "additionalProperties": False},
    "colors": {"type": "array", "items": {"enum": ["red", "green", "blue", "yellow"]}, "minItems": 2, "maxItems": 4},
    "weather": {"type": "object", "properties": {"city": S, "unit": {"enum": ["celsius", "fahrenheit"]},
                                                 "temperature": {"type": "number", "minimum": -90, "maximum": 60}},
                "required": ["city", "unit", "temperature"]},
    "order": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                                             "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["sku", "qty"]}},
        "express": {"type": "boolean"}}, "required": ["id", "items"]},
    "contact": {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
                                                 "phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}},
                "anyOf": [{"required": ["email"]}, {"required": ["phone"]}]},
    "shape": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number", "exclusiveMinimum": 0, "maximum": 100}},
         "required": ["kind", "radius"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number", "exclusiveMinimum": 0, "maximum": 100}},
         "required": ["kind", "side"], "additionalProperties": False}]},
    "tags": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                       "minItems": 1, "maxItems": 5}},
             "required": ["tags"]},
    "score": {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1},
                                               "label": {"enum": ["positive", "negative", "neutral"]}},
              "required": ["score", "label"]},
    "address": {"type": "object", "properties": {
        "street": S, "city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "country": {"type": "string", "enum": ["US", "FR", "DE", "JP"]}}, "required": ["street", "city", "country"]},
    "nested": {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": S, "profile": {"type": "object", "properties": {"bio": {"type": "string", "maxLength": 60},
                                                               "followers": {"type": "integer", "minimum": 0, "maximum": 1000000}},
                               "required": ["followers"]}}, "required": ["name", "profile"]}}, "required": ["user"]},
    "matrix": {"type": "array", "minItems": 2, "maxItems": 2,
               "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": -9, "maximum": 9}}},
    "event": {"type": "object", "properties": {"name": S, "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
                                               "attendees": {"type": "integer", "minimum": 1, "maximum": 500}},
              "required": ["name", "date"]},
    "boolean": {"type": "object", "properties": {"answer": {"type": "boolean"}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
                "required": ["answer"]},
    "nullable": {"type": "object", "properties": {"middle_name": {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "null"}]},
                                                  "first_name": S}, "required": ["first_name", "middle_name"]},
    "recipe": {"type": "object", "properties": {
        "name": S, "servings": {"type": "integer", "minimum": 1, "maximum": 12},
        "ingredients": {"type": "array", "minItems": 2, "maxItems": 4, "items": {"type": "object", "properties": {
            "item": {"type": "string", "maxLength": 20}, "grams": {"type": "integer", "minimum": 1, "maximum": 1000}},
            "required": ["item", "grams"]}}}, "required": ["name", "servings", "ingredients"]},
    "version": {"type": "object", "properties": {"major": {"type": "integer", "minimum": 0, "maximum": 99},
                                                 "minor": {"type": "integer", "minimum": 0, "maximum": 99},
                                                 "tag": {"enum": ["alpha", "beta", "rc", "stable"]}},
                "required": ["major", "minor", "tag"], "additionalProperties": False},
    "http": {"type": "object", "properties": {"method": {"enum": ["GET", "POST", "PUT", "DELETE"]},
                                              "path": {"type": "string", "pattern": "^/[a-z/]{0,30}$"},
                                              "status": {"type": "integer", "minimum": 100, "maximum": 599}},
             "required": ["method", "path", "status"]},
    "sentiment_list": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
        "text": {"type": "string", "maxLength": 30}, "positive": {"type": "boolean"}}, "required": ["text", "positive"]}},
    "const": {"type": "object", "properties": {"schema_version": {"const": 2}, "ok": {"type": "boolean"}},
              "required": ["schema_version", "ok"]},
    "numbers": {"type": "object", "properties": {"primes": {"type": "array", "items": {"type": "integer", "minimum": 2, "maximum": 100},
                                                            "minItems": 3, "maxItems": 5},
                                                 "sum": {"type": "integer"}}, "required": ["primes", "sum"]},
}

REGEXES = {
    "phone": r"[0-9]{3}-[0-9]{3}-[0-9]{4}",
    "date": r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])",
    "word": r"[A-Z][a-z]{2,10}",
    "hex": r"0x[0-9a-f]{4,8}",
}
CHOICES = [
    ("Is the sky blue on a clear day?", ["yes", "no"]),
    ("What is the capital of France?", ["Paris", "London", "Berlin", "Madrid"]),
    ("Classify the sentiment of: I love this movie!", ["positive", "negative", "neutral"]),
    ("Which is a programming language?", ["Python", "Banana", "Mountain"]),
    ("Pick a primary color.", ["red", "blue", "yellow"]),
]
GBNF = 'root ::= "The answer is " ("yes" | "no") "."'


def chat(name: str) -> list:
    return [{"role": "user", "content": f"Reply with a JSON value describing a {name.replace('_', ' ')}."}]


def run(client: openai.OpenAI, model: str) -> list:
    """Every check for one model; returns the failures."""
    jobs = []
    for temp in (0.0, 0.8):
        for i, (name, schema) in enumerate(SCHEMAS.items()):
            jobs.append(("schema", name, temp, schema, i == 3))
        for name, rx in REGEXES.items():
            jobs.append(("regex", name, temp, rx, False))
        for q, opts in CHOICES:
            jobs.append(("choice", q, temp, opts, False))
    jobs.append(("json_object", "json_object", 0.0, None, False))
    jobs.append(("grammar", "gbnf", 0.0, GBNF, False))

    def one(job):
        kind, name, temp, spec, stream = job
        args = dict(model=model, temperature=temp, seed=7, max_tokens=300)
        if kind == "schema":
            args.update(messages=chat(name), response_format={
                "type": "json_schema", "json_schema": {"name": name, "schema": spec}})
        elif kind == "regex":
            args.update(messages=[{"role": "user", "content": f"Write a {name}."}],
                        extra_body={"structured_outputs": {"regex": spec}})
        elif kind == "choice":
            args.update(messages=[{"role": "user", "content": name}], extra_body={"guided_choice": spec})
        elif kind == "json_object":
            args.update(messages=chat("list of fruits"), response_format={"type": "json_object"})
        else:
            args.update(messages=[{"role": "user", "content": "Is water wet?"}], extra_body={"guided_grammar": spec})
        label = f"{kind} {name!r} T={temp}"
        try:
            if stream:
                text, finish = "", None
                for ch in client.chat.completions.create(stream=True, **args):
                    if ch.choices:
                        text += ch.choices[0].delta.content or ""
                        finish = ch.choices[0].finish_reason or finish
            else:
                r = client.chat.completions.create(**args)
                text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        except Exception as e:  # noqa: BLE001 - report every failure, go on
            return f"{label}: request failed: {e}"
        if finish != "stop":
            return f"{label}: finish_reason {finish!r}, text {text!r}"
        try:
            if kind == "schema":
                jsonschema.validate(json.loads(text), spec)
            elif kind == "regex" and not re.fullmatch(spec, text):
                return f"{label}: {text!r} does not match"
            elif kind == "choice" and text not in spec:
                return f"{label}: {text!r} is not a choice"
            elif kind == "json_object" and not isinstance(json.loads(text), dict):
                return f"{label}: {text!r} is not an object"
            elif kind == "grammar" and text not in ("The answer is yes.", "The answer is no."):
                return f"{label}: {text!r} does not follow the grammar"
        except (ValueError, jsonschema.ValidationError) as e:
            return f"{label}: {text!r}: {str(e).splitlines()[0]}"
        return None

    with ThreadPoolExecutor(16) as ex:
        fails = [f for f in ex.map(one, jobs) if f]
    n_schema = sum(1 for j in jobs if j[0] == "schema")
    print(f"{model}: {len(jobs) - len(fails)}/{len(jobs)} constrained replies valid "
          f"({n_schema} schema replies, {len(SCHEMAS)} schemas x 2 temperatures)")
    return fails + refusals(client, model)


def refusals(client: openai.OpenAI, model: str) -> list:
    """Requests that must be answered 400 naming the field."""
    msgs = [{"role": "user", "content": "hi"}]
    bad = [
        ("response_format", dict(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}})),
        ("structured_outputs", dict(extra_body={"structured_outputs": {"regex": "[a-"}})),
        ("guided_json", dict(extra_body={"guided_json": {"type": "array", "uniqueItems": True}})),
        ("guided_grammar", dict(extra_body={"guided_grammar": "root ::= undefined-rule"})),
        ("guided_choice", dict(extra_body={"guided_choice": []})),
        ("response_format", dict(response_format={"type": "yaml"})),
        ("best_of", dict(extra_body={"best_of": 2})),
        ("suffix", dict(extra_body={"suffix": "!"})),
    ]
    fails = []
    for field, args in bad:
        try:
            client.chat.completions.create(model=model, messages=msgs, max_tokens=5, **args)
            fails.append(f"{field}: accepted, expected a 400")
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            if body.get("param") != field:
                fails.append(f"{field}: 400 names {body.get('param')!r}: {body.get('message')}")
        except Exception as e:  # noqa: BLE001
            fails.append(f"{field}: {type(e).__name__}: {e}")
    return fails


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--model", action="append", required=True)
    a = ap.parse_args()
    sys.exit(0 if check_models(a.pagellm, a.model, 16, lambda client, base, model: run(client, model)) else 1)


if __name__ == "__main__":
    main()
