// `flashlab traffic mta`: the HBM traffic of the flash MTA passes as the reference's closed-form
// model states it (mta_traffic.hpp), and with --device cuda the clear CUDA kernels' bytes
// measured with CUPTI beside it (flashlab/cuda/mta.hpp, measure). Formatting only.
//
// What is compared: the model's reads with the bytes L2 delivered to the SMs (L2 → SM, the level
// a tile-load model describes: every load is __ldcg, so none is served by L1), and its writes
// with the bytes the SMs sent to L2. dW's per-row-tile read-modify-write is done by atomics in
// L2: no data comes back to the SM, so the model's dW reads are shown in the atomic column and
// left out of the read comparison.
#include "core/commands.hpp"
#include "core/gpu_flags.hpp"
#include "core/report.hpp"
#include "mta/mta_inputs.hpp"

#include "flashlab/reference/mta.hpp"
#include "flashlab/reference/mta_traffic.hpp"
#include "flashlab/reference/npy.hpp"

#ifdef FLASHLAB_HAVE_CUDA
#include "flashlab/cuda/dtype16.hpp"
#include "flashlab/cuda/mta.hpp"
#include "flashlab/cuda/mta_fast.hpp"
#include "flashlab/cuda/mta_fast_backward.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <utility>
#include <string>
#include <vector>

