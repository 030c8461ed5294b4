#!/usr/bin/env bash
# measure.sh — on the GPU machine: `flashlab bench attention` and python/bench/bench_attention.py on
# the same shapes in the same session (the Python/CLI ratio and the ratios to SDPA's flash and cuDNN
# backends, the backward with its host time shown and hidden for flashlab and SDPA alike), the
# per-call overhead against the C call and its floor (call_cost.py), then the Python package's GPU tests.
#
# Usage, from the repository root of a CUDA build (`make cuda`):
#   python/bench/measure.sh [OUT_DIR]            (default build/python-bench; keep only the CSV)
# Paths can be set: FLASHLAB_BIN (build/cuda/app/flashlab), FLASHLAB_LIBRARY
# (build/cuda/capi/libflashlab.so), C_CALL_LOOP (build/cuda/python/c_call_loop), PYTHON (python3),
# BENCH_CPU (2: the core the timed programs are pinned to, so that the C loop and the Python calls
# run on one core and a host time compares with the other), PYTEST_K (a -k expression for the tests),
# BENCH_ARGS (more arguments for bench_attention.py, e.g. --no-throughput), COMMIT (printed in the
# header, for the record; where the tree is a git checkout, its HEAD).
# Writes OUT_DIR/{cli.csv, c_loop.txt, call_cost.txt, call_cost.csv, bench.txt, python_bench.csv,
# python_bench_calls.csv, python_bench_backward.csv, c_loop_after.txt, pytest.txt}.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-build/python-bench}"
mkdir -p "$OUT"
BIN="${FLASHLAB_BIN:-build/cuda/app/flashlab}"
export FLASHLAB_LIBRARY="${FLASHLAB_LIBRARY:-build/cuda/capi/libflashlab.so}"
LOOP="${C_CALL_LOOP:-build/cuda/python/c_call_loop}"
PY="${PYTHON:-python3}"
B=1 H=16 N=8192 D=128
SHAPE=(--seq $N --dim $D --heads $H --batch $B)
export PYTHONPATH=python LD_LIBRARY_PATH="$(dirname "$FLASHLAB_LIBRARY")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PIN=()
command -v taskset > /dev/null && PIN=(taskset -c "${BENCH_CPU:-2}")
status=0

COMMIT="${COMMIT:-$(git rev-parse --short HEAD 2> /dev/null || echo unknown)}"
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $COMMIT"
echo "== flashlab bench attention ${SHAPE[*]} --csv"
timeout 120 "${PIN[@]}" "$BIN" bench attention "${SHAPE[@]}" --pass both --csv > "$OUT/cli.csv" || status=1
cat "$OUT/cli.csv"

echo "== C call loop"
timeout 60 "${PIN[@]}" "$LOOP" > "$OUT/c_loop.txt" || status=1
cat "$OUT/c_loop.txt"

echo "== call_cost.py"
timeout 120 "${PIN[@]}" "$PY" python/bench/call_cost.py --c-loop "$OUT/c_loop.txt" --csv "$OUT/call_cost.csv" 2>&1 |
  tee "$OUT/call_cost.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== bench_attention.py"
timeout 240 "${PIN[@]}" "$PY" python/bench/bench_attention.py "${SHAPE[@]}" --cli "$OUT/cli.csv" --c-loop "$OUT/c_loop.txt" \
  --csv "$OUT/python_bench.csv" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== C call loop again (how far the host's speed moved meanwhile)"
timeout 60 "${PIN[@]}" "$LOOP" > "$OUT/c_loop_after.txt" || status=1
cat "$OUT/c_loop_after.txt"

# Last, so that the timings above run on a GPU in the same state as the CLI's.
echo "== GPU tests (FLASHLAB_REQUIRE_CUDA=1)"
FLASHLAB_REQUIRE_CUDA=1 timeout 300 "$PY" -m pytest -q -rsP -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} python/tests 2>&1 | tee "$OUT/pytest.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
