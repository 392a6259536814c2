"""JSON-schema hygiene before a schema becomes a grammar.

JSON Schema allows extra properties unless a schema says `additionalProperties: false`.
Clients that build schemas from classes (instructor, pydantic's model_json_schema) leave
that out, and a grammar that lets a model add keys lets a weak model add them forever until
max_tokens cuts the document short (instructor's IncompleteOutputException). graphc
therefore closes every object schema that lists `properties` and says nothing about extra
ones. A schema that wants extra keys says so: `additionalProperties: true` (or a schema),
or `patternProperties`, or `unevaluatedProperties`; those are left alone.
"""

from __future__ import annotations

from typing import Any

# keywords whose value is one subschema / a list of them / a dict of them
_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames",
        "additionalProperties", "unevaluatedItems", "unevaluatedProperties")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_DICT = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPEN = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def close_objects(schema: Any, _close_here: bool = True) -> Any:
    """A copy of `schema` where every object schema with `properties` and no word on extra keys
    gets `additionalProperties: false`. Booleans and non-dict values pass through. The direct
    members of an allOf are not closed themselves (each would forbid the others' properties)."""
    if isinstance(schema, list):
        return [close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for k in _ONE:
        if isinstance(out.get(k), (dict, list)):
            out[k] = close_objects(out[k])
    for k in _LIST:
        if isinstance(out.get(k), list):
            out[k] = [close_objects(s, k != "allOf") for s in out[k]]
    for k in _DICT:
        if isinstance(out.get(k), dict):
            out[k] = {name: close_objects(s) for name, s in out[k].items()}
    if _close_here and "properties" in out and not any(k in out for k in _OPEN):
        out["additionalProperties"] = False
    return out
