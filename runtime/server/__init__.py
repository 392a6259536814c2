"""`graphc serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over AsyncEngine.

Importing this package needs nothing beyond graphc; `create_app` needs the `server` extra
(`pip install graphc[server]`), so `graphc --help` works without it.
"""

from .config import ServerConfig

__all__ = ["ServerConfig", "create_app"]


def __getattr__(name):
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
