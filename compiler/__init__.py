"""graphc compiler: graph IR, parsing, validation, binding, lowering, CLI."""
