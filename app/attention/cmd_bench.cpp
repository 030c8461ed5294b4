// `flashlab bench attention`: times the fast tensor-core forward (--fwd-kernel: mma.sync in
// cuda/src/attention/attention_fwd_tc.cu, wgmma in attention_fwd_wgmma.cu, tma-ws in attention_fwd_ws.cu,
// splitkv in attention_fwd_splitkv.cu)
// and/or backward (--bwd-design: the atomic one, the default, in attention_bwd_tc_atomic.cu or,
// with --bwd-kernel wgmma-ws, attention_bwd_ws.cu; two-kernel in attention_bwd_tc.cu) over a
// sweep of shapes and prints ms, TFLOP/s and effective GB/s per shape and pass.
// Flags are parsed and checked in every build; the timing itself is
// flashlab::cuda::bench_attention (cuda/src/attention/bench.cpp), compiled only with CUDA
// (FLASHLAB_HAVE_CUDA). Formatting only here.
#include "attention/attention_flags.hpp"
#include "core/commands.hpp"
#include "core/gpu_flags.hpp"
#include "core/report.hpp"
#include "core/shared_flags.hpp"

#ifdef FLASHLAB_HAVE_CUDA
#include "flashlab/cuda/bench.hpp"
#include "flashlab/cuda/options.hpp"
#endif
#ifdef FLASHLAB_HAVE_RING
#include "flashlab/cuda/context_parallel.hpp"
#endif

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <tuple>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashlab::app {

namespace {

constexpr const char* kUsageLine =
    "bench attention [--seq N[,N2,...]] [--dim D[,D2]] [--heads H] [--heads-kv HKV] [--seq-k NK] [--batch B]\n"
    "                       [--causal | --no-causal | --both] [--window L,R] [--cu-seqlens FILE]\n"
    "                       [--pass fwd|bwd|both] [--bwd-design atomic|two-kernel] [--fwd-kernel mma|wgmma|tma-ws|splitkv]\n"
    "                       [--bwd-kernel mma|wgmma-ws|wgmma-ws-det] [--dtype bf16|fp16] [--kv-copy] [--flush-dirty]\n"
    "                       [--reps R] [--warmup W]\n"
    "                       [--gpus G[,G2,...] [--scaling strong|weak] [--layout zigzag|contiguous] [--no-single]]\n"
    "                       [--json|--csv]";
constexpr const char* kSummary =
    "Times the fast tensor-core attention forward and/or backward on the GPU (bf16/fp16 in, fp32\n"
    "accumulation) for every (d, causal, N) of the sweep. Per shape and pass: W warm-up launches,\n"
    "then R launches each timed alone with CUDA events, L2 flushed before each (a 256 MiB memset,\n"
    "then a read of the same buffer, so the launch starts on clean lines and writes back only its\n"
    "own; --flush-dirty: the memset alone, whose dirty lines the launch then writes back),\n"
    "inputs rotated over 3 sets. A backward launch is every kernel of its design (--bwd-design:\n"
    "atomic = dQ accumulator zeroing, D preprocessing, one kernel per K/V block with fp32 dQ atomics,\n"
    "dQ conversion; two-kernel = D preprocessing, dQ kernel, dK/dV kernel) on the O and LSE of a\n"
    "real forward, run once per input set before timing. Prints the median,\n"
    "min and max ms, TFLOP/s = 4·N²·d·H·B / median for fwd, 2.5 × that for bwd (halved for causal)\n"
    "and effective GB/s = ideal HBM bytes / median (fwd: Q, K, V, O, LSE; bwd: Q, K, V, O, dO, dQ,\n"
    "dK, dV, LSE, D; a lower bound on traffic: tiles are re-read). Default sweep:\n"
    "N = 1024…16384, d = 64 and 128 (--dim takes 64, 128 and 256), H = 16, B = 1, causal and not,\n"
    "both passes. --heads-kv and --seq-k time grouped K/V and N_k != N, every N of the sweep against\n"
    "NK keys (causal bottom-right aligned; TFLOP/s count the visible query-key pairs). --window L,R\n"
    "times a sliding window. The backward takes those three on the two-kernel design and the atomic\n"
    "design's mma and wgmma-ws kernels (and at d = 256 on wgmma-ws-det). Query i sees\n"
    "key j iff i + NK - N - L <= j <= i + NK - N + R (-1 unbounded, causal caps R at 0); its TFLOP/s\n"
    "count the pairs inside the band, 4 d H B times the sum over the N queries of the keys each sees\n"
    "(the area the mask leaves, not the tiles a kernel loads). --cu-seqlens FILE times packed\n"
    "variable-length sequences (the forward, and with --pass bwd or both the backward: every design and\n"
    "kernel but --bwd-kernel wgmma-ws-det takes them, at d = 64 and 128; the file format of flashlab\n"
    "attention fwd --cu-seqlens: a line 'cu_seqlens_q = 0 3 3 10', and 'cu_seqlens_k = ...' when the keys differ):\n"
    "one shape per d and mask, Q [total_q, H, d], the lists in device memory; its sequences replace\n"
    "--seq, --seq-k and --batch (N prints the longest), and its TFLOP/s count each sequence's own\n"
    "visible pairs (4 d H times their sum: the real work, none for padding). --kv-copy also times, per forward\n"
    "shape and the same way, a device-to-device copy of K and V's bytes: the row then states K and\n"
    "V's read rate beside the copy's (read + write) rate. --json and --csv print one row per shape\n"
    "and pass, as each is timed, with the keys dtype,pass,d,causal,N,H,B,ms,min_ms,max_ms,tflops,\n"
    "gbps,bwd_design,fwd_kernel,H_kv,N_k,kv_read_tbps,copy_tbps,window_left,window_right,total_q,\n"
    "total_k (bwd_design: atomic, two-kernel, or wgmma-ws / wgmma-ws-det, the atomic design on those\n"
    "kernels; kv_read_tbps and copy_tbps 0 without --kv-copy; a window side -1 when unbounded;\n"
    "total_q and total_k the packed rows with --cu-seqlens, else 0); the CSV feeds\n"
    "cuda/bench/sdpa_bench.py (PyTorch SDPA, same shapes and passes; enable_gqa for grouped K/V; rows\n"
    "with a window are not compared there).\n"
    "--gpus times context-parallel (ring) attention instead: the sequence cut among G GPUs of this\n"
    "machine (zigzag when causal), K/V passed around a ring over NCCL while the fast kernels work, one\n"
    "process driving every GPU; per (G, d, causal, N) and pass the median of the slowest rank's whole\n"
    "ring over R runs after W warm-ups, TFLOP/s per GPU, the bytes one GPU handed to NCCL beside the\n"
    "model's, the longest exchange and step, and the time the compute did not cover (defaults there:\n"
    "1 warm-up, 5 timed runs; --reps at least 3). --scaling strong\n"
    "keeps N the whole sequence for every G; weak makes it G x N (N rows per GPU). Beside it, once per\n"
    "shape, one GPU's fast kernels on the whole problem (unless --no-single, or B N H d reaches 2^31):\n"
    "strong_efficiency = their time / (G x the ring's). --json/--csv rows: gpus,layout,causal,N,B,H,\n"
    "H_kv,d,dtype,pass,kernel,ring_ms,ring_min_ms,ring_max_ms,ring_tflops_per_gpu,single_ms,\n"
    "single_tflops,strong_efficiency,model_bytes_per_gpu,counted_bytes_per_gpu,counted_equals_model,\n"
    "max_exchange_ms,max_step_compute_ms,exposed_ms (-1: not measured). Needs NCCL in the build.\n"
    "Needs a build with CUDA and an NVIDIA GPU.";

po::options_description options() {
  po::options_description d("Options");
  d.add_options()("help,h", "show this help")
      ("seq", po::value<std::string>()->default_value("1024,2048,4096,8192,16384"), "sequence lengths N, comma separated")
      ;
  add_dim_list_option(d, "64,128");
  d.add_options()
      ("heads", po::value<long long>()->default_value(16), "H, number of heads")
      ("heads-kv", po::value<long long>(), "H_kv, K/V heads dividing H (default H; the backward: not on --bwd-kernel wgmma-ws-det at d = 64 and 128)")
      ("seq-k", po::value<long long>(), "N_k, keys of every shape (default N; the backward: not on --bwd-kernel wgmma-ws-det at d = 64 and 128)")
      ("batch", po::value<long long>()->default_value(1), "B, batch size")
      ;
  add_window_option(d, " (the backward: not on --bwd-kernel wgmma-ws-det at d = 64 and 128)");
  d.add_options()
      ("cu-seqlens", po::value<std::string>(),
       "FILE with cu_seqlens_q (and cu_seqlens_k): time packed variable-length sequences, the forward unless "
       "--pass bwd or both (- reads standard input)")
      ("causal", po::bool_switch(), "causal only")
      ("no-causal", po::bool_switch(), "non-causal only")
      ("both", po::bool_switch(), "causal and non-causal (the default)")
      ("pass", po::value<std::string>()->default_value("both"), "fwd | bwd | both: the passes to time")
      ("bwd-design", po::value<std::string>()->default_value("atomic"),
       "atomic | two-kernel: the backward design to time (default atomic, the faster on H100)")
      ("fwd-kernel", po::value<std::string>()->default_value("auto"),
       "auto | mma | wgmma | tma-ws | splitkv: the forward kernel to time (auto, the default: the front "
       "door's choice per shape, splitkv for few query rows, else the fastest this build runs on the device, "
       "tma-ws on an H100/H200, else mma; mma.sync; Hopper's wgmma; wgmma fed by TMA with warp "
       "specialisation, these two sm_90a; split-KV, mma.sync, for few query rows against many keys)")
      ("bwd-kernel", po::value<std::string>()->default_value("auto"),
       "auto | mma | wgmma-ws | wgmma-ws-det: the kernel of the atomic backward design (auto, the default: "
       "the fastest this build runs on the device, wgmma-ws on an H100/H200, else mma; mma.sync; TMA + warp "
       "specialisation + wgmma, sm_90a; the same with dQ summed in a fixed order, bit-reproducible). The "
       "two-kernel design runs on mma only")
      ;
  d.add_options()
      ("gpus", po::value<std::string>(), "G[,G2,...]: context-parallel (ring) attention over G GPUs of this machine")
      ("scaling", po::value<std::string>(), "with --gpus: strong (N the whole sequence, the default) | weak (N per GPU)")
      ("layout", po::value<std::string>(), "with --gpus: zigzag | contiguous (default: zigzag when causal, else contiguous)")
      ("no-single", po::bool_switch(), "with --gpus: skip one GPU's fast kernels on the whole problem")
      ;
  add_dtype_option(d, "bf16 | fp16", "bf16");
  d.add_options()
      ("kv-copy", po::bool_switch(), "also time a D2D copy of K and V's bytes per forward shape (the copy-bandwidth anchor)")
      ("flush-dirty", po::bool_switch(),
       "flush L2 by the 256 MiB memset alone, leaving its dirty lines for the timed launch to write back "
       "(the default reads the buffer back first): to compare with timings taken that way")
      ("reps", po::value<long long>()->default_value(30),
       "timed launches per shape (at least 20; with --gpus timed rings, at least 3, default 5)")
      ("warmup", po::value<long long>()->default_value(3), "untimed launches per shape before timing");
  add_output_options(d);
  return d;
}

/// Timed rings per shape with --gpus when --reps is not given.
constexpr int kRingReps = 5;

/// Everything the sweep needs, checked.
struct Sweep {
  std::vector<int> seqs, dims;
  std::vector<bool> causal;
  int heads = 16, batch = 1, reps = 30, warmup = 3;
  int heads_kv = 0, seq_k = 0;  // --heads-kv, --seq-k (0: H, N)
  int window_left = -1, window_right = -1;  // --window (-1: unbounded)
  bool fwd = true, bwd = true;  // passes to time (--pass)
  bool fp16 = false;
  OutputFormat format = OutputFormat::text;  // --json / --csv
  bool bwd_atomic = true;  // --bwd-design
  bool kv_copy = false;    // --kv-copy
  bool flush_dirty = false;  // --flush-dirty
  std::string fwd_kernel = "auto";  // --fwd-kernel
  std::string bwd_kernel = "auto";  // --bwd-kernel
  std::vector<int> gpus;  // --gpus: the ring on each G (empty: one GPU's kernels)
  bool weak = false;      // --scaling weak: N rows per GPU
  std::string layout;     // --layout ("": by causality)
  bool single = true;     // !--no-single
  std::optional<flashlab::ref::PackedSequences> packed;  // --cu-seqlens
};

// --gpus and the flags that go with it; a flag the ring has no use for is refused by name.
void parse_ring_flags(const po::variables_map& vm, Sweep& s) {
  const bool ring = vm.count("gpus") > 0;
  for (const char* f : {"scaling", "layout"})
    if (vm.count(f) && !ring) throw UsageError(std::string("--") + f + " is for --gpus", "add --gpus G, or drop it");
  if (vm["no-single"].as<bool>() && !ring) throw UsageError("--no-single is for --gpus", "add --gpus G, or drop it");
  if (!ring) return;
  s.gpus = sweep_list("gpus", vm["gpus"].as<std::string>(), 1, 64, "1,2,4");
  const std::string scaling = vm.count("scaling") ? vm["scaling"].as<std::string>() : "strong";
  if (scaling != "strong" && scaling != "weak")
    throw UsageError("--scaling '" + scaling + "' is unknown", "strong (N the whole sequence) or weak (N per GPU)");
  s.weak = scaling == "weak";
  if (vm.count("layout")) {
    s.layout = vm["layout"].as<std::string>();
    if (s.layout != "zigzag" && s.layout != "contiguous")
      throw UsageError("--layout '" + s.layout + "' is unknown", "zigzag (balanced causal work) or contiguous");
  }
  s.single = !vm["no-single"].as<bool>();
  const auto refuse = [](const std::string& flag, const std::string& hint) {
    throw UsageError(flag + " does not go with --gpus: the ring runs dense self-attention on the fastest kernels",
                     hint);
  };
  if (s.seq_k > 0) refuse("--seq-k", "drop it (the ring is self-attention)");
  if (s.window_left >= 0 || s.window_right >= 0) refuse("--window", "drop it (the ring takes no window)");
  if (s.kv_copy) refuse("--kv-copy", "drop it");
  if (s.flush_dirty) refuse("--flush-dirty", "drop it (the ring is timed without an L2 flush)");
  if (s.packed) refuse("--cu-seqlens", "drop it (the ring takes dense batches)");
  if (s.fwd_kernel != "auto" || s.bwd_kernel != "auto" || !s.bwd_atomic)
    refuse("--fwd-kernel/--bwd-kernel/--bwd-design", "leave them at their defaults");
}

Sweep parse_sweep(const po::variables_map& vm) {
  Sweep s;
  s.seqs = sweep_list("seq", vm["seq"].as<std::string>(), 1, 1 << 20, "1024,2048,4096");
  s.dims = sweep_list("dim", vm["dim"].as<std::string>(), 1, 4096, "64,128");
  s.heads = int_flag(vm, "heads", 1, 4096);
  if (vm.count("heads-kv")) s.heads_kv = int_flag(vm, "heads-kv", 1, 4096);
  if (vm.count("seq-k")) s.seq_k = int_flag(vm, "seq-k", 1, 1 << 20);
  if (s.heads_kv > 0 && s.heads % s.heads_kv != 0)
    throw UsageError("--heads-kv " + std::to_string(s.heads_kv) + " does not divide --heads " + std::to_string(s.heads),
                     "each K/V head serves H / H_kv query heads: e.g. --heads 32 --heads-kv 8");
  {
    flashlab::ref::AttentionProblem w;
    window_flag(vm, w);
    s.window_left = int(w.window_left);
    s.window_right = int(w.window_right);
  }
  s.batch = int_flag(vm, "batch", 1, 4096);
  // A ring of a long sequence takes seconds and varies little between runs: --gpus times fewer.
  const bool ring = vm.count("gpus") > 0;
  s.reps = ring && vm["reps"].defaulted() ? kRingReps : int_flag(vm, "reps", ring ? 3 : 20, 100000);
  s.warmup = ring && vm["warmup"].defaulted() ? 1 : int_flag(vm, "warmup", 0, 100000);
  const bool c = vm["causal"].as<bool>(), nc = vm["no-causal"].as<bool>(), both = vm["both"].as<bool>();
  if (int(c) + int(nc) + int(both) > 1)
    throw UsageError("--causal, --no-causal and --both exclude each other", "give at most one (default: --both)");
  if (c) s.causal = {true};
  else if (nc) s.causal = {false};
  else s.causal = {false, true};
  std::string pass = vm["pass"].as<std::string>();
  if (pass != "fwd" && pass != "bwd" && pass != "both")
    throw UsageError("--pass '" + pass + "' is unknown", "choose fwd, bwd or both (the default)");
  if (vm.count("cu-seqlens")) {
    // The file's sequences replace the sweep's lengths and batch; the forward alone takes them.
    for (const char* flag : {"seq", "seq-k", "batch"})
      if (vm.count(flag) && !vm[flag].defaulted())
        throw UsageError(std::string("--") + flag + " conflicts with --cu-seqlens",
                         std::string("with packed sequences the lengths come from the file; drop --") + flag);
    if (vm["pass"].defaulted()) pass = "fwd";  // packed sequences time the forward unless told
    s.packed = read_cu_seqlens(vm["cu-seqlens"].as<std::string>());
  }
  s.fwd = pass != "bwd";
  s.bwd = pass != "fwd";
  for (int d : s.dims)
    require_fast_dim(std::size_t(d), s.packed.has_value(), "flashlab attention fwd takes any d on the CPU");
  const std::string design = vm["bwd-design"].as<std::string>();
  if (design != "atomic" && design != "two-kernel")
    throw UsageError("--bwd-design '" + design + "' is unknown", "choose atomic (the default) or two-kernel");
  s.bwd_atomic = design == "atomic";
  const std::string fk = vm["fwd-kernel"].as<std::string>();
  if (fk != "auto" && fk != "mma" && fk != "wgmma" && fk != "tma-ws" && fk != "splitkv")
    throw UsageError("--fwd-kernel '" + fk + "' is unknown", "choose auto (the default), mma, wgmma, tma-ws or splitkv");
  s.fwd_kernel = fk;
  const std::string bk = bwd_kernel_flag(vm["bwd-kernel"].as<std::string>());
  if (bk.rfind("wgmma-ws", 0) == 0 && !s.bwd_atomic)
    throw UsageError("--bwd-kernel " + bk + " runs the atomic design only", "drop --bwd-design two-kernel");
  s.bwd_kernel = bk;
  // d = 256: the atomic design's mma, wgmma-ws and wgmma-ws-det kernels alone.
  if (s.bwd && !s.bwd_atomic)
    for (int d : s.dims)
      if (d == 256)
        throw UsageError("--dim 256: the fast backward at d = 256 is the atomic design's mma, wgmma-ws or "
                         "wgmma-ws-det kernel, not --bwd-design two-kernel",
                         "--bwd-design atomic with --bwd-kernel auto, mma or wgmma-ws, or wgmma-ws-det for "
                         "bit-reproducible gradients, or add --pass fwd");
  if (s.bwd && s.bwd_atomic && bk == "wgmma-ws-det")
    require_det_backward({s.dims, s.seqs, std::size_t(s.heads), std::size_t(s.heads_kv), std::size_t(s.seq_k),
                          s.window_left, s.window_right, s.packed.has_value()},
                         "use --bwd-design two-kernel (deterministic too), or --bwd-kernel auto, mma or wgmma-ws, or "
                         "--dim 256 alone, or add --pass fwd",
                         "use --bwd-design two-kernel (deterministic too), or --bwd-kernel auto, mma or wgmma-ws, or "
                         "--pass fwd");
  s.fp16 = fp16_dtype(vm["dtype"].as<std::string>());
  s.format = output_format(vm);
  s.kv_copy = vm["kv-copy"].as<bool>();
  s.flush_dirty = vm["flush-dirty"].as<bool>();
  parse_ring_flags(vm, s);
  return s;
}

#ifdef FLASHLAB_HAVE_CUDA
int run_sweep(const Sweep& s) {
  namespace fc = flashlab::cuda;
  // A named forward kernel's own limit on d (d = 256: mma and tma-ws alone), before anything runs.
  if (s.fwd_kernel != "auto" && s.fwd)
    for (int d : s.dims) try {
        fc::fast_forward_tiles(d, s.fwd_kernel == "wgmma"     ? fc::FastForwardKernel::wgmma
                                  : s.fwd_kernel == "tma-ws"  ? fc::FastForwardKernel::tma_ws
                                  : s.fwd_kernel == "splitkv" ? fc::FastForwardKernel::split_kv
                                                              : fc::FastForwardKernel::mma_sync);
      } catch (const std::invalid_argument& e) {
        throw UsageError("--dim " + std::to_string(d) + ": " + e.what(), "--fwd-kernel auto, mma or tma-ws");
      }
  require_gpu("bench attention");
  fc::AttentionBenchConfig b;
  b.seqs = s.seqs;
  b.head_dims = s.dims;
  b.causal = s.causal;
  b.heads = s.heads;
  b.heads_kv = s.heads_kv;
  b.seq_k = s.seq_k;
  b.window_left = s.window_left;
  b.window_right = s.window_right;
  b.batch = s.batch;
  b.reps = s.reps;
  b.warmup = s.warmup;
  b.dtype = s.fp16 ? flashlab::ref::Dtype::fp16 : flashlab::ref::Dtype::bf16;
  b.pass = s.fwd && s.bwd ? fc::BenchPass::both : (s.bwd ? fc::BenchPass::bwd : fc::BenchPass::fwd);
  b.bwd_design = s.bwd_atomic ? flashlab::ref::Algorithm::bwd_atomic : flashlab::ref::Algorithm::bwd_two_kernel;
  const bool chosen = s.fwd_kernel == "auto";
  b.fwd_kernel = chosen                      ? fc::fastest_forward_kernel()
                 : s.fwd_kernel == "wgmma"   ? fc::FastForwardKernel::wgmma
                 : s.fwd_kernel == "tma-ws"  ? fc::FastForwardKernel::tma_ws
                 : s.fwd_kernel == "splitkv" ? fc::FastForwardKernel::split_kv
                                             : fc::FastForwardKernel::mma_sync;
  b.fwd_auto = chosen;
  b.kv_copy = s.kv_copy;
  b.flush_dirty = s.flush_dirty;

  b.packed = s.packed;
  if (!chosen && (s.fwd_kernel == "wgmma" || s.fwd_kernel == "tma-ws") && !fc::fast_forward_wgmma_built())
    throw UsageError("--fwd-kernel " + s.fwd_kernel + " is not in this build",
                     "configure with CMAKE_CUDA_ARCHITECTURES including 90 (the " + s.fwd_kernel +
                         " forward is sm_90a code)");
  const bool bwd_chosen = s.bwd_kernel == "auto";
  b.bwd_kernel = !s.bwd_atomic            ? fc::FastBackwardKernel::mma_sync
                 : bwd_chosen             ? fc::fastest_backward_kernel()
                 : s.bwd_kernel == "wgmma-ws" ? fc::FastBackwardKernel::wgmma_ws
                 : s.bwd_kernel == "wgmma-ws-det" ? fc::FastBackwardKernel::wgmma_ws_deterministic
                                          : fc::FastBackwardKernel::mma_sync;
  b.bwd_auto = bwd_chosen && s.bwd_atomic;
  if (s.bwd_kernel.rfind("wgmma-ws", 0) == 0 && !fc::fast_forward_wgmma_built())
    throw UsageError("--bwd-kernel " + s.bwd_kernel + " is not in this build",
                     "configure with CMAKE_CUDA_ARCHITECTURES including 90 (the wgmma-ws backward is sm_90a code)");
  const std::string bwd_name = std::string(flashlab::ref::algorithm_flag_name(b.bwd_design)) + " backward (" +
                               fc::to_string(b.bwd_kernel) +
                               (bwd_chosen && s.bwd_atomic ? ", the fastest for this device)" : ")");
  const std::string fwd_name =
      chosen ? "chosen per shape: splitkv for few query rows, else " + std::string(fc::to_string(b.fwd_kernel))
             : std::string(fc::to_string(b.fwd_kernel));
  const char* dt = s.fp16 ? "fp16" : "bf16";
  const std::string device = fc::device_description();
  // JSON and CSV go to stdout alone (a file for sdpa_bench.py); the device line then goes to stderr.
  const bool data = s.format != OutputFormat::text;
  std::ostream& info = info_stream(data);
  info << "device: " << device << "\n"
       << (s.fwd && s.bwd ? "fast forward (" + fwd_name + ") and " + bwd_name + ", "
                          : s.bwd ? "fast " + bwd_name + ", "
                                  : "fast forward (" + fwd_name + "), ")
       << dt << ", H=" << s.heads << (s.heads_kv ? " H_kv=" + std::to_string(s.heads_kv) : "")
       << (s.seq_k ? " N_k=" + std::to_string(s.seq_k) : "")
       << (s.window_left >= 0 || s.window_right >= 0
               ? " window=" + std::to_string(s.window_left) + "," + std::to_string(s.window_right)
               : "")
       << (s.packed ? " packed: " + std::to_string(s.packed->count()) + " sequences, total_q=" +
                          std::to_string(s.packed->total_q()) + " total_k=" + std::to_string(s.packed->total_k()) +
                          ", longest " + std::to_string(s.packed->max_len_q()) + " / " +
                          std::to_string(s.packed->max_len_k())
                    : " B=" + std::to_string(s.batch))
       << "; per shape " << s.warmup
       << " warm-up + " << s.reps << " timed launches, each alone (CUDA events), L2 flushed before each"
       << (s.flush_dirty ? " (memset alone: dirty)" : "") << ", "
       << b.input_sets << " input sets rotated; median (min, max)\n";
  std::optional<RowStream> rows;
  if (data) {
    rows.emplace(s.format, std::cout);
  } else {
    char line[160];
    std::snprintf(line, sizeof line, "%-5s %4s %4s %6s %6s %10s %10s %10s %9s %9s\n", "dtype", "pass", "d", "causal",
                  "N", "ms", "min ms", "max ms", "TFLOP/s", "GB/s");
    std::cout << line << std::flush;
  }
  fc::bench_attention(b, [&](const fc::AttentionBenchRow& r) {
    const auto& c = r.attention.problem;
    const std::string design = r.attention.bwd_kernel != fc::FastBackwardKernel::mma_sync
                                   ? std::string(fc::to_string(r.attention.bwd_kernel))
                                   : std::string(flashlab::ref::algorithm_flag_name(r.attention.bwd_design));
    const char* pass = r.attention.backward ? "bwd" : "fwd";
    if (rows) {
      // The keys are the columns sdpa_bench.py and measure.sh read; the figures keep the digits
      // the timing resolves.
      Value v;
      Json j(v);
      j.begin_object();
      j.key("dtype").value(dt).key("pass").value(pass);
      j.key("d").value(std::uint64_t(c.head_dim)).key("causal").value(int(c.causal));
      j.key("N").value(std::uint64_t(c.seq)).key("H").value(std::uint64_t(c.heads)).key("B").value(std::uint64_t(c.batch));
      j.key("ms").value(round_to(r.median_ms, 6)).key("min_ms").value(round_to(r.min_ms, 6));
      j.key("max_ms").value(round_to(r.max_ms, 6)).key("tflops").value(round_to(r.tflops, 3));
      j.key("gbps").value(round_to(r.gbps, 1));
      j.key("bwd_design");
      if (r.attention.backward) j.value(design);
      else j.null();
      j.key("fwd_kernel");
      if (r.attention.backward) j.null();
      else j.value(fc::to_string(r.attention.fwd_kernel));
      j.key("H_kv").value(std::uint64_t(c.h_kv())).key("N_k").value(std::uint64_t(c.n_k()));
      j.key("kv_read_tbps").value(round_to(r.attention.kv_read_tbps, 3));
      j.key("copy_tbps").value(round_to(r.attention.copy_tbps, 3));
      j.key("window_left").value(std::int64_t(c.window_left)).key("window_right").value(std::int64_t(c.window_right));
      j.key("total_q").value(std::uint64_t(c.packed ? c.packed->total_q() : 0));
      j.key("total_k").value(std::uint64_t(c.packed ? c.packed->total_k() : 0));
      j.end_object();
      rows->row(v);
      return;
    }
    char line[256];
    std::snprintf(line, sizeof line, "%-5s %4s %4zu %6s %6zu %10.4f %10.4f %10.4f %9.1f %9.1f\n", dt, pass, c.head_dim,
                  c.causal ? "yes" : "no", c.seq, r.median_ms, r.min_ms, r.max_ms, r.tflops, r.gbps);
    std::cout << line;
    if (r.attention.copy_tbps > 0)  // K and V read rate against the copy anchor of the same run
      std::printf("       %s reads K, V at %.2f TB/s; a D2D copy of the same bytes moves %.2f TB/s (read + write): "
                  "%.0f %%\n",
                  fc::to_string(r.attention.fwd_kernel), r.attention.kv_read_tbps, r.attention.copy_tbps,
                  100.0 * r.attention.kv_read_tbps / r.attention.copy_tbps);
    std::cout << std::flush;
  });
  if (rows) rows->finish();
  return kOk;
}
#endif


#ifdef FLASHLAB_HAVE_RING
// The ring over each G of the sweep: one LocalRing per G, one bench_context_parallel() per
// shape; one GPU's kernels timed once per shape (the first G that asks) and given to the others.
int run_ring(const Sweep& s) {
  namespace fc = flashlab::cuda;
  namespace fr = flashlab::ref;
  const fr::Dtype dtype = s.fp16 ? fr::Dtype::fp16 : fr::Dtype::bf16;
  const auto problem_for = [&](int g, int n, int d, bool causal) {
    fr::ContextParallelProblem p;
    p.attention.batch = std::size_t(s.batch);
    p.attention.seq = std::size_t(s.weak ? n * g : n);
    p.attention.heads = std::size_t(s.heads);
    p.attention.head_dim = std::size_t(d);
    p.attention.causal = causal;
    p.attention.dtype = dtype;
    p.heads_kv = std::size_t(s.heads_kv);
    p.gpus = std::size_t(g);
    p.layout = !s.layout.empty() ? fr::parse_layout(s.layout)
                                 : (causal ? fr::ShardLayout::zigzag : fr::ShardLayout::contiguous);
    return p;
  };
  // Every shape's limits first, as usage errors, before a GPU is touched.
  for (int g : s.gpus)
    for (int n : s.seqs)
      for (int d : s.dims)
        for (bool causal : s.causal) try {
            fc::check_context_parallel_problem(problem_for(g, n, d, causal));
          } catch (const std::invalid_argument& e) {
            throw UsageError(std::string("--gpus ") + std::to_string(g) + " --seq " + std::to_string(n) + " --dim " +
                                 std::to_string(d) + ": " + e.what(),
                             "N a multiple of the chunks (2G zigzag, G contiguous), d 64 or 128");
          }
  require_gpu("bench attention --gpus");
  const char* dt = s.fp16 ? "fp16" : "bf16";
  const bool data = s.format != OutputFormat::text;
  std::ostream& info = info_stream(data);
  info << "device: " << fc::device_description() << "\n"
       << "context-parallel ring over NCCL, " << (s.weak ? "weak" : "strong") << " scaling, " << dt
       << ", H=" << s.heads << (s.heads_kv ? " H_kv=" + std::to_string(s.heads_kv) : "") << " B=" << s.batch
       << "; per shape " << s.warmup << " warm-up + " << s.reps
       << " timed runs, the slowest rank's whole ring (CUDA events); median (min, max)\n";
  std::optional<RowStream> rows;
  if (data) rows.emplace(s.format, std::cout);
  std::map<std::tuple<std::size_t, int, bool, int>, double> single_ms;  // (N, d, causal, pass) -> ms
  bool all_equal = true;
  for (int g : s.gpus) {
    std::vector<int> devices;
    for (int r = 0; r < g; ++r) devices.push_back(r);
    const fc::LocalRing ring(devices);
    for (int d : s.dims)
      for (bool causal : s.causal)
        for (int n : s.seqs) {
          fc::RingBenchConfig cfg;
          cfg.problem = problem_for(g, n, d, causal);
          cfg.forward = s.fwd;
          cfg.backward = s.bwd;
          cfg.warmups = s.warmup;
          cfg.reps = s.reps;
          cfg.forward_kernel = fc::fastest_forward_kernel();
          cfg.backward_kernel = fc::fastest_backward_kernel();
          const std::size_t N = cfg.problem.attention.seq;
          const auto key = [&](fr::RingPass pass) { return std::make_tuple(N, d, causal, int(pass)); };
          cfg.single = s.single && !single_ms.count(key(s.fwd ? fr::RingPass::forward : fr::RingPass::backward));
          for (auto& r : fc::bench_context_parallel(cfg, ring)) {
            if (r.single_ms > 0) single_ms[key(r.pass)] = r.single_ms;
            else if (s.single && single_ms.count(key(r.pass))) r.single_ms = single_ms[key(r.pass)];
            const fr::ContextParallelProblem& p = cfg.problem;
            const bool fwd = r.pass == fr::RingPass::forward;
            const char* kernel = fwd ? fc::to_string(cfg.forward_kernel) : fc::to_string(cfg.backward_kernel);
            const double ring_tf = r.flops / (r.ring_ms * 1e-3) / g / 1e12;
            const double single_tf = r.single_ms > 0 ? r.flops / (r.single_ms * 1e-3) / 1e12 : -1;
            const double eff = r.single_ms > 0 ? r.single_ms / (g * r.ring_ms) : -1;
            all_equal = all_equal && r.counted_equals_model;
            if (rows) {
              Value v;
              Json j(v);
              j.begin_object();
              j.key("gpus").value(std::uint64_t(g)).key("layout").value(std::string(fr::layout_name(p.layout)));
              j.key("causal").value(int(causal)).key("N").value(std::uint64_t(N));
              j.key("B").value(std::uint64_t(s.batch)).key("H").value(std::uint64_t(s.heads));
              j.key("H_kv").value(std::uint64_t(p.kv_heads())).key("d").value(std::uint64_t(d));
              j.key("dtype").value(dt).key("pass").value(fwd ? "fwd" : "bwd").key("kernel").value(kernel);
              j.key("ring_ms").value(round_to(r.ring_ms, 4)).key("ring_min_ms").value(round_to(r.ring_min_ms, 4));
              j.key("ring_max_ms").value(round_to(r.ring_max_ms, 4));
              j.key("ring_tflops_per_gpu").value(round_to(ring_tf, 1));
              j.key("single_ms").value(round_to(r.single_ms, 4)).key("single_tflops").value(round_to(single_tf, 1));
              j.key("strong_efficiency").value(round_to(eff, 4));
              j.key("model_bytes_per_gpu").value(std::uint64_t(r.model_bytes));
              j.key("counted_bytes_per_gpu").value(std::uint64_t(r.counted_bytes));
              j.key("counted_equals_model").value(int(r.counted_equals_model));
              j.key("max_exchange_ms").value(round_to(r.exchange_ms_max, 4));
              j.key("max_step_compute_ms").value(round_to(r.compute_ms_max, 4));
              j.key("exposed_ms").value(round_to(r.exposed_ms, 4));
              j.end_object();
              rows->row(v);
              continue;
            }
            std::printf("%s G=%d %s%s N=%zu d=%d: ring %.3f ms (%.3f, %.3f), %.1f TFLOP/s per GPU", fwd ? "fwd" : "bwd", g,
                        fr::layout_name(p.layout).data(), causal ? " causal" : "", N, d, r.ring_ms, r.ring_min_ms,
                        r.ring_max_ms, ring_tf);
            if (r.single_ms > 0)
              std::printf("; one GPU %.3f ms (%.1f TFLOP/s), strong efficiency %.3f", r.single_ms, single_tf, eff);
            std::printf("\n    sent per GPU %llu B, model %llu B: %s; longest exchange %.3f ms, step %.3f ms, exposed "
                        "%.3f ms\n",
                        (unsigned long long)r.counted_bytes, (unsigned long long)r.model_bytes,
                        r.counted_equals_model ? "equal" : "DIFFERENT", r.exchange_ms_max, r.compute_ms_max,
                        r.exposed_ms);
            std::fflush(stdout);
          }
        }
  }
  if (rows) rows->finish();
  if (!all_equal) {
    std::cerr << "error: the bytes handed to NCCL differ from the model's on a row above\n";
    return kFailed;
  }
  return kOk;
}
#endif
}  // namespace

int cmd_bench(const Args& args) {
  if (!args.empty() && args.front() == "mta") return cmd_bench_mta(args);  // cmd_bench_mta.cpp
  if (!args.empty() && args.front() == "stream") return cmd_bench_stream(args);  // cmd_bench_stream.cpp
  return guarded("bench", [&]() -> int {
    const auto desc = options();
    const auto parsed = parse_subject_command(
        args, desc, {"bench", "benchmark", "attention", "flashlab bench attention --seq 4096 --dim 128", kUsageLine, kSummary});
    if (!parsed) return kOk;  // --help was printed
    const po::variables_map& vm = *parsed;
    const Sweep sweep = parse_sweep(vm);
    if (!sweep.gpus.empty()) {
#ifdef FLASHLAB_HAVE_RING
      return run_ring(sweep);
#else
      throw UsageError("--gpus: this build has no context-parallel ring",
                       "build with CUDA and NCCL (nccl.h and libnccl in the CUDA installation)");
#endif
    }
#ifdef FLASHLAB_HAVE_CUDA
    return run_sweep(sweep);
#else
    (void)sweep;
    throw built_without_cuda("bench attention times the GPU kernel");
#endif
  });
}

}  // namespace flashlab::app
