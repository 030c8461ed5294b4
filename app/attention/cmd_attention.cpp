// `flashlab attention fwd|bwd`: run one attention algorithm of the CPU reference, compare it with
// the naive float64 result, and print the traffic its loops counted beside the closed-form
// formula (tensor | read | write | formula). Parsing and formatting only: the algorithms are in
// reference/ (attention.hpp), the formulas in attention_traffic.hpp.
#include "attention/attention_flags.hpp"
#include "core/commands.hpp"
#include "core/input_checks.hpp"
#include "core/progress.hpp"
#include "core/report.hpp"

#include "flashlab/reference/attention.hpp"
#include "flashlab/reference/attention_traffic.hpp"
#include "flashlab/reference/npy.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <utility>

namespace flashlab::app {

namespace {

namespace fs = std::filesystem;
using namespace flashlab::ref;

constexpr const char* kUsageLine =
    "attention fwd|bwd --seq N --dim D [--heads H] [--heads-kv HKV] [--batch B] [--seq-k NK] [--causal]\n"
    "                          [--window L,R] [--cu-seqlens FILE] [--block-m BM] [--block-n BN]\n"
    "                          [--variant naive|fa1|fa2|atomic] [--dtype fp32|bf16|fp16] [--precision float|double]\n"
    "                          [--seed S] [--inputs DIR] [--save DIR] [--device cpu|cuda] [--json|--csv]";
constexpr const char* kSummary =
    "Runs attention forward (fwd) or backward (bwd) on the CPU reference and prints the max error\n"
    "against the naive float64 result (max|got - ref| / max|ref| per tensor) and the HBM traffic the\n"
    "tile loops counted beside the closed-form formula. --dtype sets the element size of the traffic\n"
    "count only; --precision sets the arithmetic. Variants: fwd naive|fa1|fa2, bwd naive|fa2 (two\n"
    "kernels: D preprocessing, dQ, dK/dV)|atomic (one kernel, dQ read-modify-written in HBM).\n"
    "Grouped K/V: --heads-kv HKV (dividing H) K/V heads, query head h reading K/V head h/(H/HKV).\n"
    "--seq-k NK keys per sequence; the causal diagonal and the window are bottom-right aligned\n"
    "(query i sees key j iff j <= i + NK - N). --window L,R: keys at most L left and R right of\n"
    "the diagonal (-1: unbounded; with --causal R is 0). --cu-seqlens FILE packs variable-length\n"
    "sequences: a text file with a line 'cu_seqlens_q = 0 3 3 10' (B + 1 prefix sums of the query\n"
    "lengths) and, if the keys differ, 'cu_seqlens_k = 0 5 5 17'; '#' comments; it replaces\n"
    "--batch, --seq and --seq-k, and the tensors are [total, H, D].\n"
    "--inputs DIR reads q.npy k.npy v.npy [do.npy] ([N,H,D] or [B,N,H,D], f4 or f8); --save DIR\n"
    "writes o.npy lse.npy [dq.npy dk.npy dv.npy]. Exit 0 when within tolerance (float64 1e-12,\n"
    "float32 1e-5, scaled up by L/64 when the logit bound L exceeds 64; with --fp16-arithmetic only\n"
    "NaN fails) and the counts equal the formula; 1 otherwise. NaN/Inf inputs are refused unless\n"
    "--allow-nonfinite. --device cuda runs the clear or (--kernel fast) the tensor-core CUDA kernels\n"
    "on the same inputs, with what each kernel takes (flashlab attention fwd --device cuda --help);\n"
    "--device cpu, the default, runs this command.";

po::options_description options() {
  po::options_description d("Options");
  d.add_options()("help,h", "show this help")
      ("seq", po::value<long long>(), "N, query sequence length (1..8192; from q.npy with --inputs, from FILE with --cu-seqlens)")
      ("seq-k", po::value<long long>(), "N_k, key/value length when it differs from N (causal is bottom-right aligned)")
      ("heads", po::value<long long>()->default_value(1), "H, number of query heads")
      ("heads-kv", po::value<long long>(), "H_kv, number of K/V heads, dividing H (default H; 1 is multi-query)")
      ;
  add_window_option(d);
  d.add_options()
      ("cu-seqlens", po::value<std::string>(), "FILE with cu_seqlens_q (and cu_seqlens_k): packed variable-length sequences (- reads standard input)")
      ;
  add_dim_option(d, " (1..1024; from q.npy with --inputs)");
  d.add_options()
      ("batch", po::value<long long>()->default_value(1), "B, batch size")
      ("causal", po::bool_switch(), "causal mask (fully masked tiles are skipped)")
      ("scale", po::value<double>(), "softmax scale (default 1/sqrt(d))")
      ("variant", po::value<std::string>()->default_value("fa2"), "fwd: naive | fa1 | fa2; bwd: naive | fa2 (= two-kernel) | atomic")
      ;
  add_dtype_option(d, "fp32 | bf16 | fp16", "fp32", " (sets the traffic count's bytes)");
  add_precision_option(d);
  add_seed_option(d);
  d.add_options()
      ("inputs", po::value<std::string>(), "directory with q.npy k.npy v.npy [do.npy]")
      ("save", po::value<std::string>(), "directory to write o.npy lse.npy [dq.npy dk.npy dv.npy]")
      ("drop-kv-mask", po::bool_switch(), "bwd: do not mask out-of-sequence keys (the Triton walkthrough's NaN hazard)")
      ("fp16-arithmetic", po::bool_switch(), "bwd: round every tile operation to half precision");
  add_output_options(d);
  add_tile_options(d);
  add_input_options(d);
  return d;
}

// The positional fwd|bwd, parsed but not listed in --help.
po::options_description hidden() {
  po::options_description d;
  d.add_options()("mode", po::value<std::string>(), "fwd | bwd");
  return d;
}

struct Run {
  std::string mode;
  Algorithm algorithm = Algorithm::fa2_fwd;
  std::string variant_flag;
  bool use_double = false;
  AttentionProblem cfg;
  bool four_d = false;  // inputs had a batch dimension (or --batch > 1): save 4-D arrays
  unsigned long long seed = 1;
  std::optional<fs::path> inputs, save;
  BackwardOptions bwd;
  OutputFormat output = OutputFormat::text;
  InputPolicy policy;
};

// ---- inputs ------------------------------------------------------------------------------

struct Loaded {
  Tensor<double> t;
  bool four_d = false;
};

Loaded load_operand(const fs::path& file, const InputPolicy& policy) {
  return {load_attention_operand(file, policy), attention_operand_shape(file).four_d};
}

// What a run holds at its peak, from the sizes alone: the float64 operands and their copies in
// the run's precision, the outputs of the run and of the naive reference, and the naive
// reference's N x N_k score matrices (S, P and, backward, dP, dS) of one head of the longest
// sequence (`longest_q` x `longest_k`).
void require_attention_memory(const InputPolicy& policy, const Shape& q, const Shape& kv, std::size_t longest_q,
                              std::size_t longest_k, bool bwd, bool use_double) {
  MemoryPlan plan;
  const std::uint64_t qn = checked_size({q.batch, q.seq, q.heads, q.head_dim}, "Q's element count");
  const std::uint64_t kvn = checked_size({kv.batch, kv.seq, kv.heads, kv.head_dim}, "K's element count");
  const std::uint64_t elem = use_double ? 8 : 4;
  plan.add("Q, O (float64 inputs and reference)", qn, 8, bwd ? 4 : 2);
  plan.add("K, V (float64 inputs)", kvn, 8, 2);
  plan.add("Q, K, V copies in the run's precision", qn + kvn * 2, elem);
  plan.add("outputs of the run", qn, elem, bwd ? 4 : 1);
  if (bwd) plan.add("dK, dV (run and reference)", kvn, 8, 4);
  plan.add("naive N x N_k scores of one head", checked_size({longest_q, longest_k}, "N x N_k"), 8, bwd ? 4 : 2);
  plan.require_within(policy, "attention " + std::string(bwd ? "bwd" : "fwd") + " on Q " + q.str() + ", K " + kv.str());
}

// ---- output ------------------------------------------------------------------------------

std::string human(std::uint64_t bytes) {
  std::ostringstream s;
  s << bytes;
  return s.str();
}

struct ErrorLine {
  std::string name;
  double error;
};

void print_traffic_table(std::ostream& os, const Traffic& counted, const Traffic& formula) {
  os << std::left << std::setw(8) << "tensor" << std::right << std::setw(16) << "read B" << std::setw(16) << "write B"
     << "   formula (read / write B)\n";
  for (const auto& t : counted.tensors()) {
    const auto* f = formula.find(t.name);
    const std::uint64_t fr = f ? f->read_bytes() : 0, fw = f ? f->write_bytes() : 0;
    const bool same = fr == t.read_bytes() && fw == t.write_bytes();
    os << std::left << std::setw(8) << t.name << std::right << std::setw(16) << human(t.read_bytes()) << std::setw(16)
       << human(t.write_bytes()) << "   " << fr << " / " << fw << (same ? "" : "   MISMATCH") << "\n";
  }
  os << std::left << std::setw(8) << "total" << std::right << std::setw(16) << counted.total_read_bytes()
     << std::setw(16) << counted.total_write_bytes() << "   " << formula.total_read_bytes() << " / "
     << formula.total_write_bytes() << "\n";
  os << std::left << std::setw(8) << "FLOPs" << std::right << std::setw(16) << counted.flops() << std::setw(16) << ""
     << "   " << formula.flops() << "\n";
}

template <typename T>
void save_tensor(const fs::path& file, const Tensor<T>& t, bool four_d) {
  const Shape& s = t.shape();
  std::vector<std::size_t> shape = four_d ? std::vector<std::size_t>{s.batch, s.seq, s.heads, s.head_dim}
                                          : std::vector<std::size_t>{s.seq, s.heads, s.head_dim};
  write_npy(file, shape, t.data());
}
template <typename T>
void save_stats(const fs::path& file, const std::vector<T>& v, const AttentionProblem& cfg, bool four_d) {
  const Shape q = cfg.q_shape();  // packed: one batch entry of total_q rows
  std::vector<std::size_t> shape = four_d ? std::vector<std::size_t>{q.batch, cfg.heads, q.seq}
                                          : std::vector<std::size_t>{cfg.heads, q.seq};
  write_npy(file, shape, v.data());
}

template <typename T>
Tensor<T> as(const Tensor<double>& t) {
  if constexpr (std::is_same_v<T, double>) return t;
  else return t.template cast<T>();
}

// ---- the run -------------------------------------------------------------------------------

// What a run found, for the printers.
struct Verdict {
  std::vector<ErrorLine> errors;       // max error per output tensor against naive float64
  Traffic counted;                     // bytes the tile loops counted
  Traffic formula;                     // the closed-form count
  std::vector<KernelTraffic> kernels;  // the counted traffic per kernel
  double d_identity;                   // bwd: rowsum(dP∘P) vs rowsum(dO∘O); < 0 for fwd
  bool nan;                            // NaN in any output
  bool judged;                         // errors judged against `tol` (not with emulated fp16)
  double tol;                          // the tolerance: the run's precision, scaled by conditioning
  bool within;                         // no NaN and (not judged or within tol)
  bool counts_ok;                      // counted == formula
  bool ok;                             // within and counts_ok
  std::string why;                     // the first difference when !counts_ok
  Tolerance tolerance;                 // tol and why it has the value it has (input_checks.hpp)
};

// The run's outcome as one JSON object.
void print_json(const Run& run, const Verdict& v) {
  const AttentionProblem& cfg = run.cfg;
  ReportOutput report(run.output, std::cout);
  Json& j = report.json();
  j.begin_object();
  j.key("command").value("attention " + run.mode);
  j.key("variant").value(algorithm_name(run.algorithm));
  j.key("precision").value(run.use_double ? "double" : "float");
  j.key("config").begin_object();
  j.key("batch").value(std::uint64_t(cfg.batch)).key("seq").value(std::uint64_t(cfg.n_q()));
  j.key("seq_k").value(std::uint64_t(cfg.n_k())).key("heads").value(std::uint64_t(cfg.heads));
  j.key("heads_kv").value(std::uint64_t(cfg.h_kv()));
  j.key("window_left").value(std::int64_t(cfg.window_left)).key("window_right").value(std::int64_t(cfg.window_right));
  j.key("packed").value(cfg.is_packed());
  if (cfg.packed)
    j.key("total_q").value(std::uint64_t(cfg.packed->total_q())).key("total_k").value(std::uint64_t(cfg.packed->total_k()));
  j.key("head_dim").value(std::uint64_t(cfg.head_dim)).key("block_m").value(std::uint64_t(cfg.Br));
  j.key("block_n").value(std::uint64_t(cfg.Bc)).key("causal").value(cfg.causal);
  j.key("scale").value(cfg.softmax_scale()).key("dtype").value(dtype_name(cfg.dtype));
  j.end_object();
  j.key("error_metric").value("max|got-ref|/max|ref| against naive float64");
  j.key("errors").begin_object();
  for (const auto& e : v.errors) j.key(e.name).value(e.error);
  j.end_object();
  if (v.d_identity >= 0) j.key("D_identity_error").value(v.d_identity);
  if (v.judged) j.key("tolerance").value(v.tol).key("tolerance_logit_bound").value(v.tolerance.logit_bound);
  else j.key("tolerance").null();
  j.key("nan").value(v.nan).key("within_tolerance").value(v.within);
  j.key("traffic").begin_array();
  for (const auto& t : v.counted.tensors()) {
    const auto* f = v.formula.find(t.name);
    j.begin_object().key("tensor").value(t.name);
    j.key("read_bytes").value(t.read_bytes()).key("write_bytes").value(t.write_bytes());
    j.key("formula_read_bytes").value(std::uint64_t(f ? f->read_bytes() : 0));
    j.key("formula_write_bytes").value(std::uint64_t(f ? f->write_bytes() : 0));
    j.end_object();
  }
  j.end_array();
  j.key("kernels").begin_array();
  for (const auto& k : v.kernels) {
    j.begin_object().key("name").value(k.name);
    j.key("read_bytes").value(k.traffic.total_read_bytes()).key("write_bytes").value(k.traffic.total_write_bytes());
    j.key("flops").value(k.traffic.flops()).end_object();
  }
  j.end_array();
  j.key("flops").value(v.counted.flops()).key("formula_flops").value(v.formula.flops());
  j.key("counts_equal_formula").value(v.counts_ok);
  j.key("ok").value(v.ok);
  j.end_object();
  report.finish();
}

// The run's outcome as tables: errors, verdict, traffic per tensor and per kernel.
void print_text(const Run& run, const Verdict& v) {
  const AttentionProblem& cfg = run.cfg;
  std::ostream& os = std::cout;
  os << "flashlab attention " << run.mode << "  variant " << algorithm_name(run.algorithm) << "  precision "
     << (run.use_double ? "double" : "float") << (run.bwd.fp16_arithmetic ? " (fp16 arithmetic emulated)" : "")
     << (run.bwd.mask_kv ? "" : "  KV mask DROPPED") << "\n";
  os << cfg.str() << "  scale " << cfg.softmax_scale() << "\n\n";
  os << "max error vs naive float64 (max|got - ref| / max|ref|):";
  for (const auto& e : v.errors) os << "  " << e.name << " " << std::setprecision(3) << e.error;
  os << "\n";
  if (v.d_identity >= 0)
    os << "D identity: rowsum(dP*P) vs rowsum(dO*O) in float64: " << std::setprecision(3) << v.d_identity << "\n";
  if (v.nan) os << "NaN in the result" << (run.bwd.mask_kv ? "" : " — the Triton walkthrough's NaN hazard: unmasked padded keys, Inf * 0") << "\n";
  if (v.judged) os << "tolerance " << v.tolerance.str() << ": " << (v.within ? "ok" : "FAILED") << "\n";
  const bool overflowed = std::any_of(v.errors.begin(), v.errors.end(), [](const auto& e) { return std::isinf(e.error); });
  if (v.judged && !v.within && overflowed && !v.nan && !run.use_double)
    os << "why: a result overflowed float32 (|x| > 3.4e38), so its error is infinite\nhint: --precision double\n";
  if (v.judged) os << "\n";
  else os << "emulated fp16: errors shown, not judged; NaN: " << (v.nan ? "yes (FAILED)" : "none") << "\n\n";
  os << "traffic (bytes; " << dtype_name(cfg.dtype) << " tensors, LSE/D/m/l fp32), counted by the tile loops\n";
  print_traffic_table(os, v.counted, v.formula);
  if (v.kernels.size() > 1) {
    os << "\nper kernel              read B          write B            FLOPs\n";
    for (const auto& k : v.kernels)
      os << std::left << std::setw(20) << k.name << std::right << std::setw(12) << k.traffic.total_read_bytes()
         << std::setw(17) << k.traffic.total_write_bytes() << std::setw(17) << k.traffic.flops() << "\n";
  }
  os << "\ncounted == formula: " << (v.counts_ok ? "yes" : "NO (" + v.why + ")") << "\n";
  if (run.save) os << "saved to " << run.save->string() << "\n";
}

double max_abs(const Tensor<double>& t) {
  double m = 0;
  for (std::size_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.data()[i]));
  return m;
}

// dS = P∘(dP − D) cancels where P is nearly one-hot (large logits): dQ and dK come out far smaller
// than the terms they are summed from, and both computations' rounding, relative to max|dQ|,
// grows by the ratio. Bounds of those terms: |dP_ij| ≤ ‖dO_i‖·‖V_j‖, Σ_j P_ij |dP_ij − D_i| ≤
// 2·max|dP|, so ‖dQ_i‖ ≤ 2·scale·max|dP|·max‖K_j‖ before cancellation (and likewise dK with Q).
double backward_cancellation(const AttentionProblem& cfg, const Tensor<double>& Q, const Tensor<double>& K,
                             const Tensor<double>& V, const Tensor<double>& dO, const Tensor<double>& dQ,
                             const Tensor<double>& dK) {
  const std::size_t d = cfg.head_dim;
  auto norm = [d](const Tensor<double>& t) { return max_row_norm(t.data(), t.numel() / d, d); };
  const double dp = norm(dO) * norm(V);
  const double dq_terms = 2.0 * cfg.softmax_scale() * dp * norm(K), dk_terms = 2.0 * cfg.softmax_scale() * dp * norm(Q);
  const double mq = max_abs(dQ), mk = max_abs(dK);
  return std::max(mq > 0 ? dq_terms / mq : 1.0, mk > 0 ? dk_terms / mk : 1.0);
}

template <typename T>
int execute(const Run& run, const Tensor<double>& Q, const Tensor<double>& K, const Tensor<double>& V,
            const Tensor<double>& dO) {
  const AttentionProblem& cfg = run.cfg;
  const auto Qt = as<T>(Q), Kt = as<T>(K), Vt = as<T>(V), dOt = as<T>(dO);
  const bool bwd = run.mode == "bwd";
  std::vector<ErrorLine> errors;
  Traffic counted(cfg.dtype);
  std::vector<KernelTraffic> kernels;
  double d_identity = -1.0;
  double cancellation = 1.0;
  bool nan = false;

  // Forward ≈ 4·H·d·Σ_b N·N_k flops, backward ≈ 2.5× that; stages in the order they run below.
  double score_elements = 0.0;
  for (std::size_t b = 0; b < cfg.batch; ++b) {
    const SequenceSpan s = cfg.sequence(b);
    score_elements += double(s.q_len) * double(s.k_len);
  }
  const double fwd_work = 4.0 * double(cfg.heads) * double(cfg.head_dim) * score_elements;
  std::vector<Stage> stages = {{"naive float64 reference", fwd_work}, {"forward " + run.variant_flag, fwd_work}};
  if (bwd) stages.insert(stages.end(), {{"naive float64 backward", 2.5 * fwd_work}, {"backward " + run.variant_flag, 2.5 * fwd_work}});
  Progress progress("attention " + run.mode, std::move(stages));
  const auto ref_f = naive_forward(cfg, Q, K, V);
  progress.next();
  const auto fwd = bwd ? (run.algorithm == Algorithm::naive_bwd ? naive_forward(cfg, Qt, Kt, Vt)
                                                             : flash_forward_fa2(cfg, Qt, Kt, Vt))
                       : attention_forward(run.algorithm, cfg, Qt, Kt, Vt);
  progress.next();
  if (!bwd) {
    errors.push_back({"O", max_error_vs_max(fwd.O.data(), ref_f.O.data(), ref_f.O.numel())});
    errors.push_back({"LSE", max_error_vs_max(fwd.LSE.data(), ref_f.LSE.data(), ref_f.LSE.size())});
    nan = has_nan(fwd.O.data(), fwd.O.numel());
    counted = fwd.traffic;
    kernels = fwd.kernels;
  }
  std::optional<AttentionGradients<T>> grads;
  if (bwd) {
    const auto ref_g = naive_backward(cfg, Q, K, V, dO);
    progress.next();
    d_identity = max_error_vs_max(ref_g.D_from_O.data(), ref_g.D.data(), ref_g.D.size());
    if (run.algorithm == Algorithm::naive_bwd) grads = naive_backward(cfg, Qt, Kt, Vt, dOt);
    else if (run.algorithm == Algorithm::bwd_atomic)
      grads = flash_backward_atomic(cfg, Qt, Kt, Vt, fwd.O, fwd.LSE, dOt, run.bwd);
    else grads = flash_backward_two_kernel(cfg, Qt, Kt, Vt, fwd.O, fwd.LSE, dOt, run.bwd);
    cancellation = backward_cancellation(cfg, Q, K, V, dO, ref_g.dQ, ref_g.dK);
    errors.push_back({"dQ", max_error_vs_max(grads->dQ.data(), ref_g.dQ.data(), ref_g.dQ.numel())});
    errors.push_back({"dK", max_error_vs_max(grads->dK.data(), ref_g.dK.data(), ref_g.dK.numel())});
    errors.push_back({"dV", max_error_vs_max(grads->dV.data(), ref_g.dV.data(), ref_g.dV.numel())});
    errors.push_back({"D", max_error_vs_max(grads->D.data(), ref_g.D.data(), ref_g.D.size())});
    nan = has_nan(grads->dQ.data(), grads->dQ.numel()) || has_nan(grads->dK.data(), grads->dK.numel()) ||
          has_nan(grads->dV.data(), grads->dV.numel());
    counted = grads->traffic;
    kernels = grads->kernels;
  }
  const Traffic formula = attention_traffic_formula(run.algorithm, cfg);
  std::string why;
  const bool counts_ok = same_counts(counted, formula, &why);
  // Emulated fp16 is shown, not judged (its error depends on the data's cancellation); NaN fails.
  const bool judged = !run.bwd.fp16_arithmetic;
  // Large logits and cancelling gradients make both results sensitive to rounding: the
  // tolerance grows with the logit bound scale·max‖q_i‖·max‖k_j‖ and the cancellation.
  const std::size_t d = cfg.head_dim;
  const double logit_bound = cfg.softmax_scale() * max_row_norm(Q.data(), Q.numel() / d, d) *
                             max_row_norm(K.data(), K.numel() / d, d);
  const Tolerance tolerance = conditioned_tolerance(run.use_double ? 1e-12 : 1e-5, logit_bound, cancellation);
  const double tol = tolerance.value;
  double worst = 0.0;
  for (const auto& e : errors) worst = std::max(worst, e.error);
  const bool within = !nan && (!judged || worst <= tol);
  const bool ok = within && counts_ok;

  if (run.save) {
    prepare_save_dir(run.save->string());
    save_tensor(*run.save / "o.npy", fwd.O, run.four_d);
    save_stats(*run.save / "lse.npy", fwd.LSE, cfg, run.four_d);
    if (grads) {
      save_tensor(*run.save / "dq.npy", grads->dQ, run.four_d);
      save_tensor(*run.save / "dk.npy", grads->dK, run.four_d);
      save_tensor(*run.save / "dv.npy", grads->dV, run.four_d);
    }
  }

  const Verdict v{errors, counted, formula, kernels, d_identity, nan, judged, tol, within, counts_ok, ok, why, tolerance};
  if (run.output != OutputFormat::text) print_json(run, v);
  else print_text(run, v);
  return ok ? kOk : kFailed;
}

long long get_ll(const po::variables_map& vm, const char* name) { return vm[name].as<long long>(); }

// The mode and every flag except the sizes and the inputs, checked; the problem's sizes come later
// (from the flags or from --inputs).
Run parse_run_flags(const po::variables_map& vm) {
  Run run;
  if (!vm.count("mode")) throw UsageError("missing the mode: fwd or bwd", "e.g. flashlab attention fwd --seq 128 --dim 64");
  run.mode = vm["mode"].as<std::string>();
  if (run.mode != "fwd" && run.mode != "bwd")
    throw UsageError("unknown mode '" + run.mode + "'", "the mode is fwd or bwd");
  const bool bwd = run.mode == "bwd";

  // --variant
  run.variant_flag = vm["variant"].as<std::string>();
  run.algorithm = algorithm_flag(run.variant_flag, bwd);

  // --dtype, --precision
  run.cfg.dtype = parse_dtype(dtype_flag(vm, {"fp32", "bf16", "fp16"}));
  const std::string prec = vm["precision"].as<std::string>();
  if (prec != "float" && prec != "double")
    throw UsageError("--precision '" + prec + "' is unknown", "choose float or double");
  run.use_double = prec == "double";

  // sizes
  require_range("heads", get_ll(vm, "heads"), 1, 1024);
  require_range("batch", get_ll(vm, "batch"), 1, 1024);
  run.cfg.Br = size_flag(vm, "block-m");
  run.cfg.Bc = size_flag(vm, "block-n");
  run.cfg.causal = vm["causal"].as<bool>();
  run.seed = seed_flag(vm);
  run.policy = input_policy(vm);
  run.output = output_format(vm);
  run.bwd.mask_kv = !vm["drop-kv-mask"].as<bool>();
  run.bwd.fp16_arithmetic = vm["fp16-arithmetic"].as<bool>();
  if ((!run.bwd.mask_kv || run.bwd.fp16_arithmetic) && !bwd)
    throw UsageError("--drop-kv-mask and --fp16-arithmetic apply to bwd only", "flashlab attention bwd --drop-kv-mask --fp16-arithmetic …");
  if ((!run.bwd.mask_kv || run.bwd.fp16_arithmetic) && run.algorithm == Algorithm::naive_bwd)
    throw UsageError("--drop-kv-mask and --fp16-arithmetic apply to the flash backward", "use --variant fa2 or atomic");
  if (const auto s = checked_scale(vm)) run.cfg.scale = *s;
  window_flag(vm, run.cfg);
  if (vm.count("save")) run.save = fs::path(vm["save"].as<std::string>());
  return run;
}

}  // namespace

