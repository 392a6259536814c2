"""The CUDA kernels' check verdicts on disk (runtime/kernels/verdicts.py): a restart takes them
instead of building and comparing every kernel again. The CPU has no CUDA kernels, so these
tests stand in verdicts and a CUDA device; the checks themselves are tests/test_attention_kernel_route.py's."""

from __future__ import annotations

import json

import pytest

from graphc.runtime import kernels, target
from graphc.runtime.kernels import (decode_attention, quantized_attention, quantized_write, registry, skinny_matmul,
                                   top_ranks, verdicts)

FOUND = {
    "decode_attention": {"check": {"0": None}, "write_check": {"0": "writing vec kernel differs"},
                         "kinds": {"grouped": [True, ""], "vec": [False, "vec kernel differs by 0.5"]}},
    "gumbel_choose": {},
    "quantized_attention": {"check": {"0": None}, "vec": "quantized attention (vec) differs by 0.3"},
    "quantized_write": {"check": {"0": "quantized KV write: key codes differ from mx.quantize's"}},
    "skinny_matmul": {"check": {"0": "kernel differs from MLX's matmul by 3"}},
    "top_ranks": {"check": {"0": None}, "chosen": {"variant": "sort", "select": "too many resources"}},
}


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No answers in this process, a cache folder of its own, the cached mode; state put back after."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GRAPHC_SELFCHECK", "cached")
    att = decode_attention.KERNEL
    saved = (dict(att._check.answers), dict(att._write_check.answers), dict(att.verdicts),
             dict(skinny_matmul.check.answers), dict(top_ranks.check.answers), dict(top_ranks._chosen),
             dict(quantized_attention.KERNEL._check.answers), quantized_attention.KERNEL.vec_ok,
             dict(quantized_write.KERNEL._check.answers))
    checks = (att._check, att._write_check, skinny_matmul.check, top_ranks.check, quantized_attention.KERNEL._check,
              quantized_write.KERNEL._check)
    for c in checks:
        c.answers.clear()
    monkeypatch.setattr(target, "_checked_here", False)
    yield tmp_path
    for c, answers in zip(checks, (saved[0], saved[1], saved[3], saved[4], saved[6], saved[8])):
        c.answers.clear()
        c.answers.update(answers)
    att.verdicts.clear()
    att.verdicts.update(saved[2])
    quantized_attention.KERNEL.vec_ok = saved[7]
    top_ranks._chosen.clear()
    top_ranks._chosen.update(saved[5])


def _take(found: dict) -> None:
    for name, stored in found.items():
        registry.KERNELS[name].restore_verdicts(stored)


def test_stored_verdicts_come_back_in_a_new_process(fresh):
    _take(FOUND)
    verdicts.store()
    assert [p.name for p in (fresh / "kernels").iterdir()] == [verdicts.record_path().name]
    for c in (decode_attention.KERNEL._check, decode_attention.KERNEL._write_check, skinny_matmul.check,
              top_ranks.check, quantized_attention.KERNEL._check, quantized_write.KERNEL._check):
        c.answers.clear()  # as a restarted process starts
    top_ranks._chosen.update({"variant": "select", "select": None})
    assert verdicts.restore()
    assert {n: k.stored_verdicts() for n, k in registry.KERNELS.items()} == FOUND
    assert decode_attention.check() is None and "writing vec" in decode_attention.write_check()
    assert quantized_attention.KERNEL.pick(32, 8, 64) == "grouped"  # its vec kind did not match here
    assert "key codes differ" in quantized_write.check()  # a failed check stays failed after a restart
    assert decode_attention.KERNEL.pick(B=2, Hq=8, Hkv=2, L=1, D=64, itemsize=2) == "grouped"  # grouped ok, vec not
    assert top_ranks.chosen() == "sort"


def test_a_restart_with_a_record_runs_no_check(fresh, monkeypatch):
    """probe_target on a CUDA device with a record: facts from the record, no kernel compared."""
    _take(FOUND)
    verdicts.store()
    for c in (decode_attention.KERNEL._check, decode_attention.KERNEL._write_check, skinny_matmul.check,
              top_ranks.check, quantized_attention.KERNEL._check, quantized_write.KERNEL._check):
        c.answers.clear()

    def boom(*a, **k):
        raise AssertionError("a kernel was checked although its verdict was stored")

    monkeypatch.setattr(kernels, "available", lambda: True)
    monkeypatch.setattr(decode_attention.KERNEL, "_compare_kind", boom)
    monkeypatch.setattr(top_ranks, "_compare", boom)
    monkeypatch.setattr(skinny_matmul, "_compare", boom)
    monkeypatch.setattr(quantized_attention.KERNEL, "_compare", boom)
    monkeypatch.setattr(quantized_write.KERNEL, "_compare", boom)
    facts = {name: (why, note) for name, why, note in target.probe_target(quantized=True).kernels}
    assert facts["quantized_attention"][0] is None and "key codes differ" in facts["quantized_write"][0]
    assert facts["decode_attention"][0] is None and facts["decode_attention"][1].startswith("grouped by KV head")
    assert facts["kv_write"][0] == "writing vec kernel differs"
    assert facts["skinny_matmul"][0].startswith("kernel differs")
    assert facts["top_ranks"][0] is None and "bitonic sort" in facts["top_ranks"][1]


