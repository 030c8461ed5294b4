#!/usr/bin/env bash
# splitkv.sh — the split-KV forward's measurements on one GPU (cuda/results/fwd_splitkv.csv):
#   1. decoding, one query row, GQA 32:8, d = 128, bf16, B = 1, N_k = 32k … 1M: splitkv (with the
#      D2D copy of K and V's bytes timed beside it, --kv-copy), and the regular tma-ws forward at
#      32k and 128k; B = 8 at 32k, both kernels;
#   2. a chunk of 128 queries against 64k keys, H = H_kv = 16, d = 128: splitkv, tma-ws and the
#      front door's choice, causal and not;
#   3. the rule's sweep: N = 16 … 2048 against 16k keys, H = 16, d = 64 and 128, causal and not,
#      splitkv against tma-ws (fastest_forward_kernel(problem) states the rule that came of it);
#   4. PyTorch SDPA (flash and cuDNN backends) on the splitkv rows of 1 and 2 (cuda/bench/sdpa_bench.py).
# Usage: cuda/bench/splitkv.sh FLASHLAB_BINARY OUT_DIR [--no-sweep]
#   (on the GPU machine; python3 with torch for 4; --no-sweep leaves out 3, the rule's sweep)
set -euo pipefail
bin=$1
out=$2
sweep=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
csv=$out/splitkv_bench.csv
bench() { "$bin" bench attention --pass fwd --csv "$@"; }
{
  bench --dim 128 --heads 32 --heads-kv 8 --seq 1 --seq-k 32768 --no-causal --fwd-kernel splitkv --kv-copy
  for nk in 131072 524288 1048576; do
    bench --dim 128 --heads 32 --heads-kv 8 --seq 1 --seq-k $nk --no-causal --fwd-kernel splitkv --kv-copy | tail -n +2
  done
  for nk in 32768 131072; do
    bench --dim 128 --heads 32 --heads-kv 8 --seq 1 --seq-k $nk --no-causal --fwd-kernel tma-ws | tail -n +2
  done
  bench --dim 128 --heads 32 --heads-kv 8 --batch 8 --seq 1 --seq-k 32768 --no-causal --fwd-kernel splitkv --kv-copy | tail -n +2
  bench --dim 128 --heads 32 --heads-kv 8 --batch 8 --seq 1 --seq-k 32768 --no-causal --fwd-kernel tma-ws | tail -n +2
  for k in splitkv tma-ws auto; do
    bench --dim 128 --heads 16 --seq 128 --seq-k 65536 --both --fwd-kernel $k | tail -n +2
  done
  [ "$sweep" = --no-sweep ] || for k in splitkv tma-ws; do
    bench --dim 64,128 --heads 16 --seq 16,64,128,256,512,1024,2048 --seq-k 16384 --both --fwd-kernel $k | tail -n +2
  done
} > "$csv"
# SDPA on the rows of 1 and 2 that ran splitkv (N = 1 decoding; N = 128 against 64k keys).
awk -F, 'NR == 1 || ($14 == "splitkv" && ($5 == 1 || ($5 == 128 && $16 == 65536)))' "$csv" > "$out/splitkv_ours.csv"
(cd "$here" && python3 sdpa_bench.py "$out/splitkv_ours.csv" --reps 30 --out "$out/splitkv_sdpa.csv")
