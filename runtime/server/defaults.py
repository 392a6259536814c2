"""What a request that leaves a field out gets: sampling defaults, a max_tokens default, and the
server-wide chat template and its arguments (the flags mlx_lm.server and vLLM users bring).

Sampling fields, each on its own, first found wins:

    the request's own value
    the server's flag            --temperature/--temp, --top-p, --top-k, --min-p, --repetition-penalty
    generation_config.json       the values the model's authors ship (transformers and vLLM read
                                 them too); --generation-config none ignores the file, and a
                                 file with "do_sample": false gives none (its numbers are unused
                                 by transformers then)
    OpenAI's defaults            temperature 1 (ServerConfig.default_temperature), top_p 1, no
                                 top_k / min_p / repetition penalty

`--max-tokens` is the budget of a request without one on every route that lets it out (OpenAI's
own defaults otherwise: the rest of the context on chat and Responses, 16 on /v1/completions).
`--chat-template` replaces the model's template (a file, or the template text itself), and
`--chat-template-args` are template keywords a request's own `chat_template_kwargs` add to or
override (e.g. `{"enable_thinking": false}` for a Qwen3 server that should not think by default).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Mapping

from .reasoning import RESERVED_TEMPLATE_KWARGS

log = logging.getLogger("graphc.server")

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
GENERATION_CONFIG = "generation_config.json"


def check_sampling_value(name: str, value: Any) -> float | int:
    """`value` for sampling field `name`, or ValueError saying what range it needs."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    ok = {"temperature": value >= 0, "top_p": 0 < value <= 1, "top_k": value >= -1 and float(value).is_integer(),
          "min_p": 0 <= value <= 1, "repetition_penalty": value > 0}[name]
    if not ok:
        need = {"temperature": "at least 0", "top_p": "in (0, 1]", "top_k": "a whole number, 0 or -1 for off",
                "min_p": "in [0, 1]", "repetition_penalty": "above 0"}[name]
        raise ValueError(f"{name} must be {need}, got {value!r}")
    return int(value) if name == "top_k" else float(value)


def generation_config_defaults(model_path: str | None) -> dict[str, float | int]:
    """The sampling fields of the model folder's generation_config.json (none for a .gguf file,
    a folder without one, or a file with do_sample false); a value out of range is left out with
    a warning, since the server still serves without it."""
    if not model_path:
        return {}
    path = Path(model_path) / GENERATION_CONFIG
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        log.warning("ignoring %s: %s", path, e)
        return {}
    if not isinstance(data, dict) or data.get("do_sample") is False:
        return {}
    out = {}
    for name in SAMPLING_FIELDS:
        if name in data and data[name] is not None:
            try:
                out[name] = check_sampling_value(name, data[name])
            except ValueError as e:
                log.warning("ignoring %s in %s: %s", name, path, e)
    return out


def sampling_defaults(flags: Mapping[str, float | int | None], model_path: str | None, read_file: bool,
                      temperature: float) -> tuple[dict[str, float | int], dict[str, str]]:
    """(defaults by field, where each came from: "flag" or the file's name); temperature is
    always there (`temperature`: OpenAI's default, the last resort)."""
    values: dict[str, float | int] = {"temperature": temperature}
    sources = {"temperature": "OpenAI's default"}
    for name, value in (generation_config_defaults(model_path) if read_file else {}).items():
        values[name], sources[name] = value, GENERATION_CONFIG
    for name, value in flags.items():
        if value is not None:
            values[name], sources[name] = value, "flag"
    return values, sources


def describe(values: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """One log line's worth: `temperature 0.6 (generation_config.json), top_p 0.95 (flag)`."""
    return ", ".join(f"{k} {values[k]:g} ({sources[k]})" for k in SAMPLING_FIELDS if k in values)


def read_template_args(value: str) -> dict:
    """--chat-template-args: a JSON object of template keywords, none of apply_chat_template's own."""
    try:
        args = json.loads(value)
    except ValueError as e:
        raise ValueError(f"--chat-template-args must be a JSON object: {e}") from None
    if not isinstance(args, dict):
        raise ValueError(f"--chat-template-args must be a JSON object, got {type(args).__name__}")
    bad = sorted(RESERVED_TEMPLATE_KWARGS.intersection(args))
    if bad:
        raise ValueError(f"--chat-template-args may not set {', '.join(bad)} (apply_chat_template's own arguments)")
    return args
