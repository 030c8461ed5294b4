#!/usr/bin/env bash
# cuda/bench/varlen.sh — packed variable-length sequences on the H100: the varlen tests (and their
# sanitizer shapes under memcheck and racecheck), the Python GPU test, and the packed forward beside
# the dense one at the same total tokens, and the packed backward beside the dense ones: the rows of
# cuda/results/fwd_varlen.csv, cuda/results/bwd_varlen.csv and cuda/results/checks.csv.
#
#   varlen.sh [BIN_DIR] [OUT_DIR] [all|fwd|bwd]   on the GPU machine, from the repository root
#
# all (the default) runs everything below; fwd only times the forward's shapes (fwd_varlen.csv, the
# cuDNN column), bwd only the backward's (bwd_varlen.csv): the rows to re-take after a change to
# one pass alone, without the tests.
#
# BIN_DIR (default gpu-carry) holds `test_cuda`, `flashlab` and `libflashlab.so` built with the cuda
# preset, and `commit` (git describe of the tree that built them, as measure.sh wants); OUT_DIR
# (default /tmp/flashlab-varlen, outside the tree) gets the logs, the raw bench CSVs, checks.csv
# (date, device, commit, command, status, assertions, test_cases, sanitizer_errors) and
# fwd_varlen.csv: date, device, commit, dtype, pass, kernel, d, causal, layout, sequences,
# longest, total_q, H, median_ms, min_ms, max_ms, tflops (every sequence's own visible pairs:
# bench.hpp), of_dense (tflops over the dense row's of the same d, mask and kernel),
# cudnn_bnhd_tflops (SDPA's cuDNN backend on the dense rows, same session); bwd_varlen.csv: the same
# columns but cudnn, then of_fastest_dense (over the wgmma-ws kernel's dense row).
#
# Shapes: bf16, H = 16, d = 128 and 64, causal and not, 65536 tokens in all: dense B = 8, N = 8192;
# packed-uniform, the same 8 sequences of 8192 packed (the cost of the packed work list alone);
# packed-mixed, 16 sequences of 913 … 8192 tokens (varlen_lengths.py), on the tma-ws and mma
# forwards; and packed-chunks, 16 chunks of 1024 queries against 1024 … 16384 keys (chunked prefill:
# no dense row of the same keys, so no of_dense). The backward: the dense, uniform and mixed layouts,
# each on the wgmma-ws and mma kernels
# (varlen_bwd_ab.sh times two builds' packed wgmma-ws backward against each other).
set -u
. "$(dirname "$0")/run_context.sh" "${1:-gpu-carry}" "${2:-/tmp/flashlab-varlen}"
passes=${3:-all}
case "$passes" in
  all | fwd | bwd) ;;
  *) echo "varlen.sh: the third argument is all, fwd or bwd, not '$passes'" >&2; exit 2 ;;
esac

# The lengths, as --cu-seqlens files (prefix sums).
python3 "$here"/varlen_lengths.py "$out" mixed uniform chunks || exit 2

# ---- tests: one line of checks.csv per command (assertions and test cases from Catch2's summary)
check() {  # check NAME SANITIZER_ERRORS_OR_EMPTY COMMAND...
  local name=$1 log="$out/$1.log"; shift
  "$@" >"$log" 2>&1; local rc=$?
  local asserts cases errors=""
  asserts=$(grep -Eo '[0-9]+ assertions' "$log" | tail -1 | grep -Eo '[0-9]+' || true)
  cases=$(grep -Eo '[0-9]+ test cases?' "$log" | tail -1 | grep -Eo '[0-9]+' || true)
  [ -z "$asserts" ] && asserts=$(grep -Eo 'assertions: +[0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+' || true)
  [ -z "$cases" ] && cases=$(grep -Eo 'test cases: +[0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+' || true)
  case "$name" in
    memcheck) errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+' || echo "?") ;;
    racecheck) errors=$(grep -Eo 'RACECHECK SUMMARY: [0-9]+ hazards' "$log" | tail -1 | grep -Eo '[0-9]+' || echo "?") ;;
    pytest) asserts=""; cases=$(grep -Eo '[0-9]+ passed' "$log" | tail -1 | grep -Eo '[0-9]+' || true) ;;
  esac
  local verdict=pass; [ $rc -eq 0 ] || { verdict=fail; status=1; }
  local cmd="$*"; cmd=${cmd//$bin\//}
  echo "$date,$device,$commit,\"$cmd\",$verdict,$asserts,$cases,$errors" >>"$out/checks.csv"
  echo "$name: $verdict (rc $rc)"; tail -4 "$log"
}
if [ "$passes" = all ]; then
  echo "date,device,commit,command,status,assertions,test_cases,sanitizer_errors" >"$out/checks.csv"
  check tests "$bin/test_cuda" \
    "[fast-varlen],[fast-bwd-varlen],[fast-window-sanitize],[fast-gqa-sanitize],[fast-splitkv-sanitize],[front-door],[errors]"
  check memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda" \
    "[fast-varlen-sanitize],[fast-bwd-varlen-sanitize]"
  check racecheck compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/test_cuda" \
    "[fast-varlen-sanitize],[fast-bwd-varlen-sanitize]"
  check pytest env FLASHLAB_LIBRARY="$bin/libflashlab.so" FLASHLAB_REQUIRE_CUDA=1 PYTHONPATH=python \
    python3 -m pytest -q python/tests/test_torch_varlen.py
fi