namespace flashlab::app {

namespace {

namespace mta = flashlab::ref::mta;

constexpr const char* kUsageLine =
    "traffic mta [--pass fwd|bwd|infer|all] [--seq N] [--heads H] [--dim D] [--batch B] [--cq CQ] [--ck CK]\n"
    "                    [--block B] [--splits S] [--device cpu|cuda] [--json|--csv]";
constexpr const char* kSummary =
    "Prints the HBM bytes of the flash Multi-Token Attention passes (forward, backward, split-K\n"
    "inference) as the reference's closed-form model states them (fp32, statistics fp32).\n"
    "--device cuda runs the clear CUDA kernels and measures them with CUPTI (L2 flushed before\n"
    "every kernel): L2 -> SM bytes against the model's reads, SM -> L2 bytes against its writes,\n"
    "DRAM bytes and time beside them. 'reads within 5%' says whether L2 -> SM / model read lies in\n"
    "[0.95, 1.05]; scalar stores (the inference's M_s, L_s) move whole 32-byte sectors.";

// Largest tensors the probe allocates (fp32 elements per tensor): 2^28 = 1 GiB each.
constexpr std::size_t kMaxElements = std::size_t(1) << 28;

po::options_description options() {
  po::options_description d("Options");
  d.add_options()("help,h", "show this help")
      ("pass", po::value<std::string>()->default_value("all"), "fwd | bwd | infer | all")
      ("seq", po::value<long long>()->default_value(2048), "N, sequence length")
      ("heads", po::value<long long>()->default_value(16), "H, number of heads")
      ;
  add_dim_option(d);
  d.add_options()
      ("batch", po::value<long long>()->default_value(1), "batch size")
      ("cq", po::value<long long>()->default_value(3), "kernel rows; Pq = cq - 1")
      ("ck", po::value<long long>()->default_value(3), "kernel columns, odd; Pk = (ck - 1)/2")
      ("block", po::value<long long>()->default_value(64), "B, the loaded (overlapping) tile size")
      ("splits", po::value<long long>()->default_value(8), "key splits of the inference pass")
      ("device", po::value<std::string>()->default_value("cpu"), "cpu (the model) | cuda (measure the kernels)");
  add_output_options(d);
  return d;
}

struct PassRow {
  std::string pass;
  double model_read = 0, model_write = 0, model_atomic = 0;
  double l2_read = 0, l2_write = 0, l2_atomic = 0, dram_read = 0, dram_write = 0, time_ms = 0;
  bool measured = false;
  std::vector<std::string> kernel_lines;
};

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }
// The model describes loads: the verdict is on L2 -> SM reads. Writes are shown beside it; scalar
// stores (M_s, L_s of the inference partials) move whole 32-byte sectors, 8x their 4 bytes.
bool within_5(const PassRow& r) { return std::abs(ratio(r.l2_read, r.model_read) - 1) <= 0.05; }

PassRow model_row(const std::string& pass, const ref::Shape& shape, const mta::Params& p) {
  const ref::Traffic t = pass == "fwd"   ? mta::forward_traffic(shape, p)
                         : pass == "bwd" ? mta::backward_traffic(shape, p)
                                         : mta::infer_traffic(shape, p);
  PassRow r;
  r.pass = pass;
  r.model_read = double(t.total_read_bytes());
  r.model_write = double(t.total_write_bytes());
  if (pass == "bwd") {
    r.model_atomic = double(t.read_bytes("dW"));
    r.model_read -= r.model_atomic;
  }
  return r;
}

#ifdef FLASHLAB_HAVE_CUDA
void measure_row(PassRow& r, const ref::Shape& shape, const mta::Params& p) {
  namespace fc = flashlab::cuda;
  fc::mta::ProbeConfig cfg;
  cfg.shape = shape;
  cfg.params = p;
  const fc::mta::Pass pass = r.pass == "fwd" ? fc::mta::Pass::forward
                             : r.pass == "bwd" ? fc::mta::Pass::backward
                                               : fc::mta::Pass::infer;
  const fc::ProbeResult res = fc::mta::measure(pass, cfg);
  if (!res.unavailable.empty()) {
    std::string names;
    for (const auto& u : res.unavailable) names += " " + u;
    throw std::runtime_error("CUPTI metrics not available on this device:" + names);
  }
  for (const auto& k : res.kernels) {
    const auto& c = k.counters;
    r.l2_read += c.l2_read_bytes;
    r.l2_write += c.l2_write_bytes;
    r.l2_atomic += c.l2_atomic_bytes;
    r.dram_read += c.dram_read_bytes;
    r.dram_write += c.dram_write_bytes;
    r.time_ms += c.duration_ns / 1e6;
    char line[256];
    std::snprintf(line, sizeof line, "    %-24s L2->SM %14.0f  SM->L2 %14.0f  atomic %10.0f  DRAM rd %14.0f  %9.3f ms",
                  k.kernel.c_str(), c.l2_read_bytes, c.l2_write_bytes, c.l2_atomic_bytes, c.dram_read_bytes,
                  c.duration_ns / 1e6);
    r.kernel_lines.emplace_back(line);
  }
  r.measured = true;
}
#endif

// One row object per pass (--json; --csv prints the same fields, a header row first).
void print_rows(std::ostream& os, OutputFormat format, const std::vector<PassRow>& rows, const ref::Shape& s,
                const mta::Params& p) {
  ReportOutput report(format, os);
  Json& j = report.json();
  const auto bytes = [&](const char* key, double v) { j.key(key).value(std::uint64_t(std::llround(v))); };
  j.begin_array();
  for (const auto& r : rows) {
    j.begin_object().key("pass").value(r.pass);
    j.key("batch").value(std::uint64_t(s.batch)).key("seq").value(std::uint64_t(s.seq));
    j.key("heads").value(std::uint64_t(s.heads)).key("dim").value(std::uint64_t(s.head_dim));
    j.key("cq").value(std::uint64_t(p.cq)).key("ck").value(std::uint64_t(p.ck));
    j.key("block").value(std::uint64_t(p.block)).key("splits").value(std::uint64_t(p.splits));
    bytes("model_read_bytes", r.model_read);
    bytes("l2_read_bytes", r.l2_read);
    j.key("read_ratio").value(ratio(r.l2_read, r.model_read));
    bytes("model_write_bytes", r.model_write);
    bytes("l2_write_bytes", r.l2_write);
    j.key("write_ratio").value(ratio(r.l2_write, r.model_write));
    bytes("model_atomic_bytes", r.model_atomic);
    bytes("l2_atomic_bytes", r.l2_atomic);
    bytes("dram_read_bytes", r.dram_read);
    bytes("dram_write_bytes", r.dram_write);
    j.key("duration_ms").value(r.time_ms);
    j.key("measured").value(r.measured);
    j.end_object();
  }
  j.end_array();
  report.finish();
}

void print_table(std::ostream& os, const std::vector<PassRow>& rows, const ref::Shape& s, const mta::Params& p) {
  os << "MTA traffic, fp32: batch=" << s.batch << " N=" << s.seq << " H=" << s.heads << " d=" << s.head_dim
     << ", W " << p.cq << "x" << p.ck << ", B=" << p.block << ", splits=" << p.splits << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-6s %15s %15s %7s %15s %15s %7s %12s %12s %15s %10s %s\n", "pass", "model read",
                "L2->SM read", "ratio", "model write", "SM->L2 write", "ratio", "model atomic", "L2 atomic",
                "DRAM read", "time ms", "reads within 5%");
  os << line;
  for (const auto& r : rows) {
    if (r.measured)
      std::snprintf(line, sizeof line, "%-6s %15.0f %15.0f %7.4f %15.0f %15.0f %7.4f %12.0f %12.0f %15.0f %10.3f %s\n",
                    r.pass.c_str(), r.model_read, r.l2_read, ratio(r.l2_read, r.model_read), r.model_write,
                    r.l2_write, ratio(r.l2_write, r.model_write), r.model_atomic, r.l2_atomic, r.dram_read,
                    r.time_ms, within_5(r) ? "yes" : "NO");
    else
      std::snprintf(line, sizeof line, "%-6s %15.0f %15s %7s %15.0f %15s %7s %12.0f\n", r.pass.c_str(), r.model_read,
                    "-", "-", r.model_write, "-", "-", r.model_atomic);
    os << line;
    for (const auto& k : r.kernel_lines) os << k << "\n";
  }
}

}  // namespace

