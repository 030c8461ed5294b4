// `flashlab stream estimate|apply|trace --device cuda` (the clear GPU kernels, multi-head inputs)
// and `flashlab stream needles` (planted-needle recall, CPU or GPU). Parsing and printing only:
// the algorithms live in reference/src/stream, the kernels and their choice behind the STREAM
// front door (cuda/src/stream/front_door.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/cli.hpp"
#include "core/commands.hpp"
#include "core/gpu_flags.hpp"
#include "core/input_checks.hpp"
#include "core/report.hpp"
#include "stream/stream_flags.hpp"
#include "flashlab/reference/npy.hpp"
#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/stream_needles.hpp"
#include "flashlab/reference/tensor.hpp"
#if FLASHLAB_HAVE_CUDA
#include "flashlab/cuda/dtype16.hpp"
#include "flashlab/cuda/stream.hpp"
#endif

namespace flashlab::app {

namespace {

namespace fs = std::filesystem;
namespace rs = flashlab::ref::stream;

constexpr std::string_view kCudaUsage =
    "stream <estimate|apply|trace> --device cuda --block-m BM --block-n BN --k K [--seq T --dim D --heads H]\n"
    "                       [--inputs DIR] [--mask FILE] [--seed S] [--save DIR] [--chunk N]\n"
    "                       [--format npy|csv] [--compare] [--threads N] [--kernel fast|clear] [--json|--csv]";
constexpr std::string_view kCudaSummary =
    "STREAM on the GPU: the clear fp32 kernels (cuda/src/stream/stream_*.cu), the same procedure and τ as\n"
    "the CPU reference. Inputs q.npy k.npy [v.npy] of shape [T, D] or [T, H, D] from --inputs, else\n"
    "seeded normal values (the CPU command's values for H = 1). Saves indices.npy [H, n_q, k] (or\n"
    "[n_q, k] for one head), o.npy, edges.npy|csv (a 'head' field first when H > 1). --compare runs the\n"
    "CPU reference on every head and reports whether I is identical. `estimate --kernel fast` runs the\n"
    "fast bf16 estimate (tensor cores; b_q = b_k = 64, d = 64 or 128): Q and K are rounded to bf16 first,\n"
    "and --compare feeds the reference the same rounded values. `apply --kernel fast` then applies I with\n"
    "the fast bf16 apply (V rounded to bf16 too; o.npy holds the float values of its bf16 output). The\n"
    "fast trace writes a trace store only: flashlab stream trace --store DIR --device cuda --kernel fast.\n"
    "--json and --csv print the CPU command's fields where they mean the same (command, T, d, block_m,\n"
    "block_n, k, n_q, n_k, n_it, threads, precision, mask, indices_checksum, empty_entries,\n"
    "validity_invariant, indices, edges, saved) and the GPU's own: device, device_name, kernel, H, the\n"
    "inputs rounded to bf16, the verdict and one row per head (checksum, invariant, CPU reference).";

constexpr std::string_view kTrafficUsage =
    "traffic stream --device cuda [--seq T] [--dim D] [--heads H] [--block-m BM] [--block-n BN] [--k K] [--mask FILE]\n"
    "                       [--seed S] [--threads N] [--append-csv FILE] [--json|--csv]";
constexpr std::string_view kTrafficSummary =
    "Memory traffic of the clear STREAM kernels measured with CUPTI (bytes the SMs read from L2, L2\n"
    "sectors, DRAM bytes, one launch after an L2 flush) beside the bytes the CPU reference counts\n"
    "where its loops move tiles (Q, K, C_blk, I for the estimate; Q, K, V, I, O for the apply).\n"
    "--json and --csv print the shape, the two verdicts (indices identical to the reference's, L2\n"
    "reads within 5% of the counted bytes) and one row per kernel; --append-csv FILE appends the\n"
    "kernel rows to a file in the columns of cuda/results/stream_traffic.csv.";
constexpr std::string_view kNeedlesUsage =
    "stream needles --seq T [--dim D] --block-m BM --block-n BN --k K [--needle-blocks N] [--needles M]\n"
    "                       [--noise SD] [--slope S] [--no-lead-in] [--seed S] [--threads N]\n"
    "                       [--device cpu|cuda] [--kernel fast|clear] [--save DIR] [--json|--csv]";
constexpr std::string_view kNeedlesSummary =
    "Planted needles: N query blocks get M key blocks far in their past, each matched by one query\n"
    "token on its own coordinate; the rest is noise. Keys before a needle carry a trace of it that\n"
    "grows towards it (--no-lead-in removes it: the representative rule then sees a needle only\n"
    "where a branch starts on it). Prints the recall of the planted blocks by the estimate.\n"
    "A planting needing more than D coordinates (N·M, twice that with --kernel fast) is spread over\n"
    "several input sets, each its own Q, K and seed, the N blocks spread over the second half as one\n"
    "planting; the recall counts every set. --save writes q.npy, k.npy and needles.csv (q,r) of a\n"
    "planting that fits one set.";

/// True when `args` ask for --device cuda (the dispatch test of cmd_stream).
bool wants(const Args& args, const std::string& flag, const std::string& value) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag + "=" + value) return true;
    if (args[i] == flag && i + 1 < args.size() && args[i + 1] == value) return true;
  }
  return false;
}

struct NeedleOptions {
  long long seq = 0, dim = 0, bq = 0, bk = 0, k = 0, blocks = 8, needles = 8, seed = 1, threads = 1;
  double noise = 0.02, slope = 0.25;
  bool no_lead_in = false;
  std::string device = "cpu", kernel = "clear", save;
};


