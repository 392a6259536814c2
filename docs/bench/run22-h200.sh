#!/usr/bin/env bash
# Run 22 (nvidia-h200): one mode per device call. Needs mlx (CUDA) + graphc on PYTHONPATH and $OUT.
#   choose TAG : docs/bench/proto_choose_kernel.py: both sampling kernels' checks on the device, then
#                the fused selection at batch 64 and 1 with the Gumbel-choose kernel off and on
#                (host build + submit ms, wall ms, same tokens) (~1 min)
#   pairedc TAG [models], table8b TAG, table1b TAG, split1b TAG, ... : as in run21-h200.sh
#                (22a ran pairedc, table8b, table1b and split1b before the choose kernel existed)
set -u
D="$(dirname "$0")"
case "$1" in
choose)
  for b in 64 1; do
    timeout 150 python3 "$D/proto_choose_kernel.py" $b 200 2>&1 | tee -a $OUT/choose-$2.log
  done ;;
*)
  bash "$D/run21-h200.sh" "$@" ;;
esac
