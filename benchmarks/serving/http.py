"""httpx, the HTTP client of the benches that drive servers (`--serving`, `--agent-replay`).

It comes with the `bench` extra, not with graphc itself: imported here, guarded, so that a
`graphc bench` of the other workloads runs without it, and the two that need it say how to get it.
"""

from __future__ import annotations

try:
    import httpx
except ImportError:  # the `bench` extra is not installed: require() says so when it is needed
    httpx = None


def require(what: str) -> None:
    """Stop `graphc bench <what>` with the install command when httpx is missing."""
    if httpx is None:
        raise SystemExit(f"graphc bench {what} needs httpx, which the `bench` extra installs: "
                         "pip install -e '.[bench]'")
