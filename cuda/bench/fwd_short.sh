#!/usr/bin/env bash
# cuda/bench/fwd_short.sh — the tma-ws forward on short sequences (without a mask, or causal), this build beside a
# reference build (another commit's `flashlab`) and SDPA's cuDNN backend in one run: fwd_short.csv
# and fwd_short_checks.csv, or with MASK=causal fwd_causal.csv and fwd_causal_checks.csv
# (cuda/results/, or cuda/results/archive/ for a build not kept).
#
#   fwd_short.sh [BIN_DIR] [OUT_DIR] [REPEATS]   on the GPU machine, from the repository root
#   fwd_short.sh tabulate OUT_DIR                anywhere: the two CSVs again from OUT_DIR/logs (MASK as run)
#
# BIN_DIR (default gpu-carry) holds `flashlab` and `test_cuda` of this build, `flashlab_base` of the
# reference build, and `commit` and `commit_base` (git describe of the trees that built them); if it
# also holds `flashlab_alt` and `commit_alt`, that third build is swept too (build `alt`); OUT_DIR
# (default /tmp/flashlab-short, outside the tree) gets the logs and the CSVs. Shapes: bf16, H = 16,
# non-causal, d = 64 and 128; B = 1 at N = 1024 … 16384, and B·N = 16k (B = 16, 8, 4 at N = 1024,
# 2048, 4096: FlashAttention's benchmark). With MASK=causal the same shapes causal, and B = 8 at
# N = 8192 (64k tokens, the packed runs' dense row: 128 (head, batch) pairs, about one a block),
# B = 2 at N = 16384, and grouped K/V 32:8 at N = 8192, B = 1 and 4. REPEATS (default 3) sweeps of
# each build, alternating
# (base, [alt,] this, base, …) so that all meet the same clocks; then SDPA (sdpa_bench.py) on the
# same shapes, once per repeat in one process. Then the forward's tests and, if SANITIZE=1 (the
# default), memcheck and racecheck on its small shapes.
#   fwd_short.csv: date, device, commit, build (this, base or alt), repeat, dtype, pass, kernel, d, causal,
#     N, H, B, median_ms, min_ms, max_ms, tflops, then SDPA's TFLOP/s on the shape in the same repeat
#     (flash_bnhd_tflops, cudnn_bnhd_tflops, cudnn_bhnd_tflops), ours_over_cudnn_bnhd, H_kv;
#   fwd_short_checks.csv: as cuda/results/checks.csv (step_checks.py).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
status=0
mask=${MASK:-no-causal}
case "$mask" in
  causal | no-causal) ;;
  *) echo "error: MASK=$mask: not a mask of this script" >&2
     echo "hint: MASK=causal (or no-causal, the default)" >&2
     exit 2 ;;
esac
name=$([ "$mask" = causal ] && echo fwd_causal || echo fwd_short)
if [ "${1:-}" = tabulate ]; then
  out=${2:?usage: fwd_short.sh tabulate OUT_DIR}
  logs=$out/logs
  IFS=$'\n' read -r -d '' date device commit commit_base repeats commit_alt <"$logs/env.txt"
else
  bin=${1:-gpu-carry}
  out=${2:-/tmp/flashlab-short}
  repeats=${3:-3}
  logs=$out/logs
  mkdir -p "$logs"
  export PATH=$PATH:/usr/local/cuda/bin
  commit=$(head -1 "$bin/commit" 2>/dev/null || echo unknown)
  commit_base=$(head -1 "$bin/commit_base" 2>/dev/null || echo unknown)
  commit_alt=$([ -x "$bin/flashlab_alt" ] && { head -1 "$bin/commit_alt" 2>/dev/null || echo unknown; })
  date=$(date -u '+%Y-%m-%d %H:%M')
  device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  printf '%s\n%s\n%s\n%s\n%s\n%s\n' "$date" "$device" "$commit" "$commit_base" "$repeats" "$commit_alt" >"$logs/env.txt"
