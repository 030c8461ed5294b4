#!/bin/bash
# bwd atomic session 2, round 3, run 1: the CLEAN atomic backward (no variant bits; SASS-identical
# to VARIANT 12293): tests, sanitizers, bench + SDPA; cuobjdump -sass before/after diff; ncu --set full
# of one d = 128 non-causal launch. Everything goes into ONE tar.
C=gpu-carry-bwd3
R=$OUT/r3run1; mkdir -p $R
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; md5sum $C/flashlab $C/test_cuda; } > $R/info.txt 2>&1
$C/test_cuda "[fast-bwd]" > $R/fastbwd.log 2>&1; echo "rc=$?" >> $R/fastbwd.log
grep -h "worst\|passed\|failed\|rc=" $R/fastbwd.log | tail -4
for tool in memcheck racecheck synccheck; do
  echo "=== compute-sanitizer --tool $tool --error-exitcode 9 $C/test_cuda [fast-bwd-sanitize]" >> $R/sanitize.log
  compute-sanitizer --tool $tool --error-exitcode 9 $C/test_cuda "[fast-bwd-sanitize]" >> $R/sanitize.log 2>&1; echo "rc=$? ($tool)" >> $R/sanitize.log
done
grep -h "===\|SUMMARY\|rc=\|Hazard\|rror" $R/sanitize.log | head -20
$C/flashlab bench attention --pass bwd --seq 8192 --dim 128,64 --both --reps 30 --csv > $R/ours.csv 2>> $R/info.txt
cat $R/ours.csv
python3 cuda/bench/sdpa_bench.py $R/ours.csv --reps 30 --out $R/ratios.csv > $R/sdpa.log 2>&1
tail -8 $R/sdpa.log
# SASS identity with the real cuobjdump (the CPU machine has none): normalise names/addresses.
CUOBJ=$(which cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
echo "cuobjdump: $CUOBJ" > $R/sass_diff.txt
for pair in "before.o after.o" "cmake_before.o cmake_after.o"; do set -- $pair
  $CUOBJ -sass $C/sass/$1 > $R/sass_$1.txt 2>&1; $CUOBJ -sass $C/sass/$2 > $R/sass_$2.txt 2>&1
  echo "== $1 vs $2" >> $R/sass_diff.txt
  python3 $C/sass/cmp_sass.py $R/sass_$1.txt $R/sass_$2.txt >> $R/sass_diff.txt 2>&1
done
grep -h "==\|ALL\|DIFF\|cuobjdump" $R/sass_diff.txt
# ncu: one launch of the d = 128 bf16 non-causal atomic kernel (the bench runs the forward first).
NCU=$(which ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
timeout 100 $NCU --set full --import-source no -k regex:fast_bwd_atomic_kernel -c 1 -o $R/ncu_bwd128 \
  $C/flashlab bench attention --pass bwd --seq 8192 --dim 128 --no-causal --reps 2 --warmup 0 > $R/ncu_run.log 2>&1
echo "ncu rc=$?" >> $R/ncu_run.log
$NCU -i $R/ncu_bwd128.ncu-rep --page details --csv > $R/ncu_details.csv 2>&1
$NCU -i $R/ncu_bwd128.ncu-rep --page source --csv --print-source sass > $R/ncu_source_sass.csv 2>&1 || \
  $NCU -i $R/ncu_bwd128.ncu-rep --page source --csv > $R/ncu_source_sass.csv 2>&1
$NCU -i $R/ncu_bwd128.ncu-rep --page raw --csv > $R/ncu_raw.csv 2>&1
tail -3 $R/ncu_run.log; wc -l $R/ncu_*.csv
date -u >> $R/info.txt
tar czf $OUT/r3run1.tar.gz -C $OUT r3run1
ls -la $OUT
