#!/usr/bin/env bash
# Run 21 (nvidia-h200): what run 20 left open, one mode per device call. Needs mlx (CUDA) + graphc
# on PYTHONPATH and $OUT.
#   gathermodel TAG : docs/bench/proto_gather_model.py under ncu (gather kernels only, warm caches,
#                     free clocks): the embedding lookup on the 8B model's own table, a [64, 1]
#                     view, the model's module, under mx.compile, a copy of the table, an argmax
#                     index: which of them is the step's 250 µs (run 20e: 4 µs alone) (~2 min)
#   topranks TAG    : proto_top_ranks.py: the select variant's early stop (after run 20) against
#                     run 20b's 0.103 ms at batch 64; check() must still match MLX (~1 min)
#   table8b TAG, table1b TAG, paired TAG, spec GGUF TAG, kvwrite TAG : as in run20-h200.sh
#                     (the table and the paired sampling ratio are what issue 15's "every run"
#                     goals are judged on: one more session of each)
set -u
D="$(dirname "$0")"
case "$1" in
gathermodel)
  timeout 240 ncu --cache-control none --clock-control none --kernel-name regex:gather \
      --metrics gpu__time_duration.sum --csv --page raw --log-file $OUT/gather-model-$2.csv \
      python3 "$D/proto_gather_model.py" llama-3.1-8b 64 2>&1 | tail -8
  python3 "$D/proto_gather_model.py" --sum $OUT/gather-model-$2.csv | tee $OUT/gather-model-$2.txt ;;
*)
  bash "$D/run20-h200.sh" "$@" ;;
esac
