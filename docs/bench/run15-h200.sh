#!/usr/bin/env bash
# Run 15 (nvidia-h200): what session 22 changed but could not measure. Needs mlx (CUDA) + graphc
# on PYTHONPATH and $OUT.
#   spec GGUF TAG : the grounded bench at batch 1 with prompt lookup's new GPU policy (k = 16, k kept
#                   after a rejection; docs/performance.md "Drafting policy, replayed offline"):
#                   eager Q4_1, then with --num-draft-tokens 8 for the old k in the same process
#                   kind, then compile "auto" (~4 min; give it one call)
#   bf16 GGUF TAG : the same, weights dequantized to bf16, eager (outputs compared at one cache state)
#   table TAG     : the issue-15 user-API table (docs/bench/run11-h200.sh table: 1B and 8B, batches
#                   1 and 64, decode and sampled; compile "auto" now compiles batch 64)
# For tensor parallel on nvidia-h200-x2: docs/bench/run8-tp.sh tp1 / tp2.
set -u
B="python3 -m graphc.cli bench --user-api --no-progress --user-workloads grounded --batches 1 --long-new 96 --short-new 8 --user-repeats 3"
case "$1" in
spec)
  g=$2; t=$3
  timeout 100 $B --model $g --no-compile --json $OUT/grounded-eager-$t.json 2>&1 | grep "^| B\|^note" | tee $OUT/spec-$t.log
  timeout 100 $B --model $g --no-compile --num-draft-tokens 8 --json $OUT/grounded-eager-k8-$t.json 2>&1 | grep "^| B\|^note" | tee -a $OUT/spec-$t.log
  timeout 120 $B --model $g --json $OUT/grounded-auto-$t.json 2>&1 | grep "^| B\|^note" | tee -a $OUT/spec-$t.log ;;
bf16)
  g=$2; t=$3
  timeout 120 $B --model $g --no-compile --dequantize --dtype bfloat16 --json $OUT/grounded-bf16-$t.json 2>&1 | grep "^| B\|^note" | tee $OUT/bf16-$t.log ;;
table)
  bash "$(dirname "$0")/run11-h200.sh" table "$2" ;;
esac
