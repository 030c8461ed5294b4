#!/bin/bash
# Step 7 run: key sub-tiles (kKeySub = 2) and softmax/P·V schedule kinds vs the current default;
# bench rounds in alternating order, SDPA, [fast], memcheck + racecheck, SASS opcode counts. One tar.
W=/tmp/w3; C=/tmp/bin3; mkdir -p $W $C
for f in gpu-carry-fwd3/*.gz; do gunzip -c $f > $C/$(basename $f .gz); chmod +x $C/$(basename $f .gz); done
pack() { tar czf $OUT/r3.tgz -C $W . ; }
L=$W/log.txt; V="cur pk u0 u1 u2 u3 u2n"; R="u2n u3 u2 u1 u0 pk cur"
date -u > $L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> $L
bench() { timeout 40 $C/flashlab_$1 bench attention --pass fwd --seq 8192,16384 --dim 64,128 --both --reps 30 --csv > $W/ours_$1_r$2.csv 2> $W/ours_$1_r$2.err; echo "bench $1 r$2 rc=$? $(date -u +%T)" >> $L; }
for x in $V; do bench $x 1; done; pack
timeout 60 python3 cuda/bench/sdpa_bench.py $W/ours_cur_r1.csv --reps 30 --out $W/ratios.csv > $W/sdpa.log 2>&1; echo "sdpa rc=$? $(date -u +%T)" >> $L; pack
for x in $R; do bench $x 2; done; pack
for x in $V; do timeout 30 $C/test_cuda_$x "[fast]" > $W/test_$x.log 2>&1; echo "test $x rc=$? $(date -u +%T)" >> $L; done; pack
for x in u2 u3 u0 u1 pk u2n cur; do
  for tool in memcheck racecheck; do
    [ $SECONDS -gt 175 ] && break 2
    timeout 30 compute-sanitizer --tool $tool --error-exitcode 9 $C/test_cuda_$x "[fast-sanitize]" > $W/san_${tool}_$x.log 2>&1; echo "$tool $x rc=$? $(date -u +%T)" >> $L
  done; pack
done
for x in cur u0 u2 u3; do
  OBJ=/usr/local/cuda/bin/cuobjdump; [ -x $OBJ ] || OBJ=cuobjdump; $OBJ -sass $C/flashlab_$x 2>/dev/null | python3 -c "
import sys,re,collections
cur=None;c=collections.Counter()
for l in sys.stdin:
    m=re.search(r'Function : (\S+)',l)
    if m: cur=m.group(1); continue
    if cur and 'FastTraitsILi128ELb0EEELb1' in cur:
        m=re.match(r'\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)',l)
        if m: c[m.group(2)]+=1
print('$x', sum(c.values()), ' '.join(f'{k}:{v}' for k,v in c.most_common(25)))" >> $W/sass_ops.txt
done
for x in $V; do [ $SECONDS -gt 185 ] && break; bench $x 3; done
date -u >> $L; pack
