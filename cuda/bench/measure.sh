#!/usr/bin/env bash
# cuda/bench/measure.sh — every GPU figure of cuda/RESULTS.md and the README, in one run.
#
#   measure.sh run [BIN_DIR] [OUT_DIR]   on the GPU machine, from the repository root: tests,
#                                        sanitizers, CUPTI traffic, timings beside PyTorch SDPA;
#                                        raw logs in OUT_DIR/logs, then `tabulate`
#   measure.sh tabulate OUT_DIR          raw logs of OUT_DIR/logs -> OUT_DIR/csv/*.csv, the files
#                                        (and columns) of cuda/results/; runs anywhere (bash + awk)
#   measure.sh hopper [BIN_DIR] [OUT_DIR] the Hopper forwards only (a few minutes, most of them
#                                        racecheck's): the tma-ws
#                                        tests and sanitizers, tma-ws and wgmma sweeps beside SDPA,
#                                        one ncu profile of each at the headline shape (and of
#                                        tma-ws at d = 64); tabulated
#   measure.sh hopper-bwd [BIN_DIR] [OUT_DIR] the Hopper backward (about four minutes): the
#                                        wgmma-ws tests and sanitizers, its sweep beside SDPA and
#                                        beside other builds' (BIN_DIR/flashlab_LABEL, if there,
#                                        e.g. _before), the deterministic variant at N = 8192, 16384,
#                                        an ncu profile at the headline shape (d = 128 and 64);
#                                        tabulated into bwd_ws.csv, bwd_ws_checks.csv
#   measure.sh mta [BIN_DIR] [OUT_DIR]   the MTA kernels: the clear ones' tests, sanitizers, CUPTI
#                                        traffic beside the model, the CLI (also on INPUTS=<dir of
#                                        .npy>), then everything of mta-fast; tabulated into
#                                        mta_checks.csv, mta_traffic.csv and mta-fast's CSVs
#   measure.sh mta-fast [BIN_DIR] [OUT_DIR] the fast MTA forward only: its tests and sanitizers,
#                                        `bench mta` at H = 16, N = 4096 (3x3, 11x11, 6x11; d = 64
#                                        and 128; the clear kernel at 3x3) and the unfused PyTorch
#                                        implementation on the same shapes (mta_torch.py); tabulated
#                                        into mta_fast_checks.csv, mta_fast_worst_errors.csv,
#                                        mta_fast.csv, mta_torch.csv; the linear path forced on and
#                                        off at narrow kernels into mta_fast_linear.csv
#   measure.sh mta-fast-bwd [BIN_DIR] [OUT_DIR] the fast MTA backward and decode: their tests and
#                                        sanitizers, the CLI, `bench mta` fwd, bwd and fwd+bwd at
#                                        H = 16, N = 4096 (3x3, 11x11, 6x11; d = 64 and 128), the
#                                        decode at N = 32k…256k (d = 128, beside a D2D copy of the
#                                        same bytes) and the unfused PyTorch fwd+bwd (d = 64), one run;
#                                        tabulated into mta_fast_bwd_checks.csv,
#                                        mta_fast_bwd_worst_errors.csv, mta_fast_bwd.csv,
#                                        mta_fast_bwd_torch.csv
#   measure.sh mta-decode [BIN_DIR] [OUT_DIR] the split-K decode only (under a minute): its tests
#                                        and sanitizers and `bench mta --pass decode` at N = 32k…256k
#                                        (3x3, 6x11, 11x11; d = 128) beside the D2D copy; tabulated
#                                        into the same CSV files as mta-fast-bwd (decode rows only:
#                                        append them to cuda/results/ to keep the other rows)
#   measure.sh stream [BIN_DIR] [OUT_DIR] the STREAM kernels: tests, sanitizers, CUPTI traffic,
#                                        planted-needle recall at T = 1M (clear and fast kernels),
#                                        `bench stream` beside dense SDPA, the fast estimate's I
#                                        checked launch after launch; tabulated into
#                                        stream_checks.csv, stream_traffic.csv, stream_needles.csv,
#                                        stream_fast.csv, stream_sdpa.csv, stream_fast_ncu.csv,
#                                        stream_fast_estimate.csv
#
# BIN_DIR (default gpu-carry) holds `flashlab` and `test_cuda` built with the cuda preset
# (sm_90 + sm_90a); OUT_DIR (default /tmp/flashlab-measure) must lie outside the tree, because
# raw logs do not belong in it. The recipe, end to end:
#   cmake --preset cuda && cmake --build --preset cuda -j2 --target flashlab test_cuda
#   mkdir -p gpu-carry && cp build/cuda/app/flashlab build/cuda/tests/cuda/test_cuda gpu-carry/
#   git describe --always --dirty --abbrev=7 >gpu-carry/commit
#   (GPU machine)  bash cuda/bench/measure.sh run gpu-carry "$OUT"        # about 4 minutes
#   (here)         append the rows of OUT_DIR/csv/*.csv to cuda/results/ (a run of a build whose
#                  kernels are replaced later moves to cuda/results/archive/, see its README)
#                  cmake --build --preset cpu --target results-pages      # rewrites the tables
# Each CSV row carries the run's date (UTC), device and commit, so rows of several runs can share a
# file; the pages show the newest run of each kernel and, for the headline shape, every run.
# SANITIZE=0 leaves out hopper's and hopper-bwd's compute-sanitizer steps (a re-timing of a build
# whose sanitizer rows come from a run of their own).
set -u

usage() { awk 'NR > 1 && /^set -u/ { exit } NR > 1' "$0" >&2; exit 2; }

