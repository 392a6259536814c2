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
])
def test_bad_values_name_the_option(kw, says):
    with pytest.raises(ValueError, match=says):
        EngineConfig(**kw)


def test_every_field_has_a_default_and_the_defaults_are_the_engines():
    c = EngineConfig()
    assert (c.prefill_chunk, c.max_batch, c.chain, c.prefix_cache, c.lowering, c.compile) == (
        2048, 64, True, True, "auto", None)
