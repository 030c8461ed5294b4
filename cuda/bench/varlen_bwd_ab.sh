#!/usr/bin/env bash
# cuda/bench/varlen_bwd_ab.sh — the packed wgmma-ws backward of two builds beside the dense one, in
# one session: rounds of the same six processes (each build × dense B = 8, N = 8192, packed
# 8 × 8192, packed 16 mixed lengths), the builds alternating and the order rotated each round, so
# the clocks and the machine's state reach both alike.
#
#   varlen_bwd_ab.sh BEFORE_DIR AFTER_DIR [OUT_DIR] [ROUNDS]   on the GPU machine, from the repository root
#
# Each BIN dir holds `flashlab` (cuda preset) and `commit` (git describe of the tree that built it).
# OUT_DIR (default /tmp/flashlab-varlen-ab) gets the lengths files, one bench CSV per process and
# ab.csv: date, device, round, build (before/after), commit, layout (dense, packed-uniform,
# packed-mixed), d, causal, median_ms, min_ms, max_ms, tflops (every sequence's own visible pairs);
# and prints per build and shape the median over the rounds of the processes' TFLOP/s and the
# packed rows over the dense row of the same build (of_dense: medians over medians; then each
# round's ratio). Shapes: bf16, H = 16, d = 128
# and 64, causal and not, 65536 tokens in all; the lengths are varlen_lengths.py's (varlen.sh's).
set -u
before=$1
after=$2
out=${3:-/tmp/flashlab-varlen-ab}
rounds=${4:-3}
mkdir -p "$out"
date=$(date -u '+%Y-%m-%d %H:%M')
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
status=0

python3 "$(dirname "$0")"/varlen_lengths.py "$out" mixed uniform || exit 2

bwd=(bench attention --csv --pass bwd --heads 16 --dim 128,64 --both --reps 20 --bwd-kernel wgmma-ws)
jobs=()
for build in before after; do
  for layout in dense uniform mixed; do jobs+=("$build:$layout"); done
done
for ((r = 1; r <= rounds; ++r)); do
  n=${#jobs[@]}
  for ((k = 0; k < n; ++k)); do
    job=${jobs[$(((k + r - 1) % n))]}  # rotated each round
    build=${job%%:*} layout=${job##*:}
    dir=$before; [ "$build" = after ] && dir=$after
    shape=(--batch 8 --seq 8192)
    [ "$layout" = dense ] || shape=(--cu-seqlens "$out/$layout.txt")
    "$dir/flashlab" "${bwd[@]}" "${shape[@]}" >"$out/r${r}_${build}_${layout}.csv" || status=1
  done
done

python3 - "$out" "$date" "$device" "$before" "$after" "$rounds" <<'EOF' || status=1
import csv, statistics, sys
out, date, device, before, after, rounds = sys.argv[1:7]
commit = {}
for build, d in (("before", before), ("after", after)):
    try:
        commit[build] = open(f"{d}/commit").read().strip()
    except OSError:
        commit[build] = "unknown"
cols = ["date", "device", "round", "build", "commit", "layout", "d", "causal", "median_ms", "min_ms", "max_ms", "tflops"]
w = csv.writer(open(f"{out}/ab.csv", "w", newline=""), lineterminator="\n")
w.writerow(cols)
tf = {}
for r in range(1, int(rounds) + 1):
    for build in ("before", "after"):
        for layout in ("dense", "uniform", "mixed"):
            name = layout if layout == "dense" else "packed-" + layout
            try:
                rows = list(csv.DictReader(open(f"{out}/r{r}_{build}_{layout}.csv")))
            except OSError:
                continue
            for x in rows:
                w.writerow([date, device, r, build, commit[build], name, x["d"], x["causal"], x["ms"], x["min_ms"],
                            x["max_ms"], x["tflops"]])
                tf.setdefault((build, name, x["d"], x["causal"]), []).append(float(x["tflops"]))
print(f"device: {device}; builds: before {commit['before']}, after {commit['after']}; {rounds} rounds")
print("build  layout          d    causal  TFLOP/s (median of rounds; rounds)        of_dense (per round)")
for build in ("before", "after"):
    for name in ("dense", "packed-uniform", "packed-mixed"):
        for d in ("128", "64"):
            for c in ("0", "1"):
                v = tf.get((build, name, d, c))
                if not v:
                    continue
                dense = tf.get((build, "dense", d, c))
                ratio = statistics.median(v) / statistics.median(dense) if dense else float("nan")
                per_round = [a / b for a, b in zip(v, dense or [])]
                print(f"{build:6} {name:15} {d:>4} {c:>6}  {statistics.median(v):7.1f} "
                      f"({', '.join(f'{t:.1f}' for t in v):28})  {ratio:.4f} "
                      f"(rounds {', '.join(f'{t:.3f}' for t in per_round)})")
EOF
echo "varlen_bwd_ab: status $status ($out/ab.csv)"
exit $status
