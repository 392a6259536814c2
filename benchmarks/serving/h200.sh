#!/usr/bin/env bash
# The serving bench on one H200: graphc serve vs mlx_lm.server on a Llama-shape model folder with
# random bf16 weights (no network there; graphc and mlx come from PYTHONPATH).
#   OUT=/some/dir PYTHONPATH=/root/site bash benchmarks/serving/h200.sh 1b    # or 8b
#   MAX_BATCH=32 ... 8b: mlx_lm.server runs out of GPU memory on the 8B shape at decode concurrency 64
#   MLX_PC=N: mlx_lm.server's --prompt-concurrency (default: its own, or 8 on GPUs under 100 GB)
#   MLX_BATCH=N: mlx_lm.server's --decode-concurrency, where it cannot hold MAX_BATCH streams
#   BENCH_ARGS="--mlx-env MLX_USE_CUDA_GRAPHS=0": mlx_lm.server without MLX's CUDA graphs (its process
#     died of `cudaGraphInstantiate ... out of memory` on 80 GB H100s at every prompt concurrency tried;
#     the default under 100 GB of GPU memory)
#   BENCH_ARGS="--servers graphc --trace-steps": graphc's steps traced, summarized per run beside its log
#   GRAPHC_ARGS="--mixed-step on --step-tokens 256": `graphc serve` flags (spaces kept, unlike BENCH_ARGS)
# Sized to finish in ~500 s per invocation: REPEATS (default 3) on one start of each server, one
# server after the other (--keep-servers; KEEP=0 restarts both every repeat, alternating), the mix (input 64-4096, output
# 32-512 tokens), batch 64.
# Every rate sends fresh prompts (same lengths), so every rate prefills for real on both servers:
# 1B runs 8, 32 and inf req/s (2 req/s alone took 32 s of arrivals per server and repeat).
set -euo pipefail
case "${1:-}" in
  1b) shape=llama-3.2-1b; requests=${REQUESTS:-64}; rates=${RATES:-8,32,inf} ;;
  8b) shape=llama-3.1-8b; requests=${REQUESTS:-48}; rates=${RATES:-4,16,inf} ;;  # slower steps, longer loads: fewer, faster arrivals
  *) echo "usage: $0 1b|8b" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/serving-out}
mkdir -p "$OUT"
model=/tmp/serving-models/$shape  # not under $OUT: 2.5 / 16 GB of weights must not come back
# config.json is written last, so its presence means a complete folder from an earlier call
[ -f "$model/config.json" ] || { time "$PY" -m graphc.benchmarks.serving.make_shape "$shape" "$model"; }
# mlx_lm.server prefills up to --prompt-concurrency prompts in one forward (its default: the decode
# concurrency, here MAX_BATCH): at 64 prompts of up to 4096 tokens that ran out of memory on an
# 80 GB H100 at the 1B shape. Under 100 GB of GPU memory it gets 8 unless MLX_PC says otherwise.
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 || true)
if [ -z "${MLX_PC:-}" ] && [ -n "$gpu_mib" ] && [ "$gpu_mib" -lt 102400 ]; then MLX_PC=8; fi
# MLX_BATCH: mlx_lm.server's decode concurrency where it cannot hold MAX_BATCH streams (8B on an
# H200: out of GPU memory at 32 and 64 whatever its prompt concurrency, 2026-12-07; it finished at
# 16 with MLX_PC=1): graphc keeps MAX_BATCH rows, the table says each side's.
# With MLX's CUDA graphs on (its default) mlx_lm.server has not finished two runs in one process
# on an 80 GB H100 at any prompt concurrency tried (docs/serving-bench.md#h100-1b-shape): under
# 100 GB it runs without them unless BENCH_ARGS says otherwise.
if [ -n "$gpu_mib" ] && [ "$gpu_mib" -lt 102400 ] && [[ "${BENCH_ARGS:-}" != *MLX_USE_CUDA_GRAPHS* ]]; then
  BENCH_ARGS="${BENCH_ARGS:-} --mlx-env MLX_USE_CUDA_GRAPHS=0"
  echo "mlx_lm.server: MLX_USE_CUDA_GRAPHS=0 (${gpu_mib} MiB of GPU memory)"
fi
mlx_flags="${MLX_PC:+--prompt-concurrency=$MLX_PC}${MLX_PC:+${MLX_BATCH:+ }}${MLX_BATCH:+--decode-concurrency=$MLX_BATCH}"
mlx_pc=${mlx_flags:+--mlx-args=$mlx_flags}
[ -n "$mlx_pc" ] && echo "mlx_lm.server: $mlx_flags (${gpu_mib:-?} MiB of GPU memory)"
"$PY" -m graphc.cli bench --serving --model "$model" --requests "$requests" --rates "$rates" \
  --serving-repeats "${REPEATS:-3}" $([ "${KEEP:-1}" = 1 ] && echo --keep-servers) ${mlx_pc:+"$mlx_pc"} ${BENCH_ARGS:-} ${GRAPHC_ARGS:+"--graphc-args=$GRAPHC_ARGS"} --max-batch "${MAX_BATCH:-64}" --min-input 64 --max-input 4096 --min-output 32 --max-output 512 \
  --json "$OUT/serving-$1.json" --plot "$OUT/serving-$1.png" --log-dir "$OUT/logs-$1" 2>&1 | tee "$OUT/serving-$1.txt"
# With --trace-steps in BENCH_ARGS: each server start's step trace read per run (traced_serve.py
# --summarize, a JSON line a run: ITL p99, the slowest steps, step_classes), then gzipped.
for trace in "$OUT/logs-$1"/graphc-steps-*.jsonl; do
  [ -f "$trace" ] || continue
  "$PY" -m graphc.benchmarks.serving.traced_serve --summarize "$trace" --requests "$requests" > "$trace.summary.json"
  gzip -f "$trace"
done
