"""On the CPU a quantized or half-precision model computes in float32 (runtime/cpu_weights.py):
the choice's every branch, the conversion itself, and that graphc then matches mlx-lm's forward
on the converted model (greedy tokens equal) and stays close to the stored one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime import cpu_weights as cw
from graphc.runtime.cpu_weights import WeightStats, decide

GIB = 1 << 30
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
PROMPTS = [[3, 5, 7, 9, 11], [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]]


# -- the choice -----------------------------------------------------------------------------------

def test_decide_every_branch():
    q = WeightStats(quantized=10, half=3, stored_bytes=GIB // 4, float32_bytes=2 * GIB)
    half = WeightStats(quantized=0, half=5, stored_bytes=GIB, float32_bytes=2 * GIB)
    f32 = WeightStats(quantized=0, half=0, stored_bytes=GIB, float32_bytes=GIB)
    assert decide("stored", True, q, 64 * GIB).choice == "stored"
    assert decide("auto", False, q, 64 * GIB).choice == "stored"  # a GPU keeps its fast kernels
    assert decide("float32", False, q, 64 * GIB).choice == "float32"  # unless asked
    assert decide("auto", True, f32, 64 * GIB).choice == "stored"
    assert "float32 already" in decide("auto", True, f32, 64 * GIB).why
    assert decide("auto", True, half, 1).choice == "float32"  # no dequantizing: no memory cap
    fits = decide("auto", True, q, 4 * GIB)  # 2 GiB in float32 is half of 4 GiB
    assert fits.choice == "float32" and "10 quantized layers dequantized" in fits.why
    big = decide("auto", True, q, 4 * GIB - 1)
    assert big.choice == "float32-activations" and "kept" in big.why and "4.0 GiB available" in big.why
    assert decide("float32", True, q, 1).choice == "float32"  # forced past the share
    assert decide("auto", True, q, None).choice == "float32"  # memory unknown: convert
    with pytest.raises(ValueError, match="cpu_weights must be one of auto, stored, float32"):
        decide("half", True, q, GIB)


# -- a quantized float16 model folder -------------------------------------------------------------

@pytest.fixture(scope="module")
def q4_f16(model_dir, tmp_path_factory):
    """The tiny llama with 4-bit affine layers (group 32) and float16 everything else, as a folder."""
    from mlx_lm.utils import quantize_model, save_config, save_model

    src = model_dir("llama")
    model, _ = mlx_lm.load(str(src))
    config = json.loads((src / "config.json").read_text())
    model.set_dtype(mx.float16)
    model, config = quantize_model(model, config, group_size=32, bits=4)
    out = tmp_path_factory.mktemp("q4f16")
    save_model(out, model)
    save_config({**config, "torch_dtype": "float16"}, out / "config.json")
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
            shutil.copy(f, out / f.name)
    return out


def mlx_lm_greedy(model, prompt: list[int], n: int) -> list[int]:
    """mlx-lm's own forward and KV cache, one token at a time: the reference."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)
    out = []
    for _ in range(n):
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
        logits = model(mx.array([[tok]]), cache=cache)
    return out


def quantized_layers(model) -> int:
    return sum(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())


def float_dtypes(model) -> set:
    return {v.dtype for _, v in nn.utils.tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)}


def test_stats_of_a_quantized_half_model(q4_f16):
    model, _ = mlx_lm.load(str(q4_f16))
    s = cw.weight_stats(model)
    assert s.quantized == quantized_layers(model) > 0
    assert s.half > 0  # the norms
    # 4-bit codes + float16 scales/biases per 32 values, against 32 bits a value
    assert 5 * s.stored_bytes < s.float32_bytes < 8 * s.stored_bytes


