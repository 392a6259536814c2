"""The ragged attention kernel's route through graphc's own layer blocks (verify steps, and
unfused layers on the compiled decode path), on the CPU: the CUDA kernel is replaced by its
MLX reference (runtime/kernels/decode_attention.py `reference`, the same semantics), so
what is tested is everything around it — which layers take it, the columns and causal
offsets it is given, left-padded rows — and that greedy tokens stay the target's own."""

from __future__ import annotations

import mlx.core as mx
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.kernels import decode_attention as da
from helpers import random_prompts, reference_greedy
from test_speculative import WIDE, _oracle

SPEC = SamplingParams(max_tokens=30, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=4)
KERNEL_SHAPE = dict(head_dim=32)  # the kernel takes head dims that are multiples of 32


@pytest.fixture
def kernel_on_cpu(monkeypatch):
    """The kernel 'passes' its check here and runs as its reference; returns the query lengths
    it was called with."""
    calls = []

    def kernel(q, k, v, start, end, scale):
        calls.append(q.shape[2])
        return da.reference(q, k, v, start, end, scale)

    monkeypatch.setattr(da, "check", lambda seed=0: None)
    monkeypatch.setattr(da, "ragged_attention", kernel)
    return calls


def test_reference_semantics_are_causal_among_the_new_queries():
    """Query l of a row sees columns start..end - L + l: the same as a causal forward over the row."""
    q = mx.random.normal((2, 4, 3, 32), key=mx.random.key(0))
    k = mx.random.normal((2, 2, 16, 32), key=mx.random.key(1))
    v = mx.random.normal((2, 2, 16, 32), key=mx.random.key(2))
    start, end = mx.array([0, 5], dtype=mx.int32), 12
    got = da.reference(q, k, v, start, mx.array([end], dtype=mx.int32), 0.2)
    for b in range(2):
        s = int(start[b])
        want = mx.fast.scaled_dot_product_attention(q[b:b + 1], k[b:b + 1, :, s:end], v[b:b + 1, :, s:end],
                                                    scale=0.2, mask="causal")
        assert mx.allclose(got[b:b + 1], want, atol=1e-5)


def test_kernel_blocks_cover_llama_layers_only(model_dir):
    llama = Engine.load(model_dir("llama", **KERNEL_SHAPE))
    adapter = llama.compiled.binding.adapter
    assert set(da.kernel_blocks(adapter)) == {id(layer) for layer in adapter.layers}
    small = Engine.load(model_dir("llama"))  # head dim 16: MLX's attention
    assert da.kernel_blocks(small.compiled.binding.adapter) == {}
    qwen3 = Engine.load(model_dir("qwen3"))
    assert da.kernel_blocks(qwen3.compiled.binding.adapter) == {}  # no own block for qwen3: MLX's attention
    assert "off" in qwen3.speculator.views.note


def test_views_are_off_without_a_cuda_kernel(model_dir):
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE))
    assert not eng.speculator.views.on and "not a CUDA device" in eng.speculator.views.note
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), decode_options={"attention_kernel": False})
    assert eng.speculator.views.note == "off (decode: {attention_kernel: false})"


@pytest.mark.parametrize("graph, compile", [("dense", None), ("dense_noprefix", None), ("dense", True)])
def test_verify_through_the_kernel_keeps_greedy_tokens(model_dir, kernel_on_cpu, graph, compile):
    # Rows of different lengths (left-padded, so each row's first column differs) and drafts
    # that are accepted in full, in part or not at all.
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), graph, prefill_chunk=16, spec_max_tokens=WIDE,
                      compile=compile)
    assert eng.speculator.views.on
    prompts = random_prompts(4, eng.vocab_size, [5, 40, 17, 23], seed=5)
    refs = {tuple(p): reference_greedy(eng.model, p, 30) for p in prompts}
    eng.speculator.drafter = _oracle(refs, eng.vocab_size)
    out = eng.generate(prompts, SPEC)
    assert [r.token_ids for r in out] == [refs[tuple(p)] for p in prompts]
    assert eng.stats["spec_steps"] > 0
    assert any(n > 1 for n in kernel_on_cpu)  # verify forwards went through the kernel
    if compile:
        assert eng.compiled.decode.verify_steps > 0


