"""`graphc serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over AsyncEngine.

Importing this package needs nothing beyond graphc; `create_app` needs the `server` extra
(`pip install graphc[server]`), so `graphc --help` works without it.
"""

from graphc.contracts.providers import resolve

from .config import ServerConfig

__all__ = ["ServerConfig", "create_app"]

CREATE_APP = "graphc.runtime.server.app:create_app"  # loaded on first use: it needs the server extra


def __getattr__(name):
    if name == "create_app":
        return resolve(CREATE_APP, "graphc.runtime.server.create_app")
    raise AttributeError(name)