def test_auto_dequantizes_and_equals_mlx_lm_on_the_converted_model(q4_f16):
    eng = Engine.load(q4_f16)  # the default is auto, and the tests run on the CPU
    assert eng.weights.choice == "float32" and eng.describe()["weights"]["choice"] == "float32"
    assert quantized_layers(eng.model) == 0 and float_dtypes(eng.model) == {mx.float32}
    ours = [r.token_ids for r in eng.generate(PROMPTS, GREEDY)]

    ref_model, _ = mlx_lm.load(str(q4_f16))
    cw.apply(ref_model, cw.WeightsChoice("float32", "test"))
    assert ours == [mlx_lm_greedy(ref_model, p, GREEDY.max_tokens) for p in PROMPTS]

    # the same weights at a higher precision: the logits stay close to the stored model's
    stored, _ = mlx_lm.load(str(q4_f16))
    x = mx.array([PROMPTS[1]])
    a, b = ref_model(x), stored(x).astype(mx.float32)
    assert mx.allclose(a, b, atol=0.05, rtol=0.05).item()


def test_stored_keeps_the_folder(q4_f16):
    eng = Engine.load(q4_f16, cpu_weights="stored")
    assert eng.weights.choice == "stored"
    assert quantized_layers(eng.model) > 0 and mx.float16 in float_dtypes(eng.model)
    ref, _ = mlx_lm.load(str(q4_f16))
    ours = eng.generate(PROMPTS[:1], GREEDY)[0].token_ids
    assert ours == mlx_lm_greedy(ref, PROMPTS[0], GREEDY.max_tokens)


def test_too_big_to_dequantize_keeps_the_codes_in_float32(q4_f16, monkeypatch):
    monkeypatch.setattr(cw, "available_bytes", lambda: 1024)  # nothing fits
    eng = Engine.load(q4_f16)
    assert eng.weights.choice == "float32-activations"
    assert quantized_layers(eng.model) > 0 and float_dtypes(eng.model) == {mx.float32}
    ours = eng.generate(PROMPTS[:1], GREEDY)[0].token_ids
    ref, _ = mlx_lm.load(str(q4_f16))
    ref.set_dtype(mx.float32)
    assert ours == mlx_lm_greedy(ref, PROMPTS[0], GREEDY.max_tokens)


def test_a_float32_model_is_left_alone(model_dir):
    eng = Engine.load(model_dir("llama"))
    assert eng.weights.choice == "stored" and "float32 already" in eng.weights.why


def test_bad_values_are_refused(model_dir):
    with pytest.raises(ValueError, match="cpu_weights must be one of"):
        Engine.load(model_dir("llama"), cpu_weights="half")
    with pytest.raises(ValueError, match="shards the weights as stored"):
        Engine.load(model_dir("llama"), distributed=True, cpu_weights="float32")
    r = subprocess.run([sys.executable, "-m", "graphc.cli", "generate", "hi", "--cpu-weights", "half"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--cpu-weights" in r.stderr


def test_the_server_config_reaches_the_load(q4_f16):
    from graphc.runtime.server.config import ServerConfig
    from graphc.runtime.server.state import load_engine

    eng = load_engine(ServerConfig(model=str(q4_f16), cpu_weights="stored", max_batch=4))
    assert eng.weights.choice == "stored"


def test_inspect_says_what_it_did(q4_f16):
    r = subprocess.run([sys.executable, "-m", "graphc.cli", "inspect", "auto", "--model", str(q4_f16), "--no-trace"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "weights: float32: MLX's CPU quantized matmul" in r.stderr
    assert r.stderr.count("weights: float32:") == 1, r.stderr  # said once, by the log that -q silences
    quiet = subprocess.run([sys.executable, "-m", "graphc.cli", "-q", "inspect", "auto", "--model", str(q4_f16),
                            "--no-trace"], capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and "weights:" not in quiet.stderr, quiet.stderr


def test_a_draft_model_runs_in_float32_and_the_output_stays_the_target_s(q4_f16, model_dir):
    from graphc.runtime.speculative.draft_model import DraftModel

    draft = DraftModel.load(q4_f16)
    assert quantized_layers(draft.model) == 0 and float_dtypes(draft.model) == {mx.float32}
    target = model_dir("llama")
    plain = Engine.load(target).generate(PROMPTS, GREEDY)
    spec = Engine.load(target, draft_model=str(q4_f16), num_draft_tokens=3).generate(PROMPTS, GREEDY)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
