// `flashlab traffic stream-shards`: STREAM's estimate and application with the sequence sharded
// over G GPUs, simulated on the CPU (reference/…/stream_shards.hpp): per rank what it holds and
// scores, and per scheme the bytes that cross the links — the model a multi-GPU STREAM is
// designed from, before any GPU runs it.
#include <iomanip>
#include <iostream>
#include <sstream>

#include "core/cli.hpp"
#include "core/commands.hpp"
#include "core/report.hpp"
#include "stream/stream_flags.hpp"
#include "flashlab/reference/stream_shards.hpp"
#include "flashlab/reference/tensor.hpp"

namespace flashlab::app {

namespace {

namespace rs = flashlab::ref::stream;

constexpr const char* kUsageLine =
    "traffic stream-shards [--gpus G] [--seq T] [--dim D] [--block-m BM] [--block-n BN] [--k K] [--seed S]\n"
    "                              [--mask FILE] [--link-bytes E] [--threads N] [--csv|--json]";
constexpr const char* kSummary =
    "STREAM with the sequence cut into G contiguous shards (one per GPU), simulated on the CPU on\n"
    "seeded N(0, 1) inputs: each rank estimates its own query blocks with the single-GPU refinement,\n"
    "and the key blocks it does not hold reach it one of three ways — keys_visible (every remote\n"
    "key block the mask lets it see, in one exchange), keys_scored (only the representatives it\n"
    "scores, one request round per refinement round), queries_to_keys (its query block travels\n"
    "to the key blocks' owners, which return (score, r)). Prints per rank the blocks it holds and\n"
    "the scores of its query blocks, and per scheme the bytes over the links for the estimate and\n"
    "for the application (V, and K where the estimate did not bring it, of the kept remote\n"
    "blocks); checks that I equals the single-GPU estimate. --link-bytes is the element size on\n"
    "the links (2: bf16 as the fast kernels hold Q, K, V).";

po::options_description options() {
  po::options_description d("Options");
  d.add_options()("help,h", "show this help")
      ("gpus", po::value<long long>()->default_value(4), "G, ranks (GPUs) the sequence is cut into")
      ("seq", po::value<long long>()->default_value(65536), "T, sequence length")
      ;
  add_dim_option(d);
  add_tile_options(d, 64, 64, kStreamTiles);
  d.add_options()("k", po::value<long long>()->default_value(16), "key blocks kept per query block");
  add_seed_option(d);
  d.add_options()
      ("mask", po::value<std::string>(), "user block mask file (as stream estimate --mask)")
      ("link-bytes", po::value<long long>()->default_value(2), "bytes per element of Q, K, V on the links (1, 2, 4, 8)")
      ("threads", po::value<long long>()->default_value(8), "CPU threads of the simulation");
  add_output_options(d);
  return d;
}

std::string human(double bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3);
  if (bytes >= 1e9) os << bytes / 1e9 << " GB";
  else if (bytes >= 1e6) os << bytes / 1e6 << " MB";
  else os << bytes / 1e3 << " kB";
  return os.str();
}

std::uint64_t max_of(const rs::SchemeTraffic& t, bool estimate) {
  std::uint64_t m = 0;
  for (const auto& r : t.ranks) m = std::max(m, estimate ? r.estimate_in : r.apply_in);
  return m;
}

void print_table(std::ostream& os, const rs::ShardedEstimate& s, const rs::Geometry& g, std::size_t d, std::size_t k,
                 std::size_t e, bool same) {
  os << "STREAM sharded over G = " << s.shards.size() << " GPUs (simulated): T=" << g.T << " d=" << d
     << " b_q=" << g.bq << " b_k=" << g.bk << " k=" << k << ", " << e << " bytes per element on the links\n\n";
  const auto& scored = s.schemes[1].ranks;  // keys_scored: the scores of each rank's query blocks
  os << std::setw(5) << "rank" << std::setw(22) << "tokens" << std::setw(15) << "query blocks" << std::setw(13)
     << "key blocks" << std::setw(15) << "scores local" << std::setw(15) << "scores remote" << "\n";
  for (std::size_t r = 0; r < s.shards.size(); ++r) {
    const auto& sh = s.shards[r];
    std::ostringstream tokens;
    tokens << "[" << sh.token_begin << ", " << sh.token_end << ")";
    os << std::setw(5) << r << std::setw(22) << tokens.str() << std::setw(15) << sh.q_end - sh.q_begin << std::setw(13)
       << sh.r_end - sh.r_begin << std::setw(15) << scored[r].scores_local << std::setw(15) << scored[r].scores_remote
       << "\n";
  }
  os << "\n" << std::left << std::setw(17) << "scheme" << std::right << std::setw(7) << "rounds" << std::setw(20)
     << "estimate in (max)" << std::setw(18) << "apply in (max)" << std::setw(16) << "max rank in" << std::setw(18)
     << "total on links" << "\n";
  for (const auto& t : s.schemes)
    os << std::left << std::setw(17) << rs::shard_scheme_name(t.scheme) << std::right << std::setw(7) << t.rounds
       << std::setw(20) << human(double(max_of(t, true))) << std::setw(18) << human(double(max_of(t, false)))
       << std::setw(16) << human(double(t.max_in())) << std::setw(18) << human(double(t.total())) << "\n";
  os << "\nI equal to the single-GPU estimate: " << (same ? "yes" : "NO") << "\n";
}

// --json / --csv through the one report writer: the problem's fields, then one row per (scheme,
// rank) carrying its scheme's rounds and totals (CSV repeats the problem's fields in front of each).
void print_report(OutputFormat format, std::ostream& os, const rs::ShardedEstimate& s, const rs::Geometry& g,
                  std::size_t d, std::size_t k, std::size_t e, bool same) {
  ReportOutput report(format, os);
  Json& j = report.json();
  j.begin_object();
  j.key("T").value(std::uint64_t(g.T));
  j.key("d").value(std::uint64_t(d));
  j.key("block_m").value(std::uint64_t(g.bq));
  j.key("block_n").value(std::uint64_t(g.bk));
  j.key("k").value(std::uint64_t(k));
  j.key("gpus").value(std::uint64_t(s.shards.size()));
  j.key("link_elem_bytes").value(std::uint64_t(e));
  j.key("indices_equal_single_gpu").value(same);
  j.key("rows").begin_array();
  for (const auto& t : s.schemes)
    for (std::size_t r = 0; r < t.ranks.size(); ++r) {
      const auto& x = t.ranks[r];
      j.begin_object();
      j.key("scheme").value(rs::shard_scheme_name(t.scheme));
      j.key("rounds").value(std::uint64_t(t.rounds));
      j.key("max_in_bytes").value(t.max_in());
      j.key("total_bytes").value(t.total());
      j.key("rank").value(std::uint64_t(r));
      j.key("estimate_in_bytes").value(x.estimate_in);
      j.key("estimate_out_bytes").value(x.estimate_out);
      j.key("apply_in_bytes").value(x.apply_in);
      j.key("apply_out_bytes").value(x.apply_out);
      j.key("scores_local").value(x.scores_local);
      j.key("scores_remote").value(x.scores_remote);
      j.key("scores_computed").value(x.scores_computed);
      j.end_object();
    }
  j.end_array();
  j.end_object();
  report.finish();
}

}  // namespace

