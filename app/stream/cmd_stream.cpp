// `flashlab stream estimate|apply|trace` — the STREAM sparse-tracing reference (the STREAM paper) from the
// command line: parse flags, load or generate Q, K, V, call reference/stream, print and save.
// No algorithm code here (DESIGN.md); the specification lives in reference/src/stream/ and
// docs/stream.md.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/commands.hpp"
#include "core/input_checks.hpp"
#include "core/report.hpp"
#include "stream/stream_flags.hpp"
#include "stream/stream_store_flags.hpp"
#include "core/progress.hpp"
#include "flashlab/reference/npy.hpp"
#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/tensor.hpp"

namespace flashlab::app {

namespace {

namespace fs = std::filesystem;
namespace rs = flashlab::ref::stream;
using ref::Mat;

constexpr std::string_view kStreamUsage =
    "stream <estimate|apply|trace> --seq T --dim D --block-m BM --block-n BN --k K [--mask FILE] [--seed S]\n"
    "                       [--threads N] [--inputs DIR] [--save DIR] [--precision float|double] [--check]\n"
    "                       [--format npy|csv] [--json|--csv] [--allow-nonfinite] [--memory-limit SIZE]\n"
    "                       [--device cpu|cuda]\n"
    "       flashlab stream needles --seq T --dim D --block-m BM --block-n BN --k K [--device cpu|cuda] …\n"
    "       flashlab stream trace --store DIR … | query DIR … | serve DIR … | fidelity …";
constexpr std::string_view kSummary =
    "STREAM sparse tracing (the STREAM paper): hierarchical top-k key-block selection with tie-breaking τ.\n"
    "  estimate  the index tensor I [T/b_q, k] (0-based key blocks, -1 = empty) -> indices.npy\n"
    "  apply     sparse attention over the selected blocks (online softmax)     -> o.npy\n"
    "  trace     streamed edge records (q, r, slot, score, mass, value_norm)   -> edges.npy|csv\n"
    "  needles   planted-needle recall of the estimate (flashlab stream needles --help)\n"
    "  trace --store DIR  many layers and heads into a trace store (flashlab stream trace --store x --help)\n"
    "  query     reads, readers, routes and summaries of a store (flashlab stream query --help)\n"
    "  serve     the store in a browser: flashlab stream serve DIR (flashlab stream serve --help)\n"
    "  fidelity  kept blocks against dense attention's top-k by mass (flashlab stream fidelity --help)\n"
    "Inputs: q.npy k.npy [v.npy] of shape [T, D] from --inputs, else seeded normal values.\n"
    "The block mask (--mask) is a .npy of uint8/bool [n_q, n_k] or a text file of '0'/'1' rows;\n"
    "it is ANDed with causality. The specification and its decisions: docs/stream.md.\n"
    "Inputs are float32 or float64 and finite (--allow-nonfinite lets NaN/Inf through); the --check\n"
    "tolerance 1e-12 is scaled up by L/64 when the logit bound L = max|q_t|*max|k_s| exceeds 64.\n"
    "--device cuda runs estimate|apply|trace on the clear CUDA kernels (estimate and apply on the fast\n"
    "ones with --kernel fast) with the same flags and input rules, also on [T, H, D] inputs\n"
    "(flashlab stream estimate --device cuda --help); --device cpu, the default, runs this CPU reference.";

/// The dense check computes full attention: O(T²·d) time, so it is limited to moderate T.
constexpr long long kMaxCheckSeq = 16384;

struct Options : StreamFlags {
  std::string precision = "float";
  OutputFormat output = OutputFormat::text;
  bool check = false;
};

constexpr const char* kInputsHint = "--inputs DIR must hold q.npy, k.npy (and v.npy for apply/trace), float [T, D]";

// Checks one [T, D] input's header (nothing read yet); errors name the file and what was expected.
ref::NpyHeader matrix_header(const fs::path& path, std::optional<long long> seq, std::optional<long long> dim,
                             bool check_dim) {
  const ref::NpyHeader a = float_input_header(path, kInputsHint);
  if (a.shape.size() != 2) {
    throw UsageError(path.string() + ": has shape " + ref::shape_str(a.shape) + ", expected [T, D]",
                     "save the input as a 2-D array, one row per token");
  }
  if (a.shape[0] == 0 || a.shape[1] == 0)
    throw UsageError(path.string() + ": shape " + ref::shape_str(a.shape) + " has a zero dimension",
                     "T and D must be at least 1");
  if (seq && a.shape[0] != std::size_t(*seq)) {
    throw UsageError(path.string() + ": has " + std::to_string(a.shape[0]) + " rows, expected T = " +
                         std::to_string(*seq) + " (from --seq or q.npy)",
                     "q, k and v must have one row per token; drop --seq to take T from q.npy");
  }
  if (check_dim && dim && a.shape[1] != std::size_t(*dim)) {
    throw UsageError(path.string() + ": has " + std::to_string(a.shape[1]) + " columns, expected D = " +
                         std::to_string(*dim) + " (from --dim or q.npy)",
                     "q and k must share the head dim; drop --dim to take D from q.npy");
  }
  return a;
}

// Reads an input whose header was checked; the finiteness policy applies.
Mat<double> load_matrix(const fs::path& path, const ref::NpyHeader& h, const InputPolicy& policy) {
  const auto v = read_float_input(path, policy, kInputsHint);
  Mat<double> m(static_cast<Eigen::Index>(h.shape[0]), static_cast<Eigen::Index>(h.shape[1]));
  std::copy(v.begin(), v.end(), m.data());
  return m;
}

// What a run holds at its peak, from the sizes alone: Q, K, V read as float64 and kept in the
// working precision, the float64 copies of the dense check, O, the index tensor and the edge records.
void require_stream_memory(const Options& o, std::size_t T, std::size_t D, std::size_t v_cols, bool from_files) {
  const std::uint64_t td = checked_size({T, D}, "T x D");
  const std::uint64_t tv = checked_size({T, v_cols}, "T x D_v");
  const std::uint64_t elem = o.precision == "float" ? 4 : 8;
  const std::uint64_t n_q = (T + std::size_t(o.bq) - 1) / std::size_t(o.bq);
  MemoryPlan plan;
  if (from_files) plan.add("Q, K, V read as float64", td * 2 + tv, 8);
  plan.add("Q, K, V and O in the working precision", td * 2 + tv * 2, elem);
  if (o.check) plan.add("float64 Q, K, V and O of the dense check", td * 2 + tv * 3, 8);
  plan.add("index tensor I [n_q, k]", checked_size({n_q, std::uint64_t(o.k)}, "n_q x k"), 8, o.sub == "trace" ? 7 : 1);
  plan.require_within(o.policy, "stream " + o.sub + " at T = " + std::to_string(T) + ", D = " + std::to_string(D));
}

template <typename S>
Mat<S> random_matrix(std::size_t rows, std::size_t cols, unsigned long long seed) {
  ref::Tensor<S> t(ref::Shape{1, rows, 1, cols});
  ref::fill_normal(t, seed);
  Mat<S> m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  std::copy(t.data(), t.data() + t.numel(), m.data());
  return m;
}

void print_traffic(std::ostream& os, const ref::Traffic& t) {
  os << "  " << std::left << std::setw(8) << "tensor" << std::right << std::setw(16) << "read bytes" << std::setw(16)
     << "write bytes" << "\n";
  for (const auto& e : t.tensors()) {
    os << "  " << std::left << std::setw(8) << e.name << std::right << std::setw(16) << e.read_bytes() << std::setw(16)
       << e.write_bytes() << "\n";
  }
  os << "  flops " << t.flops() << "\n";
}

std::string hex(std::uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(16) << std::setfill('0') << v;
  return os.str();
}

void write_edges(const fs::path& path, const std::vector<rs::Edge>& edges, const std::string& format) {
  if (format == "csv") {
    std::ofstream out(path);
    if (!out) throw std::runtime_error(path.string() + ": cannot write");
    out << "q,r,slot,score,mass,value_norm\n" << std::setprecision(17);
    for (const auto& e : edges)
      out << e.q << ',' << e.r << ',' << e.slot << ',' << e.score << ',' << e.mass << ',' << e.value_norm << '\n';
    if (!out) throw std::runtime_error(path.string() + ": write failed");
    return;
  }
  static_assert(sizeof(rs::Edge) == 48, "edge record layout must match the .npy structured dtype");
  ref::write_npy_raw(path, {edges.size()},
                     "[('q', '<i8'), ('r', '<i8'), ('slot', '<i8'), ('score', '<f8'), ('mass', '<f8'), "
                     "('value_norm', '<f8')]",
                     edges.data(), edges.size() * sizeof(rs::Edge));
}

template <typename S>
int run(const Options& o, const Mat<double>* Qd, const Mat<double>* Kd, const Mat<double>* Vd) {
  // Inputs in the working precision: float at large T halves memory, double for exactness.
  const bool need_v = o.sub != "estimate";
  // T and D are known (from --seq/--dim or the headers): the mask is sized and read first.
  const std::size_t T = std::size_t(*o.seq), D = std::size_t(*o.dim);
  const rs::Geometry g{T, std::size_t(o.bq), std::size_t(o.bk)};
  const std::size_t k = std::size_t(o.k);
  const rs::BlockMask mask = o.mask.empty() ? rs::BlockMask(g) : rs::load_block_mask(o.mask, g, o.policy.memory_limit);
  Mat<S> Q, K, V;
  if (Qd) {
    Q = Qd->cast<S>();
    K = Kd->cast<S>();
    if (need_v) V = Vd->cast<S>();
  } else {
    const auto seed = static_cast<unsigned long long>(o.seed);
    Q = random_matrix<S>(T, D, seed);
    K = random_matrix<S>(T, D, seed + 1);
    if (need_v) V = random_matrix<S>(T, D, seed + 2);
  }

  const rs::Bounds b = rs::stream_bounds(g, D, k);
  std::vector<Stage> stages = {{"estimate", b.work_paper}};
  if (need_v) stages.push_back({"apply", 2.0 * b.work_paper});
  if (o.check) stages.push_back({"dense check", 4.0 * double(T) * double(T) * double(D)});
  Progress progress("stream " + o.sub, std::move(stages));
  const rs::EstimateResult est = rs::stream_estimate(Q, K, mask, rs::EstimateParams{k, std::size_t(o.threads)});
  progress.next();
  const std::string violation = rs::validate_indices(est.indices, k, mask);
  std::optional<rs::ApplyResult<S>> app;
  if (need_v) app = rs::stream_apply(Q, K, V, mask, est.indices, k, std::size_t(o.threads), o.sub == "trace");
  progress.next();
  std::optional<rs::DenseCheck> chk;
  std::optional<Tolerance> check_tolerance;
  if (o.check) {
    const Mat<double> q64 = Q.template cast<double>(), k64 = K.template cast<double>();
    const Mat<double> v64 = need_v ? Mat<double>(V.template cast<double>()) : random_matrix<double>(T, D, 7);
    chk = rs::stream_check_dense(q64, k64, v64, mask, std::size_t(o.threads));
    // Conditioning (input_checks.hpp): STREAM's logits are unscaled ⟨q_t, k_s⟩ ≤ max‖q‖·max‖k‖.
    check_tolerance = conditioned_tolerance(chk->tolerance, max_row_norm(q64.data(), T, D) * max_row_norm(k64.data(), T, D));
    chk->tolerance = check_tolerance->value;
  }

  std::vector<std::string> saved;
  if (!o.save.empty()) {
    prepare_save_dir(o.save);
    const fs::path dir(o.save);
    if (o.sub == "estimate") {
      ref::write_npy(dir / "indices.npy", {g.n_q(), k}, est.indices.data());
      saved.push_back((dir / "indices.npy").string());
    } else if (o.sub == "apply") {
      ref::write_npy(dir / "o.npy", {T, std::size_t(V.cols())}, app->O.data());
      saved.push_back((dir / "o.npy").string());
    } else {
      const fs::path p = dir / (o.format == "csv" ? "edges.csv" : "edges.npy");
      write_edges(p, app->edges, o.format);
      saved.push_back(p.string());
    }
  }

  const double eb = sizeof(S);
  const auto* qt = est.traffic.find("Q");
  const auto* kt = est.traffic.find("K");
  const double io_counted = double(qt->read_elements + kt->read_elements);
  std::size_t empty = 0;
  for (auto v : est.indices) empty += v < 0 ? 1 : 0;

  if (o.output != OutputFormat::text) {
    ReportOutput report(o.output, std::cout);
    Json& j = report.json();
    j.begin_object();
    j.key("command").value("stream " + o.sub);
    j.key("T").value(std::uint64_t(T)).key("d").value(std::uint64_t(D)).key("block_m").value(std::uint64_t(g.bq));
    j.key("block_n").value(std::uint64_t(g.bk)).key("k").value(std::uint64_t(k));
    j.key("n_q").value(std::uint64_t(b.n_q)).key("n_k").value(std::uint64_t(b.n_k)).key("n_it").value(std::uint64_t(b.n_it));
    j.key("threads").value(std::int64_t(o.threads)).key("precision").value(o.precision);
    j.key("mask").value(o.mask.empty() ? std::string("causal") : o.mask);
    j.key("indices_checksum").value(hex(rs::indices_checksum(est.indices)));
    j.key("empty_entries").value(std::uint64_t(empty));
    j.key("validity_invariant").value(violation.empty());
    if (g.n_q() * k <= 4096) {
      j.key("indices").begin_array();
      for (std::size_t q = 0; q < g.n_q(); ++q) {
        j.begin_array();
        for (std::size_t c = 0; c < k; ++c) j.value(est.at(q, c));
        j.end_array();
      }
      j.end_array();
    }
    j.key("blocks_scored").value(est.blocks_scored);
    j.key("max_blocks_scored_per_q").value(est.max_blocks_scored_per_q);
    auto traffic = [&](const char* name, const ref::Traffic& t) {
      j.key(name).begin_object();
      for (const auto& e : t.tensors()) {
        j.key(e.name).begin_object().key("read_bytes").value(e.read_bytes()).key("write_bytes").value(e.write_bytes()).end_object();
      }
      j.key("flops").value(t.flops());
      j.end_object();
    };
    traffic("traffic_estimate", est.traffic);
    if (app) traffic("traffic_apply", app->traffic);
    j.key("bounds").begin_object();
    j.key("io_est_counted_bytes").value(io_counted * eb);
    j.key("io_upper_paper_bytes").value(b.io_upper_paper * eb);
    j.key("io_upper_exact_bytes").value(b.io_upper_exact * eb);
    j.key("io_lower_bytes").value(b.io_lower * eb);
    j.key("work_counted_flops").value(est.traffic.flops());
    j.key("work_paper_flops").value(b.work_paper);
    j.key("work_upper_exact_flops").value(b.work_upper_exact);
    j.end_object();
    if (app && o.sub == "trace") j.key("edges").value(std::uint64_t(app->edges.size()));
    if (chk) {
      j.key("dense_check").begin_object().key("max_rel_error").value(chk->max_rel_error);
      j.key("tolerance").value(chk->tolerance).key("every_valid_block_kept").value(chk->every_valid_block_kept);
      j.key("passed").value(chk->passed()).end_object();
    }
    j.key("saved").begin_array();
    for (const auto& s : saved) j.value(s);
    j.end_array();
    j.end_object();
    report.finish();
  } else {
    auto& os = std::cout;
    os << "stream " << o.sub << "  T=" << T << " d=" << D << " b_q=" << g.bq << " b_k=" << g.bk << " k=" << k
       << "  n_q=" << b.n_q << " n_k=" << b.n_k << " n_it=" << b.n_it << "  threads=" << o.threads
       << " precision=" << o.precision << " mask=" << (o.mask.empty() ? "causal" : "causal ∧ " + o.mask) << "\n";
    os << "indices: checksum " << hex(rs::indices_checksum(est.indices)) << ", " << empty << " empty entries of "
       << est.indices.size() << "; validity invariant " << (violation.empty() ? "holds" : "VIOLATED: " + violation)
       << "\n";
    const std::size_t show = std::min<std::size_t>(g.n_q(), 8);
    for (std::size_t q = 0; q < show; ++q) {
      os << "  I[" << q << "] =";
      for (std::size_t c = 0; c < k && c < 16; ++c) os << ' ' << est.at(q, c);
      if (k > 16) os << " …";
      os << "\n";
    }
    if (g.n_q() > show) os << "  … (" << g.n_q() - show << " more rows; --save writes them all)\n";
    os << "estimate traffic (counted by the tile loops, " << ref::dtype_name(est.traffic.dtype()) << "):\n";
    print_traffic(os, est.traffic);
    os << std::setprecision(4);
    os << "IO_est (Q + K reads) " << io_counted * eb << " bytes; blocks scored " << est.blocks_scored
       << " (max per query block " << est.max_blocks_scored_per_q << ")\n"
       << "  ≤ Td + n_q·k·n_it·b_k·d     = " << b.io_upper_paper * eb << "  (STREAM paper, Thm 3; ratio "
       << io_counted / b.io_upper_paper << ")\n"
       << "  ≤ Td + n_q·k·(n_it+1)·b_k·d = " << b.io_upper_exact * eb << "  (this reference's worst case)\n"
       << "  ≥ Td + n_q·k·b_k·d          = " << b.io_lower * eb << "  (STREAM paper, Thm 4; ratio "
       << io_counted / b.io_lower << ")\n"
       << "Work_est " << double(est.traffic.flops()) << " flops vs 2·n_q·k·n_it·b_q·b_k·d = " << b.work_paper
       << " (ratio " << double(est.traffic.flops()) / b.work_paper << ")\n";
    if (app) {
      os << "apply traffic:\n";
      print_traffic(os, app->traffic);
    }
    if (app && o.sub == "trace") {
      os << app->edges.size() << " edge records (q, r, slot, score, mass, value_norm); first ones:\n"
         << std::setprecision(6);
      for (std::size_t i = 0; i < std::min<std::size_t>(app->edges.size(), 6); ++i) {
        const auto& e = app->edges[i];
        os << "  (" << e.q << ", " << e.r << ", " << e.slot << ", " << e.score << ", " << e.mass << ", "
           << e.value_norm << ")\n";
      }
    }
    if (chk) {
      os << std::setprecision(3) << "dense check (k = n_k, float64): max rel error " << chk->max_rel_error
         << " (tolerance " << check_tolerance->str() << "), every valid block kept: "
         << (chk->every_valid_block_kept ? "yes" : "no") << " — " << (chk->passed() ? "PASS" : "FAIL") << "\n";
    }
    for (const auto& s : saved) os << "saved " << s << "\n";
  }
  if (!violation.empty()) {
    std::cerr << "error: validity invariant violated: " << violation << "\n";
    return kFailed;
  }
  if (chk && !chk->passed()) {
    std::cerr << "error: dense check failed: max rel error " << chk->max_rel_error << " > " << chk->tolerance << "\n";
    return kFailed;
  }
  return kOk;
}

}  // namespace

int cmd_stream(const Args& args) {
  if (!args.empty() && args[0] == "needles") return cmd_stream_needles(args);
  if (!args.empty() && args[0] == "query") return cmd_stream_query(args);
  if (!args.empty() && args[0] == "serve") return cmd_stream_serve(args);
  if (!args.empty() && args[0] == "fidelity") return cmd_stream_fidelity(args);
  if (!args.empty() && args[0] == "trace" && has_flag(args, "--store")) return cmd_stream_trace_store(args);
  if (stream_wants_cuda(args)) return cmd_stream_cuda(args);
  return guarded("stream", [&]() -> int {
    Options o;
    po::options_description desc("Options");
    desc.add_options()("help,h", "show this help");
    add_stream_options(desc, 1);
    desc.add_options()
        ("check", po::bool_switch(&o.check), "also run the dense check: k = n_k must equal dense causal attention (float64, 1e-12)");
    add_precision_option(desc);
    add_output_options(desc);
    po::positional_options_description pos;
    pos.add("sub", 1);
    const auto vm = parse(args, desc, &pos);
    if (vm.count("help")) {
      print_help(std::cout, kStreamUsage, kSummary, desc);
      return kOk;
    }
    if (vm.count("device") && vm["device"].as<std::string>() != "cpu")  // cuda went to cmd_stream_cuda
      throw UsageError("--device '" + vm["device"].as<std::string>() + "' is unknown", "choose cpu or cuda");
    static_cast<StreamFlags&>(o) = stream_flags(vm);
    o.precision = vm["precision"].as<std::string>();
    if (o.precision != "float" && o.precision != "double")
      throw UsageError("--precision '" + o.precision + "' is unknown", "choose float or double");
    o.output = output_format(vm);
    std::optional<Mat<double>> Qd, Kd, Vd;
    if (!o.inputs.empty()) {
      const fs::path dir(o.inputs);
      if (!fs::is_directory(dir)) throw UsageError("--inputs " + o.inputs + ": not a directory", "pass the directory holding q.npy and k.npy");
      // Every header first (shapes agree, the run fits the memory limit), then the payloads.
      const auto qh = matrix_header(dir / "q.npy", o.seq, o.dim, true);
      const auto T = static_cast<long long>(qh.shape[0]), D = static_cast<long long>(qh.shape[1]);
      const auto kh = matrix_header(dir / "k.npy", T, D, true);
      std::optional<ref::NpyHeader> vh;
      if (o.sub != "estimate") vh = matrix_header(dir / "v.npy", T, std::nullopt, false);
      require_stream_memory(o, qh.shape[0], qh.shape[1], vh ? vh->shape[1] : qh.shape[1], true);
      Qd = load_matrix(dir / "q.npy", qh, o.policy);
      Kd = load_matrix(dir / "k.npy", kh, o.policy);
      if (vh) Vd = load_matrix(dir / "v.npy", *vh, o.policy);
      o.seq = T;
      o.dim = D;
    } else {
      require_stream_memory(o, std::size_t(*o.seq), std::size_t(*o.dim), std::size_t(*o.dim), false);
    }
    if (o.check && *o.seq > kMaxCheckSeq) {
      throw UsageError("--check computes dense attention (O(T²·d)) and is limited to --seq ≤ " + std::to_string(kMaxCheckSeq),
                       "drop --check, or check a smaller T");
    }
    const Mat<double>* q = Qd ? &*Qd : nullptr;
    const Mat<double>* kk = Kd ? &*Kd : nullptr;
    const Mat<double>* v = Vd ? &*Vd : nullptr;
    try {
      return o.precision == "float" ? run<float>(o, q, kk, v) : run<double>(o, q, kk, v);
    } catch (const rs::StreamError& e) {
      throw UsageError(e.what(), "check --mask, --block-m, --block-n and --k against T (docs/stream.md)");
    }
  });
}

}  // namespace flashlab::app
