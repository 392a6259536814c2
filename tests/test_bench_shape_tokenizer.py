"""The serving bench's model folders (benchmarks/serving/make_shape.py): every id of the shape's
vocabulary decodes to text, so graphc and mlx_lm.server both stream one chunk per token of a
random-weight model's output, and text still tokenizes as make-model's tokenizer does."""

from __future__ import annotations

import json

from graphc.benchmarks.serving.make_shape import cover_vocab
from graphc.benchmarks.serving.workload import ids_without_text
from graphc.compiler.modelgen.tokenizer import write_tokenizer
from transformers import PreTrainedTokenizerFast

VOCAB = 128256


def test_every_id_decodes_to_text_and_text_tokenizes_as_before(tmp_path):
    write_tokenizer(tmp_path, VOCAB)
    before = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert before.decode([VOCAB - 1]) == ""  # past the learned vocabulary: no text without the cover
    added = cover_vocab(tmp_path / "tokenizer.json", VOCAB)
    after = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert added > 100_000 and len(after) == VOCAB
    for i in (20_000, 77_777, VOCAB - 1):
        assert after.decode([i]).strip() == f"w{i}"
    text = "Once upon a time, a small fox found a key. w20000 is not a token here."
    assert after.encode(text) == before.encode(text)


def test_the_serving_bench_counts_ids_without_text(tmp_path):
    write_tokenizer(tmp_path, VOCAB)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    holes, n = ids_without_text(tmp_path)
    assert n == VOCAB and holes == VOCAB - len(PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json")))
    cover_vocab(tmp_path / "tokenizer.json", VOCAB)
    assert ids_without_text(tmp_path) == (0, VOCAB)


def test_the_dense_hybrid_shape_has_qwen3_nexts_layer_plan_and_no_experts():
    """The GPU agent replay's hybrid shape (benchmarks/shapes.py): random routers flip experts on
    bf16 rounding, so it keeps Qwen3-Next's gated-delta / full-attention plan with dense MLPs."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache

    from graphc.benchmarks.shapes import SHAPES, random_model

    moe, dense = SHAPES["qwen3-next-2b"], SHAPES["qwen3-next-2b-dense"]
    assert {k for k in dense if dense[k] != moe.get(k)} == {"mlp_only_layers"}
    cut = dict(dense, num_hidden_layers=4, hidden_size=256, vocab_size=512)
    model = random_model(cut, mx.float32)
    assert [type(c) for c in make_prompt_cache(model)] == [ArraysCache] * 3 + [KVCache]
    assert {type(layer.mlp).__name__ for layer in model.layers} == {"Qwen3NextMLP"}