int cmd_attention(const Args& args) {
  if (attention_device_given(args)) return cmd_attention_device(args);  // --device cpu|cuda: cmd_attention_cuda.cpp
  return guarded("attention", [&]() -> int {
    const auto desc = options();
    po::options_description all;
    all.add(desc).add(hidden());
    po::positional_options_description pos;
    pos.add("mode", 1);
    const auto vm = parse(args, all, &pos);
    if (vm.count("help")) {
      print_help(std::cout, kUsageLine, kSummary, desc);
      return kOk;
    }
    Run run = parse_run_flags(vm);
    const bool bwd = run.mode == "bwd";

    // --cu-seqlens: the file's sequences replace --batch, --seq and --seq-k.
    if (vm.count("cu-seqlens")) {
      for (const std::string flag : {"seq", "seq-k"})
        if (vm.count(flag))
          throw UsageError("--" + flag + " conflicts with --cu-seqlens",
                           "with packed sequences the lengths come from the file; drop --" + flag);
      if (!vm["batch"].defaulted())
        throw UsageError("--batch conflicts with --cu-seqlens", "B is the number of sequences the file lists; drop --batch");
      run.cfg.set_packed(read_cu_seqlens(vm["cu-seqlens"].as<std::string>()));
    }
    const bool packed = run.cfg.is_packed();
    if (vm.count("heads-kv")) require_range("heads-kv", get_ll(vm, "heads-kv"), 1, 1024);

    Tensor<double> Q, K, V, dO;
    if (vm.count("inputs")) {
      run.inputs = fs::path(vm["inputs"].as<std::string>());
      if (!fs::is_directory(*run.inputs))
        throw UsageError("--inputs " + run.inputs->string() + " is not a directory", "give a directory holding q.npy k.npy v.npy");
      // Sized from the headers before any payload is read.
      const bool have_do = bwd && fs::exists(*run.inputs / "do.npy");
      const fs::path qf = *run.inputs / "q.npy", kf = *run.inputs / "k.npy", vf = *run.inputs / "v.npy";
      const Shape q_shape = attention_operand_shape(qf).shape;
      const Shape k_shape = attention_operand_shape(kf).shape;
      attention_operand_shape(vf);
      if (have_do) attention_operand_shape(*run.inputs / "do.npy");
      if (packed) {
        // Packed operands hold every sequence along one token axis: [total, H, D] (or a batch of 1).
        const auto require_total = [](const fs::path& file, const Shape& got, std::size_t total, const char* list) {
          if (got.batch != 1 || got.seq != total) {
            std::ostringstream m;
            m << file.string() << ": " << got.batch << " x " << got.seq << " rows do not hold the " << total
              << " rows --cu-seqlens gives (" << list << " ends at " << total << ")";
            throw UsageError(m.str(), "packed operands are [total, H, D]: every sequence's rows one after another");
          }
        };
        require_total(qf, q_shape, run.cfg.packed->total_q(), "cu_seqlens_q");
        require_total(kf, k_shape, run.cfg.packed->total_k(), "cu_seqlens_k");
      }
      const std::size_t longest_q = packed ? run.cfg.n_q() : q_shape.seq;
      const std::size_t longest_k = packed ? run.cfg.n_k() : k_shape.seq;
      require_attention_memory(run.policy, q_shape, k_shape, longest_q, longest_k, bwd, run.use_double);
      const auto q = load_operand(qf, run.policy);
      const auto k = load_operand(kf, run.policy);
      const auto vv = load_operand(vf, run.policy);
      // One layout for all operands: a 4-D q beside 3-D k, v is a mistake, not a batch of one.
      for (const auto& [name, operand] : {std::pair{"k.npy", &k}, std::pair{"v.npy", &vv}})
        if (operand->four_d != q.four_d)
          throw UsageError(std::string(name) + " is " + (operand->four_d ? "4-D" : "3-D") + " but q.npy is " +
                               (q.four_d ? "4-D" : "3-D"),
                           "give every operand the same layout: all [N, H, D] or all [B, N, H, D]");
      const Shape qs = q.t.shape(), ks = k.t.shape();
      require_operand_match(kf, "batch", ks.batch, qs.batch, "q.npy");
      require_operand_match(kf, "head dim", ks.head_dim, qs.head_dim, "q.npy");
      if (qs.heads % ks.heads != 0) {
        std::ostringstream m;
        m << kf.string() << ": heads is " << ks.heads << ", which does not divide the " << qs.heads << " heads of q.npy";
        throw UsageError(m.str(), "k and v have H_kv heads, and each serves H/H_kv query heads of q");
      }
      require_operand_match(vf, "batch", vv.t.shape().batch, ks.batch, "k.npy");
      require_operand_match(vf, "sequence length", vv.t.shape().seq, ks.seq, "k.npy");
      require_operand_match(vf, "heads", vv.t.shape().heads, ks.heads, "k.npy");
      require_operand_match(vf, "head dim", vv.t.shape().head_dim, ks.head_dim, "k.npy");
      auto agree = [&](const char* flag, std::size_t file_value, const fs::path& file) {
        if (vm.count(flag) && !vm[flag].defaulted() && std::size_t(get_ll(vm, flag)) != file_value) {
          std::ostringstream m;
          m << "--" << flag << " " << get_ll(vm, flag) << " disagrees with " << file.string() << " (" << file_value << ")";
          throw UsageError(m.str(), "with --inputs the sizes come from the files; drop the flag");
        }
      };
      agree("heads", qs.heads, qf);
      agree("dim", qs.head_dim, qf);
      agree("heads-kv", ks.heads, kf);
      if (!packed) {
        agree("seq", qs.seq, qf);
        agree("batch", qs.batch, qf);
        agree("seq-k", ks.seq, kf);
        run.cfg.batch = qs.batch;
        run.cfg.seq = qs.seq;
        run.cfg.seq_k = ks.seq == qs.seq ? 0 : ks.seq;
      }
      run.cfg.heads = qs.heads;
      run.cfg.heads_kv = ks.heads == qs.heads ? 0 : ks.heads;
      run.cfg.head_dim = qs.head_dim;
      run.four_d = q.four_d;
      Q = q.t;
      K = k.t;
      V = vv.t;
      if (have_do) {
        auto d = load_operand(*run.inputs / "do.npy", run.policy);
        if (!(d.t.shape() == qs))
          throw UsageError((*run.inputs / "do.npy").string() + ": shape differs from q.npy", "dO has the shape of Q (and O)");
        dO = d.t;
      }
    } else {
      if (!packed && !vm.count("seq")) throw UsageError("--seq is required", "e.g. --seq 128 (or --inputs DIR, or --cu-seqlens FILE)");
      if (!packed) run.cfg.batch = std::size_t(get_ll(vm, "batch"));
      run.cfg.heads = std::size_t(get_ll(vm, "heads"));
      if (vm.count("heads-kv")) run.cfg.heads_kv = std::size_t(get_ll(vm, "heads-kv"));
      run.four_d = !packed && run.cfg.batch > 1;
    }
    if (vm.count("seq")) {
      require_range("seq", get_ll(vm, "seq"), 1, 8192);
      run.cfg.seq = std::size_t(get_ll(vm, "seq"));
    }
    if (vm.count("dim") && !(run.inputs && vm["dim"].defaulted())) {  // with --inputs, d is q.npy's
      require_range("dim", get_ll(vm, "dim"), 1, 1024);
      run.cfg.head_dim = std::size_t(get_ll(vm, "dim"));
    }
    if (vm.count("seq-k")) {
      require_range("seq-k", get_ll(vm, "seq-k"), 1, 8192);
      run.cfg.seq_k = std::size_t(get_ll(vm, "seq-k"));
    }
    if (run.cfg.seq > 8192 || run.cfg.n_k() > 8192) {
      const std::size_t longest = std::max(run.cfg.seq, run.cfg.n_k());
      if (packed)
        throw UsageError("--cu-seqlens: the longest sequence has " + std::to_string(longest) + " rows, above 8192",
                         "the naive float64 reference materialises N x N_k scores per sequence; use shorter sequences");
      throw UsageError("sequence length " + std::to_string(longest) + " is above 8192",
                       "the naive float64 reference materialises N x N scores; use a shorter sequence");
    }
    validate_flags(run.cfg);

    if (!run.inputs) {
      require_attention_memory(run.policy, run.cfg.q_shape(), run.cfg.kv_shape(), run.cfg.n_q(), run.cfg.n_k(), bwd,
                               run.use_double);
      Q = Tensor<double>(run.cfg.q_shape());
      K = Tensor<double>(run.cfg.kv_shape());
      V = Tensor<double>(run.cfg.kv_shape());
      fill_normal(Q, run.seed * 4 + 0);
      fill_normal(K, run.seed * 4 + 1);
      fill_normal(V, run.seed * 4 + 2);
    }
    if (bwd && dO.numel() == 0) {
      dO = Tensor<double>(run.cfg.q_shape());
      fill_normal(dO, run.seed * 4 + 3);
    }
    return run.use_double ? execute<double>(run, Q, K, V, dO) : execute<float>(run, Q, K, V, dO);
  });
}

}  // namespace flashlab::app
