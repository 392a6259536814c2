"""The warm-up of the decode attention kernel's builds (runtime/kernels/decode_attention.py
`DecodeAttention.warm`, runtime/warmup.py `decode_kernel_builds`), on the CPU: the CUDA kernels
are replaced by recorders of the template each launch asks for, so what is tested is which builds
a batch of 1..max_batch rows takes and that the warm-up launches each of them once."""

from __future__ import annotations

import mlx.core as mx
import pytest

from graphc.runtime import Engine
from graphc.runtime.kernels import decode_attention as da
from graphc.runtime.warmup import decode_kernel_builds


class Recorder:
    """Stands in for one mx.fast.cuda_kernel: records each launch's kind and template arguments."""

    def __init__(self, kind, launches):
        self.kind, self.launches = kind, launches

    def __call__(self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
        self.launches.append((self.kind, tuple(template), inputs[0].shape[0]))
        return [mx.zeros(output_shapes[0], dtype=output_dtypes[0])]


def recording_kernel(vec_ok: bool = True):
    att, launches = da.DecodeAttention(), []
    att.kernels = {key: Recorder(key, launches) for key in att.kernels}
    att.verdicts["grouped"].ok = True
    att.verdicts["vec"].ok = vec_ok
    return att, launches


def test_builds_switch_past_8_and_16_rows_at_8_kv_heads():
    """Llama-3.2-1B heads (32 query, 8 KV, dim 64): grouped under 64 blocks, then the vec kernel in
    its two configurations (8 warps from 64 blocks, 4 from 128)."""
    att, _ = recording_kernel()
    assert att.builds_for(32, 8, 64, mx.bfloat16, 64) == [(1, "grouped"), (8, "vec"), (16, "vec")]
    assert att.builds_for(32, 8, 64, mx.bfloat16, 12) == [(1, "grouped"), (8, "vec")]
    off, _ = recording_kernel(vec_ok=False)  # a vec kernel that failed its check is never picked
    assert off.builds_for(32, 8, 64, mx.bfloat16, 64) == [(1, "grouped")]


def test_warm_launches_each_build_once():
    att, launches = recording_kernel()
    assert att.warm(32, 8, 64, mx.bfloat16, 64) == 3
    templates = {t for _, t, _ in launches}
    assert len(launches) == len(templates) == 3
    assert [b for _, _, b in launches] == [1, 8, 16]
    # a client's step of any batch size then asks for a build already launched
    for B in (5, 9, 33, 64):
        launches.clear()
        att.attend(mx.zeros((B, 32, 1, 64), dtype=mx.bfloat16), mx.zeros((B, 8, 9, 64), dtype=mx.bfloat16),
                   mx.zeros((B, 8, 9, 64), dtype=mx.bfloat16), mx.zeros((B,), dtype=mx.int32),
                   mx.array([9], dtype=mx.int32), 0.125)
        assert launches[0][1] in templates


def test_engine_warm_up_launches_the_builds_of_its_heads(model_dir, monkeypatch):
    """With the kernel serving eager decode steps (its check 'passes' here), the engine's warm-up
    launches its builds at the model's own heads and dtype, up to the scheduler's max batch."""
    att, launches = recording_kernel()
    monkeypatch.setattr(da, "check", lambda seed=0: None)
    monkeypatch.setattr(da, "KERNEL", att)
    engine = Engine.load(model_dir("llama", head_dim=32), max_batch=20)
    assert engine.runner.views.on
    a = engine.compiled.binding.adapter.layers[0].self_attn
    n = decode_kernel_builds(engine)
    assert n == len(launches) == len(att.builds_for(a.n_heads, a.n_kv_heads, 32, mx.float32, 20)) >= 1
    assert all(dict(t)["D"] == 32 and dict(t)["T"] == mx.float32 for _, t, _ in launches)


@pytest.mark.parametrize("arch", ["qwen3"])
def test_no_builds_where_the_kernel_does_not_serve(model_dir, arch):
    engine = Engine.load(model_dir(arch))
    assert decode_kernel_builds(engine) == 0
