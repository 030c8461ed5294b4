#!/bin/bash
# Step 7 run 2: kind-2 schedule (vote first, sliced exp2 + P·V in one block) vs cur; 5 bench rounds
# in alternating order, SDPA twice, [fast], memcheck + racecheck, SASS opcode counts. One tar.
W=/tmp/w4; C=/tmp/bin4; mkdir -p $W $C
for f in gpu-carry-fwd3/*.gz; do gunzip -c $f > $C/$(basename $f .gz); chmod +x $C/$(basename $f .gz); done
pack() { tar czf $OUT/r4.tgz -C $W . ; }
L=$W/log.txt
date -u > $L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> $L
bench() { timeout 40 $C/flashlab_$1 bench attention --pass fwd --seq 8192,16384 --dim 64,128 --both --reps 30 --csv > $W/ours_$1_r$2.csv 2> $W/ours_$1_r$2.err; echo "bench $1 r$2 rc=$? $(date -u +%T)" >> $L; }
for x in cur s2 s2all; do bench $x 1; done; pack
timeout 60 python3 cuda/bench/sdpa_bench.py $W/ours_cur_r1.csv --reps 30 --out $W/ratios_cur.csv > $W/sdpa1.log 2>&1; echo "sdpa1 rc=$? $(date -u +%T)" >> $L; pack
for x in s2all s2 cur; do bench $x 2; done; pack
for x in s2 s2all cur; do timeout 30 $C/test_cuda_$x "[fast]" > $W/test_$x.log 2>&1; echo "test $x rc=$? $(date -u +%T)" >> $L; done; pack
for x in s2 s2all cur; do
  for tool in memcheck racecheck; do
    timeout 30 compute-sanitizer --tool $tool --error-exitcode 9 $C/test_cuda_$x "[fast-sanitize]" > $W/san_${tool}_$x.log 2>&1; echo "$tool $x rc=$? $(date -u +%T)" >> $L
  done; pack
done
for x in cur s2 s2all; do bench $x 3; done
for x in s2all s2 cur; do bench $x 4; done; pack
timeout 60 python3 cuda/bench/sdpa_bench.py $W/ours_s2_r1.csv --reps 30 --out $W/ratios_s2.csv > $W/sdpa2.log 2>&1; echo "sdpa2 rc=$? $(date -u +%T)" >> $L; pack
OBJ=/usr/local/cuda/bin/cuobjdump; [ -x $OBJ ] || OBJ=cuobjdump
for x in cur s2 s2all; do
  $OBJ -sass $C/flashlab_$x 2>/dev/null | python3 -c "
import sys,re,collections
cur=None;c={}
for l in sys.stdin:
    m=re.search(r'Function : (\S+)',l)
    if m: cur=m.group(1); continue
    k=re.search(r'FastTraitsILi(\d+)ELb(\d)EEELb1',cur or '')
    if k:
        m=re.match(r'\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)',l)
        if m: c.setdefault(k.groups(),collections.Counter())[m.group(2)]+=1
for k,v in sorted(c.items()): print('$x', k, sum(v.values()), ' '.join(f'{a}:{b}' for a,b in v.most_common(22)))" >> $W/sass_ops.txt
done
for x in cur s2 s2all; do [ $SECONDS -gt 180 ] && break; bench $x 5; done
date -u >> $L; pack
