"""Compile the top-ranks kernel's variants with NVRTC, without a GPU: a syntax and type check of a
CUDA source edited on a machine that cannot run it (check() on the GPU still decides whether a
variant serves). Each variant is wrapped in a stand-in of the signature mx.fast.cuda_kernel builds
and compiled for sm_90 at three template configurations.

  pip download --no-deps nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 -d /tmp/nvrtc
  for w in /tmp/nvrtc/*.whl; do python -m zipfile -e $w /tmp/nvrtc/x; done
  python docs/bench/nvrtc_compile_check.py /tmp/nvrtc/x/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 \
      /tmp/nvrtc/x/nvidia/cuda_runtime/include

The second argument (the CUDA runtime's headers, for cuda_bf16.h / cuda_fp16.h) adds the bf16 and
f16 instantiations the engine runs; without it only float is compiled. The third (ptxas, from the
nvidia-cuda-nvcc-cu12 wheel) assembles each for sm_90 and reports its registers and shared memory:
a kernel that compiles can still fail to launch with 512 threads a block when it needs more than
128 registers a thread (run 20a: "too many resources requested for launch").

Prints OK or the compiler's log per variant and configuration; exits 1 on any failure."""
import ctypes
import os
import re
import subprocess
import sys
import tempfile

from graphc.runtime.kernels import top_ranks as T

lib = ctypes.CDLL(sys.argv[1])
include = sys.argv[2] if len(sys.argv) > 2 else None
ptxas = sys.argv[3] if len(sys.argv) > 3 else None
dtypes = ["float"] + (["__nv_bfloat16", "__half"] if include else [])


def compile_src(src: str, name: str) -> tuple[int, str, bytes]:
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None) == 0
    opts = [b"--gpu-architecture=compute_90", b"-std=c++17"] + ([f"-I{include}".encode()] if include else [])
    r = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    ptx = b""
    if r == 0:
        lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetPTX(prog, buf)
        ptx = buf.value
    return r, log.value.decode(), ptx


def resources(ptx: bytes) -> tuple[int, int, str | None]:
    """ptxas's registers a thread and static shared bytes for sm_90, and why a launch of
    T.THREADS threads a block would fail ("too many resources requested for launch"), if it would."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "wb") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-arch=sm_90", "-v", path, "-o", os.devnull], capture_output=True,
                             text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    m = re.search(r"(\d+) bytes smem", out)
    smem = int(m.group(1)) if m else 0
    why = []
    if regs * T.THREADS > 65536:
        why.append(f"{regs} registers x {T.THREADS} threads > 65,536 a block")
    if smem > 48 * 1024:
        why.append(f"{smem} B static shared > 48 KB")
    return regs, smem, "; ".join(why) or None


failed = 0
for variant in T._VARIANTS:
    body = T._variant_source(variant)
    for dt in dtypes:
        for K, BK, P in ((64, 32, 4096), (16, 32, 32), (128, 32, 4096), (64, 64, 4096)):
            sig = f"const {dt}*, const float*, const unsigned int*, const int*, int*, float*, float*, const int*"
            src = ("#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n" if include else "") + T._HEADER + f"""
template <typename T, int K, int BK, int P>
__global__ void kern(const T* x, const float* inv_t, const unsigned int* h, const int* pos,
                     int* ids, float* scaled, float* u, const int* x_shape) {{
{body}
}}
template __global__ void kern<{dt}, {K}, {BK}, {P}>({sig});
"""
            r, log, ptx = compile_src(src, f"top_ranks_{variant}.cu")
            verdict = "OK" if r == 0 else f"FAILED\n{log}"
            if r == 0 and ptxas:
                regs, smem, why = resources(ptx)
                verdict = f"{regs:3d} registers, {smem:5d} B shared: " + (why or "OK")
                r = 1 if why else 0
            failed += r != 0
            print(f"{variant:6s} {dt:14s} K={K:3d} BK={BK:3d} P={P:5d}", verdict, flush=True)
sys.exit(1 if failed else 0)
