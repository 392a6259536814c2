#!/usr/bin/env bash
# Run 19 (nvidia-h200): what run 18 left open, in the order to run it. Needs mlx (CUDA) + graphc on
# PYTHONPATH and $OUT. Each mode is one device call (~ minutes given).
#   probe TAG      : proto_embed_gather.py (~30 s): is the embedding lookup the 218-301 µs
#                    `mlx::gather` of run 14's profiles (one launch per step; 512 KB of rows at
#                    batch 64)? If so, a cheaper lookup is ~5 % of an 8B batch-1 step (goal 4.5 ms,
#                    best 4.8). Then the 1B batch-64 sampled / greedy pair with 9 interleaved
#                    repeats (proto_top_ranks.py; the <= 5 % goal needs a spread under 5 %; ~2 min)
#   spec GGUF TAG  : the grounded speculative row at batch 1 (run15-h200.sh spec: eager k = 16,
#                    eager k = 8, compile "auto"; the GGUF travels as .gpu-wheels/g1 + g2 over two
#                    calls: `cat /root/w/gg.aa .gpu-wheels/g2/gg.ab > /root/smol.gguf`; ~4 min). Not
#                    measured since run 16 (1.96-2.16x); the vec kernel now serves its verify steps.
#   table TAG      : the issue-15 user-API table a fifth time (~7 min: its own call)
set -u
D="$(dirname "$0")"
case "$1" in
probe)
  timeout 90 python3 "$D/proto_embed_gather.py" 2>&1 | tee $OUT/embed-gather-$2.log
  timeout 200 python3 "$D/proto_top_ranks.py" llama-3.2-1b 64 9 2>&1 | tee $OUT/sampled-1b64-$2.log ;;
spec)
  bash "$D/run15-h200.sh" spec "$2" "$3" ;;
table)
  bash "$D/run17-h200.sh" table "$2" ;;
esac
