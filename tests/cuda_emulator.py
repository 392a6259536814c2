"""Runs a kernel's CUDA source on the CPU, thread by thread, for tests on machines without a GPU.

The source (what `mx.fast.cuda_kernel` would compile) is compiled by the host's C++ compiler
inside a function with the kernel's signature; every block runs as 32 x WARPS std::threads, a
block barrier stands for `__syncthreads()` and a warp barrier around a per-warp exchange slot
for `__shfl_xor_sync` (the kernels call it with every lane of a warp, in the same loop trips).
`__shared__` arrays are plain statics: blocks run one after another. T is float, so what this
checks is the kernel's logic — indexing, layouts, the online softmax, the warps' combine — not
bf16 rounding or speed. `build` returns None where no C++20 compiler is found (tests skip)."""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

PRELUDE = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
using std::min;
struct Dim3 { int x = 0, y = 0, z = 0; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
thread_local Dim3 blockIdx, threadIdx, blockDim;
static std::barrier<>* block_bar;
static std::barrier<>* warp_bar[32];
static float shfl_slot[32][32];
static inline float __shfl_xor_sync(unsigned, float v, int o) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  shfl_slot[w][l] = v;
  warp_bar[w]->arrive_and_wait();
  const float r = shfl_slot[w][l ^ o];
  warp_bar[w]->arrive_and_wait();
  return r;
}
static inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
#define __syncthreads() block_bar->arrive_and_wait()
#define __shared__ static
#define __trap() std::abort()
"""


_LAUNCH = r"""
template <typename F>
static void launch(int blocks, int threads, F body) {
  for (int b = 0; b < blocks; ++b) {
    std::barrier<> bb(threads);
    std::vector<std::barrier<>*> wb;
    for (int w = 0; w < threads / 32; ++w) wb.push_back(new std::barrier<>(32));
    block_bar = &bb;
    for (int w = 0; w < threads / 32; ++w) warp_bar[w] = wb[w];
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, b, t] { blockIdx.x = b; threadIdx.x = t; blockDim.x = threads; body(); });
    for (auto& t : ts) t.join();
    for (auto* p : wb) delete p;
  }
}
"""


def build(source: str, params: str, template: str, instances: list[tuple[str, str]], workdir: Path | None = None):
    """Compile `source` as the body of `template <template> void kernel(params)` and one extern "C"
    launcher per (suffix, template arguments) in `instances`: run_<suffix>(blocks, threads, params...).
    Returns the loaded library, or None without a C++ compiler."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        return None
    names = ", ".join(p.rsplit(" ", 1)[1].lstrip("*") for p in params.split(", "))
    text = [PRELUDE, _LAUNCH, f"template <{template}>\nstatic void kernel({params}) {{\n{source}\n}}\n"]
    for suffix, targs in instances:
        text.append(f'extern "C" void run_{suffix}(int blocks, int threads, {params}) {{\n'
                    f"  launch(blocks, threads, [&] {{ kernel<{targs}>({names}); }});\n}}\n")
    code = "".join(text)
    tag = hashlib.sha1(code.encode()).hexdigest()[:12]
    root = Path(workdir or tempfile.gettempdir()) / "graphc-cuda-emulator"
    root.mkdir(parents=True, exist_ok=True)
    lib = root / f"k{tag}.so"
    if not lib.exists():
        src = root / f"k{tag}.cpp"
        src.write_text(code)
        tmp = root / f"k{tag}.{id(code)}.so"
        done = subprocess.run([cxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-Wno-unknown-pragmas",
                               str(src), "-o", str(tmp)], capture_output=True, text=True)
        if done.returncode:  # the kernel's source did not compile: say where
            raise RuntimeError(f"{cxx} could not build {src}:\n{done.stderr[-4000:]}")
        tmp.replace(lib)
    return ctypes.CDLL(str(lib))


def ptr(a: np.ndarray):
    """A numpy array's buffer for a launcher argument (C-contiguous, as the kernel reads it)."""
    assert a.flags["C_CONTIGUOUS"]
    return a.ctypes.data_as(ctypes.c_void_p)