int cmd_traffic_mta(const Args& args) {
  return guarded("traffic", [&]() -> int {
    const auto desc = options();
    const auto parsed = parse_subject_command(
        args, desc, {"traffic", "model", "mta", "flashlab traffic mta --seq 2048", kUsageLine, kSummary});
    if (!parsed) return kOk;  // --help was printed
    const po::variables_map& vm = *parsed;
    require_range("seq", vm["seq"].as<long long>(), 1, 1 << 20);
    require_range("heads", vm["heads"].as<long long>(), 1, 65535);
    require_range("dim", vm["dim"].as<long long>(), 1, 1024);
    require_range("batch", vm["batch"].as<long long>(), 1, 65535);
    require_range("cq", vm["cq"].as<long long>(), 1, 64);
    require_range("ck", vm["ck"].as<long long>(), 1, 64);
    require_range("block", vm["block"].as<long long>(), 1, 1024);
    require_range("splits", vm["splits"].as<long long>(), 1, 65535);
    if (vm["ck"].as<long long>() % 2 == 0)
      throw UsageError("--ck " + std::to_string(vm["ck"].as<long long>()) + " is even",
                       "--ck must be odd so that (ck - 1)/2 key columns pad each side");
    const ref::Shape shape{std::size_t(vm["batch"].as<long long>()), std::size_t(vm["seq"].as<long long>()),
                           std::size_t(vm["heads"].as<long long>()), std::size_t(vm["dim"].as<long long>())};
    if (shape.numel() > kMaxElements)
      throw UsageError("--batch x --seq x --heads x --dim = " + std::to_string(shape.numel()) + " elements per tensor",
                       "at most " + std::to_string(kMaxElements) + "; use fewer tokens or heads");
    mta::Params p;
    p.cq = std::size_t(vm["cq"].as<long long>());
    p.ck = std::size_t(vm["ck"].as<long long>());
    p.block = std::size_t(vm["block"].as<long long>());
    p.splits = std::size_t(vm["splits"].as<long long>());
    const std::string pass = vm["pass"].as<std::string>();
    if (pass != "fwd" && pass != "bwd" && pass != "infer" && pass != "all")
      throw UsageError("--pass '" + pass + "' is unknown", "choose fwd, bwd, infer or all");
    std::vector<std::string> passes = pass == "all" ? std::vector<std::string>{"fwd", "bwd", "infer"}
                                                    : std::vector<std::string>{pass};
    for (const auto& ps : passes) {
      try {
        if (ps == "bwd") (void)mta::backward_tiling(shape.seq, p);
        else (void)mta::forward_tiling(shape.seq, p);
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what(), "--block must exceed the halos (backward: 2*Pq and 4*Pk), e.g. --block 64");
      }
      if (ps == "infer" && p.cq > mta::kInferQueryRows)
        throw UsageError("--cq " + std::to_string(p.cq) + " is too large for the inference pass",
                         "the 16-row query tile needs cq <= 16, or use --pass fwd|bwd");
    }
    const std::string device = vm["device"].as<std::string>();
    if (device != "cpu" && device != "cuda") throw UsageError("--device '" + device + "' is unknown", "choose cpu or cuda");
    const OutputFormat format = output_format(vm);

    std::vector<PassRow> rows;
    for (const auto& ps : passes) rows.push_back(model_row(ps, shape, p));
    if (device == "cuda") {
#ifdef FLASHLAB_HAVE_CUDA
      std::string why;
      if (!flashlab::cuda::device_available(&why)) {
        std::cerr << "error: --device cuda: " << why << "\nhint: run on a machine with an NVIDIA GPU, or use --device cpu\n";
        return kFailed;
      }
      if (format == OutputFormat::text) std::cout << "device: " << flashlab::cuda::device_description() << "\n";
      for (auto& r : rows) measure_row(r, shape, p);
#else
      throw built_without_cuda("--device cuda", "use --device cpu for the model");
#endif
    }
    if (format != OutputFormat::text) print_rows(std::cout, format, rows, shape, p);
    else print_table(std::cout, rows, shape, p);
    return kOk;
  });
}

}  // namespace flashlab::app

// ---- `flashlab mta fwd|bwd|infer --device cpu|cuda` ----
//
// --device cpu hands the remaining flags to the CPU reference command (cmd_mta.cpp). --device
// cuda runs the clear CUDA kernels (fp32) on the same inputs — seeded, or q.npy k.npy v.npy
// w.npy (do.npy) from --inputs — and compares them with the naive float64 reference.

