"""The prefill step's choice passes: how a prompt's final chunk runs, and whether it is padded.

A final chunk of L tokens samples from one position. `split` runs it as two forwards, L-1
positions (their output feeds nothing, so MLX computes only their cache writes) then the last
one alone: the last layer's attention and MLP, and the head, run on one position. `whole` runs
one forward over all L positions; the logits node reads only the sampled position, so on the
fast path norm + head still run on one, and the last layer runs on L. What the split saves is
about 1/num_layers of the prefill's arithmetic; what it costs is a second forward, which reads
every layer's weights and launches every layer's kernels for one position: on the H200 that cost
was the larger (and on the CPU with OpenBLAS), with the CPU's reference BLAS the split's saving
was. The generic lowering keeps the split: the model's own forward runs its head on every
position.

Padding (`pad_final_chunk`) rounds the final chunk up to the scheduler's chunk alignment
(runtime/scheduler.py CHUNK_ALIGN) so its attention shapes repeat: MLX's CUDA attention builds
a cuDNN plan per exact (query length, key length). With `whole` a padded chunk is still one
forward (real tokens, then pads the causal mask hides from them; logits at the last real
position); with `split` the pads go into the first forward. The runtime (runtime/runner.py,
runtime/chunk_pad.py) reads both records and obeys them.
"""

from __future__ import annotations

from ..choice import Choice
from ..gated_delta_layer import why_not_chunked
from ..selfcheck import batch_prefill_ok
from ..target import UNPROBED

FINAL_CHUNK = ("whole", "split")
PADDING = ("on", "off")
FINAL_CHUNK_REQUESTS = ("auto", "whole", "split")
PREFILL_LANES = (1, 2)
LINEAR_PREFILL = ("chunked", "mlx-lm")
LINEAR_PREFILL_REQUESTS = ("auto",) + LINEAR_PREFILL

# Why one forward wins where it was measured: the split's second forward (one position) reads
# every layer's weights and launches every layer's kernels, against the last layer's attention
# and MLP over L-1 more positions.
CUDA_WHY = ("device is cuda: the split's second forward (one position through every layer) is launch-bound, "
            "~5.7 ms on an H200 (1B Llama, benchmarks/probes/step_phases.py), more than the last layer's attention "
            "and MLP over L-1 more positions")
# On the CPU it depends on the BLAS (benchmarks/probes/final_chunk.py, docs/scheduling.md): with the
# reference BLAS mlx-cpu bundles (the default install, what docs/cpu-prefill.md measured) the
# matmuls dominate and split was faster; with OpenBLAS preloaded whole was as fast or faster. The
# target does not tell the two apart (both libraries are mapped when one is preloaded), so the
# CPU keeps the split that computes least; final_chunk="whole" takes the other.
CPU_WHY = ("device is cpu: with mlx-cpu's bundled reference BLAS the last layer's attention and MLP over L-1 "
           "positions cost more than a second forward (split/whole 0.87-0.99 at chunks of 64-1024, "
           "benchmarks/probes/final_chunk.py); with OpenBLAS preloaded whole measured faster up to 256 tokens, and "
           "at every length with a wide MLP (Engine(final_chunk='whole'))")
GPU_WHY = ("device is gpu: not measured here; as on cuda, the split's second forward launches every layer's "
           "kernels for one position")

COMPILE = Choice("compile mode", "eager", ("eager",), "prefill shapes change every chunk: nothing to trace once")
ATTENTION = Choice("attention (prefill)", "mlx sdpa", ("mlx sdpa",),
                   "the model's layers with MLX's attention (causal; left-padded batched prompts take an array mask)")


def samples_last_position(spec) -> bool:
    """The graph generates: its sampling reads a last-position logits node (scoring and embedding
    graphs read every position and run every final chunk as one forward)."""
    return "next_tokens" in spec.output_dict and any(
        n.op == "logits" and dict(n.params).get("positions", "last") == "last" for n in spec.nodes)


def choose_final_chunk(binding, target, requested) -> Choice:
    name, asked = "final chunk", requested.final_chunk
    if asked not in FINAL_CHUNK_REQUESTS:
        raise ValueError(f"final_chunk must be one of {', '.join(FINAL_CHUNK_REQUESTS)}, got {asked!r}")
    if not samples_last_position(binding.spec):
        return Choice(name, "whole", FINAL_CHUNK, "the graph reads every position (no last-position logits node "
                      "that sampling reads): one forward")
    generic = binding.lowering != "fast"
    if asked != "auto":
        cost = (" (the generic lowering: the model's own forward runs its head on all L positions)"
                if asked == "whole" and generic else "")
        return Choice(name, asked, FINAL_CHUNK, f"the engine asks final_chunk={asked!r}{cost}")
    if generic:
        return Choice(name, "split", FINAL_CHUNK, "the generic lowering runs the model's own forward, whose head runs "
                      "on every position it is given: one forward would compute L x vocab logits (and hold them) to "
                      "read one row, so L-1 positions, then the last alone")
    if target.device not in ("cuda", "gpu"):
        why = CPU_WHY if target.device == "cpu" else UNPROBED
        return Choice(name, "split", FINAL_CHUNK, f"{why}; L-1 positions (cache writes only), then the last alone")
    why = CUDA_WHY if target.device == "cuda" else GPU_WHY
    return Choice(name, "whole", FINAL_CHUNK, f"{why}; the logits node reads only the sampled position, so norm + "
                  "head run on one")