/// I of the planted inputs on the chosen device.
std::vector<std::int64_t> needle_indices(const NeedleOptions& o, const rs::NeedleSet& set, const rs::Geometry& g) {
  const rs::BlockMask mask(g);
  if (o.device == "cpu")
    return rs::stream_estimate(set.Q, set.K, mask, rs::EstimateParams{std::size_t(o.k), std::size_t(o.threads)}).indices;
#if FLASHLAB_HAVE_CUDA
  const cuda::stream::HostHeads Q{set.Q.data(), 1, std::size_t(set.Q.cols())}, K{set.K.data(), 1, std::size_t(set.K.cols())};
  const auto kernel = o.kernel == "fast" ? cuda::StreamKernel::fast : cuda::StreamKernel::clear;
  return cuda::stream::stream_estimate(kernel, Q, K, mask, std::size_t(o.k)).indices;
#else
  throw built_without_cuda("--device cuda", "use --device cpu");
#endif
}

}  // namespace

bool stream_wants_cuda(const Args& args) { return wants(args, "--device", "cuda"); }

int cmd_stream_needles(const Args& args) {
  return guarded("stream needles", [&]() -> int {
    NeedleOptions o;
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("sub", po::value<std::string>(), "needles")
        ("seq", po::value<long long>(&o.seq), "sequence length T (required)");
    add_dim_option(desc);
    add_tile_options(desc, std::nullopt, std::nullopt, kStreamTiles);
    desc.add_options()
        ("k", po::value<long long>(&o.k), "key blocks kept per query block (required)")
        ("needle-blocks", po::value<long long>(&o.blocks)->default_value(8), "query blocks with needles")
        ("needles", po::value<long long>(&o.needles)->default_value(8), "needles per such query block")
        ("noise", po::value<double>(&o.noise)->default_value(0.02), "standard deviation of the noise")
        ("slope", po::value<double>(&o.slope)->default_value(0.25), "lead-in growth per key block")
        ("no-lead-in", po::bool_switch(&o.no_lead_in), "plant isolated needles (no trace before them)");
    add_seed_option(desc);
    desc.add_options()
        ("threads", po::value<long long>(&o.threads)->default_value(1), "CPU threads over query blocks")
        ("device", po::value<std::string>(&o.device)->default_value("cpu"), "cpu | cuda")
        ("kernel", po::value<std::string>(&o.kernel)->default_value("clear"),
         "fast | clear (--device cuda): the fast bf16 tensor-core estimate (b_q = b_k = 64, d = 64 or 128), or the "
         "clear fp32 one (the default)")
        ("save", po::value<std::string>(&o.save), "directory for q.npy, k.npy, needles.csv");
    add_output_options(desc);
    po::positional_options_description pos;
    pos.add("sub", 1);
    const auto vm = parse(args, desc, &pos);
    if (vm.count("help")) {
      print_help(std::cout, kNeedlesUsage, kNeedlesSummary, desc);
      return kOk;
    }
    for (const char* flag : {"seq", "block-m", "block-n", "k"})
      if (!vm.count(flag)) throw UsageError(std::string("--") + flag + " is required", "flashlab stream needles --help");
    o.dim = vm["dim"].as<long long>();
    o.bq = vm["block-m"].as<long long>();
    o.bk = vm["block-n"].as<long long>();
    o.seed = vm["seed"].as<long long>();
    require_range("seq", o.seq, 1, 1LL << 24);
    require_range("dim", o.dim, 1, 4096);
    require_range("block-m", o.bq, 1, 1LL << 24);
    require_range("block-n", o.bk, 1, 1LL << 24);
    require_range("k", o.k, 1, 1LL << 20);
    require_range("needle-blocks", o.blocks, 1, 1LL << 20);
    require_range("needles", o.needles, 1, 4096);
    require_range("threads", o.threads, 1, 256);
    checked_seed(o.seed);
    if (o.device != "cpu" && o.device != "cuda")
      throw UsageError("--device '" + o.device + "' is unknown", "choose cpu or cuda");
    kernel_family(o.kernel, KernelFamily::clear);  // checks the value (default clear)
    if (o.kernel == "fast" && o.device != "cuda") throw UsageError("--kernel fast runs on the GPU", "add --device cuda");
    rs::NeedleParams p;
    p.geometry = rs::Geometry{std::size_t(o.seq), std::size_t(o.bq), std::size_t(o.bk)};
    p.d = std::size_t(o.dim);
    p.needle_blocks = std::size_t(o.blocks);
    p.needles_per_block = std::size_t(o.needles);
    p.noise = o.noise;
    p.slope = o.slope;
    p.lead_in = !o.no_lead_in;
    // bf16 inputs would round the lead-in in steps of many blocks: keep it exact as bf16 pairs.
    p.bf16_pairs = o.kernel == "fast";
    p.seed = std::uint64_t(o.seed);
    // One input set holds d / (needles per block · coordinates per needle) needle blocks.
    p.sets = rs::needle_sets_needed(p.d, p.needle_blocks, p.needles_per_block, p.bf16_pairs);
    if (p.sets == 0)
      throw UsageError("--needles " + std::to_string(o.needles) + (p.bf16_pairs ? " (two coordinates each)" : "") +
                           " exceeds d = " + std::to_string(o.dim),
                       "each needle owns its coordinate(s) of the head dim: --needles ≤ --dim (half of it with "
                       "--kernel fast)");
    if (p.sets > 1 && !o.save.empty())
      throw UsageError("--save writes one input set, and this planting needs " + std::to_string(p.sets),
                       "fewer --needle-blocks (N·M ≤ --dim) with --save");
    rs::NeedleSet set;  // the first set's (what --save writes)
    rs::NeedleRecall rec;
    for (std::size_t s_i = 0; s_i < p.sets; ++s_i) {
      rs::NeedleParams ps = p;
      ps.set = s_i;
      ps.seed = p.seed + 1000003ULL * s_i;  // set 0: the inputs of a one-set planting
      rs::NeedleSet one;
      std::vector<std::int64_t> I;
      try {
        one = rs::make_needles(ps);
        I = needle_indices(o, one, p.geometry);
      } catch (const rs::StreamError& e) {
        throw UsageError(e.what(), "--needles ≤ --dim (half of it with --kernel fast), --needles ≤ --block-m, "
                                   "--needle-blocks ≤ half the query blocks, and a long enough --seq");
      }
      const rs::NeedleRecall r = rs::needle_recall(one.needles, I, std::size_t(o.k));
      rec.found += r.found;
      rec.planted += r.planted;
      if (s_i == 0) set = std::move(one);
    }
    const OutputFormat format = output_format(vm);
    if (format != OutputFormat::text) {
      ReportOutput report(format, std::cout);
      Json& j = report.json();
      j.begin_object().key("command").value("stream needles").key("T").value(std::int64_t(o.seq));
      j.key("d").value(std::int64_t(o.dim)).key("block_m").value(std::int64_t(o.bq)).key("block_n").value(std::int64_t(o.bk));
      j.key("k").value(std::int64_t(o.k)).key("needle_blocks").value(std::int64_t(o.blocks));
      j.key("needles_per_block").value(std::int64_t(o.needles)).key("lead_in").value(p.lead_in);
      j.key("device").value(o.device).key("kernel").value(o.device == "cuda" ? o.kernel : std::string("reference"));
      j.key("input_sets").value(std::uint64_t(p.sets)).key("bf16_pairs").value(p.bf16_pairs);
      j.key("seed").value(std::int64_t(o.seed)).key("found").value(std::uint64_t(rec.found));
      j.key("planted").value(std::uint64_t(rec.planted)).key("recall").value(rec.recall());
      j.end_object();
      report.finish();
    } else {
      std::cout << "needles: T=" << o.seq << " d=" << o.dim << " b_q=" << o.bq << " b_k=" << o.bk << " k=" << o.k
                << " needle blocks=" << o.blocks << " needles per block=" << o.needles
                << " lead-in=" << (p.lead_in ? "yes" : "no") << " device=" << o.device
                << (o.device == "cuda" ? " kernel=" + o.kernel : std::string()) << " input sets=" << p.sets
                << (p.bf16_pairs ? " (planted values as bf16 pairs)" : "") << "\n"
                << "recall " << rec.found << "/" << rec.planted << " = " << std::setprecision(4) << rec.recall() << "\n";
    }
    if (!o.save.empty()) {
      const fs::path dir(o.save);
      prepare_save_dir(o.save);
      const std::vector<std::size_t> shape{std::size_t(o.seq), std::size_t(o.dim)};
      ref::write_npy(dir / "q.npy", shape, set.Q.data());
      ref::write_npy(dir / "k.npy", shape, set.K.data());
      std::ofstream csv(dir / "needles.csv");
      csv << "q,r\n";
      for (const auto& n : set.needles) csv << n.q << ',' << n.r << '\n';
      if (!csv) throw std::runtime_error((dir / "needles.csv").string() + ": write failed");
      if (format == OutputFormat::text) std::cout << "saved " << (dir / "q.npy").string() << ", k.npy, needles.csv\n";
    }
    return kOk;
  });
}

