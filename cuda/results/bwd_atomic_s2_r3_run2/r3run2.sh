#!/bin/bash
# bwd atomic round 3, run 2. A = the clean file (run 1's binaries, SASS-identical to VARIANT 12293),
# B = A + the P/dS element loop without per-element branches (one uniform need_mask branch per step).
# Tests + sanitizers for both; bench A, B, A, B; SDPA beside B; ncu --set full of one d = 128
# non-causal launch of each. Everything in ONE tar.
C=gpu-carry-bwd3
R=$OUT/r3run2; mkdir -p $R
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; md5sum $C/flashlab $C/test_cuda $C/flashlab_b $C/test_cuda_b; } > $R/info.txt 2>&1
for v in b a; do
  T=$C/test_cuda; [ $v = b ] && T=$C/test_cuda_b
  $T "[fast-bwd]" > $R/fastbwd_$v.log 2>&1; echo "rc=$?" >> $R/fastbwd_$v.log
  echo "[$v]"; grep -h "worst\|passed\|failed\|rc=" $R/fastbwd_$v.log | tail -4
  for tool in memcheck racecheck synccheck; do
    echo "=== compute-sanitizer --tool $tool --error-exitcode 9 $T [fast-bwd-sanitize]" >> $R/sanitize_$v.log
    compute-sanitizer --tool $tool --error-exitcode 9 $T "[fast-bwd-sanitize]" >> $R/sanitize_$v.log 2>&1; echo "rc=$? ($tool)" >> $R/sanitize_$v.log
  done
  grep -h "SUMMARY\|rc=" $R/sanitize_$v.log
done
for k in 1 2; do for v in a b; do
  F=$C/flashlab; [ $v = b ] && F=$C/flashlab_b
  $F bench attention --pass bwd --seq 8192 --dim 128,64 --both --reps 30 --csv > $R/ours_${v}${k}.csv 2>> $R/info.txt
  echo "== $v$k"; grep -v dtype $R/ours_${v}${k}.csv
done; done
python3 cuda/bench/sdpa_bench.py $R/ours_b1.csv --reps 30 --out $R/ratios_b1.csv > $R/sdpa.log 2>&1
tail -6 $R/sdpa.log
NCU=$(which ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for v in b a; do
  F=$C/flashlab; [ $v = b ] && F=$C/flashlab_b
  timeout 60 $NCU --set full --import-source no -k regex:fast_bwd_atomic_kernel -c 1 -o $R/ncu_$v \
    $F bench attention --pass bwd --seq 8192 --dim 128 --no-causal --reps 20 --warmup 0 > $R/ncu_run_$v.log 2>&1
  echo "ncu rc=$?" >> $R/ncu_run_$v.log; tail -1 $R/ncu_run_$v.log
  $NCU -i $R/ncu_$v.ncu-rep --page details --csv > $R/ncu_details_$v.csv 2>&1
  $NCU -i $R/ncu_$v.ncu-rep --page source --csv --print-source sass > $R/ncu_source_$v.csv 2>&1
done
wc -l $R/ncu_*.csv
date -u >> $R/info.txt
tar czf $OUT/r3run2.tar.gz -C $OUT r3run2
ls -la $OUT
