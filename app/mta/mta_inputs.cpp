#include "mta/mta_inputs.hpp"

#include "core/input_checks.hpp"
#include "core/shared_flags.hpp"

#include "flashlab/reference/npy.hpp"

#include <algorithm>
#include <sstream>
#include <utility>

namespace flashlab::app {

namespace {

namespace fs = std::filesystem;
namespace mta = flashlab::ref::mta;
using ref::Shape;
using ref::Tensor;

// Largest sizes the naive N x N reference is allowed to materialise (memory, not correctness).
constexpr long long kMaxSeq = 4096, kMaxDim = 1024, kMaxHeads = 256, kMaxBatch = 256;
constexpr long long kMaxKernel = 64, kMaxBlock = 1024, kMaxSplits = 4096;
constexpr const char* kInputsHint = "write it with numpy.save (float32 or float64, C order)";

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

// The sizes of q.npy, each in range and equal to its flag when that was given explicitly.
void take_shape_from_q(MtaInputs& in, const ref::NpyHeader& qa, const fs::path& qfile, const po::variables_map& vm) {
  if (qa.shape.size() != 3 && qa.shape.size() != 4)
    throw UsageError(qfile.string() + ": shape " + ref::shape_str(qa.shape) + " is not [B, N, H, D] or [N, H, D]");
  in.batched = qa.shape.size() == 4;
  const std::size_t off = in.batched ? 1 : 0;
  in.shape = Shape{in.batched ? qa.shape[0] : 1, qa.shape[off], qa.shape[off + 1], qa.shape[off + 2]};
  const std::pair<const char*, std::size_t> dims[] = {
      {"batch", in.shape.batch}, {"seq", in.shape.seq}, {"heads", in.shape.heads}, {"dim", in.shape.head_dim}};
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
}

// w.npy is [H, cq, ck] with each kernel size in range and ck odd; explicit --cq/--ck must agree.
void take_kernel_from_w(MtaInputs& in, const ref::NpyHeader& wa, const fs::path& wfile, const po::variables_map& vm) {
  if (wa.shape.size() != 3 || wa.shape[0] != in.shape.heads)
    throw UsageError(wfile.string() + ": shape " + ref::shape_str(wa.shape) + " is not [HEAD_NUM, cq, ck] with HEAD_NUM = " +
                         std::to_string(in.shape.heads),
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
  in.p.cq = cq;
  in.p.ck = ck;
}

// Dimensions come from q.npy and w.npy; every header is checked and the run sized before any
// payload is read.
void load_inputs(MtaInputs& in, const fs::path& dir, const po::variables_map& vm, const InputPolicy& policy) {
  const bool need_do = in.mode == "bwd";
  if (!fs::is_directory(dir)) throw UsageError("--inputs " + dir.string() + ": not a directory");
  const auto qa = input_header(dir, "q.npy");
  const fs::path qfile = dir / "q.npy";
  take_shape_from_q(in, qa, qfile, vm);
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
  const fs::path wfile = dir / "w.npy";
  take_kernel_from_w(in, input_header(dir, "w.npy"), wfile, vm);
  require_mta_memory(policy, in.shape, in.mode);
  in.q = to_tensor(read_float_input(qfile, policy, kInputsHint), in.shape);
  in.k = to_tensor(read_float_input(dir / "k.npy", policy, kInputsHint), in.shape);
  in.v = to_tensor(read_float_input(dir / "v.npy", policy, kInputsHint), in.shape);
  if (need_do) in.d_o = to_tensor(read_float_input(dir / "do.npy", policy, kInputsHint), in.shape);
  const auto wv = read_float_input(wfile, policy, kInputsHint);
  in.w = mta::Weights<double>(in.shape.heads, in.p.cq, in.p.ck);
  std::copy(wv.begin(), wv.end(), in.w.data());
}

// Seeded inputs: the same values for the same --seed on every device.
void seed_inputs(MtaInputs& in, const po::variables_map& vm, unsigned long long seed, const InputPolicy& policy) {
  in.shape = Shape{std::size_t(vm["batch"].as<long long>()), std::size_t(vm["seq"].as<long long>()),
                   std::size_t(vm["heads"].as<long long>()), std::size_t(vm["dim"].as<long long>())};
  in.p.cq = std::size_t(vm["cq"].as<long long>());
  in.p.ck = std::size_t(vm["ck"].as<long long>());
  require_mta_memory(policy, in.shape, in.mode);
  for (Tensor<double>* t : {&in.q, &in.k, &in.v, &in.d_o}) *t = Tensor<double>(in.shape);
  ref::fill_normal(in.q, seed * 8 + 1);
  ref::fill_normal(in.k, seed * 8 + 2);
  ref::fill_normal(in.v, seed * 8 + 3);
  ref::fill_normal(in.d_o, seed * 8 + 4);
  in.w = mta::random_weights(in.shape.heads, in.p.cq, in.p.ck, seed * 8 + 5);
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

void check_flag_ranges(const po::variables_map& vm) {
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
}

std::optional<fs::path> save_directory(const po::variables_map& vm) {
  if (!vm.count("save")) return std::nullopt;
  return prepare_save_dir(vm["save"].as<std::string>());
}

}  // namespace

void add_mta_options(po::options_description& desc, po::options_description& hidden, long long default_block) {
  // Sizes are parsed as signed so that "-3" reaches require_range instead of wrapping around.
  desc.add_options()
      ("device", po::value<std::string>(), "cpu (the CPU reference, default) | cuda (the clear CUDA kernels; --kernel fast: the fast ones)")
      ("seq", po::value<long long>()->default_value(64), "N, sequence length")
      ("heads", po::value<long long>()->default_value(2), "H, number of heads (one kernel W per head)");
  add_dim_option(desc);
  desc.add_options()
      ("cq", po::value<long long>()->default_value(2), "kernel rows (query direction); Pq = cq - 1")
      ("ck", po::value<long long>()->default_value(3), "kernel columns (key direction), odd; Pk = (ck - 1)/2")
      ("block", po::value<long long>()->default_value(default_block), "B, the loaded (overlapping) tile size")
      ("splits", po::value<long long>()->default_value(1), "key splits of the split-K inference path")
      ("batch", po::value<long long>()->default_value(1), "batch size");
  add_seed_option(desc);
  desc.add_options()
      ("scale", po::value<double>(), "softmax scale (default 1/sqrt(D))")
      ("inputs", po::value<std::string>(), "read q.npy k.npy v.npy w.npy (do.npy for bwd) from DIR")
      ("save", po::value<std::string>(), "write o.npy (dq dk dv dw .npy for bwd) to DIR");
  add_input_options(desc);
  hidden.add_options()("mode", po::value<std::string>(), "fwd, bwd or infer");
}

MtaInputs mta_inputs(const po::variables_map& vm) {
  MtaInputs in;
  if (!vm.count("mode")) throw UsageError("missing mode: fwd, bwd or infer", "e.g. flashlab mta fwd --seq 64");
  in.mode = vm["mode"].as<std::string>();
  if (in.mode != "fwd" && in.mode != "bwd" && in.mode != "infer")
    throw UsageError("unknown mode '" + in.mode + "'", "choose fwd, bwd or infer");
  check_flag_ranges(vm);
  in.p.block = std::size_t(vm["block"].as<long long>());
  in.p.splits = std::size_t(vm["splits"].as<long long>());
  if (const auto s = checked_scale(vm)) in.p.scale = *s;
  const auto seed = seed_flag(vm);
  const InputPolicy policy = input_policy(vm);
  if (vm.count("inputs"))
    load_inputs(in, vm["inputs"].as<std::string>(), vm, policy);
  else
    seed_inputs(in, vm, seed, policy);
  check_tiles(in.mode, in.p);
  in.save_dir = save_directory(vm);
  return in;
}

}  // namespace flashlab::app