def test_unfused_layers_take_the_kernel_on_the_compiled_path(model_dir, kernel_on_cpu):
    """Quantized (or, here, unfused) llama layers have no fused block; the compiled decode step
    still runs their attention in the kernel through the own block, exactly."""
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), prefill_chunk=16, compile=True,
                      decode_options={"fuse_projections": False})
    prompts = random_prompts(3, eng.vocab_size, [9, 30, 4], seed=2)
    plain = SamplingParams(max_tokens=20, ignore_eos=True)
    out = eng.generate(prompts, plain)
    assert [r.token_ids for r in out] == [reference_greedy(eng.model, p, 20) for p in prompts]
    assert eng.compiled.decode.compiled_steps > 0 and 1 in kernel_on_cpu


def test_left_padded_eager_decode_takes_the_kernel(model_dir, kernel_on_cpu):
    """Rows of different lengths decode left-padded: on an eager step their attention needs a mask,
    which sends MLX's CUDA attention to its slow path, so it runs in the kernel; rows that started
    together (no padding) keep MLX's attention."""
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), prefill_chunk=16)
    plain = SamplingParams(max_tokens=12, ignore_eos=True)
    same = random_prompts(2, eng.vocab_size, [7, 7], seed=4)
    assert [r.token_ids for r in eng.generate(same, plain)] == [reference_greedy(eng.model, p, 12) for p in same]
    assert kernel_on_cpu == []  # unpadded: MLX's attention
    mixed = random_prompts(3, eng.vocab_size, [5, 33, 12], seed=6)
    assert [r.token_ids for r in eng.generate(mixed, plain)] == [reference_greedy(eng.model, p, 12) for p in mixed]
    assert kernel_on_cpu and set(kernel_on_cpu) == {1}


def test_compiled_steps_keep_their_own_kernel_path(model_dir, kernel_on_cpu):
    """A padded batch the compiled step takes is not wrapped (its fixed-shape caches have the
    kernel already); past the compiled batch limit the eager step wraps it."""
    from graphc.compiler.lower import StepInputs

    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), prefill_chunk=16, compile="auto")
    mixed = random_prompts(3, eng.vocab_size, [5, 33, 12], seed=6)
    plain = SamplingParams(max_tokens=8, ignore_eos=True)
    assert [r.token_ids for r in eng.generate(mixed, plain)] == [reference_greedy(eng.model, p, 8) for p in mixed]
    d, views = eng.compiled.decode, eng.runner.views
    assert d.compiled_steps > 0
    from graphc.runtime.cache.full import FullKV

    caches = []
    for _ in range(2):
        c = FullKV(2, [0, 3])
        c.update_and_fetch(mx.zeros((2, 2, 5, 32)), mx.zeros((2, 2, 5, 32)))
        caches.append(c)
    inputs = StepInputs(mx.zeros((2, 1), dtype=mx.int32), caches)
    assert views.for_decode(d, inputs) is caches  # the compiled step takes 2 rows
    d.max_batch = 1
    assert all(type(v).__name__ == "_KernelKV" for v in views.for_decode(d, inputs))


def test_many_padded_rows_take_the_kernel(model_dir, kernel_on_cpu, monkeypatch):
    """Every eager decode step over left-padded rows takes the kernel, whatever the batch size
    (MLX's masked attention reads every row's padding)."""
    rows, inner = [], da.ragged_attention  # the fixture's stand-in, wrapped to see each call's rows

    def counted(q, *args):
        rows.append(q.shape[0])
        return inner(q, *args)

    monkeypatch.setattr(da, "ragged_attention", counted)
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE), prefill_chunk=64, max_batch=24)
    plain = SamplingParams(max_tokens=4, ignore_eos=True)
    lengths = [4 + (i * 7) % 40 for i in range(20)]  # 20 rows, whole in one burst step: they decode together
    mixed = random_prompts(20, eng.vocab_size, lengths, seed=6)
    assert [r.token_ids for r in eng.generate(mixed, plain)] == [reference_greedy(eng.model, p, 4) for p in mixed]
    assert set(kernel_on_cpu) == {1} and max(rows) == 20


def test_the_decode_plan_says_when_the_kernel_runs(model_dir, kernel_on_cpu):
    eng = Engine.load(model_dir("llama", **KERNEL_SHAPE))
    line = dict(eng.compiled.plan("decode").passes)["attention kernel"]
    assert "ragged kernel" in line and "on (2 of 2 layers, per query head (not checked))" in line
    off = Engine.load(model_dir("llama", **KERNEL_SHAPE), decode_options={"attention_kernel": False})
    assert "attention kernel" not in dict(off.compiled.plan("decode").passes)


