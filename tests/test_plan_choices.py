"""The compiler chooses, the plan records, the runtime obeys (compiler/passes/, docs/inspect.md)."""

import ast
import json
from pathlib import Path

import attrs
import mlx_lm
import pytest

from graphc.compiler.compile import compile_graph
from graphc.compiler.inspect import inspect_plan
from graphc.compiler.plan import Plan
from graphc.compiler.target import Requested, Target
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.compiled_decode import CompiledDecode
from graphc.runtime.target import probe_target

ROOT = Path(__file__).resolve().parent.parent
DECODE_CHOICES = ["compile mode", "attention (eager steps)", "sampling", "host read", "vacant rows", "mixed step", "speculative arm"]
COMPILED_CHOICES = ["decode layers", "attention (compiled steps)", "K/V write", "projections (compiled steps)",
                    "residual adds"]
# Every shipped graph, on a model whose layers it serves.
SHIPPED = {"dense": ("llama", {}), "dense_noprefix": ("llama", {}), "dense_paged": ("llama", {}),
           "sliding": ("gemma3_text", {"sliding_window": 8}), "hybrid": ("qwen3_next", {}), "embed": ("llama", {}),
           "score": ("llama", {})}


def _load(model_dir, arch, sizes):
    d = model_dir(arch, **sizes)
    model, _ = mlx_lm.load(str(d))
    return model, json.loads((Path(d) / "config.json").read_text())


def test_every_shipped_graph_is_covered():
    assert sorted(SHIPPED) == sorted(p.stem for p in (ROOT / "graphs").glob("*.yaml"))


@pytest.mark.parametrize("graph", sorted(SHIPPED))
def test_inspect_names_each_backend_choice_for_every_shipped_graph(model_dir, graph):
    model, config = _load(model_dir, *SHIPPED[graph])
    compiled = compile_graph(graph, model, config, target=probe_target())
    prefill = inspect_plan(compiled, "prefill", "text", trace=False)
    for name in ("compile mode", "attention (prefill)", "final chunk", "final chunk padding"):
        assert f"\n{name}" in prefill, (graph, name)
    plan = compiled.plan("decode")
    if "next_tokens" not in dict(plan.outputs):  # embed / score: no decode step to choose for
        return
    text = inspect_plan(compiled, "decode", "text", trace=False)
    assert [c.name for c in plan.choices] == DECODE_CHOICES
    for c in plan.choices:
        assert c.choice in c.alternatives + ("measured",) and c.why, c
        assert f"\n{c.name:<28} {c.choice}" in text and f"why: {c.why}" in text


def test_compiled_decode_adds_its_choices_and_json_round_trips(model_dir):
    model, config = _load(model_dir, "llama", {})
    compiled = compile_graph("dense", model, config, target=probe_target(),
                             requested=Requested.of({"compile": "measured"}))
    plan = compiled.plan("decode")
    names = [c.name for c in plan.choices]
    assert names[:1] + names[1:6] == ["compile mode"] + COMPILED_CHOICES
    mode = plan.choice("compile mode")
    assert mode.choice == "measured" and mode.arms == ("compiled", "eager")  # a declared measured node
    data = json.loads(inspect_plan(compiled, "decode", "json", trace=False))
    assert {c["name"] for c in data["choices"]} == set(names)
    back = Plan.from_dict(data)
    assert back.choices == plan.choices and dict(back.decode_options)["compile"] == "measured"


def test_choices_follow_the_target_not_the_machine(model_dir):
    """The same graph, model and options on a target whose kernels matched: the kernel choices
    flip, and say why; the plan is a function of its inputs."""
    model, config = _load(model_dir, "llama", {})
    cuda = Target(device="cuda", kernels=(("decode_attention", None, "grouped by KV head"), ("kv_write", None, ""),
                                          ("skinny_matmul", "kernel differs", ""), ("top_ranks", None, "on (select)"),
                                          ("gumbel_choose", None, "on where its check passes")),
                  cuda_memory=True, cuda_adds=True)
    plan = compile_graph("dense", model, config, target=cuda, requested=Requested.of({"compile": True})).plan("decode")
    assert plan.choice("attention (compiled steps)").choice == "cuda decode kernel"
    assert "head_dim 64" not in plan.choice("attention (compiled steps)").why  # says the rule, not a guess
    assert plan.choice("K/V write").choice == "in the attention kernel"
    assert plan.choice("projections (compiled steps)").choice == "mlx matmul"  # skinny_matmul off by default
    assert plan.choice("residual adds").choice == "in the matmul (addmm)"
    assert plan.choice("sampling").choice == "fused cuda"
    assert plan.choice("host read").choice == "tokens" and "host read" in dict(plan.passes)
    cpu = compile_graph("dense", model, config, target=Target(device="cpu"),
                        requested=Requested.of({"compile": True})).plan("decode")
    assert cpu.choice("attention (compiled steps)") == attrs.evolve(
        plan.choice("attention (compiled steps)"), choice="mlx sdpa", why="not a CUDA device")
    assert cpu.choice("sampling").choice == "fused mlx" and "not a CUDA device" in cpu.choice("sampling").why
    # Vacant rows: dropped past a quarter where a row costs matmul work (the CPU); on a GPU refilled
    # by joins in place and otherwise dropped only by copies the batch takes anyway; the paged
    # graph's rows leave at once.
    assert cpu.choice("vacant rows").choice == "quarter" and "device is cpu" in cpu.choice("vacant rows").why
    assert plan.choice("vacant rows").choice == "reuse" and "device is cuda" in plan.choice("vacant rows").why
    paged = compile_graph("dense_paged", model, config, target=cuda).plan("decode")
    assert paged.choice("vacant rows").choice == "at once" and "pages" in paged.choice("vacant rows").why