namespace {

/// The shared flags (stream_flags.hpp) and those of the GPU command alone.
struct CudaOptions : StreamFlags {
  long long heads = 1, chunk = 4096;
  bool compare = false;
  std::string kernel = "clear";  ///< estimate kernel: clear (fp32) or fast (bf16)
  OutputFormat output = OutputFormat::text;  ///< --json / --csv
};

/// One head's index tensor as the GPU produced it.
struct HeadCheck {
  std::uint64_t checksum = 0;
  std::string violation;             ///< empty when the validity invariant holds
  std::optional<bool> identical;     ///< --compare: I equals the CPU reference's
};

/// What a GPU run found, for --json / --csv.
struct CudaRunReport {
  std::string device_name;
  std::size_t T = 0, H = 1, D = 0;
  rs::Geometry geometry;
  std::size_t k = 0;
  const std::vector<std::int64_t>* indices = nullptr;  ///< [H, n_q, k]
  std::vector<HeadCheck> heads;
  std::optional<std::size_t> edges;  ///< trace: the edge records streamed
  std::vector<std::string> saved;    ///< files --save wrote
  bool passed = false;
};

std::string hex16(std::uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(16) << std::setfill('0') << v;
  return os.str();
}

// The CPU command's keys where the quantity is the same (cmd_stream.cpp), so a script reads the
// same fields on either device (for H = 1 the checksum and I are those of the same inputs), then
// the GPU's own: device, kernel, H, what was rounded to bf16, the verdict and a row per head.
[[maybe_unused]] void print_cuda_report(std::ostream& os, const CudaOptions& o, const CudaRunReport& r) {
  ReportOutput report(o.output, os);
  Json& j = report.json();
  const rs::Geometry& g = r.geometry;
  const std::vector<std::int64_t>& I = *r.indices;
  std::size_t empty = 0;
  for (auto v : I) empty += v < 0 ? 1 : 0;
  bool valid = true;
  for (const auto& h : r.heads) valid = valid && h.violation.empty();
  j.begin_object();
  j.key("command").value("stream " + o.sub);
  j.key("T").value(std::uint64_t(r.T)).key("d").value(std::uint64_t(r.D)).key("block_m").value(std::uint64_t(g.bq));
  j.key("block_n").value(std::uint64_t(g.bk)).key("k").value(std::uint64_t(r.k));
  j.key("n_q").value(std::uint64_t(g.n_q())).key("n_k").value(std::uint64_t(g.n_k())).key("n_it").value(std::uint64_t(g.n_it()));
  j.key("threads").value(std::int64_t(o.threads)).key("precision").value("float");  // fp32 arithmetic on either kernel
  j.key("mask").value(o.mask.empty() ? std::string("causal") : o.mask);
  j.key("indices_checksum").value(hex16(rs::indices_checksum(I)));
  j.key("empty_entries").value(std::uint64_t(empty));
  j.key("validity_invariant").value(valid);
  if (r.H == 1 && g.n_q() * r.k <= 4096) {
    j.key("indices").begin_array();
    for (std::size_t q = 0; q < g.n_q(); ++q) {
      j.begin_array();
      for (std::size_t c = 0; c < r.k; ++c) j.value(I[q * r.k + c]);
      j.end_array();
    }
    j.end_array();
  }
  if (r.edges) j.key("edges").value(std::uint64_t(*r.edges));
  j.key("saved").begin_array();
  for (const auto& f : r.saved) j.value(f);
  j.end_array();
  j.key("device").value("cuda").key("device_name").value(r.device_name);
  j.key("kernel").value(o.kernel).key("H").value(std::uint64_t(r.H));
  j.key("rounded_to_bf16").begin_array();
  if (o.kernel == "fast") {
    j.value("Q").value("K");
    if (o.sub == "apply") j.value("V");
  }
  j.end_array();
  j.key("compare").value(o.compare);
  j.key("passed").value(r.passed);
  j.key("per_head").begin_array();
  for (std::size_t h = 0; h < r.heads.size(); ++h) {
    const HeadCheck& c = r.heads[h];
    j.begin_object().key("head").value(std::uint64_t(h)).key("indices_checksum").value(hex16(c.checksum));
    j.key("validity_invariant").value(c.violation.empty());
    j.key("reference_identical");
    if (c.identical) j.value(*c.identical);
    else j.null();
    j.end_object();
  }
  j.end_array();
  j.end_object();
  report.finish();
}

/// The flags of `traffic stream` (seeded inputs only).
struct TrafficOptions {
  long long seq = 0, dim = 0, heads = 1, bq = 0, bk = 0, k = 0, seed = 0, threads = 8;
  std::string mask;
  OutputFormat format = OutputFormat::text;  ///< --json / --csv
};

/// A [T, H, D] float array and its shape.
struct Heads {
  std::vector<float> data;
  std::size_t T = 0, H = 1, D = 0;
#if FLASHLAB_HAVE_CUDA
  [[nodiscard]] cuda::stream::HostHeads view() const { return {data.data(), H, D}; }
#endif
  /// Head h as a T × D matrix (for the CPU reference).
  [[nodiscard]] ref::Mat<float> head(std::size_t h) const {
    ref::Mat<float> m(static_cast<Eigen::Index>(T), static_cast<Eigen::Index>(D));
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t c = 0; c < D; ++c) m(Eigen::Index(t), Eigen::Index(c)) = data[(t * H + h) * D + c];
    return m;
  }
};

