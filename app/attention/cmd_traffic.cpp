// `flashlab traffic attention`: sweep N and print the modelled HBM bytes of naive vs FA1 vs FA2
// side by side (or one variant per tensor, or the backward designs), as a table or CSV.
// `--device cuda` hands the same parsed flags to the CUDA helper (cuda_traffic.hpp), which
// measures the kernels with CUPTI beside this model. Formatting only: the formulas are
// reference/ attention_traffic.hpp, and tests assert they equal what the tile loops count.
#include "attention/attention_flags.hpp"
#include "lessons/cmd_traffic_chapter.hpp"
#include "core/commands.hpp"
#include "core/gpu_flags.hpp"
#include "core/report.hpp"

#include "flashlab/reference/attention_traffic.hpp"
#include "flashlab/reference/memory_budget.hpp"

#ifdef FLASHLAB_HAVE_CUDA
#include "attention/cuda_traffic.hpp"
#endif

#include <algorithm>
#include <iomanip>
#include <optional>
#include <iostream>
#include <sstream>

namespace flashlab::app {

namespace {

using namespace flashlab::ref;

constexpr const char* kUsageLine =
    "traffic attention --seq N[,N2,...] [--dim D] [--heads H] [--batch B] [--block-m BM] [--block-n BN]\n"
    "                          [--causal] [--dtype fp32|bf16|fp16] [--variant naive|fa1|fa2|atomic|bwd] [--json|--csv]\n"
    "                          [--device cpu|cuda] [--svg FILE]\n"
    "       flashlab traffic levels [options]   (the traffic chapter's three-level table; --help)\n"
    "       flashlab traffic mta|stream [options] (their models beside the clear kernels' measured bytes; --help)\n"
    "       flashlab traffic ring [options]     (bytes between GPUs: context-parallel attention's ring; --help)\n"
    "       flashlab traffic stream-shards [options] (bytes between GPUs: STREAM sharded over G; --help)";
constexpr const char* kSummary =
    "Prints the HBM bytes (read + write) of attention as the reference's closed-form model states\n"
    "them, for each N: naive (S and P materialised) vs FA1 (KV outer, O/m/l read-modify-written) vs\n"
    "FA2 (Q tile resident). --variant V prints that variant per tensor instead (atomic and bwd: the\n"
    "backward designs, one kernel with dQ in HBM and the two-kernel design). The counts assume\n"
    "what docs/attention.md states; tests check them against the tile loops. --device cuda\n"
    "measures the CUDA kernels with CUPTI beside the model (builds with CUDA only).";

po::options_description options() {
  po::options_description d("Options");
  d.add_options()("help,h", "show this help")
      ("seq", po::value<std::string>(), "sequence lengths, comma separated (e.g. 1024,2048,4096)")
      ("heads", po::value<long long>()->default_value(1), "H, number of heads")
      ;
  add_dim_option(d);
  d.add_options()
      ("batch", po::value<long long>()->default_value(1), "B, batch size")
      ("causal", po::bool_switch(), "causal mask (fully masked tiles are skipped)")
      ;
  add_dtype_option(d, "fp32 | bf16 | fp16", "fp32", " (statistics stay fp32)");
  d.add_options()
      ("variant", po::value<std::string>(), "naive | fa1 | fa2 | atomic | bwd (default: naive vs FA1 vs FA2)")
      ("device", po::value<std::string>()->default_value("cpu"), "cpu (the model) | cuda (measure the kernels)")
      ("svg", po::value<std::string>(), "also write bytes against N (naive, FA1, FA2; model and measured) as SVG");
  add_tile_options(d);
  add_output_options(d);
  return d;
}

// --seq as sizes (the model runs up to 2^24 keys; each level checks its own limits after).
std::vector<std::size_t> seq_list(const std::string& text) {
  const auto v = integer_list("seq", text, 1, 1LL << 24, "1024,2048,4096");
  return {v.begin(), v.end()};
}

// The models count bytes and FLOPs in 64 bits; every count is below 64·B·H·N²·max(d, 4) (the
// largest, the backward's FLOPs, is 20·B·H·N²·d), so a size whose bound does not fit is refused
// rather than printed wrapped.
void require_counts_fit(const AttentionProblem& cfg, std::size_t n) {
  const auto bound = checked_product({cfg.batch, cfg.heads, n, n, std::max<std::size_t>(cfg.head_dim, 4), 64});
  if (!bound || *bound > (std::uint64_t{1} << 63))
    throw UsageError("--seq " + std::to_string(n) + " with --heads " + std::to_string(cfg.heads) + " --batch " +
                         std::to_string(cfg.batch) + " --dim " + std::to_string(cfg.head_dim) +
                         ": the byte and FLOP counts would pass 2^63, beyond what the model counts exactly",
                     "use smaller sizes: the counts grow as B·H·N²·d");
}

std::uint64_t total(const Traffic& t) { return t.total_read_bytes() + t.total_write_bytes(); }

std::string ratio(std::uint64_t a, std::uint64_t b) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << (b ? double(a) / double(b) : 0.0);
  return s.str();
}

void side_by_side(const std::vector<std::size_t>& seqs, AttentionProblem cfg, OutputFormat format, bool backward) {
  const Algorithm a = backward ? Algorithm::naive_bwd : Algorithm::naive_fwd;
  const Algorithm b = backward ? Algorithm::bwd_two_kernel : Algorithm::fa1_fwd;
  const Algorithm c = backward ? Algorithm::bwd_atomic : Algorithm::fa2_fwd;
  const char* na = backward ? "naive_bwd" : "naive";
  const char* nb = backward ? "two_kernel" : "fa1";
  const char* nc = backward ? "atomic" : "fa2";
  // The three designs' models at every N, computed once for whichever format prints them.
  struct Models {
    std::size_t n;
    Traffic a, b, c;
  };
  std::vector<Models> models;
  for (std::size_t n : seqs) {
    cfg.seq = n;
    models.push_back({n, attention_traffic_formula(a, cfg), attention_traffic_formula(b, cfg),
                      attention_traffic_formula(c, cfg)});
  }
  std::ostream& os = std::cout;
  if (format != OutputFormat::text) {
    // One row object per N (--json), the same fields as CSV columns (--csv).
    ReportOutput report(format, os);
    Json& j = report.json();
    j.begin_array();
    for (const auto& m : models) {
      j.begin_object().key("seq").value(std::uint64_t(m.n)).key("heads").value(std::uint64_t(cfg.heads));
      j.key("head_dim").value(std::uint64_t(cfg.head_dim)).key("block_m").value(std::uint64_t(cfg.Br));
      j.key("block_n").value(std::uint64_t(cfg.Bc)).key("causal").value(cfg.causal ? 1 : 0);
      j.key("dtype").value(dtype_name(cfg.dtype));
      j.key(std::string(na) + "_bytes").value(total(m.a)).key(std::string(nb) + "_bytes").value(total(m.b));
      j.key(std::string(nc) + "_bytes").value(total(m.c)).key(std::string(na) + "_flops").value(m.a.flops());
      j.key(std::string(nb) + "_flops").value(m.b.flops()).key(std::string(nc) + "_flops").value(m.c.flops());
      j.end_object();
    }
    j.end_array();
    report.finish();
    return;
  }
  os << "attention HBM traffic (model; bytes read + written), H=" << cfg.heads << " B=" << cfg.batch
     << " d=" << cfg.head_dim << " Br=" << cfg.Br << " Bc=" << cfg.Bc << (cfg.causal ? " causal" : "")
     << " " << dtype_name(cfg.dtype) << "\n";
  std::vector<std::vector<std::string>> rows{
      {"N", na, nb, nc, std::string(na) + "/" + nc, std::string(nb) + "/" + nc}};
  for (const auto& m : models)
    rows.push_back({std::to_string(m.n), std::to_string(total(m.a)), std::to_string(total(m.b)),
                    std::to_string(total(m.c)), ratio(total(m.a), total(m.c)), ratio(total(m.b), total(m.c))});
  // Columns at least as wide as their widest cell plus two spaces, so large counts never run together.
  std::vector<std::size_t> width{10, 18, 18, 18, 12, 12};
  for (const auto& r : rows)
    for (std::size_t col = 0; col < r.size(); ++col) width[col] = std::max(width[col], r[col].size() + 2);
  for (const auto& r : rows) {
    for (std::size_t col = 0; col < r.size(); ++col) os << std::setw(static_cast<int>(width[col])) << r[col];
    os << "\n";
  }
}

void per_tensor(const std::vector<std::size_t>& seqs, AttentionProblem cfg, Algorithm v, OutputFormat format) {
  std::ostream& os = std::cout;
  if (format != OutputFormat::text) {
    // One row object per (N, kernel, tensor).
    ReportOutput report(format, os);
    Json& j = report.json();
    j.begin_array();
    for (std::size_t n : seqs) {
      cfg.seq = n;
      for (const auto& k : attention_traffic_kernels(v, cfg))
        for (const auto& t : k.traffic.tensors()) {
          j.begin_object().key("variant").value(algorithm_name(v)).key("seq").value(std::uint64_t(n));
          j.key("kernel").value(k.name).key("tensor").value(t.name);
          j.key("read_bytes").value(t.read_bytes()).key("write_bytes").value(t.write_bytes()).end_object();
        }
    }
    j.end_array();
    report.finish();
    return;
  }
  for (std::size_t n : seqs) {
    cfg.seq = n;
    const auto kernels = attention_traffic_kernels(v, cfg);
    os << algorithm_name(v) << "  " << cfg.str() << "\n";
    // Counts reach 19 digits below the size bound (require_counts_fit): columns of 21 keep a gap.
    os << std::left << std::setw(20) << "kernel" << std::setw(8) << "tensor" << std::right << std::setw(21) << "read B"
       << std::setw(21) << "write B" << "\n";
    for (const auto& k : kernels)
      for (const auto& t : k.traffic.tensors())
        os << std::left << std::setw(20) << k.name << std::setw(8) << t.name << std::right << std::setw(21)
           << t.read_bytes() << std::setw(21) << t.write_bytes() << "\n";
    const auto all = attention_traffic_formula(v, cfg);
    os << std::left << std::setw(28) << "total" << std::right << std::setw(21) << all.total_read_bytes()
       << std::setw(21) << all.total_write_bytes() << "   FLOPs " << all.flops() << "\n\n";
  }
}

}  // namespace

