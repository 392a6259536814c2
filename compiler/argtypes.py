"""argparse value types shared by every `graphc` subcommand (cli/ and runtime/server/cli.py).

A bad value then fails while the flags are parsed, and argparse's message names the flag
(`argument --prefill-chunk: must be >= 1, got 0`) instead of an error from deep in a load."""

from __future__ import annotations

import argparse


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"int>={low}"  # argparse shows it in "invalid <name> value" messages
    return parse


positive_int = _int_at_least(1)
non_negative_int = _int_at_least(0)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """`--help` shows every flag's default, unless the help text already says it or it has none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if "default" in text or d is None or d is False or d is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)".strip()


def add_kv_bits_arguments(p) -> None:
    """--kv-bits / --kv-group-size: full-attention KV quantized (policy `quantized`, not exact)."""
    p.add_argument("--kv-bits", type=int, choices=[8, 4],
                   help="keep full-attention KV quantized to 8 or 4 bits (policy `quantized`, mlx-lm's "
                        "QuantizedKVCache format; not exact, docs/cache-policies.md); default: the graph's policy")
    p.add_argument("--kv-group-size", type=int, choices=[32, 64, 128],
                   help="values per quantization scale/bias along head_dim with --kv-bits (default 64)")


def add_cpu_weights_argument(p) -> None:
    """--cpu-weights: on the CPU, compute in float32 (runtime/cpu_weights.py)."""
    p.add_argument("--cpu-weights", choices=["auto", "stored", "float32"], default=None,
                   help="on the CPU, run quantized and float16/bfloat16 models in float32 through the BLAS, "
                        "quantized layers dequantized where they fit half the free memory (default auto; "
                        "not exact against the stored weights; docs/cpu-prefill.md); "
                        "stored: as the folder has them; no effect on a GPU unless float32")