# ---------------------------------------------------------------------------------------------
# shared by the modes: the run's date, device and mode, and one log per command
# ---------------------------------------------------------------------------------------------
# begin_logs LOGS MODE: env.txt (date=, device=, commit=, mode= lines) and nvidia-smi's view. The
# commit is the one the binaries were built from: BIN_DIR/commit (written beside them by the recipe
# above, `git describe --always --dirty --abbrev=7`), else this tree's, else "unknown".
begin_logs() {
  mkdir -p "$1"
  export PATH=$PATH:/usr/local/cuda/bin
  local commit
  commit=$(head -1 "${bin:-gpu-carry}/commit" 2>/dev/null || git describe --always --dirty --abbrev=7 2>/dev/null)
  {
    echo "date=$(date -u '+%Y-%m-%d %H:%M')"
    echo "device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    echo "commit=${commit:-unknown}"
    echo "mode=$2"
  } >"$1/env.txt"
  nvidia-smi >"$1/nvidia-smi.txt" 2>&1
}

# step LOG CMD...: run CMD (at most $step_timeout seconds), its stdout into LOG, its stderr into
# LOG.err, the command line into LOG.cmd and the exit status into LOG.rc; a failure sets the
# caller's `status` to 1.
step() {
  local log=$1; shift
  echo "=== $*" | tee "$log.cmd"
  timeout "${step_timeout:-400}" "$@" >"$log" 2>"$log.err"
  local rc=$?
  echo "$rc" >"$log.rc"
  [ "$rc" -eq 0 ] || { echo "    failed: rc=$rc (see $log.err)"; status=1; }
}

# ---------------------------------------------------------------------------------------------
# run: every measurement, one log per command
# ---------------------------------------------------------------------------------------------
run_all() {
  local bin=$1 out=$2 logs=$2/logs status=0
  local step_timeout=400
  begin_logs "$logs" run
  # Correctness: every GPU test case, then the three sanitizers on the small shapes.
  step "$logs/test_cuda.log" "$bin/test_cuda" --durations yes
  for tool in memcheck racecheck synccheck; do
    step "$logs/sanitize_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$bin/test_cuda" '[sanitize],[fast-sanitize],[fast-bwd-sanitize]'
  done
  # Traffic of the clear fp32 kernels, CUPTI beside the model.
  local traffic=("$bin/flashlab" traffic attention --device cuda --heads 16 --dim 64 --block-m 64 --block-n 32)
  for v in fa2 bwd atomic; do
    step "$logs/traffic_$v.csv" "${traffic[@]}" --variant "$v" --seq 4096,8192 --csv
    step "$logs/traffic_${v}_causal.csv" "${traffic[@]}" --variant "$v" --seq 4096 --causal --csv
  done
  step "$logs/traffic_fa1.csv" "${traffic[@]}" --variant fa1 --seq 4096 --csv
  step "$logs/sweep.csv" "${traffic[@]}" --seq 1024,2048,4096,8192,16384 --csv
  # Timings of the fast kernels, each sweep followed by SDPA on the same shapes.
  bench() {  # bench NAME ARGS...: ours, then SDPA's flash and cuDNN backends
    step "$logs/bench_$1.csv" "$bin/flashlab" bench attention --csv "${@:2}"
    step "$logs/sdpa_$1.log" env PYTHONUNBUFFERED=1 python3 cuda/bench/sdpa_bench.py \
      "$logs/bench_$1.csv" --out "$logs/sdpa_$1.csv"
  }
  bench bf16 --fwd-kernel mma --bwd-kernel mma  # mma.sync forward + atomic backward, N = 1k…16k
  bench wgmma --pass fwd --fwd-kernel wgmma    # the sm_90a forward
  bench twokernel --pass bwd --bwd-design two-kernel
  bench fp16 --dtype fp16 --seq 8192
  tabulate "$out" || status=1
  tar czf "$out/measure.tgz" -C "$out" logs csv
  echo "measure: status $status; CSVs in $out/csv"
  return $status
}

# ---------------------------------------------------------------------------------------------
# hopper: the sm_90a forwards (tma-ws against wgmma), a subset of `run`
# ---------------------------------------------------------------------------------------------
run_hopper() {
  local bin=$1 out=$2 logs=$2/logs status=0
  local step_timeout=300
  begin_logs "$logs" hopper
  step "$logs/test_cuda.log" "$bin/test_cuda" '[fast-ws]'
  for tool in memcheck racecheck; do
    [ "${SANITIZE:-1}" = 1 ] || break
    step "$logs/sanitize_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$bin/test_cuda" '[fast-ws][fast-sanitize]'
  done
  local sweep=(--pass fwd --seq 1024,2048,4096,8192,16384)
  step "$logs/bench_tmaws.csv" "$bin/flashlab" bench attention --csv "${sweep[@]}" --fwd-kernel tma-ws
  # wgmma at the headline lengths only (its full sweep is in `run`)
  step "$logs/bench_wgmma.csv" "$bin/flashlab" bench attention --csv --pass fwd --seq 8192,16384 --fwd-kernel wgmma
  step "$logs/sdpa_tmaws.log" env PYTHONUNBUFFERED=1 python3 cuda/bench/sdpa_bench.py \
    "$logs/bench_tmaws.csv" --out "$logs/sdpa_tmaws.csv"
  cp "$logs/sdpa_tmaws.csv" "$logs/sdpa_wgmma.csv"  # the same shapes, timed once in this run
  local metrics=gpu__time_duration.sum,launch__registers_per_thread,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
  metrics+=,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
  metrics+=,sm__inst_issued.avg.pct_of_peak_sustained_active
  for k in tma-ws wgmma; do
    step "$logs/ncu_$k.csv" ncu --csv --kernel-name regex:fwd_kernel --launch-skip 2 --launch-count 1 --metrics "$metrics" \
      "$bin/flashlab" bench attention --pass fwd --seq 8192 --dim 128 --no-causal --reps 20 --warmup 2 --fwd-kernel "$k"
  done
  step "$logs/ncu_tma-ws_d64.csv" ncu --csv --kernel-name regex:fwd_kernel --launch-skip 2 --launch-count 1 \
    --metrics "$metrics" "$bin/flashlab" bench attention --pass fwd --seq 8192 --dim 64 --no-causal --reps 20 --warmup 2 \
    --fwd-kernel tma-ws
  tabulate "$out" >/dev/null || status=1
  tar czf "$out/measure.tgz" -C "$out" logs csv
  echo "measure hopper: status $status"
  return $status
}

