#!/usr/bin/env bash
# Run 10 (nvidia-h200): step profile through the public API, speculative on the grounded
# workload (SmolLM2 Q4_1 GGUF), and the user-API decode/sampled rows at batch 1 and 64.
# Needs mlx (CUDA) + graphc on PYTHONPATH. Usage: run10-h200.sh profile | stream | spec GGUF TAG [bench args] | table TAG | table8 TAG
set -u
B="python3 -m graphc.cli bench --user-api --no-progress"
P="python3 -m graphc.benchmarks.step_profile"
case "$1" in
profile)
    timeout 200 $P --model llama-3.1-8b --batch 1 64 --json $OUT/profile-8b.json
    timeout 100 $P --model llama-3.1-8b --batch 64 --repeats 2 --engine-kw '{"compile": true}' --json $OUT/profile-8b-compile.json
    timeout 120 $P --model llama-3.2-1b --batch 1 64 --json $OUT/profile-1b.json ;;
spec)  # spec GGUF TAG [--num-draft-tokens K] [--batches ...]
    g=$2; t=$3; shift 3
    timeout 240 $B --user-workloads grounded --model $g --batches 1,16 --long-new 96 --short-new 8 --user-repeats 3 \
        --no-compile --json $OUT/grounded-$t.json "$@" 2>&1 | grep "^|\|note\|self-check\|Error" | tail -12 ;;
stream)
    for s in "llama-3.1-8b 64" "llama-3.2-1b 64"; do timeout 120 python3 docs/bench/proto_stream.py $s 2>&1 | grep -v Warn; done ;;
table8)
    timeout 200 $B --model llama-3.1-8b --batches 64 --user-workloads decode,sampled --json $OUT/ua-8b-$2.json 2>&1 | grep "^|" | tail -12 ;;
table)
    timeout 200 $B --model llama-3.1-8b --batches 1,64 --user-workloads decode,sampled --json $OUT/ua-8b-$2.json 2>&1 | grep "^|" | tail -12
    timeout 150 $B --model llama-3.2-1b --batches 1,64 --user-workloads decode,sampled --json $OUT/ua-1b-$2.json 2>&1 | grep "^|" | tail -12 ;;
esac
