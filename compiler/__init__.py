"""graphc compiler: graph IR, parsing, validation, binding, lowering, CLI."""

import graphc.contracts  # noqa: F401  first: it sets what MLX reads when mlx.core is imported
