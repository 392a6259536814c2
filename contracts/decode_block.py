"""What a fused decode block (an ArchAdapter's, compiler/fused_block.py) may call on its cache.

The compiled decode path (runtime/compiled_decode.py) hands each layer a fixed-shape cache
inside `mx.compile`; when the architecture supplies a fused block for a layer, the block
runs the layer itself through this cache:

    cache.offset                    RoPE positions (an int32 array [B])
    cache.attend_new(q, k, v, scale)  write this step's keys / values and attend over the valid
                                    columns: MLX's write and attention, or one CUDA kernel that
                                    writes them in place while it attends (compiled steps)
    cache.update_and_fetch(k, v)    write this step's keys / values, return what to attend over
    cache.attend(q, k, v, scale)    attention over the valid columns (MLX's, or a CUDA kernel)
    cache.matmul(x, w)              x @ w.T (MLX's, or the skinny-matmul kernel)
    cache.plus_matmul(x, y, w)      x + y @ w.T, a residual: one matmul with x as its C input
                                    (compiled CUDA steps, `residual_matmul`), or the matmul and an add
"""

from __future__ import annotations

from typing import Any, Protocol

import mlx.core as mx


class DecodeBlockCache(Protocol):
    offset: Any

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]: ...

    def attend(self, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array: ...

    def attend_new(self, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array: ...

    def matmul(self, x: mx.array, w: mx.array) -> mx.array: ...

    def plus_matmul(self, x: mx.array, y: mx.array, w: mx.array) -> mx.array: ...
