#!/usr/bin/env bash
# Run 6 (issue 15) on the H200, from the repository root of the GPU machine, with MLX's CUDA
# wheels and this package installed under /root/site (docs/performance.md, "Running it on the
# GPU machine"). Usage: bash docs/bench/h200-run6.sh TAG PART, PART one of:
#   8b        graphc bench --user-api on Llama-3.1-8B shapes (decode B=1,16,64, sampled, prefill)
#   1b        the same on Llama-3.2-1B, then token selection alone (bench_sampling) at V=128k
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site
tag=${1:?tag}
out=${OUT:-.}
case ${2:?part} in
  8b) python3 -m graphc.cli bench --user-api --no-progress --model llama-3.1-8b --batches 1,16,64 \
        --json "$out/$tag-8b.json" 2>&1 | tee "$out/$tag-8b.log" ;;
  1b) python3 -m graphc.cli bench --user-api --no-progress --model llama-3.2-1b --batches 1,16,64 \
        --json "$out/$tag-1b.json" 2>&1 | tee "$out/$tag-1b.log"
      python3 -m graphc.runtime.sampling.bench_sampling --vocab 128256 --iters 30 --batch 1 64 2>&1 \
        | tee "$out/$tag-select.log" ;;
  *) echo "unknown part $2 (8b or 1b)"; exit 2 ;;
esac