def test_a_first_check_logs_each_kernel_as_it_goes(fresh, monkeypatch, caplog):
    """Without a record the checks build and compare for minutes on a fresh GPU: one log line a kernel,
    with its answer and time, so a starting server shows progress instead of silence."""
    monkeypatch.setattr(kernels, "available", lambda: True)
    monkeypatch.setattr(verdicts, "store", lambda: None)
    monkeypatch.setattr(decode_attention, "check", lambda: None)
    monkeypatch.setattr(decode_attention, "write_check", lambda: "writing vec kernel differs")
    monkeypatch.setattr(decode_attention, "grouped_note", lambda: "grouped")
    monkeypatch.setattr(skinny_matmul, "check", lambda: None)
    monkeypatch.setattr(top_ranks, "check", lambda: None)
    with caplog.at_level("INFO", logger="graphc.load"):
        target.probe_target()
    lines = [r.getMessage() for r in caplog.records if "kernel:" in r.getMessage()]
    assert [ln.split(" kernel:")[0].strip() for ln in lines] == ["decode attention", "KV write", "skinny matmul",
                                                                  "top ranks"]
    assert "matches MLX" in lines[0] and "off: writing vec kernel differs" in lines[1] and lines[0].endswith(" s)")
    assert "CUDA kernel checks done" in caplog.text


@pytest.mark.parametrize("damage", ["not json", json.dumps({"schema": 999, "kernels": {}}),
                                    json.dumps({"schema": verdicts.SCHEMA, "kernels": {"decode_attention": {}}})])
def test_a_damaged_or_foreign_record_is_ignored_with_a_warning(fresh, damage, caplog):
    path = verdicts.record_path()
    path.parent.mkdir(parents=True)
    path.write_text(damage)
    with caplog.at_level("WARNING", logger="graphc.kernels"):
        assert not verdicts.restore()
    assert "ignoring the stored kernel checks" in caplog.text


def test_always_mode_neither_reads_nor_writes(fresh, monkeypatch):
    _take(FOUND)
    verdicts.store()
    monkeypatch.setenv("GRAPHC_SELFCHECK", "always")
    assert not verdicts.restore()
    verdicts.record_path().unlink()
    verdicts.store()
    assert not verdicts.record_path().exists()


def test_the_key_follows_the_kernels_code_only(fresh, monkeypatch, tmp_path):
    """An edit under runtime/kernels or runtime/token_math re-checks; one elsewhere (the scheduler)
    keeps the stored verdicts."""
    import shutil
    for sub in ("runtime/kernels", "runtime/token_math", "runtime/cache"):
        shutil.copytree(verdicts._PACKAGE / sub, tmp_path / sub, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(verdicts, "_PACKAGE", tmp_path)
    first = verdicts.source_digest()
    (tmp_path / "runtime/cache/full.py").write_text("# edited outside the kernels\n")
    assert verdicts.source_digest() == first
    fragment = next((tmp_path / "runtime/kernels/cuda").rglob("*.cu"))
    fragment.write_text(fragment.read_text() + "// edited\n")
    second = verdicts.source_digest()
    assert second != first
    (tmp_path / "runtime/token_math/noise.py").write_text("# edited\n")
    assert verdicts.source_digest() != second


def test_the_key_changes_with_graphc_code(fresh, monkeypatch):
    before = verdicts.record_key()
    monkeypatch.setattr(verdicts, "source_digest", lambda: "edited")
    edited = verdicts.record_key()
    assert edited != before
    monkeypatch.setattr(verdicts, "_driver", lambda: "NVRM version: another driver")
    assert verdicts.record_key() != edited


def test_the_key_ignores_what_changes_between_starts(fresh, monkeypatch):
    """CUDA's device_info() reports the free memory of the moment: a restart must find its record."""
    info = {"device_name": "NVIDIA H200", "architecture": "sm_90", "total_memory": 150_000_000_000,
            "free_memory": 149_000_000_000, "uuid": "GPU-1", "pci_bus_id": "0000:01:00.0"}
    monkeypatch.setattr(verdicts.mx, "device_info", lambda: dict(info))
    first = verdicts.record_key()
    info.update(free_memory=120_000_000_000, uuid="GPU-2", pci_bus_id="0000:02:00.0")
    assert verdicts.record_key() == first
    info["device_name"] = "NVIDIA H100"
    assert verdicts.record_key() != first
