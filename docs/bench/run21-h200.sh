#!/usr/bin/env bash
# Run 21 (nvidia-h200): what run 20 left open, one mode per device call. Needs mlx (CUDA) + graphc
# on PYTHONPATH and $OUT.
#   gathermodel TAG : docs/bench/proto_gather_model.py under ncu (gather kernels only, warm caches,
#                     free clocks): the embedding lookup on the 8B model's own table, a [64, 1]
#                     view, the model's module, under mx.compile, a copy of the table, an argmax
#                     index: which of them is the step's 250 µs (run 20e: 4 µs alone) (~2 min)
#   gatherstep TAG  : the in-step lookup under ncu (gather kernels only, warm caches, free clocks), an
#                     8B batch-64 compile=True step with the decode option host_read_pieces off and
#                     on (runtime/host_read.py; 21a compared PROTO_HOST_COPY=0/1 instead) (~4 min)
#   hostread TAG    : docs/bench/proto_host_read.py: the runner's chain without the model, the host
#                     reading the tokens, a copy, 8-byte pieces, or a padded copy; wall ms/step,
#                     then the lookup's device time under ncu per variant (~2 min)
#   pieces TAG      : docs/bench/proto_host_read_api.py: per-step ms through Engine.generate with
#                     the runner's 8-byte-piece read off and on, paired repeats, 8B and 1B at batch
#                     64 and 1 (~6 min)
#   split1b TAG     : step_profile at 1B batch 64, compile="auto", greedy then sampled (T 0.8, top-p
#                     0.9, top-k 50): where the sampled step's extra 0.3-0.5 ms of run 21b's pairs
#                     goes (host build, submit = kernel encode, wait = device) (~2 min)
#   pairedc TAG     : `paired` with --control: mlx-lm's plain loop after every call, each pair's
#                     sampled / greedy also normalized by it (run 21c: the host's speed moves
#                     between calls), 1B then 8B, 9 pairs (~8 min: split over two calls if needed)
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
hostread)
  timeout 120 python3 "$D/proto_host_read.py" 64 64 5 2>&1 | tee $OUT/host-read-$2.log
  timeout 240 ncu --cache-control none --clock-control none --kernel-name regex:gather \
      --metrics gpu__time_duration.sum --csv --page raw --log-file $OUT/host-read-$2.csv \
      python3 "$D/proto_host_read.py" 64 32 3 2>&1 | tail -6
  python3 "$D/proto_host_read.py" --sum $OUT/host-read-$2.csv 32 3 | tee -a $OUT/host-read-$2.log ;;
pairedc)
  S='{"temperature": 0.8, "top_p": 0.9, "top_k": 50}'
  for m in ${3:-llama-3.2-1b llama-3.1-8b}; do
    timeout 280 python3 -m graphc.benchmarks.step_profile --model $m --batch 64 --repeats 9 --paired "$S" \
        --control --engine-kw '{"compile": "auto"}' --json $OUT/pairedc-$m-$2.json 2>&1 | grep "^B=\|Error" \
        | tee -a $OUT/pairedc-$2.log
  done ;;
split1b)
  for smp in '{}' '{"temperature": 0.8, "top_p": 0.9, "top_k": 50}'; do
    echo "== sampling $smp" | tee -a $OUT/split-1b-$2.log
    timeout 150 python3 -m graphc.benchmarks.step_profile --model llama-3.2-1b --batch 64 --repeats 3 \
        --engine-kw '{"compile": "auto"}' --sampling "$smp" 2>&1 | grep "^B=\|rror" | tee -a $OUT/split-1b-$2.log
  done ;;
gatherstep)
  # 21a: PROTO_HOST_COPY=0/1. From 21b: the runner's own read, decode option host_read_pieces off / on.
  for v in false true; do
    timeout 280 ncu --profile-from-start off --cache-control none --clock-control none \
        --kernel-name regex:gather --metrics gpu__time_duration.sum --csv --page raw \
        --log-file $OUT/gather-step-pieces-$v-$2.csv \
        python3 "$D/proto_kernel_profile.py" llama-3.1-8b 64 "{\"compile\": true, \"decode_options\": {\"host_read_pieces\": $v}}" 16 8 \
        2>&1 | grep "profiled\|rror"
    python3 "$D/proto_kernel_profile.py" --sum $OUT/gather-step-pieces-$v-$2.csv 8 | tee -a $OUT/gather-step-$2.txt
  done ;;
pieces)
  # the read through the public API: Engines with host_read_pieces off and on, paired per-step ms
  for m in llama-3.1-8b llama-3.2-1b; do for b in 64 1; do
    timeout 200 python3 "$D/proto_host_read_api.py" $m $b 7 2>&1 | tail -3 | tee -a $OUT/pieces-api-$2.log
  done; done ;;
*)
  bash "$D/run20-h200.sh" "$@" ;;
esac