def test_the_grouped_kernel_takes_query_groups_it_can_hold():
    """One block per KV head serves its 2..8 query heads; warps shrink until the combine's shared
    memory fits; groups of one head (nothing shared) or more than 8 take the per-head kernel."""
    assert da.grouped_warps(32, 8, 128) == 8  # Llama-3.1-8B: G = 4
    assert da.grouped_warps(32, 8, 64) == 8  # Llama-3.2-1B
    assert da.grouped_warps(64, 8, 128) == 4  # G = 8: 8 warps x 8 x 130 x 4 B > 32 KB
    assert da.grouped_warps(16, 2, 256) == 2  # G = 8, D = 256
    assert da.grouped_warps(32, 32, 128) == 0  # multi-head attention
    assert da.grouped_warps(16, 1, 128) == 0  # G = 16
    assert da.grouped_warps(12, 8, 128) == 0  # not a whole group


def test_the_grouped_kernel_runs_only_after_it_matched_here(monkeypatch):
    """check() compares every kernel with MLX's attention: the per-head one decides whether any
    kernel runs, the grouped and vec ones only whether they replace it; the note says which
    serves and why one does not."""
    verdicts = {"per_head": None, "grouped": "grouped kernel differs from masked attention by 1",
                "vec": "vec kernel differs from masked attention by 2"}
    att = da.DecodeAttention()  # its own verdicts: the runtime's instance is not touched
    monkeypatch.setattr(att, "_compare_kind", lambda seed, kind: verdicts[kind])
    assert att._compare(0) is None
    assert not att.verdicts["grouped"].ok and "differs" in att.grouped_note() and "vec kernel off" in att.grouped_note()
    verdicts["grouped"] = None
    assert att._compare(0) is None and att.verdicts["grouped"].ok and not att.verdicts["vec"].ok
    assert att.grouped_note().startswith("grouped by KV head; vec kernel off (vec kernel differs")
    verdicts["vec"] = None
    assert att._compare(0) is None and att.verdicts["vec"].ok and att.grouped_note().startswith("vec from 64 blocks")
    verdicts["per_head"] = "per_head kernel failed: build error"
    assert att._compare(0) == "per_head kernel failed: build error"
    assert da.DecodeAttention().grouped_note().startswith("per query head (not checked)")  # a fresh one: unchecked


def test_the_vec_kernel_takes_heads_whose_rows_split_into_16_byte_loads():
    """A key row is D / (16 / itemsize) lanes of one 16-byte load each, a power of two up to a
    warp; a lane holds its dims of the whole query group (G x 8 <= 32 in bf16)."""
    assert da.vec_fits(32, 8, 128, 2) and da.vec_fits(32, 8, 64, 2)  # Llama-3.1-8B, Llama-3.2-1B
    assert da.vec_fits(32, 32, 128, 2)  # multi-head attention: groups of one
    assert not da.vec_fits(64, 8, 128, 2)  # G = 8 in bf16: 64 dims of registers per lane
    assert da.vec_fits(64, 8, 128, 4)  # ... 32 in float32
    assert not da.vec_fits(32, 8, 96, 2)  # 12 lanes per key
    assert not da.vec_fits(12, 8, 128, 2)  # not a whole group
    assert da.vec_config(8, 4, 128) == (8, 4)  # batch 1: more warps per block
    assert da.vec_config(64 * 8, 4, 128) == (4, 4)
    assert da.vec_config(8, 8, 256) == (4, 4)  # 8 wanted, 4 fit the combine's shared memory


