#!/bin/bash
# The clear MTA kernels on the GPU machine: GPU tests, compute-sanitizer on the small shapes, the
# traffic CSVs of this folder, and `flashlab mta --device cuda` on .npy inputs.
#   BIN=<folder with test_cuda and flashlab> OUT=<log folder> bash cuda/results/mta/run_on_device.sh
# Optional: INPUTS=<folder with q.npy k.npy v.npy do.npy w.npy> for the --inputs check.
BIN=${BIN:-gpu-carry}
OUT=${OUT:-mta-logs}
L=$OUT/logs
mkdir -p "$L"
export PATH=$PATH:/usr/local/cuda/bin
{ date -u; nvidia-smi -L; command -v compute-sanitizer; } >"$L/env.log" 2>&1
status=0
step() {
  local name=$1 log=$2
  shift 2
  echo "=== $name ($(date -u +%T))" >>"$log"
  local t0=$(date +%s)
  "$@" >>"$log" 2>&1
  local rc=$?
  echo "=== rc=$rc $name $(($(date +%s) - t0))s" >>"$log"
  echo "$name rc=$rc"
  [ $rc -eq 0 ] || status=1
}

step "test_cuda [mta]" "$L/tests.log" "$BIN/test_cuda" '[mta]' --durations yes
for tool in memcheck racecheck synccheck; do
  step "compute-sanitizer $tool" "$L/sanitize.log" timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 \
    "$BIN/test_cuda" '[mta][sanitize]'
done

# A CSV step writes only the CSV to its file (the step's markers go to traffic.log).
csv() {
  local file=$1
  shift
  step "$(basename "$file")" "$L/traffic.log" bash -c '"$@" > "$0"' "$file" "$@"
}
F="$BIN/flashlab traffic mta --device cuda --heads 16 --dim 64 --block 64"
step "traffic 3x3 table" "$L/traffic.log" $F --seq 2048 --splits 8 --cq 3 --ck 3
csv "$L/traffic_3x3.csv" $F --seq 2048 --splits 8 --cq 3 --ck 3 --csv
csv "$L/traffic_6x11.csv" $F --seq 2048 --splits 8 --cq 6 --ck 11 --csv
csv "$L/traffic_infer_32k.csv" $F --pass infer --seq 32768 --splits 64 --cq 3 --ck 3 --csv

C="$BIN/flashlab mta"
step "mta fwd --device cuda" "$L/cli.log" $C fwd --device cuda --seq 300 --heads 2 --dim 64 --cq 3 --ck 3 --block 64
step "mta bwd --device cuda" "$L/cli.log" $C bwd --device cuda --seq 300 --heads 2 --dim 128 --cq 6 --ck 11 --block 48
step "mta infer --device cuda" "$L/cli.log" $C infer --device cuda --seq 1000 --heads 2 --dim 128 --cq 3 --ck 5 \
  --block 32 --splits 6
if [ -n "$INPUTS" ]; then
  step "mta bwd --device cuda --inputs" "$L/cli.log" $C bwd --device cuda --inputs "$INPUTS" --block 32 --save "$L/gpu_out"
  step "mta bwd --device cpu --inputs" "$L/cli.log" $C bwd --device cpu --inputs "$INPUTS" --block 32
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs
exit $status
