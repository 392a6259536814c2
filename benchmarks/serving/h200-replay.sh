#!/usr/bin/env bash
# The agent replay on one H200: a conversation growing to 32k tokens, replayed turn by turn against
# graphc serve and/or mlx_lm.server on a bench shape's model folder (random bf16 weights; graphc and
# mlx come from PYTHONPATH).
#   OUT=/some/dir PYTHONPATH=/root/site SERVERS=graphc bash benchmarks/serving/h200-replay.sh 8b
#   ... SERVERS=mlx_lm ... 8b, then the hybrid shape: ... hybrid
# One server per call keeps a call under the device's 10 minutes: an 8B graphc start is ~45 s with
# the kernel checks' verdicts stored (~3 min on a fresh machine), and the restart pass starts two.
# PASSES defaults to cold,warm,restart: the disk tier's write-through pass is one more start and
# 4 GiB of writes at 8B / 32k, and the CPU runs already measure it (docs/agent-replay.md).
set -euo pipefail
case "${1:-}" in
  8b) shape=llama-3.1-8b ;;
  # Qwen3-Next's layer plan with dense MLPs (benchmarks/shapes.py says why; HYBRID_SHAPE=qwen3-next-2b
  # for its experts). The chunked gated-delta form, asked for: where it rounds past the self-check's
  # tolerance against mlx-lm's loop, auto would serve the loop, which is what stalled the 32k cold
  # pass (docs/cpu-prefill.md#hybrid-models). GRAPHC_ARGS= overrides.
  hybrid) shape=${HYBRID_SHAPE:-qwen3-next-2b-dense}; GRAPHC_ARGS=${GRAPHC_ARGS---linear-prefill chunked} ;;
  *) echo "usage: $0 8b|hybrid" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/replay-out}
SERVERS=${SERVERS:-graphc}
mkdir -p "$OUT"
model=/tmp/serving-models/$shape  # not under $OUT: the weights must not come back
[ -f "$model/config.json" ] || { time "$PY" -m graphc.benchmarks.serving.make_shape "$shape" "$model"; }
tag="$1-${SERVERS//,/-}"
"$PY" -m graphc.cli bench --agent-replay --model "$model" --servers "$SERVERS" \
  --replay-context "${CONTEXT:-32768}" --replay-turns "${TURNS:-16}" --replay-repeats "${REPEATS:-1}" \
  --replay-passes "${PASSES:-cold,warm,restart}" ${BENCH_ARGS:-} ${GRAPHC_ARGS:+"--graphc-args=$GRAPHC_ARGS"} \
  --log-dir "$OUT/logs-$tag" --json "$OUT/replay-$tag.json" 2>&1 | tee "$OUT/replay-$tag.txt"
