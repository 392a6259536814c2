#!/usr/bin/env bash
# Tensor parallel on nvidia-h200-x2: where TP=2 decode time goes, and the TP=1 / TP=2 table
# (docs/distributed.md). Needs mlx (CUDA) + graphc on PYTHONPATH.
# usage: bash benchmarks/probes/tp_h200x2.sh probe|tp2|tp1|model|round N   (writes under $OUT)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
launch() { python3 -c "import sys; from mlx._distributed_utils.launch import main; sys.argv[0]='mlx.launch'; main()" \
             -n 2 --backend nccl -- "$@"; }
PY=$(which python3)
case "$1" in
probe)
  P="$PY -m graphc.benchmarks.tp_probe --json $OUT/probe.jsonl"
  launch $P --label default
  MLX_USE_CUDA_GRAPHS=0 launch $P --label graphs-off
  NCCL_GRAPH_MIXING_SUPPORT=0 launch $P --label nccl-mixing-off
  MLX_MAX_OPS_PER_BUFFER=1000 launch $P --label ops1000
  ;;
tp2)
  for v in default graphs-off; do
    e=(); [ $v = graphs-off ] && e=(env MLX_USE_CUDA_GRAPHS=0)
    "${e[@]}" bash -c "$(declare -f launch); launch $PY -m graphc.benchmarks.tp --shape llama-3.1-8b \
        --batches 1,32,64 --json $OUT/tp2-$v.json" 2>&1 | grep -v "^\s*$" | tail -8
  done
  ;;
tp1)
  for v in default graphs-off; do
    e=(); [ $v = graphs-off ] && e=(env MLX_USE_CUDA_GRAPHS=0)
    "${e[@]}" $PY -m graphc.benchmarks.tp --shape llama-3.1-8b --batches 1,32,64 --json $OUT/tp1-$v.json 2>&1 | tail -4
  done
  ;;
esac
case "$1" in
model)
  P="$PY -m graphc.benchmarks.tp_probe --skip-micro --model llama-3.1-8b --rows 1,32,64 --reps 16 --json $OUT/model.jsonl"
  $P --label tp1 --variants as-is
  launch $P --label tp2-default
  MLX_USE_CUDA_GRAPHS=0 launch $P --label tp2-graphs-off
  ;;
esac
case "$1" in
round)  # one round of the TP table: TP=1 and TP=2, eager and compiled, mlx-lm's loop both ways
  B="-m graphc.benchmarks.tp --shape llama-3.1-8b --batches 1,32,64"
  r=${2:-1}
  $PY $B --json $OUT/r$r-tp1.json 2>&1 | grep "TP="
  $PY $B --compile --skip-mlx-lm --json $OUT/r$r-tp1c.json 2>&1 | grep "TP="
  launch $PY $B --json $OUT/r$r-tp2.json 2>&1 | grep "TP="
  launch $PY $B --compile --skip-mlx-lm --json $OUT/r$r-tp2c.json 2>&1 | grep "TP="
  MLX_USE_CUDA_GRAPHS=1 launch $PY $B --json $OUT/r$r-tp2g.json 2>&1 | grep "TP="
  ;;
esac
