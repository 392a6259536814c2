#!/usr/bin/env bash
# Run 25 (nvidia-h200): one mode per device call. Needs mlx (CUDA) + graphc on PYTHONPATH and $OUT.
# Run 25 itself ran, on main f77503f + this script's parent: `run24-h200.sh copies 25a`,
# `run24-h200.sh many8b 25a`, `run24-h200.sh spec GGUF 25b`, `run24-h200.sh table8b 25c`,
# `run24-h200.sh table1b 25d`, `ABLATION_MODELS=llama-3.2-1b run24-h200.sh ablation 25e`, and on a
# second, fresh machine step_profile --paired at 1B with `--budget 150` (25f: no pair started in
# 150 s; see `cold` below). The modes for the next session:
#   many TAG     : 101 sampled / greedy pairs at 1B batch 64 (run24-h200.sh many): the third
#                  session that issue 15's sampling goal still needs at 1B. Give it its own
#                  call on a machine that has run something before (a fresh one spends minutes
#                  building kernels first: 25f).
#   cold TAG     : docs/bench/proto_cold_start.py at 1B batch 64, graphc (compile="auto"), graphc
#                  after `graphc serve`'s warm-up (timed), then mlx-lm's batch_generate, each in a
#                  fresh process with an empty MLX kernel cache: the build and five greedy then five
#                  sampled calls, wall seconds each
#   skinny TAG   : the user-API table at 1B and 8B, batches 1 and 64, greedy, with the contestant
#                  graphc_skinny (compile="auto" + the skinny matmul kernel; run 25e's ablation had
#                  it 1.23x the compiled step at 1B batch 1, windows apart, and 1.15x at batch 64,
#                  windows overlapping)
#   exact GGUF TAG: graphc bench --workloads exact on the trained SmolLM2 (Q4_1): how many of 32 rows'
#                  greedy tokens the compiled step (fused projections, attention kernel, residual adds
#                  inside the matmuls since run 24) keeps equal to the eager step's, on a model without
#                  random weights' near-ties (run 2's 8B random weights: 3 of 32). Slow on the CPU only
#                  (MLX's CPU quantized matmul: ~5 s a step at batch 32 for mlx-lm too)
#   ...          : as in run24-h200.sh (many8b, spec, copies, ablation, table8b, table1b, ...)
set -u
D="$(dirname "$0")"
case "$1" in
cold)
  for who in graphc graphc-warm mlx-lm; do
    MLX_PTX_CACHE_DIR=$(mktemp -d) timeout 190 python3 "$D/proto_cold_start.py" llama-3.2-1b 64 $who 2>&1 \
        | grep -v "^\s*$" | tail -6 | tee -a $OUT/cold-$2.log
  done ;;
skinny)
  for m in llama-3.2-1b llama-3.1-8b; do
    timeout 280 python3 -m graphc.cli bench --user-api --no-progress --user-workloads decode --batches 1,64 \
        --user-skinny --model $m --json $OUT/skinny-$m-$2.json 2>&1 | grep "^|\|^note\|rror" | tee -a $OUT/skinny-$2.log
  done ;;
exact)
  timeout 240 python3 -m graphc.cli bench --no-progress --workloads exact --model "$2" --json $OUT/exact-$3.json 2>&1 \
      | grep "^|\|^note\|rror" | tee $OUT/exact-$3.log ;;
*)
  bash "$D/run24-h200.sh" "$@" ;;
esac
