"""Random ggml blocks for types the `gguf` package can read but not write (K-quants, IQ4).

Test-only. Every byte is random except the float16 super-scales, which get small finite
values (`scale` sets the size of the dequantized weights), so the blocks are valid files'
blocks: what a quantizer could have written, and what gguf.quants.dequantize reads.
"""

from __future__ import annotations

import numpy as np

# type -> (values per block, bytes per block, byte offsets of its float16 scale fields,
#          largest |quantized value × sub-scale| the fields multiply)
LAYOUT = {
    "Q4_0": (32, 18, (0,), 8), "Q4_1": (32, 20, (0, 2), 15), "Q5_0": (32, 22, (0,), 16),
    "Q5_1": (32, 24, (0, 2), 31), "Q8_0": (32, 34, (0,), 128),
    "Q2_K": (256, 84, (80, 82), 45), "Q3_K": (256, 110, (108,), 128), "Q4_K": (256, 144, (0, 2), 945),
    "Q5_K": (256, 176, (0, 2), 1953), "Q6_K": (256, 210, (208,), 4064),
    "IQ4_NL": (32, 18, (0,), 127), "IQ4_XS": (256, 136, (0,), 4064),
}


def random_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator, scale: float = 0.05) -> np.ndarray:
    """(rows, bytes per row) uint8 of random blocks whose values are about ±`scale`."""
    n, size, fields, span = LAYOUT[qtype]
    raw = rng.integers(0, 256, (rows * cols // n, size), dtype=np.uint8)
    for off in fields:
        d = (rng.uniform(0.5, 1.0, raw.shape[0]) * scale / span).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)