def unpaddable(policies) -> str | None:
    """Why a graph's final chunks cannot be padded exactly (None: they can). Padding is the same as
    running a chunk and throwing its positions away only where every layer keeps plain FullKV
    rows the pads can be trimmed off: a rotating window would evict real positions for pads,
    recurrent state would fold them in, and a prefix cache capturing window tails or state at
    boundaries would capture them."""
    if not batch_prefill_ok(policies):
        return "a layer keeps state other than plain FullKV rows (sliding window or recurrent state)"
    kinds = {str(getattr(p.prefix_kind, "value", p.prefix_kind)) for p in policies}
    if kinds & {"tail", "snapshot"}:
        return "the prefix cache captures windowed / recurrent state at boundaries"
    return None


def choose_padding(binding, target, requested, final_chunk: str) -> Choice:
    name, asked = "final chunk padding", requested.pad_final_chunk
    if not (asked is True or asked is False or asked == "auto"):
        raise ValueError(f"pad_final_chunk must be 'auto', True or False, got {asked!r}")
    if not samples_last_position(binding.spec):
        return Choice(name, "off", PADDING, "the graph reads every position: its chunks are not padded")
    if asked is False:
        return Choice(name, "off", PADDING, "the engine asks pad_final_chunk=False")
    blocked = unpaddable(binding.policies)
    if blocked:
        return Choice(name, "off", PADDING, f"not exact for this graph: {blocked}")
    if asked == "auto" and target.device != "cuda":
        return Choice(name, "off", PADDING, f"pad_final_chunk='auto' and device is {target.device}: no attention "
                      "plan cache to hit, so each pad token would be only extra work")
    how = ("one forward: real tokens, then pads after them (a batched prefill: more left padding), logits at the "
           "last real position, the pad columns trimmed off the cache" if final_chunk == "whole" else
           "the chunk but its last token padded (cache writes only), the pad columns trimmed, then the last token "
           "alone")
    why = ("the engine asks pad_final_chunk=True" if asked is True else
           "pad_final_chunk='auto' and device is cuda: MLX's CUDA attention builds a cuDNN plan per exact (query, key "
           "length), ~40 ms per new shape on an H200 (docs/scheduling.md)")
    return Choice(name, "on", PADDING, f"{why}; to a multiple of the scheduler's chunk alignment "
                  f"(runtime/scheduler.py CHUNK_ALIGN), exact here (plain FullKV rows, prompt-logprobs chunks "
                  f"excepted): {how}")


def choose_lanes(binding, target, requested) -> Choice:
    """`prefill lanes`: how many batched prefill forwards (whole prompts, nothing cached) of one step
    run at once, each on a CPU stream of its own. Where the CPU's BLAS runs a matmul on one thread
    (mlx-cpu's bundled reference BLAS), one forward leaves the other cores idle and two forwards on
    two streams take about the time of one (runtime/cpu_lanes.py measures it at load); a GPU runs
    one forward's kernels across the whole device."""
    name, asked = "prefill lanes", requested.prefill_lanes
    alternatives = tuple(str(n) for n in PREFILL_LANES)
    if target.ranks > 1:  # refused even where asked: a hang, not a slowdown
        return Choice(name, "1", alternatives, f"rank of a distributed launch of {target.ranks}: every rank issues "
                      "its forwards' collectives in one order, which two lanes would interleave differently per rank")
    if not batch_prefill_ok(binding.policies):
        # before what the engine asks: the runtime could not run it (runtime/batched_prefill.py `possible`)
        return Choice(name, "1", alternatives, "prompts are prefilled one at a time here (a layer keeps state other "
                      "than plain FullKV rows): no batched forwards to run side by side")
    if asked != "auto":
        return Choice(name, str(asked), alternatives, f"the engine asks prefill_lanes={asked}")
    if target.device != "cpu":
        why = (UNPROBED if target.device == "unprobed" else
               f"device is {target.device}: one forward's kernels take the device")
        return Choice(name, "1", alternatives, why)
    count, why = target.cpu_lanes
    how = ("a step's batched prompt forwards run two at a time, each on a CPU stream of its own" if count > 1
           else "one forward at a time")
    return Choice(name, str(count), alternatives, f"device is cpu: {why}; {how}")


