#!/usr/bin/env bash
# measure.sh — on the GPU machine: the Python package's GPU tests, then `flashlab bench attention`
# and python/bench/bench_attention.py on the same shapes in the same session (the Python/CLI ratio
# and the ratios to SDPA's flash and cuDNN backends), and the per-call overhead against the C call.
#
# Usage, from the repository root of a CUDA build (`make cuda`):
#   python/bench/measure.sh [OUT_DIR]            (default build/python-bench; keep only the CSV)
# Paths can be set: FLASHLAB_BIN (build/cuda/app/flashlab), FLASHLAB_LIBRARY
# (build/cuda/capi/libflashlab.so), C_CALL_LOOP (build/cuda/python/c_call_loop), PYTHON (python3).
# Writes OUT_DIR/{pytest.txt, cli.csv, c_loop.txt, bench.txt, python_bench.csv}.
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
status=0

echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "== GPU tests (FLASHLAB_REQUIRE_CUDA=1)"
FLASHLAB_REQUIRE_CUDA=1 timeout 300 "$PY" -m pytest -q -rsP -p no:cacheprovider python/tests 2>&1 | tee "$OUT/pytest.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== flashlab bench attention ${SHAPE[*]} --csv"
timeout 120 "$BIN" bench attention "${SHAPE[@]}" --pass both --csv > "$OUT/cli.csv" || status=1
cat "$OUT/cli.csv"

echo "== C call loop"
timeout 60 "$LOOP" > "$OUT/c_loop.txt" || status=1
cat "$OUT/c_loop.txt"

echo "== bench_attention.py"
timeout 240 "$PY" python/bench/bench_attention.py "${SHAPE[@]}" --cli "$OUT/cli.csv" --c-loop "$OUT/c_loop.txt" \
  --csv "$OUT/python_bench.csv" 2>&1 | tee "$OUT/bench.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
