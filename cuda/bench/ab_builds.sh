#!/usr/bin/env bash
# cuda/bench/ab_builds.sh — builds of `flashlab` timed against each other in one session: ROUNDS
# rounds of every build's processes, alternating, the order rotated each round (so that all builds
# meet the same clocks), each running the same `flashlab bench attention` commands (a named shape
# set); then, unless SDPA=0, SDPA's flash and cuDNN backends once on the first build's shapes
# (sdpa_bench.py); then ab_builds.py prints the median round per build and shape.
#
#   ab_builds.sh SET OUT_DIR ROUNDS NAME=BINARY...   on the GPU machine, from the repository root
#
# SET (bf16, B = 1, each process one `bench attention --csv` call):
#   bwd        the wgmma-ws backward at d = 128: H = 16 at N = 4096, 8192 and grouped 32:8 at 8192,
#              causal and not
#   bwd-nc     the same without a mask
#   fwd-short  the tma-ws forward at d = 64 on short sequences: B·N = 16k (16 × 1024, 8 × 2048,
#              4 × 4096) causal and not, and B = 1 at N = 1024, 4096 without a mask
# NAME=BINARY: a label (letters, digits, '-') and the flashlab binary of one build.
# OUT_DIR gets r<round>_<name>.<part>.csv per process (the bench's CSV), err.txt (their stderr),
# gpu.txt (name, clock, power limit), all_first.csv and sdpa.csv (SDPA on the first build's shapes)
# and summary.txt (ab_builds.py OUT_DIR). A process that fails or runs past 150 s leaves its CSV
# short and sets the exit status.
set -u
usage() { awk 'NR > 1 && /^set -u/ { exit } NR > 1' "$0" >&2; exit 2; }
[ $# -ge 4 ] || usage
set_name=$1 out=$2 rounds=$3
shift 3
case "$set_name" in
  bwd | bwd-nc | fwd-short) ;;
  *) echo "error: ab_builds.sh: unknown shape set '$set_name'" >&2
     echo "hint: one of bwd, bwd-nc, fwd-short" >&2
     exit 2 ;;
esac
builds=("$@")
for spec in "${builds[@]}"; do
  name=${spec%%=*} bin=${spec#*=}
  if [[ ! "$name" =~ ^[A-Za-z0-9-]+$ || "$spec" != *=* ]]; then
    echo "error: ab_builds.sh: '$spec' is not NAME=BINARY" >&2
    echo "hint: e.g. before=/tmp/a/flashlab after=/tmp/b/flashlab" >&2
    exit 2
  fi
  [ -x "$bin" ] || { echo "error: ab_builds.sh: $bin (build $name) is not an executable" >&2; exit 2; }
done
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin
here=$(cd "$(dirname "$0")" && pwd)
status=0
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv >"$out/gpu.txt" 2>&1

bwd=(bench attention --csv --pass bwd --bwd-kernel wgmma-ws --reps 20 --dim 128)
fwd=(bench attention --csv --pass fwd --fwd-kernel tma-ws --reps 30 --heads 16 --dim 64)
mask=--both
[ "$set_name" = bwd-nc ] && mask=--no-causal
run() {  # run FILE BINARY ARGS...: one process, its CSV into FILE
  local file=$1 bin=$2
  shift 2
  timeout 150 "$bin" "$@" >"$file" 2>>"$out/err.txt" || status=1
}
for ((r = 0; r < rounds; ++r)); do
  n=${#builds[@]}
  for ((i = 0; i < n; ++i)); do
    spec=${builds[$(((i + r) % n))]}
    name=${spec%%=*} bin=${spec#*=}
    f=$out/r${r}_${name}
    case "$set_name" in
      bwd | bwd-nc)
        run "$f.bwd.csv" "$bin" "${bwd[@]}" --heads 16 "$mask" --seq 4096,8192
        run "$f.bwdg.csv" "$bin" "${bwd[@]}" --heads 32 --heads-kv 8 "$mask" --seq 8192 ;;
      fwd-short)
        run "$f.fwd16.csv" "$bin" "${fwd[@]}" --both --seq 1024 --batch 16
        run "$f.fwd8.csv" "$bin" "${fwd[@]}" --both --seq 2048 --batch 8
        run "$f.fwd4.csv" "$bin" "${fwd[@]}" --both --seq 4096 --batch 4
        run "$f.fwd1.csv" "$bin" "${fwd[@]}" --no-causal --seq 1024,4096 ;;
    esac
  done
done
if [ "${SDPA:-1}" = 1 ]; then
  first=${builds[0]%%=*}
  cat "$out/r0_${first}".*.csv | awk 'NR == 1 || !/^dtype/' >"$out/all_first.csv"
  python3 "$here/sdpa_bench.py" "$out/all_first.csv" --out "$out/sdpa.csv" >"$out/sdpa.log" 2>&1 || status=1
fi
python3 "$here/ab_builds.py" "$out" | tee "$out/summary.txt" || status=1
exit $status
