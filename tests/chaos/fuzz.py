"""Seeded generator of hostile request bodies for the chaos tests (and docs/reliability.md).

Each body starts from a valid /v1/completions or /v1/chat/completions request and applies one
or two mutations: a field set to a value of the wrong type or far out of range (2**31, 2**63,
-1, 1e308, huge strings), lone UTF-16 surrogates in any text field, deep nesting, unknown
fields, truncated / non-UTF-8 / non-object JSON. Returns raw bytes (some are not valid JSON)."""

from __future__ import annotations

import json
import random

NUMERIC = ["max_tokens", "min_tokens", "n", "temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty",
           "presence_penalty", "repetition_penalty", "logprobs", "top_logprobs", "max_completion_tokens"]
TEXT = ["prompt", "model", "stop", "user", "suffix"]
WEIRD = [2**31, 2**31 - 1, 2**32, 2**63, 2**64, -(2**63) - 1, -1, 0, 10**30, 1e308, -1e308, 1e-320, 0.5, True, None,
         "1", "", [], {}, [1, 2], {"a": 1}, "\ud800", 10**400]
SURROGATES = ["\ud800", "\udfff", "a\udc80b", "\ud83d", "ok\ud800\ud800"]


def _deep(depth: int, kind: str):
    v = 1
    for _ in range(depth):
        v = [v] if kind == "list" else {"a": v}
    return v


def _base(rng: random.Random, chat: bool) -> dict:
    body = {"model": "tiny", "max_tokens": rng.randint(1, 4), "temperature": rng.choice([0, 0.7])}
    if chat:
        body["messages"] = [{"role": "user", "content": rng.choice(["hi", "hello there", "x"])}]
    else:
        body["prompt"] = rng.choice(["hi", "Once upon", [5, 6, 7], ["a", "b"]])
    if rng.random() < 0.3:
        body["stream"] = True
    return body


def _mutate(rng: random.Random, body: dict, chat: bool):
    m = rng.randrange(12)
    if m == 0:
        body[rng.choice(NUMERIC)] = rng.choice(WEIRD)
    elif m == 1:
        field = rng.choice(TEXT)
        body[field] = rng.choice(SURROGATES) if field != "stop" else [rng.choice(SURROGATES)]
    elif m == 2 and chat:
        body["messages"] = [{"role": rng.choice(["user", "system", "bogus", ""]),
                             "content": rng.choice(SURROGATES + ["ok", None, 5, [{"type": "text", "text": "\ud800"}]])}]
    elif m == 2:
        body["prompt"] = rng.choice([[2**31], [-1], [[]], [[1, "a"]], [True], [1.5], "", [], [""] * 3, 5])
    elif m == 3:
        body[rng.choice(["logit_bias", "prompt", "stop", "response_format", "tool_choice", "messages"])] = \
            _deep(rng.choice([63, 65, 200, 1000, 5000]), rng.choice(["list", "dict"]))
    elif m == 4:
        body["logit_bias"] = rng.choice([{"\ud800": 1}, {"99999999999999999999": 1}, {"1": 1e308}, {"1": "x"},
                                         {str(2**31): 5}, {"-1": 1}])
    elif m == 5:
        body["stop_token_ids"] = rng.choice([[2**31], [2**63], [-5], ["a"], [None]])
    elif m == 6:
        body["response_format"] = rng.choice([{"type": "json_schema", "json_schema": {"schema": {"type": "\ud800"}}},
                                              {"type": "json_schema", "json_schema": {"schema": _deep(70, "dict")}},
                                              {"type": "json_object"}, {"type": "nope"}, "text", None])
    elif m == 7:
        body["stream_options"] = rng.choice([{"include_usage": "yes"}, [], {"include_usage": True}])
    elif m == 8:
        body[rng.choice(["x", "\ud800", "metadata"])] = rng.choice(WEIRD[:-1])
    elif m == 9:
        body["prompt" if not chat else "messages"] = rng.choice(["a" * rng.randint(1000, 200000),
                                                               [{"role": "user", "content": "b" * 150000}]])
    elif m == 10:
        body["n"] = rng.choice([0, 17, 2**31, 3])
    else:
        body["echo"], body["logprobs"] = rng.choice([(True, 5), (True, 2**31), ("x", 1), (True, -1)])
    return body


def hostile_bodies(count: int, seed: int = 0):
    """(path, raw bytes) pairs; deterministic for a seed."""
    rng = random.Random(seed)
    for _ in range(count):
        chat = rng.random() < 0.5
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body = _mutate(rng, _base(rng, chat), chat)
        if rng.random() < 0.3:
            body = _mutate(rng, body, chat)
        try:
            raw = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        except (ValueError, RecursionError):
            raw = b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        r = rng.random()
        if r < 0.04:
            raw = raw[: rng.randrange(max(1, len(raw)))]  # truncated
        elif r < 0.06:
            raw = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))  # not JSON, not UTF-8
        elif r < 0.08:
            raw = rng.choice([b"[]", b"null", b"1", b'"x"', b"NaN", b'{"max_tokens": NaN}', b"{}"])
        yield path, raw
