"""On the CPU, a model computes in float32: the `cpu_weights` load option (Engine.load,
`graphc serve / generate / inspect --cpu-weights`).

MLX's CPU backend runs float32 matmuls through a BLAS (OpenBLAS where installed:
contracts/cpu_blas.py) but half-precision and quantized ones through loops of its own, which on
x86 are orders of magnitude slower. On this project's 2-core machine with OpenBLAS, one
SmolLM2-135M MLP projection (576 -> 1536, Q4_1 imported as 4-bit affine, float16 scales) took 28 ms
for one row and 7.2 s for 256, against 0.3 and 7.6 ms as a float32 matmul; its tied 8-bit output
head (49152 x 576) 0.94 s for one row against 18 ms; a float16 or bfloat16 dense matmul of the
MLP's shape ~20x float32's at 256 rows (docs/cpu-prefill.md#quantized-and-half-precision-models
has the command). llama.cpp computes in float32 on CPUs for the same reason.

`auto` (the default), on the CPU only:
- quantized layers (mlx's QuantizedLinear / QuantizedEmbedding, mlx-lm's QuantizedSwitchLinear)
  are dequantized to float32 once, at load (mlx-lm's own `dequantize_model`), when the model's
  float32 weights fit FIT_SHARE of the memory available; past that they stay quantized and
  only their scales and biases become float32 (MLX's quantized matmul in float32 is ~30x its
  float16 one here, still far from a BLAS);
- every other float16 / bfloat16 parameter becomes float32, so activations and KV are float32.

The weights are the same numbers at a higher precision, so this is not exact against mlx-lm's
forward on the weights as stored (greedy tokens can differ where two logits are within float16
rounding); mlx-lm's forward on the converted model is what graphc is held to
(tests/test_cpu_weights.py). `stored` keeps the folder's weights and dtypes (mlx-lm's numerics);
`float32` converts even past the memory share. On a GPU (Metal, CUDA) `auto` changes nothing:
there the half-precision and quantized kernels are the fast path. A model a distributed load
shards runs as stored; a speculative draft model always takes `auto` (its numbers only change
which drafts are accepted, never the output).
"""

from __future__ import annotations

import logging
import os

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import QuantizedSwitchLinear
from mlx_lm.utils import dequantize_model

log = logging.getLogger("graphc.load")

MODES = ("auto", "stored", "float32")
FIT_SHARE = 0.5  # of the memory available: the most that float32 weights may take under `auto`
HALF = (mx.float16, mx.bfloat16)


@attrs.frozen
class WeightStats:
    """What a model holds: its quantized layers, and the bytes of its weights as stored and in float32."""

    quantized: int  # quantized layers
    half: int  # float16 / bfloat16 parameters (not counting quantized layers' scales and biases)
    stored_bytes: int
    float32_bytes: int  # every weight as float32, the quantized ones dequantized


@attrs.frozen
class WeightsChoice:
    """What the load did to the weights: `stored`, `float32` (everything float32, quantized layers
    dequantized) or `float32-activations` (quantized layers kept, their scales and the rest float32)."""

    choice: str
    why: str

    def to_dict(self) -> dict:
        return {"choice": self.choice, "why": self.why}


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"cpu_weights must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


QUANTIZED = (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)  # what dequantize_model converts


def weight_stats(model: nn.Module) -> WeightStats:
    quantized, q_float32, q_stored, q_params = 0, 0, 0, set()
    for name, module in model.named_modules():
        if not isinstance(module, QUANTIZED):
            continue
        quantized += 1
        w = module.weight
        values = w.size * 32 // module.bits  # uint32 words of `bits`-bit codes
        q_float32 += values * 4
        prefix = f"{name}." if name else ""
        for key in ("weight", "scales", "biases"):
            arr = getattr(module, key, None)
            if arr is not None:
                q_stored += arr.nbytes
                q_params.add(prefix + key)
    half, rest_stored, rest_float32 = 0, 0, 0
    for name, arr in nn.utils.tree_flatten(model.parameters()):
        if name in q_params:
            continue
        rest_stored += arr.nbytes
        rest_float32 += arr.size * 4 if mx.issubdtype(arr.dtype, mx.floating) else arr.nbytes
        half += arr.dtype in HALF
    return WeightStats(quantized, half, q_stored + rest_stored, q_float32 + rest_float32)


def available_bytes() -> int | None:
    """MemAvailable (Linux), else the machine's physical memory, else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def decide(mode: str, on_cpu: bool, stats: WeightStats, available: int | None) -> WeightsChoice:
    """Pure: what `mode` does to a model of `stats` on this device (every branch testable)."""
    check_mode(mode)
    if mode == "stored":
        return WeightsChoice("stored", "cpu_weights='stored': the weights as the folder has them")
    if not on_cpu and mode == "auto":
        return WeightsChoice("stored", "not on the CPU: the device's half-precision and quantized kernels are its fast path")
    if stats.quantized == 0 and stats.half == 0:
        return WeightsChoice("stored", "the weights are float32 already")
    gib = 1 << 30
    sizes = f"{stats.stored_bytes / gib:.2f} GiB as stored, {stats.float32_bytes / gib:.2f} GiB in float32"
    if mode == "float32":
        return WeightsChoice("float32", f"cpu_weights='float32' ({sizes})")
    if stats.quantized == 0:
        return WeightsChoice("float32", f"the half-precision weights run in float32 here, on purpose: MLX's CPU "
                                        f"half-precision matmul is ~20x slower than float32 through the BLAS ({sizes}; "
                                        "--cpu-weights stored keeps them)")
    if available is None or stats.float32_bytes <= FIT_SHARE * available:
        room = "" if available is None else f"; {available / gib:.1f} GiB available"
        return WeightsChoice("float32", f"MLX's CPU quantized matmul is 30x or more slower than a float32 matmul "
                                        f"through the BLAS: {stats.quantized} quantized layers dequantized ({sizes}{room})")
    return WeightsChoice("float32-activations",
                         f"{stats.quantized} quantized layers kept: dequantized they would take more than "
                         f"{FIT_SHARE:.0%} of the {available / gib:.1f} GiB available ({sizes}); their scales "
                         "and the other weights are float32, the quantized matmul ~30x faster than in float16")


def apply(model: nn.Module, choice: WeightsChoice) -> None:
    """Convert `model` in place as `choice` says (evaluated here, so the load's time includes it)."""
    if choice.choice == "stored":
        return
    if choice.choice == "float32":
        dequantize_model(model)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())


def convert(model: nn.Module, mode: str | None = None) -> WeightsChoice:
    """Decide for this process's device and apply; logs what it did. `mode` None: `auto`."""
    mode = check_mode(mode or "auto")
    on_cpu = mx.default_device() == mx.cpu
    if mode == "stored" or (mode == "auto" and not on_cpu):
        choice = decide(mode, on_cpu, WeightStats(0, 0, 0, 0), None)
    else:
        choice = decide(mode, on_cpu, weight_stats(model), available_bytes())
    if choice.choice != "stored":
        log.info("weights: %s: %s", choice.choice, choice.why)
        apply(model, choice)
    return choice
