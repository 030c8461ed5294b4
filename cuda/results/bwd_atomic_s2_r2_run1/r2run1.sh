#!/bin/bash
# bwd atomic session 2, round 2, run 1: bulk async dQ reduction (VARIANT 2049, the default in these
# binaries): correctness, variant timing vs 513, default bench + SDPA, then sanitizers.
C=gpu-carry-bwd3
date -u > $OUT/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
$C/test_cuda "[fast-bwd]" > $OUT/fastbwd.log 2>&1; echo "rc=$?" >> $OUT/fastbwd.log
grep -h "passed\|failed\|rc=" $OUT/fastbwd.log | tail -3
E="$C/flashlab_exp bench attention --pass bwd --seq 8192 --reps 20 --csv"
for v in 64,513 64,2049 64,2177 64,2053 64,2081; do FLASHLAB_BWD_ATOMIC_VARIANT=$v $E --dim 128 --both 2>>$OUT/variants.err | grep -v dtype | sed "s/\$/,v=$v/" >> $OUT/variants.txt; done
for v in 128,513 128,2049 128,2053; do FLASHLAB_BWD_ATOMIC_VARIANT=$v $E --dim 64 --both 2>>$OUT/variants.err | grep -v dtype | sed "s/\$/,v=$v/" >> $OUT/variants.txt; done
cat $OUT/variants.txt
$C/flashlab bench attention --pass bwd --seq 8192 --dim 128,64 --both --reps 30 --csv > $OUT/ours.csv 2> $OUT/ours.err
cat $OUT/ours.csv
python3 cuda/bench/sdpa_bench.py $OUT/ours.csv --reps 30 --out $OUT/ratios.csv > $OUT/sdpa.log 2>&1
cat $OUT/sdpa.log | tail -30
for tool in memcheck racecheck synccheck; do
  compute-sanitizer --tool $tool --error-exitcode 9 $C/test_cuda "[fast-bwd-sanitize]" > $OUT/$tool.log 2>&1; echo "rc=$?" >> $OUT/$tool.log
done
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" $OUT/memcheck.log $OUT/racecheck.log $OUT/synccheck.log
grep -h -m3 "Error\|error\|Hazard" $OUT/memcheck.log $OUT/racecheck.log $OUT/synccheck.log | head -6
date -u >> $OUT/date.txt
