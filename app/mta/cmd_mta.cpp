// `flashlab mta fwd|bwd|infer`: runs the flash MTA reference (the MTA kernels) on seeded or given
// inputs, compares it with the naive float64 result, and prints the traffic its tile loops
// counted beside the closed-form formula. Parsing and formatting only; the algorithms live in
// reference/ (mta.hpp, mta_traffic.hpp).
#include "core/commands.hpp"
#include "core/input_checks.hpp"
#include "core/report.hpp"
#include "mta/mta_inputs.hpp"
#include "core/progress.hpp"

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
    "                [--batch NB] [--seed S] [--scale X] [--dtype T] [--inputs DIR] [--save DIR] [--json|--csv]\n"
    "                [--device cpu|cuda] [--allow-nonfinite] [--memory-limit SIZE]";
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
    "tolerance is scaled up by L/64 when the logit bound L = scale*max|q|*max|k|*max sum|W| exceeds 64.\n"
    "--device cuda runs the clear CUDA kernels on the same inputs (fwd and bwd on the fast ones with\n"
    "--kernel fast; flashlab mta fwd --device cuda --help);\n"
    "--device cpu, the default, runs this command.";

// Float64 round-off, relative to the reference tensor's max |value| (docs/mta.md). dW is one sum
// over batch·N²/2 score entries per head, so its round-off grows with batch·N (measured: 3e-14 at
// N = 1024, 2.2e-13 at N = 4096, cq = 3, ck = 5); its tolerance scales with it.
constexpr double kTolerance = 1e-12;
double dw_tolerance(const Shape& s) { return kTolerance * std::max(1.0, double(s.batch * s.seq) / 1024.0); }



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

void print_text(std::ostream& os, const std::string& mode, const MtaInputs& pr, const Report& r, double scale) {
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

void print_json(std::ostream& os, OutputFormat format, const std::string& mode, const MtaInputs& pr, const Report& r,
                double scale, bool passed) {
  ReportOutput report(format, os);
  Json& j = report.json();
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
  report.finish();
}

// Conditioning (input_checks.hpp): a logit of the convolved scores is bounded by
// L = scale·max‖q_i‖·max‖k_j‖·max_h Σ|W_h|; above 64 the float64 tolerances grow with L.
double convolved_logit_bound(const MtaInputs& pr, double scale) {
  const std::size_t d = pr.shape.head_dim, taps = pr.p.cq * pr.p.ck;
  double w_sum = 0;
  for (std::size_t h = 0; h < pr.w.heads(); ++h) {
    double sum = 0;
    for (std::size_t i = 0; i < taps; ++i) sum += std::abs(pr.w.data()[h * taps + i]);
    w_sum = std::max(w_sum, sum);
  }
  return std::abs(scale) * max_row_norm(pr.q.data(), pr.q.numel() / d, d) *
         max_row_norm(pr.k.data(), pr.k.numel() / d, d) * w_sum;
}

// The backward pass: flash gradients (their traffic counted) against the naive ones.
void check_backward(const MtaInputs& pr, const Tensor<double>& naive_o, double tol, double tol_dw, Progress& progress,
                    Report& r) {
  const auto fl = mta::flash_forward(pr.q, pr.k, pr.v, pr.w, pr.p);  // not counted: bwd traffic only
  progress.next();
  const auto g = mta::flash_backward(pr.q, pr.k, pr.v, pr.w, fl.o, fl.m, fl.l, pr.d_o, pr.p, &r.counted);
  progress.next();
  const auto gn = mta::naive_backward(pr.q, pr.k, pr.v, pr.w, pr.d_o, pr.p);
  r.formula = mta::backward_traffic(pr.shape, pr.p, r.counted.dtype());
  r.errors.push_back({"O", rel_to_max(fl.o.data(), naive_o.data(), fl.o.numel()), tol});
  r.errors.push_back({"dQ", rel_to_max(g.dq.data(), gn.dq.data(), g.dq.numel()), tol});
  r.errors.push_back({"dK", rel_to_max(g.dk.data(), gn.dk.data(), g.dk.numel()), tol});
  r.errors.push_back({"dV", rel_to_max(g.dv.data(), gn.dv.data(), g.dv.numel()), tol});
  r.errors.push_back({"dW", rel_to_max(g.dw.data(), gn.dw.data(), g.dw.numel()), tol_dw});
  if (!pr.save_dir) return;
  const fs::path& dir = *pr.save_dir;
  save_output(dir, "o.npy", fl.o, pr.batched);
  save_output(dir, "dq.npy", g.dq, pr.batched);
  save_output(dir, "dk.npy", g.dk, pr.batched);
  save_output(dir, "dv.npy", g.dv, pr.batched);
  ref::write_npy(dir / "dw.npy", {g.dw.heads(), g.dw.cq(), g.dw.ck()}, g.dw.data());
}

int run(const Args& args) {
  po::options_description desc("Options"), hidden;
  desc.add_options()("help,h", "show this help");
  add_mta_options(desc, hidden, 16);
  add_dtype_option(desc, "fp32 | bf16 | fp16 | fp64", "fp32", " (sets the traffic count's bytes; the arithmetic is float64)");
  add_output_options(desc);
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("mode", 1);
  const auto vm = parse(args, all, &pos);
  if (vm.count("help")) {
    print_help(std::cout, kUsage, kSummary, desc);
    return kOk;
  }
  const MtaInputs pr = mta_inputs(vm);
  const std::string& mode = pr.mode;
  const ref::Dtype dtype = ref::parse_dtype(dtype_flag(vm, {"fp32", "bf16", "fp16", "fp64"}));
  const OutputFormat format = output_format(vm);
  const std::optional<fs::path>& save_dir = pr.save_dir;
  const double scale = mta::resolve_scale(pr.p, pr.shape.head_dim);

  const std::size_t d = pr.shape.head_dim;
  const double logit_bound = convolved_logit_bound(pr, scale);
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
    if (save_dir) save_output(*save_dir, "o.npy", fl.o, pr.batched);
  } else if (mode == "bwd") {
    check_backward(pr, naive.o, tol, tol_dw, progress, r);
  } else {
    const auto last = mta::flash_infer(pr.q, pr.k, pr.v, pr.w, pr.p, &r.counted);
    r.formula = mta::infer_traffic(pr.shape, pr.p, dtype);
    Tensor<double> ref_last(last.shape());
    for (std::size_t b = 0; b < pr.shape.batch; ++b)
      for (std::size_t h = 0; h < pr.shape.heads; ++h)
        ref_last.head(b, h).row(0) = naive.o.head(b, h).row(Eigen::Index(pr.shape.seq) - 1);
    r.errors.push_back({"O", rel_to_max(last.data(), ref_last.data(), last.numel()), tol});
    if (save_dir) save_output(*save_dir, "o.npy", last, pr.batched);  // [B, 1, H, D]: the last token
  }
  r.traffic_equal = same_traffic(r.counted, r.formula);
  bool passed = r.traffic_equal;
  for (const auto& e : r.errors) passed = passed && e.error <= e.tolerance;  // NaN error: +inf, fails
  if (format != OutputFormat::text)
    print_json(std::cout, format, mode, pr, r, scale, passed);
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
