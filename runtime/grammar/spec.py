"""What a request asks its output to match. Plain data; compiled per request by GrammarCompiler."""

from __future__ import annotations

import json
from typing import Any

import attrs

KINDS = ("json_schema", "json_object", "regex", "lark")


@attrs.frozen
class Grammar:
    """`kind` is one of json_schema, json_object, regex, lark; `source` its text (schema as JSON text)."""

    kind: str
    source: str = ""

    def __attrs_post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @classmethod
    def json_schema(cls, schema: dict | str) -> "Grammar":
        text = schema if isinstance(schema, str) else json.dumps(schema)
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
        return cls("json_schema", text)

    @classmethod
    def json_object(cls) -> "Grammar":
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> "Grammar":
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str) -> "Grammar":
        return cls("lark", grammar)

    @classmethod
    def coerce(cls, value: Any) -> "Grammar":
        """Accept a Grammar or a dict like {"type": "regex", "pattern": "..."} / {"type": "json_schema", "schema": {...}}."""
        if isinstance(value, Grammar):
            return value
        if isinstance(value, dict):
            kind = value.get("type")
            if kind == "json_schema":
                return cls.json_schema(value.get("schema", value.get("json_schema", {})))
            if kind == "json_object":
                return cls.json_object()
            if kind == "regex":
                return cls.regex(value["pattern"])
            if kind == "lark":
                return cls.lark(value["grammar"])
        raise ValueError(f"cannot make a grammar from {value!r}; use Grammar.json_schema / regex / lark / json_object")