int cmd_traffic_shards(const Args& args) {
  return guarded("traffic stream-shards", [&]() -> int {
    const auto desc = options();
    const auto parsed = parse_subject_command(
        args, desc,
        {"traffic", "model", "stream-shards", "flashlab traffic stream-shards --gpus 4 --seq 65536", kUsageLine, kSummary});
    if (!parsed) return kOk;  // --help was printed
    const po::variables_map& vm = *parsed;
    require_range("gpus", vm["gpus"].as<long long>(), 1, 1024);
    require_range("seq", vm["seq"].as<long long>(), 1, 1LL << 20);
    require_range("dim", vm["dim"].as<long long>(), 1, 1024);
    require_range("block-m", vm["block-m"].as<long long>(), 1, 4096);
    require_range("block-n", vm["block-n"].as<long long>(), 1, 4096);
    require_range("k", vm["k"].as<long long>(), 1, 4096);
    require_range("threads", vm["threads"].as<long long>(), 1, 256);
    const long long e = vm["link-bytes"].as<long long>();
    if (e != 1 && e != 2 && e != 4 && e != 8)
      throw UsageError("--link-bytes " + std::to_string(e) + " is not an element size", "choose 1, 2, 4 or 8");
    const OutputFormat format = output_format(vm);
    const bool csv = format == OutputFormat::csv, json = format == OutputFormat::json;
    const unsigned long long seed = seed_flag(vm);
    const rs::Geometry g{std::size_t(vm["seq"].as<long long>()), std::size_t(vm["block-m"].as<long long>()),
                         std::size_t(vm["block-n"].as<long long>())};
    const std::size_t d = std::size_t(vm["dim"].as<long long>()), k = std::size_t(vm["k"].as<long long>());
    // Q and K as T × d floats (the reference's own layout): 2·T·d·4 bytes at most 8 GiB by the limits.
    if (std::uint64_t(g.T) * d > (std::uint64_t(1) << 27))
      throw UsageError("--seq × --dim = " + std::to_string(std::uint64_t(g.T) * d) + " elements per tensor",
                       "at most 2^27 (the simulation holds Q and K in host memory): shorten --seq");
    try {
      const rs::BlockMask mask =
          vm.count("mask") ? rs::load_block_mask(vm["mask"].as<std::string>(), g) : rs::BlockMask(g);
      ref::Tensor<float> q(ref::Shape{1, g.T, 1, d}), kk(q.shape());
      ref::fill_normal(q, std::uint64_t(seed));
      ref::fill_normal(kk, std::uint64_t(seed) + 1);
      const ref::Mat<float> Q = Eigen::Map<const ref::Mat<float>>(q.data(), Eigen::Index(g.T), Eigen::Index(d));
      const ref::Mat<float> K = Eigen::Map<const ref::Mat<float>>(kk.data(), Eigen::Index(g.T), Eigen::Index(d));
      const rs::EstimateParams params{k, std::size_t(vm["threads"].as<long long>())};
      const rs::ShardedEstimate s =
          rs::stream_estimate_sharded(Q, K, mask, params, std::size_t(vm["gpus"].as<long long>()), std::size_t(e));
      // The simulation checks I against the single-GPU estimate itself (it throws otherwise).
      const bool same = true;
      if (json || csv) print_report(format, std::cout, s, g, d, k, std::size_t(e), same);
      else print_table(std::cout, s, g, d, k, std::size_t(e), same);
    } catch (const rs::StreamError& err) {
      throw UsageError(err.what(), "check --block-m, --block-n, --k and --mask against --seq (docs/stream.md)");
    }
    return kOk;
  });
}

}  // namespace flashlab::app
