"""Hybrid models (qwen3_next: gated-delta linear attention + full attention; jamba: mamba mixers +
attention) in growing chats:
recurrent-state snapshots at chat message boundaries and every `snapshot_interval` tokens, so
the next turn resumes where it parts from the previous prompt; greedy output equals mlx-lm's
own forward on the whole prompt (a cold run). See docs/cache-policies.md, "Hybrid models"."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import attrs
import httpx
import numpy as np
import pytest

from graphc.cli.main import build_parser
from graphc.compiler.modelgen.tokenizer import CHAT_TEMPLATE, write_tokenizer
from graphc.compiler.modelgen.weights import random_weights, save_weights
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.prefix_cache import PrefixCache
from graphc.runtime.server.cli import config_from_args
from graphc.runtime.server.message_bounds import render_with_boundaries
from graphc.runtime.server.state import ServerState, load_engine
from helpers import reference_greedy
from server_harness import MODEL, live_server

# A generation prompt the assistant message that later replaces it does not start with (Qwen3's
# template with thinking off does this): the previous prompt's end is no prefix of the next turn.
THINK_OFF = "<think>\n\n</think>\n\n"
THINK_TEMPLATE = CHAT_TEMPLATE.replace("{{ '<|im_start|>assistant\\n' }}{% endif %}",
                                       "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{% endif %}")
assert THINK_TEMPLATE != CHAT_TEMPLATE


# Mamba-style: jamba's mamba mixers (mlx-lm's MambaCache, policy ssm_state) between attention
# layers, through the generic lowering; graphc make-model does not build it, so the config is here.
JAMBA = dict(model_type="jamba", vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, attn_layer_offset=1, attn_layer_period=2,
             expert_layer_offset=1, expert_layer_period=4, mamba_d_conv=4, mamba_d_state=8, mamba_expand=2,
             num_experts=2, num_experts_per_tok=1, rms_norm_eps=1e-6, max_position_embeddings=4096,
             tie_word_embeddings=False, torch_dtype="float32")


@pytest.fixture(scope="module")
def hybrid_dir(model_dir):
    return model_dir("qwen3_next")


@pytest.fixture(scope="module", params=["qwen3_next", "jamba"])
def any_hybrid_dir(request, model_dir, tmp_path_factory):
    if request.param == "qwen3_next":
        return model_dir("qwen3_next")
    out = tmp_path_factory.mktemp("jamba")
    write_tokenizer(out, JAMBA["vocab_size"])
    save_weights(random_weights(JAMBA, 0), out)
    (out / "config.json").write_text(json.dumps(JAMBA))
    return out


@attrs.define
class _Req:
    context_ids: list
    params: SamplingParams


def test_capture_points_hold_message_ends_and_snapshot_interval():
    pc = PrefixCache(capacity=64, snapshots=True, max_snapshots=8, interval=4, snapshot_interval=10)
    req = _Req(list(range(25)), SamplingParams(prefix_boundaries=(0, 7, 13, 25, 40)))
    # Recurrent layers only: every 10 (not every 4), the message ends inside the prompt, L-1 and L.
    assert pc.capture_points(req) == {10, 20, 7, 13, 24, 25}
    win = PrefixCache(capacity=64, window=3, window_capacity=64, interval=4)
    assert win.capture_points(req) == {4, 8, 12, 16, 20, 24, 25, 7, 13}
    with pytest.raises(ValueError, match="snapshot interval"):
        PrefixCache(capacity=8, snapshots=True, snapshot_interval=0)
    with pytest.raises(ValueError, match="prefix_boundaries"):
        SamplingParams(prefix_boundaries=(3, -1)).validate()


def test_message_boundary_is_where_the_next_turn_resumes(any_hybrid_dir):
    """Turn 2 parts from turn 1 after turn 1's last message (its generation prompt differs): the
    snapshot at that message's end is the hit; without it, nothing before the prompt end is kept."""
    rng = np.random.default_rng(3)
    messages, gen = rng.integers(3, 1000, 45).tolist(), rng.integers(3, 1000, 5).tolist()
    turn1 = messages + gen
    turn2 = messages + rng.integers(3, 1000, 9).tolist() + rng.integers(3, 1000, 20).tolist()
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    bounded = attrs.evolve(params, prefix_boundaries=(20, len(messages)))
    eng = Engine.load(any_hybrid_dir, prefill_chunk=16, max_total_tokens=4096)
    assert "ssm_state" in {p.name for p in eng.compiled.binding.policies}
    eng.generate([turn1], bounded)
    [res] = eng.generate([turn2], attrs.evolve(params, prefix_boundaries=(len(messages) + 9,)))
    assert res.cached_tokens == len(messages)
    assert res.token_ids == reference_greedy(eng.model, turn2, 8)
    # Turn 3 grows turn 2 by a message: it resumes at turn 2's own message boundary.
    turn3 = turn2[:len(messages) + 9] + rng.integers(3, 1000, 12).tolist()
    [res3] = eng.generate([turn3], params)
    assert res3.cached_tokens == len(messages) + 9
    assert res3.token_ids == reference_greedy(eng.model, turn3, 8)
    eng.prefix.check()

    plain = Engine.load(any_hybrid_dir, prefill_chunk=16, max_total_tokens=4096)
    plain.generate([turn1], params)
    [cold] = plain.generate([turn2], params)
    assert cold.cached_tokens == 0 and cold.token_ids == res.token_ids


