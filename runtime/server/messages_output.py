"""What /v1/messages sends back, shared by the whole reply and the stream: tool_use blocks,
usage in Anthropic's split, the stop sequence that matched, and the stop_reason."""

from __future__ import annotations

import json


def tool_use_block(call: dict) -> dict:
    """A chat tool call (tool_output.py's dict) as a tool_use block with an Anthropic-style id."""
    fn = call["function"]
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": fn["name"],
            "input": json.loads(fn["arguments"])}


def thinking_block(text: str) -> dict:
    """The thinking as a thinking block; graphc signs nothing, so the signature is empty."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def usage(prompt_tokens: int, output_tokens: int, cached: int) -> dict:
    return {"input_tokens": prompt_tokens - cached, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def matched_stop(state, res, stops: list[str] | None) -> str | None:
    """The stop sequence that ended `res`, if one did: the engine cuts the text before it, so
    it is what the full decode of the generated tokens continues with. A stop token (EOS)
    is not a stop sequence."""
    if not stops or res.finish_reason != "stop" or not res.token_ids:
        return None
    if res.token_ids[-1] in state.engine.eos_token_ids:
        return None
    full = state.tokenizer.decode(res.token_ids)
    rest = full[len(res.text):] if full.startswith(res.text) else full
    return next((s for s in stops if s and rest.startswith(s)), None) or \
        next((s for s in stops if s and s in rest), None)


def stop_reason(finish_reason: str, called: bool, stop_sequence: str | None) -> str:
    if called and finish_reason == "stop":
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"
