"""What the compiler's choice passes are given: the device's facts and what the engine asks.

Both are frozen values passed to `compile_graph(..., target=, requested=)`: the passes in
compiler/passes/ read them and nothing else about the machine, so a plan says why it chose
what it chose and the same inputs give the same plan. The runtime builds a `Target` once at
load (runtime/target.py: which kernels built and matched MLX in this process); `graphc
inspect` does the same, so it prints what an engine on this machine would run.
"""

from __future__ import annotations

import attrs

# The kernels a choice pass may ask about (runtime/kernels/): name -> what it does.
KERNELS = {
    "decode_attention": "ragged decode-attention kernel (L causal queries per row, left-padded rows)",
    "kv_write": "the attention kernel writing the step's K/V columns in place",
    "skinny_matmul": "the 2..64-row matmul kernel",
    "quantized_attention": "ragged attention over quantized KV codes (kv_bits on CUDA)",
    "quantized_write": "a quantized KV step's new keys / values quantized and written in one launch (kv_bits on CUDA)",
    "top_ranks": "a sampled step's candidate stage (first K ranks, 1/T, noise)",
}

UNPROBED = "device not probed (compile_graph without a target: runtime/target.py probe_target gives one)"


@attrs.frozen
class Target:
    """The device a plan is compiled for.

    device: "cuda" (MLX's CUDA backend is the default device), "cpu", "gpu" (Metal), or
    "unprobed" (no facts: every kernel is off, the plan says so).
    kernels: (name, None | why not, note) per kernel of KERNELS that was checked: None = it
    built and matched its reference here; note = how it serves (which variant), for the plan.
    cuda_memory: the host can read device memory (managed memory: host reads may migrate pages).
    cuda_adds: the residual add may move into the matmul (cuBLAS's epilogue; CUDA only, where
    the step already rounds differently from mlx-lm's).
    kernel_head_dim_multiple: the attention kernel serves heads whose dim is a multiple of this.
    cpu_lanes: (count, why): how many prefill forwards run at once on this CPU, as measured
    (runtime/cpu_lanes.py); (1, "") off the CPU.
    ranks: processes of a distributed launch this one is a rank of (1: none).
    """

    device: str = "unprobed"
    kernels: tuple = ()
    cuda_memory: bool = False
    cuda_adds: bool = False
    kernel_head_dim_multiple: int = 32
    cpu_lanes: tuple = (1, "")
    ranks: int = 1

    def why_not(self, name: str) -> str | None:
        """None when kernel `name` serves on this target, else why not."""
        for n, why, _ in self.kernels:
            if n == name:
                return why
        return UNPROBED if self.device == "unprobed" else "not a CUDA device" if self.device != "cuda" else (
            f"{name} not probed")

    def note(self, name: str) -> str:
        return next((note for n, _, note in self.kernels if n == name), "")

    @property
    def describe(self) -> str:
        on = [n for n, why, _ in self.kernels if why is None]
        return f"{self.device}; kernels that matched MLX here: {', '.join(on) or 'none'}"


@attrs.frozen
class Requested:
    """What the engine's options ask of the decode step (runtime/config.py EngineConfig), over the
    graph's `decode:` section: the choice passes resolve the two (compiler/decode_options.py).

    decode: (option, value) pairs; None values leave the graph's.
    speculative: the engine's default method ("prompt_lookup", "draft_model"), "off", or None
    (rows that ask); spec_pipeline / spec_adaptive: None = the default.
    final_chunk / pad_final_chunk: how a prompt's last chunk runs ("auto", "whole", "split") and
    whether it is padded ("auto", True, False); "auto" leaves it to the prefill passes
    (compiler/passes/prefill_choices.py), which also refuse padding where it is not exact.
    prefill_lanes: batched prefill forwards run at once ("auto": the CPU's measured lanes).
    linear_prefill: how gated-delta layers run a prompt chunk: "auto" (the prefill passes decide),
    "chunked" (compiler/gated_delta_chunked.py) or "mlx-lm" (its own gated_delta_update)."""

    decode: tuple = ()
    speculative: str | None = None
    spec_pipeline: bool | None = None
    spec_adaptive: bool | None = None
    final_chunk: str = "auto"
    pad_final_chunk: bool | str = "auto"
    prefill_lanes: int | str = "auto"
    linear_prefill: str = "auto"

    @classmethod
    def of(cls, decode: dict | None = None, **kw) -> "Requested":
        return cls(decode=tuple(sorted((decode or {}).items())), **kw)

    @property
    def decode_overrides(self) -> dict:
        return dict(self.decode)


__all__ = ["KERNELS", "Requested", "Target"]