namespace flashlab::app {

namespace {

namespace fs = std::filesystem;
using ref::Shape;
using ref::Tensor;

constexpr std::string_view kMtaUsage =
    "mta fwd|bwd|infer --device cuda [--seq N] [--heads H] [--dim D] [--cq CQ] [--ck CK] [--block B]\n"
    "                [--splits S] [--batch NB] [--seed S] [--scale X] [--inputs DIR] [--save DIR]\n"
    "                [--allow-nonfinite] [--memory-limit SIZE] [--kernel fast|clear] [--dtype bf16|fp16]\n"
    "                [--json|--csv]";
constexpr std::string_view kMtaSummary =
    "Multi-Token Attention on the GPU: the clear fp32 CUDA kernels (forward with O read-modify-written\n"
    "per key tile, backward dQ + dW and dK/dV kernels, split-K inference with its combine kernel),\n"
    "tile for tile with the CPU reference, on seeded inputs or on q.npy k.npy v.npy w.npy (do.npy for\n"
    "bwd) from --inputs DIR. Prints each output's max error against the naive float64 reference\n"
    "(max |gpu - ref| / max |ref|, tolerance 1e-5 for fp32, 1e-4 for dW: a sum whose terms cancel).\n"
    "--save DIR writes the GPU's o.npy (and dq dk dv dw .npy for bwd) as float32. Exit 0 when every\n"
    "error is within tolerance, 1 when not, 2 on bad input. The flags, limits and input rules are the\n"
    "CPU command's (inputs float32 or float64 and finite, --allow-nonfinite lets NaN/Inf through);\n"
    "--device cpu runs the CPU reference command instead.\n"
    "--kernel fast (fwd, bwd) runs the fast tensor-core kernels instead: Q, K, V (dO) rounded to --dtype\n"
    "(bf16 or fp16), W fp32, d = 64 or 128, cq <= 16, odd ck <= 15; the reference gets the rounded values.\n"
    "fwd prints O's error (tolerance 1e-2 and 2x the error of merely rounding the float64 O to the dtype)\n"
    "and LSE's (absolute, tolerance 1e-4 of max(1, max|LSE|)); bwd runs the fast forward for O and LSE,\n"
    "then the fast backward, and prints dQ, dK, dV (tolerance max(1e-2, 2x the rounding error)) and dW\n"
    "(fp32, 1e-2 of max|dW|); --block and --splits are not used.\n"
    "--json and --csv print the CPU command's fields where they mean the same (command, shape, cq, ck,\n"
    "block, splits, scale, tiling, errors, tolerances, dtype, passed) and the GPU's own: device, kernel,\n"
    "the rounding floors of --kernel fast and each output's verdict.";

constexpr double kFp32Tolerance = 1e-5;
// dW is one sum over N²/2 score entries whose terms cancel (Σ_j dŜ[i, j] = 0 on every row), so
// relative to max|dW| its fp32 round-off can exceed 1e-5 though correct (1.6e-5 measured for a
// 1 x 1 kernel of weight 1 at N = 29; the GPU tests hold it to 1e-5 of its terms' scale).
constexpr double kFp32DwTolerance = 1e-4;

// One output of a GPU run checked against the float64 reference.
struct GpuCheck {
  std::string tensor;
  double error = 0;                  // max |gpu - ref| / max |ref| (LSE: absolute / max(1, max|LSE|))
  double tolerance = 0;              // the bound it must stay under
  std::optional<double> floor;       // --kernel fast: the error of merely rounding the reference to the dtype
  bool ok() const { return error <= tolerance; }  // NaN fails
};

bool all_ok(const std::vector<GpuCheck>& checks) {
  return std::all_of(checks.begin(), checks.end(), [](const GpuCheck& c) { return c.ok(); });
}

// --json / --csv of a GPU run: the CPU command's keys where the quantity is the same (cmd_mta.cpp),
// then the GPU's own (device, kernel, floors, each output's verdict). The fast kernels use neither
// --block nor --splits, nor the reference's tiling: those are null there.
[[maybe_unused]] void print_gpu_report(std::ostream& os, OutputFormat format, const MtaInputs& in,
                                       const std::string& device_name, bool fast, ref::Dtype dtype,
                                       const std::vector<GpuCheck>& checks) {
  ReportOutput report(format, os);
  Json& j = report.json();
  const Shape& s = in.shape;
  j.begin_object();
  j.key("command").value("mta " + in.mode);
  j.key("shape").begin_object();
  j.key("batch").value(std::uint64_t(s.batch)).key("seq").value(std::uint64_t(s.seq));
  j.key("heads").value(std::uint64_t(s.heads)).key("dim").value(std::uint64_t(s.head_dim));
  j.end_object();
  j.key("cq").value(std::uint64_t(in.p.cq)).key("ck").value(std::uint64_t(in.p.ck));
  if (fast) {
    j.key("block").null().key("splits").null();
  } else {
    j.key("block").value(std::uint64_t(in.p.block)).key("splits").value(std::uint64_t(in.p.splits));
  }
  j.key("scale").value(ref::mta::resolve_scale(in.p, s.head_dim));
  if (fast) {
    j.key("tiling").null();
  } else {
    const auto t = in.mode == "bwd" ? ref::mta::backward_tiling(s.seq, in.p) : ref::mta::forward_tiling(s.seq, in.p);
    j.key("tiling").begin_object();
    j.key("Br").value(std::uint64_t(t.br)).key("Bc").value(std::uint64_t(t.bc));
    j.key("Tr").value(std::uint64_t(t.tr)).key("Tc").value(std::uint64_t(t.tc));
    j.end_object();
  }
  j.key("errors").begin_object();
  for (const auto& c : checks) j.key(c.tensor).value(c.error);  // NaN/inf → null
  j.end_object();
  j.key("tolerances").begin_object();
  for (const auto& c : checks) j.key(c.tensor).value(c.tolerance);
  j.end_object();
  j.key("dtype").value(ref::dtype_name(dtype));
  j.key("device").value("cuda").key("device_name").value(device_name);
  j.key("kernel").value(fast ? "fast" : "clear");
  if (fast) {
    j.key("floors").begin_object();
    for (const auto& c : checks)
      if (c.floor) j.key(c.tensor).value(*c.floor);
    j.end_object();
  }
  j.key("within").begin_object();
  for (const auto& c : checks) j.key(c.tensor).value(c.ok());
  j.end_object();
  j.key("passed").value(all_ok(checks));
  j.end_object();
  report.finish();
}

#ifdef FLASHLAB_HAVE_CUDA
// Everything below runs only with the CUDA kernels built.

// Prints the errors beside their fp32 tolerances (or the report of --json/--csv); kFailed when
// one is above.
int report(const MtaInputs& in, OutputFormat format, const std::vector<std::pair<std::string, double>>& errors) {
  const std::string& mode = in.mode;
  const ref::mta::Params& p = in.p;
  const Shape& s = in.shape;
  std::vector<GpuCheck> checks;
  for (const auto& [name, e] : errors) checks.push_back({name, e, name == "dW" ? kFp32DwTolerance : kFp32Tolerance, {}});
  const bool passed = all_ok(checks);
  if (format != OutputFormat::text) {
    print_gpu_report(std::cout, format, in, flashlab::cuda::device_description(), false, ref::Dtype::fp32, checks);
  } else {
    std::cout << "flashlab mta " << mode << " --device cuda: " << flashlab::cuda::device_description() << "\n"
              << "batch=" << s.batch << " N=" << s.seq << " H=" << s.heads << " D=" << s.head_dim << ", cq=" << p.cq
              << " ck=" << p.ck << ", block B=" << p.block
              << (mode == "infer" ? ", splits=" + std::to_string(p.splits) : "")
              << "\nmax error vs naive float64 (max |gpu - ref| / max |ref|):\n";
    for (const auto& c : checks) {
      char line[128];
      std::snprintf(line, sizeof line, "  %-4s %.2e  %s  (tolerance %.0e, fp32)\n", c.tensor.c_str(), c.error,
                    c.ok() ? "ok" : "FAILED", c.tolerance);
      std::cout << line;
    }
  }
  if (!passed) {
    std::cerr << "error: the GPU result does not match the float64 reference (see above)\n";
    return kFailed;
  }
  return kOk;
}

/// The rounding floor and tolerances of the fast path (tests/cuda/test_cuda_mta_fast.cpp uses the same).
constexpr double kFastOTolerance = 1e-2;
constexpr double kFastLseTolerance = 1e-4;

// `x` rounded to the 16-bit dtype (nearest even) and widened back: the values the fast kernels
// see, which the reference then gets too.
Tensor<float> rounded_to(const Tensor<double>& x, bool bf16) {
  Tensor<float> out(x.shape());
  for (std::size_t i = 0; i < x.numel(); ++i) {
    out.data()[i] = flashlab::cuda::round_to(float(x.data()[i]), bf16 ? ref::Dtype::bf16 : ref::Dtype::fp16);
  }
  return out;
}

// The problem as the fast kernels take it, their limits checked first (as usage errors).
flashlab::cuda::mta::FastShape checked_fast_shape(const MtaInputs& in, ref::Dtype dtype) {
  flashlab::cuda::mta::FastShape shape;
  shape.batch = int(in.shape.batch);
  shape.seq = int(in.shape.seq);
  shape.heads = int(in.shape.heads);
  shape.head_dim = int(in.shape.head_dim);
  shape.cq = int(in.p.cq);
  shape.ck = int(in.p.ck);
  shape.dtype = dtype;
  if (in.p.scale) shape.scale = float(*in.p.scale);
  try {
    flashlab::cuda::mta::check_fast_shape(shape);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what(), "--kernel fast takes --dim 64 or 128, --cq <= 16 and odd --ck <= 15 (--kernel clear "
                               "takes any)");
  }
  return shape;
}

// The fast forward on checked inputs: Q, K, V rounded to `dtype` (the reference gets the rounded
// values), errors of O and LSE against the naive float64 reference, --save o.npy.
int run_fast_on_gpu(const MtaInputs& in, ref::Dtype dtype, OutputFormat format) {
  const bool bf16 = dtype == ref::Dtype::bf16;
  auto rounded = [&](const Tensor<double>& x) { return rounded_to(x, bf16); };
  (void)checked_fast_shape(in, dtype);
  std::string why;
  if (!flashlab::cuda::device_available(&why)) {
    std::cerr << "error: --device cuda: " << why << "\nhint: run on a machine with an NVIDIA GPU, or use --device cpu\n";
    return kFailed;
  }
  const Tensor<float> q = rounded(in.q), k = rounded(in.k), v = rounded(in.v);
  const ref::mta::Weights<float> w = in.w.cast<float>();
  const auto got = flashlab::cuda::mta::fast_forward(q, k, v, w, in.p, dtype);
  const auto naive = ref::mta::naive_forward<double>(q.cast<double>(), k.cast<double>(), v.cast<double>(),
                                                     w.cast<double>(), in.p);
  const double e_o = rel_to_max(got.o.data(), naive.o.data(), got.o.numel());
  std::vector<float> floor_o(naive.o.numel());
  for (std::size_t i = 0; i < floor_o.size(); ++i) floor_o[i] = flashlab::cuda::round_to(float(naive.o.data()[i]), dtype);
  const double floor = rel_to_max(floor_o.data(), naive.o.data(), floor_o.size());
  // LSE: the kernel's base 2, [B, H, N], against the reference's natural log, [B, N, H, 1].
  const Shape& s = in.shape;
  double lse_scale = 1.0, lse_diff = 0.0;
  for (std::size_t i = 0; i < naive.lse.numel(); ++i) lse_scale = std::max(lse_scale, std::abs(naive.lse.data()[i]));
  for (std::size_t b = 0; b < s.batch; ++b)
    for (std::size_t n = 0; n < s.seq; ++n)
      for (std::size_t h = 0; h < s.heads; ++h) {
        const double lse = double(got.lse[(b * s.heads + h) * s.seq + n]) * 0.6931471805599453;  // · ln 2
        const double e = std::abs(lse - naive.lse.data()[(b * s.seq + n) * s.heads + h]);
        lse_diff = std::isfinite(e) ? std::max(lse_diff, e) : std::numeric_limits<double>::infinity();
      }
  const double e_lse = lse_diff / lse_scale;
  if (in.save_dir) save_output(*in.save_dir, "o.npy", got.o, in.batched);
  const bool ok_o = e_o <= kFastOTolerance && e_o <= 2.0 * floor + 1e-7, ok_lse = e_lse <= kFastLseTolerance;
  if (format != OutputFormat::text) {
    const std::vector<GpuCheck> checks = {{"O", e_o, std::min(kFastOTolerance, 2.0 * floor + 1e-7), floor},
                                          {"LSE", e_lse, kFastLseTolerance, {}}};
    print_gpu_report(std::cout, format, in, flashlab::cuda::device_description(), true, dtype, checks);
  } else {
    std::cout << "flashlab mta fwd --device cuda --kernel fast: " << flashlab::cuda::device_description() << "\n"
              << "batch=" << s.batch << " N=" << s.seq << " H=" << s.heads << " D=" << s.head_dim << ", cq=" << in.p.cq
              << " ck=" << in.p.ck << ", " << ref::dtype_name(dtype) << " inputs, fp32 accumulation\n"
              << "max error vs naive float64 on the rounded inputs:\n";
    char line[200];
    std::snprintf(line, sizeof line, "  O    %.2e  %s  (tolerance 1e-2 and 2 x %.2e, the error of rounding the exact O)\n",
                  e_o, ok_o ? "ok" : "FAILED", floor);
    std::cout << line;
    std::snprintf(line, sizeof line, "  LSE  %.2e  %s  (absolute / max(1, max|LSE|), tolerance 1e-4)\n", e_lse,
                  ok_lse ? "ok" : "FAILED");
    std::cout << line;
  }
  if (!(ok_o && ok_lse)) {
    std::cerr << "error: the GPU result does not match the float64 reference (see above)\n";
    return kFailed;
  }
  return kOk;
}

// Error of 16-bit results (bit patterns) against the float64 reference, and the error of the
// reference merely rounded to the dtype (the floor of any 16-bit output).
std::pair<double, double> error_and_floor_16(const std::vector<std::uint16_t>& got, const Tensor<double>& want,
                                             bool bf16) {
  const ref::Dtype dtype = bf16 ? ref::Dtype::bf16 : ref::Dtype::fp16;
  const std::vector<float> g = flashlab::cuda::from_bits16(got, dtype);
  std::vector<float> r(want.numel());
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = flashlab::cuda::round_to(float(want.data()[i]), dtype);
  return {rel_to_max(g.data(), want.data(), g.size()), rel_to_max(r.data(), want.data(), r.size())};
}

// The fast backward on checked inputs: Q, K, V, dO rounded to `dtype`, O and LSE from the fast
// forward, dQ, dK, dV (16-bit) and dW (fp32) against the naive float64 backward on the rounded
// inputs, --save dq dk dv dw .npy (float32).
int run_fast_bwd_on_gpu(const MtaInputs& in, ref::Dtype dtype, OutputFormat format) {
  namespace fm = flashlab::cuda::mta;
  const bool bf16 = dtype == ref::Dtype::bf16;
  const fm::FastShape shape = checked_fast_shape(in, dtype);
  std::string why;
  if (!flashlab::cuda::device_available(&why)) {
    std::cerr << "error: --device cuda: " << why << "\nhint: run on a machine with an NVIDIA GPU, or use --device cpu\n";
    return kFailed;
  }
  const Tensor<float> q = rounded_to(in.q, bf16), k = rounded_to(in.k, bf16), v = rounded_to(in.v, bf16),
                      d_o = rounded_to(in.d_o, bf16);
  const ref::mta::Weights<float> w = in.w.cast<float>();
  const auto fwd = fm::fast_forward(q, k, v, w, in.p, dtype);
  auto bits = [&](const Tensor<float>& x) {  // exact: every value is already a 16-bit one
    return flashlab::cuda::to_bits16(x.data(), x.numel(), dtype);
  };
  const std::vector<float> w_host(w.data(), w.data() + w.numel());
  const auto g = fm::fast_backward(shape, bits(q), bits(k), bits(v), w_host, bits(fwd.o), bits(d_o), fwd.lse);
  const auto want = ref::mta::naive_backward<double>(q.cast<double>(), k.cast<double>(), v.cast<double>(),
                                                     w.cast<double>(), d_o.cast<double>(), in.p);
  const Shape& s = in.shape;
  std::vector<GpuCheck> checks;
  const std::pair<const char*, const std::vector<std::uint16_t>*> grads[] = {{"dQ", &g.dQ}, {"dK", &g.dK}, {"dV", &g.dV}};
  const Tensor<double>* wants[] = {&want.dq, &want.dk, &want.dv};
  for (int t = 0; t < 3; ++t) {
    const auto [err, floor] = error_and_floor_16(*grads[t].second, *wants[t], bf16);
    checks.push_back({grads[t].first, err, std::max(kFastOTolerance, 2.0 * floor), floor});
  }
  checks.push_back({"dW", rel_to_max(g.dW.data(), want.dw.data(), g.dW.size()), kFastOTolerance, {}});
  const bool passed = all_ok(checks);
  if (format != OutputFormat::text) {
    print_gpu_report(std::cout, format, in, flashlab::cuda::device_description(), true, dtype, checks);
  } else {
    std::cout << "flashlab mta bwd --device cuda --kernel fast: " << flashlab::cuda::device_description() << "\n"
              << "batch=" << s.batch << " N=" << s.seq << " H=" << s.heads << " D=" << s.head_dim << ", cq=" << in.p.cq
              << " ck=" << in.p.ck << ", " << ref::dtype_name(dtype) << " inputs, fp32 accumulation\n"
              << "max error vs naive float64 on the rounded inputs (max |gpu - ref| / max |ref|):\n";
    char line[200];
    for (const auto& c : checks) {
      if (c.floor)
        std::snprintf(line, sizeof line,
                      "  %-3s  %.2e  %s  (tolerance max(1e-2, 2 x %.2e), the error of rounding the exact %s)\n",
                      c.tensor.c_str(), c.error, c.ok() ? "ok" : "FAILED", *c.floor, c.tensor.c_str());
      else
        std::snprintf(line, sizeof line, "  dW   %.2e  %s  (fp32, tolerance 1e-2)\n", c.error, c.ok() ? "ok" : "FAILED");
      std::cout << line;
    }
  }
  if (in.save_dir) {
    auto widened = [&](const std::vector<std::uint16_t>& x) {
      Tensor<float> out(in.shape);
      const std::vector<float> wide = flashlab::cuda::from_bits16(x, dtype);
      std::copy(wide.begin(), wide.end(), out.data());
      return out;
    };
    save_output(*in.save_dir, "dq.npy", widened(g.dQ), in.batched);
    save_output(*in.save_dir, "dk.npy", widened(g.dK), in.batched);
    save_output(*in.save_dir, "dv.npy", widened(g.dV), in.batched);
    ref::write_npy(*in.save_dir / "dw.npy", {in.shape.heads, in.p.cq, in.p.ck}, g.dW.data());
  }
  if (!passed) {
    std::cerr << "error: the GPU result does not match the float64 reference (see above)\n";
    return kFailed;
  }
  return kOk;
}

// The GPU run on checked inputs: fp32 kernels, errors against the naive float64 reference.
int run_on_gpu(const MtaInputs& in, OutputFormat format) {
  const std::string& mode = in.mode;
  const ref::mta::Params& p = in.p;
  const std::optional<fs::path>& save_dir = in.save_dir;
  std::string why;
  if (!flashlab::cuda::device_available(&why)) {
    std::cerr << "error: --device cuda: " << why << "\nhint: run on a machine with an NVIDIA GPU, or use --device cpu\n";
    return kFailed;
  }
  // The GPU gets fp32; the reference gets exactly those fp32 values in float64.
  const Tensor<float> q = in.q.cast<float>(), k = in.k.cast<float>(), v = in.v.cast<float>();
  const ref::mta::Weights<float> w = in.w.cast<float>();
  const Tensor<double> qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>();
  const ref::mta::Weights<double> wd = w.cast<double>();
  const auto naive = ref::mta::naive_forward<double>(qd, kd, vd, wd, p);
  std::vector<std::pair<std::string, double>> errors;
  if (mode == "fwd" || mode == "bwd") {
    const auto fwd = flashlab::cuda::mta::forward(q, k, v, w, p);
    errors.emplace_back("O", rel_to_max(fwd.o.data(), naive.o.data(), fwd.o.numel()));
    if (save_dir) save_output(*save_dir, "o.npy", fwd.o, in.batched);
    if (mode == "bwd") {
      const Tensor<float> d_o = in.d_o.cast<float>();
      const auto g = flashlab::cuda::mta::backward(q, k, v, w, fwd.o, fwd.m, fwd.l, d_o, p);
      const auto gn = ref::mta::naive_backward<double>(qd, kd, vd, wd, d_o.cast<double>(), p);
      errors.emplace_back("dQ", rel_to_max(g.dq.data(), gn.dq.data(), g.dq.numel()));
      errors.emplace_back("dK", rel_to_max(g.dk.data(), gn.dk.data(), g.dk.numel()));
      errors.emplace_back("dV", rel_to_max(g.dv.data(), gn.dv.data(), g.dv.numel()));
      errors.emplace_back("dW", rel_to_max(g.dw.data(), gn.dw.data(), g.dw.numel()));
      if (save_dir) {
        save_output(*save_dir, "dq.npy", g.dq, in.batched);
        save_output(*save_dir, "dk.npy", g.dk, in.batched);
        save_output(*save_dir, "dv.npy", g.dv, in.batched);
        ref::write_npy(*save_dir / "dw.npy", {g.dw.heads(), g.dw.cq(), g.dw.ck()}, g.dw.data());
      }
    }
  } else {
    const auto last = flashlab::cuda::mta::infer(q, k, v, w, p);
    Tensor<double> want(last.shape());
    for (std::size_t b = 0; b < in.shape.batch; ++b)
      for (std::size_t h = 0; h < in.shape.heads; ++h)
        want.head(b, h).row(0) = naive.o.head(b, h).row(Eigen::Index(in.shape.seq) - 1);
    errors.emplace_back("O", rel_to_max(last.data(), want.data(), last.numel()));
    if (save_dir) save_output(*save_dir, "o.npy", last, in.batched);  // [B, 1, H, D]: the last token
  }

  return report(in, format, errors);
}
#endif

// Parsing and every check run before any CUDA call, with the CPU command's flags and rules
// (mta_inputs.hpp): the same bad input gets the same error on both devices, in any build.
int run_mta_cuda(const Args& args) {
  po::options_description desc("Options"), hidden;
  desc.add_options()("help,h", "show this help")
      ("kernel", po::value<std::string>()->default_value("clear"),
       "fast | clear: the fast tensor-core forward and backward, or the clear fp32 kernels (the default)")
      ;
  add_dtype_option(desc, "bf16 | fp16", "bf16", " (--kernel fast; the clear kernels are fp32)");
  add_mta_options(desc, hidden, 32);
  add_output_options(desc);
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("mode", 1);
  const auto vm = parse(args, all, &pos);
  if (vm.count("help")) {
    print_help(std::cout, kMtaUsage, kMtaSummary, desc);
    return kOk;
  }
  const OutputFormat format = output_format(vm);
  const bool fast = kernel_family(vm["kernel"].as<std::string>(), KernelFamily::clear) == KernelFamily::fast;
  const ref::Dtype fast_dtype = fp16_dtype(vm["dtype"].as<std::string>()) ? ref::Dtype::fp16 : ref::Dtype::bf16;
  const MtaInputs in = mta_inputs(vm);
  if (fast && in.mode == "infer")
    throw UsageError("--kernel fast runs mta fwd and bwd", "use --kernel clear for mta infer");
#ifdef FLASHLAB_HAVE_CUDA
  if (fast) return in.mode == "bwd" ? run_fast_bwd_on_gpu(in, fast_dtype, format) : run_fast_on_gpu(in, fast_dtype, format);
  return run_on_gpu(in, format);
#else
  (void)fast_dtype;
  (void)format;
  throw built_without_cuda("--device cuda", "use --device cpu");
#endif
}

}  // namespace

bool mta_device_given(const Args& args) { return !device_flag(args).empty(); }

int cmd_mta_device(const Args& args) { return dispatch_device(args, "mta", cmd_mta, run_mta_cuda); }

}  // namespace flashlab::app
