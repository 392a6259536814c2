#!/usr/bin/env bash
# Run 20 (nvidia-h200): what run 19 left open, one mode per device call, in this order. Needs mlx
# (CUDA) + graphc on PYTHONPATH and $OUT. Run 19 lost its 8B table row and its speculative row to
# time limits on a fresh machine (the first process builds every kernel), so the calls are small.
#   gather TAG     : run19-h200.sh gather: the ncu profile of an 8B batch-64 compiled step after
#                    FullKV.left_pad_array; is the 174-224 µs embedding gather of 19a gone? (~3 min;
#                    also builds the Llama kernels into MLX's PTX cache for the calls after it)
#   cause TAG      : docs/bench/proto_gather_cause.py: the lookup alone, after a 16 GB matmul stream
#                    (TLB), into a buffer the host just read (managed memory recycled), and after the
#                    stream with all rows in one page (~1 min)
#   topranks TAG   : docs/bench/proto_top_ranks.py (selection alone, ~1 min): does the radix-select
#                    variant of the top-ranks kernel (new after run 19, never run on a GPU) match MLX,
#                    and what does its candidate stage cost against the bitonic sort's?
#   sampledk TAG   : ncu of 4 steady 8B batch-64 compile=True steps, sampled (T 0.8, top-p 0.9, top-k 50)
#                    against the greedy profile of `gather`: the kernels a sampled step adds (~3 min)
#   table8b TAG    : the issue-15 table, 8B, batches 1 and 64, decode and sampled (~5 min)
#   table1b TAG    : the same at 1B (~2.5 min)
#   spec GGUF TAG  : the GGUF converted first (graphc's import, cached), then the grounded row at
#                    batch 1, eager and compile "auto" (run19's `spec` without k = 8; ~4 min).
#                    The GGUF travels as .gpu-wheels/g1 + g2 over two calls.
#   paired TAG     : run19-h200.sh probe's paired sampling ratio, 1B then 8B, 9 pairs each, with
#                    room for all nine at 1B (19a cut it at seven)
#   host TAG       : run19-h200.sh host: proto_host_arrays.py, now also a verify step's drafts as one
#                    host array against 8-byte pieces (MLX's small pool) joined on the device (~1 min)
#   kvwrite TAG    : docs/bench/proto_kv_write_fused.py at B 64/16/1 and capacity 256 (and 64 x 1,024):
#                    one step's K/V column writes as two scatters, one scatter into a joined K/V
#                    buffer, scatters on flat views, and setitem (~30 s; run 20d)
#   nsys TAG       : Nsight Systems over 8 steady 8B batch-64 compile=True steps (CUDA graphs traced
#                    per node): each kernel's real duration, without ncu's serialisation, locked
#                    clocks and cache flushes, which inflate small kernels (the embedding lookup?)
#   ptx            : MLX's PTX cache (/tmp/mlx/*/ptx) as $OUT/ptx.tgz, to carry to the next fresh
#                    machine with MLX_PTX_CACHE_DIR (skips the NVRTC builds) when it is small enough
set -u
D="$(dirname "$0")"
U="python3 -m graphc.cli bench --user-api --no-progress --user-workloads decode,sampled --batches 1,64"
G="python3 -m graphc.cli bench --user-api --no-progress --user-workloads grounded --batches 1 --long-new 96 --short-new 8 --user-repeats 3"
case "$1" in
gather)
  bash "$D/run19-h200.sh" gather "$2" ;;
cause)
  (cd "$D" && timeout 200 python3 proto_gather_cause.py 30 16 2>&1 | tee $OUT/gather-cause-$2.log) ;;
topranks)
  timeout 200 python3 "$D/proto_top_ranks.py" 2>&1 | tee $OUT/top-ranks-$2.log ;;
sampledk)
  timeout 200 ncu --profile-from-start off --metrics gpu__time_duration.sum,launch__grid_size \
      --csv --page raw --log-file $OUT/k8b64-sampled-$2.csv \
      python3 "$D/proto_kernel_profile.py" llama-3.1-8b 64 '{"compile": true}' 16 4 \
      '{"temperature": 0.8, "top_p": 0.9, "top_k": 50}' 2>&1 | grep "profiled"
  python3 "$D/proto_kernel_profile.py" --sum $OUT/k8b64-sampled-$2.csv 4 | head -30 | tee $OUT/k8b64-sampled-$2.txt ;;
table8b)
  timeout 420 $U --model llama-3.1-8b --json $OUT/ua-8b-$2.json 2>&1 | grep "^|\|rror" | tail -12 | tee $OUT/table-8b-$2.log ;;
table1b)
  timeout 300 $U --model llama-3.2-1b --json $OUT/ua-1b-$2.json 2>&1 | grep "^|\|rror" | tail -12 | tee $OUT/table-1b-$2.log ;;
spec)
  python3 -c "from graphc.compiler.gguf import resolve_model_path as r; print(r('$2'))" 2>&1 | tail -1
  timeout 200 $G --model "$2" --no-compile --json $OUT/grounded-eager-$3.json 2>&1 | grep "^| B\|^note\|rror" | tee $OUT/spec-$3.log
  timeout 200 $G --model "$2" --json $OUT/grounded-auto-$3.json 2>&1 | grep "^| B\|^note\|rror" | tee -a $OUT/spec-$3.log ;;
paired)
  S='{"temperature": 0.8, "top_p": 0.9, "top_k": 50}'
  for m in llama-3.2-1b llama-3.1-8b; do
    timeout 240 python3 -m graphc.benchmarks.step_profile --model $m --batch 64 --repeats 9 --paired "$S" \
        --engine-kw '{"compile": "auto"}' --json $OUT/paired-$m-$2.json 2>&1 | grep "^B=\|Error" | tee -a $OUT/paired-$2.log
  done ;;
host)
  bash "$D/run19-h200.sh" host "$2" ;;
nsys)
  command -v nsys || { echo "no nsys on this machine"; ls /usr/local/cuda*/bin /opt/nvidia 2>&1 | head; exit 0; }
  timeout 300 nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop --cuda-graph-trace=node \
      -t cuda -o /tmp/k8b64 -f true python3 "$D/proto_kernel_profile.py" llama-3.1-8b 64 '{"compile": true}' 16 8 \
      2>&1 | grep "profiled\|rror"
  nsys stats -q --report cuda_gpu_kern_sum --format csv -o $OUT/nsys-k8b64-$2 /tmp/k8b64.nsys-rep
  nsys stats -q --report cuda_gpu_trace --format csv -o $OUT/nsys-trace-k8b64-$2 /tmp/k8b64.nsys-rep
  head -c 3000 $OUT/nsys-k8b64-$2*.csv ;;
kvwrite)
  (cd "$D" && for a in "64 256" "64 1024" "16 256" "1 256"; do timeout 60 python3 proto_kv_write_fused.py $a; done) \
      2>&1 | tee $OUT/kv-write-fused-$2.log ;;
ptx)
  du -sh /tmp/mlx/*/ptx && tar czf $OUT/ptx.tgz -C /tmp/mlx . && ls -la $OUT/ptx.tgz ;;
esac
