#!/usr/bin/env bash
# Run 13 (nvidia-h200): what run 12 built but could not measure. Needs mlx (CUDA) + graphc on
# PYTHONPATH and $OUT. Usage: run13-h200.sh GGUF TAG
#   1. eager decode over left-padded rows: the ragged kernel against MLX's masked attention
#      (runtime/kernel_views.py DECODE_MAX_BATCH: does it pay, and where does it stop paying)
#   2. bf16 speculative exactness: kernel and MLX attention, tokens compared with plain
#   3. the grounded bench at batch 1, compile "auto" (the gate's close re-check) and eager
set -u
g=$1; t=$2
timeout 200 python3 docs/bench/proto_padded_decode.py llama-3.2-1b 4,8,16,32 3 2>&1 | grep -v "^graphc: " | tee $OUT/padded-$t.log
PARTS=graphc DEQUANTIZE=1 timeout 150 python3 docs/bench/proto_verify_attrib.py $g 3 2>&1 | grep -v "^graphc: " | tee $OUT/attrib-bf16-$t.log
B="python3 -m graphc.cli bench --user-api --no-progress --user-workloads grounded --model $g --batches 1 --long-new 96 --short-new 8 --user-repeats 3"
timeout 150 $B --json $OUT/grounded-compiled-$t.json 2>&1 | grep "^| B" | tee $OUT/grounded-$t.log
timeout 150 $B --no-compile --json $OUT/grounded-eager-$t.json 2>&1 | grep "^| B" | tee -a $OUT/grounded-$t.log