def choose_linear_prefill(binding, target, requested) -> Choice | None:
    """`linear attention (prompt chunks)`: how gated-delta layers fold a prompt chunk into their
    state. mlx-lm's `gated_delta_update` runs a Metal kernel, and elsewhere `gated_delta_ops`, a
    Python loop of a dozen ops per position and layer (a 32k prompt did not get through its cold
    pass in 200 s on an H100, docs/agent-replay.md). `chunked` is compiler/gated_delta_chunked.py:
    the same recurrence with T/C dependent matmul steps, equal to the loop to float32 rounding
    but not bit for bit. None for models without such layers."""
    if not any(info.kind == "linear_attention" for info in binding.layers):
        return None
    name, asked = "linear attention (prompt chunks)", requested.linear_prefill
    if asked not in LINEAR_PREFILL_REQUESTS:
        raise ValueError(f"linear_prefill must be one of {', '.join(LINEAR_PREFILL_REQUESTS)}, got {asked!r}")
    if binding.lowering != "fast":
        return Choice(name, "mlx-lm", LINEAR_PREFILL, "the generic lowering runs the model's own forward: its layers "
                      "call mlx-lm's gated_delta_update")
    layers = [lay for lay, info in zip(binding.adapter.layers, binding.layers) if info.kind == "linear_attention"]
    blocked = sorted({w for w in map(why_not_chunked, layers) if w is not None})
    if blocked:
        return Choice(name, "mlx-lm", LINEAR_PREFILL, f"not chunked: {'; '.join(blocked)}")
    failed = next((c for c in binding.checks if c.linear_prefill == "chunked" and not c.ok and c.reference is None),
                  None)
    if asked == "chunked" and failed is not None:
        return Choice(name, asked, LINEAR_PREFILL, f"the engine asks linear_prefill='chunked'; against mlx-lm's "
                      f"per-position loop it rounds past the self-check's tolerance here ({failed.describe()}), so "
                      "it is checked against mlx-lm's forward with the same chunked recurrence in its gated-delta "
                      "layers (its batching, caches and chunk boundaries still checked exactly)")
    if asked != "auto":
        return Choice(name, asked, LINEAR_PREFILL, f"the engine asks linear_prefill={asked!r}")
    if target.device == "cuda" and failed is not None:
        return Choice(name, "mlx-lm", LINEAR_PREFILL, f"device is cuda, but the chunked form failed this model's "
                      f"self-check ({failed.describe()}): its rounding differs from mlx-lm's loop and here that "
                      "compounds past the tolerance, so mlx-lm's gated_delta_update steps through each chunk "
                      "(exact; slower on long prompts)")
    if target.device == "cuda":
        return Choice(name, "chunked", LINEAR_PREFILL, "device is cuda: mlx-lm's gated_delta_update has no kernel "
                      "there and steps through the chunk one position at a time (gated_delta_ops); chunked runs "
                      "T/64 steps of matmuls, equal to it to float32 rounding (CUDA steps are compared with mlx-lm "
                      "within a tolerance anyway)")
    if target.device == "gpu":
        return Choice(name, "mlx-lm", LINEAR_PREFILL, "device is gpu (Metal): mlx-lm's own gated-delta kernel")
    why = UNPROBED if target.device != "cpu" else (
        "device is cpu: mlx-lm's forward here is the per-position loop itself, and graphc's CPU steps equal it bit "
        "for bit; the chunked form rounds differently (to float32 rounding) and measured 1.4-1.5x faster over a "
        "tiny model's whole prefill, 3.5x over one layer of qwen3-next-2b's heads at 2048 tokens "
        "(docs/cpu-prefill.md#hybrid-models): Engine(linear_prefill='chunked') takes it")
    return Choice(name, "mlx-lm", LINEAR_PREFILL, why)


def run_prefill_passes(binding, target, requested) -> tuple:
    """The prefill plan's choices, in order."""
    final = choose_final_chunk(binding, target, requested)
    linear = choose_linear_prefill(binding, target, requested)
    return (COMPILE, ATTENTION, final, choose_padding(binding, target, requested, final.choice),
            choose_lanes(binding, target, requested)) + ((linear,) if linear is not None else ())


__all__ = ["FINAL_CHUNK", "LINEAR_PREFILL", "LINEAR_PREFILL_REQUESTS", "PADDING", "PREFILL_LANES",
           "choose_final_chunk", "choose_lanes", "choose_linear_prefill", "choose_padding", "run_prefill_passes",
           "samples_last_position", "unpaddable"]
