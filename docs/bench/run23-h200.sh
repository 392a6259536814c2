#!/usr/bin/env bash
# Run 23 (nvidia-h200): one mode per device call. Needs mlx (CUDA) + graphc on PYTHONPATH and $OUT.
#   kvw TAG   : docs/bench/proto_kv_write_kernel.py: both attention checks (plain, writing), whether
#               MLX's chained K/V writes copy the whole buffer (donation), the 32-layer write +
#               attention at 8B batch 64, then through the API the kernel write on / off
#               (compile="auto", 5 paired repeats: 8B batch 64 and 1, 1B batch 64) (~5 min)
#   many8b TAG: as `many` (101 pairs of 48 new tokens, sampled / greedy per step) at 8B batch 64 (~5 min)
#   kvw1b TAG : the API part of kvw at 1B batch 64 only, 15 paired repeats (run 23's five were noise)
#   many TAG, table8b TAG, table1b TAG, ... : as in run22-h200.sh
set -u
D="$(dirname "$0")"
case "$1" in
kvw)
  timeout 150 python3 "$D/proto_kv_write_kernel.py" 2>&1 | tee $OUT/kvw-$2.log
  timeout 240 python3 "$D/proto_kv_write_kernel.py" llama-3.1-8b 64,1 5 2>&1 | grep -v "^\s*$" | tail -8 | tee -a $OUT/kvw-$2.log
  timeout 120 python3 "$D/proto_kv_write_kernel.py" llama-3.2-1b 64 5 2>&1 | grep -v "^\s*$" | tail -6 | tee -a $OUT/kvw-$2.log ;;
many8b)
  S='{"temperature": 0.8, "top_p": 0.9, "top_k": 50}'
  timeout ${MANY8B_TIMEOUT:-380} python3 -m graphc.benchmarks.step_profile --model llama-3.1-8b --batch 64 --repeats 101 \
      --new 48 --skip 8 --paired "$S" --engine-kw '{"compile": "auto"}' --json $OUT/many8b-$2.json 2>&1 \
      | grep --line-buffered "^B=\|rror" | tee $OUT/many8b-$2.log | tail -2 ;;
kvw1b)
  timeout 300 python3 "$D/proto_kv_write_kernel.py" llama-3.2-1b 64 15 2>&1 | grep -v "^\s*$" | tail -6 | tee $OUT/kvw1b-$2.log ;;
*)
  bash "$D/run22-h200.sh" "$@" ;;
esac
