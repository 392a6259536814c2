"""Tiny random-weight models of real mlx-lm architectures, and the demo model.

    from graphc.compiler.modelgen import make_model, demo_model_path
    path = make_model("gpt_oss", "/tmp/tiny-gpt-oss", seed=0)
    model, tok = mlx_lm.load(str(path))
"""

from .archs import ARCHS
from .command import add_cli_arguments, run_cli
from .demo import demo_model_path
from .make import make_config, make_model

__all__ = [
    "ARCHS",
    "add_cli_arguments",
    "demo_model_path",
    "make_config",
    "make_model",
    "run_cli",
]
