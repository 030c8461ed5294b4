// `flashlab mta fwd|bwd|infer`: runs the flash MTA reference (the MTA kernels) on seeded or given
// inputs, compares it with the naive float64 result, and prints the traffic its tile loops
// counted beside the closed-form formula. Parsing and formatting only; the algorithms live in
// reference/ (mta.hpp, mta_traffic.hpp).
#include "commands.hpp"
#include "input_checks.hpp"
#include "progress.hpp"

#include "flashlab/reference/mta.hpp"
#include "flashlab/reference/mta_traffic.hpp"
#include "flashlab/reference/npy.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace flashlab::app {

namespace {

namespace fs = std::filesystem;
namespace mta = flashlab::ref::mta;
using ref::Shape;
using ref::Tensor;

constexpr std::string_view kUsage =
    "mta fwd|bwd|infer [--seq N] [--heads H] [--dim D] [--cq CQ] [--ck CK] [--block B] [--splits S]\n"
    "                [--batch NB] [--seed S] [--scale X] [--dtype T] [--inputs DIR] [--save DIR] [--json]";
constexpr std::string_view kSummary =
    "Multi-Token Attention on the CPU reference (the MTA kernels): per head S = scale*QK^T, causal zeros,\n"
    "a cq x ck convolution over (query, key) (cq-1 rows of past-query padding, (ck-1)/2 key columns\n"
    "each side), causal -inf mask, softmax, O = PV. Runs the flash path (fwd: forward, bwd: backward\n"
    "dQ dK dV dW, infer: split-K output of the last token), prints its max error against the naive\n"
    "float64 result and the HBM traffic its tile loops counted (checked against the closed-form\n"
    "formula). Exit 0 when both agree, 1 when a check fails, 2 on bad input.\n"
    "--inputs DIR reads q.npy k.npy v.npy ([B,N,H,D] or [N,H,D]), w.npy ([H,cq,ck]) and, for bwd,\n"
    "do.npy; --save DIR writes o.npy (and dq.npy dk.npy dv.npy dw.npy for bwd) as float64.\n"
    "Inputs are float32 or float64 and finite (--allow-nonfinite lets NaN/Inf through). The float64\n"
    "tolerance is scaled up by L/64 when the logit bound L = scale*max|q|*max|k|*max sum|W| exceeds 64.";

// Largest sizes the naive N x N reference is allowed to materialise (memory, not correctness).
constexpr long long kMaxSeq = 4096, kMaxDim = 1024, kMaxHeads = 256, kMaxBatch = 256;
constexpr long long kMaxKernel = 64, kMaxBlock = 1024, kMaxSplits = 4096;
// Float64 round-off, relative to the reference tensor's max |value| (docs/mta.md). dW is one sum
// over batch·N²/2 score entries per head, so its round-off grows with batch·N (measured: 3e-14 at
// N = 1024, 2.2e-13 at N = 4096, cq = 3, ck = 5); its tolerance scales with it.
constexpr double kTolerance = 1e-12;
double dw_tolerance(const Shape& s) { return kTolerance * std::max(1.0, double(s.batch * s.seq) / 1024.0); }

struct Problem {
  Shape shape;
  mta::Params p;
  bool batched = true;  // inputs carried a batch dimension (outputs mirror the input rank)
  Tensor<double> q, k, v, d_o;
  mta::Weights<double> w;
};

// max |got − ref| / max |ref|; NaN or inf anywhere → +inf (never passes).
double rel_to_max(const double* got, const double* ref, std::size_t n) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(got[i] - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

std::string flag_value(const po::variables_map& vm, const char* flag) {
  return std::to_string(vm[flag].as<long long>());
}

// What a run holds at its peak, from the sizes alone: the inputs and outputs of the flash path and
// of the naive reference (float64), and the naive reference's N x N matrices of one head.
void require_mta_memory(const InputPolicy& policy, const Shape& s, const std::string& mode) {
  const std::uint64_t n = checked_size({s.batch, s.seq, s.heads, s.head_dim}, "batch*seq*heads*dim");
  MemoryPlan plan;
  plan.add("q, k, v, do", n, 8, 4);
  plan.add(mode == "bwd" ? "O and dQ, dK, dV (flash and naive)" : "O (flash and naive)", n, 8, mode == "bwd" ? 8 : 2);
  plan.add("naive N x N matrices of one head", checked_size({s.seq, s.seq}, "N x N"), 8, mode == "bwd" ? 6 : 2);
  plan.require_within(policy, "mta " + mode + " on [B, N, H, D] = " + s.str());
}

constexpr const char* kInputsHint = "write it with numpy.save (float32 or float64, C order)";

// The header of a tensor file of the inputs directory (format and dtype checked), naming the file.
ref::NpyHeader input_header(const fs::path& dir, const char* name) {
  const fs::path file = dir / name;
  if (!fs::exists(file))
    throw UsageError(file.string() + ": no such file", std::string("--inputs DIR must hold ") + name);
  return float_input_header(file, kInputsHint);
}

Tensor<double> to_tensor(const std::vector<double>& values, const Shape& s) {
  Tensor<double> t(s);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

// Dimensions come from q.npy and w.npy; a flag given explicitly must agree with them.
void load_inputs(Problem& pr, const fs::path& dir, const po::variables_map& vm, const std::string& mode,
                 const InputPolicy& policy) {
  const bool need_do = mode == "bwd";
  if (!fs::is_directory(dir)) throw UsageError("--inputs " + dir.string() + ": not a directory");
  const auto qa = input_header(dir, "q.npy");
  const fs::path qfile = dir / "q.npy";
  if (qa.shape.size() != 3 && qa.shape.size() != 4)
    throw UsageError(qfile.string() + ": shape " + ref::shape_str(qa.shape) + " is not [B, N, H, D] or [N, H, D]");
  pr.batched = qa.shape.size() == 4;
  const std::size_t off = pr.batched ? 1 : 0;
  pr.shape = Shape{pr.batched ? qa.shape[0] : 1, qa.shape[off], qa.shape[off + 1], qa.shape[off + 2]};
  const std::pair<const char*, std::size_t> dims[] = {
      {"batch", pr.shape.batch}, {"seq", pr.shape.seq}, {"heads", pr.shape.heads}, {"dim", pr.shape.head_dim}};
  const long long limits[] = {kMaxBatch, kMaxSeq, kMaxHeads, kMaxDim};
  for (std::size_t i = 0; i < 4; ++i) {
    const auto [flag, value] = dims[i];
    if (value < 1 || (long long)value > limits[i])
      throw UsageError(qfile.string() + ": " + flag + " = " + std::to_string(value) + " is out of range",
                       "the reference takes " + std::string(flag) + " from 1 to " + std::to_string(limits[i]));
    if (!vm[flag].defaulted() && vm[flag].as<long long>() != (long long)value)
      throw UsageError("--" + std::string(flag) + " " + flag_value(vm, flag) + " disagrees with " + qfile.string() +
                           " (shape " + ref::shape_str(qa.shape) + ")",
                       "drop the flag: with --inputs the sizes come from the files");
  }
  auto same_as_q = [&](const char* name) {
    const auto a = input_header(dir, name);
    if (a.shape != qa.shape)
      throw UsageError((dir / name).string() + ": shape " + ref::shape_str(a.shape) + " differs from q.npy " +
                           ref::shape_str(qa.shape),
                       "q, k, v (and do) must have the same shape");
  };
  same_as_q("k.npy");
  same_as_q("v.npy");
  if (need_do) same_as_q("do.npy");

  const auto wa = input_header(dir, "w.npy");
  const fs::path wfile = dir / "w.npy";
  if (wa.shape.size() != 3 || wa.shape[0] != pr.shape.heads)
    throw UsageError(wfile.string() + ": shape " + ref::shape_str(wa.shape) + " is not [HEAD_NUM, cq, ck] with HEAD_NUM = " +
                         std::to_string(pr.shape.heads),
                     "one cq x ck kernel per head");
  const std::size_t cq = wa.shape[1], ck = wa.shape[2];
  if (cq < 1 || (long long)cq > kMaxKernel || ck < 1 || (long long)ck > kMaxKernel)
    throw UsageError(wfile.string() + ": kernel " + std::to_string(cq) + " x " + std::to_string(ck) + " is out of range",
                     "cq and ck take values from 1 to " + std::to_string(kMaxKernel));
  if (ck % 2 == 0)
    throw UsageError(wfile.string() + ": ck = " + std::to_string(ck) + " is even",
                     "ck must be odd so that (ck - 1)/2 key columns pad each side");
  for (const auto& [flag, value] : {std::pair<const char*, std::size_t>{"cq", cq}, {"ck", ck}})
    if (!vm[flag].defaulted() && vm[flag].as<long long>() != (long long)value)
      throw UsageError("--" + std::string(flag) + " " + flag_value(vm, flag) + " disagrees with " + wfile.string() +
                           " (shape " + ref::shape_str(wa.shape) + ")",
                       "drop the flag: with --inputs the kernel size comes from w.npy");
  // Every header agrees: size the run, then read the payloads.
  require_mta_memory(policy, pr.shape, mode);
  pr.q = to_tensor(read_float_input(qfile, policy, kInputsHint), pr.shape);
  pr.k = to_tensor(read_float_input(dir / "k.npy", policy, kInputsHint), pr.shape);
  pr.v = to_tensor(read_float_input(dir / "v.npy", policy, kInputsHint), pr.shape);
  if (need_do) pr.d_o = to_tensor(read_float_input(dir / "do.npy", policy, kInputsHint), pr.shape);
  const auto wv = read_float_input(wfile, policy, kInputsHint);
  pr.p.cq = cq;
  pr.p.ck = ck;
  pr.w = mta::Weights<double>(pr.shape.heads, cq, ck);
  std::copy(wv.begin(), wv.end(), pr.w.data());
}

// The tile constraints, as usage errors naming --block (and the kernel flags behind them).
void check_tiles(const std::string& mode, const mta::Params& p) {
  const std::size_t pq = p.pq(), pk = p.pk();
  const bool bwd = mode == "bwd";
  const std::size_t need_r = bwd ? 2 * pq : pq, need_c = bwd ? 4 * pk : 2 * pk;
  if (p.block <= need_r || p.block <= need_c) {
    std::ostringstream msg, hint;
    msg << "--block " << p.block << " leaves no effective tile for mta " << mode << " with cq = " << p.cq
        << ", ck = " << p.ck;
    hint << "--block must exceed " << (bwd ? "2*Pq = " : "Pq = ") << need_r << " and " << (bwd ? "4*Pk = " : "2*Pk = ")
         << need_c << " (Pq = cq - 1, Pk = (ck - 1)/2" << (bwd ? "; the backward halos are doubled)" : ")")
         << ", e.g. --block " << std::max(need_r, need_c) + 8;
    throw UsageError(msg.str(), hint.str());
  }
  if (mode == "infer" && p.cq > mta::kInferQueryRows)
    throw UsageError("--cq " + std::to_string(p.cq) + " is too large for mta infer",
                     "the inference query tile holds the last 16 tokens, so cq must be at most 16");
}

void save_tensor(const fs::path& dir, const char* name, const Tensor<double>& t, bool batched) {
  const Shape& s = t.shape();
  std::vector<std::size_t> shape = {s.seq, s.heads, s.head_dim};
  if (batched) shape.insert(shape.begin(), s.batch);
  ref::write_npy(dir / name, shape, t.data());
}

struct ErrorLine {
  std::string tensor;
  double error = 0;      // max |flash − naive| / max |naive|
  double tolerance = 0;  // what counts as float64 round-off for this tensor
};

struct Report {
  std::vector<ErrorLine> errors;
  ref::Traffic counted, formula;
  bool traffic_equal = true;
  std::string tolerance_note;  // why the tolerances were raised, when they were
};

bool same_traffic(const ref::Traffic& a, const ref::Traffic& b) {
  if (a.tensors().size() != b.tensors().size() || a.flops() != b.flops()) return false;
  for (const auto& t : a.tensors()) {
    const auto* u = b.find(t.name);
    if (!u || u->read_elements != t.read_elements || u->write_elements != t.write_elements ||
        u->element_bytes != t.element_bytes)
      return false;
  }
  return true;
}

void print_text(std::ostream& os, const std::string& mode, const Problem& pr, const Report& r, double scale) {
  const auto& s = pr.shape;
  os << "flashlab mta " << mode << ": batch=" << s.batch << " N=" << s.seq << " H=" << s.heads << " D=" << s.head_dim
     << ", cq=" << pr.p.cq << " ck=" << pr.p.ck << ", block B=" << pr.p.block;
  const auto t = mode == "bwd" ? mta::backward_tiling(s.seq, pr.p) : mta::forward_tiling(s.seq, pr.p);
  os << " (Br=" << t.br << " Bc=" << t.bc << " Tr=" << t.tr << " Tc=" << t.tc << ")";
  if (mode == "infer") os << ", splits=" << pr.p.splits;
  os << ", scale=" << std::setprecision(6) << scale << "\n\n";
  os << "max error vs naive float64 (max |flash - naive| / max |naive|):\n";
  for (const auto& e : r.errors)
    os << "  " << std::left << std::setw(4) << e.tensor << std::right << " " << std::scientific << std::setprecision(2)
       << e.error << (e.error <= e.tolerance ? "  ok" : "  FAILED") << "  (tolerance " << std::setprecision(1)
       << e.tolerance << ")" << std::defaultfloat << "\n";
  if (!r.tolerance_note.empty()) os << "  " << r.tolerance_note << "\n";
  os << "\ntraffic (" << ref::dtype_name(r.counted.dtype()) << ", statistics fp32), counted by the tile loops:\n";
  os << "  " << std::left << std::setw(6) << "tensor" << std::right << std::setw(14) << "read elems" << std::setw(14)
     << "write elems" << std::setw(14) << "read bytes" << std::setw(14) << "write bytes" << "\n";
  for (const auto& tt : r.counted.tensors())
    os << "  " << std::left << std::setw(6) << tt.name << std::right << std::setw(14) << tt.read_elements
       << std::setw(14) << tt.write_elements << std::setw(14) << tt.read_bytes() << std::setw(14) << tt.write_bytes()
       << "\n";
  os << "  " << std::left << std::setw(6) << "total" << std::right << std::setw(14) << "" << std::setw(14) << ""
     << std::setw(14) << r.counted.total_read_bytes() << std::setw(14) << r.counted.total_write_bytes() << "\n";
  os << "  flops (tile products) " << r.counted.flops() << "\n";
  os << "closed-form formula (mta_traffic.hpp): " << (r.traffic_equal ? "equal" : "DIFFERS") << "\n";
}

void print_json(std::ostream& os, const std::string& mode, const Problem& pr, const Report& r, double scale,
                bool passed) {
  Json j(os);
  j.begin_object();
  j.key("command").value("mta " + mode);
  j.key("shape").begin_object();
  j.key("batch").value(std::uint64_t(pr.shape.batch)).key("seq").value(std::uint64_t(pr.shape.seq));
  j.key("heads").value(std::uint64_t(pr.shape.heads)).key("dim").value(std::uint64_t(pr.shape.head_dim));
  j.end_object();
  j.key("cq").value(std::uint64_t(pr.p.cq)).key("ck").value(std::uint64_t(pr.p.ck));
  j.key("block").value(std::uint64_t(pr.p.block)).key("splits").value(std::uint64_t(pr.p.splits));
  j.key("scale").value(scale);
  const auto t = mode == "bwd" ? mta::backward_tiling(pr.shape.seq, pr.p) : mta::forward_tiling(pr.shape.seq, pr.p);
  j.key("tiling").begin_object();
  j.key("Br").value(std::uint64_t(t.br)).key("Bc").value(std::uint64_t(t.bc));
  j.key("Tr").value(std::uint64_t(t.tr)).key("Tc").value(std::uint64_t(t.tc));
  j.end_object();
  j.key("errors").begin_object();
  for (const auto& e : r.errors) j.key(e.tensor).value(e.error);  // NaN/inf → null
  j.end_object();
  j.key("tolerances").begin_object();
  for (const auto& e : r.errors) j.key(e.tensor).value(e.tolerance);
  j.end_object();
  j.key("dtype").value(ref::dtype_name(r.counted.dtype()));
  j.key("traffic").begin_array();
  for (const auto& tt : r.counted.tensors()) {
    j.begin_object();
    j.key("tensor").value(tt.name);
    j.key("read_elements").value(tt.read_elements).key("write_elements").value(tt.write_elements);
    j.key("read_bytes").value(tt.read_bytes()).key("write_bytes").value(tt.write_bytes());
    j.end_object();
  }
  j.end_array();
  j.key("total_read_bytes").value(r.counted.total_read_bytes());
  j.key("total_write_bytes").value(r.counted.total_write_bytes());
  j.key("flops").value(r.counted.flops());
  j.key("formula_equal").value(r.traffic_equal);
  j.key("passed").value(passed);
  j.end_object();
  j.finish();
}

int run(const Args& args) {
  po::options_description desc("Options");
  // Sizes are parsed as signed so that "-3" reaches require_range instead of wrapping around.
  desc.add_options()("help,h", "show this help")
      ("seq", po::value<long long>()->default_value(64), "N, sequence length")
      ("heads", po::value<long long>()->default_value(2), "H, number of heads (one kernel W per head)")
      ("dim", po::value<long long>()->default_value(16), "D, head dimension")
      ("cq", po::value<long long>()->default_value(2), "kernel rows (query direction); Pq = cq - 1")
      ("ck", po::value<long long>()->default_value(3), "kernel columns (key direction), odd; Pk = (ck - 1)/2")
      ("block", po::value<long long>()->default_value(16), "B, the loaded (overlapping) tile size")
      ("splits", po::value<long long>()->default_value(1), "key splits of the split-K inference path")
      ("batch", po::value<long long>()->default_value(1), "batch size")
      ("seed", po::value<long long>()->default_value(0), "seed of the random inputs")
      ("scale", po::value<double>(), "softmax scale (default 1/sqrt(D))")
      ("dtype", po::value<std::string>()->default_value("fp32"), "element type for traffic bytes: fp32 bf16 fp16 fp64")
      ("inputs", po::value<std::string>(), "read q.npy k.npy v.npy w.npy (do.npy for bwd) from DIR")
      ("save", po::value<std::string>(), "write o.npy (dq dk dv dw .npy for bwd) to DIR")
      ("json", "print JSON instead of text");
  add_input_options(desc);
  po::options_description hidden;
  hidden.add_options()("mode", po::value<std::string>(), "fwd, bwd or infer");
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("mode", 1);
  const auto vm = parse(args, all, &pos);
  if (vm.count("help")) {
    print_help(std::cout, kUsage, kSummary, desc);
    return kOk;
  }
  if (!vm.count("mode")) throw UsageError("missing mode: fwd, bwd or infer", "e.g. flashlab mta fwd --seq 64");
  const std::string mode = vm["mode"].as<std::string>();
  if (mode != "fwd" && mode != "bwd" && mode != "infer")
    throw UsageError("unknown mode '" + mode + "'", "choose fwd, bwd or infer");

  require_range("seq", vm["seq"].as<long long>(), 1, kMaxSeq);
  require_range("heads", vm["heads"].as<long long>(), 1, kMaxHeads);
  require_range("dim", vm["dim"].as<long long>(), 1, kMaxDim);
  require_range("batch", vm["batch"].as<long long>(), 1, kMaxBatch);
  require_range("cq", vm["cq"].as<long long>(), 1, kMaxKernel);
  require_range("ck", vm["ck"].as<long long>(), 1, kMaxKernel);
  require_range("block", vm["block"].as<long long>(), 1, kMaxBlock);
  require_range("splits", vm["splits"].as<long long>(), 1, kMaxSplits);
  if (vm["ck"].as<long long>() % 2 == 0)
    throw UsageError("--ck " + flag_value(vm, "ck") + " is even",
                     "--ck must be odd so that (ck - 1)/2 key columns pad each side");
  ref::Dtype dtype;
  try {
    dtype = ref::parse_dtype(vm["dtype"].as<std::string>());
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--dtype: ") + e.what());
  }

  Problem pr;
  pr.p.block = std::size_t(vm["block"].as<long long>());
  pr.p.splits = std::size_t(vm["splits"].as<long long>());
  if (const auto s = checked_scale(vm)) pr.p.scale = *s;
  const auto seed = checked_seed(vm["seed"].as<long long>());
  const InputPolicy policy = input_policy(vm);
  if (vm.count("inputs")) {
    load_inputs(pr, vm["inputs"].as<std::string>(), vm, mode, policy);
  } else {
    pr.shape = Shape{std::size_t(vm["batch"].as<long long>()), std::size_t(vm["seq"].as<long long>()),
                     std::size_t(vm["heads"].as<long long>()), std::size_t(vm["dim"].as<long long>())};
    pr.p.cq = std::size_t(vm["cq"].as<long long>());
    pr.p.ck = std::size_t(vm["ck"].as<long long>());
    require_mta_memory(policy, pr.shape, mode);
    pr.q = Tensor<double>(pr.shape);
    pr.k = Tensor<double>(pr.shape);
    pr.v = Tensor<double>(pr.shape);
    pr.d_o = Tensor<double>(pr.shape);
    ref::fill_normal(pr.q, seed * 8 + 1);
    ref::fill_normal(pr.k, seed * 8 + 2);
    ref::fill_normal(pr.v, seed * 8 + 3);
    ref::fill_normal(pr.d_o, seed * 8 + 4);
    pr.w = mta::random_weights(pr.shape.heads, pr.p.cq, pr.p.ck, seed * 8 + 5);
  }
  check_tiles(mode, pr.p);
  std::optional<fs::path> save_dir;
  if (vm.count("save")) {
    save_dir = fs::path(vm["save"].as<std::string>());
    std::error_code ec;
    fs::create_directories(*save_dir, ec);
    if (ec || !fs::is_directory(*save_dir))
      throw UsageError("--save " + save_dir->string() + ": cannot create the directory (" + ec.message() + ")");
  }
  const double scale = mta::resolve_scale(pr.p, pr.shape.head_dim);

  // Conditioning (input_checks.hpp): a logit of the convolved scores is bounded by
  // L = scale·max‖q_i‖·max‖k_j‖·max_h Σ|W_h|; above 64 the float64 tolerances grow with L.
  const std::size_t d = pr.shape.head_dim, taps = pr.p.cq * pr.p.ck;
  double w_sum = 0;
  for (std::size_t h = 0; h < pr.w.heads(); ++h) {
    double sum = 0;
    for (std::size_t i = 0; i < taps; ++i) sum += std::abs(pr.w.data()[h * taps + i]);
    w_sum = std::max(w_sum, sum);
  }
  const double logit_bound = std::abs(scale) * max_row_norm(pr.q.data(), pr.q.numel() / d, d) *
                             max_row_norm(pr.k.data(), pr.k.numel() / d, d) * w_sum;
  const Tolerance conditioned = conditioned_tolerance(kTolerance, logit_bound);
  const double tol = conditioned.value;
  const double tol_dw = conditioned_tolerance(dw_tolerance(pr.shape), logit_bound).value;

  // Work ≈ 4·B·H·N²·D flops for a forward, ≈ 2.5× that for a backward; stages in the order below.
  const double fwd_work = 4.0 * double(pr.shape.batch * pr.shape.heads) * double(pr.shape.seq) *
                          double(pr.shape.seq) * double(d);
  std::vector<Stage> stages = {{"naive float64 forward", fwd_work}, {"flash " + mode, fwd_work}};
  if (mode == "bwd") stages.insert(stages.end(), {{"flash backward", 2.5 * fwd_work}, {"naive backward", 2.5 * fwd_work}});
  Progress progress("mta " + mode, std::move(stages));

  Report r{{}, ref::Traffic(dtype), ref::Traffic(dtype), true, {}};
  if (conditioned.scaled()) r.tolerance_note = "tolerances scaled by conditioning: " + conditioned.str();
  const auto naive = mta::naive_forward(pr.q, pr.k, pr.v, pr.w, pr.p);
  progress.next();
  if (mode == "fwd") {
    const auto fl = mta::flash_forward(pr.q, pr.k, pr.v, pr.w, pr.p, &r.counted);
    r.formula = mta::forward_traffic(pr.shape, pr.p, dtype);
    r.errors.push_back({"O", rel_to_max(fl.o.data(), naive.o.data(), fl.o.numel()), tol});
    if (save_dir) save_tensor(*save_dir, "o.npy", fl.o, pr.batched);
  } else if (mode == "bwd") {
    const auto fl = mta::flash_forward(pr.q, pr.k, pr.v, pr.w, pr.p);  // not counted: bwd traffic only
    progress.next();
    const auto g = mta::flash_backward(pr.q, pr.k, pr.v, pr.w, fl.o, fl.m, fl.l, pr.d_o, pr.p, &r.counted);
    progress.next();
    const auto gn = mta::naive_backward(pr.q, pr.k, pr.v, pr.w, pr.d_o, pr.p);
    r.formula = mta::backward_traffic(pr.shape, pr.p, dtype);
    r.errors.push_back({"O", rel_to_max(fl.o.data(), naive.o.data(), fl.o.numel()), tol});
    r.errors.push_back({"dQ", rel_to_max(g.dq.data(), gn.dq.data(), g.dq.numel()), tol});
    r.errors.push_back({"dK", rel_to_max(g.dk.data(), gn.dk.data(), g.dk.numel()), tol});
    r.errors.push_back({"dV", rel_to_max(g.dv.data(), gn.dv.data(), g.dv.numel()), tol});
    r.errors.push_back({"dW", rel_to_max(g.dw.data(), gn.dw.data(), g.dw.numel()), tol_dw});
    if (save_dir) {
      save_tensor(*save_dir, "o.npy", fl.o, pr.batched);
      save_tensor(*save_dir, "dq.npy", g.dq, pr.batched);
      save_tensor(*save_dir, "dk.npy", g.dk, pr.batched);
      save_tensor(*save_dir, "dv.npy", g.dv, pr.batched);
      ref::write_npy(*save_dir / "dw.npy", {g.dw.heads(), g.dw.cq(), g.dw.ck()}, g.dw.data());
    }
  } else {
    const auto last = mta::flash_infer(pr.q, pr.k, pr.v, pr.w, pr.p, &r.counted);
    r.formula = mta::infer_traffic(pr.shape, pr.p, dtype);
    Tensor<double> ref_last(last.shape());
    for (std::size_t b = 0; b < pr.shape.batch; ++b)
      for (std::size_t h = 0; h < pr.shape.heads; ++h)
        ref_last.head(b, h).row(0) = naive.o.head(b, h).row(Eigen::Index(pr.shape.seq) - 1);
    r.errors.push_back({"O", rel_to_max(last.data(), ref_last.data(), last.numel()), tol});
    if (save_dir) save_tensor(*save_dir, "o.npy", last, pr.batched);  // [B, 1, H, D]: the last token
  }
  r.traffic_equal = same_traffic(r.counted, r.formula);
  bool passed = r.traffic_equal;
  for (const auto& e : r.errors) passed = passed && e.error <= e.tolerance;  // NaN error: +inf, fails
  if (vm.count("json"))
    print_json(std::cout, mode, pr, r, scale, passed);
  else
    print_text(std::cout, mode, pr, r, scale);
  if (!passed) {
    std::cerr << "error: the flash result or its traffic does not match the reference (see above)\n";
    return kFailed;
  }
  return kOk;
}

}  // namespace

int cmd_mta(const Args& args) {
  if (mta_device_given(args)) return cmd_mta_device(args);  // --device cpu|cuda: cmd_mta_cuda.cpp
  return guarded("mta", [&] { return run(args); });
}

}  // namespace flashlab::app
