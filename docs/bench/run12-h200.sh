#!/usr/bin/env bash
# Run 12 (nvidia-h200): the verify attention kernel and quantized fused blocks, SmolLM2 Q4_1 GGUF.
# Needs mlx (CUDA) + graphc on PYTHONPATH and $OUT. Usage: run12-h200.sh GGUF TAG
#   1. proto_verify_attrib.py, eager engine: plain / speculative with the kernel / without it
#   2. the grounded bench at batch 1: eager, compile="auto" (quantized fused blocks + the kernel
#      in the trace), and the weights dequantized to bf16 (eager)
#   3. the user-API decode rows with the compile="measured" contestant, 1B, batches 1 and 64
set -u
g=$1; t=$2
B="python3 -m graphc.cli bench --user-api --no-progress --user-workloads grounded --model $g --batches 1 --long-new 96 --short-new 8 --user-repeats 3"
PARTS=graphc timeout 150 python3 docs/bench/proto_verify_attrib.py $g 3 2>&1 | grep -v "^graphc: " | tee $OUT/attrib-q4-$t.log
timeout 150 $B --no-compile --json $OUT/grounded-eager-$t.json 2>&1 | grep "^| B" | tee $OUT/grounded-$t.log
timeout 150 $B --json $OUT/grounded-compiled-$t.json 2>&1 | grep "^| B" | tee -a $OUT/grounded-$t.log
timeout 150 $B --dequantize --dtype bfloat16 --no-compile --json $OUT/grounded-bf16-$t.json 2>&1 | grep "^| B" | tee -a $OUT/grounded-$t.log
timeout 170 python3 -m graphc.cli bench --user-api --no-progress --model llama-3.2-1b --batches 1,64 --user-workloads decode \
    --compile-measured --json $OUT/measured-1b-$t.json 2>&1 | grep "^|" | tail -6 | tee $OUT/measured-$t.log
