#!/usr/bin/env bash
# Run 22 (nvidia-h200): one mode per device call. Needs mlx (CUDA) + graphc on PYTHONPATH and $OUT.
#   choose TAG : docs/bench/proto_choose_kernel.py: both sampling kernels' checks on the device, then
#                the fused selection at batch 64 and 1 with the Gumbel-choose kernel off and on
#                (host build + submit ms, wall ms, same tokens) (~1 min)
#   many TAG   : step_profile --paired at 1B batch 64, compile="auto", many short calls (101 pairs of
#                48 new tokens, 8 skipped): enough pairs for the median's 95 % interval to resolve
#                "sampling at most 5 % over greedy" one way or the other (~2 min of pairs after ~2 min
#                of model build, traces and kernel builds on a fresh machine: 22c's 140 s ended
#                before the first pair; killed at 400 s, the pairs printed so far stay in the log)
#   pairedc TAG [models], table8b TAG, table1b TAG, split1b TAG, ... : as in run21-h200.sh
#                (22a ran pairedc, table8b, table1b and split1b before the choose kernel existed)
set -u
D="$(dirname "$0")"
case "$1" in
choose)
  for b in 64 1; do
    timeout 150 python3 "$D/proto_choose_kernel.py" $b 200 2>&1 | tee -a $OUT/choose-$2.log
  done ;;
many)
  S='{"temperature": 0.8, "top_p": 0.9, "top_k": 50}'
  timeout 400 python3 -m graphc.benchmarks.step_profile --model llama-3.2-1b --batch 64 --repeats 101 \
      --new 48 --skip 8 --paired "$S" --engine-kw '{"compile": "auto"}' --json $OUT/many-$2.json 2>&1 \
      | grep --line-buffered "^B=\|rror" | tee $OUT/many-$2.log ;;
*)
  bash "$D/run21-h200.sh" "$@" ;;
esac