# ---------------------------------------------------------------------------------------------
# hopper-bwd: the sm_90a backward (wgmma-ws against the mma.sync atomic kernel)
# ---------------------------------------------------------------------------------------------
run_hopper_bwd() {
  local bin=$1 out=$2 logs=$2/logs status=0
  local step_timeout=300
  begin_logs "$logs" hopper-bwd
  step "$logs/test_cuda.log" "$bin/test_cuda" '[fast-bwd-ws]'
  for tool in memcheck racecheck; do
    [ "${SANITIZE:-1}" = 1 ] || break
    step "$logs/sanitize_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$bin/test_cuda" '[fast-bwd-ws][fast-bwd-sanitize]'
  done
  local sweep=(--pass bwd --seq 1024,2048,4096,8192,16384)
  step "$logs/bench_wgmmaws.csv" "$bin/flashlab" bench attention --csv "${sweep[@]}" --bwd-kernel wgmma-ws
  # Other builds' flashlab (BIN_DIR/flashlab_LABEL, e.g. flashlab_before), the same sweep back to
  # back: their rows are labelled wgmma-ws-LABEL, so the CSV holds every build of one run.
  # (The C example, flashlab_example, and compressed copies are not builds of the CLI.)
  local other label
  is_build() { [ -x "$1" ] && [[ "$1" != *.gz && "${1##*/}" != flashlab_example ]]; }
  for other in "$bin"/flashlab_*; do
    is_build "$other" || continue
    label=${other##*/flashlab_}
    step "$logs/bench_$label.raw" "$other" bench attention --csv "${sweep[@]}" --bwd-kernel wgmma-ws
    sed "s/,wgmma-ws,/,wgmma-ws-$label,/" "$logs/bench_$label.raw" >"$logs/bench_wgmmaws$label.csv"
  done
  step "$logs/sdpa_wgmmaws.log" env PYTHONUNBUFFERED=1 python3 cuda/bench/sdpa_bench.py \
    "$logs/bench_wgmmaws.csv" --out "$logs/sdpa_wgmmaws.csv"
  for other in "$bin"/flashlab_*; do
    is_build "$other" && cp "$logs/sdpa_wgmmaws.csv" "$logs/sdpa_wgmmaws${other##*/flashlab_}.csv"
  done
  # the deterministic variant (fixed dQ order) at the headline lengths
  step "$logs/bench_wgmmawsdet.csv" "$bin/flashlab" bench attention --csv --pass bwd --seq 8192,16384 \
    --bwd-kernel wgmma-ws-det
  cp "$logs/sdpa_wgmmaws.csv" "$logs/sdpa_wgmmawsdet.csv"
  local metrics=gpu__time_duration.sum,launch__registers_per_thread,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
  metrics+=,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
  metrics+=,lts__t_sectors_op_red.sum,smsp__warp_issue_stalled_barrier_per_warp_active.pct
  local d
  for d in 128 64; do  # the wgmma-ws kernel at the headline shape
    step "$logs/ncu_wgmma-ws_d$d.csv" ncu --csv --kernel-name bwd_ws_kernel --launch-skip 2 --launch-count 1 \
      --metrics "$metrics" "$bin/flashlab" bench attention --pass bwd --seq 8192 --dim $d --no-causal --reps 20 \
      --warmup 2 --bwd-kernel wgmma-ws
  done
  tabulate "$out" >/dev/null || status=1
  tar czf "$out/measure.tgz" -C "$out" logs csv
  echo "measure hopper-bwd: status $status"
  return $status
}

# ---------------------------------------------------------------------------------------------
# mta: the clear fp32 MTA kernels — tests, sanitizers, CUPTI traffic beside the model, the CLI
# ---------------------------------------------------------------------------------------------
run_mta() {
  local bin=$1 out=$2 logs=$2/logs status=0
  local step_timeout=200
  begin_logs "$logs" mta
  step "$logs/test_cuda.log" "$bin/test_cuda" '[mta]' --durations yes
  for tool in memcheck racecheck synccheck; do
    step "$logs/sanitize_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/test_cuda" '[mta][sanitize]'
  done
  local traffic=("$bin/flashlab" traffic mta --device cuda --heads 16 --dim 64 --block 64)
  step "$logs/mta_traffic_3x3.txt" "${traffic[@]}" --seq 2048 --splits 8 --cq 3 --ck 3   # the text table
  step "$logs/mta_traffic_3x3.csv" "${traffic[@]}" --seq 2048 --splits 8 --cq 3 --ck 3 --csv
  step "$logs/mta_traffic_6x11.csv" "${traffic[@]}" --seq 2048 --splits 8 --cq 6 --ck 11 --csv
  step "$logs/mta_traffic_infer_32k.csv" "${traffic[@]}" --pass infer --seq 32768 --splits 64 --cq 3 --ck 3 --csv
  # The CLI on seeded inputs (each prints its error against the float64 reference) and, when the
  # environment names a folder INPUTS with q.npy k.npy v.npy do.npy w.npy, on those files.
  local mta=("$bin/flashlab" mta)
  step "$logs/mta_fwd.txt" "${mta[@]}" fwd --device cuda --seq 300 --heads 2 --dim 64 --cq 3 --ck 3 --block 64
  step "$logs/mta_bwd.txt" "${mta[@]}" bwd --device cuda --seq 300 --heads 2 --dim 128 --cq 6 --ck 11 --block 48
  step "$logs/mta_infer.txt" "${mta[@]}" infer --device cuda --seq 1000 --heads 2 --dim 128 --cq 3 --ck 5 \
    --block 32 --splits 6
  if [ -n "${INPUTS:-}" ]; then
    step "$logs/mta_bwd_inputs_cuda.txt" "${mta[@]}" bwd --device cuda --inputs "$INPUTS" --block 32 --save "$logs/gpu_out"
    step "$logs/mta_bwd_inputs_cpu.txt" "${mta[@]}" bwd --device cpu --inputs "$INPUTS" --block 32
  fi
  mta_fast_steps "$bin" "$logs"
  finish "$out" "$status" mta
}

# mta_fast_steps BIN LOGS: the fast MTA forward's tests and sanitizers, `bench mta` at the bar
# shapes (the clear kernel beside it: the source's order, O read-modify-written in HBM) and the
# unfused PyTorch implementation on the same shapes in the same run. Sets the caller's status.
mta_fast_steps() {
  local bin=$1 logs=$2 k
  step_timeout=200 step "$logs/test_cuda_mta_fast.log" "$bin/test_cuda" '[mta-fast]' --durations yes
  for k in memcheck racecheck; do
    step_timeout=150 step "$logs/sanitize_mta_fast_$k.log" compute-sanitizer --tool "$k" --error-exitcode 9 \
      "$bin/test_cuda" '[mta-fast-sanitize]'
  done
  step_timeout=60 step "$logs/mta_fwd_fast.txt" "$bin/flashlab" mta fwd --device cuda --kernel fast --seq 300 \
    --heads 2 --dim 64 --cq 6 --ck 11
  local bench=("$bin/flashlab" bench mta --csv --heads 16 --seq 4096)
  for k in 3x3 11x11 6x11; do
    step_timeout=120 step "$logs/mta_bench_fast_$k.csv" "${bench[@]}" --reps 20 --cq "${k%x*}" --ck "${k#*x}" --dim 64,128
  done
  step_timeout=60 step "$logs/mta_bench_fast_3x3_fp16.csv" "${bench[@]}" --reps 20 --cq 3 --ck 3 --dtype fp16
  # The forward's linear path forced on (1) and off (0) at narrow kernels: what its policy rests on.
  local on
  for k in 3x3 1x1 1x3 6x3 16x3; do
    for on in 0 1; do
      step_timeout=60 step "$logs/mta_linear_${on}_$k.csv" "${bench[@]}" --reps 20 --cq "${k%x*}" --ck "${k#*x}" \
        --dim 64,128 --linear-path "$on"
    done
  done
  step_timeout=120 step "$logs/mta_bench_clear_3x3.csv" "${bench[@]}" --kernel clear --reps 5 --warmup 1 --cq 3 --ck 3
  step_timeout=300 step "$logs/mta_torch.log" env PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/mta_torch.py" \
    "$logs"/mta_bench_fast_{3x3,11x11,6x11}.csv --reps 5 --out "$logs/mta_torch.csv"
}

# mta_fast_bwd_steps BIN LOGS: the fast MTA backward's and decode's tests and sanitizers, the CLI,
# `bench mta` (fwd, bwd, fwd+bwd at the bar shapes; decode at long N) and the unfused PyTorch
# implementation on the d = 64 fwd+bwd shapes in the same run. Sets the caller's status.
mta_fast_bwd_steps() {
  local bin=$1 logs=$2 k p
  step_timeout=200 step "$logs/test_cuda_mta_fast_bwd.log" "$bin/test_cuda" '[mta-fast-bwd],[mta-fast-decode]' \
    --durations yes
  for k in memcheck racecheck; do
    step_timeout=150 step "$logs/sanitize_mta_fast_bwd_$k.log" compute-sanitizer --tool "$k" --error-exitcode 9 \
      "$bin/test_cuda" '[mta-fast-bwd-sanitize],[mta-fast-decode-sanitize]'
  done
  step_timeout=60 step "$logs/mta_bwd_fast.txt" "$bin/flashlab" mta bwd --device cuda --kernel fast --seq 300 \
    --heads 2 --dim 64 --cq 6 --ck 11
  local bench=("$bin/flashlab" bench mta --csv --heads 16)
  for k in 3x3 11x11 6x11; do
    for p in fwd bwd fwd+bwd; do
      step_timeout=120 step "$logs/mta_bwd_bench_${k}_$p.csv" "${bench[@]}" --seq 4096 --dim 64,128 --reps 20 \
        --pass "$p" --cq "${k%x*}" --ck "${k#*x}"
    done
    grep -v ',128,4096,' "$logs/mta_bwd_bench_${k}_fwd+bwd.csv" >"$logs/mta_bwd_torch_in_$k.csv"
  done
  mta_decode_bench "$bin" "$logs"
  step_timeout=300 step "$logs/mta_bwd_torch.log" env PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/mta_torch.py" \
    "$logs"/mta_bwd_torch_in_{3x3,11x11,6x11}.csv --reps 5 --out "$logs/mta_bwd_torch.csv"
}

# mta_decode_bench BIN LOGS: `bench mta --pass decode` at N = 32k…256k, d = 128, H = 16, for the
# kernel sizes the decode is compiled for (each row beside a D2D copy of the same K, V bytes).
mta_decode_bench() {
  local bin=$1 logs=$2 k
  for k in 3x3 6x11 11x11; do
    step_timeout=120 step "$logs/mta_bwd_bench_${k}_decode.csv" "$bin/flashlab" bench mta --csv --heads 16 \
      --pass decode --dim 128 --reps 20 --seq 32768,65536,131072,262144 --cq "${k%x*}" --ck "${k#*x}"
  done
}

# mta_decode_steps BIN LOGS: the decode's tests, its sanitizers on the small shapes, its timings.
mta_decode_steps() {
  local bin=$1 logs=$2 k
  step_timeout=120 step "$logs/test_cuda_mta_fast_decode.log" "$bin/test_cuda" '[mta-fast-decode]' --durations yes
  for k in memcheck racecheck; do
    step_timeout=150 step "$logs/sanitize_mta_fast_decode_$k.log" compute-sanitizer --tool "$k" --error-exitcode 9 \
      "$bin/test_cuda" '[mta-fast-decode-sanitize]'
  done
  mta_decode_bench "$bin" "$logs"
}

run_mta_decode() {
  local bin=$1 out=$2 logs=$2/logs status=0
  begin_logs "$logs" mta-decode
  mta_decode_steps "$bin" "$logs"
  finish "$out" "$status" mta-decode
}

run_mta_fast_bwd() {
  local bin=$1 out=$2 logs=$2/logs status=0
  begin_logs "$logs" mta-fast-bwd
  mta_fast_bwd_steps "$bin" "$logs"
  finish "$out" "$status" mta-fast-bwd
}

run_mta_fast() {
  local bin=$1 out=$2 logs=$2/logs status=0
  begin_logs "$logs" mta-fast
  mta_fast_steps "$bin" "$logs"
  finish "$out" "$status" mta-fast
}

# ---------------------------------------------------------------------------------------------
# stream: the STREAM kernels — tests, sanitizers, CUPTI traffic, planted-needle recall, timings
# ---------------------------------------------------------------------------------------------
run_stream() {
  local bin=$1 out=$2 logs=$2/logs status=0
  begin_logs "$logs" stream
  step_timeout=200 step "$logs/test_cuda.log" "$bin/test_cuda" "[stream],[stream-fast]" -d yes
  step_timeout=150 step "$logs/sanitize_memcheck.log" compute-sanitizer --tool memcheck "$bin/test_cuda" "[stream]~[large]"
  step_timeout=150 step "$logs/sanitize_racecheck.log" compute-sanitizer --tool racecheck "$bin/test_cuda" \
    "cuda stream: sparse apply*,cuda stream: NaN*,*heads are independent*"
  local shape i=0
  for shape in "--seq 32768 --dim 128 --k 16" "--seq 131072 --dim 64 --k 8" "--seq 131072 --dim 128 --k 8" \
               "--seq 131072 --dim 128 --k 8 --heads 2" "--seq 1048576 --dim 128 --k 8 --threads 16"; do
    # shellcheck disable=SC2086 # the shape is a list of flags
    step_timeout=120 step "$logs/stream_traffic_$((i++)).txt" "$bin/flashlab" traffic stream --device cuda $shape \
      --append-csv "$logs/stream_traffic.csv"   # the command appends its rows to that file
  done
  # Planted needles at T = 1M, k = 16: 64 query blocks x 8 needles (512) per kernel and lead-in.
  local lead kernel
  for kernel in clear fast; do
    for lead in lead-in no-lead-in; do
      local flag=(); [ "$lead" = lead-in ] || flag=(--no-lead-in)
      step_timeout=300 step "$logs/stream_needles_${kernel}_$lead.txt" "$bin/flashlab" stream needles --device cuda \
        --kernel "$kernel" --seq 1048576 --dim 128 --block-m 64 --block-n 64 --k 16 --needle-blocks 64 --needles 8 "${flag[@]}"
    done
  done
  step_timeout=60 step "$logs/stream_estimate.txt" "$bin/flashlab" stream estimate --device cuda --seq 20000 --dim 32 \
    --heads 3 --block-m 64 --block-n 32 --k 8 --compare
  stream_timings "$bin" "$logs"
  finish "$out" "$status" stream
}

# The STREAM kernels timed (`flashlab bench stream`: median, L2 flushed) and dense causal SDPA
# (cuDNN and flash backends) at the same T in the same session (cuda/bench/stream_sdpa.py); the
# fast apply's sanitizers on a small case. Rows: bench_stream_*.csv, stream_sdpa.csv.
stream_timings() {
  local bin=$1 logs=$2 tool
  for tool in memcheck racecheck; do
    step_timeout=120 step "$logs/sanitize_fast_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$bin/test_cuda" "[stream-fast-small]"
    step_timeout=120 step "$logs/sanitize_fast_estimate_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$bin/test_cuda" "cuda stream fast: heads*,cuda stream fast: NaN*"
  done
  local bench=("$bin/flashlab" bench stream --csv) sweep=(--seq 32768,65536,131072,262144,524288,1048576 --dim 64,128)
  step_timeout=300 step "$logs/bench_stream_fast.csv" "${bench[@]}" --kernel fast --pass both "${sweep[@]}" --k 8,16,32
  step_timeout=120 step "$logs/bench_stream_long.csv" "${bench[@]}" --kernel fast --pass both --seq 2097152,4194304 \
    --dim 128 --k 8 --reps 10
  # Neighbouring query blocks sharing their K/V loads (--group 2) against one query block per thread block.
  step_timeout=60 step "$logs/bench_stream_group.csv" "${bench[@]}" --kernel fast --pass apply --seq 1048576 --dim 128 \
    --k 8 --group 2
  # Bytes of one fast apply launch per grouping (ncu flushes caches before each replay): what
  # sharing K/V loads between neighbouring query blocks saves at L2 and DRAM.
  local metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum
  metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
  local group
  for group in 1 2; do
    step_timeout=120 step "$logs/ncu_stream_group$group.txt" ncu --csv --kernel-name regex:stream_fast_apply --launch-skip 1 \
      --launch-count 1 --metrics "$metrics" "${bench[@]}" --kernel fast --pass apply --seq 1048576 --dim 128 --k 8 \
      --group "$group" --reps 1 --warmup 1
  done
  step_timeout=200 step "$logs/bench_stream_clear.csv" "${bench[@]}" --kernel clear --seq 32768,1048576 --dim 128 --k 8 \
    --reps 5
  # The fast trace (records of every entry of I, no O) and, beside it at T = 1M, the estimate and the
  # apply; eight heads at once at T = 1M, k = 16 (a layer of 32 heads does not fit as fp32 inputs).
  step_timeout=150 step "$logs/bench_stream_trace.csv" "${bench[@]}" --kernel fast --pass trace \
    --seq 65536,262144,1048576 --dim 64,128 --k 8,16 --reps 10
  step_timeout=150 step "$logs/bench_stream_trace_both.csv" "${bench[@]}" --kernel fast --pass both --seq 1048576 \
    --dim 128 --k 8,16 --reps 10
  step_timeout=150 step "$logs/bench_stream_trace_h8.csv" "${bench[@]}" --kernel fast --pass trace --seq 1048576 \
    --dim 128 --k 16 --heads 8 --reps 5
  # The fast estimate with I downloaded and compared after every launch, then the CUPTI bytes of one
  # launch at the long T: the rows of stream_fast_estimate.csv.
  local check=("${bench[@]}" --kernel fast --pass estimate --check-indices)
  step_timeout=200 step "$logs/stream_fast_estimate_sweep.csv" "${check[@]}" --seq 32768,131072,262144,524288,1048576 \
    --dim 64,128 --k 8,16,32 --reps 20
  step_timeout=200 step "$logs/stream_fast_estimate_traffic.csv" "${check[@]}" --traffic \
    --seq 1048576,2097152,4194304 --dim 128 --k 8 --reps 10
  # Dense SDPA up to T = 1M only: at 4M one dense call takes about 9 s (cuDNN) and 15 s (flash).
  step_timeout=400 step "$logs/stream_sdpa.log" env PYTHONUNBUFFERED=1 python3 cuda/bench/stream_sdpa.py \
    "$logs/bench_stream_fast.csv" --out "$logs/stream_sdpa.csv"
}

# finish OUT STATUS MODE: tabulate, pack the logs, report
finish() {
  local status=$2
  tabulate "$1" >/dev/null || status=1
  tar czf "$1/measure.tgz" -C "$1" logs csv
  echo "measure $3: status $status; CSVs in $1/csv"
  return "$status"
}

# ---------------------------------------------------------------------------------------------
# tabulate: raw logs -> the CSVs of cuda/results/ (names and columns are the generator's input)
# ---------------------------------------------------------------------------------------------
env_value() { sed -n "s/^$1=//p" "$2" | head -1; }

# checks.csv: one row per test or sanitizer command: its exit status and Catch2's summary.
tab_checks() {
  local logs=$1 date=$2 device=$3
  echo "date,device,command,status,assertions,test_cases,sanitizer_errors"
  for log in "$logs"/test_cuda*.log "$logs"/sanitize_*.log; do
    [ -f "$log" ] || continue
    local cmd rc
    cmd=$(sed -n '1s/^=== //p' "$log.cmd" 2>/dev/null | sed 's|^[^ ]*/||; s|compute-sanitizer \(.*\) [^ ]*/test_cuda|compute-sanitizer \1 test_cuda|')
    rc=$(cat "$log.rc" 2>/dev/null || echo "")
    awk -v date="$date" -v device="$device" -v cmd="$cmd" -v rc="$rc" '
      /All tests passed \(/ { split($0, a, /[(]/); split(a[2], b, / /); asserts = b[1]; cases = b[4]; ok = 1 }
      /test cases:.*failed/ { ok = 0 }
      /^assertions:/ { asserts = $2 }
      /^test cases:/ { cases = $3 }
      /ERROR SUMMARY: [0-9]+ error/ { san += $4 }
      /RACECHECK SUMMARY: [0-9]+ hazard/ { san += $4 }
      END {
        status = (rc == "" ? (ok ? "pass" : "fail") : (rc == 0 ? "pass" : "fail (rc " rc ")"))
        gsub(/"/, "\"\"", cmd)
        printf "%s,%s,\"%s\",%s,%s,%s,%s\n", date, device, cmd, status, asserts, cases, (san == "" ? "" : san + 0)
      }' "$log"
  done
}

# worst_errors.csv: the "[tag] worst ..." lines the GPU tests print, one row per quantity.
tab_worst_errors() {
  local log=$1 date=$2 device=$3
  echo "date,device,group,quantity,worst_error,tolerance,where"
  [ -f "$log" ] || return 0
  awk -v date="$date" -v device="$device" '
    function row(group, qty, err, tol, where) {
      gsub(/"/, "\"\"", where)
      printf "%s,%s,%s,%s,%s,%s,\"%s\"\n", date, device, group, qty, err, tol, where
    }
    /^\[[^]]*\] worst / {
      group = substr($0, 2, index($0, "]") - 2); rest = substr($0, index($0, "]") + 2)
      if (rest ~ /^worst error max/) {               # clear kernels: one error over all outputs
        match(rest, /= [0-9.e+-]+/); err = substr(rest, RSTART + 2, RLENGTH - 2)
        where = rest; sub(/^.* at /, "", where); sub(/ \(tolerance.*$/, "", where)
        match(rest, /tolerance [0-9.e+-]+/); tol = substr(rest, RSTART + 10, RLENGTH - 10)
        row(group, "all outputs", err, tol, where)
        next
      }
      n = split(rest, parts, /, worst /)
      for (i = 1; i <= n; ++i) {                     # fast kernels: "worst O error E (tolerance T)"
        p = parts[i]; sub(/^worst /, "", p)
        qty = p; sub(/ error .*$/, "", qty)
        match(p, /error [0-9.e+-]+/); err = substr(p, RSTART + 6, RLENGTH - 6)
        match(p, /tolerance [0-9.e+-]+/); tol = substr(p, RSTART + 10, RLENGTH - 10)
        row(group, qty, err, tol, "")
      }
    }' "$log"
}

# traffic_kernels.csv / traffic_sweep.csv: `flashlab traffic attention --csv` rows, date and device first.
tab_traffic() {
  local date=$1 device=$2; shift 2
  local first=1
  for f in "$@"; do
    [ -f "$f" ] || continue
    awk -F, -v date="$date" -v device="$device" -v first="$first" '
      /^variant,/ { if (first == 1) print "date,device," $0; next }
      NF > 8 { print date "," device "," $0 }' "$f"
    first=0
  done
  [ $first -eq 0 ] || echo "date,device"
}

# fast_attention.csv: our timings (bench_X.csv) joined with SDPA's (sdpa_X.csv) on pass, d, causal, N.
tab_fast() {
  local logs=$1 date=$2 device=$3
  echo "date,device,dtype,pass,kernel,d,causal,N,H,B,median_ms,min_ms,max_ms,tflops,fa2_bnhd_tflops,fa2_bhnd_tflops,cudnn_bnhd_tflops,cudnn_bhnd_tflops"
  for ours in "$logs"/bench_*.csv; do
    [ -f "$ours" ] || continue
    local sdpa=${ours%/bench_*}/sdpa_${ours##*/bench_}
    if [ ! -f "$sdpa" ]; then   # a sweep timed without SDPA: its columns stay empty
      sdpa=$(mktemp)
      echo "pass,d,causal,N" >"$sdpa"
    fi
    awk -F, -v date="$date" -v device="$device" '
      FNR == 1 { delete col; for (i = 1; i <= NF; ++i) col[$i] = i; file++; next }
      function get(name) { return (name in col) ? $col[name] : "" }
      function key(p) { return (p == "" ? "fwd" : p) SUBSEP get("d") SUBSEP get("causal") SUBSEP get("N") }
      file == 1 && NF > 1 {                                   # SDPA (read first)
        k = key(get("pass"))
        fa2b[k] = get("flash_bnhd_tflops"); fa2h[k] = get("flash_bhnd_tflops")
        cub[k] = get("cudnn_bnhd_tflops"); cuh[k] = get("cudnn_bhnd_tflops")
        next
      }
      file == 2 && NF > 1 {                                   # ours
        p = get("pass"); if (p == "") p = "fwd"
        kernel = (p == "fwd") ? get("fwd_kernel") : get("bwd_design")
        if (kernel == "") kernel = (p == "fwd") ? "mma" : "two-kernel"
        k = key(p)
        printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", date, device, get("dtype"), p,
               kernel, get("d"), get("causal"), get("N"), get("H"), get("B"), get("ms"), get("min_ms"),
               get("max_ms"), get("tflops"), fa2b[k], fa2h[k], cub[k], cuh[k]
      }' "$sdpa" "$ours"
    [ "$sdpa" = "${ours%/bench_*}/sdpa_${ours##*/bench_}" ] || rm -f "$sdpa"
  done
}

# prefix_csv DATE DEVICE FILE...: the CSV files of one command, concatenated under the first file's
# header, date and device first (the later files' header lines are dropped).
prefix_csv() {
  local date=$1 device=$2; shift 2
  local first=1 f
  for f in "$@"; do
    [ -f "$f" ] || continue
    awk -v date="$date" -v device="$device" -v first="$first" '
      FNR == 1 { if (first == 1) print "date,device," $0; next }
      NF > 0 { print date "," device "," $0 }' "$f"
    first=0
  done
  [ $first -eq 0 ] || echo "date,device"
}

# stream_needles.csv: the two lines `flashlab stream needles` prints, one row per command (kernel: cpu
# for the reference).
tab_needles() {
  local logs=$1 date=$2 device=$3
  echo "date,device,T,d,bq,bk,k,needle_blocks,needles_per_block,lead_in,kernel,found,planted"
  for log in "$logs"/stream_needles_*.txt; do
    [ -f "$log" ] || continue
    awk -v date="$date" -v device="$device" '
      function field(name,   v) { v = $0; sub(".*" name "=", "", v); sub(/ .*/, "", v); return v }
      /^needles: / { shape = field("T") "," field(" d") "," field("b_q") "," field("b_k") "," field(" k") "," \
                       field("needle blocks") "," field("needles per block") "," field("lead-in") "," \
                       ($0 ~ / kernel=/ ? field(" kernel") : "cpu") }
      /^recall / { split($2, fp, "/"); print date "," device "," shape "," fp[1] "," fp[2] }' "$log"
  done
}

# tab_mta_fast LOGS DATE DEVICE CSV_DIR: the fast MTA forward's worst errors, `bench mta` rows
# (fast and clear) and the PyTorch rows, date and device first.
tab_mta_fast() {
  tab_worst_errors "$1/test_cuda_mta_fast.log" "$2" "$3" >"$4/mta_fast_worst_errors.csv"
  # `bench mta --csv` also prints the decode's read_tbps and copy_tbps after tflops: the forward's
  # files keep their columns, up to tflops.
  prefix_csv "$2" "$3" "$1"/mta_bench_*.csv | cut -d, -f1-15 >"$4/mta_fast.csv"
  prefix_csv "$2" "$3" "$1/mta_torch.csv" >"$4/mta_torch.csv"
  local f on
  echo "date,device,linear_path,kernel,dtype,pass,cq,ck,d,N,H,B,ms,min_ms,max_ms,tflops" >"$4/mta_fast_linear.csv"
  for f in "$1"/mta_linear_*.csv; do
    [ -f "$f" ] || continue
    on=${f##*/mta_linear_}; on=${on%%_*}
    prefix_csv "$2" "$3,$on" "$f" | tail -n +2 | cut -d, -f1-16 >>"$4/mta_fast_linear.csv"
  done
}

# stream_fast_ncu.csv: ncu's metrics of the fast apply at T = 1M, one row per grouping and metric.
tab_stream_ncu() {
  local logs=$1 date=$2 device=$3 log
  echo "date,device,T,d,k,group,metric,unit,value"
  for log in "$logs"/ncu_stream_group*.txt; do
    [ -f "$log" ] || continue
    local group=${log##*group}; group=${group%.txt}
    awk -F'","' -v date="$date" -v device="$device" -v group="$group" '
      NF > 10 && $0 ~ /stream_fast_apply/ { v = $NF; gsub(/[",]/, "", v); u = $(NF - 1)
        print date "," device ",1048576,128,8," group "," $(NF - 2) "," u "," v }' "$log"
  done
}

# tab_mta_fast_bwd LOGS DATE DEVICE CSV_DIR: the fast MTA backward's worst errors, its `bench mta`
# rows (fwd, bwd, fwd+bwd, decode) and the PyTorch rows of the same run, date and device first.
tab_mta_fast_bwd() {
  local log=$1/test_cuda_mta_fast_bwd.log
  [ -f "$log" ] || log=$1/test_cuda_mta_fast_decode.log  # mode mta-decode
  tab_worst_errors "$log" "$2" "$3" >"$4/mta_fast_bwd_worst_errors.csv"
  prefix_csv "$2" "$3" "$1"/mta_bwd_bench_*.csv >"$4/mta_fast_bwd.csv"
  prefix_csv "$2" "$3" "$1/mta_bwd_torch.csv" | tr -d '\r' >"$4/mta_fast_bwd_torch.csv"  # csv.writer ends lines with CRLF
}

tabulate() {
  local out=$1 logs=$1/logs
  [ -f "$logs/env.txt" ] || { echo "measure: $logs/env.txt missing (date=…, device=… lines)" >&2; return 1; }
  local date device mode
  date=$(env_value date "$logs/env.txt")
  device=$(env_value device "$logs/env.txt")
  mode=$(env_value mode "$logs/env.txt")
  local commit
  commit=$(env_value commit "$logs/env.txt")
  mkdir -p "$out/csv"
  case "${mode:-run}" in
    mta)
      tab_checks "$logs" "$date" "$device" >"$out/csv/mta_checks.csv"
      prefix_csv "$date" "$device" "$logs"/mta_traffic_{3x3,6x11,infer_32k}.csv >"$out/csv/mta_traffic.csv"
      tab_mta_fast "$logs" "$date" "$device" "$out/csv" ;;
    mta-fast-bwd|mta-decode)
      tab_checks "$logs" "$date" "$device" >"$out/csv/mta_fast_bwd_checks.csv"
      tab_mta_fast_bwd "$logs" "$date" "$device" "$out/csv" ;;
    mta-fast)
      tab_checks "$logs" "$date" "$device" >"$out/csv/mta_fast_checks.csv"
      tab_mta_fast "$logs" "$date" "$device" "$out/csv" ;;
    hopper-bwd)
      tab_checks "$logs" "$date" "$device" >"$out/csv/bwd_ws_checks.csv"
      tab_fast "$logs" "$date" "$device" >"$out/csv/bwd_ws.csv" ;;
    stream)
      tab_checks "$logs" "$date" "$device" >"$out/csv/stream_checks.csv"
      prefix_csv "$date" "$device" "$logs/stream_traffic.csv" >"$out/csv/stream_traffic.csv"
      tab_needles "$logs" "$date" "$device" >"$out/csv/stream_needles.csv"
      prefix_csv "$date" "$device" "$logs"/bench_stream_{fast,long,group,clear}.csv >"$out/csv/stream_fast.csv"
      prefix_csv "$date" "$device" "$logs/stream_sdpa.csv" >"$out/csv/stream_sdpa.csv"
      tab_stream_ncu "$logs" "$date" "$device" >"$out/csv/stream_fast_ncu.csv"
      prefix_csv "$date" "$device" "$logs"/stream_fast_estimate_{sweep,traffic}.csv \
        >"$out/csv/stream_fast_estimate.csv"
      prefix_csv "$date" "$device" "$logs"/bench_stream_trace{,_both,_h8}.csv >"$out/csv/stream_fast_trace.csv" ;;
    *)
      tab_checks "$logs" "$date" "$device" >"$out/csv/checks.csv"
      tab_worst_errors "$logs/test_cuda.log" "$date" "$device" >"$out/csv/worst_errors.csv"
      local v kernels=()
      for v in fa2 fa2_causal fa1 bwd bwd_causal atomic atomic_causal; do kernels+=("$logs/traffic_$v.csv"); done
      tab_traffic "$date" "$device" "${kernels[@]}" >"$out/csv/traffic_kernels.csv"
      tab_traffic "$date" "$device" "$logs/sweep.csv" >"$out/csv/traffic_sweep.csv"
      tab_fast "$logs" "$date" "$device" >"$out/csv/fast_attention.csv" ;;
  esac
  add_commit "$out/csv" "${commit:-unknown}"
  wc -l "$out"/csv/*.csv
}

# add_commit CSV_DIR COMMIT: the commit column after date and device in every CSV of the run (the
# first two fields never hold a comma).
add_commit() {
  local f
  for f in "$1"/*.csv; do
    sed -E -i "1s/^([^,]*,[^,]*)(,|$)/\1,commit\2/; 2,\$s/^([^,]*,[^,]*)(,|$)/\1,$2\2/" "$f"
  done
}

case "${1:-}" in
  run) run_all "${2:-gpu-carry}" "${3:-/tmp/flashlab-measure}" ;;
  tabulate) [ $# -eq 2 ] || usage; tabulate "$2" ;;
  hopper) run_hopper "${2:-gpu-carry}" "${3:-/tmp/flashlab-measure}" ;;
  hopper-bwd) run_hopper_bwd "${2:-gpu-carry}" "${3:-/tmp/flashlab-measure}" ;;
  mta) run_mta "${2:-gpu-carry}" "${3:-/tmp/flashlab-measure}" ;;
  mta-fast) run_mta_fast "${2:-gpu-carry}" "${3:-/tmp/flashlab-measure}" ;;
  mta-fast-bwd) run_mta_fast_bwd "${2:-gpu-carry}" "${3:-/tmp/flashlab-measure}" ;;
  mta-decode) run_mta_decode "${2:-gpu-carry}" "${3:-/tmp/flashlab-measure}" ;;
  stream) run_stream "${2:-gpu-carry}" "${3:-/tmp/flashlab-measure}" ;;
  *) usage ;;
esac
