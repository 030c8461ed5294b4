#!/usr/bin/env bash
# cuda/bench/final_check_on_device.sh — the record run for issue 7 on the GPU machine: every GPU
# test, the sanitizers on the fast kernels, issue 7's full sweep (bf16, both passes) and fp16 at
# N = 8192, the wgmma forward's sweep, each beside PyTorch SDPA in the same session; everything packed into $OUT/final.tgz
# (the device tool returns few files).
#   build here: cmake --build --preset cuda --target test_cuda flashlab -j2
#               mkdir -p gpu-carry && cp build/cuda/tests/cuda/test_cuda build/cuda/app/flashlab gpu-carry/
#   device:     bash cuda/bench/final_check_on_device.sh      (carry gpu-carry)
set -u
OUT=${OUT:-./gpu-logs}
BIN=${BIN:-gpu-carry}
LOG="$OUT/final"
mkdir -p "$LOG"
status=0
{ date -u; nvidia-smi; nvidia-smi -q -d CLOCK | head -40; } >"$LOG/env.log" 2>&1
# Fast kernels: tests, sanitizers, bf16 sweep (N = 1k…16k, d = 64/128, causal and not, fwd and bwd) + SDPA.
OUT="$LOG" BIN="$BIN" bash cuda/bench/run_fast_on_device.sh all || status=1
# Every other GPU test (the clear kernels, CUPTI traffic).
echo "=== test_cuda (all tags)" >>"$LOG/test_cuda_all.log"
timeout 300 "$BIN/test_cuda" --durations yes >>"$LOG/test_cuda_all.log" 2>&1 || status=1
tail -3 "$LOG/test_cuda_all.log"
# The wgmma forward (sm_90a variant), issue 7's sweep, beside SDPA.
timeout 120 "$BIN/flashlab" bench attention --pass fwd --fwd-kernel wgmma --csv >"$LOG/wgmma_ours.csv" \
  2>"$LOG/wgmma_ours.err" || status=1
timeout 200 env PYTHONUNBUFFERED=1 python3 cuda/bench/sdpa_bench.py "$LOG/wgmma_ours.csv" --out "$LOG/wgmma_ratios.csv" \
  >"$LOG/wgmma_sdpa.log" 2>&1 || status=1
# fp16 at N = 8192 beside SDPA.
timeout 120 "$BIN/flashlab" bench attention --dtype fp16 --seq 8192 --csv >"$LOG/fp16_ours.csv" 2>"$LOG/fp16_ours.err" || status=1
timeout 200 env PYTHONUNBUFFERED=1 python3 cuda/bench/sdpa_bench.py "$LOG/fp16_ours.csv" --out "$LOG/fp16_ratios.csv" \
  >"$LOG/fp16_sdpa.log" 2>&1 || status=1
tar czf "$OUT/final.tgz" -C "$OUT" final
echo "final status: $status"
exit $status