# ---- the timed shapes
common=(bench attention --csv --pass fwd --heads 16 --dim 128,64 --both --reps 20)
for k in tma-ws mma; do
  [ "$passes" = bwd ] && break
  "$bin/flashlab" "${common[@]}" --fwd-kernel "$k" --batch 8 --seq 8192 >"$out/dense_$k.csv" || status=1
  for layout in uniform mixed chunks; do
    "$bin/flashlab" "${common[@]}" --fwd-kernel "$k" --cu-seqlens "$out/$layout.txt" >"$out/${layout}_$k.csv" || status=1
  done
done
bwd=(bench attention --csv --pass bwd --heads 16 --dim 128,64 --both --reps 20)
if [ "$passes" != fwd ]; then
  "$bin/flashlab" "${bwd[@]}" --bwd-kernel wgmma-ws --batch 8 --seq 8192 >"$out/bwd_dense_wgmma-ws.csv" || status=1
  "$bin/flashlab" "${bwd[@]}" --bwd-kernel mma --batch 8 --seq 8192 >"$out/bwd_dense_mma.csv" || status=1
  for layout in uniform mixed; do
    for k in wgmma-ws mma; do
      "$bin/flashlab" "${bwd[@]}" --bwd-kernel "$k" --cu-seqlens "$out/$layout.txt" \
        >"$out/bwd_${layout}_$k.csv" || status=1
    done
  done
fi
if [ "$passes" != bwd ]; then
  PYTHONUNBUFFERED=1 python3 "$here/sdpa_bench.py" "$out/dense_tma-ws.csv" --out "$out/sdpa_dense.csv" \
    >"$out/sdpa.log" 2>&1 || status=1
fi
python3 - "$out" "$date" "$device" "$commit" <<'EOF' || status=1
import csv, os, sys
out, date, device, commit = sys.argv[1:5]
cudnn = {}
if os.path.exists(f"{out}/sdpa_dense.csv"):
    for r in csv.DictReader(open(f"{out}/sdpa_dense.csv")):
        cudnn[(r["d"], r["causal"])] = r["cudnn_bnhd_tflops"]
rows, dense = [], {}
for layout in ("dense", "uniform", "mixed", "chunks"):
    for k in ("tma-ws", "mma"):
        if not os.path.exists(f"{out}/dense_tma-ws.csv"):  # bwd only
            break
        for r in csv.DictReader(open(f"{out}/{layout}_{k}.csv")):
            name = "dense" if layout == "dense" else "packed-" + layout
            rows.append((name, r))
            if layout == "dense":
                dense[(k, r["d"], r["causal"])] = float(r["tflops"])
cols = ["date", "device", "commit", "dtype", "pass", "kernel", "d", "causal", "layout", "sequences", "longest",
        "total_q", "H", "median_ms", "min_ms", "max_ms", "tflops", "of_dense", "cudnn_bnhd_tflops"]
w = csv.writer(open(f"{out}/fwd_varlen.csv", "w", newline=""), lineterminator="\n") if rows else None
if w:
    w.writerow(cols)
for name, r in rows:
    k, d, c = r["fwd_kernel"], r["d"], r["causal"]
    ref = dense.get((k, d, c)) if name != "packed-chunks" else None  # chunks: other keys than dense's
    total = int(r["total_q"]) or int(r["B"]) * int(r["N"])
    w.writerow([date, device, commit, r["dtype"], r["pass"], k, d, c, name, r["B"], r["N"], total, r["H"], r["ms"],
                r["min_ms"], r["max_ms"], r["tflops"], f"{float(r['tflops']) / ref:.4f}" if ref else "",
                cudnn.get((d, c), "") if name == "dense" and k == "tma-ws" else ""])
# The backward: of_dense over the same kernel's dense row, of_fastest_dense over wgmma-ws's.
if not os.path.exists(f"{out}/bwd_dense_wgmma-ws.csv"):
    sys.exit(0)
dense = {}
for k in ("wgmma-ws", "mma"):
    for r in csv.DictReader(open(f"{out}/bwd_dense_{k}.csv")):
        dense[(k, r["d"], r["causal"])] = float(r["tflops"])
w = csv.writer(open(f"{out}/bwd_varlen.csv", "w", newline=""), lineterminator="\n")
w.writerow(cols[:-1] + ["of_fastest_dense"])
for name, k, path in (("dense", "wgmma-ws", "bwd_dense_wgmma-ws"), ("dense", "mma", "bwd_dense_mma"),
                      ("packed-uniform", "wgmma-ws", "bwd_uniform_wgmma-ws"), ("packed-uniform", "mma", "bwd_uniform_mma"),
                      ("packed-mixed", "wgmma-ws", "bwd_mixed_wgmma-ws"), ("packed-mixed", "mma", "bwd_mixed_mma")):
    for r in csv.DictReader(open(f"{out}/{path}.csv")):
        d, c, t = r["d"], r["causal"], float(r["tflops"])
        total = int(r["total_q"]) or int(r["B"]) * int(r["N"])
        w.writerow([date, device, commit, r["dtype"], r["pass"], k, d, c, name, r["B"], r["N"], total, r["H"], r["ms"],
                    r["min_ms"], r["max_ms"], r["tflops"], f"{t / dense[(k, d, c)]:.4f}",
                    f"{t / dense[('wgmma-ws', d, c)]:.4f}"])
EOF
# The tma-ws kernels' registers and spills (dense and packed instantiations side by side).
cuobjdump -res-usage "$bin/libflashlab.so" 2>/dev/null | grep -A1 ws_fwd_kernel | grep -Eo 'REG:[0-9]+ STACK:[0-9]+' |
  sort | uniq -c >"$out/ws_registers.txt" || true
echo "varlen: status $status ($out/fwd_varlen.csv, $out/bwd_varlen.csv, $out/checks.csv)"
exit $status
