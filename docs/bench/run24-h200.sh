#!/usr/bin/env bash
# Run 24 (nvidia-h200): one mode per device call. Needs mlx (CUDA) + graphc on PYTHONPATH and $OUT.
# Run 24 itself ran `run23-h200.sh many8b 24a` (its 380 s limit cut it at 69 of 101 pairs: the
# 8B model's build and a slower host), `run23-h200.sh many 24a`, `run23-h200.sh table8b 24a`,
# `MANY8B_TIMEOUT=540 bash run23-h200.sh many8b 24b`, then `spec GGUF 24c` below. The modes for the
# next session:
#   many8b TAG, many TAG: 101 sampled / greedy pairs at batch 64, 8B / 1B (as in run 23), with
#                  `--budget 500`, so that a cut keeps the pairs done
#   spec GGUF TAG: the grounded row at batch 1, eager only (run20's `spec` without its
#                  compile="auto" half, which a fresh machine's remaining budget did not fit)
#   copies TAG   : docs/bench/proto_kv_write_kernel.py copies: the writing kernels read the new keys /
#                  values as strided views (no copy, after run 24) against copies first (as before):
#                  32 layers at 8B batch 64, then through the API at 8B batch 64 and 1, 1B batch 64 (~5 min)
#   ablation TAG : graphc bench --compile-ablation at 1B then 8B, batches 64 and 1: the compiled step
#                  against itself with each part off, among them `residual_matmul` (compiled/noaddmm,
#                  new in run 24) and `kv_write_kernel` (compiled/nokvwrite) (~2 x 4 min)
#   table8b TAG, table1b TAG, kvw TAG, kvw1b TAG, ... : as in run23-h200.sh
set -u
D="$(dirname "$0")"
case "$1" in
many|many8b)  # --budget: past 500 s no new pair starts, and the pairs done are kept (24a lost its JSON)
  M=llama-3.2-1b; [ "$1" = many8b ] && M=llama-3.1-8b
  S='{"temperature": 0.8, "top_p": 0.9, "top_k": 50}'
  timeout 570 python3 -m graphc.benchmarks.step_profile --model $M --batch 64 --repeats 101 --new 48 --skip 8 \
      --paired "$S" --engine-kw '{"compile": "auto"}' --budget 500 --json $OUT/$1-$2.json 2>&1 \
      | grep --line-buffered "^B=\|rror" | tee $OUT/$1-$2.log | tail -2 ;;
spec)
  python3 -c "from graphc.compiler.gguf import resolve_model_path as r; print(r('$2'))" 2>&1 | tail -1
  timeout 200 python3 -m graphc.cli bench --user-api --no-progress --user-workloads grounded --batches 1 \
      --long-new 96 --short-new 8 --user-repeats 3 --model "$2" --no-compile --json $OUT/grounded-eager-$3.json 2>&1 \
      | grep "^| B\|^note\|rror" | tee $OUT/spec-$3.log ;;
copies)
  timeout 260 python3 "$D/proto_kv_write_kernel.py" copies llama-3.1-8b 64,1 5 2>&1 | grep -v "^\s*$" | tail -8 | tee $OUT/copies-$2.log
  timeout 150 python3 "$D/proto_kv_write_kernel.py" copies llama-3.2-1b 64 9 2>&1 | grep -v "^\s*$" | tail -4 | tee -a $OUT/copies-$2.log ;;
ablation)
  for m in ${ABLATION_MODELS:-llama-3.2-1b llama-3.1-8b}; do  # ABLATION_MODELS=llama-3.2-1b: one model
    timeout 270 python3 -m graphc.cli bench --no-progress --workloads decode --batches 64,1 --compile-ablation \
        --model $m --json $OUT/ablation-$m-$2.json 2>&1 | grep "^|\|rror" | tee -a $OUT/ablation-$2.log
  done ;;
*)
  bash "$D/run23-h200.sh" "$@" ;;
esac
