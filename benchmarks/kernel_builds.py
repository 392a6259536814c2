"""Build every CUDA kernel of runtime/kernels for the H200 without a GPU, and say whether each
launch configuration the engine uses could run.

A kernel whose source compiles can still fail every launch: the select variant of the top-ranks
kernel needed 147-255 registers a thread at 512 threads a block, more than the 65,536 a block may
hold, and the H200 answered "too many resources requested for launch" (`check()` then quietly
fell back to the slower variant). Nothing off the GPU saw it. Here each launch is built
as the GPU would build it:

1. `launches()` runs the kernels' own launch code (`ragged_attention`, `skinny_matmul`,
   `candidates`, `gumbel_choose.choose`) at the shapes the engine serves (`LLAMA_LAYOUTS`, `VOCABS`, `DTYPES`, and the
   kernels' `check()` cases), with `Kernel.__call__` recording instead of launching: template
   values, threads a block and argument dtypes come from the code that launches them, not from
   a copy of it here.
2. `kernel_source()` writes the source `mx.fast.cuda_kernel` would (MLX 0.32,
   mlx/backend/cuda/custom_kernel.cpp `build_kernel`): MLX's default header, the kernel's
   header, then `__global__ void custom_kernel_<name><template hash>(...)` in namespace
   mlx::core::cu with inputs as `const T*` (plus `<name>_shape` / `_strides` / `_ndim` where
   the source names them), outputs as `T*`, and the template values as `constexpr` / `using`
   lines opening the body.
3. `build()` compiles it with NVRTC as MLX's jit_module.cpp does (`--device-as-default-
   execution-space`, C++17 by default) for `ARCH`, assembles the PTX with ptxas -v, and reads
   the registers a thread and static shared bytes; `Build.why` says why a launch would fail.

The toolchain is the nvidia-cuda-{nvrtc,runtime,nvcc}-cu12 wheels (the `test` extra on Linux
x86_64); GRAPHC_NVRTC (libnvrtc.so), GRAPHC_CUDA_INCLUDE (the folder of cuda_bf16.h) and
GRAPHC_PTXAS override where each is found. tests/test_kernel_builds.py runs it all;
`python -m graphc.benchmarks.kernel_builds [--only NAME] [--full] [--log]` prints the table.

What it cannot see: a wrong answer (that is `check()`'s job on the GPU) and dynamic limits such
as occupancy. The GPU's MLX (the `cuda` extra) builds with NVRTC 13; these wheels are 12.9, so
register counts may differ there by a few.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import itertools
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from graphc.runtime.kernels import Kernel
from graphc.runtime.kernels import decode_attention as da
from graphc.runtime.kernels import gumbel_choose as gc
from graphc.runtime.kernels import quantized_attention as qa
from graphc.runtime.kernels import quantized_write as qw
from graphc.runtime.kernels import skinny_matmul as sk
from graphc.runtime.kernels import top_ranks as tr

from .kernel_tune import sweep as tune_sweep

# MLX builds for the device's own architecture and adds the "a" suffix from compute capability 9
# (jit_module.cpp `compile`), so an H200 runs sm_90a code.
ARCH = "90a"
REGISTERS_PER_BLOCK = 65536  # every architecture from sm_50 to sm_120
REGISTER_UNIT = 256  # registers are given to a warp in units of 256 (the occupancy calculator's)
STATIC_SMEM = 48 * 1024  # the most static __shared__ a kernel may declare
MAX_THREADS = 1024

# The logits / activations dtypes a kernel may be handed: bf16 and f16 checkpoints, float32 ones
# (and MLX's CPU default), and float32 logits from a head that upcasts.
DTYPES = (mx.bfloat16, mx.float16, mx.float32)

# (query heads, KV heads, head dim, hidden, intermediate, vocabulary) from each model's
# config.json. The attention and skinny-matmul kernels serve only the llama block
# (compiler/archs.py, LlamaAdapter.own_block: llama, and the families mlx-lm runs as llama).
LLAMA_LAYOUTS = {
    "llama-3.2-1b": (32, 8, 64, 2048, 8192, 128256),
    "llama-3.2-3b": (24, 8, 128, 3072, 8192, 128256),
    "llama-3.1-8b": (32, 8, 128, 4096, 14336, 128256),
    "mistral-7b-v0.3": (32, 8, 128, 4096, 14336, 32768),
    "tinyllama-1.1b": (32, 4, 64, 2048, 5632, 32000),
    "smollm2-135m": (9, 3, 64, 576, 1536, 49152),
    "smollm2-360m": (15, 5, 64, 960, 2560, 49152),
    "smollm2-1.7b": (32, 32, 64, 2048, 8192, 49152),
    "small-32k": (8, 4, 32, 256, 768, 32000),  # benchmarks/shapes.py
}
# check()'s (query heads, KV heads, head dim): it launches these on the GPU before the kernel is
# used, so they must launch too.
ATTENTION_CHECK_HEADS = tuple(sorted({(hq, hkv, d) for (_, hq, hkv, _, d, _, _) in da.CHECK_CASES}))

# Vocabularies the top-ranks kernel ranks (it serves every model's sampled steps): Llama 2 /
# TinyLlama, Phi-3, Mistral v0.3, SmolLM2, Llama 3, Qwen 2.5 / 3, Gemma 2 / 3; 1,000 and 50,000
# are top_ranks.CHECK_CASES' vocabularies.
VOCABS = (1000, 32000, 32064, 32768, 49152, 50000, 128256, 151936, 152064, 256000, 262144, 262208)
# check()'s (vocabulary, width, dtype): it launches these on the GPU
TOP_RANKS_CHECK_CASES = tuple(dict.fromkeys((V, K, dt) for (_, V, K, dt, _) in tr.CHECK_CASES))
WIDTHS = tuple(1 << i for i in range(4, tr.MAX_WIDTH.bit_length()))  # layout() takes powers of two

ROWS = (2, 8, 16, 32, 64)  # decode batch rows the skinny matmul takes: every x-tile count row_tiles() gives


@dataclass(frozen=True)
class Launch:
    """One build of one kernel: what `mx.fast.cuda_kernel` compiles and how it is launched."""

    name: str  # the Kernel's name (with its source hash)
    source: str
    header: str
    inputs: tuple  # ((name, cuda type, ndim), ...)
    outputs: tuple  # ((name, cuda type), ...)
    template: tuple  # ((name, value), ...): int, bool or mx.Dtype
    threads: int  # a block

    def label(self) -> str:
        args = " ".join(f"{n}={_template_text(v)}" for n, v in self.template)
        return f"{self.name.rsplit('_', 1)[0]} {args} ({self.threads} threads)"


_CUDA_TYPES = {mx.bool_: "bool", mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t",
               mx.int64: "int64_t", mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t",
               mx.uint64: "uint64_t", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16",
               mx.float32: "float", mx.float64: "double"}  # mlx/backend/cuda/utils.cpp dtype_to_cuda_type


def _template_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return str(v).removeprefix("mlx.core.")


@contextlib.contextmanager
def recording():
    """Every `Kernel` call inside records a `Launch` (in the yielded list) and returns zeros of
    its output shapes instead of building and running the kernel."""
    seen: list[Launch] = []
    original = Kernel.__call__

    def record(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=(), **_):
        s = self.spec
        seen.append(Launch(
            name=s["name"], source=s["source"], header=s["header"],
            inputs=tuple((n, _CUDA_TYPES[a.dtype], a.ndim) for n, a in zip(s["input_names"], inputs)),
            outputs=tuple((n, _CUDA_TYPES[d]) for n, d in zip(s["output_names"], output_dtypes)),
            template=tuple(template), threads=threadgroup[0] * threadgroup[1] * threadgroup[2]))
        return [mx.zeros(shape, dtype) for shape, dtype in zip(output_shapes, output_dtypes)]

    Kernel.__call__ = record
    try:
        yield seen
    finally:
        Kernel.__call__ = original


def _attention_launches():
    heads = {layout[:3] for layout in LLAMA_LAYOUTS.values()} | set(ATTENTION_CHECK_HEADS)
    for (hq, hkv, d) in sorted(heads):
        G = hq // hkv
        for dt in DTYPES:
            q = mx.zeros((1, hq, 1, d), dt)
            k = mx.zeros((1, hkv, 8, d), dt)
            args = (q, k, k, mx.zeros((1,), mx.int32), mx.array([8], mx.int32), d ** -0.5)
            nk = mx.zeros((1, hkv, 1, d), dt)
            for new in (None, (nk, nk)):  # the plain kernels and their writing variants
                da.ragged_attention(*args, kind="per_head", new=new)
                if da.grouped_warps(hq, hkv, d):
                    da.ragged_attention(*args, kind="grouped", new=new)
                if da.vec_fits(hq, hkv, d, dt.size):
                    # the configurations ragged_attention picks over all block counts (as check() does)
                    for cfg in sorted({da.vec_config(n, G, d) for n, _, _ in da.VEC_CONFIG}):
                        da.ragged_attention(*args, kind="vec", config=cfg, new=new)


def _quantized_attention_launches(full: bool = False):
    """Both kinds at every llama layout's heads (and check()'s), each width and group size they take,
    in every activation dtype (scales and biases keep the model's dtype); `full`: the vec kind also at
    every config of qa.VEC_CONFIGS (the probe's)."""
    heads = {layout[:3] for layout in LLAMA_LAYOUTS.values()} | {c[0][1:3] + (c[0][4],) for c in qa.CHECK_CASES}
    for (hq, hkv, d) in sorted(heads):
        for dt in DTYPES:
            for bits in qa.BITS:
                for group in (g for g in qa.GROUP_SIZES if qa.takes(hq, hkv, d, g, bits)):
                    q = mx.zeros((1, hq, 1, d), dt)
                    codes = mx.zeros((1, hkv, 8, d * bits // 32), mx.uint32)
                    scales = mx.zeros((1, hkv, 8, d // group), dt)
                    planes = (codes, scales, scales, codes, scales, scales)
                    args = (q, planes, mx.zeros((1,), mx.int32), mx.array([8], mx.int32), d ** -0.5, group, bits)
                    qa.KERNEL.attend(*args, kind="grouped")
                    if qa.vec_fits(hq, hkv, d):
                        qa.KERNEL.attend(*args, kind="vec")
                    for cfg in qa.VEC_CONFIGS if full else ():
                        if qa.vec_fits(hq, hkv, d, cfg[2]):
                            qa.KERNEL.attend(*args, kind="vec", config=cfg)


def _quantized_write_launches():
    """The quantized KV write at each width and group size, in every dtype (the head dim is a launch
    value, not a template one: one build serves every layout's heads)."""
    for dt in DTYPES:
        for bits in qw.BITS:
            for group in qw.GROUP_SIZES:
                new = mx.zeros((1, 8, 1, 128), dt)
                codes = mx.zeros((1, 8, 8, 128 * bits // 32), mx.uint32)
                scales = mx.zeros((1, 8, 8, 128 // group), dt)
                qw.KERNEL.write(new, new, (codes, scales, scales, codes, scales, scales), mx.array([0], mx.int32),
                                group, bits)


def _skinny_launches(sweep: bool):
    """The heuristic's configuration for every llama projection at every row count, check()'s
    cases, and with `sweep` every configuration tune.py measures (what a tuned table may name)."""
    cases = set()
    for hq, hkv, d, hidden, inter, vocab in LLAMA_LAYOUTS.values():
        # fused q+k+v, o, fused gate+up, down (compiler/fused_block.py), the head (compiled_decode.py)
        for K, N in ((hidden, (hq + 2 * hkv) * d), (hq * d, hidden), (hidden, 2 * inter), (inter, hidden),
                     (hidden, vocab)):
            for M in ROWS:
                for dt in (mx.bfloat16, mx.float16):
                    cases.add((dt, sk.heuristic(M, K, N)))
    for dt, M, K, N, cfg in sk._check_cases():
        cases.add((dt, cfg or sk.heuristic(M, K, N)))
    if sweep:
        for MT in (1, 2, 4, 8):
            for cfg in tune_sweep(MT, 14336):  # the largest K: no configuration is left out for it
                for dt in (mx.bfloat16, mx.float16):
                    cases.add((dt, cfg))
    for dt, cfg in sorted(cases, key=lambda c: (str(c[0]), c[1])):
        MT = cfg[0]
        x = mx.zeros((MT * 8, 256), dt)
        sk.skinny_matmul(x, mx.zeros((64, 256), dt), config=cfg)


def _top_ranks_cases(every_p: bool) -> list[tuple[int, int, mx.Dtype]]:
    """(vocabulary, width, dtype) to launch: every (width, BK) that layout() gives for VOCABS in
    every dtype, at the smallest and largest P it takes (all of them with `every_p`), and
    check()'s cases as they are. P (the block count, rounded up to a power of two) only bounds
    loops: the select variant's run with a stride of blockDim.x (not unrollable, so P is an
    immediate), and the sort network's length grows with it, but no thread holds more for it."""
    by_block: dict = {}
    for V in VOCABS:
        for K in WIDTHS:
            lay = tr.layout(V, K)
            if lay is not None:
                by_block.setdefault((K, lay[0]), {}).setdefault(lay[1], V)
    cases = list(TOP_RANKS_CHECK_CASES)
    for (K, _), by_p in by_block.items():
        ps = sorted(by_p) if every_p else sorted({min(by_p), max(by_p)})
        cases += [(by_p[p], K, dt) for p in ps for dt in DTYPES]
    return cases


def _top_ranks_launches(every_p: bool):
    z = mx.zeros((1,), mx.float32)
    for variant in tr._VARIANTS:
        for V, K, dt in _top_ranks_cases(every_p):
            tr.candidates(mx.zeros((1, V), dt), K, z, z.astype(mx.uint32), z.astype(mx.int32), variant=variant)


def _choose_launches():
    """The Gumbel-choose kernel at every width the top-ranks kernel gives, every filter combination,
    and its check's top-p sums kernel."""
    for K in WIDTHS:
        s, z = mx.zeros((1, K), mx.float32), mx.zeros((1,), mx.float32)
        for use_k, use_p, use_m in gc.FLAGS:
            gc.choose(s, s.astype(mx.int32), s, z.astype(mx.int32), z, z,
                      use_top_k=use_k, use_top_p=use_p, use_min_p=use_m)
        for use_k in (False, True):  # its check's sums kernel
            gc.top_p_sums(s, z.astype(mx.int32), use_top_k=use_k)


def launches(full: bool = False) -> list[Launch]:
    """Every distinct build the engine may launch (see the module doc), in a stable order.
    `full`: also the top-ranks kernel at every P, every skinny-matmul configuration tune.py
    sweeps and the quantized vec kind at every probe config (~950 more builds, minutes: the CLI's
    --full, not the test)."""
    with recording() as seen:
        _attention_launches()
        _quantized_attention_launches(full)
        _quantized_write_launches()
        _skinny_launches(full)
        _top_ranks_launches(full)
        _choose_launches()
    return list(dict.fromkeys(seen))


def _type_hash(v) -> str:
    # custom_kernel.cpp template_arguments_hash: _<int>, _t / _f, _<get_type_string(dtype)>
    if isinstance(v, bool):
        return "_t" if v else "_f"
    if isinstance(v, int):
        return f"_{v}"
    return "_" + {mx.float16: "float16_t", mx.bfloat16: "bfloat16_t"}.get(v, _CUDA_TYPES[v])


# MLX's default_header (custom_kernel.cpp) ...
DEFAULT_HEADER = """
#include "mlx/backend/cuda/device/utils.cuh"

#include <cooperative_groups.h>

"""
# ... resolved against stand-ins: MLX's own device headers are built into its binary, and CUDA's
# cooperative_groups.h needs the CCCL headers (nv/target), which no wheel here has. The kernels
# use neither; the generated signature needs the fixed-width integer types and Shape / Strides
# (cuda::std::array<int32_t / int64_t, MAX_NDIM> in MLX: the same bytes, passed the same way).
STAND_INS = {
    "mlx/backend/cuda/device/utils.cuh": """#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define MAX_NDIM 10
#define WARP_SIZE 32
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
namespace mlx::core::cu {
template <typename T, int N>
struct StandInArray {
  T data_[N];
  __device__ const T& operator[](int i) const { return data_[i]; }
};
using Shape = StandInArray<int32_t, MAX_NDIM>;
using Strides = StandInArray<int64_t, MAX_NDIM>;
}  // namespace mlx::core::cu
""",
    "cooperative_groups.h": "#pragma once\nnamespace cooperative_groups {}\n",
}


def kernel_name(launch: Launch) -> str:
    return "custom_kernel_" + launch.name + "".join(_type_hash(v) for _, v in launch.template)


def kernel_source(launch: Launch) -> str:
    """The source mx.fast.cuda_kernel compiles for this launch (custom_kernel.cpp `build_kernel`)."""
    params = []
    for name, ctype, ndim in launch.inputs:
        params.append(f"    const {ctype}* {name}")
        if ndim > 0:  # shape / strides / ndim only where the source names them
            if f"{name}_shape" in launch.source:
                params.append(f"    const __grid_constant__ Shape {name}_shape")
            if f"{name}_strides" in launch.source:
                params.append(f"    const __grid_constant__ Strides {name}_strides")
            if f"{name}_ndim" in launch.source:
                params.append(f"    const __grid_constant__ int {name}_ndim")
    params += [f"    {ctype}* {name}" for name, ctype in launch.outputs]
    consts = "".join(
        f"  using {n} = {_CUDA_TYPES[v]};\n" if isinstance(v, mx.Dtype)
        else f"  constexpr {'bool' if isinstance(v, bool) else 'int'} {n} = {_template_text(v)};\n"
        for n, v in launch.template)
    return (DEFAULT_HEADER + launch.header + "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
            + f"__global__ void {kernel_name(launch)}(\n" + ",\n".join(params) + ") {\n"
            + (consts + "\n" if consts else "") + launch.source + "\n}\n\n} // namespace mlx::core::cu\n")


@dataclass(frozen=True)
class Tools:
    nvrtc: str  # libnvrtc.so
    include: str  # the CUDA runtime's headers (cuda_bf16.h, cuda_fp16.h)
    ptxas: str


class ToolsMissing(RuntimeError):
    pass


def _package_dir(module: str) -> Path | None:
    """The folder of an nvidia-* wheel's namespace package (they have no __init__.py)."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def tools() -> Tools:
    """Where NVRTC, the CUDA headers and ptxas are: GRAPHC_NVRTC / GRAPHC_CUDA_INCLUDE /
    GRAPHC_PTXAS, else the nvidia-cuda-{nvrtc,runtime,nvcc}-cu12 wheels. Raises ToolsMissing."""
    found, missing = {}, []
    for key, env, module, rel in (("nvrtc", "GRAPHC_NVRTC", "nvidia.cuda_nvrtc", "lib/libnvrtc.so.12"),
                                  ("include", "GRAPHC_CUDA_INCLUDE", "nvidia.cuda_runtime", "include"),
                                  ("ptxas", "GRAPHC_PTXAS", "nvidia.cuda_nvcc", "bin/ptxas")):
        path = os.environ.get(env)
        if not path:
            base = _package_dir(module)
            path = str(base / rel) if base else None
        if not path or not os.path.exists(path):
            missing.append(f"{key}: {path or module + ' is not installed'} (set {env})")
        found[key] = path
    if missing:
        raise ToolsMissing("; ".join(missing))
    return Tools(**found)


@dataclass
class Build:
    launch: Launch
    registers: int = 0
    smem: int = 0  # static shared bytes
    spill: int = 0  # spill store + load bytes a thread (slow, but it launches)
    why: str | None = None  # why it would not build or launch; None: it would
    log: str = field(default="", repr=False)

    def line(self) -> str:
        res = f"{self.registers:3d} regs {self.smem:6d} B smem" + (f" {self.spill} B spill" if self.spill else "")
        return f"{'FAIL' if self.why else 'ok  '} {res}  {self.launch.label()}" + (f": {self.why}" if self.why else "")


_libs: dict = {}


def _nvrtc(path: str):
    if path not in _libs:
        lib = ctypes.CDLL(path)
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        _libs[path] = lib
    return _libs[path]


def compile_ptx(source: str, t: Tools, arch: str = ARCH, name: str = "kernel.cu",
                pch_dir: str | None = None) -> tuple[bytes | None, str]:
    """(PTX or None, NVRTC's log) for compute_<arch>, with MLX's options (jit_module.cpp).
    `pch_dir`: keep the parsed CUDA headers there as a precompiled header (NVRTC's -pch; the
    code is the same, the next program of the same `name` skips ~0.06 s of parsing)."""
    lib = _nvrtc(t.nvrtc)
    names = list(STAND_INS)
    prog = ctypes.c_void_p()
    r = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), len(names),
                               (ctypes.c_char_p * len(names))(*(STAND_INS[n].encode() for n in names)),
                               (ctypes.c_char_p * len(names))(*(n.encode() for n in names)))
    if r:
        return None, f"nvrtcCreateProgram: {lib.nvrtcGetErrorString(r).decode()}"
    try:
        opts = [b"--device-as-default-execution-space", f"--gpu-architecture=compute_{arch}".encode(),
                f"--include-path={t.include}".encode()]
        if pch_dir:
            opts += [b"-pch", f"--pch-dir={pch_dir}".encode()]
        r = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        if r:
            return None, log.value.decode(errors="replace")
        lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
        ptx = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetPTX(prog, ptx)
        return ptx.value, log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def assemble(ptx: bytes, t: Tools, arch: str = ARCH) -> tuple[dict | None, str]:
    """ptxas -v's resources of the kernel for sm_<arch>: registers, smem, spill; or None and the log."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.ptx")
        with open(path, "wb") as f:
            f.write(ptx)
        p = subprocess.run([t.ptxas, f"-arch=sm_{arch}", "-v", path, "-o", os.devnull],
                           capture_output=True, text=True)
    log = p.stdout + p.stderr
    # One entry function per program; its lines follow "Compiling entry function".
    entry = log.split("Compiling entry function", 1)[-1]
    regs = re.search(r"Used (\d+) registers", entry)
    if p.returncode or not regs:
        return None, log
    smem = re.search(r"(\d+) bytes smem", entry)
    spill = sum(int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", entry))
    return {"registers": int(regs.group(1)), "smem": int(smem.group(1)) if smem else 0, "spill": spill}, log


def launch_failure(registers: int, smem: int, threads: int) -> str | None:
    """Why a block of `threads` threads of a kernel with these resources could not launch (the
    driver's "too many resources requested for launch"), or None."""
    why = []
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    if threads > MAX_THREADS:
        why.append(f"{threads} threads > {MAX_THREADS} a block")
    if warps * per_warp > REGISTERS_PER_BLOCK:
        why.append(f"{registers} registers x {threads} threads ({warps * per_warp:,} allocated) > "
                   f"{REGISTERS_PER_BLOCK:,} a block")
    if smem > STATIC_SMEM:
        why.append(f"{smem:,} B static shared > {STATIC_SMEM:,}")
    return "; ".join(why) or None


_worker = threading.local()
_workers = itertools.count()


def _worker_program() -> str:
    """A program name of this thread's own: NVRTC names its precompiled header after the
    program, so each thread reuses its own and never writes one another thread reads."""
    if not hasattr(_worker, "name"):
        _worker.name = f"graphc_worker{next(_workers)}.cu"
    return _worker.name


def build(launch: Launch, t: Tools, arch: str = ARCH, pch_dir: str | None = None) -> Build:
    """Compile and assemble one launch's kernel; `Build.why` says why it would not run."""
    name = _worker_program() if pch_dir else kernel_name(launch) + ".cu"
    ptx, log = compile_ptx(kernel_source(launch), t, arch, name=name, pch_dir=pch_dir)
    if ptx is None:
        return Build(launch, why="NVRTC failed: " + _first_error(log), log=log)
    res, alog = assemble(ptx, t, arch)
    if res is None:
        return Build(launch, why="ptxas failed: " + _first_error(alog), log=alog)
    return Build(launch, **res, why=launch_failure(res["registers"], res["smem"], launch.threads), log=alog)


def _first_error(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if "error" in ln.lower()]
    return (lines[0] if lines else log.strip().splitlines()[-1] if log.strip() else "no log")[:300]


def build_all(items: list[Launch], t: Tools | None = None, jobs: int | None = None, arch: str = ARCH) -> list[Build]:
    """`build()` for each launch, `jobs` at a time (NVRTC calls may run concurrently; ctypes lets
    go of the GIL during them, and ptxas is a process of its own)."""
    t = t or tools()
    jobs = jobs or len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as pch, ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda launch: build(launch, t, arch, pch), items))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Build every CUDA kernel of graphc for an H200 without a GPU "
                                "(NVRTC + ptxas) and fail what could not launch.")
    p.add_argument("--full", action="store_true",
                   help="also the top-ranks kernel at every P, and every skinny-matmul configuration tune.py "
                        "measures (a tuned table may name any)")
    p.add_argument("--only", default="", help="only kernels whose name contains this")
    p.add_argument("--jobs", type=int, default=None, help="builds at a time (default: the CPUs this process may use)")
    p.add_argument("--arch", default=ARCH, help=f"NVRTC compute_ / ptxas sm_ suffix (default {ARCH}, as MLX on an H200)")
    p.add_argument("--log", action="store_true", help="the compiler's log of each failure")
    a = p.parse_args(argv)
    try:
        t = tools()
    except ToolsMissing as e:
        print(f"no CUDA toolchain: {e}\n  pip install -e '.[kernels]' installs it (Linux x86_64)", file=sys.stderr)
        return 2
    items = [x for x in launches(full=a.full) if a.only in x.name]
    t0 = time.perf_counter()
    builds = build_all(items, t, a.jobs, a.arch)
    for b in builds:
        print(b.line())
        if b.why and a.log:
            print(b.log)
    bad = sum(b.why is not None for b in builds)
    print(f"{len(builds)} builds for sm_{a.arch} in {time.perf_counter() - t0:.1f} s: "
          f"{len(builds) - bad} launch, {bad} would not")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