constexpr const char* kHeadsHint =
    "--inputs DIR must hold q.npy, k.npy (and v.npy for apply/trace), float [T, D] or [T, H, D]";

/// One input's header under the shared dtype rule (input_checks.hpp), as [T, H, D].
Heads heads_header(const fs::path& path) {
  if (!fs::exists(path)) throw UsageError(path.string() + ": no such file", kHeadsHint);
  const ref::NpyHeader a = float_input_header(path, kHeadsHint);
  if (a.shape.size() != 2 && a.shape.size() != 3)
    throw UsageError(path.string() + ": has shape " + ref::shape_str(a.shape) + ", expected [T, D] or [T, H, D]",
                     "one row per token, heads in the middle");
  for (const std::size_t n : a.shape)
    if (n == 0)
      throw UsageError(path.string() + ": shape " + ref::shape_str(a.shape) + " has a zero dimension",
                       "T, H and D must be at least 1");
  Heads x;
  x.T = a.shape[0];
  x.H = a.shape.size() == 3 ? a.shape[1] : 1;
  x.D = a.shape.back();
  return x;
}

/// Reads the payload of a checked header under the memory limit and the non-finite policy.
void read_heads(Heads& x, const fs::path& path, const InputPolicy& policy) {
  const auto v = read_float_input(path, policy, kHeadsHint);
  x.data.assign(v.begin(), v.end());
}

