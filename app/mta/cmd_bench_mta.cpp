// `flashlab bench mta`: times the Multi-Token Attention kernels (the clear fp32 kernels or the
// fast tensor-core ones) over a sweep of N and d for one kernel size cq × ck and one pass, and
// prints ms and TFLOP/s per shape. Flags are parsed and checked in every build; the timing itself
// is flashlab::cuda::mta::bench_mta (cuda/src/mta/mta_bench.cpp), compiled only with CUDA
// (FLASHLAB_HAVE_CUDA). Formatting only here.
#include "core/commands.hpp"
#include "core/gpu_flags.hpp"
#include "core/report.hpp"
#include "core/shared_flags.hpp"

#ifdef FLASHLAB_HAVE_CUDA
#include "flashlab/cuda/mta_bench.hpp"
#include "flashlab/cuda/options.hpp"
#endif

#include <cmath>
#include <cstdio>
#include <optional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace flashlab::app {

namespace {

constexpr const char* kUsageLine =
    "bench mta [--kernel fast|clear] [--pass fwd|bwd|fwd+bwd|decode] [--cq CQ] [--ck CK] [--seq N[,N2,...]]\n"
    "                 [--dim D[,D2]] [--heads H] [--batch B] [--dtype bf16|fp16] [--block B] [--reps R] [--warmup W]\n"
    "                 [--linear-path -1|0|1] [--o-order on-chip|source] [--traffic] [--json|--csv]";
constexpr const char* kSummary =
    "Times the Multi-Token Attention kernels on the GPU (causal, as MTA is) for every (d, N) of the\n"
    "sweep and one convolution kernel size cq x ck. Per shape: W warm-up launches, then R launches\n"
    "each timed alone with CUDA events, L2 flushed (256 MiB memset, read back) before each, inputs rotated over\n"
    "3 sets, W drawn once (N(0, 0.5^2) per tap). --kernel fast: the tensor-core kernels, bf16 or fp16\n"
    "in, fp32 accumulation, O kept on chip across key tiles. --kernel clear: the clear fp32 kernels\n"
    "in the source's order (O zero-filled, then read-modify-written in HBM per key tile; --block\n"
    "sets their tile B). Prints the median, min and max ms and TFLOP/s = (2·N²·d·H·B for QK^T and\n"
    "PV, causal, + N²·H·B·cq·ck for the convolution) / median. --json and --csv print one row per\n"
    "shape as it is timed, with the keys kernel,dtype,pass,cq,ck,d,N,H,B,ms,min_ms,max_ms,tflops,\n"
    "read_tbps,copy_tbps (and with --traffic o_order,l2_read_bytes,l2_write_bytes,dram_read_bytes,\n"
    "dram_write_bytes); the CSV feeds cuda/bench/mta_torch.py (the unfused PyTorch implementation,\n"
    "same shapes). --pass bwd times the fast backward (D, dQ,\n"
    "dK, dV, dW; O and LSE from an untimed fast forward), fwd+bwd both in one range (TFLOP/s of the\n"
    "backward: 5·N²·d·H·B + 3·N²·H·B·cq·ck). --pass decode times the split-K decode of the last 16\n"
    "rows and prints the rate it reads K and V beside a device-to-device copy of the same bytes timed\n"
    "the same way (read_tbps, copy_tbps). --o-order source (fast forward, bf16, d = 64): the same\n"
    "kernel with O_i, m_i, l_i sent to an fp32 workspace after each key tile and read back before the\n"
    "next, as the source's read-modify-write order, to measure what keeping them on chip saves.\n"
    "--traffic (fast forward): one more launch per shape under CUPTI, L2 flushed before each counter,\n"
    "reporting its L2->SM, SM->L2 and DRAM bytes. Needs a build with CUDA and an NVIDIA GPU.";

po::options_description options() {
  po::options_description d("Options");
  d.add_options()("help,h", "show this help")
      ("kernel", po::value<std::string>()->default_value("fast"), 
       "fast | clear: the fast tensor-core kernels (the default) or the clear fp32 ones")
      ("pass", po::value<std::string>()->default_value("fwd"), "fwd | bwd | fwd+bwd | decode: the pass to time (--kernel clear: fwd only)")
      ("cq", po::value<long long>()->default_value(3), "kernel rows cq (query direction, >= 1)")
      ("ck", po::value<long long>()->default_value(3), "kernel columns ck (key direction, odd)")
      ("seq", po::value<std::string>()->default_value("4096"), "sequence lengths N, comma separated")
      ;
  add_dim_list_option(d, "64");
  d.add_options()
      ("heads", po::value<long long>()->default_value(16), "H, number of heads")
      ("batch", po::value<long long>()->default_value(1), "B, batch size")
      ;
  add_dtype_option(d, "bf16 | fp16", "bf16", " (the fast kernels; the clear ones are fp32)");
  d.add_options()
      ("block", po::value<long long>()->default_value(64), "B, the clear kernels' loaded tile (the fast tiles are fixed)")
      ("splits", po::value<long long>()->default_value(16), "N_splits of the decode pass")
      ("linear-path", po::value<long long>()->default_value(-1),
       "fast forward's linear path off the diagonal: -1 its policy, 0 off (masked path everywhere), 1 on")
      ("o-order", po::value<std::string>()->default_value("on-chip"),
       "on-chip | source: the fast forward keeps O_i, m_i, l_i in registers across key tiles (the default), "
       "or sends them through HBM between key tiles as the source does (bf16, d = 64, --pass fwd)")
      ("traffic", po::bool_switch(), "also measure one launch per shape with CUPTI: L2->SM, SM->L2 and DRAM bytes "
                                     "(fast forward only; adds o_order and byte columns to --json/--csv)")
      ("reps", po::value<long long>()->default_value(30), "timed launches per shape (at least 5)")
      ("warmup", po::value<long long>()->default_value(3), "untimed launches per shape before timing");
  add_output_options(d);
  return d;
}

/// Everything the sweep needs, checked (flag names in every error).
struct MtaSweep {
  std::vector<int> seqs, dims;
  int cq = 3, ck = 3, heads = 16, batch = 1, block = 64, splits = 16, reps = 30, warmup = 3, linear_path = -1;
  std::string kernel = "fast", pass = "fwd";
  bool fp16 = false, traffic = false, source_order = false;
  OutputFormat format = OutputFormat::text;  // --json / --csv
};

MtaSweep parse_mta_sweep(const po::variables_map& vm) {
  MtaSweep s;
  s.seqs = sweep_list("seq", vm["seq"].as<std::string>(), 1, 1 << 20, "1024,4096");
  s.dims = sweep_list("dim", vm["dim"].as<std::string>(), 1, 4096, "64,128");
  s.cq = int_flag(vm, "cq", 1, 64);
  s.ck = int_flag(vm, "ck", 1, 63);
  if (s.ck % 2 == 0)
    throw UsageError("--ck " + std::to_string(s.ck) + " is even", "the key direction needs an odd kernel, e.g. --ck 3");
  s.heads = int_flag(vm, "heads", 1, 4096);
  s.batch = int_flag(vm, "batch", 1, 4096);
  s.block = int_flag(vm, "block", 1, 256);
  s.splits = int_flag(vm, "splits", 1, 4096);
  s.linear_path = int_flag(vm, "linear-path", -1, 1);
  s.reps = int_flag(vm, "reps", 5, 100000);
  s.warmup = int_flag(vm, "warmup", 0, 100000);
  s.kernel = vm["kernel"].as<std::string>();
  kernel_family(s.kernel, KernelFamily::fast);  // checks the value
  s.pass = vm["pass"].as<std::string>();
  if (s.pass != "fwd" && s.pass != "bwd" && s.pass != "fwd+bwd" && s.pass != "decode")
    throw UsageError("--pass '" + s.pass + "' is unknown", "choose fwd (the default), bwd, fwd+bwd or decode");
  s.fp16 = fp16_dtype(vm["dtype"].as<std::string>());
  s.format = output_format(vm);
  const std::string order = vm["o-order"].as<std::string>();
  if (order != "on-chip" && order != "source")
    throw UsageError("--o-order '" + order + "' is unknown", "choose on-chip (the default) or source");
  s.source_order = order == "source";
  s.traffic = vm["traffic"].as<bool>();
  const bool fast_fwd = s.kernel == "fast" && s.pass == "fwd";
  if (s.source_order && !fast_fwd)
    throw UsageError("--o-order source needs --kernel fast --pass fwd", "the source-order variant is a fast forward");
  for (int d : s.dims)
    if (s.source_order && (d != 64 || s.fp16))
      throw UsageError("--o-order source is compiled for --dtype bf16 --dim 64 only",
                       "drop --o-order (the on-chip order takes every shape) or use --dim 64 --dtype bf16");
  if (s.traffic && !fast_fwd)
    throw UsageError("--traffic needs --kernel fast --pass fwd", "the traffic is measured for the fast forward");
  return s;
}

#ifdef FLASHLAB_HAVE_CUDA
namespace fm = flashlab::cuda::mta;

fm::MtaBenchConfig config_of(const MtaSweep& s) {
  fm::MtaBenchConfig b;
  b.seqs = s.seqs;
  b.head_dims = s.dims;
  b.cq = s.cq;
  b.ck = s.ck;
  b.heads = s.heads;
  b.batch = s.batch;
  b.block = s.block;
  b.splits = s.splits;
  b.linear_path = s.linear_path;
  b.o_order = s.source_order ? fm::FastOOrder::source : fm::FastOOrder::on_chip;
  b.traffic = s.traffic;
  b.reps = s.reps;
  b.warmup = s.warmup;
  b.dtype = s.fp16 ? flashlab::ref::Dtype::fp16 : flashlab::ref::Dtype::bf16;
  b.kernel = s.kernel == "clear" ? fm::MtaBenchKernel::clear : fm::MtaBenchKernel::fast;
  b.pass = s.pass == "bwd"       ? fm::MtaBenchPass::bwd
           : s.pass == "fwd+bwd" ? fm::MtaBenchPass::fwd_bwd
           : s.pass == "decode"  ? fm::MtaBenchPass::decode
                                 : fm::MtaBenchPass::fwd;
  return b;
}

/// The CUPTI byte counters of one row, as a line under it.
void print_traffic(const fm::MtaBenchRow& r) {
  char line[220];
  std::snprintf(line, sizeof line, "       O order %s, one launch (CUPTI): L2->SM %.1f MB, SM->L2 %.1f MB, DRAM read %.1f MB, "
                "DRAM write %.1f MB\n", fm::to_string(r.mta.o_order), r.counters.l2_read_bytes / 1e6,
                r.counters.l2_write_bytes / 1e6, r.counters.dram_read_bytes / 1e6, r.counters.dram_write_bytes / 1e6);
  std::cout << line;
}

/// One row as the --json / --csv writer takes it: the keys are the columns mta_torch.py and
/// measure.sh read; the traffic keys only with --traffic (empty where a row was not measured).
Value row_of(const fm::MtaBenchRow& r, bool traffic) {
  Value v;
  Json j(v);
  j.begin_object();
  j.key("kernel").value(fm::to_string(r.mta.kernel)).key("dtype").value(flashlab::ref::dtype_name(r.dtype));
  j.key("pass").value(fm::to_string(r.mta.pass)).key("cq").value(r.mta.cq).key("ck").value(r.mta.ck);
  j.key("d").value(r.head_dim).key("N").value(r.seq).key("H").value(r.heads).key("B").value(r.batch);
  j.key("ms").value(round_to(r.median_ms, 6)).key("min_ms").value(round_to(r.min_ms, 6));
  j.key("max_ms").value(round_to(r.max_ms, 6)).key("tflops").value(round_to(r.tflops, 3));
  j.key("read_tbps").value(round_to(r.mta.read_tbps, 4)).key("copy_tbps").value(round_to(r.mta.copy_tbps, 4));
  if (traffic) {
    j.key("o_order").value(fm::to_string(r.mta.o_order));
    const std::pair<const char*, double> counters[] = {{"l2_read_bytes", r.counters.l2_read_bytes},
                                                        {"l2_write_bytes", r.counters.l2_write_bytes},
                                                        {"dram_read_bytes", r.counters.dram_read_bytes},
                                                        {"dram_write_bytes", r.counters.dram_write_bytes}};
    for (const auto& [name, bytes] : counters) {
      j.key(name);
      if (r.traffic) j.value(std::uint64_t(std::llround(bytes)));
      else j.null();
    }
  }
  j.end_object();
  return v;
}

int run_mta_sweep(const MtaSweep& s) {
  require_gpu("bench mta");
  const fm::MtaBenchConfig b = config_of(s);
  // JSON and CSV go to stdout alone (a file for mta_torch.py); the device line then goes to stderr.
  const bool data = s.format != OutputFormat::text;
  std::ostream& info = info_stream(data);
  info << "device: " << flashlab::cuda::device_description() << "\n"
       << s.kernel << " MTA kernels, pass " << s.pass << ", " << s.cq << "x" << s.ck << ", causal, H=" << s.heads
       << " B=" << s.batch << "; per shape " << s.warmup << " warm-up + " << s.reps
       << " timed launches, each alone (CUDA events), L2 flushed before each, " << b.input_sets
       << " input sets rotated; median (min, max)"
       << (s.kernel == "fast" && s.pass == "fwd" ? std::string("; O order ") + fm::to_string(b.o_order) : "") << "\n";
  std::optional<RowStream> rows;
  if (data) {
    rows.emplace(s.format, std::cout);
  } else {
    char line[160];
    std::snprintf(line, sizeof line, "%-6s %-5s %-7s %5s %4s %6s %10s %10s %10s %9s\n", "kernel", "dtype", "pass",
                  "cq×ck", "d", "N", "ms", "min ms", "max ms", "TFLOP/s");
    std::cout << line << std::flush;
  }
  try {
    fm::bench_mta(b, [&](const fm::MtaBenchRow& r) {
      if (rows) {
        rows->row(row_of(r, s.traffic));
        return;
      }
      const std::string dt(flashlab::ref::dtype_name(r.dtype));
      char line[220];
      std::snprintf(line, sizeof line, "%-6s %-5s %-7s %2dx%-2d %4d %6d %10.4f %10.4f %10.4f %9.1f\n",
                    fm::to_string(r.mta.kernel), dt.c_str(), fm::to_string(r.mta.pass), r.mta.cq, r.mta.ck, r.head_dim,
                    r.seq, r.median_ms, r.min_ms, r.max_ms, r.tflops);
      std::cout << line;
      if (r.traffic) print_traffic(r);
      if (r.mta.copy_tbps > 0)  // decode: K and V read rate against the copy anchor of the same run
        std::printf("       reads K, V at %.2f TB/s; a D2D copy of the same bytes moves %.2f TB/s (read + write): "
                    "ratio %.3f\n",
                    r.mta.read_tbps, r.mta.copy_tbps, r.mta.read_tbps / r.mta.copy_tbps);
      std::cout << std::flush;
    });
  } catch (const std::invalid_argument& e) {
    // The harness checks the shape limits and the passes before timing: report them as usage errors.
    throw UsageError(e.what(), "see flashlab bench mta --help (--kernel, --pass, --dim, --cq, --ck)");
  }
  if (rows) rows->finish();
  return kOk;
}
#endif

}  // namespace

int cmd_bench_mta(const Args& args) {
  return guarded("bench", [&]() -> int {
    const auto desc = options();
    const auto parsed = parse_subject_command(
        args, desc, {"bench", "benchmark", "mta", "flashlab bench mta --cq 3 --ck 3 --seq 4096", kUsageLine, kSummary});
    if (!parsed) return kOk;  // --help was printed
    const MtaSweep sweep = parse_mta_sweep(*parsed);
#ifdef FLASHLAB_HAVE_CUDA
    return run_mta_sweep(sweep);
#else
    (void)sweep;
    throw built_without_cuda("bench mta times the GPU kernels");
#endif
  });
}

}  // namespace flashlab::app
