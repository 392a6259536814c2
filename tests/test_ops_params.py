"""Every param a built-in op declares changes what the step does, or the validator rejects it.

The registry (compiler/ops/) is the op table: `test_every_declared_param_has_a_test` fails
when an op gains a param this file does not exercise.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from graphc.compiler.compile import load_spec
from graphc.compiler.errors import GraphError
from graphc.compiler.lower import StepInputs
from graphc.compiler.ops import OPS
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.request import Request
from helpers import reference_logits

BUILTIN = ("embed", "attention", "logits", "logit_edits", "sample", "logprobs", "prompt_logprobs", "pool",
           "normalize", "score")

# (op, param) -> the test below that shows it honoured.
COVERED = {
    ("logits", "positions"): "test_positions_all_feeds_sampling_and_prompt_logprobs",
    ("logits", "dtype"): "test_logits_dtype",
    ("logit_edits", "edits"): "test_edits_subset_is_honoured_and_enforced",
    ("sample", "method"): "test_sample_method_greedy_forces_argmax",
    ("logprobs", "max_top_n"): "test_logprobs_max_top_n",
    ("prompt_logprobs", "max_top_n"): "test_prompt_logprobs_max_top_n_and_absence",
    ("pool", "method"): "tests/test_embeddings.py::test_engine_embed_matches_numpy_reference",
    ("attention", "layers"): "tests/test_graph_layer_groups.py::test_binding_refuses_a_model_the_decoder_was_not_written_for",
    ("attention", "requires"): "tests/test_graph_layer_groups.py::test_binding_refuses_a_model_the_decoder_was_not_written_for",
}


def test_every_declared_param_has_a_test():
    declared = {(name, p) for name in BUILTIN for p in OPS[name].params}
    assert declared == set(COVERED)


def graph(tmp_path, name="g", *, logits="{positions: last}", edits=None, sample="{}", logprobs="{}",
          prompt="{max_top_n: 20}", prompt_from="prompt_logits", extra_nodes=""):
    edits_params = "{}" if edits is None else "{edits: [%s]}" % ", ".join(edits)
    text = f"""name: {name}
cache:
  full_attention: {{policy: full}}
nodes:
  - {{id: embed, op: embed, inputs: [tokens]}}
  - {{id: decoder, op: attention, inputs: [embed]}}
  - {{id: logits, op: logits, inputs: [decoder], params: {logits}}}
  - {{id: edits, op: logit_edits, inputs: [logits], params: {edits_params}}}
  - {{id: sample, op: sample, inputs: [edits], params: {sample}}}
  - {{id: logprobs, op: logprobs, inputs: [edits, sample], params: {logprobs}}}
  - {{id: prompt_logits, op: logits, inputs: [decoder], params: {{positions: all}}}}
  - {{id: prompt_logprobs, op: prompt_logprobs, inputs: [{prompt_from}, tokens], params: {prompt}}}
{extra_nodes}outputs:
  next_tokens: sample
  logprobs: logprobs
  prompt_logprobs: prompt_logprobs
