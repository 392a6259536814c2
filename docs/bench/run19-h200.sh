#!/usr/bin/env bash
# Run 19 (nvidia-h200): what run 18 left open, in the order to run it. Needs mlx (CUDA) + graphc on
# PYTHONPATH and $OUT. Each mode is one device call (~ minutes given).
#   probe TAG      : what sampling costs per step at batch 64, 1B then 8B, `compile="auto"`:
#                    step_profile.py --paired (greedy and sampled calls alternated on one Engine,
#                    9 pairs, a ratio of per-step medians each: the <= 5 % goal needs a spread
#                    under 5 %, which the call-level bench has not given; ~3 min), then an ncu
#                    profile of 4 steady 8B batch-64 compiled steps with grid sizes (proto_kernel_
#                    profile.py, as run 14): which op is the 218-301 µs `mlx::gather` (not the
#                    embedding lookup alone: 18b; ~3 min)
#   spec GGUF TAG  : the grounded speculative row at batch 1 (run15-h200.sh spec: eager k = 16,
#                    eager k = 8, compile "auto"; the GGUF travels as .gpu-wheels/g1 + g2 over two
#                    calls: `cat /root/w/gg.aa .gpu-wheels/g2/gg.ab > /root/smol.gguf`; ~4 min). Not
#                    measured since run 16 (1.96-2.16x); the vec kernel now serves its verify steps.
#   table TAG      : the issue-15 user-API table a fifth time (~7 min: its own call)
#   gather TAG     : (19b on) the probe's ncu profile again, after FullKV.left_pad_array: is the 200-224 µs
#                    gather of 19a gone? (~3 min)
#   host TAG       : docs/bench/proto_host_arrays.py: what a fresh host-made array costs a GPU kernel
set -u
D="$(dirname "$0")"
case "$1" in
probe)
  S='{"temperature": 0.8, "top_p": 0.9, "top_k": 50}'
  for m in llama-3.2-1b llama-3.1-8b; do
    timeout 150 python3 -m graphc.benchmarks.step_profile --model $m --batch 64 --repeats 9 --paired "$S" \
        --engine-kw '{"compile": "auto"}' --json $OUT/paired-$m-$2.json 2>&1 | grep "^B=\|Error" | tee -a $OUT/paired-$2.log
  done
  # the grid size of each launch tells what array the gather fills (one thread per output element)
  timeout 200 ncu --profile-from-start off --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
      --csv --page raw --log-file $OUT/k8b64-compiled-$2.csv \
      python3 "$D/proto_kernel_profile.py" llama-3.1-8b 64 '{"compile": true}' 16 4 2>&1 | grep "profiled"
  python3 "$D/proto_kernel_profile.py" --sum $OUT/k8b64-compiled-$2.csv 4 | head -14 | tee $OUT/k8b64-compiled-$2.txt
  grep -i "gather" $OUT/k8b64-compiled-$2.csv | head -8 | tee $OUT/k8b64-gather-$2.txt ;;
gather)
  timeout 200 ncu --profile-from-start off --metrics gpu__time_duration.sum,launch__grid_size \
      --csv --page raw --log-file $OUT/k8b64-compiled-$2.csv \
      python3 "$D/proto_kernel_profile.py" llama-3.1-8b 64 '{"compile": true}' 16 4 2>&1 | grep "profiled"
  python3 "$D/proto_kernel_profile.py" --sum $OUT/k8b64-compiled-$2.csv 4 | head -16 | tee $OUT/k8b64-compiled-$2.txt ;;
host)
  (cd "$D" && timeout 150 python3 proto_host_arrays.py 40 2>&1 | tee $OUT/host-arrays-$2.log) ;;
spec)
  bash "$D/run15-h200.sh" spec "$2" "$3" ;;
table)
  bash "$D/run17-h200.sh" table "$2" ;;
esac
