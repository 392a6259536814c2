"""The kernels by name, each behind the one interface (kernels.KernelOp: applies, check,
reference, __call__). A module above the kernel modules: they need not know each other."""

from __future__ import annotations

from . import KernelOp, decode_attention, gumbel_choose, quantized_attention, quantized_write, skinny_matmul, top_ranks

KERNELS: dict[str, KernelOp] = {k.name: k for k in (decode_attention.KERNEL, gumbel_choose.KERNEL,
                                                    quantized_attention.KERNEL, quantized_write.KERNEL,
                                                    skinny_matmul.KERNEL, top_ranks.KERNEL)}


def kernel(name: str) -> KernelOp:
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"no kernel '{name}' (known: {', '.join(sorted(KERNELS))})") from None