// What a GPU run holds on the host at its peak, from the sizes alone: Q, K, V read as float64
// and kept as float32, O, the index tensor with its scores and margins, and the edge records.
void require_stream_cuda_memory(const CudaOptions& o, const Heads& q, std::size_t v_cols, bool from_files) {
  const std::uint64_t thd = checked_size({q.T, q.H, q.D}, "T x H x D");
  const std::uint64_t thv = checked_size({q.T, q.H, v_cols}, "T x H x D_v");
  const std::uint64_t n_q = (q.T + std::size_t(o.bq) - 1) / std::size_t(o.bq);
  MemoryPlan plan;
  if (from_files) plan.add("Q, K, V read as float64", thd * 2 + thv, 8);
  plan.add("Q, K, V and O as float32", thd * 2 + thv * 2, 4);
  plan.add("index tensor I [H, n_q, k] with scores and margins", checked_size({q.H, n_q, std::uint64_t(o.k)}, "H x n_q x k"),
           16, o.sub == "trace" ? 4 : 1);
  plan.require_within(o.policy, "stream " + o.sub + " --device cuda at T = " + std::to_string(q.T) +
                                    ", H = " + std::to_string(q.H) + ", D = " + std::to_string(q.D));
}

Heads random_heads(std::size_t T, std::size_t H, std::size_t D, unsigned long long seed) {
  ref::Tensor<float> t(ref::Shape{1, T, H, D});
  ref::fill_normal(t, seed);
  return Heads{std::vector<float>(t.data(), t.data() + t.numel()), T, H, D};
}

/// Q, K (and V) from --inputs (every header and the memory plan checked before any payload is
/// read) or seeded; all before any CUDA call.
void load_cuda_inputs(const CudaOptions& o, Heads& Q, Heads& K, Heads& V) {
  const bool need_v = o.sub != "estimate";
  if (o.inputs.empty()) {
    Q = Heads{{}, std::size_t(*o.seq), std::size_t(o.heads), std::size_t(*o.dim)};
    require_stream_cuda_memory(o, Q, Q.D, false);
    Q = random_heads(Q.T, Q.H, Q.D, std::uint64_t(o.seed));
    K = random_heads(Q.T, Q.H, Q.D, std::uint64_t(o.seed) + 1);
    if (need_v) V = random_heads(Q.T, Q.H, Q.D, std::uint64_t(o.seed) + 2);
    return;
  }
  const fs::path dir(o.inputs);
  if (!fs::is_directory(dir)) throw UsageError("--inputs " + o.inputs + ": not a directory", "pass the directory holding q.npy and k.npy");
  Q = heads_header(dir / "q.npy");
  K = heads_header(dir / "k.npy");
  if (need_v) V = heads_header(dir / "v.npy");
  if (K.T != Q.T || K.H != Q.H || K.D != Q.D)
    throw UsageError("k.npy must have the shape of q.npy", "Q and K are [T, H, D] with the same T, H, D");
  if (need_v && (V.T != Q.T || V.H != Q.H))
    throw UsageError("v.npy must have the T and H of q.npy", "V is [T, H, D_v]");
  if (o.seq && std::size_t(*o.seq) != Q.T)
    throw UsageError("--seq " + std::to_string(*o.seq) + " disagrees with q.npy (T = " + std::to_string(Q.T) + ")",
                     "drop --seq to take T from q.npy");
  if (o.dim && std::size_t(*o.dim) != Q.D)
    throw UsageError("--dim " + std::to_string(*o.dim) + " disagrees with q.npy (D = " + std::to_string(Q.D) + ")",
                     "drop --dim to take D from q.npy");
  require_stream_cuda_memory(o, Q, need_v ? V.D : Q.D, true);
  read_heads(Q, dir / "q.npy", o.policy);
  read_heads(K, dir / "k.npy", o.policy);
  if (need_v) read_heads(V, dir / "v.npy", o.policy);
}

}  // namespace