def _vec_emulated(q, k, v, start, end, scale, warps, kpl, itemsize=2):
    """The vec kernel's algorithm in numpy, one block at a time: which lane group of which warp
    takes which key, each group's online softmax, the merges of a warp's groups and of the
    warps. (The CUDA source itself is compared with MLX by `check()` on the device.)"""
    import numpy as np

    q, k, v = (np.asarray(x, dtype=np.float32) for x in (q, k, v))
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    G, lpk = Hq // Hkv, D // (16 // itemsize)
    gpw = 32 // lpk
    stride = warps * gpw
    out = np.zeros_like(q)

    def merge(a, b):  # (m, l, acc) of two lane groups -> one
        M = max(a[0], b[0])
        fa = 0.0 if a[0] == -np.inf else np.exp(a[0] - M)
        fb = 0.0 if b[0] == -np.inf else np.exp(b[0] - M)
        return M, a[1] * fa + b[1] * fb, a[2] * fa + b[2] * fb

    for b in range(B):
        for kvh in range(Hkv):
            for ql in range(L):
                s, e = int(start[b]), end - L + 1 + ql
                for g in range(G):
                    qv = q[b, kvh * G + g, ql] * scale
                    per_warp = []
                    for w in range(warps):
                        groups = [(-np.inf, 0.0, np.zeros(D, np.float32)) for _ in range(gpw)]
                        for jw in range(s + w * gpw, e, stride * kpl):
                            for grp in range(gpw):
                                m, l, acc = groups[grp]
                                js = [jw + grp + u * stride for u in range(kpl)]
                                d = [float(qv @ k[b, kvh, min(j, e - 1)]) if j < e else -np.inf for j in js]
                                mn = max([m] + d)
                                if mn == -np.inf:
                                    continue
                                c = np.exp(m - mn)
                                l, acc = l * c, acc * c
                                for j, dj in zip(js, d):
                                    p = np.exp(dj - mn)
                                    l, acc = l + p, acc + p * v[b, kvh, min(j, e - 1)]
                                groups[grp] = (mn, l, acc)
                        o = 1
                        while o < gpw:  # the shuffles over lanes lpk * o apart
                            groups = [merge(groups[i], groups[i ^ o]) for i in range(gpw)]
                            o *= 2
                        per_warp.append(groups[0])
                    M = max(m for m, _, _ in per_warp)
                    f = [np.exp(m - M) if l > 0 else 0.0 for m, l, _ in per_warp]
                    Lsum = sum(l * fw for (_, l, _), fw in zip(per_warp, f))
                    out[b, kvh * G + g, ql] = sum(acc * fw for (_, _, acc), fw in zip(per_warp, f)) / Lsum
    return out


@pytest.mark.parametrize("warps,kpl,D,L,start", [(4, 4, 128, 1, [0, 3]), (8, 2, 64, 1, [5, 0]), (2, 1, 64, 3, [0, 9]),
                                                  (16, 2, 32, 1, [1, 2])])
def test_the_vec_kernels_algorithm_takes_every_column_once(warps, kpl, D, L, start):
    """Every column of [start, end - L + 1 + l) is taken by exactly one lane group, the rest
    weigh nothing: the emulation equals MLX's masked attention (in float32) for contexts
    shorter than, equal to and longer than a block's trip."""
    import numpy as np

    B, Hq, Hkv, C = 2, 8, 2, 96
    for end in (L + 9, 40, 96):
        q = mx.random.normal((B, Hq, L, D), key=mx.random.key(end))
        k = mx.random.normal((B, Hkv, C, D), key=mx.random.key(end + 1))
        v = mx.random.normal((B, Hkv, C, D), key=mx.random.key(end + 2))
        st = mx.array(start, dtype=mx.int32)
        want = da.reference(q, k, v, st, end, D ** -0.5)
        got = _vec_emulated(q, k, v, start, end, D ** -0.5, warps, kpl)
        assert np.allclose(got, np.asarray(want), atol=1e-4), (warps, kpl, D, L, end)


def test_the_vec_kernel_serves_from_64_blocks_in_the_configuration_the_sweep_chose(monkeypatch):
    """Past check(): one query at batch 1 takes the grouped kernel (the vec one was slower there
    through the API), batch 8 and 9 queries at batch 1 the vec kernel with 8 warps, batch 16
    and more with 4; the launch covers every (row, KV head, query) with one block."""
    calls = []

    def recorder(name):
        def run(**kw):
            calls.append((name, dict(kw["template"]), kw["grid"][0] // kw["threadgroup"][0]))
            return [mx.zeros(kw["output_shapes"][0], dtype=kw["output_dtypes"][0])]
        return run

    att = da.DecodeAttention()
    att.verdicts["vec"] = da.Verdict(ok=True, why="")
    att.verdicts["grouped"] = da.Verdict(ok=True, why="")
    monkeypatch.setitem(att.kernels, ("vec", False), recorder("vec"))
    monkeypatch.setitem(att.kernels, ("grouped", False), recorder("grouped"))
    start, end = mx.zeros((64,), dtype=mx.int32), mx.array([100], dtype=mx.int32)
    for B, L in ((1, 1), (8, 1), (1, 9), (16, 1), (64, 1)):
        q = mx.zeros((B, 32, L, 128), dtype=mx.bfloat16)
        kv = mx.zeros((B, 8, 256, 128), dtype=mx.bfloat16)
        att(q, kv, kv, start[:B], end, 0.1)
    assert len(att._launches) == 5  # one launch worked out per shape
    got = [(name, t.get("WARPS"), t.get("KPL"), blocks) for name, t, blocks in calls]
    assert got == [("grouped", 8, None, 8), ("vec", 8, 4, 64), ("vec", 8, 4, 72), ("vec", 4, 4, 128),
                   ("vec", 4, 4, 512)]
