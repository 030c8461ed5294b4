#!/bin/bash
# The GPU check of the clear STREAM kernels and the source of cuda/results/stream/traffic.csv.
# Build here (cmake --preset cuda && cmake --build --preset cuda --target test_cuda flashlab), copy
# build/cuda/tests/cuda/test_cuda and build/cuda/app/flashlab into DIR on the GPU machine, then:
#   OUT=results_dir bash cuda/bench/stream_on_device.sh DIR
# Writes tests.txt, memcheck.txt, racecheck.txt, cli.txt and traffic.csv under $OUT.
set -u
B=${1:?directory holding test_cuda and flashlab}
F=$B/flashlab
: "${OUT:?set OUT to a results directory}"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/env.txt"; date -u >> "$OUT/env.txt"
timeout 200 "$B/test_cuda" "[stream]" -d yes > "$OUT/tests.txt" 2>&1; echo "rc=$?" >> "$OUT/tests.txt"
timeout 150 compute-sanitizer --tool memcheck "$B/test_cuda" "[stream]~[large]" > "$OUT/memcheck.txt" 2>&1
echo "rc=$?" >> "$OUT/memcheck.txt"
timeout 150 compute-sanitizer --tool racecheck "$B/test_cuda" "cuda stream: sparse apply*","cuda stream: NaN*","*heads are independent*" \
  > "$OUT/racecheck.txt" 2>&1
echo "rc=$?" >> "$OUT/racecheck.txt"
{
  for a in "--seq 32768 --dim 128 --k 16" "--seq 131072 --dim 64 --k 8" "--seq 131072 --dim 128 --k 8" \
           "--seq 131072 --dim 128 --k 8 --heads 2" "--seq 1048576 --dim 128 --k 8 --threads 16"; do
    echo "\$ flashlab traffic stream --device cuda $a --csv traffic.csv"
    timeout 120 $F traffic stream --device cuda $a --csv "$OUT/traffic.csv"; echo "rc=$?"
  done
  for lead in "" "--no-lead-in"; do
    echo "\$ flashlab stream needles --device cuda --seq 1048576 --dim 128 --bq 64 --bk 64 --k 16 --needle-blocks 8 --needles 8 $lead"
    timeout 120 $F stream needles --device cuda --seq 1048576 --dim 128 --bq 64 --bk 64 --k 16 --needle-blocks 8 --needles 8 $lead
    echo "rc=$?"
  done
  echo "\$ flashlab stream estimate --device cuda --seq 20000 --dim 32 --heads 3 --bq 64 --bk 32 --k 8 --compare"
  timeout 60 $F stream estimate --device cuda --seq 20000 --dim 32 --heads 3 --bq 64 --bk 32 --k 8 --compare; echo "rc=$?"
} > "$OUT/cli.txt" 2>&1
