#!/usr/bin/env bash
# Run 9 (nvidia-h200): sampling vs greedy at batch 64 and speculative decoding on the grounded
# workload, through the public API. Needs mlx (CUDA) + graphc on PYTHONPATH and the SmolLM2 GGUF at $1.
set -u
G=$1
B="python3 -m graphc.cli bench --user-api --no-progress"
timeout 200 $B --model llama-3.2-1b --batches 64 --user-workloads decode,sampled --json $OUT/ua-1b.json 2>&1 | grep "^|" | tail -8
timeout 200 $B --user-workloads grounded --model $G --batches 1,16 --long-new 96 --short-new 8 --user-repeats 3 \
    --no-compile --json $OUT/grounded.json 2>&1 | grep "^|\|note" | tail -8
timeout 150 $B --model llama-3.1-8b --batches 64 --user-workloads decode,sampled --json $OUT/ua-8b.json 2>&1 | grep "^|" | tail -8
