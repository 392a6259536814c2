"""Cross-site safety: which Host headers the server answers, and CORS.

An unkeyed server on loopback is reachable by every web page the user opens: the page
cannot read a cross-origin answer, but it can send a "simple" POST (text/plain or
form-encoded — refused with 415 by body.py), and with DNS rebinding it can point a name
it controls at 127.0.0.1 and then read the answers as same-origin. The browser sends
that name as `Host`, so a loopback server answers only loopback names and addresses
(`--allowed-hosts` to add others, `*` for any). CORS is off unless `--cors-origins`
lists the origins that may read responses.
"""

from __future__ import annotations

import ipaddress

from starlette.middleware.cors import CORSMiddleware

from .errors import APIError

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host part of a Host header: `name`, `name:port`, `[v6]`, `[v6]:port`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header[1:]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_policy(bind_host: str, allowed: list[str] | None):
    """A predicate on the Host header's name, or None when every Host is accepted.

    Default: bound to loopback -> loopback names/addresses only; bound elsewhere -> any (the
    operator exposed it on purpose; use --allowed-hosts to pin the names). `allowed`
    replaces the loopback set; `*` accepts any.
    """
    if allowed:
        names = {a.strip().lower().strip("[]") for a in allowed if a.strip()}
        if "*" in names:
            return None
        return lambda name: name in names or (is_loopback(name) and is_loopback(bind_host))
    if is_loopback(bind_host):
        return is_loopback
    return None


class HostGuard:
    """Pure ASGI middleware: 403 for a Host header the policy refuses (or none at all)."""

    def __init__(self, app, allow):
        self.app = app
        self.allow = allow

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.allow is not None:
            raw = dict(scope.get("headers") or ()).get(b"host", b"")
            name = host_name(raw.decode("latin-1"))
            if not name or not self.allow(name):
                shown = name.encode("ascii", "replace").decode()[:80] or "none"
                err = APIError(403, f"the Host header '{shown}' is not allowed on this server; it answers "
                                    "loopback names only (start it with --allowed-hosts NAME to add names)",
                               code="host_not_allowed")
                return await err.response()(scope, receive, send)
        return await self.app(scope, receive, send)


def install(app, config) -> None:
    """Host checking always (per policy); CORS only when origins were configured."""
    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type"], max_age=600)
    app.add_middleware(HostGuard, allow=host_policy(config.host, config.allowed_hosts))
