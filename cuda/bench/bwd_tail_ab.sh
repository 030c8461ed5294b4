#!/usr/bin/env bash
# cuda/bench/bwd_tail_ab.sh — the plain wgmma-ws backward (d = 128, H = 16, B = 1) of two builds
# beside PyTorch SDPA in one session: rounds of the two builds' processes, alternating and the
# order rotated each round, each timing N = 4096, 8192, 16384, causal and not; then H = 33 at
# N = 8192 (64 × 33 key tiles: 16 whole waves on 132 SMs, no partial last wave) for each build;
# then SDPA (flash and cuDNN, sdpa_bench.py) on the same shapes; then, unless NCU=0, one ncu
# profile of each build's backward kernel at N = 8192 non-causal and the launch statistics of every
# kernel of SDPA's cuDNN backward there.
#
#   bwd_tail_ab.sh BEFORE_DIR AFTER_DIR [OUT_DIR] [ROUNDS]   on the GPU machine, from the repository root
#
# Each BIN dir holds `flashlab` (cuda preset) and `commit` (git describe of the tree that built it).
# OUT_DIR (default /tmp/flashlab-bwd-tail) gets one bench CSV per process, sdpa.csv, ncu_*.csv and
# ab.csv: date, device, round, build, commit, H, N, causal, median_ms, min_ms, max_ms, tflops; and
# prints per build and shape the median over the rounds (and each round's TFLOP/s).
set -u
before=$1
after=$2
out=${3:-/tmp/flashlab-bwd-tail}
rounds=${4:-3}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin
date=$(date -u '+%Y-%m-%d %H:%M')
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
status=0
here=$(dirname "$0")

bwd=(bench attention --csv --pass bwd --dim 128 --reps 20 --bwd-kernel wgmma-ws)
for ((r = 1; r <= rounds; ++r)); do
  order=(before after)
  ((r % 2 == 0)) && order=(after before)
  for build in "${order[@]}"; do
    dir=$before; [ "$build" = after ] && dir=$after
    "$dir/flashlab" "${bwd[@]}" --heads 16 --both --seq 4096,8192,16384 >"$out/r${r}_${build}.csv" || status=1
  done
done
for build in before after; do  # no partial last wave (on 132 SMs)
  dir=$before; [ "$build" = after ] && dir=$after
  "$dir/flashlab" "${bwd[@]}" --heads 33 --no-causal --seq 8192 >"$out/h33_${build}.csv" || status=1
done
PYTHONUNBUFFERED=1 python3 "$here/sdpa_bench.py" "$out/r1_after.csv" --out "$out/sdpa.csv" >"$out/sdpa.log" 2>&1 || status=1

python3 - "$out" "$date" "$device" "$before" "$after" "$rounds" <<'PY' || status=1
import csv, os, statistics, sys
out, date, device, before, after, rounds = sys.argv[1:7]
# each build's commit file (git describe of the tree that built it), else unknown
commit = {b: open(f"{d}/commit").read().strip() if os.path.isfile(f"{d}/commit") else "unknown"
          for b, d in (("before", before), ("after", after))}
w = csv.writer(open(f"{out}/ab.csv", "w", newline=""), lineterminator="\n")
w.writerow(["date", "device", "round", "build", "commit", "H", "N", "causal", "median_ms", "min_ms", "max_ms", "tflops"])
tf = {}
files = [(r, b, f"{out}/r{r}_{b}.csv") for r in range(1, int(rounds) + 1) for b in ("before", "after")]
files += [(1, b, f"{out}/h33_{b}.csv") for b in ("before", "after")]
for r, build, path in files:
    try:
        rows = list(csv.DictReader(open(path)))
    except OSError:
        continue
    for x in rows:
        w.writerow([date, device, r, build, commit[build], x["H"], x["N"], x["causal"], x["ms"], x["min_ms"],
                    x["max_ms"], x["tflops"]])
        tf.setdefault((x["H"], x["N"], x["causal"], build), []).append(float(x["tflops"]))
cudnn = {}
try:
    for x in csv.DictReader(open(f"{out}/sdpa.csv")):
        cudnn[(x["N"], x["causal"])] = x.get("cudnn_bnhd_tflops", ""), x.get("cudnn_bhnd_tflops", "")
except OSError:
    pass
print(f"device: {device}; builds: before {commit['before']}, after {commit['after']}; {rounds} rounds")
print("H   N      causal  before (rounds)                 after (rounds)                  after/before  cuDNN bnhd/bhnd")
for key in sorted({k[:3] for k in tf}, key=lambda k: (int(k[0]), k[2], int(k[1]))):
    b, a = tf.get(key + ("before",), []), tf.get(key + ("after",), [])
    mb = statistics.median(b) if b else float("nan")
    ma = statistics.median(a) if a else float("nan")
    c = cudnn.get((key[1], key[2]), ("", ""))
    print(f"{key[0]:<3} {key[1]:<6} {key[2]:<7} {mb:7.1f} ({' '.join(f'{v:.1f}' for v in b):<22}) "
          f"{ma:7.1f} ({' '.join(f'{v:.1f}' for v in a):<22}) {ma / mb:6.4f}        {c[0]} / {c[1]}")
PY

if [ "${NCU:-1}" = 1 ]; then
  sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats
            --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis)
  for build in before after; do
    dir=$before; [ "$build" = after ] && dir=$after
    timeout 120 ncu --csv --page details --kernel-name regex:'bwd_ws_(split_)?kernel' --launch-skip 2 --launch-count 1 \
      "${sections[@]}" "$dir/flashlab" bench attention --pass bwd --seq 8192 --dim 128 --no-causal --reps 3 \
      --warmup 2 --bwd-kernel wgmma-ws >"$out/ncu_$build.csv" 2>"$out/ncu_$build.err" || status=1
  done
  # SDPA's cuDNN backward at the same shape: every kernel of one backward call, launch statistics.
  cat >"$out/cudnn_once.py" <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v = (torch.randn(1, 8192, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True).transpose(1, 2)
           for _ in range(3))
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(2):
        out = F.scaled_dot_product_attention(q, k, v)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("bwd")
        out.backward(torch.randn_like(out))
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
PY
  timeout 120 ncu --csv --page details --nvtx --nvtx-include 'bwd/' --section LaunchStats --section SpeedOfLight \
    --section Occupancy python3 "$out/cudnn_once.py" >"$out/ncu_cudnn.csv" 2>"$out/ncu_cudnn.err" || status=1
fi
echo "bwd_tail_ab: status $status"
exit $status
