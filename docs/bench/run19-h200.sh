#!/usr/bin/env bash
# Run 19 (nvidia-h200): what run 18 left open, in the order to run it. Needs mlx (CUDA) + graphc on
# PYTHONPATH and $OUT. Each mode is one device call (~ minutes given).
#   probe TAG      : the 1B batch-64 sampled / greedy pair with 9 interleaved repeats
#                    (proto_top_ranks.py; the <= 5 % goal needs a spread under 5 %; in 18b it did
#                    not finish in 180 s on a fresh machine: give it 240), then an ncu profile of
#                    4 steady 8B batch-64 compiled steps (proto_kernel_profile.py, as run 14): which
#                    op is the 218-301 µs `mlx::gather` (not the embedding lookup alone: 18b)
#   spec GGUF TAG  : the grounded speculative row at batch 1 (run15-h200.sh spec: eager k = 16,
#                    eager k = 8, compile "auto"; the GGUF travels as .gpu-wheels/g1 + g2 over two
#                    calls: `cat /root/w/gg.aa .gpu-wheels/g2/gg.ab > /root/smol.gguf`; ~4 min). Not
#                    measured since run 16 (1.96-2.16x); the vec kernel now serves its verify steps.
#   table TAG      : the issue-15 user-API table a fifth time (~7 min: its own call)
set -u
D="$(dirname "$0")"
case "$1" in
probe)
  timeout 240 python3 "$D/proto_top_ranks.py" llama-3.2-1b 64 9 2>&1 | tee $OUT/sampled-1b64-$2.log
  # the grid size of each launch tells what array the gather fills (one thread per output element)
  timeout 200 ncu --profile-from-start off --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
      --csv --page raw --log-file $OUT/k8b64-compiled-$2.csv \
      python3 "$D/proto_kernel_profile.py" llama-3.1-8b 64 '{"compile": true}' 16 4 2>&1 | grep "profiled"
  python3 "$D/proto_kernel_profile.py" --sum $OUT/k8b64-compiled-$2.csv 4 | head -14 | tee $OUT/k8b64-compiled-$2.txt
  grep -i "gather" $OUT/k8b64-compiled-$2.csv | head -8 | tee $OUT/k8b64-gather-$2.txt ;;
spec)
  bash "$D/run15-h200.sh" spec "$2" "$3" ;;
table)
  bash "$D/run17-h200.sh" table "$2" ;;
esac
