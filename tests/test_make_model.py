"""graphc make-model: tiny random-weight models of real mlx-lm architectures."""

from __future__ import annotations

import argparse
import json

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from graphc.compiler.modelgen import (
    ARCHS,
    add_cli_arguments,
    demo_model_path,
    make_config,
    make_model,
    run_cli,
)

PROMPT = "Once upon a time, in a small village near the edge of a great forest, there lived"


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """arch -> (path, model, tokenizer), each built and loaded once per session."""
    root = tmp_path_factory.mktemp("models")
    cache = {}

    def get(arch):
        if arch not in cache:
            path = make_model(arch, root / arch, seed=0)
            model, tok = mlx_lm.load(str(path))
            cache[arch] = (path, model, tok)
        return cache[arch]

    return get


def _logits(model, tok, text=PROMPT):
    ids = mx.array([tok.encode(text)])
    out = model(ids)
    mx.eval(out)
    return out[0]


def test_archs_listed():
    assert ARCHS == ("llama", "qwen3", "gpt_oss", "gemma3_text", "qwen3_next")


@pytest.mark.parametrize("arch", ARCHS)
def test_folder_loads_and_logits_are_sane(built, arch):
    path, model, tok = built(arch)
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json"} <= names
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == arch
    assert cfg["vocab_size"] == len(tok.get_vocab())

    logits = _logits(model, tok)
    assert logits.shape[-1] == cfg["vocab_size"]
    assert mx.all(mx.isfinite(logits)).item()
    # Non-degenerate: a spread of a few units, and not one token everywhere.
    std = mx.std(logits[-1]).item()
    assert 0.5 < std < 20, std
    assert len(set(mx.argmax(logits, axis=-1).tolist())) > 3


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_depends_on_prompt(built, arch):
    _, model, tok = built(arch)
    a = mlx_lm.generate(model, tok, "The king said", max_tokens=8)
    b = mlx_lm.generate(model, tok, "Once upon a time there was a fox", max_tokens=8)
    assert a != b


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_round_trip_and_chat_template(built, arch):
    _, _, tok = built(arch)
    for text in ["hello world", "Once upon a time, a fox said: \"Hi!\"\n  ok", "héllo ☃"]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.decode(tok.encode("hello world")) == "hello world"
    vocab = tok.get_vocab()
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert special in vocab
    # <|im_end|> and <|endoftext|> both stop generation.
    assert {vocab["<|im_end|>"], vocab["<|endoftext|>"]} <= set(tok.eos_token_ids)
    msgs = [{"role": "user", "content": "Tell me a story."}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True)
    assert ids[0] == vocab["<|im_start|>"]


def test_llama_and_qwen3_features(built):
    _, llama, _ = built("llama")
    assert all(isinstance(c, KVCache) for c in llama.make_cache())
    _, qwen3, _ = built("qwen3")
    attn = qwen3.layers[0].self_attn
    assert hasattr(attn, "q_norm") and hasattr(attn, "k_norm")
    # Norm weights are random around 1, so the q/k norms really act.
    assert mx.std(attn.q_norm.weight).item() > 0.01


def test_gpt_oss_sliding_sinks_and_moe(built, tmp_path):
    path, model, tok = built("gpt_oss")
    cfg = json.loads((path / "config.json").read_text())
    assert set(cfg["layer_types"]) == {"sliding_attention", "full_attention"}
    assert cfg["sliding_window"] == 8
    assert cfg["num_local_experts"] > cfg["num_experts_per_tok"] == 2
    caches = model.make_cache()
    rotating = [c for c in caches if isinstance(c, RotatingKVCache)]
    assert rotating and len(rotating) < len(caches)
    assert all(c.max_size == 8 for c in rotating)
    assert all(mx.any(layer.self_attn.sinks != 0).item() for layer in model.layers)

    base = _logits(model, tok)
    assert len(tok.encode(PROMPT)) > 8  # long enough for the window to bind
    # The window binds: the same weights with a huge window give other logits.
    wide, _ = mlx_lm.load(str(path), model_config={"sliding_window": 4096})
    assert not mx.allclose(base, _logits(wide, tok), atol=1e-4).item()
    # The sinks matter: zero them and the logits move.
    nosink, _ = mlx_lm.load(str(path))
    for layer in nosink.layers:
        layer.self_attn.sinks = mx.zeros_like(layer.self_attn.sinks)
    assert not mx.allclose(base, _logits(nosink, tok), atol=1e-4).item()

    small = make_model("gpt_oss", tmp_path / "w4", sliding_window=4, num_layers=2)
    m4, _ = mlx_lm.load(str(small))
    assert [c.max_size for c in m4.make_cache() if isinstance(c, RotatingKVCache)] == [4]


def test_gemma3_sliding_pattern(built):
    path, model, _ = built("gemma3_text")
    cfg = json.loads((path / "config.json").read_text())
    pattern = cfg["sliding_window_pattern"]
    assert cfg["num_hidden_layers"] % pattern == 0
    kinds = [type(c) for c in model.make_cache()]
    assert RotatingKVCache in kinds and KVCache in kinds
    assert all(c.max_size == cfg["sliding_window"] == 8
               for c in model.make_cache() if isinstance(c, RotatingKVCache))
    # Tied embeddings: no lm_head stored, sanitize() ties on load.
    assert "lm_head.weight" not in mx.load(str(path / "model.safetensors"))
    assert model.tie_word_embeddings