def test_snapshot_interval_bounds_what_a_long_message_recomputes(any_hybrid_dir):
    rng = np.random.default_rng(5)
    long = rng.integers(3, 1000, 70).tolist()
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    eng = Engine.load(any_hybrid_dir, prefill_chunk=16, max_total_tokens=4096, snapshot_interval=24)
    assert eng.prefix.snapshot_interval == 24
    eng.generate([long], params)
    edited = long[:60] + rng.integers(3, 1000, 10).tolist()
    [res] = eng.generate([edited], params)
    assert res.cached_tokens == 48  # the last multiple of 24 before the edit
    assert res.token_ids == reference_greedy(eng.model, edited, 6)
    assert Engine.load(any_hybrid_dir, prefill_chunk=16, max_total_tokens=64).prefix.snapshot_interval == 4096


def test_boundaries_are_message_ends_and_ids_equal_the_templates(hybrid_dir):
    tok = Engine.load(hybrid_dir, prefill_chunk=16, max_total_tokens=256).tokenizer
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": "hi! what now?"}, {"role": "user", "content": "count to three"}]
    flags = dict(add_generation_prompt=True, continue_final_message=False)
    ids, bounds = render_with_boundaries(tok, msgs, flags, {})
    assert ids == list(tok.apply_chat_template(msgs, tokenize=True, **flags))
    assert len(bounds) == 4 and max(bounds) < len(ids)  # the generation prompt follows the last end
    for b in bounds:
        assert tok.decode(ids[:b]).endswith("<|im_end|>\n"), tok.decode(ids[:b])
    cont = dict(add_generation_prompt=False, continue_final_message=True)
    ids_c, bounds_c = render_with_boundaries(tok, msgs[:3], cont, {})
    assert ids_c == list(tok.apply_chat_template(msgs[:3], tokenize=True, **cont))
    assert len(bounds_c) == 2  # the open assistant message has no end yet


