"""LoRA adapters (compiler/adapters.py): Engine.load(..., adapter_path=) and `--adapter-path`
serve the adapted model exactly as mlx-lm's own forward runs it with the same adapter, and
the adapter is part of the model's identity for the disk tier and the stored self-checks."""

from __future__ import annotations

import argparse
import json
import random

import httpx
import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm import load
from mlx_lm.tuner.utils import linear_to_lora_layers

from graphc.compiler.selfcheck_cache import _files
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache.disk_tier import model_identity
from graphc.runtime.server.cli import add_parser, config_from_args
from graphc.runtime.server import ServerConfig, create_app
from helpers import assert_greedy_matches_mlx_lm, reference_greedy
from server_harness import MODEL, LiveServer, wait_until


def write_adapter(model_path, out, seed: int, layers: int = 2, rank: int = 4):
    """An adapter as mlx_lm.lora saves one, with random B matrices (a freshly initialised LoRA
    adds nothing: B starts at zero) so that it changes the model's output."""
    model, _ = load(str(model_path))
    model.freeze()
    params = {"rank": rank, "scale": 2.0, "dropout": 0.0}
    linear_to_lora_layers(model, layers, params)
    mx.random.seed(seed)
    for _, m in model.named_modules():
        if hasattr(m, "lora_b"):
            m.lora_b = mx.random.normal(m.lora_b.shape) * 0.5
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), dict(tree_flatten(model.trainable_parameters())))
    (out / "adapter_config.json").write_text(json.dumps({"fine_tune_type": "lora", "num_layers": layers,
                                                         "lora_parameters": params}))
    return out


@pytest.fixture(scope="module")
def adapted(model_dir, tmp_path_factory):
    path = model_dir("llama")
    return path, write_adapter(path, tmp_path_factory.mktemp("adapter"), seed=1)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 200) for _ in range(rng.randrange(5, 40))] for _ in range(n)]


def test_adapted_engine_matches_mlx_lm_with_the_adapter(adapted):
    """Batched, chunked, and again with every prompt a prefix hit: mlx-lm's greedy tokens with
    the same adapter, and not the base model's."""
    path, adapter = adapted
    ref_model, _ = load(str(path), adapter_path=str(adapter))
    base_model, _ = load(str(path))
    engine = Engine.load(path, adapter_path=str(adapter), prefill_chunk=16)
    prompts = _prompts(4)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    for _ in range(2):  # the second pass hits the prefix cache on every prompt
        results = engine.generate(prompts, params)
        assert_greedy_matches_mlx_lm(ref_model, prompts, results, 10)
    with pytest.raises(AssertionError):
        assert_greedy_matches_mlx_lm(base_model, prompts, results, 10)
    assert engine.engine_config.adapter_path == str(adapter)


def test_a_missing_or_incomplete_adapter_folder_says_which(adapted, tmp_path):
    path, adapter = adapted
    with pytest.raises(FileNotFoundError, match="no adapter folder"):
        Engine.load(path, adapter_path=str(tmp_path / "nope"))
    half = tmp_path / "half"
    half.mkdir()
    (half / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    with pytest.raises(FileNotFoundError, match="has no adapters.safetensors"):
        Engine.load(path, adapter_path=str(half))


def test_the_adapter_is_part_of_the_model_identity(adapted, tmp_path):
    """Two adapters of one shape over one model: different disk-tier names and self-check keys, so
    one adapter's KV blocks or stored verdict never serve the other."""
    path, adapter = adapted
    other = write_adapter(path, tmp_path / "other", seed=2)
    engine = Engine.load(path)
    ids = {model_identity(engine.config, str(path), engine.compiled, a) for a in (None, str(adapter), str(other))}
    assert len(ids) == 3
    assert len({json.dumps(_files(str(path), a)) for a in (None, str(adapter), str(other))}) == 3


def test_disk_tier_blocks_of_the_base_model_are_not_read_by_the_adapted_one(adapted, tmp_path):
    path, adapter = adapted
    prompt = _prompts(1, seed=3)[0] * 4
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    kw = dict(kv_cache_dir=str(tmp_path / "kv"), kv_cache_block_tokens=16)
    Engine.load(path, **kw).generate([prompt], params)  # writes the base model's blocks
    got = Engine.load(path, adapter_path=str(adapter), **kw).generate([prompt], params)[0]
    assert got.cached_tokens == 0
    ref_model, _ = load(str(path), adapter_path=str(adapter))
    assert_greedy_matches_mlx_lm(ref_model, [prompt], [got], 6)


def _args(*argv):
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    return p.parse_args(["serve", *argv])


def test_serve_flag(adapted):
    path, adapter = adapted
    assert config_from_args(_args("--model", str(path), "--adapter-path", str(adapter))).adapter_path == str(adapter)
    with pytest.raises(SystemExit, match="--adapter-path serves one model"):
        config_from_args(_args("--model", f"a={path}", "--model", f"b={path}", "--adapter-path", str(adapter)))


def test_a_server_with_an_adapter_serves_the_adapted_model(adapted):
    """ServerConfig(adapter_path=) loads through the server's own loader (what --adapter-path sets)."""
    path, adapter = adapted
    ref_model, tok = load(str(path), adapter_path=str(adapter))
    prompt = _prompts(1, seed=4)[0]
    want = tok.decode(reference_greedy(ref_model, prompt, 8))
    cfg = ServerConfig(model=str(path), adapter_path=str(adapter), served_model_name=MODEL, warmup=False)
    srv = LiveServer(create_app(cfg)).start()
    try:
        assert wait_until(lambda: srv.state.ready, timeout=60), srv.state.load_error
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 8,
                                                          "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
    finally:
        srv.stop()