#if FLASHLAB_HAVE_CUDA
namespace {

void write_edges(const fs::path& path, const std::vector<cuda::stream::HeadEdge>& edges, std::size_t heads,
                 const std::string& format) {
  if (format == "csv") {
    std::ofstream out(path);
    out << (heads > 1 ? "head," : "") << "q,r,slot,score,mass,value_norm\n" << std::setprecision(17);
    for (const auto& he : edges) {
      const rs::Edge& e = he.edge;
      if (heads > 1) out << he.head << ',';
      out << e.q << ',' << e.r << ',' << e.slot << ',' << e.score << ',' << e.mass << ',' << e.value_norm << '\n';
    }
    if (!out) throw std::runtime_error(path.string() + ": write failed");
    return;
  }
  const std::string fields = "('q', '<i8'), ('r', '<i8'), ('slot', '<i8'), ('score', '<f8'), ('mass', '<f8'), ('value_norm', '<f8')";
  if (heads == 1) {
    std::vector<rs::Edge> plain;
    for (const auto& he : edges) plain.push_back(he.edge);
    ref::write_npy_raw(path, {plain.size()}, "[" + fields + "]", plain.data(), plain.size() * sizeof(rs::Edge));
    return;
  }
  struct Row { std::int64_t head; rs::Edge e; };
  static_assert(sizeof(Row) == 56, "record layout must match the structured dtype");
  std::vector<Row> rows;
  for (const auto& he : edges) rows.push_back(Row{std::int64_t(he.head), he.edge});
  ref::write_npy_raw(path, {rows.size()}, "[('head', '<i8'), " + fields + "]", rows.data(), rows.size() * sizeof(Row));
}

cuda::StreamKernel kernel_of(const CudaOptions& o) {
  return o.kernel == "fast" ? cuda::StreamKernel::fast : cuda::StreamKernel::clear;
}

/// --compare gives the reference the values the fast kernels read: Q and K rounded to bf16.
void round_for_compare(const CudaOptions& o, Heads& x) {
  if (o.kernel != "fast") return;
  for (float& v : x.data) v = cuda::round_to(v, ref::Dtype::bf16);
}

int run_cuda(const CudaOptions& o, Heads& Q, Heads& K, const Heads& V) {
  const rs::Geometry g{Q.T, std::size_t(o.bq), std::size_t(o.bk)};
  const std::size_t k = std::size_t(o.k);
  const rs::BlockMask mask = o.mask.empty() ? rs::BlockMask(g) : rs::load_block_mask(o.mask, g, o.policy.memory_limit);
  const cuda::stream::EstimateOutput est = cuda::stream::stream_estimate(kernel_of(o), Q.view(), K.view(), mask, k);
  round_for_compare(o, Q);
  round_for_compare(o, K);
  std::vector<float> O;
  std::vector<cuda::stream::HeadEdge> edges;
  if (o.sub == "apply") O = cuda::stream::stream_apply(kernel_of(o), Q.view(), K.view(), V.view(), mask, est.indices, k);
  if (o.sub == "trace")
    O = cuda::stream::stream_trace(Q.view(), K.view(), V.view(), mask, est.indices, k, std::size_t(o.chunk),
                                   [&](const std::vector<cuda::stream::HeadEdge>& batch) {
                                     edges.insert(edges.end(), batch.begin(), batch.end());
                                   });
  const std::size_t per_head = g.n_q() * k;
  const bool text = o.output == OutputFormat::text;
  CudaRunReport r;
  if (text)
    std::cout << "stream " << o.sub << " --device cuda: T=" << g.T << " H=" << Q.H << " d=" << Q.D << " b_q=" << g.bq
              << " b_k=" << g.bk << " k=" << k << " n_q=" << g.n_q() << " n_k=" << g.n_k() << " n_it=" << g.n_it()
              << " kernel=" << o.kernel
              << (o.kernel != "fast" ? "" : o.sub == "apply" ? " (Q, K, V rounded to bf16)" : " (Q, K rounded to bf16)")
              << "\n";
  bool all_same = true;
  for (std::size_t h = 0; h < Q.H; ++h) {
    const std::vector<std::int64_t> I(est.indices.begin() + std::ptrdiff_t(h * per_head),
                                      est.indices.begin() + std::ptrdiff_t((h + 1) * per_head));
    HeadCheck c;
    c.checksum = rs::indices_checksum(I);
    c.violation = rs::validate_indices(I, k, mask);
    if (o.compare) {
      const auto ref = rs::stream_estimate(Q.head(h), K.head(h), mask, rs::EstimateParams{k, std::size_t(o.threads)});
      c.identical = ref.indices == I;
      all_same = all_same && *c.identical;
    }
    all_same = all_same && c.violation.empty();
    if (text) {
      std::cout << "head " << h << ": indices checksum " << hex16(c.checksum) << ", validity invariant "
                << (c.violation.empty() ? "holds" : "BROKEN: " + c.violation);
      if (c.identical) std::cout << ", CPU reference " << (*c.identical ? "identical" : "DIFFERS");
      std::cout << "\n";
    }
    r.heads.push_back(std::move(c));
  }
  if (o.sub == "trace" && text) std::cout << "edges: " << edges.size() << " records\n";
  if (!o.save.empty()) {
    const fs::path dir(o.save);
    prepare_save_dir(o.save);
    std::vector<std::size_t> ishape{g.n_q(), k};
    if (Q.H > 1) ishape.insert(ishape.begin(), Q.H);
    fs::path file;
    if (o.sub == "estimate") ref::write_npy(file = dir / "indices.npy", ishape, est.indices.data());
    std::vector<std::size_t> oshape{g.T, V.D};
    if (V.H > 1) oshape.insert(oshape.begin() + 1, V.H);
    if (o.sub == "apply") ref::write_npy(file = dir / "o.npy", oshape, O.data());
    if (o.sub == "trace") write_edges(file = dir / (o.format == "csv" ? "edges.csv" : "edges.npy"), edges, Q.H, o.format);
    r.saved.push_back(file.string());
    if (text) std::cout << "saved to " << dir.string() << "\n";
  }
  if (!text) {
    r.device_name = cuda::device_description();
    r.T = g.T;
    r.H = Q.H;
    r.D = Q.D;
    r.geometry = g;
    r.k = k;
    r.indices = &est.indices;
    if (o.sub == "trace") r.edges = edges.size();
    r.passed = all_same;
    print_cuda_report(std::cout, o, r);
  }
  return all_same ? kOk : kFailed;
}

/// Counted bytes of the reference (sum over heads) beside the measured ones, one row per kernel.
int traffic_stream(const TrafficOptions& o, const std::string& csv) {
  const Heads Q = random_heads(std::size_t(o.seq), std::size_t(o.heads), std::size_t(o.dim), std::uint64_t(o.seed));
  const Heads K = random_heads(Q.T, Q.H, Q.D, std::uint64_t(o.seed) + 1);
  const Heads V = random_heads(Q.T, Q.H, Q.D, std::uint64_t(o.seed) + 2);
  const rs::Geometry g{Q.T, std::size_t(o.bq), std::size_t(o.bk)};
  const std::size_t k = std::size_t(o.k);
  const rs::BlockMask mask = o.mask.empty() ? rs::BlockMask(g) : rs::load_block_mask(o.mask, g);
  std::vector<std::int64_t> I;
  const auto measured = cuda::stream::measure_stream_traffic(Q.view(), K.view(), V.view(), mask, k, &I);
  double counted_read[2] = {0, 0}, counted_write[2] = {0, 0};
  bool same_indices = true;
  for (std::size_t h = 0; h < Q.H; ++h) {
    const ref::Mat<float> Qh = Q.head(h), Kh = K.head(h), Vh = V.head(h);
    const auto est = rs::stream_estimate(Qh, Kh, mask, rs::EstimateParams{k, std::size_t(o.threads)});
    same_indices = same_indices && std::equal(est.indices.begin(), est.indices.end(),
                                              I.begin() + std::ptrdiff_t(h * g.n_q() * k));
    const auto app = rs::stream_apply(Qh, Kh, Vh, mask, est.indices, k, std::size_t(o.threads), false);
    counted_read[0] += double(est.traffic.total_read_bytes());
    counted_write[0] += double(est.traffic.total_write_bytes());
    counted_read[1] += double(app.traffic.total_read_bytes());
    counted_write[1] += double(app.traffic.total_write_bytes());
  }
  const bool new_file = !csv.empty() && !fs::exists(csv);
  std::ofstream out;
  if (!csv.empty()) {
    out.open(csv, std::ios::app);
    if (!out) throw std::runtime_error(csv + ": cannot write");
    if (new_file)
      out << "T,d,H,bq,bk,k,kernel,counted_read_bytes,l2_read_bytes,lts_read_bytes,dram_read_bytes,"
             "counted_write_bytes,l2_write_bytes,dram_write_bytes,duration_ms,l2_read_over_counted\n";
  }
  bool within = true;
  std::vector<double> ratios;
  for (std::size_t i = 0; i < measured.size(); ++i) {
    ratios.push_back(measured[i].counters.l2_read_bytes / counted_read[i]);
    within = within && std::abs(ratios.back() - 1) <= 0.05;
  }
  if (out)
    for (std::size_t i = 0; i < measured.size(); ++i) {
      const cuda::KernelCounters& c = measured[i].counters;
      out << g.T << ',' << Q.D << ',' << Q.H << ',' << g.bq << ',' << g.bk << ',' << k << ',' << measured[i].kernel
          << ',' << counted_read[i] << ',' << c.l2_read_bytes << ',' << c.lts_read_bytes << ',' << c.dram_read_bytes
          << ',' << counted_write[i] << ',' << c.l2_write_bytes << ',' << c.dram_write_bytes << ','
          << c.duration_ns / 1e6 << ',' << ratios[i] << '\n';
    }
  if (o.format != OutputFormat::text) {
    ReportOutput report(o.format, std::cout);
    Json& j = report.json();
    j.begin_object();
    j.key("T").value(std::uint64_t(g.T)).key("d").value(std::uint64_t(Q.D)).key("H").value(std::uint64_t(Q.H));
    j.key("bq").value(std::uint64_t(g.bq)).key("bk").value(std::uint64_t(g.bk)).key("k").value(std::uint64_t(k));
    j.key("indices_identical").value(same_indices).key("l2_reads_within_5pct").value(within);
    j.key("kernels").begin_array();
    for (std::size_t i = 0; i < measured.size(); ++i) {
      const cuda::KernelCounters& c = measured[i].counters;
      j.begin_object().key("kernel").value(measured[i].kernel);
      j.key("counted_read_bytes").value(counted_read[i]).key("l2_read_bytes").value(c.l2_read_bytes);
      j.key("lts_read_bytes").value(c.lts_read_bytes).key("dram_read_bytes").value(c.dram_read_bytes);
      j.key("counted_write_bytes").value(counted_write[i]).key("l2_write_bytes").value(c.l2_write_bytes);
      j.key("dram_write_bytes").value(c.dram_write_bytes).key("duration_ms").value(c.duration_ns / 1e6);
      j.key("l2_read_over_counted").value(round_to(ratios[i], 4));
      j.end_object();
    }
    j.end_array();
    j.end_object();
    report.finish();
    return same_indices ? kOk : kFailed;
  }
  std::cout << "traffic stream --device cuda: T=" << g.T << " H=" << Q.H << " d=" << Q.D << " b_q=" << g.bq
            << " b_k=" << g.bk << " k=" << k << " (fp32, L2 flushed before each measured launch)\n"
            << "indices of the measured run vs CPU reference: " << (same_indices ? "identical" : "DIFFER") << "\n";
  for (std::size_t i = 0; i < measured.size(); ++i) {
    const cuda::KernelCounters& c = measured[i].counters;
    std::cout << measured[i].kernel << ": counted reads " << counted_read[i] << " B, measured L2→SM " << c.l2_read_bytes
              << " B (ratio " << std::setprecision(4) << ratios[i] << std::setprecision(6) << "), L2-slice sectors "
              << c.lts_read_bytes << " B, DRAM " << c.dram_read_bytes << " B; counted writes " << counted_write[i]
              << " B, measured SM→L2 " << c.l2_write_bytes << " B; " << c.duration_ns / 1e6 << " ms (one launch)\n";
  }
  std::cout << "measured L2 reads within 5% of the counted bytes: " << (within ? "yes" : "NO") << "\n";
  return same_indices ? kOk : kFailed;
}

}  // namespace
#endif

