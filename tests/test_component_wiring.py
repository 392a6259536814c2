"""Components are wired once, at construction: no module assigns into a component after it is built.

`self.runner.views = KernelViews(...)` after `ModelRunner(...)`, or `spec.draft_model = ...` after
`Speculator(...)`, leaves a window in which the object exists half-wired, hides from its
constructor what it depends on, and lets any holder rewire it later. The Engine builds the kernel
views and the speculator first and hands them to the runner (runtime/engine.py); the compiler
builds a CompiledGraph with its final plans instead of replacing them on the checked one.

The rule, an AST scan of every .py file under runtime/ and compiler/: an assignment, augmented or
annotated assignment, or `setattr(x, ...)`, whose target is an attribute of an object reached
through one of the component names below (`runner.x`, `self.scheduler.x`, `compiled.decode.plan`),
fails unless the object is `self` itself. Request and cache objects (data the components pass
between them) and the Binding (the compile driver records on it what the self-check found while
it tries lowerings: compiler/compile.py) are not components here. Exceptions are listed one by
one with their reason; an entry that no longer occurs fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("runtime", "compiler")
# The names the package gives its components (`spec`: a Speculator in runtime/, a GraphSpec in
# compiler/; `step`: a LoweredStep or its compiled wrapper; `plan`: its Plan).
COMPONENTS = {"runner", "scheduler", "speculator", "spec", "views", "compiled", "step", "plan", "prefix", "io",
              "prefix_io", "disk_tier", "tier", "store", "faults", "host_edits", "sampler"}

EXCEPTIONS = {
    # The disk tier and the prefix cache / PrefixIO hold each other (the tier reads the tree and
    # writes through the io; they spill and promote through the tier), so one side is attached
    # after both exist: attach_disk_tier, called once by the Engine before any request (and
    # DiskTier.scratch swaps in a scratch tier for the warm-up, before any request too).
    ("runtime/cache/disk_tier.py", "prefix.disk"): "the prefix cache's disk tier, attached once",
    ("runtime/cache/disk_tier.py", "io.disk"): "PrefixIO's disk tier, attached once",
    ("runtime/cache/disk_tier.py", "prefix.disk_off"): "why the asked-for tier is off (stats report it)",
}


def _targets(node) -> list:
    if isinstance(node, ast.Assign):
        return [t for x in node.targets for t in (x.elts if isinstance(x, (ast.Tuple, ast.List)) else [x])]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
            and node.args):
        return [ast.Attribute(value=node.args[0], attr="<setattr>")]
    return []


def assignments_into_components(source: str, filename: str = "<src>") -> list[tuple[int, str]]:
    """(line, `obj.attr`) of every assignment onto an attribute of a component other than self."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        for t in _targets(node):
            if not isinstance(t, ast.Attribute):
                continue
            chain = ast.unparse(t.value).split(".")
            if chain not in (["self"], ["cls"]) and COMPONENTS.intersection(chain):
                out.append((node.lineno, f"{ast.unparse(t.value)}.{t.attr}"))
    return sorted(out)


def _scan() -> list[tuple[str, int, str]]:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found += [(rel, line, name) for line, name in assignments_into_components(path.read_text(), rel)]
    return found


def test_no_module_assigns_into_a_component_after_construction():
    bad = [f"{rel}:{line}: {name} = ..." for rel, line, name in _scan() if (rel, name) not in EXCEPTIONS]
    assert not bad, ("modules assign into components after construction (pass the value to the constructor, "
                     "or build the dependency first and hand it over):\n" + "\n".join(bad))


def test_every_exception_is_still_needed():
    seen = {(rel, name) for rel, _, name in _scan()}
    stale = sorted(k for k in EXCEPTIONS if k not in seen)
    assert not stale, f"exceptions that no longer occur (remove them): {stale}"


def test_the_scan_sees_assignments_into_components():
    src = """
def build(self, runner, compiled):
    self.runner.views = views
    self.speculator = self.runner.speculator = spec
    compiled.decode.plan = plan
    compiled.vocab_size += 1
    spec.draft_model = draft
    setattr(self.scheduler, "batch_prefill", True)
    self.views = views
    self.scheduler = sched
    req.caches = caches
    binding.lowering = "fast"
"""
    assert [n for _, n in assignments_into_components(src)] == [
        "self.runner.views", "self.runner.speculator", "compiled.decode.plan", "compiled.vocab_size",
        "spec.draft_model", "self.scheduler.<setattr>"]
