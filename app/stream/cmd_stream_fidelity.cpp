// `flashlab stream fidelity`: the estimate's kept blocks against dense attention's top-k blocks
// by mass (recall, mass kept, the oracle's mass, per k) on synthetic workloads or the user's Q/K.
// Parsing and printing only: reference/src/stream/stream_fidelity.cpp computes.
#include <chrono>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "core/input_checks.hpp"
#include "core/report.hpp"
#include "core/shared_flags.hpp"
#include "stream/stream_flags.hpp"
#include "stream/stream_store_flags.hpp"
#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/stream_fidelity.hpp"

namespace flashlab::app {

namespace {

namespace rs = flashlab::ref::stream;

constexpr std::string_view kFidelityUsage =
    "stream fidelity --seq T --dim D --block-m BM --block-n BN --k LIST [--workload LIST|all] [--inputs DIR]\n"
    "                       [--mask FILE] [--seed S] [--threads N] [--needle-blocks N] [--needles M] [--json|--csv]";
constexpr std::string_view kFidelitySummary =
    "How much of dense attention the estimate keeps. For every query block, dense causal attention (float64)\n"
    "gives each valid key block its mass; the estimate keeps k blocks by representative score. Per k:\n"
    "  recall       kept blocks whose dense mass reaches the k-th largest, over min(k, valid blocks)\n"
    "  mass kept    dense mass in the kept blocks, over all dense mass\n"
    "  oracle       the same for the dense top-k blocks (the best any k blocks hold)\n"
    "  planted      planted (query block, key block) pairs the estimate kept (needles, structured)\n"
    "Workloads: random (Q scaled by 1/sqrt(D)), needles (planted with lead-in), structured (local window,\n"
    "sink on block 0, retrieval pairs); --inputs DIR takes q.npy, k.npy [T, D] or [T, H, D] (every head).\n"
    "Dense attention is O(T^2 D) in float64 on the CPU: with --k 8,16,32, every workload and two threads\n"
    "T = 16384 took 80 s and T = 131072 1110 s at D = 64 (docs/stream.md); --seq is limited to 131072.";

constexpr long long kMaxSeq = 131072;  // the dense side's time (O(T^2 D)), not its memory, sets it

struct Options {
  std::optional<long long> seq, dim;
  long long bq = 0, bk = 0, seed = 1, threads = 1, needle_blocks = 4, needles = 4;
  std::string k_list, workloads = "all", inputs, mask;
  OutputFormat output = OutputFormat::text;
  InputPolicy policy;
};

struct Row {
  std::string workload;
  std::size_t head = 0;
  rs::Fidelity f;
  std::size_t planted = 0, planted_found = 0;
};

}  // namespace

int cmd_stream_fidelity(const Args& args) {
  return guarded("stream fidelity", [&]() -> int {
    Options o;
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("sub", po::value<std::string>(), "fidelity")
        ("seq", po::value<long long>(), "sequence length T (≤ 131072; taken from --inputs when omitted)");
    add_dim_option(desc, " (taken from --inputs when they are given)");
    add_tile_options(desc, std::nullopt, std::nullopt, kStreamTiles);
    desc.add_options()
        ("k", po::value<std::string>(&o.k_list), "blocks kept per query block, a list: 4,8,16 (required)")
        ("workload", po::value<std::string>(&o.workloads)->default_value("all"), "random, needles, structured: a list, or all")
        ("inputs", po::value<std::string>(&o.inputs), "directory with q.npy, k.npy [T, D] or [T, H, D] instead of workloads")
        ("mask", po::value<std::string>(&o.mask), "user block mask (.npy or 0/1 text), ANDed with causality")
        ("threads", po::value<long long>(&o.threads)->default_value(1), "CPU threads over query blocks")
        ("needle-blocks", po::value<long long>(&o.needle_blocks)->default_value(4), "needles / structured: planted query blocks")
        ("needles", po::value<long long>(&o.needles)->default_value(4), "needles / structured: needles or retrieving tokens per block")
        ;
    add_seed_option(desc, "the workloads");
    add_output_options(desc);
    add_input_options(desc);
    po::positional_options_description pos;
    pos.add("sub", 1);
    const auto vm = parse(args, desc, &pos);
    if (vm.count("help")) {
      print_help(std::cout, kFidelityUsage, kFidelitySummary, desc);
      return kOk;
    }
    o.policy = input_policy(vm);
    for (const char* flag : {"block-m", "block-n", "k"})
      if (!vm.count(flag)) throw UsageError(std::string("--") + flag + " is required", "flashlab stream fidelity --help");
    o.bq = vm["block-m"].as<long long>();
    o.bk = vm["block-n"].as<long long>();
    o.seed = vm["seed"].as<long long>();
    o.output = output_format(vm);
    if (vm.count("seq")) o.seq = vm["seq"].as<long long>();
    // --dim's default stands without --inputs; with them only a --dim given checks the files.
    if (o.inputs.empty() || !vm["dim"].defaulted()) o.dim = vm["dim"].as<long long>();
    if (o.inputs.empty() && !o.seq) throw UsageError("--seq is required without --inputs", "e.g. --seq 4096");
    if (!o.inputs.empty() && !vm["workload"].defaulted()) throw UsageError("--workload and --inputs both choose the inputs", "use one of them");
    if (o.seq) require_range("seq", *o.seq, 1, kMaxSeq);
    if (o.dim) require_range("dim", *o.dim, 1, 4096);
    require_range("block-m", o.bq, 1, kMaxSeq);
    require_range("block-n", o.bk, 1, kMaxSeq);
    require_range("threads", o.threads, 1, 256);
    require_range("needle-blocks", o.needle_blocks, 1, 4096);
    require_range("needles", o.needles, 1, 4096);
    checked_seed(o.seed);
    const auto ks = integer_list("k", o.k_list, 1, 1 << 20, "4,8,16");
    std::vector<rs::Workload> workloads;
    if (o.inputs.empty()) {
      std::stringstream ss(o.workloads == "all" ? "random,needles,structured" : o.workloads);
      for (std::string w; std::getline(ss, w, ',');) {
        const auto wl = rs::workload_from_name(w);
        if (!wl) throw UsageError("--workload '" + w + "' is unknown", "random, needles, structured (a comma list), or all");
        workloads.push_back(*wl);
      }
    }
    if (!o.mask.empty() && !std::filesystem::exists(o.mask))
      throw UsageError("--mask " + o.mask + ": no such file", "a .npy of uint8/bool [n_q, n_k] or a text file of 0/1 rows");

    return with_store_errors([&]() -> int {
      std::optional<TraceInputs> in;
      if (!o.inputs.empty()) {
        in = load_trace_inputs(o.inputs, o.policy, o.seq, o.dim, false);
        if (in->L != 1) throw UsageError("--inputs: fidelity takes [T, D] or [T, H, D] inputs, not layers", "pass one layer's q.npy, k.npy");
        if (in->T > std::size_t(kMaxSeq))
          throw UsageError("--inputs: T = " + std::to_string(in->T) + " exceeds " + std::to_string(kMaxSeq) + " (dense attention is O(T^2 D))", "cut the inputs shorter");
        o.seq = (long long)in->T;
        o.dim = (long long)in->D;
      }
      const rs::Geometry g{std::size_t(*o.seq), std::size_t(o.bq), std::size_t(o.bk)};
      MemoryPlan plan;
      plan.add("dense block masses n_q x n_k", checked_size({g.n_q(), g.n_k()}, "n_q x n_k"), 8);
      plan.add("Q, K as float32 and K as float64", checked_size({g.T, std::uint64_t(*o.dim)}, "T x D"), 16);
      plan.add("one query block's scores per thread", checked_size({g.bq, g.T, std::uint64_t(o.threads)}, "b_q x T"), 16);
      plan.require_within(o.policy, "stream fidelity");
      const rs::BlockMask mask = o.mask.empty() ? rs::BlockMask(g) : rs::load_block_mask(o.mask, g, o.policy.memory_limit);
      std::vector<Row> rows;
      using clock = std::chrono::steady_clock;
      const auto start = clock::now();
      auto measure = [&](const std::string& name, std::size_t head, const ref::Mat<float>& Q, const ref::Mat<float>& K,
                         const std::vector<rs::Needle>& planted) {
        const rs::BlockMass dense = rs::dense_block_mass(Q, K, mask, std::size_t(o.threads));
        for (long long k : ks) {
          const auto est = rs::stream_estimate(Q, K, mask, rs::EstimateParams{std::size_t(k), std::size_t(o.threads)});
          Row r{name, head, rs::compare_with_dense(dense, mask, est.indices, std::size_t(k)), planted.size(), 0};
          r.planted_found = rs::needle_recall(planted, est.indices, std::size_t(k)).found;
          rows.push_back(r);
        }
      };
      if (in) {
        for (std::size_t h = 0; h < in->H; ++h)
          measure("inputs", h, head_of(in->q, 0, in->T, in->H, h, in->D),
                  head_of(in->k, 0, in->T, in->H_kv, h / (in->H / in->H_kv), in->D), {});
      } else {
        for (const auto w : workloads) {
          rs::WorkloadParams p{g, std::size_t(*o.dim), std::uint64_t(o.seed)};
          p.needle_blocks = std::size_t(o.needle_blocks);
          p.needles_per_block = std::size_t(o.needles);
          const auto wi = rs::make_workload(w, p);
          measure(std::string(rs::workload_name(w)), 0, wi.Q, wi.K, wi.planted);
        }
      }
      const double seconds = std::chrono::duration<double>(clock::now() - start).count();
      if (o.output != OutputFormat::text) {
        ReportOutput report(o.output, std::cout);
        Json& j = report.json();
        j.begin_object().key("command").value("stream fidelity");
        j.key("T").value(std::uint64_t(g.T)).key("d").value(std::uint64_t(*o.dim)).key("block_m").value(std::uint64_t(g.bq));
        j.key("block_n").value(std::uint64_t(g.bk)).key("seed").value(std::int64_t(o.seed)).key("seconds").value(seconds);
        j.key("mask").value(o.mask.empty() ? std::string("causal") : o.mask).key("rows").begin_array();
        for (const auto& r : rows) {
          j.begin_object().key("workload").value(r.workload).key("head").value(std::uint64_t(r.head)).key("k").value(std::uint64_t(r.f.k));
          j.key("recall").value(r.f.recall()).key("hits").value(r.f.hits).key("wanted").value(r.f.wanted);
          j.key("mass_kept").value(r.f.mass_kept).key("mass_oracle").value(r.f.mass_oracle);
          j.key("planted").value(std::uint64_t(r.planted)).key("planted_found").value(std::uint64_t(r.planted_found));
          j.end_object();
        }
        j.end_array().end_object();
        report.finish();
        return kOk;
      }
      std::cout << "stream fidelity  T=" << g.T << " d=" << *o.dim << " b_q=" << g.bq << " b_k=" << g.bk
                << (o.mask.empty() ? " causal" : " causal ∧ " + o.mask) << ", seed " << o.seed << ", " << std::setprecision(3)
                << seconds << " s\n"
                << "  workload     head     k   recall   mass kept   oracle mass   kept/oracle   planted found\n";
      for (const auto& r : rows) {
        std::ostringstream planted;
        if (r.planted) planted << r.planted_found << "/" << r.planted;
        else planted << "-";
        std::cout << "  " << std::left << std::setw(11) << r.workload << std::right << std::setw(6) << r.head << std::setw(6)
                  << r.f.k << std::fixed << std::setprecision(3) << std::setw(9) << r.f.recall() << std::setw(12)
                  << r.f.mass_kept << std::setw(14) << r.f.mass_oracle << std::setw(14)
                  << (r.f.mass_oracle > 0 ? r.f.mass_kept / r.f.mass_oracle : 1.0) << std::setw(16) << planted.str() << "\n"
                  << std::defaultfloat;
      }
      return kOk;
    });
  });
}

}  // namespace flashlab::app