fi
step() {  # step LOG CMD...: stdout into LOG, stderr into LOG.err, the command into LOG.cmd, rc into LOG.rc
  local log=$1; shift
  echo "=== $*" | tee "$log.cmd"
  timeout "${step_timeout:-200}" "$@" >"$log" 2>"$log.err"
  local rc=$?
  echo "$rc" >"$log.rc"
  [ "$rc" -eq 0 ] || { echo "    failed: rc=$rc (see $log.err)"; status=1; }
}
sweep() {  # sweep BINARY OUT_CSV: every shape, one CSV (the header once)
  local b=$1 csv=$2
  local common=(bench attention --csv --pass fwd "--$mask" --dim 64,128 --fwd-kernel tma-ws) bn
  local more=(16:1024 8:2048 4:4096)
  [ "$mask" = causal ] && more+=(8:8192 2:16384)
  "$b" "${common[@]}" --heads 16 --seq 1024,2048,4096,8192,16384 --batch 1 >"$csv" || return 1
  for bn in "${more[@]}"; do
    "$b" "${common[@]}" --heads 16 --batch "${bn%%:*}" --seq "${bn##*:}" | tail -n +2 >>"$csv" || return 1
  done
  [ "$mask" = causal ] || return 0
  for bn in 1:8192 4:8192; do
    "$b" "${common[@]}" --heads 32 --heads-kv 8 --batch "${bn%%:*}" --seq "${bn##*:}" | tail -n +2 >>"$csv" || return 1
  done
}
run() {
  local r b builds=(base)
  [ -n "$commit_alt" ] && builds+=(alt)
  builds+=(this)
  for ((r = 1; r <= repeats; r++)); do
    for b in "${builds[@]}"; do
      echo "=== sweep $b $r"
      sweep "$bin/flashlab$([ $b != this ] && echo _$b)" "$logs/bench_${b}_$r.csv" 2>"$logs/bench_${b}_$r.err" ||
        { echo "    failed (see $logs/bench_${b}_$r.err)"; status=1; }
    done
  done
  # SDPA: the shapes once per repeat, one process (its graphs built once)
  { head -1 "$logs/bench_this_1.csv"
    for ((r = 1; r <= repeats; r++)); do tail -n +2 "$logs/bench_this_1.csv"; done; } >"$logs/sdpa_in.csv"
  step "$logs/sdpa.log" env PYTHONUNBUFFERED=1 python3 "$here/sdpa_bench.py" "$logs/sdpa_in.csv" --out "$logs/sdpa.csv"
  step "$logs/test_cuda_fast_ws.log" "$bin/test_cuda" '[fast-ws]' --durations yes
  if [ "${SANITIZE:-1}" = 1 ]; then
    local tool
    for tool in memcheck racecheck; do
      step "$logs/sanitize_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/test_cuda" \
        '[fast-ws][fast-sanitize]'
    done
  fi
}
[ "${1:-}" = tabulate ] || run
python3 - "$out" "$date" "$device" "$commit" "$commit_base" "$repeats" "${commit_alt:-}" "$name" <<'EOF' || status=1
import csv, os, statistics, sys
out, date, device, commit, commit_base, repeats, commit_alt, name = sys.argv[1:9]
logs, repeats = f"{out}/logs", int(repeats)
# sdpa.csv: one row per row of sdpa_in.csv, in order (its columns do not include B): repeat r's
# rows are the r-th block of the shapes.
sdpa_rows = list(csv.DictReader(open(f"{logs}/sdpa.csv"))) if os.path.exists(f"{logs}/sdpa.csv") else []
cols = ["date", "device", "commit", "build", "repeat", "dtype", "pass", "kernel", "d", "causal", "N", "H", "B",
        "median_ms", "min_ms", "max_ms", "tflops", "flash_bnhd_tflops", "cudnn_bnhd_tflops", "cudnn_bhnd_tflops",
        "ours_over_cudnn_bnhd", "H_kv"]
w = csv.writer(open(f"{out}/{name}.csv", "w", newline=""), lineterminator="\n")
w.writerow(cols)
summary = {}
for r in range(1, repeats + 1):
    for build, com in (("base", commit_base), ("alt", commit_alt), ("this", commit)):
        f = f"{logs}/bench_{build}_{r}.csv"
        if not os.path.exists(f):
            continue
        rows = list(csv.DictReader(open(f)))
        for i, row in enumerate(rows):
            k = (r - 1) * len(rows) + i
            s = sdpa_rows[k] if k < len(sdpa_rows) else {}
            if s and (s["d"], s["N"]) != (row["d"], row["N"]):
                sys.exit(f"fwd_short: SDPA row {k} is d={s['d']} N={s['N']}, ours d={row['d']} N={row['N']}")
            fl, cb, ch = (s.get(c, "") for c in ("flash_bnhd_tflops", "cudnn_bnhd_tflops", "cudnn_bhnd_tflops"))
            ratio = f"{float(row['tflops']) / float(cb):.3f}" if cb not in ("", "n/a") else ""
            w.writerow([date, device, com, build, r, row["dtype"], row["pass"], row["fwd_kernel"], row["d"],
                        row["causal"], row["N"], row["H"], row["B"], row["ms"], row["min_ms"], row["max_ms"],
                        row["tflops"], fl, cb, ch, ratio, row.get("H_kv") or row["H"]])
            key = (int(row["d"]), int(row["N"]), int(row["B"]), f"{row['H']}:{row.get('H_kv') or row['H']}")
            summary.setdefault(key, {}).setdefault(build, []).append(float(row["tflops"]))
            if build == "this" and cb not in ("", "n/a"):
                summary[key].setdefault("cudnn", []).append(float(cb))
alt = " alt/base alt/cuDNN" if commit_alt else ""
print(f"{'d':>4} {'N':>6} {'B':>3} {'H':>5} {'base':>8} {'this':>8} {'cuDNN':>8} {'this/base':>9}"
      f" {'base/cuDNN':>10} {'this/cuDNN':>10}"
      f"{alt}   (TFLOP/s, medians over the repeats)")
for key in sorted(summary):
    m = {b: statistics.median(v) for b, v in summary[key].items()}
    base, this, cud = m.get("base", float("nan")), m.get("this", float("nan")), m.get("cudnn", float("nan"))
    a = m.get("alt", float("nan"))
    print(f"{key[0]:>4} {key[1]:>6} {key[2]:>3} {key[3]:>5} {base:>8.1f} {this:>8.1f} {cud:>8.1f} {this / base:>9.3f} "
          f"{base / cud:>10.3f} {this / cud:>10.3f}" + (f" {a / base:>8.3f} {a / cud:>9.3f}" if commit_alt else ""))
EOF
python3 "$here/step_checks.py" "$out/${name}_checks.csv" "$logs" "$date" "$device" "$commit" || status=1
tar czf "$out/$name.tgz" -C "$out" logs "$name.csv" "${name}_checks.csv"  # the whole run in one file
echo "fwd_short: status $status ($out/$name.csv, $out/${name}_checks.csv)"
exit $status
