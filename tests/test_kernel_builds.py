"""Every CUDA kernel in runtime/kernels builds for the H200 and fits the launches the engine makes,
checked without a GPU (benchmarks/kernel_builds.py): NVRTC compiles the source
mx.fast.cuda_kernel would build at each configuration, ptxas reports the registers a thread and the
static shared memory, and a launch that would need more than a block may have fails here, not on
the H200 ("too many resources requested for launch", as the top-ranks select variant once did).

The build tests skip only where the nvidia-cuda-{nvrtc,runtime,nvcc}-cu12 wheels are not
installed (the `kernels` extra installs them on Linux x86_64: `pip install -e '.[cpu,test,kernels]'`)."""

from __future__ import annotations

import importlib
import pkgutil

import mlx.core as mx
import pytest

import graphc.runtime.kernels as kernels_pkg
from graphc.runtime.kernels import Kernel
from graphc.benchmarks import kernel_builds as ob


@pytest.fixture(scope="module")
def toolchain() -> ob.Tools:
    for module in ("nvidia.cuda_nvrtc", "nvidia.cuda_runtime", "nvidia.cuda_nvcc"):
        pytest.importorskip(module, reason="the CUDA toolchain wheels are not installed (pip install -e '.[kernels]')")
    return ob.tools()  # installed but not found where expected: an error, not a skip


def _all_kernels() -> dict[str, Kernel]:
    """Every Kernel a module of runtime/kernels holds, alone, in a dict, or in a kernel object's
    `kernels` (decode_attention's instance holds its own), by name."""
    found = {}
    for info in pkgutil.iter_modules(kernels_pkg.__path__):
        module = importlib.import_module(f"{kernels_pkg.__name__}.{info.name}")
        for value in vars(module).values():
            held = getattr(value, "kernels", None) if isinstance(value, kernels_pkg.KernelOp) else None
            value = held if isinstance(held, dict) else value
            for k in (value.values() if isinstance(value, dict) else [value]):
                if isinstance(k, Kernel):
                    found[k.spec["name"]] = k
    return found


def test_every_kernel_has_launches_to_check():
    """A kernel added to runtime/kernels without a place in kernel_builds.launches() fails here."""
    launched = {launch.name for launch in ob.launches()}
    kernels = _all_kernels()
    assert len(kernels) >= 6  # 3 attention kernels, the skinny matmul, 2 top-ranks variants
    assert not set(kernels) - launched, f"kernels kernel_builds.launches() never launches: {set(kernels) - launched}"


def test_launch_limits():
    assert ob.launch_failure(147, 0, 512) is not None  # the run-20a select variant at K = 64
    assert ob.launch_failure(128, 0, 512) is None  # exactly 65,536
    assert ob.launch_failure(32, 35344, 512) is None
    # registers go to a warp in units of 256: 170 a thread is 176 allocated, x 384 threads > 65,536
    assert ob.launch_failure(170, 0, 384) is not None and 170 * 384 <= 65536
    assert "static shared" in ob.launch_failure(32, 48 * 1024 + 1, 128)
    assert ob.launch_failure(16, 0, 1025) is not None


def test_every_kernel_builds_and_fits_its_launches(toolchain):
    launches = ob.launches()
    builds = ob.build_all(launches, toolchain)
    failed = [b for b in builds if b.why]
    assert not failed, "kernels that would not build or launch on the H200:\n" + "\n".join(
        b.line() + "\n" + b.log[-2000:] for b in failed[:5])
    assert all(b.registers > 0 for b in builds)
    # the top-ranks kernel's 512 threads leave at most 128 registers a thread
    assert {b.launch.threads for b in builds if "top_ranks" in b.launch.name} == {512}


def _launch(source: str, threads: int = 512, header: str = "") -> ob.Launch:
    """The Launch kernel_builds records for a Kernel of this source (float x in, float y out)."""
    kernel = Kernel("graphc_test_kernel", ["x"], ["y"], source, header)
    with ob.recording() as seen:
        kernel(inputs=[mx.zeros((4,))], output_shapes=[(4,)], output_dtypes=[mx.float32],
               grid=(threads, 1, 1), threadgroup=(threads, 1, 1), template=[("T", mx.float32), ("K", 64)])
    return seen[0]


# the run-20a bug in small: a loop over K shared keys unrolled whole inside a loop the compiler
# cannot unroll, so it hoists all K loads out of it and holds them in registers
_REGISTER_HUNGRY = """
    __shared__ unsigned long long sel[K];
    for (int j = threadIdx.x; j < K; j += blockDim.x) sel[j] = __float_as_uint(x[j % x_shape[0]]) * 2654435761ull + j;
    __syncthreads();
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
      const unsigned long long key = sel[i];
      int r = 0;
#pragma unroll
      for (int j = 0; j < K; ++j) r += sel[j] > key;
      y[i] = (T)r;
    }
"""


def test_the_check_fails_a_kernel_that_could_not_launch(toolchain):
    hungry = ob.build(_launch(_REGISTER_HUNGRY), toolchain)
    assert hungry.registers > 128 and "registers" in hungry.why, hungry.line()
    assert ob.build(_launch(_REGISTER_HUNGRY, threads=128), toolchain).why is None  # the same kernel fits 128 threads

    broken = ob.build(_launch("    y[threadIdx.x] = x[threadIdx.x] +;\n"), toolchain)
    assert broken.why.startswith("NVRTC failed") and "expected an expression" in broken.log

    big = ob.build(_launch("    __shared__ float s[16384];\n    s[threadIdx.x] = x[0];\n    __syncthreads();\n"
                           "    y[threadIdx.x] = s[threadIdx.x ^ 1];\n"), toolchain)
    assert big.why is not None and "shared" in big.why, big.line()  # ptxas refuses 64 KB of static shared
