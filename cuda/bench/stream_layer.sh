#!/usr/bin/env bash
# A layer of STREAM traced to a trace store on the GPU machine, end to end (inputs on the GPU →
# every head committed), and the rows of cuda/results/stream_layer.csv:
#
#   bash cuda/bench/stream_layer.sh BIN OUT [STORE_ROOT [CONFIG ...]]
#
# BIN holds flashlab (and test_cuda), OUT receives the logs and stream_layer.csv (columns: the
# README's date,device,commit first, from BIN/commit), STORE_ROOT (default /tmp) the stores, each
# removed after its run. Each configuration runs once under /usr/bin/time -v (its "Maximum resident
# set size" is the peak host RSS); the stores of one layer are verified (checksums, reverse index)
# with `flashlab stream query --verify`. Shapes: T = 1M, d = 128, k = 16, H = 32. A CONFIG is
# LAYERS,HEADS_PER_LAUNCH[,PRIORITY] (PRIORITY: --priority equal|trace|estimate, passed only when
# given, so that builds without the flag run too; the column says equal then); by default 1 layer
# with 1, 2 and 4 heads per launch, 8 layers with 1 and 4. Run it once per binary to put two builds
# side by side (the commit column tells them apart).
set -u
bin=${1:?BIN}
out=${2:?OUT}
root=${3:-/tmp}
mkdir -p "$out"
fl="$bin/flashlab"
commit=$(cat "$bin/commit" 2>/dev/null || echo unknown)
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
date=$(date -u '+%Y-%m-%d %H:%M')
shape=(--block-m 64 --block-n 64 --k 16 --seq 1048576 --dim 128 --heads 32 --seed 1)
csv="$out/stream_layer.csv"
echo "date,device,commit,T,d,k,H,layers,heads_per_launch,priority,chunk,traced_ms,max_layer_ms,inputs_ms,estimate_ms,trace_ms,gpu_span_ms,writer_busy_ms,end_head_ms,device_bytes_beyond_qkv,device_bytes_measured,qkv_bytes,pinned_bytes,peak_rss_bytes,records,checksum,verified" >"$csv"

run_layer() {  # layers heads_per_launch [priority]
  local layers=$1 hpl=$2 prio=${3:-} tag="L$1_hpl$2${3:+_$3}" store="$root/stream_layer_L$1_hpl$2"
  local extra=()
  [ -n "$prio" ] && extra=(--priority "$prio")
  rm -rf "$store"
  /usr/bin/time -v -o "$out/time_$tag.txt" "$fl" stream trace --store "$store" --device cuda --kernel fast "${shape[@]}" \
    --layers "$layers" --heads-per-launch "$hpl" "${extra[@]}" --json >"$out/layer_$tag.json" 2>"$out/layer_$tag.err"
  local rc=$?
  local verified=-
  if [ $rc -eq 0 ] && [ "$layers" -eq 1 ]; then
    if "$fl" stream query "$store" --verify >"$out/verify_$tag.txt" 2>&1; then verified=yes; else verified=no; fi
  fi
  rm -rf "$store"
  [ $rc -eq 0 ] || { echo "layer run $tag failed ($rc)"; return; }
  python3 - "$out/layer_$tag.json" "$out/time_$tag.txt" "$date" "$device" "$commit" "$verified" >>"$csv" <<'EOF'
import json, re, sys
j = json.load(open(sys.argv[1]))
rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(sys.argv[2]).read()).group(1))
row = [sys.argv[3], sys.argv[4], sys.argv[5], j["T"], j["d"], j["k"], j["heads"], j["layers"], j["heads_per_launch"],
       j.get("priority", "equal"), j["chunk"], "%.2f" % j["traced_ms"], "%.2f" % max(j["layer_ms"]), "%.2f" % j["inputs_ms"],
       "%.2f" % j["estimate_ms"], "%.2f" % j["trace_ms"], "%.2f" % j["gpu_span_ms"], "%.2f" % j["writer_busy_ms"],
       "%.2f" % j["end_head_ms"], j["device_bytes_beyond_qkv"], j["device_bytes_beyond_qkv_measured"], j["qkv_device_bytes"], j["pinned_bytes"],
       rss_kb * 1024, j["records"], j["checksum"], sys.argv[6]]
print(",".join(str(x) for x in row))
EOF
}

configs=("${@:4}")
[ ${#configs[@]} -gt 0 ] || configs=(1,1 1,2 1,4 8,1 8,4)
for c in "${configs[@]}"; do
  IFS=, read -r layers hpl prio <<<"$c"
  run_layer "$layers" "$hpl" "$prio"
done
cat "$csv"
