#!/usr/bin/env bash
# cuda/bench/ring_cli_check.sh — the ring's command lines on 2 GPUs, checked rather than read:
#
#   ring_cli_check.sh [BIN_DIR]
#
# BIN_DIR (default gpu-carry) holds `flashlab` built with the cuda preset and NCCL. On a machine
# of at least 2 GPUs it runs, on small shapes (seconds):
#   flashlab bench attention --gpus 2 --csv   causal zigzag (d = 64, H_kv < H) and contiguous
#                                             (d = 128, H_kv = H), forward and backward
#   flashlab traffic ring --device cuda --gpus 2 --json   the same causal shape, both passes
# and fails (exit 1) unless every expected row appears and, on each, the bytes one GPU handed to
# NCCL equal the model's as the command reports them AND as this script computes them from the
# formula of docs/context-parallel.md (K + V in the dtype over G − 1 hops; the backward's dK + dV
# sums in fp32 over G hops), so that a model and a count that drifted together are caught too.
# With fewer than 2 GPUs (or no nvidia-smi) it prints "SKIPPED" and exits 77, never 0.
# Not a CI step: CI has no GPU. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail
export NCCL_NVLS_ENABLE=0

bin=${1:-gpu-carry}
[[ -x "$bin/flashlab" ]] || { echo "error: $bin/flashlab is missing (hint: build it with the cuda preset and copy it there)" >&2; exit 2; }
gpus=$( (nvidia-smi -L 2> /dev/null || true) | grep -c "^GPU")
if (( gpus < 2 )); then
  echo "ring CLI check: SKIPPED (this machine has $gpus GPUs; the ring's command lines need at least 2)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

# bench LABEL EXPECTED_JSON FLAGS...: the --csv rows of `flashlab bench attention --gpus 2 FLAGS`.
bench() {
  local label=$1 shape=$2; shift 2
  if ! "$bin/flashlab" bench attention --gpus 2 --pass both --reps 3 --csv "$@" > "$work/$label.csv" 2> "$work/$label.err"; then
    echo "FAIL bench $label: flashlab exited non-zero"; sed 's/^/    /' "$work/$label.err" | tail -5; fail=1; return
  fi
  python3 - "$work/$label.csv" "$shape" "$label" << 'EOF' || fail=1
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
s, label = json.loads(sys.argv[2]), sys.argv[3]
G, e = 2, 2  # two GPUs, bf16
ok = True
for pas in ("fwd", "bwd"):
    got = [r for r in rows if r["gpus"] == "2" and r["pass"] == pas]
    if not got:
        print(f"FAIL bench {label}: no G = 2 {pas} row"); ok = False; continue
    r = got[0]
    kv = s["B"] * s["N"] // G * s["H_kv"] * s["d"]  # one GPU's K (or V) elements
    formula = (G - 1) * 2 * kv * e + (G * 2 * kv * 4 if pas == "bwd" else 0)
    model, counted = int(r["model_bytes_per_gpu"]), int(r["counted_bytes_per_gpu"])
    good = model == counted == formula and r["counted_equals_model"] == "1"
    ok = ok and good
    print(f"{'ok  ' if good else 'FAIL'} bench {label} {pas}: ring {r['ring_ms']} ms, {r['ring_tflops_per_gpu']} TFLOP/s per GPU; "
          f"sent per GPU {counted} B, model {model} B, formula {formula} B")
sys.exit(0 if ok else 1)
EOF
}

bench causal_gqa_d64 '{"B": 1, "N": 8192, "H_kv": 2, "d": 64}' --seq 8192 --heads 8 --heads-kv 2 --dim 64 --causal
bench contiguous_d128 '{"B": 1, "N": 4096, "H_kv": 4, "d": 128}' --seq 4096 --heads 4 --dim 128

# The traffic command: the live measurement under each pass of its model, the same bytes.
if ! "$bin/flashlab" traffic ring --device cuda --gpus 2 --seq 8192 --heads 8 --heads-kv 2 --dim 64 --causal --json \
  > "$work/traffic.json" 2> "$work/traffic.err"; then
  echo "FAIL traffic ring: flashlab exited non-zero"; sed 's/^/    /' "$work/traffic.err" | tail -5; fail=1
else
  python3 - "$work/traffic.json" << 'EOF' || fail=1
import json, sys
j = json.load(open(sys.argv[1]))
G, e, kv = 2, 2, 8192 // 2 * 2 * 64
ok = True
passes = {p["pass"]: p for p in j["passes"]}
for pas in ("forward", "backward"):
    p = passes.get(pas)
    m = p and p["measured"]
    if not m or m.get("source") != "live":
        print(f"FAIL traffic ring {pas}: no live measurement"); ok = False; continue
    formula = (G - 1) * 2 * kv * e + (G * 2 * kv * 4 if pas == "backward" else 0)
    model = sum(s["sent_bytes"] for s in j["steps"] if s["pass"] == pas)
    counted = int(m["counted_bytes_per_gpu"])
    good = int(m["model_bytes_per_gpu"]) == model == counted == formula and m["counted_equals_model"]
    ok = ok and good
    print(f"{'ok  ' if good else 'FAIL'} traffic ring {pas}: ring {m['ring_ms']:.3f} ms on {m['device']}; "
          f"sent per GPU {counted} B, model {model} B, formula {formula} B")
sys.exit(0 if ok else 1)
EOF
fi

if (( fail )); then echo "ring CLI check: FAILED"; exit 1; fi
echo "ring CLI check: passed ($gpus GPUs)"