"""
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    return str(p)


@pytest.fixture(scope="module")
def llama(model_dir):
    return model_dir("llama", num_layers=2)


PROMPT = [5, 17, 29, 3, 8, 41, 12, 7, 19]


def test_edits_subset_is_honoured_and_enforced(llama, tmp_path):
    eng = Engine.load(llama, graph=graph(tmp_path, edits=["penalties"]))
    assert eng.compiled.plan("decode").edits == ("penalties",)
    # Requests asking for an undeclared edit are rejected, naming the graph param.
    for params, field in ((SamplingParams(banned_token_ids=[3]), "banned_token_ids"),
                          (SamplingParams(logit_bias={3: 5.0}), "logit_bias"),
                          (SamplingParams(min_tokens=2), "min_tokens")):
        with pytest.raises(ValueError, match=f"{field}.*logit_edits declares edits: \\[penalties\\]"):
            eng.add_request(PROMPT, params)
    # The runner's sampler tensors never carry them either (what the lowering applies).
    banned = SamplingParams(banned_token_ids=[3], logit_bias={4: 9.0}, repetition_penalty=1.3)
    st = eng.runner.sampler.tensors([Request(PROMPT, banned)])
    assert st is not None and st.has_penalties and not st.has_static_edits
    # ...while the declared one applies: a strong repetition penalty changes greedy output.
    plain = eng.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    pen = eng.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True, repetition_penalty=5.0))[0]
    assert pen.token_ids != plain
    # The default (every kind) applies a ban.
    full = Engine.load(llama, graph=graph(tmp_path, "full"))
    ban = plain[0]
    got = full.generate([PROMPT], SamplingParams(max_tokens=3, banned_token_ids=[ban], ignore_eos=True))[0]
    assert ban not in got.token_ids


def test_unknown_edit_kind_is_rejected(tmp_path):
    with pytest.raises(GraphError, match="unknown edit"):
        load_spec(graph(tmp_path, edits=["penalties", "bans"]))


def test_logprobs_max_top_n(llama, tmp_path):
    eng = Engine.load(llama, graph=graph(tmp_path, logprobs="{max_top_n: 2}"))
    assert eng.compiled.plan("decode").logprobs_top_n == 2
    [res] = eng.generate([PROMPT], SamplingParams(max_tokens=3, logprobs=2))
    assert all(len(lp["top"]) == 2 for lp in res.logprobs)
    with pytest.raises(ValueError, match=r"logprobs=3 .*\(logprobs.max_top_n: 2\)"):
        eng.add_request(PROMPT, SamplingParams(logprobs=3))
    # The op itself caps what it computes (a runner that skipped the check gets 2 columns).
    st = eng.runner.sampler.tensors([Request(PROMPT, SamplingParams(logprobs=5))])
    ctx = eng.compiled.prefill.forward(StepInputs(mx.array([PROMPT]), eng.runner.new_caches()))
    ctx.inputs.sampling = eng.runner.sampler.host_state(st, [Request(PROMPT, SamplingParams(logprobs=5))])
    out = eng.compiled.prefill.head(ctx)
    assert out.logprobs.top_ids.shape[1] == 2
    with pytest.raises(GraphError, match="max_top_n.*0..20"):
        load_spec(graph(tmp_path, logprobs="{max_top_n: 21}"))


def test_logprobs_absent_means_rejected(llama, tmp_path):
    text = open(graph(tmp_path)).read().replace("  logprobs: logprobs\n", "").replace(
        "  - {id: logprobs, op: logprobs, inputs: [edits, sample], params: {}}\n", "")
    (tmp_path / "nolp.yaml").write_text(text)
    eng = Engine.load(llama, graph=str(tmp_path / "nolp.yaml"))
    with pytest.raises(ValueError, match="has no logprobs node"):
        eng.add_request(PROMPT, SamplingParams(logprobs=0))


def test_prompt_logprobs_max_top_n_and_absence(llama, tmp_path):
    eng = Engine.load(llama, graph=graph(tmp_path, prompt="{max_top_n: 1}"), prefill_chunk=4)
    [res] = eng.generate([PROMPT], SamplingParams(max_tokens=1, prompt_logprobs=1))
    ref = np.array(reference_logits(eng.model, PROMPT))
    for i in range(1, len(PROMPT)):
        row = ref[i - 1] - np.logaddexp.reduce(ref[i - 1])
        got = res.prompt_logprobs[i]
        assert got["token"] == PROMPT[i] and abs(got["logprob"] - row[PROMPT[i]]) < 1e-4
        assert len(got["top"]) == 1 and got["top"][0][0] == int(row.argmax())
    with pytest.raises(ValueError, match="prompt_logprobs.max_top_n: 1"):
        eng.add_request(PROMPT, SamplingParams(prompt_logprobs=2))
    # A prompt_logprobs node fed by last-position logits is a graph error, not a crash at run time.
    with pytest.raises(GraphError, match="prompt logprobs need `positions: all`"):
        load_spec(graph(tmp_path, prompt_from="logits"))


def test_positions_all_feeds_sampling_and_prompt_logprobs(llama, tmp_path):
    """`positions: all` on the one logits node: sampling reads its last position, prompt logprobs every one."""
    text = open(graph(tmp_path, logits="{positions: all}")).read().replace(
        "  - {id: prompt_logits, op: logits, inputs: [decoder], params: {positions: all}}\n", "").replace(
        "inputs: [prompt_logits, tokens]", "inputs: [logits, tokens]")
    (tmp_path / "all.yaml").write_text(text)
    eng = Engine.load(llama, graph=str(tmp_path / "all.yaml"), prefill_chunk=4)
    base = Engine.load(llama, graph=graph(tmp_path, "base"), prefill_chunk=4)
    params = SamplingParams(max_tokens=6, prompt_logprobs=2, logprobs=1, ignore_eos=True)
    [a], [b] = eng.generate([PROMPT], params), base.generate([PROMPT], params)
    assert a.token_ids == b.token_ids
    for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
        assert x["token"] == y["token"] and abs(x["logprob"] - y["logprob"]) < 1e-5
    ctx = eng.compiled.prefill.forward(StepInputs(mx.array([PROMPT]), eng.runner.new_caches()))
    assert ctx.values["logits"].shape == (1, len(PROMPT), eng.vocab_size)
    # With `last` the node gives one row per batch row.
    ctx = base.compiled.prefill.forward(StepInputs(mx.array([PROMPT]), base.runner.new_caches()))
    assert ctx.values["logits"].shape == (1, base.vocab_size)


def test_logits_dtype(model_dir, tmp_path):
    d = model_dir("llama", num_layers=2, dtype="bfloat16")
    for dtype, want in (("float32", mx.float32), ("model", mx.bfloat16)):
        # cpu_weights="stored": the bfloat16 model as a GPU runs it (on the CPU the load would make it float32)
        eng = Engine.load(d, graph=graph(tmp_path, f"dt_{dtype}", logits="{positions: last, dtype: %s}" % dtype),
                          cpu_weights="stored")
        out = eng.compiled.prefill(StepInputs(mx.array([PROMPT]), eng.runner.new_caches()))
        assert out.logits.dtype == want


def test_sample_method_greedy_forces_argmax(llama, tmp_path):
    greedy = Engine.load(llama, graph=graph(tmp_path, "greedy", sample="{method: greedy}"))
    auto = Engine.load(llama, graph=graph(tmp_path, "auto"))
    hot = SamplingParams(max_tokens=16, temperature=5.0, seed=1, ignore_eos=True)
    argmax = auto.generate([PROMPT], SamplingParams(max_tokens=16, ignore_eos=True))[0].token_ids
    assert greedy.generate([PROMPT], hot)[0].token_ids == argmax
    assert auto.generate([PROMPT], hot)[0].token_ids != argmax


def test_server_answers_a_graph_limit_with_an_openai_400(llama, tmp_path):
    """Through the server the plan's limits are 400s naming the problem (the official client raises)."""
    import openai
    from server_harness import live_server

    eng = Engine.load(llama, graph=graph(tmp_path, logprobs="{max_top_n: 2}", edits=["penalties"]))
    with live_server(engine=eng) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        ok = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, logprobs=2)
        assert len(ok.choices[0].logprobs.top_logprobs[0]) == 2
        with pytest.raises(openai.BadRequestError, match="logprobs.max_top_n: 2"):
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, logprobs=3)
        with pytest.raises(openai.BadRequestError, match="logit_bias is not supported by graph 'g'"):
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, logit_bias={"5": 3})
