#!/usr/bin/env bash
# Run 17 (nvidia-h200, then nvidia-h200-x2 if lent): what session 23 (run 16) left open. Needs mlx
# (CUDA) + graphc on PYTHONPATH and $OUT.
#   probe TAG : why the second pair of 144-token calls runs 400-550 ms slower at 8B batch 64 compiled
#               (proto_step_outliers.py with 3 pairs: admission steps, engine part, time outside
#               steps, GC, pool growth and MLX memory per call; ~2 min), then the 1B batch-64 sampled
#               row (sampling <= 5 % over greedy is the open goal there; ~1 min)
#   table TAG : the issue-15 user-API table (run11-h200.sh table; the grouped attention kernel and
#               the AUTO_MAX_KV bound are in since run 16; ~7 min: give it its own call)
#   sampling TAG: per-step profile (step_profile.py) of greedy, sampled with the top-ranks kernel and
#               sampled with MLX's ops (decode: {sampling_kernel: false}), 1B and 8B batch 64 (~6 min;
#               run 17 measured it before the kernel's final version: the open question of issue 15's
#               sampling goal). On a fresh machine run `python3 docs/bench/proto_top_ranks.py` first
#               (~1 min: it builds the kernels; its 90 s limit in 17c was too short on a slow machine)
#   prefill TAG : the cold-prefill rows (32 x 2,048 and 1 x 8,192 tokens), 8B and 1B
#   tp ROUND  : on nvidia-h200-x2, run 8's TP table again (run8-tp.sh round): compiled TP=2 measured
#               13.7-15.7 ms in run 8, before run 14 fixed the compiled K/V write (8.7 of 17.2 ms of
#               device time at 8B batch 64 then); ~6 min
set -u
D="$(dirname "$0")"
case "$1" in
probe)
  timeout 150 python3 "$D/proto_step_outliers.py" llama-3.1-8b 64 1 3 2>&1 | tee $OUT/outliers-$2.log
  timeout 120 python3 -m graphc.cli bench --user-api --no-progress --model llama-3.2-1b --batches 64 \
      --user-workloads sampled --json $OUT/ua-1b-sampled-$2.json 2>&1 | grep "^|\|note" | tee $OUT/ua-1b-sampled-$2.log ;;
table)
  bash "$D/run11-h200.sh" table "$2" ;;
sampling)
  S='{"temperature": 0.8, "top_p": 0.9, "top_k": 50}'
  for m in llama-3.2-1b llama-3.1-8b; do
    P="python3 -m graphc.benchmarks.step_profile --model $m --batch 64 --repeats 3"
    echo "== $m greedy"; timeout 120 $P 2>&1 | grep "^B=\|Error"
    echo "== $m sampled, kernel"; timeout 120 $P --sampling "$S" 2>&1 | grep "^B=\|Error"
    echo "== $m sampled, MLX search"; timeout 120 $P --sampling "$S" --engine-kw '{"decode_options": {"sampling_kernel": false}}' 2>&1 | grep "^B=\|Error"
  done 2>&1 | tee $OUT/step-profile-sampled-$2.log ;;
prefill)
  B="python3 -m graphc.cli bench --user-api --no-progress --user-workloads prefill"
  timeout 150 $B --model llama-3.1-8b --json $OUT/prefill-8b-$2.json 2>&1 | grep "^|" | tee $OUT/prefill-$2.log
  timeout 100 $B --model llama-3.2-1b --json $OUT/prefill-1b-$2.json 2>&1 | grep "^|" | tee -a $OUT/prefill-$2.log ;;
tp)
  bash "$D/run8-tp.sh" round "$2" ;;
esac