def _think_model(hybrid_dir, tmp_path):
    out = tmp_path / "think"
    shutil.copytree(hybrid_dir, out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = THINK_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return out


def _chat(url, messages, max_tokens=8, **extra):
    r = httpx.post(url + "/v1/chat/completions", timeout=120,
                   json={"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                         "ignore_eos": True, **extra})
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]


def _roundtrip_token(tok) -> int:
    """A token whose repeats decode and re-encode to themselves: an answer the next turn's template
    renders back to the very tokens that were generated."""
    special = set(tok.all_special_ids)
    for t in range(3, 1000):
        if t not in special and tok.encode(tok.decode([t] * 8), add_special_tokens=False) == [t] * 8:
            return t
    raise AssertionError("no token of this vocabulary round-trips")


def test_chat_turn_two_reuses_turn_one_and_its_answer(hybrid_dir):
    """ChatML: turn 2 resumes after turn 1's prompt and answer, less the one template token after it."""
    eng = Engine.load(hybrid_dir, prefill_chunk=16, max_total_tokens=4096)
    tok = eng.tokenizer
    t = _roundtrip_token(tok)
    msgs = [{"role": "system", "content": "you are a terse assistant " * 4},
            {"role": "user", "content": "tell me about the weather in spring " * 3}]
    with live_server(engine=eng) as srv:
        answer, u1 = _chat(srv.url, msgs, logit_bias={str(t): 100})
        n_answer = u1["completion_tokens"]
        assert tok.encode(answer, add_special_tokens=False) == [t] * n_answer
        msgs2 = msgs + [{"role": "assistant", "content": answer}, {"role": "user", "content": "and in autumn?"}]
        text2, u2 = _chat(srv.url, msgs2)
    # The answer's last token was sampled, never fed: its state is not in any snapshot.
    assert u2["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"] + n_answer - 1
    ids2 = list(tok.apply_chat_template(msgs2, add_generation_prompt=True, tokenize=True))
    assert text2 == tok.decode(reference_greedy(eng.model, ids2, 8))


def test_chat_turns_resume_at_message_ends_when_the_generation_prompt_differs(hybrid_dir, tmp_path):
    """A template whose generation prompt the later assistant message does not repeat: each turn
    reuses everything up to the end of the previous turn's messages; the reply equals a cold run."""
    eng = Engine.load(_think_model(hybrid_dir, tmp_path), prefill_chunk=16, max_total_tokens=4096)
    tok = eng.tokenizer
    tail = len(tok.encode("<|im_start|>assistant\n" + THINK_OFF, add_special_tokens=False))
    msgs = [{"role": "system", "content": "you are a terse assistant " * 4},
            {"role": "user", "content": "tell me about the weather in spring " * 3}]
    with live_server(engine=eng) as srv:
        a1, u1 = _chat(srv.url, msgs)
        msgs2 = msgs + [{"role": "assistant", "content": a1}, {"role": "user", "content": "and in autumn?"}]
        a2, u2 = _chat(srv.url, msgs2)
        msgs3 = msgs2 + [{"role": "assistant", "content": a2}, {"role": "user", "content": "winter, then."}]
        a3, u3 = _chat(srv.url, msgs3)
        hits = srv.metric("graphc_prefix_cache_hits_total")
        assert srv.metric("graphc_prefix_cache_snapshots") >= 6  # per turn: its message ends, L-1, L, the answer end
        assert srv.metric("graphc_prefix_cache_snapshot_evictions_total") == 0
    assert u2["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"] - tail > 0
    assert u3["prompt_tokens_details"]["cached_tokens"] >= u2["prompt_tokens"] - tail
    assert hits >= 2
    for m, got in ((msgs2, a2), (msgs3, a3)):
        ids = list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True))
        assert got == tok.decode(reference_greedy(eng.model, ids, 8))


def test_restart_resumes_at_the_state_written_with_the_last_block(any_hybrid_dir, tmp_path):
    """With a disk tier, a hybrid model writes the recurrent state at each prompt's last block end
    beside the blocks; a new engine on the folder resumes there, output equal to a cold run; a
    corrupt state file is skipped (the hit falls back to an earlier block's state), removed and
    written again by the next prompt that computes that state."""
    rng = np.random.default_rng(11)
    conv = rng.integers(3, 1000, 90).tolist()
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    folder = tmp_path / "kv"
    first = Engine.load(any_hybrid_dir, prefill_chunk=16, max_total_tokens=4096, kv_cache_dir=str(folder),
                        kv_cache_block_tokens=16)
    assert first.disk_tier is not None
    for n in (40, 70):  # a growing conversation: turns of 40 and 70 tokens
        first.generate([conv[:n]], params)
    first.disk_tier.flush()
    assert first.cache_stats()["disk_spilled_states"] >= 2
    del first

    def restarted():
        return Engine.load(any_hybrid_dir, prefill_chunk=16, max_total_tokens=4096, kv_cache_dir=str(folder),
                           kv_cache_block_tokens=16)

    eng = restarted()
    [res] = eng.generate([conv], params)  # the next turn, 90 tokens, first on the new process
    # all 70 tokens the disk saw of this prompt: 4 blocks (of 16) and the tail file past them, whose
    # state at the earlier prompt's end (70) is where the hit resumes
    assert res.cached_tokens == 70
    assert res.token_ids == reference_greedy(eng.model, conv, 6)
    assert eng.cache_stats()["disk_loaded_tails"] == 1
    eng.prefix.check()
    eng.disk_tier.flush()  # it wrote the state at 80 of its own prompt too
    del eng
    for f in folder.rglob("*-tail*"):
        f.unlink()  # without the tails, a hit resumes at a block end's state file
    eng = restarted()
    [res] = eng.generate([conv], params)
    assert res.cached_tokens == 80 and res.token_ids == reference_greedy(eng.model, conv, 6)
    assert eng.cache_stats()["disk_loaded_states"] == 1
    eng.disk_tier.flush()
    del eng
    for f in folder.rglob("*-tail*"):
        f.unlink()

    at = {_state_start(f): f for f in folder.rglob("*-state*")}
    assert {32, 64, 80} <= set(at)
    raw = bytearray(at[80].read_bytes())
    raw[-1] ^= 0xFF  # a flipped byte in the data: the checksum no longer matches
    at[80].write_bytes(bytes(raw))
    eng = restarted()
    [res] = eng.generate([conv], params)
    assert res.cached_tokens == 64 and res.token_ids == reference_greedy(eng.model, conv, 6)
    assert eng.cache_stats()["disk_rejected_files"] == 1
    eng.disk_tier.flush()  # the corrupt file was removed; this prompt's own state at 80 replaced it
    assert at[80].read_bytes() != bytes(raw) and _state_start(at[80]) == 80


