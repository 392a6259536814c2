"""Legacy completions logprobs: tokens that are not UTF-8 on their own are keyed `bytes:\\xNN`.

Byte-level BPE has one token per byte; two partial characters would both print as U+FFFD and
collapse into one key of a top_logprobs dict. OpenAI spells such tokens `bytes:\\xe2\\x80`.
"""

from __future__ import annotations

import httpx
import mlx_lm

from graphc.runtime.server.logprobs import TokenText, _gpt2_byte_decoder, _top_dict


def test_partial_utf8_tokens_get_bytes_keys(model_dir):
    _, tok = mlx_lm.load(str(model_dir("llama")))
    texts = TokenText(tok)
    char_of = {b: c for c, b in _gpt2_byte_decoder().items()}
    e2, c3 = (tok.convert_tokens_to_ids(char_of[b]) for b in (0xE2, 0xC3))
    a = tok.convert_tokens_to_ids("a")
    assert texts.text(e2) == texts.text(c3) == "\ufffd"  # what made them collide
    assert texts.key(e2) == "bytes:\\xe2" and texts.key(c3) == "bytes:\\xc3"
    assert texts.key(a) == "a"
    top = _top_dict([(e2, -1.0), (c3, -2.0), (a, -3.0)], texts)
    assert top == {"bytes:\\xe2": -1.0, "bytes:\\xc3": -2.0, "a": -3.0}


def test_top_logprobs_dicts_keep_n_entries(server):
    for seed in range(3):
        r = httpx.post(server.url + "/v1/completions", json={
            "model": "tiny", "prompt": "Once upon a time", "max_tokens": 16, "logprobs": 5,
            "temperature": 1.0, "seed": seed}, timeout=60)
        lp = r.json()["choices"][0]["logprobs"]
        assert all(len(d) == 5 for d in lp["top_logprobs"]), lp["top_logprobs"]
        assert len(lp["tokens"]) == len(lp["top_logprobs"])
