"""The compiler loads without the runtime: importing any compiler module pulls in no runtime module."""

from __future__ import annotations

import subprocess
import sys

MODULES = ["graphc.compiler.compile", "graphc.compiler.inspect", "graphc.compiler.ops", "graphc.compiler.validate",
           "graphc.compiler.plan", "graphc.compiler.lower", "graphc.compiler.cli"]


def test_compiler_imports_load_no_runtime_module():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "bad = sorted(m for m in sys.modules if m.startswith('graphc.runtime'))\n"
            + "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
