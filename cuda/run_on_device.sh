#!/usr/bin/env bash
# cuda/run_on_device.sh — everything issue 6 needs from the GPU machine, in one run.
#
# Build here (CPU machine, nvcc present), copy the two binaries into gpu-carry/, run this there:
#   cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
#   cmake --build build-cuda --target test_cuda flashlab -j2
#   mkdir -p gpu-carry && cp build-cuda/tests/cuda/test_cuda build-cuda/app/flashlab gpu-carry/
#   (device) OUT=/some/dir bash cuda/run_on_device.sh [all|tests|sanitize|traffic]
# TAGS='[cupti] [errors]' narrows the test step to some Catch2 tags.
# Logs go to $OUT (default ./gpu-logs): env.log, tests.log, sanitize.log, traffic.log, traffic.csv.
# The binaries are run directly (no ctest: a copied build tree has absolute paths).
set -u
OUT=${OUT:-./gpu-logs}
BIN=${BIN:-gpu-carry}
WHAT=${1:-all}
mkdir -p "$OUT"
status=0
step() {  # step NAME LOG CMD...: run, append to LOG, remember failures
  local name=$1 log=$2; shift 2
  echo "=== $name: $*" | tee -a "$log"
  local t0=$(date +%s)
  "$@" >>"$log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$log"
  [ $rc -eq 0 ] || status=1
}

{ date -u; nvidia-smi; command -v compute-sanitizer; } >"$OUT/env.log" 2>&1
export PATH=$PATH:/usr/local/cuda/bin

if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
  for tag in ${TAGS:-'[errors]' '[sanitize]' '[d128]' '[n1000]' '[n4096]' '[cupti]'}; do
    step "test_cuda $tag" "$OUT/tests.log" "$BIN/test_cuda" "$tag" --durations yes
  done
fi

if [ "$WHAT" = all ] || [ "$WHAT" = sanitize ]; then
  for tool in memcheck racecheck synccheck; do
    step "compute-sanitizer $tool" "$OUT/sanitize.log" timeout 240 compute-sanitizer --tool "$tool" \
      --error-exitcode 9 "$BIN/test_cuda" '[sanitize]'
  done
fi

if [ "$WHAT" = all ] || [ "$WHAT" = traffic ]; then
  T="$OUT/traffic.log"
  F="$BIN/flashlab traffic attention --device cuda --heads 16 --dim 64 --block-m 64 --block-n 32"
  for v in fa2 bwd atomic; do
    step "traffic $v" "$T" $F --variant $v --seq 4096,8192
    step "traffic $v causal" "$T" $F --variant $v --seq 4096 --causal
  done
  step "traffic fa1" "$T" $F --variant fa1 --seq 4096
  step "traffic naive vs flash sweep" "$T" $F --seq 1024,2048,4096,8192,16384
  step "traffic sweep csv" "$OUT/traffic.csv" $F --seq 1024,2048,4096,8192,16384 --csv
  step "traffic bad dtype (must fail)" "$T" bash -c "! $F --variant fa2 --seq 128 --dtype bf16"
fi
exit $status
