#!/usr/bin/env bash
# Run 11 (nvidia-h200): speculative decoding with pipelined verify on the grounded workload
# (SmolLM2 Q4_1 GGUF). On a GPU the bench adds an `unpipelined` mode (same requests, verify
# steps not pipelined), so each row shows plain / pipelined / unpipelined from one Engine.
# Needs mlx (CUDA) + graphc on PYTHONPATH. Usage: run11-h200.sh spec GGUF TAG [bench args]
#   spec  GGUF TAG [args]: eager decode (--no-compile), batches 1 and 16
#   specc GGUF TAG [args]: compile "auto" (plain steps and verify forwards traced), batch 1
#   table TAG: the user-API decode/sampled rows, 1B and 8B, batches 1 and 64
#   specbf16 GGUF TAG [args]: the grounded workload on the model's weights dequantized to bf16
#   measured TAG: decode rows with the compile="measured" contestant too, 1B and 8B, batches 1 and 64
set -u
B="python3 -m graphc.cli bench --user-api --no-progress"
case "$1" in
spec)
    g=$2; t=$3; shift 3
    timeout 300 $B --user-workloads grounded --model $g --batches 1,16 --long-new 96 --short-new 8 --user-repeats 3 \
        --no-compile --json $OUT/grounded-$t.json "$@" 2>&1 | grep "^|\|note\|self-check\|Error\|Traceback" | tail -12 ;;
specc)
    g=$2; t=$3; shift 3
    timeout 300 $B --user-workloads grounded --model $g --batches 1 --long-new 96 --short-new 8 --user-repeats 3 \
        --json $OUT/grounded-compiled-$t.json "$@" 2>&1 | grep "^|\|note\|self-check\|Error\|Traceback" | tail -12 ;;
specbf16)
    g=$2; t=$3; shift 3
    timeout 300 $B --user-workloads grounded --model $g --dequantize --dtype bfloat16 --batches 1,16 --long-new 96 \
        --short-new 8 --user-repeats 3 --no-compile --json $OUT/grounded-bf16-$t.json "$@" 2>&1 | grep "^|\|note\|Error\|Traceback" | tail -12 ;;
measured)
    timeout 330 $B --model llama-3.1-8b --batches 1,64 --user-workloads decode --compile-measured --json $OUT/measured-8b-$2.json 2>&1 | grep "^|" | tail -6
    timeout 200 $B --model llama-3.2-1b --batches 1,64 --user-workloads decode --compile-measured --json $OUT/measured-1b-$2.json 2>&1 | grep "^|" | tail -6 ;;
table)
    timeout 330 $B --model llama-3.1-8b --batches 1,64 --user-workloads decode,sampled --json $OUT/ua-8b-$2.json 2>&1 | grep "^|" | tail -12
    timeout 220 $B --model llama-3.2-1b --batches 1,64 --user-workloads decode,sampled --json $OUT/ua-1b-$2.json 2>&1 | grep "^|" | tail -12 ;;
esac
