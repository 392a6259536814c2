"""Build every CUDA kernel of graphc for the H200 without a GPU, and fail what could not launch.

  pip install -e ".[cpu,test]"   # the nvidia-cuda-{nvrtc,runtime,nvcc}-cu12 wheels (Linux x86_64)
  python docs/bench/nvrtc_compile_check.py [--only top_ranks] [--full] [--log] [--arch 90]

For each kernel in runtime/kernels and each configuration the engine launches it with (template
values and threads a block from its own launch code; benchmarks/kernel_builds.py), NVRTC
compiles the source mx.fast.cuda_kernel would build and ptxas -v assembles it for sm_90a (MLX's
target on an H200). Prints the registers a thread and static shared bytes of each, and why a launch
would fail: registers x threads over the 65,536 a block may hold (run 20a's "too many resources
requested for launch"), over 48 KB of static shared memory, or a compiler error. Exits 1 on any
failure. `--full` adds the top-ranks kernel at every block count and every skinny-matmul
configuration tune.py sweeps (~600 builds, minutes). GRAPHC_NVRTC / GRAPHC_CUDA_INCLUDE /
GRAPHC_PTXAS point it at another toolchain. CI runs the same check: tests/test_kernel_builds.py."""
import sys

from graphc.runtime.kernels.offline_build import main

sys.exit(main())
