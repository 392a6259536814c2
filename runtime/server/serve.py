"""`graphc serve` once its flags are parsed: load (when distributed), build the app, run uvicorn.

Needs the `server` extra; runtime/server/cli.py names this module by string so that parsing
`graphc` flags needs neither FastAPI nor the engine.
"""

from __future__ import annotations

import logging
import sys

import uvicorn

from graphc.runtime.distributed import launched

from .app import create_app
from .config import ServerConfig
from .guard import is_loopback
from .shutdown import GracefulServer
from .state import load_engine


def serve(args, config: ServerConfig) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if config.shutdown_timeout < 0:
        print("--shutdown-timeout must be >= 0", file=sys.stderr)
        return 2
    engine = None
    if launched() and config.several_models:
        print("a distributed server serves one model (give --model once)", file=sys.stderr)
        return 2
    if launched():  # under mlx.launch: rank 0 serves, the others follow it (docs/distributed.md)
        config.distributed = True
        # Loaded before the server starts, on every rank alike: a rank that cannot load (or shard)
        # the model ends the launch instead of leaving rank 0 serving 503s. Ranks other than 0
        # follow rank 0's steps inside load_engine and exit there.
        engine = load_engine(config)
    if not is_loopback(config.host) and not config.api_key:
        logging.getLogger("graphc.server").warning(
            "binding %s without --api-key: anyone who can reach this address can use the model", config.host)
    app = create_app(config, engine=engine)
    # SIGTERM/SIGINT drain (runtime/server/shutdown.py): 503 for new requests, running ones get
    # --shutdown-timeout to finish, the rest end with finish_reason "abort"; then exit 0.
    server = GracefulServer(uvicorn.Config(app, host=config.host, port=config.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=5), app.state.graphc, config.shutdown_timeout)
    server.run()
    return 0