int cmd_traffic(const Args& args) {
  if (!args.empty() && args.front() == "levels") return cmd_traffic_levels(Args(args.begin() + 1, args.end()));
  if (!args.empty() && args.front() == "mta") return cmd_traffic_mta(args);  // cmd_mta_cuda.cpp
  if (!args.empty() && args.front() == "stream") return cmd_traffic_stream(args);  // cmd_stream_cuda.cpp
  if (!args.empty() && args.front() == "ring") return cmd_traffic_ring(args);  // cmd_traffic_ring.cpp
  if (!args.empty() && args.front() == "stream-shards") return cmd_traffic_shards(args);  // stream/cmd_traffic_shards.cpp
  return guarded("traffic", [&]() -> int {
    const auto desc = options();
    const auto parsed = parse_subject_command(
        args, desc, {"traffic", "model", "attention",
         "flashlab traffic attention --seq 1024,2048 (subjects: attention, levels, mta, stream, stream-shards, ring)", kUsageLine, kSummary});
    if (!parsed) return kOk;  // --help was printed
    const po::variables_map& vm = *parsed;
    if (!vm.count("seq")) throw UsageError("--seq is required", "e.g. --seq 1024,2048,4096");
    const auto seqs = seq_list(vm["seq"].as<std::string>());
    require_range("heads", vm["heads"].as<long long>(), 1, 65536);
    require_range("dim", vm["dim"].as<long long>(), 1, 4096);
    require_range("batch", vm["batch"].as<long long>(), 1, 65536);
    const std::string dt = dtype_flag(vm, {"fp32", "bf16", "fp16"});
    const OutputFormat format = output_format(vm);
    std::string variant = vm.count("variant") ? vm["variant"].as<std::string>() : "all";
    if (variant != "all" && variant != "naive" && variant != "fa1" && variant != "fa2" && variant != "atomic" &&
        variant != "bwd")
      throw UsageError("--variant '" + variant + "' is unknown", "choose naive, fa1, fa2, atomic or bwd");
    AttentionProblem cfg;
    cfg.seq = seqs.front();
    cfg.heads = std::size_t(vm["heads"].as<long long>());
    cfg.head_dim = std::size_t(vm["dim"].as<long long>());
    cfg.batch = std::size_t(vm["batch"].as<long long>());
    cfg.Br = size_flag(vm, "block-m");
    cfg.Bc = size_flag(vm, "block-n");
    cfg.causal = vm["causal"].as<bool>();
    cfg.dtype = parse_dtype(dt);
    validate_flags(cfg);
    for (std::size_t n : seqs) require_counts_fit(cfg, n);
    const std::string device = vm["device"].as<std::string>();
    if (traffic_svg_wanted(vm)) write_traffic_svg(vm, seqs, cfg);
    if (device == "cuda") {
#ifdef FLASHLAB_HAVE_CUDA
      // "bwd" is the two-kernel design; no --variant measures naive and fa2 side by side.
      std::optional<Algorithm> algorithm;
      if (variant == "bwd") algorithm = Algorithm::bwd_two_kernel;
      else if (variant != "all") algorithm = algorithm_flag(variant, variant == "atomic");
      if (format == OutputFormat::json)
        throw UsageError("--json prints the model (--device cpu); --device cuda prints a table or --csv",
                         "drop --json, or use --csv");
      return cuda_traffic_attention(cfg, seqs, algorithm, format == OutputFormat::csv);
#else
      throw built_without_cuda("--device cuda", "use --device cpu for the model");
#endif
    }
    if (device != "cpu") throw UsageError("--device '" + device + "' is unknown", "choose cpu or cuda");

    if (variant == "all") side_by_side(seqs, cfg, format, false);
    else if (variant == "bwd") side_by_side(seqs, cfg, format, true);
    else if (variant == "naive") per_tensor(seqs, cfg, Algorithm::naive_fwd, format);
    else if (variant == "fa1") per_tensor(seqs, cfg, Algorithm::fa1_fwd, format);
    else if (variant == "fa2") per_tensor(seqs, cfg, Algorithm::fa2_fwd, format);
    else per_tensor(seqs, cfg, Algorithm::bwd_atomic, format);
    return kOk;
  });
}

}  // namespace flashlab::app
