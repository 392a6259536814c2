"""The public-API step profiler splits every steady decode step into its parts, for graphc and the
plain mlx-lm loop."""

from __future__ import annotations

import json

from graphc.runtime.bench import step_profile


def test_step_profile_splits_steps(tmp_path):
    out = tmp_path / "p.json"
    res = step_profile.main(["--model", "tiny", "--batch", "2", "--prompt-len", "8", "--new", "12",
                             "--skip", "2", "--repeats", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    (run,) = res["runs"]
    for who in ("graphc", "plain"):
        parts = run[who]
        assert parts["steps"] >= 8, parts  # every decode step after the skipped ones was seen
        assert all(parts[p] >= 0 for p in ("build", "submit", "engine", "step")), parts
        # the parts are pieces of the step: none of their medians exceeds the median step
        assert parts["build"] <= parts["step"] and parts["submit"] <= parts["step"], parts
    assert run["plain"]["engine"] == 0.0
