#!/bin/bash
# run 2 (final): lazy-rescale kinds 2/3/4 vs current defaults; tests, sanitizers, SDPA, two bench rounds.
W=/tmp/w2; C=/tmp/bin2; mkdir -p $W $C
for f in gpu-carry-fwd3/*.gz; do gunzip -c $f > $C/$(basename $f .gz); chmod +x $C/$(basename $f .gz); done
pack() { tar czf $OUT/r2.tgz -C $W . ; }
L=$W/log.txt
date -u > $L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> $L
bench() { timeout 40 $C/flashlab_$1 bench attention --pass fwd --seq 8192,16384 --dim 64,128 --both --reps 30 --csv > $W/ours_$1_r$2.csv 2> $W/ours_$1_r$2.err; echo "bench $1 r$2 rc=$? $(date -u +%T)" >> $L; }
for x in cur L2 L3 L4 L2all; do bench $x 1; done; pack
timeout 80 python3 cuda/bench/sdpa_bench.py $W/ours_cur_r1.csv --reps 30 --out $W/ratios.csv > $W/sdpa.log 2>&1; echo "sdpa rc=$? $(date -u +%T)" >> $L; pack
for x in L2all L3 L4; do
  timeout 40 $C/test_cuda_$x "[fast]" --durations yes > $W/test_$x.log 2>&1; echo "test $x rc=$? $(date -u +%T)" >> $L
done; pack
for x in L2all L4 L3; do
  for tool in memcheck racecheck; do
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $C/test_cuda_$x "[fast-sanitize]" > $W/san_${tool}_$x.log 2>&1; echo "$tool $x rc=$? $(date -u +%T)" >> $L
  done; pack
done
for x in L2all L4 L3 L2 cur; do bench $x 2; done; pack
bench P88 1
OBJ=/usr/local/cuda/bin/cuobjdump
for x in cur L2 L4; do $OBJ -sass $C/flashlab_$x 2>/dev/null | gzip > $W/sass_$x.txt.gz; done
date -u >> $L; pack
