"""EngineConfig: the Engine's options as one frozen value; keywords still work and are checked."""

import attrs
import pytest

from graphc.runtime import Engine, EngineConfig


def test_keywords_build_the_config(model_dir):
    eng = Engine.load(model_dir("llama"), max_batch=3, prefill_chunk=16, seed=7)
    c = eng.engine_config
    assert (c.max_batch, c.prefill_chunk, c.seed) == (3, 16, 7)
    assert c.model_path == str(model_dir("llama"))  # Engine.load names the folder it read
    assert eng.scheduler.max_batch == 3  # the engine obeys what the config says


def test_a_config_value_and_keywords_over_it(model_dir):
    base = EngineConfig(max_batch=5, prefill_chunk=32)
    eng = Engine.load(model_dir("llama"), engine_config=base, max_batch=2)
    assert (eng.engine_config.max_batch, eng.engine_config.prefill_chunk) == (2, 32)
    assert base.max_batch == 5  # the value given is not changed


def test_config_is_frozen():
    c = EngineConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        c.max_batch = 2


def test_unknown_keyword_is_a_type_error_with_a_suggestion(model_dir):
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'max_bach'.*did you mean 'max_batch'"):
        Engine.load(model_dir("llama"), max_bach=4)
    with pytest.raises(TypeError, match=r"'zzz_unrelated'.*known: .*prefill_chunk"):
        EngineConfig.from_kwargs(zzz_unrelated=1)


@pytest.mark.parametrize("kw, says", [
    ({"max_batch": 0}, "max_batch must be a positive integer"),
    ({"prefill_chunk": True}, "prefill_chunk must be a positive integer"),
    ({"compile": "sometimes"}, "compile must be True, False, 'auto' or 'measured'"),
    ({"lowering": "fastest"}, "unknown lowering 'fastest'"),
    ({"mem_fraction": 1.5}, r"mem_fraction must be a number in \(0, 1\]"),
    ({"decode_options": ["compile"]}, "decode_options must be a dict"),
    ({"prefill_lanes": 3}, "prefill_lanes must be 'auto' or one of 1, 2, got 3"),
    ({"prefill_lanes": True}, "prefill_lanes must be 'auto'"),
    ({"linear_prefill": "loop"}, "linear_prefill must be one of auto, chunked, mlx-lm"),
])
def test_bad_values_name_the_option(kw, says):
    with pytest.raises(ValueError, match=says):
        EngineConfig(**kw)


def test_every_field_has_a_default_and_the_defaults_are_the_engines():
    c = EngineConfig()
    assert (c.prefill_chunk, c.max_batch, c.chain, c.prefix_cache, c.lowering, c.compile) == (
        2048, 64, True, True, "auto", None)


# Every keyword Engine(...) / Engine.load(...) took before EngineConfig: each is a field now.
ENGINE_KEYWORDS = (
    "prefill_chunk", "max_batch", "chain", "model_path", "compile", "prefix_cache", "mem_fraction",
    "max_total_tokens", "prefix_interval", "seed", "kv_budget_tokens", "batch_prefill", "skinny_gemm", "lowering",
    "decode_options", "speculative", "num_draft_tokens", "spec_max_batch", "spec_max_tokens", "draft_model",
    "spec_pipeline", "spec_adaptive", "kv_bits", "kv_group_size", "kv_cache_dir", "kv_cache_disk_gb",
    "kv_cache_block_tokens", "kv_cache_disk_read", "step_tokens", "snapshot_interval", "pad_final_chunk", "final_chunk",
    "prefill_lanes", "linear_prefill", "warm_continuations", "adapter_path")


def test_every_engine_keyword_is_a_config_field():
    assert sorted(EngineConfig.option_names()) == sorted(ENGINE_KEYWORDS)


def test_the_kv_and_step_options_reach_what_they_configure(model_dir, tmp_path):
    d = model_dir("llama", hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32)  # a head a group divides
    eng = Engine.load(d, kv_bits=8, kv_group_size=32, step_tokens=24, kv_cache_disk_read="never",
                      kv_cache_dir=str(tmp_path / "kv"), kv_cache_block_tokens=16, prefill_chunk=32)
    c = eng.engine_config
    assert (c.kv_bits, c.kv_group_size, c.step_tokens, c.kv_cache_block_tokens) == (8, 32, 24, 16)
    assert {p.name for p in eng.compiled.binding.policies} == {"quantized"}  # kv_bits rewrote the graph
    assert eng.scheduler.step_tokens == 24
    assert eng.disk_tier is not None and eng.disk_tier.block == 16
    assert eng.disk_tier.choice.mode == "never" and eng.describe()["disk_tier"]["read"] == "never"


@pytest.mark.parametrize("kw, says", [
    ({"step_tokens": 0}, "step_tokens must be a positive integer"),
    ({"kv_cache_block_tokens": 0}, "kv_cache_block_tokens must be a positive integer"),
    ({"kv_cache_disk_read": "sometimes"}, "kv_cache_disk_read must be one of auto, always, never"),
])
def test_bad_kv_and_step_values_name_the_option(kw, says):
    with pytest.raises(ValueError, match=says):
        EngineConfig(**kw)


def test_changed_lists_only_the_options_set():
    c = EngineConfig(max_batch=3, compile="auto", model_path="/x")
    assert c.changed() == {"max_batch": 3, "compile": "auto"}  # model_path is the loader's to name
    assert EngineConfig().changed() == {}


def test_a_distributed_load_outside_a_launch_keeps_the_config(model_dir):
    # World size 1: the distributed loader serves on this process alone, from keywords.
    eng = Engine.load(model_dir("llama"), distributed=True, engine_config=EngineConfig(max_batch=3), prefill_chunk=16)
    assert (eng.engine_config.max_batch, eng.engine_config.prefill_chunk) == (3, 16)