def test_vacant_rows_is_a_decode_option(model_dir):
    """`decode: {vacant_rows: ...}` overrides the device's default and the plan says where it came
    from; a value it does not know is refused by the validator and by the engine's override."""
    from graphc.compiler import decode_options

    model, config = _load(model_dir, "llama", {})
    plan = compile_graph("dense", model, config, target=Target(device="cpu"),
                         requested=Requested.of({"vacant_rows": "copies"})).plan("decode")
    assert plan.choice("vacant rows").choice == "copies"
    assert plan.choice("vacant rows").why == "the engine asks vacant_rows='copies'"
    assert decode_options.problems({"vacant_rows": "never"}) == [
        "decode option 'vacant_rows' must be auto, quarter, copies, reuse, got 'never'"]
    with pytest.raises(ValueError, match="vacant_rows must be"):
        compile_graph("dense", model, config, target=Target(device="cpu"), requested=Requested.of({"vacant_rows": 1}))


def test_the_engine_obeys_the_plan_and_shows_the_measured_arm_in_use(model_dir):
    # spec_adaptive=True: tests turn the speculator's gate off by default (conftest.py)
    eng = Engine.load(model_dir("llama"), compile="measured", speculative="prompt_lookup", spec_adaptive=True)
    plan = eng.compiled.plan("decode")
    assert isinstance(eng.compiled.decode, CompiledDecode) and eng.compiled.decode.plan is plan
    assert eng.compiled.decode.gate.arm_names == plan.choice("compile mode").arms
    assert eng.runner.sampler.kernel == (plan.choice("sampling").choice == "fused cuda")
    assert eng.runner.host_read == plan.choice("host read").choice
    assert eng.runner.batch.max_vacant_share == {"quarter": 0.25, "copies": 1.0, "reuse": 1.0}[
        plan.choice("vacant rows").choice]
    before = json.dumps(eng.describe())
    assert all(c.get("in_use", {}).get("latest") is None for c in eng.describe()["choices"] if c["arms"])
    eng.generate(["one two three one two three one two"], SamplingParams(max_tokens=12, ignore_eos=True))
    d = eng.describe()
    measured = {c["name"]: c for c in d["choices"] if c["arms"]}
    assert set(measured) == {"compile mode", "speculative arm"}
    arm, bucket = measured["compile mode"]["in_use"]["latest"]
    assert arm in ("compiled", "eager") and bucket == 1
    assert measured["compile mode"]["in_use"]["by_bucket"] == {1: arm}
    assert measured["speculative arm"]["in_use"]["latest"][0] in measured["speculative arm"]["arms"]
    assert eng.compiled.plan("decode") is plan and json.dumps(d) != before  # the plan unchanged, the state moved


def test_the_compiler_artifact_is_left_as_compiled(model_dir):
    eng = Engine.load(model_dir("llama"), compile=True)
    # with_decode made a new CompiledGraph; the plans are the compiler's own objects
    assert type(eng.compiled.decode) is CompiledDecode and eng.compiled.decode.step.plan is eng.compiled.plan("decode")
    with pytest.raises(ValueError, match="carry its decode plan unchanged"):
        eng.compiled.with_decode(eng.compiled.prefill)  # a step for another plan


# Attributes of compiled artifacts (CompiledGraph, LoweredStep, Plan) that only the compiler sets.
COMPILED_ATTRS = {"decode", "prefill", "plan", "passes", "choices", "decode_options"}


def _runtime_writes(tree: ast.AST) -> list[str]:
    bad = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if (isinstance(sub, ast.Attribute) and sub.attr in COMPILED_ATTRS
                        and not (isinstance(sub.value, ast.Name) and sub.value.id == "self")):
                    bad.append(f"line {sub.lineno}: assigns .{sub.attr}")
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in ("evolve", "setattr") and (any(k.arg in COMPILED_ATTRS for k in node.keywords) or (
                    name == "setattr" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in COMPILED_ATTRS)):
                bad.append(f"line {node.lineno}: {name}(...) of a compiled attribute")
    return bad


def test_no_runtime_module_rewrites_a_compiled_plan():
    found = {}
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        bad = _runtime_writes(ast.parse(path.read_text()))
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    assert found == {}


def test_the_ast_check_catches_the_old_rewrites():
    old = ("def f(self, d, views):\n"
           "    self.compiled.decode = CompiledDecode(self.compiled.decode)\n"
           "    d.plan = attrs.evolve(d.plan, passes=d.plan.passes + (('x', 'y'),))\n")
    assert len(_runtime_writes(ast.parse(old))) == 3


def test_describe_says_why_each_compiled_switch_is_off_once(model_dir):
    built = Engine.load(model_dir("llama"), compile=True).describe()["built"]
    assert built["skinny_matmul"] == "off (the graph declares decode: {skinny_matmul: false})"  # graphs/dense.yaml
    assert not any("off (off" in str(v) for v in built.values()), built
