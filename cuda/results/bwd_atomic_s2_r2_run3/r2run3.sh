#!/bin/bash
# bwd atomic session 2, round 2, run 3 (FINAL binaries, default VARIANT 12293 at d = 64 and 128):
# tests, sanitizers, default bench + SDPA side by side, then the variant comparison (flashlab_exp).
C=gpu-carry-bwd3
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; md5sum $C/flashlab $C/test_cuda $C/flashlab_exp; } > $OUT/info.txt 2>&1
$C/test_cuda "[fast-bwd]" > $OUT/fastbwd.log 2>&1; echo "rc=$?" >> $OUT/fastbwd.log
grep -h "worst\|passed\|failed\|rc=" $OUT/fastbwd.log | tail -4
for tool in memcheck racecheck synccheck; do
  echo "=== compute-sanitizer --tool $tool --error-exitcode 9 $C/test_cuda [fast-bwd-sanitize]" >> $OUT/sanitize.log
  compute-sanitizer --tool $tool --error-exitcode 9 $C/test_cuda "[fast-bwd-sanitize]" >> $OUT/sanitize.log 2>&1; echo "rc=$? ($tool)" >> $OUT/sanitize.log
done
grep -h "===\|SUMMARY\|rc=\|Hazard\|rror" $OUT/sanitize.log | head -20
$C/flashlab bench attention --pass bwd --seq 8192 --dim 128,64 --both --reps 30 --csv > $OUT/ours.csv 2>> $OUT/info.txt
cat $OUT/ours.csv
python3 cuda/bench/sdpa_bench.py $OUT/ours.csv --reps 30 --out $OUT/ratios.csv > $OUT/sdpa.log 2>&1
tail -8 $OUT/sdpa.log
E="$C/flashlab_exp bench attention --pass bwd --seq 8192 --reps 20 --csv"
for v in 64,513 64,12293 64,4101 64,12325 64,12421; do FLASHLAB_BWD_ATOMIC_VARIANT=$v $E --dim 128 --both 2>>$OUT/info.txt | grep -v dtype | sed "s/\$/,v=$v/" >> $OUT/variants.txt; done
for v in 128,513 128,12293 128,12325; do FLASHLAB_BWD_ATOMIC_VARIANT=$v $E --dim 64 --both 2>>$OUT/info.txt | grep -v dtype | sed "s/\$/,v=$v/" >> $OUT/variants.txt; done
cat $OUT/variants.txt
date -u >> $OUT/info.txt
