#!/usr/bin/env bash
# Run 18 (nvidia-h200): the vec decode-attention kernel, then what run 17 left open. Needs mlx
# (CUDA) + graphc on PYTHONPATH and $OUT.
#   vec TAG      : proto_vec_attention.py: check(), the kernel alone against the grouped kernel and
#                  MLX at the Llama shapes in every (warps, keys per lane) configuration (~2 min with
#                  its builds), then vec on / off through the public API, 8B and 1B, batches 1 and 64
#                  (~4 min)
#   sampling TAG : run17-h200.sh sampling (per-step profile, greedy vs sampled with and without the
#                  top-ranks kernel, 1B and 8B batch 64; ~6 min)
#   table TAG    : the issue-15 user-API table (~7 min: give it its own call)
#   prefill TAG  : the cold-prefill rows, 8B and 1B (~2.5 min)
set -u
D="$(dirname "$0")"
case "$1" in
vec)
  timeout 240 python3 "$D/proto_vec_attention.py" 2>&1 | tee $OUT/vec-kernel-$2.log
  for m in llama-3.1-8b llama-3.2-1b; do
    timeout 200 python3 "$D/proto_vec_attention.py" $m 1,64 5 2>&1 | grep -v "^check" | tee -a $OUT/vec-api-$2.log
  done ;;
sampling|table|prefill)
  bash "$D/run17-h200.sh" "$1" "$2" ;;
esac
