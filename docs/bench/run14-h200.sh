#!/usr/bin/env bash
# Run 14 (nvidia-h200): does MLX's CUDA-graph batching set the host cost of a decode step?
# MLX's CUDA backend adds every kernel to a CUDA graph and launches the graph every
# MLX_MAX_OPS_PER_BUFFER nodes (default 20), updating or instantiating a cached graph exec
# each time; MLX_USE_CUDA_GRAPHS=0 launches kernels directly. Every eager decode step is
# host-bound (run 10), so this per-kernel cost is the step. Needs mlx (CUDA) + graphc on
# PYTHONPATH and $OUT. Usage: run14-h200.sh graphs TAG   (step_profile per setting, 1B then 8B)
set -u
mode=$1; t=$2
P="python3 -m graphc.benchmarks.step_profile"
if [ "$mode" = graphs ]; then
  for env in "X=1" "MLX_USE_CUDA_GRAPHS=0" "MLX_MAX_OPS_PER_BUFFER=60" "MLX_MAX_OPS_PER_BUFFER=200"; do
    echo "== 1B $env" | tee -a $OUT/graphs-$t.log
    env $env timeout 120 $P --model llama-3.2-1b --batch 1 64 --repeats 3 --json $OUT/graphs-1b-${env%%=*}-${env##*=}-$t.json 2>&1 \
      | grep "^B=" | tee -a $OUT/graphs-$t.log
  done
  for env in "X=1" "MLX_USE_CUDA_GRAPHS=0"; do
    echo "== 8B $env" | tee -a $OUT/graphs-$t.log
    env $env timeout 150 $P --model llama-3.1-8b --batch 1 64 --repeats 2 --new 96 --json $OUT/graphs-8b-${env%%=*}-${env##*=}-$t.json 2>&1 \
      | grep "^B=" | tee -a $OUT/graphs-$t.log
  done
fi
# run14-h200.sh write TAG: the compiled step with the scatter KV write (runtime/compiled_decode.py
# _write_columns) against eager, per-step split, then the compiled 8B batch-64 step's kernels.
if [ "$mode" = write ]; then
  for kw in '{}' '{"compile": true}'; do
    echo "== 8B $kw" | tee -a $OUT/write-$t.log
    timeout 150 $P --model llama-3.1-8b --batch 1 64 --repeats 2 --new 96 --engine-kw "$kw" 2>&1 | grep "^B=" | tee -a $OUT/write-$t.log
  done
  for kw in '{}' '{"compile": true}'; do
    echo "== 1B $kw" | tee -a $OUT/write-$t.log
    timeout 100 $P --model llama-3.2-1b --batch 1 64 --repeats 3 --engine-kw "$kw" 2>&1 | grep "^B=" | tee -a $OUT/write-$t.log
  done
  timeout 200 ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw --log-file $OUT/k8b64-compiled-$t.csv \
    python3 docs/bench/proto_kernel_profile.py llama-3.1-8b 64 '{"compile": true}' 16 4 2>&1 | grep "profiled"
  python3 docs/bench/proto_kernel_profile.py --sum $OUT/k8b64-compiled-$t.csv 4 | head -12 | tee $OUT/k8b64-compiled-$t.txt
fi