def test_qwen3_next_linear_and_full_layers(built):
    path, model, _ = built("qwen3_next")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["full_attention_interval"] == 2
    linear = [layer.is_linear for layer in model.layers]
    assert any(linear) and not all(linear)
    kinds = {type(c) for c in model.make_cache()}
    assert kinds == {ArraysCache, KVCache}
    # MoE with a shared expert in every layer.
    assert all(hasattr(layer.mlp, "switch_mlp") for layer in model.layers)
    # Saved in mlx layout, so sanitize() must not shift norms by +1: the loaded
    # norm scales are the saved ones (around 1, not around 2).
    assert abs(mx.mean(model.model.norm.weight).item() - 1.0) < 0.2


def test_seed_determinism(tmp_path):
    a = mx.load(str(make_model("gpt_oss", tmp_path / "a", seed=3) / "model.safetensors"))
    b = mx.load(str(make_model("gpt_oss", tmp_path / "b", seed=3) / "model.safetensors"))
    c = mx.load(str(make_model("gpt_oss", tmp_path / "c", seed=4) / "model.safetensors"))
    assert a.keys() == b.keys() == c.keys()
    assert all(mx.array_equal(a[k], b[k]).item() for k in a)
    assert not all(mx.array_equal(a[k], c[k]).item() for k in a)


def test_sizes_and_dtype(tmp_path):
    path = make_model(
        "llama", tmp_path / "m", hidden_size=32, num_layers=3, num_heads=2,
        num_kv_heads=1, intermediate_size=48, dtype="bfloat16",
    )
    cfg = json.loads((path / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (32, 3, 1)
    w = mx.load(str(path / "model.safetensors"))
    assert all(v.dtype == mx.bfloat16 for v in w.values())
    model, tok = mlx_lm.load(str(path))
    assert mx.all(mx.isfinite(_logits(model, tok))).item()


def test_other_vocab_size_trains_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    path = make_model("qwen3", tmp_path / "m", vocab_size=600)
    cached = list((tmp_path / "cache" / "tokenizers").glob("bpe-600-*.json"))
    assert len(cached) == 1
    model, tok = mlx_lm.load(str(path))
    assert len(tok.get_vocab()) == 600
    assert tok.decode(tok.encode("hello world")) == "hello world"


def test_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="supported: llama, qwen3, gpt_oss, gemma3_text, qwen3_next"):
        make_model("mistral", tmp_path / "x")
    with pytest.raises(ValueError, match="multiple of sliding_window_pattern"):
        make_config("gemma3_text", num_layers=3)
    with pytest.raises(ValueError, match="no sliding-window layers"):
        make_config("qwen3", sliding_window=4)
    with pytest.raises(ValueError, match="vocab_size must be at least"):
        make_model("llama", tmp_path / "y", vocab_size=100)


def test_make_model_cli_writes_the_config_and_rejects_an_unsupported_window(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    args = parser.parse_args(
        ["--arch", "gemma3_text", "--out", str(tmp_path / "g"), "--seed", "1",
         "--num-layers", "2", "--sliding-window", "4"]
    )
    assert run_cli(args) == 0
    assert "config.json" in capsys.readouterr().out
    cfg = json.loads((tmp_path / "g" / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["sliding_window"]) == (2, 4)
    bad = parser.parse_args(["--arch", "qwen3", "--out", str(tmp_path / "q"), "--sliding-window", "4"])
    assert run_cli(bad) == 2


def test_random_demo_is_cached_once(tmp_path, monkeypatch):
    from graphc.compiler.modelgen import demo

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    first = demo.random_demo_path()
    assert first.parent == tmp_path and first.name.startswith("demo-llama-")
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert demo.random_demo_path() == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    model, tok = mlx_lm.load(str(first))
    assert mlx_lm.generate(model, tok, "hello", max_tokens=4)


def test_demo_model_path_loads():
    path = demo_model_path()
    model, tok = mlx_lm.load(str(path))
    assert mlx_lm.generate(model, tok, "Once upon a time", max_tokens=8)


def test_shipped_demo_speaks():
    """The trained demo (package data) writes words from its corpus, not noise."""
    import re

    from graphc.compiler.modelgen import demo
    from graphc.compiler.modelgen.tokenizer import corpus_text

    if not demo._shipped_demo_ok(demo.SHIPPED_DEMO_DIR):
        pytest.skip("trained demo model not present")
    assert demo_model_path() == demo.SHIPPED_DEMO_DIR
    model, tok = mlx_lm.load(str(demo.SHIPPED_DEMO_DIR))
    text = mlx_lm.generate(model, tok, "Once upon a time", max_tokens=40)
    words = re.findall(r"[A-Za-z]+", text)
    known = set(re.findall(r"[A-Za-z]+", corpus_text()))
    assert len(words) >= 15
    assert sum(w in known for w in words) / len(words) > 0.9, text