// Parsing, every check and the inputs come before any CUDA call, with the CPU command's flags and
// rules (stream_flags.hpp): the same bad input gets the same error on both devices, in any build.
int cmd_stream_cuda(const Args& args) {
  return guarded("stream", [&]() -> int {
    CudaOptions o;
    po::options_description desc("Options");
    desc.add_options()("help,h", "show this help");
    add_stream_options(desc, 4);
    desc.add_options()
        ("heads", po::value<long long>(&o.heads)->default_value(1), "heads H (without --inputs)")
        ("chunk", po::value<long long>(&o.chunk)->default_value(4096), "trace: query blocks per streamed chunk")
        ("compare", po::bool_switch(&o.compare), "also run the CPU reference and compare I per head")
        ("kernel", po::value<std::string>(&o.kernel)->default_value("clear"),
         "fast | clear: the fast bf16 tensor-core estimate and apply (b_q = b_k = 64, d = 64 or 128), or the clear "
         "fp32 kernels (the default)");
    add_output_options(desc);
    po::positional_options_description pos;
    pos.add("sub", 1);
    const auto vm = parse(args, desc, &pos);
    if (vm.count("help")) {
      print_help(std::cout, kCudaUsage, kCudaSummary, desc);
      return kOk;
    }
    static_cast<StreamFlags&>(o) = stream_flags(vm);
    o.output = output_format(vm);
    require_range("heads", o.heads, 1, 1024);
    require_range("chunk", o.chunk, 1, 1LL << 24);
    kernel_family(o.kernel, KernelFamily::clear);  // checks the value (default clear)
    if (o.kernel == "fast" && o.sub == "trace")
      throw UsageError("--kernel fast: 'stream trace' writes its edge list with the clear kernels; the fast trace "
                       "writes a trace store",
                       "add --store DIR for the fast trace into a store, or drop --kernel fast");
    Heads Q, K, V;
    load_cuda_inputs(o, Q, K, V);
#if FLASHLAB_HAVE_CUDA
    try {
      return run_cuda(o, Q, K, V);
    } catch (const rs::StreamError& e) {
      throw UsageError(e.what(), "check --mask, --block-m, --block-n and --k against T (docs/stream.md)");
    }
#else
    throw built_without_cuda("--device cuda", "drop --device cuda to run the CPU reference");
#endif
  });
}

