#!/usr/bin/env bash
# The C ABI and `flashlab attention --device cuda` on a GPU machine, in one go:
#   1. the C example with --cuda: every family on device memory on a non-default stream, then
#      captured in a CUDA graph and replayed (graph results bit for bit the stream's);
#   2. compute-sanitizer memcheck and racecheck on the same run;
#   3. `flashlab attention fwd|bwd --device cuda --kernel fast --inputs DIR` on awkward inputs
#      (N not a multiple of the tiles, N = 1, causal, ±800 values, fp16) made with NumPy, and on
#      the example's own inputs, whose outputs are compared with the example's.
# Usage: examples/check_on_gpu.sh BIN_DIR LOG_DIR, where BIN_DIR holds flashlab, flashlab_example,
# test_capi_errors and libflashlab.so from a CUDA build. Needs python3 with NumPy. Each step has
# its own time limit; the logs say what passed.
set -u
bin=$(cd "$1" && pwd)
logs=$(mkdir -p "$2" && cd "$2" && pwd)
work=$(mktemp -d)
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step() {  # step LOG SECONDS COMMAND...: runs the command with a time limit, appends output and exit code
  local log=$1 limit=$2
  shift 2
  echo "\$ $*" >>"$log"
  local start=$SECONDS
  timeout "$limit" "$@" >>"$log" 2>&1
  echo "exit $? after $((SECONDS - start)) s" >>"$log"
  echo >>"$log"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$logs/example.log" 2>&1
step "$logs/example.log" 20 "$bin/test_capi_errors"
mkdir -p "$work/example"
step "$logs/example.log" 40 "$bin/flashlab_example" --cuda --save "$work/example"
step "$logs/memcheck.log" 80 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/flashlab_example" --cuda
step "$logs/racecheck.log" 100 compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/flashlab_example" --cuda

cli="$logs/cli.log"
python3 - "$work" >>"$cli" 2>&1 <<'EOF'
# Awkward attention inputs, [B, N, H, D] float32: seeded normal values, and ±800 ones.
import sys, numpy as np
root = sys.argv[1]
rng = np.random.default_rng(20261127)
def case(name, b, n, h, d, big=False):
    import os
    os.makedirs(f"{root}/{name}", exist_ok=True)
    q, k, v, do = (rng.standard_normal((b, n, h, d)).astype(np.float32) for _ in range(4))
    if big:  # every Q entry ±800, the second half of the keys ±800: exact ties, one-hot rows
        q = (800 * rng.choice([-1.0, 1.0], size=q.shape)).astype(np.float32)
        k[:, n // 2:] = 800 * rng.choice([-1.0, 1.0], size=k[:, n // 2:].shape)
    for t, x in (("q", q), ("k", k), ("v", v), ("do", do)):
        np.save(f"{root}/{name}/{t}.npy", x)
case("n100_d64", 2, 100, 2, 64)
case("n1_d128", 1, 1, 2, 128)
case("n257_d128", 1, 257, 3, 128)
case("n300_d64_pm800", 1, 300, 2, 64, big=True)
case("n77_d64", 1, 77, 2, 64)
EOF

run() { step "$cli" 30 "$bin/flashlab" attention "$@"; }
for mode in fwd bwd; do
  run $mode --device cuda --kernel fast --inputs "$work/n100_d64" --save "$work/out_n100_$mode"
  run $mode --device cuda --kernel fast --inputs "$work/n100_d64" --causal
  run $mode --device cuda --kernel fast --inputs "$work/n1_d128" --causal
  run $mode --device cuda --kernel fast --inputs "$work/n257_d128" --causal
  run $mode --device cuda --kernel fast --inputs "$work/n257_d128"
  run $mode --device cuda --kernel fast --inputs "$work/n1_d128"
  run $mode --device cuda --kernel fast --inputs "$work/n300_d64_pm800"
  run $mode --device cuda --kernel fast --inputs "$work/n300_d64_pm800" --causal
  run $mode --device cuda --kernel fast --dtype fp16 --inputs "$work/n77_d64" --causal
  run $mode --device cuda --kernel fast --dtype fp16 --inputs "$work/n300_d64_pm800" --causal
  run $mode --device cuda --kernel clear --inputs "$work/n100_d64" --causal
  run $mode --device cuda --kernel fast --inputs "$work/example" --causal --save "$work/cli_$mode"
done
run fwd --device cuda --kernel fast --seq 10 --seq-k 12 --dim 64  # N_k != N, bottom-right causal aligned
run fwd --device cuda --kernel fast --seq 33 --seq-k 70 --heads 8 --heads-kv 2 --dim 128 --causal  # grouped K/V

python3 - "$work" >"$logs/compare.log" 2>&1 <<'EOF'
# The C example's CUDA attention outputs against the CLI's on the same inputs (the same kernels:
# the fastest forward; the example's backward is the deterministic one, the CLI's the fastest).
import sys, numpy as np
w = sys.argv[1]
for name, run in (("o", "fwd"), ("lse", "fwd"), ("dq", "bwd"), ("dk", "bwd"), ("dv", "bwd")):
    a = np.load(f"{w}/example/{name}.npy"); b = np.load(f"{w}/cli_{run}/{name}.npy")
    same = a.shape == b.shape and np.array_equal(a, b)
    diff = float(np.max(np.abs(a.astype(np.float64) - b))) if a.shape == b.shape else float("nan")
    rel = diff / max(float(np.max(np.abs(b))), 1e-30)
    print(f"{name:4s} example vs CLI {run}: shapes {a.shape} {b.shape}, bitwise equal {same}, max |diff| {diff:.3e} ({rel:.2e} of max)")
EOF
rm -rf "$work"