def _state_start(path) -> int:
    """The position a state file's metadata says it holds (safetensors: 8-byte header length, JSON)."""
    raw = path.read_bytes()
    head = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    return int(head["__metadata__"]["start"])


def test_restart_repeats_a_prompt_of_whole_blocks(hybrid_dir, tmp_path):
    """A prompt of exactly 3 blocks again after a restart: the hit resumes at the state before its
    last block (a hit never ends at the prompt's last token), not nowhere."""
    prompt = np.random.default_rng(2).integers(3, 1000, 48).tolist()
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    kw = dict(prefill_chunk=16, max_total_tokens=1024, kv_cache_dir=str(tmp_path / "kv"), kv_cache_block_tokens=16)
    first = Engine.load(hybrid_dir, **kw)
    first.generate([prompt], params)
    first.disk_tier.flush()
    del first
    eng = Engine.load(hybrid_dir, **kw)
    [res] = eng.generate([prompt], params)
    assert res.cached_tokens == 32 and res.token_ids == reference_greedy(eng.model, prompt, 4)


def test_metrics_count_state_files(hybrid_dir, tmp_path):
    eng = Engine.load(hybrid_dir, prefill_chunk=16, max_total_tokens=1024, kv_cache_dir=str(tmp_path / "kv"),
                      kv_cache_block_tokens=16)
    with live_server(engine=eng) as srv:
        r = httpx.post(srv.url + "/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": list(range(10, 60)), "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        httpx.post(srv.url + "/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 1})  # /metrics reads the next step's numbers
        assert srv.metric("graphc_prefix_cache_disk_states_total", op="written") >= 1
        assert srv.metric("graphc_prefix_cache_disk_states_total", op="read") == 0


def test_serve_flags_reach_the_engine(hybrid_dir, tmp_path):
    args = build_parser().parse_args(["serve", "--model", str(hybrid_dir), "--kv-cache-dir", str(tmp_path / "kv"),
                                      "--kv-cache-block-tokens", "32", "--snapshot-interval", "64"])
    eng = load_engine(config_from_args(args))
    assert eng.disk_tier.block == 32 and eng.prefix.snapshot_interval == 64


def test_only_caches_that_keep_state_at_message_ends_ask_for_them(hybrid_dir, model_dir):
    """The server finds message boundaries (extra template renders per chat request) only for an
    engine whose prefix cache keeps state there; a full-attention cache resumes at any token."""
    wants = ServerState.wants_boundaries.fget
    assert wants(SimpleNamespace(engine=Engine.load(hybrid_dir, prefill_chunk=16, max_total_tokens=256)))
    assert not wants(SimpleNamespace(engine=Engine.load(model_dir("llama"), max_total_tokens=256)))
    assert not wants(SimpleNamespace(engine=Engine.load(hybrid_dir, prefix_cache=False)))
    assert not wants(SimpleNamespace(engine=None))