int cmd_traffic_stream(const Args& args) {
  return guarded("traffic stream", [&]() -> int {
    TrafficOptions o;
    std::string device, csv;
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("device", po::value<std::string>(&device), "cuda (required: the clear kernels are measured on the GPU)")
        ("seq", po::value<long long>(&o.seq)->default_value(131072), "sequence length T");
    add_dim_option(desc);
    desc.add_options()("heads", po::value<long long>(&o.heads)->default_value(1), "heads H");
    add_tile_options(desc, 64, 64, kStreamTiles);
    desc.add_options()
        ("k", po::value<long long>(&o.k)->default_value(8), "key blocks kept per query block")
        ("mask", po::value<std::string>(&o.mask), "user block mask file");
    add_seed_option(desc);
    desc.add_options()
        ("threads", po::value<long long>(&o.threads)->default_value(8), "CPU threads of the reference count")
        ("append-csv", po::value<std::string>(&csv), "append the rows to this CSV file (header when new)");
    add_output_options(desc);
    po::options_description hidden;  // the subject word itself, not shown in --help
    hidden.add_options()("sub", po::value<std::string>(), "stream");
    po::options_description all;
    all.add(desc).add(hidden);
    po::positional_options_description pos;
    pos.add("sub", 1);
    const auto vm = parse(args, all, &pos);
    if (vm.count("help")) {
      print_help(std::cout, kTrafficUsage, kTrafficSummary, desc);
      return kOk;
    }
    o.format = output_format(vm);
    if (device != "cuda") throw UsageError("traffic stream measures the GPU kernels only", "add --device cuda");
    o.dim = vm["dim"].as<long long>();
    o.bq = vm["block-m"].as<long long>();
    o.bk = vm["block-n"].as<long long>();
    o.seed = vm["seed"].as<long long>();
#if FLASHLAB_HAVE_CUDA
    require_range("seq", o.seq, 1, 1LL << 24);
    require_range("dim", o.dim, 1, (long long)cuda::stream::kMaxHeadDim);
    require_range("heads", o.heads, 1, 1024);
    require_range("block-m", o.bq, 1, (long long)cuda::stream::kMaxBlock);
    require_range("block-n", o.bk, 1, (long long)cuda::stream::kMaxBlock);
    require_range("k", o.k, 1, 1LL << 20);
    require_range("threads", o.threads, 1, 256);
    checked_seed(o.seed);
    // Q, K, V as [T, H, d] and one head's float copies of each for the reference count.
    MemoryPlan plan;
    plan.add("Q, K, V", checked_size({std::uint64_t(o.seq), std::uint64_t(o.heads), std::uint64_t(o.dim)}, "T x H x d"), 4, 4);
    plan.require_within(input_policy(vm), "traffic stream at T = " + std::to_string(o.seq));
    require_gpu("traffic stream");
    try {
      return traffic_stream(o, csv);
    } catch (const rs::StreamError& e) {
      throw UsageError(e.what(), "check --block-m, --block-n and --k against --seq (docs/stream.md)");
    }
#else
    throw built_without_cuda("traffic stream --device cuda", "run flashlab stream estimate|apply for the CPU counts");
#endif
  });
}

}  // namespace flashlab::app
