"""graphc's neutral contracts: what the compiler and the runtime agree on, owned by neither.

The layering (tests/test_imports.py checks every import, function-local ones included):

    graphc.contracts   imports neither of the others (mlx, attrs and the standard library only)
    graphc.compiler    imports graphc.contracts, never graphc.runtime
    graphc.runtime     imports graphc.compiler and graphc.contracts
    graphc.cli         the `graphc` command: the composition root, may import all three

What lives here:
- step.py      StepInputs / StepOutputs: one lowered step's inputs and (lazy) outputs;
- policies.py  the cache-policy registry (`register_policy`, `get_policy`, `policy_names`),
               the protocol the compiler relies on, and the prefix-sharing rule over it;
- sampling.py  the sampling functions the head ops lower to (the runtime's kernels);
- decode_block.py  what a fused decode block (an ArchAdapter's fast path) may call on its cache;
- mlx_env.py   MLX environment defaults set before mlx.core is imported (the attention plan cache);
- cpu_blas.py  on Linux, the system's OpenBLAS loaded before mlx.core, for the CPU's float32 matmuls.

Built-in implementations (cache policies, sampling kernels) live in the runtime; the
contracts name them only as module strings, resolved on first use — the same way a
graph's `plugins:` or a Python entry point names an implementation (contracts/providers.py).
"""

from . import cpu_blas
from .mlx_env import set_defaults

set_defaults()  # before anything below imports mlx.core (contracts/mlx_env.py says why)
cpu_blas.preload()  # likewise: MLX binds its CPU BLAS when mlx.core loads (contracts/cpu_blas.py)

from .policies import get_policy, policy_names, register_policy  # noqa: E402
from .step import StepInputs, StepOutputs  # noqa: E402

__all__ = ["StepInputs", "StepOutputs", "get_policy", "policy_names", "register_policy"]
