#!/usr/bin/env bash
# Run 26 (nvidia-h200): one mode per device call. Needs mlx (CUDA) + graphc on PYTHONPATH and $OUT.
# Run 26 itself ran, on main 773a63d: `run25-h200.sh table1b 26a` (a fresh machine: its 300 s limit
# passed before the first row), `run25-h200.sh many 26b` (1B sampled / greedy 1.046, 95 % interval
# [1.026, 1.060]: not resolved at 5 %), `run25-h200.sh table1b 26c`; then, on a second machine with
# the Gumbel-choose kernel doing the top-p scan itself (two launches fewer a sampled step):
#   scanmany TAG : the kernel's check in the configuration `many` uses (K = 64, top-k + top-p: the
#                  top-p sums bit for bit against MLX's CUDA cumsum, then the tokens), then `many`
#                  (101 sampled / greedy pairs at 1B batch 64) with --budget 300 (26d: 340), so that a fresh
#                  machine's kernel builds leave room, then the check in all 40 configurations
#                  (26d; its 90 s limit cut that last check, which 26e then ran alone: 82.6 s of
#                  builds, passed; the limit is 150 s now)
#   ...          : as in run25-h200.sh (many, cold, skinny, exact, many8b, spec, copies, ablation, ...)
set -u
D="$(dirname "$0")"
case "$1" in
scanmany)
  timeout 60 python3 -c "
from graphc.runtime.kernels import gumbel_choose as g
print('gumbel_choose check_config(64, top-k + top-p):', g.check_config(64, True, True, False) or 'passed')
" 2>&1 | tail -2 | tee $OUT/checks-$2.log
  M=llama-3.2-1b
  S='{"temperature": 0.8, "top_p": 0.9, "top_k": 50}'
  timeout 380 python3 -m graphc.benchmarks.step_profile --model $M --batch 64 --repeats 101 --new 48 --skip 8 \
      --paired "$S" --engine-kw '{"compile": "auto"}' --budget 300 --json $OUT/many-$2.json 2>&1 \
      | grep --line-buffered "^B=\|rror" | tee $OUT/many-$2.log | tail -2
  timeout 150 python3 -c "
from graphc.runtime.kernels import gumbel_choose as g
print('gumbel_choose check (all 40 configurations):', g.check() or 'passed')
" 2>&1 | tail -2 | tee -a $OUT/checks-$2.log ;;
*)
  bash "$D/run25-h200.sh" "$@" ;;
esac
