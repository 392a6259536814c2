"""CUDA kernels (`mx.fast.cuda_kernel`) for decode paths where MLX's own kernels are the limit.

Each module has the kernel, a `reference()` it must match, and a `check()` that compares
the two on random inputs in this process before the kernel is used (the compiled decode
path, runtime/compiled_decode.py, falls back to MLX on any mismatch or build failure).

The CUDA itself is in cuda/<module>/*.cu (package data), read by `cuda_source`: the whole
body of a kernel, or a fragment whose `@NAME@` markers the module fills in.
"""

import hashlib
from importlib import resources

import mlx.core as mx


def cuda_source(name: str) -> str:
    """The text of cuda/`name` (e.g. "top_ranks/source.cu"), as the module's kernel uses it."""
    return (resources.files(__name__) / "cuda" / name).read_text(encoding="utf-8")


def source_tag(source: str) -> str:
    """A short hash of a kernel's source, part of its name.

    MLX's CUDA backend caches built kernels on disk (MLX_PTX_CACHE_DIR, default
    /tmp/mlx/<version>/ptx) under the kernel's name and template arguments only, so a
    changed source under an unchanged name would load the old build."""
    return hashlib.sha1(source.encode()).hexdigest()[:10]


def available() -> bool:
    """MLX's CUDA backend is the default device."""
    return mx.default_device().type == mx.gpu and mx.cuda.is_available()


class Kernel:
    """An `mx.fast.cuda_kernel`, built on first call, its name tagged with its source's hash."""

    def __init__(self, name: str, input_names: list, output_names: list, source: str, header: str = "",
                 ensure_row_contiguous: bool = True):
        # ensure_row_contiguous=False: MLX hands the inputs over as they are (no copy of a view) and
        # the source must read each one through its `<name>_strides`.
        self.spec = dict(name=f"{name}_{source_tag(header + source)}", input_names=input_names,
                         output_names=output_names, source=source, header=header,
                         ensure_row_contiguous=ensure_row_contiguous)
        self._built = None

    def __call__(self, **kwargs):
        if self._built is None:
            self._built = mx.fast.cuda_kernel(**self.spec)
        return self._built(**kwargs)


class KernelOp:
    """What the runtime asks of every kernel; each module exposes one as `KERNEL`, and
    runtime/kernels/registry.py lists them by name.

        applies(...)      -> bool: the kernel takes these shapes / settings at all
        check(seed=0)     -> None, or why not: it matched `reference` on this device (once per process)
        stored_verdicts / restore_verdicts   the checks' answers out of / into this process (kept on disk per device)
        reference(...)    the same result from MLX's own ops
        __call__(...)     the kernel (lazy, like any mx op)

    A module's subclass forwards each to the module's functions, looked up when called."""

    name = ""

    def applies(self, *args, **kwargs) -> bool:
        raise NotImplementedError

    def check(self, seed: int = 0) -> str | None:
        raise NotImplementedError

    def reference(self, *args, **kwargs):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        raise NotImplementedError

    def stored_verdicts(self) -> dict:
        """What this process's checks found (JSON-able): kept on disk by runtime/kernels/verdicts.py."""
        return {}

    def restore_verdicts(self, verdicts: dict) -> None:
        """Take `stored_verdicts()` of an earlier process on the same device and code as this one's answers."""

    def __repr__(self) -> str:
        return f"<kernel {self.name}>"


def answers_of(check) -> dict:
    """`check`'s answers so far, {seed as text: None or why not} (JSON keys are text)."""
    return {str(k): v for k, v in check.answers.items()}


def restore_answers(check, answers: dict) -> None:
    check.answers.update({int(k): v for k, v in answers.items()})


def in_process_check(compare):
    """`check(seed=0)` for a kernel module: None when `compare(seed)` (None, or why not) finds
    the kernel equal to its reference on this device; the answer is computed once per seed.
    A kernel that fails to build or run reports why instead of raising: decoding goes on
    with MLX's own ops."""
    answers: dict = {}

    def check(seed: int = 0) -> str | None:
        if seed not in answers:
            if not available():
                answers[seed] = "not a CUDA device"
            else:
                try:
                    answers[seed] = compare(seed)
                except Exception as e:  # noqa: BLE001 - see the docstring
                    answers[seed] = f"kernel failed: {type(e).__name__}: {e}"
        return answers[seed]

    check.answers = answers  # what runtime/kernels/verdicts.py stores and restores
    return check
