// `flashlab bench stream`: times the STREAM kernels on the GPU — the estimate and/or the apply,
// clear fp32 (cuda/src/stream/stream_estimate.cu, stream_apply.cu) or fast 16-bit — over a sweep of
// (d, k, T) and prints ms per shape and pass with the device memory each pass needs beyond Q, K,
// V, O. Flags are parsed and checked in every build; the timing itself is
// flashlab::cuda::bench_stream (cuda/src/stream/stream_bench.cpp), compiled only with CUDA.
#include "core/commands.hpp"
#include "core/gpu_flags.hpp"
#include "core/report.hpp"
#include "stream/stream_flags.hpp"
#include "flashlab/reference/stream_shards.hpp"

#ifdef FLASHLAB_HAVE_CUDA
#include "flashlab/cuda/options.hpp"
#include "flashlab/cuda/stream_bench.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"
#endif
#ifdef FLASHLAB_HAVE_RING
#include "flashlab/cuda/context_parallel.hpp"
#include "flashlab/cuda/stream_sharded.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <tuple>
#include <cstdio>
#include <optional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashlab::app {

namespace {

constexpr const char* kUsageLine =
    "bench stream [--pass estimate|apply|both|trace|trace-mass] [--kernel fast|clear] [--seq T[,T2,...]] [--dim D[,D2]]\n"
    "                       [--k K[,K2,...]] [--heads H] [--block-m BM] [--block-n BN] [--dtype bf16|fp16] [--group G]\n"
    "                       [--reps R] [--warmup W] [--check-indices [--traffic]] [--json|--csv]\n"
    "                       [--gpus G[,G2,...] [--scaling strong|weak] [--layout contiguous|zigzag[,...]]\n"
    "                       [--exchange whole|pieces[,...]] [--folds F[,F2,...]] [--schedule serial|overlap[,...]]\n"
    "                       [--comm-priority normal|high[,...]] [--transport nccl|copy[,...]] [--timeline]]";
constexpr const char* kSummary =
    "Times the STREAM kernels on the GPU: mask estimation (top-k key blocks per query block) and/or\n"
    "mask application (block-sparse attention over them), the fast 16-bit tensor-core kernels (the\n"
    "default) or the clear fp32 ones, for every (d, k, T) of the sweep; causal mask, N(0, 1) inputs. Per\n"
    "shape and pass: W warm-up launches, then R launches each timed alone with CUDA events, L2\n"
    "flushed (256 MiB memset, read back) before each. The apply runs on the I of the estimate of the same inputs\n"
    "(the fast bf16 estimate with --kernel fast --dtype bf16, else one untimed clear estimate).\n"
    "Prints the median, min and max ms and the device bytes the pass needs beyond\n"
    "Q, K, V and O (I, scores, workspaces). --json and --csv print one row per shape and pass as it is\n"
    "timed, with the keys kernel,dtype,pass,T,d,k,H,bq,bk,group,ms,min_ms,max_ms,extra_bytes,reps; the\n"
    "CSV feeds cuda/bench/stream_sdpa.py (dense causal SDPA at the same T). --check-indices (with --kernel fast --pass estimate) also downloads I after\n"
    "every launch and reports whether it was bitwise the same each time and its checksum, and\n"
    "--traffic the CUPTI L2->SM and DRAM bytes of one launch; those rows have the columns of\n"
    "cuda/results/stream_fast_estimate.csv. --gpus G[,G2,...] times the fast estimate + apply with the\n"
    "sequence dealt over GPUs 0 … G − 1 (a build with NCCL; G = 1: the single-GPU kernels,\n"
    "the anchor): per row the slowest rank's total, estimate, apply and exposed exchange ms (medians),\n"
    "the most bytes one rank sends and receives beside the CPU model's keys_visible bytes for the same\n"
    "I, and whether I equals the G = 1 row's of the same T bit for bit; --scaling weak reads --seq as\n"
    "tokens per GPU. --layout zigzag (the default) deals 2G query chunks, rank g holding chunks g and\n"
    "2G − 1 − g (balanced estimate work), contiguous G shards; --exchange pieces (zigzag only; the\n"
    "default) moves the K rows each rank's first chunk needs first (in tiers: chunk i's rows in group\n"
    "i), so that chunk's estimate starts before the rest lands, whole in one group; --folds F (zigzag\n"
    "only; default 8) deals 2F·G chunks, every 2G of them as zigzag, 2F per rank; --schedule overlap\n"
    "(the default) runs each chunk's estimate and apply on a stream of its own (the latest chunk\n"
    "first; as many streams as the GPU's hardware queues leave, CUDA_DEVICE_MAX_CONNECTIONS), serial the estimates in token order on one stream, then the applies; --comm-priority\n"
    "high puts the exchange's stream at the greatest stream priority; --transport copy (the default)\n"
    "moves the rows with the copy engines (peer copies, no kernel; GPUs with peer access), nccl with\n"
    "NCCL's send/receive kernels. The defaults were chosen by measurement on 2 and 4 GPUs (docs/stream.md). With\n"
    "--gpus, --seq goes up to 16777216. Each\n"
    "row is followed by one line per rank (text; on stderr with --json/--csv): its total, estimate,\n"
    "apply, exposed and first-wait ms, when its K and V rows had landed, and its estimates timed again\n"
    "alone (no exchange, no other GPU busy; per chunk too; G = 1: the range kernel over every query\n"
    "block) and with every rank's at once, still without the exchange; the row has the slowest rank's\n"
    "alone, their sum and the slowest at once (estimate_alone_ms, estimate_alone_sum_ms,\n"
    "estimate_together_ms). Lists run every\n"
    "combination (G = 1 once; contiguous with --exchange pieces or --folds above 1 is skipped: those\n"
    "split zigzag's chunks alone; left at its default, either is whole or 1 on contiguous rows). Needs a\n"
    "build with CUDA and an NVIDIA GPU.";

/// Largest T the sweep accepts: 8M tokens (at d = 128 one fp32 tensor is 4 GiB); with --gpus, whose
/// tensors are bf16 and dealt over the GPUs, 16M (one bf16 tensor 4 GiB).
constexpr long long kMaxSeq = 1LL << 23;
constexpr long long kMaxSeqGpus = 1LL << 24;

po::options_description options() {
  po::options_description d("Options");
  d.add_options()("help,h", "show this help")
      ("pass", po::value<std::string>()->default_value("both"),
       "estimate | apply | both: the passes to time; trace: the fast trace's records (--kernel fast); "
       "trace-mass: the same without value norms (V not read), as a store of key blocks and mass takes them")
      ("kernel", po::value<std::string>()->default_value("fast"), 
       "fast | clear: the fast 16-bit tensor-core kernels (the default) or the clear fp32 ones")
      ("seq", po::value<std::string>()->default_value("32768,65536,131072,262144,524288,1048576"),
       "sequence lengths T, comma separated (up to 8388608; 16777216 with --gpus)")
      ;
  add_dim_list_option(d, "64,128");
  d.add_options()
      ("k", po::value<std::string>()->default_value("8,16,32"), "key blocks kept per query block, comma separated")
      ("heads", po::value<long long>()->default_value(1), "H, number of heads (every head uses one block mask)")
      ;
  add_tile_options(d, 64, 64, kStreamTiles);
  add_dtype_option(d, "bf16 | fp16", "bf16", " (the fast kernels; the clear ones are fp32)");
  d.add_options()
      ("group", po::value<long long>()->default_value(0),
       "fast apply: neighbouring query blocks per thread block sharing K/V loads (1 or 2; 0 = the default)")
      ("reps", po::value<long long>()->default_value(20), "timed launches per shape and pass")
      ("warmup", po::value<long long>()->default_value(2), "untimed launches per shape and pass before timing")
      ("check-indices", po::bool_switch(),
       "fast estimate only: download I after every launch; report 'same every launch' and its checksum")
      ("traffic", po::bool_switch(),
       "with --check-indices: also the CUPTI L2->SM and DRAM bytes of one launch per shape (needs the counters)")
      ("gpus", po::value<std::string>(),
       "GPU counts, comma separated: estimate + apply with the sequence sharded over G GPUs (a build with NCCL); 1 = one GPU")
      ("scaling", po::value<std::string>()->default_value("strong"),
       "with --gpus: strong (T is the whole sequence) or weak (T is per GPU: the sequence is G·T)")
      ("layout", po::value<std::string>()->default_value("zigzag"),
       "with --gpus: how query blocks are dealt, comma separated: zigzag (chunks g, 2G-1-g; the default) or contiguous (G shards)")
      ("exchange", po::value<std::string>()->default_value("pieces"),
       "with --gpus: the K exchange, comma separated: whole (one group) or pieces (chunk i's rows in group i; zigzag; "
       "the default: contiguous rows take whole)")
      ("folds", po::value<std::string>()->default_value("8"),
       "with --gpus and zigzag: folds, comma separated: 2F·G chunks, every 2G dealt as zigzag (1 = plain zigzag; "
       "the default 8: contiguous rows take 1)")
      ("schedule", po::value<std::string>()->default_value("overlap"),
       "with --gpus: serial (one compute stream) or overlap (a stream per chunk), comma separated")
      ("comm-priority", po::value<std::string>()->default_value("normal"),
       "with --gpus: the exchange stream's priority, comma separated: normal or high (ahead of the kernels)")
      ("transport", po::value<std::string>()->default_value("copy"),
       "with --gpus: how rows move, comma separated: nccl (send/receive kernels) or copy (peer copies by the copy engines)")
      ("timeline", po::bool_switch(),
       "with --gpus: after each rank's line, the timeline of the run that took the median total: when each K group "
       "landed, each chunk's estimate and apply");
  add_output_options(d);
  return d;
}

/// Everything the sweep needs, checked.
struct StreamSweep {
  std::vector<int> seqs, dims, ks;
  int heads = 1, bq = 64, bk = 64, group = 0, reps = 20, warmup = 2;
  bool estimate = true, apply = true, trace = false, trace_mass = false, fast = false, fp16 = false;
  OutputFormat format = OutputFormat::text;  ///< --json / --csv
  bool check_indices = false, traffic = false;  ///< the fast estimate's launch check and CUPTI bytes
  std::vector<int> gpus;  ///< --gpus: the sharded runs (empty: one GPU, the sweep above)
  bool weak = false;      ///< --scaling weak: T per GPU
  std::vector<ref::stream::ShardLayout> layouts{ref::stream::ShardLayout::contiguous};  ///< --layout
  std::vector<bool> pieces{true};   ///< --exchange: whole (false) and / or pieces (true)
  std::vector<int> folds{4};        ///< --folds: zigzag folds
  /// --exchange, --folds left at their defaults (which split zigzag's exchange and chunks):
  /// contiguous rows then take whole, 1 fold instead of being skipped.
  bool exchange_default = true, folds_default = true;
  std::vector<bool> overlap{true};  ///< --schedule: serial (false) and / or overlap (true)
  std::vector<bool> priority{false};///< --comm-priority: normal (false) and / or high (true)
  std::vector<bool> copy{true};     ///< --transport: nccl (false) and / or copy (true)
  bool timeline = false;            ///< --timeline: each rank's timeline after its line
};

/// A comma-separated list of names, each checked by `parse`; `flag` names the flag in errors.
template <typename T, typename Parse>
std::vector<T> name_list(const std::string& flag, const std::string& text, Parse parse, const std::string& hint) {
  std::vector<T> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    const std::string name = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    try {
      out.push_back(parse(name));
    } catch (const std::exception&) {
      throw UsageError("--" + flag + " '" + name + "' is unknown", hint);
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

/// A comma-separated list of the two names `off` (the default) and `on`, as false / true.
std::vector<bool> switch_list(const std::string& flag, const std::string& text, const std::string& off,
                              const std::string& on) {
  return name_list<bool>(
      flag, text,
      [&](const std::string& n) {
        if (n != off && n != on) throw std::invalid_argument(n);
        return n == on;
      },
      "choose " + off + " (the default) or " + on + ", comma separated");
}

StreamSweep parse_sweep(const po::variables_map& vm) {
  StreamSweep s;
  s.seqs = sweep_list("seq", vm["seq"].as<std::string>(), 1, vm.count("gpus") ? kMaxSeqGpus : kMaxSeq, "32768,1048576");
  s.dims = sweep_list("dim", vm["dim"].as<std::string>(), 1, 256, "64,128");
  s.ks = sweep_list("k", vm["k"].as<std::string>(), 1, 4096, "8,16,32");
  s.heads = int_flag(vm, "heads", 1, 4096);
  s.bq = int_flag(vm, "block-m", 1, 128);
  s.bk = int_flag(vm, "block-n", 1, 128);
  s.group = int_flag(vm, "group", 0, 2);
  s.reps = int_flag(vm, "reps", 1, 100000);
  s.warmup = int_flag(vm, "warmup", 0, 100000);
  const std::string pass = vm["pass"].as<std::string>();
  if (pass != "estimate" && pass != "apply" && pass != "both" && pass != "trace" && pass != "trace-mass")
    throw UsageError("--pass '" + pass + "' is unknown", "choose estimate, apply, both (the default), trace or trace-mass");
  s.trace = pass == "trace" || pass == "trace-mass";
  s.trace_mass = pass == "trace-mass";
  s.estimate = pass == "estimate" || pass == "both";
  s.apply = pass == "apply" || pass == "both";
  s.fast = kernel_family(vm["kernel"].as<std::string>(), KernelFamily::fast) == KernelFamily::fast;
  s.fp16 = fp16_dtype(vm["dtype"].as<std::string>());
  if (s.trace && !s.fast) throw UsageError("--pass trace times the fast trace", "add --kernel fast");
  if (s.fast && (s.bq != 64 || s.bk != 64))
    throw UsageError("--kernel fast takes --block-m 64 --block-n 64",
                     "pass --block-m 64 --block-n 64 (the defaults), or --kernel clear");
  if (s.fast && s.fp16 && s.estimate)
    throw UsageError("the fast estimate takes bf16 inputs (--dtype fp16 with --pass " + pass + ")",
                     "--dtype bf16, or --pass apply for the fp16 apply");
  s.format = output_format(vm);
  s.check_indices = vm["check-indices"].as<bool>();
  s.traffic = vm["traffic"].as<bool>();
  if (s.check_indices && (!s.fast || pass != "estimate" || s.fp16))
    throw UsageError("--check-indices checks the fast bf16 estimate's I", "add --kernel fast --pass estimate");
  if (s.traffic && !s.check_indices)
    throw UsageError("--traffic measures the fast estimate with --check-indices", "add --check-indices");
  const std::string scaling = vm["scaling"].as<std::string>();
  if (scaling != "strong" && scaling != "weak")
    throw UsageError("--scaling '" + scaling + "' is unknown", "choose strong (the default) or weak");
  s.weak = scaling == "weak";
  if (vm.count("gpus")) {
    s.gpus = sweep_list("gpus", vm["gpus"].as<std::string>(), 1, 64, "1,2,4");
    if (!s.fast || s.fp16 || pass != "both" || s.check_indices || s.group != 0 || s.bq != 64 || s.bk != 64)
      throw UsageError("--gpus times the fast bf16 estimate + apply (b_q = b_k = 64, I checked after every run)",
                       "drop --kernel clear, --dtype fp16, --pass, --check-indices, --group and the block sizes");
    for (const int T : s.seqs)
      for (const int G : s.gpus)
        if (s.weak && (long long)T * G > kMaxSeqGpus)
          throw UsageError("--scaling weak: " + std::to_string(G) + " GPUs × --seq " + std::to_string(T) +
                               " is past 16777216 tokens",
                           "a smaller --seq per GPU");
  } else if (s.weak) {
    throw UsageError("--scaling applies to --gpus", "add --gpus G[,G2,...]");
  }
  for (const char* flag : {"layout", "exchange", "folds", "schedule", "comm-priority", "transport", "timeline"})
    if (!vm[flag].defaulted() && s.gpus.empty())
      throw UsageError(std::string("--") + flag + " applies to --gpus", "add --gpus G[,G2,...]");
  s.timeline = vm["timeline"].as<bool>();
  s.layouts = name_list<ref::stream::ShardLayout>("layout", vm["layout"].as<std::string>(), ref::stream::parse_shard_layout,
                                                  "choose zigzag (the default) or contiguous, comma separated");
  s.pieces = switch_list("exchange", vm["exchange"].as<std::string>(), "whole", "pieces");
  s.folds = sweep_list("folds", vm["folds"].as<std::string>(), 1, 16, "1,2,4");
  s.overlap = switch_list("schedule", vm["schedule"].as<std::string>(), "serial", "overlap");
  s.priority = switch_list("comm-priority", vm["comm-priority"].as<std::string>(), "normal", "high");
  s.copy = switch_list("transport", vm["transport"].as<std::string>(), "nccl", "copy");
  const bool any_zigzag = std::count(s.layouts.begin(), s.layouts.end(), ref::stream::ShardLayout::zigzag) > 0;
  s.exchange_default = vm["exchange"].defaulted();
  s.folds_default = vm["folds"].defaulted();
  if (!vm["folds"].defaulted() && !any_zigzag && std::count_if(s.folds.begin(), s.folds.end(), [](int f) { return f > 1; }) > 0)
    throw UsageError("--folds deals the zigzag layout's chunks (a contiguous shard is one chunk)",
                     "drop --layout contiguous (zigzag is the default) or list contiguous,zigzag");
  if (!vm["exchange"].defaulted() && !any_zigzag && std::count(s.pieces.begin(), s.pieces.end(), true) > 0)
    throw UsageError("--exchange pieces splits the K exchange of the zigzag layout (a contiguous shard needs every "
                     "row it receives before its first query block)",
                     "drop --layout contiguous (zigzag is the default) or list contiguous,zigzag");
  return s;
}

#ifdef FLASHLAB_HAVE_CUDA
/// One row of the table (text), or of --json / --csv through `rows`: the keys are the columns
/// stream_sdpa.py and measure.sh read.
void print_row(const flashlab::cuda::StreamBenchRow& r, std::optional<RowStream>& rows) {
  const char* pass = r.stream.trace ? (r.stream.value_norm ? "trace" : "trace-mass") : r.stream.apply ? "apply" : "estimate";
  const std::string dtype(flashlab::ref::dtype_name(r.dtype));
  if (rows) {
    Value v;
    Json j(v);
    j.begin_object();
    j.key("kernel").value(to_string(r.stream.kernel)).key("dtype").value(dtype).key("pass").value(pass);
    j.key("T").value(r.seq).key("d").value(r.head_dim).key("k").value(r.stream.k).key("H").value(r.heads);
    j.key("bq").value(r.stream.bq).key("bk").value(r.stream.bk).key("group").value(r.stream.group);
    j.key("ms").value(round_to(r.median_ms, 6)).key("min_ms").value(round_to(r.min_ms, 6));
    j.key("max_ms").value(round_to(r.max_ms, 6)).key("extra_bytes").value(std::uint64_t(r.extra_bytes));
    j.key("reps").value(r.reps);
    j.end_object();
    rows->row(v);
    return;
  }
  char line[240];
  std::snprintf(line, sizeof line, "%-5s %-4s %-8s %8d %4d %4d %3d %11.4f %11.4f %11.4f %12zu\n",
                to_string(r.stream.kernel), dtype.c_str(), pass, r.seq, r.head_dim, r.stream.k, r.heads, r.median_ms,
                r.min_ms, r.max_ms, r.extra_bytes);
  std::cout << line << std::flush;
}

/// The fast estimate per shape with its I checked after every launch (and, with --traffic, the
/// CUPTI bytes of one launch): the rows of cuda/results/stream_fast_estimate.csv.
int run_index_check(const StreamSweep& s) {
  namespace fs = flashlab::cuda::stream;
  const bool data = s.format != OutputFormat::text;
  std::ostream& info = info_stream(data);
  info << "device: " << flashlab::cuda::device_description() << "\n"
       << "STREAM fast bf16 estimate, H=" << s.heads << " b_q=b_k=64, causal; per shape " << s.warmup
       << " warm-up + " << s.reps << " timed launches, each alone (CUDA events), L2 flushed before each, I "
       << "downloaded and compared after each" << (s.traffic ? "; CUPTI bytes of one more launch" : "") << "\n";
  std::optional<RowStream> rows;
  if (data) rows.emplace(s.format, std::cout);
  char line[320];
  bool all_same = true;
  for (const int d : s.dims)
    for (const int k : s.ks)
      for (const int T : s.seqs) {
        const std::uint64_t seed = 0x5eed + std::uint64_t(T);
        const fs::FastEstimateTiming r =
            fs::time_stream_fast_estimate(std::size_t(T), std::size_t(s.heads), std::size_t(d), std::size_t(k), s.reps,
                                          s.warmup, seed);
        double l2 = -1, dram = -1;  // -1: not measured
        if (s.traffic) {
          const flashlab::cuda::KernelCounters c =
              fs::measure_fast_estimate_traffic(std::size_t(T), std::size_t(s.heads), std::size_t(d), std::size_t(k), seed);
          l2 = c.l2_read_bytes;
          dram = c.dram_read_bytes;
        }
        const auto checksum = static_cast<unsigned long long>(r.stream.indices_checksum);
        char hex[24];
        std::snprintf(hex, sizeof hex, "0x%016llx", checksum);
        all_same = all_same && r.stream.same_every_launch;
        if (rows) {  // the columns of cuda/results/stream_fast_estimate.csv
          Value v;
          Json j(v);
          j.begin_object();
          j.key("kernel").value("fast").key("dtype").value("bf16").key("T").value(r.seq).key("H").value(r.heads);
          j.key("d").value(r.head_dim).key("bq").value(64).key("bk").value(64).key("k").value(r.stream.k);
          j.key("ms").value(round_to(r.median_ms, 4)).key("min_ms").value(round_to(r.min_ms, 4));
          j.key("max_ms").value(round_to(r.max_ms, 4)).key("extra_bytes").value(std::uint64_t(r.extra_bytes));
          j.key("same_every_launch").value(r.stream.same_every_launch ? 1 : 0).key("checksum").value(hex);
          j.key("l2_read_bytes").value(std::int64_t(std::llround(l2)));
          j.key("dram_read_bytes").value(std::int64_t(std::llround(dram)));
          j.end_object();
          rows->row(v);
          continue;
        }
        char bytes[96] = "";
        if (s.traffic) std::snprintf(bytes, sizeof bytes, "  L2->SM %.3f GB, DRAM %.3f GB", l2 / 1e9, dram / 1e9);
        std::snprintf(line, sizeof line,
                      "T=%d d=%d k=%d  %.4f ms (%.4f - %.4f)  extra %zu B  I same every launch: %s  checksum %s%s\n",
                      r.seq, r.head_dim, r.stream.k, r.median_ms, r.min_ms, r.max_ms, r.extra_bytes,
                      r.stream.same_every_launch ? "yes" : "NO", hex, bytes);
        std::cout << line << std::flush;
      }
  if (rows) rows->finish();
  if (!all_same) std::cerr << "error: the fast estimate's I differed between launches (rows with 0 / NO above)\n";
  return all_same ? kOk : kFailed;
}

#ifdef FLASHLAB_HAVE_RING
/// x with three decimals.
std::string fixed3(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", x);
  return b;
}

/// --timeline: one rank's run, ms from its start: when each K group landed, then each chunk's
/// estimate and apply (chunks in token order, as the rank holds them).
void print_timeline(std::ostream& os, const flashlab::cuda::stream::ShardedRankTimes& t,
                    const std::vector<ref::stream::RankShard>& chunks) {
  std::string landed;
  for (const float x : t.k_group_landed_ms) {
    if (!landed.empty()) landed += ' ';
    landed += fixed3(x);
  }
  os << "       K groups landed at: " << (landed.empty() ? "(receives none)" : landed + " ms") << "\n";
  char line[200];
  for (std::size_t c = 0; c < t.chunk_spans.size() && c < chunks.size(); ++c) {
    const auto& x = t.chunk_spans[c];
    std::snprintf(line, sizeof line, "       chunk %zu, query blocks %zu-%zu: estimate %.3f-%.3f, apply %.3f-%.3f ms\n", c,
                  chunks[c].q_begin, chunks[c].q_end - 1, x.estimate_begin, x.estimate_end, x.apply_begin, x.apply_end);
    os << line;
  }
}

/// --gpus: estimate + apply sharded over G GPUs per (d, k, T, G), the G = 1 row the anchor.
int run_sharded(const StreamSweep& s) {
  namespace fs = flashlab::cuda::stream;
  const bool data = s.format != OutputFormat::text;
  std::ostream& info = info_stream(data);
  info << "device: " << flashlab::cuda::device_description() << "\n"
       << "STREAM fast bf16 estimate + apply, sequence sharded over G GPUs (rows moved as --transport says, keys_visible: K then V of "
       << "every remote row before a rank's last query chunk), H=" << s.heads << " b_q=b_k=64, causal, " << (s.weak ? "weak" : "strong")
       << " scaling; per row " << s.warmup << " warm-up + " << s.reps
       << " timed runs, every L2 flushed before each; medians of the slowest rank; I compared after every run\n";
  std::optional<RowStream> rows;
  if (data) rows.emplace(s.format, std::cout);
  else
    std::cout << "   G layout     exch   F schedule     move        T    d    k   total ms   estim ms   apply ms exposed ms  wait ms  "
                 "sent MB model MB  recv MB model MB  same  =1GPU  checksum\n";
  std::map<std::tuple<long long, int, int>, std::uint64_t> anchor;  // (T, d, k) → checksum of the G = 1 row
  std::map<int, std::unique_ptr<flashlab::cuda::LocalRing>> rings;
  bool ok = true;
  char line[640];
  for (const int d : s.dims)
    for (const int k : s.ks)
      for (const int T0 : s.seqs)
        for (const int G : s.gpus)
          for (const auto layout : s.layouts)
            for (const bool pieces_listed : s.pieces)
            for (const int folds_listed : s.folds)
            for (const bool overlap : s.overlap)
            for (const bool priority : s.priority)
            for (const bool copy : s.copy) {
              // G = 1 is the whole sequence whatever the layout: one row; pieces and folds only
              // split zigzag's exchange and chunks.
              if (G == 1 && (layout != s.layouts.front() || pieces_listed != s.pieces.front() || folds_listed != s.folds.front() ||
                             overlap != s.overlap.front() || priority != s.priority.front() || copy != s.copy.front()))
                continue;
              const bool contiguous = layout == ref::stream::ShardLayout::contiguous;
              if (G > 1 && contiguous && ((pieces_listed && !s.exchange_default) || (folds_listed > 1 && !s.folds_default)))
                continue;
              const bool pieces = pieces_listed && !contiguous;  // the defaults split zigzag's alone
              const int folds = contiguous ? 1 : folds_listed;
              const long long T = s.weak ? (long long)T0 * G : T0;
              const fs::ShardedStreamProblem p{std::size_t(T), std::size_t(s.heads), std::size_t(d), std::size_t(k), layout,
                                               pieces, G == 1 ? 1 : std::size_t(folds), overlap, G > 1 && priority,
                                               G > 1 && copy};
              const char* layout_name = G == 1 ? "-" : ref::stream::shard_layout_name(layout);
              const char* exchange_name = G == 1 ? "-" : pieces ? "pieces" : "whole";
              const std::string schedule_name = G == 1 ? "-" : std::string(overlap ? "overlap" : "serial") +
                                                               (priority ? "+prio" : "");
              const char* transport_name = G == 1 ? "-" : copy ? "copy" : "nccl";
              auto& ring = rings[G];  // one per G for the whole sweep: making communicators takes a while
              try {
                if (!ring) {
                  std::vector<int> devices;
                  for (int g = 0; g < G; ++g) devices.push_back(g);
                  ring = std::make_unique<flashlab::cuda::LocalRing>(devices);
                }
              } catch (const std::invalid_argument& e) {
                throw UsageError(e.what(), "ask for at most as many GPUs as the machine has");
              }
              const fs::ShardedBenchRow r = fs::bench_stream_sharded(p, *ring, s.reps, s.warmup, 0x5eed + std::uint64_t(T));
              const auto chunks_of = ref::stream::shard_layout({std::size_t(T), 64, 64}, std::size_t(G), layout,
                                                               std::size_t(p.folds));
              const auto key = std::make_tuple(T, d, k);
              if (G == 1) anchor[key] = r.indices_checksum;
              const auto a = anchor.find(key);
              const char* same1 = a == anchor.end() ? "-" : a->second == r.indices_checksum ? "yes" : "NO";
              ok = ok && r.same_every_launch && std::string(same1) != "NO";
              char hex[24];
              std::snprintf(hex, sizeof hex, "0x%016llx", static_cast<unsigned long long>(r.indices_checksum));
              if (rows) {
                Value v;
                Json j(v);
                j.begin_object();
                j.key("gpus").value(G).key("scaling").value(s.weak ? "weak" : "strong").key("T").value(std::int64_t(T));
                j.key("d").value(d).key("k").value(k).key("H").value(s.heads);
                j.key("total_ms").value(round_to(r.total_ms, 4)).key("estimate_ms").value(round_to(r.estimate_ms, 4));
                j.key("apply_ms").value(round_to(r.apply_ms, 4)).key("exposed_ms").value(round_to(r.exposed_ms, 4));
                j.key("sent_bytes").value(r.sent_max).key("model_sent_bytes").value(r.model_sent_max);
                j.key("received_bytes").value(r.received_max).key("model_received_bytes").value(r.model_received_max);
                j.key("same_every_launch").value(r.same_every_launch ? 1 : 0).key("same_as_1gpu").value(same1);
                j.key("checksum").value(hex).key("reps").value(r.reps);
                j.key("layout").value(layout_name).key("exchange").value(exchange_name);
                j.key("folds").value(G == 1 ? 1 : folds).key("schedule").value(schedule_name);
                j.key("first_wait_ms").value(round_to(r.first_wait_ms, 4)).key("transport").value(transport_name);
                j.key("estimate_alone_ms").value(round_to(r.estimate_alone_ms, 4));
                j.key("estimate_alone_sum_ms").value(round_to(r.estimate_alone_sum_ms, 4));
                j.key("estimate_together_ms").value(round_to(r.estimate_together_ms, 4));
                j.end_object();
                rows->row(v);
              } else {
                std::snprintf(line, sizeof line,
                              "%4d %-10s %-6s %2d %-12s %-4s %8lld %4d %4d %10.3f %10.3f %10.3f %10.3f %8.3f %8.1f %8.1f %8.1f "
                              "%8.1f  %-4s  %-5s  %s\n",
                              G, layout_name, exchange_name, G == 1 ? 1 : folds, schedule_name.c_str(), transport_name, T, d, k, r.total_ms,
                              r.estimate_ms, r.apply_ms, r.exposed_ms, r.first_wait_ms, double(r.sent_max) / 1e6,
                              double(r.model_sent_max) / 1e6, double(r.received_max) / 1e6,
                              double(r.model_received_max) / 1e6, r.same_every_launch ? "yes" : "NO", same1, hex);
                std::cout << line << std::flush;
              }
              // Where each rank's time went (medians over the reps), and its estimates alone.
              for (std::size_t g = 0; g < r.ranks.size(); ++g) {
                const auto& t = r.ranks[g];
                std::string chunks;
                for (const float c : t.chunk_alone_ms) chunks += (chunks.empty() ? "" : " + ") + fixed3(c);
                if (G == 1) {
                  std::snprintf(line, sizeof line, "     the range kernel over every query block, alone: %.3f ms\n",
                                t.estimate_alone_ms);
                } else {
                  std::snprintf(line, sizeof line,
                                "     rank %zu: total %.3f = estimate %.3f + apply %.3f + exposed %.3f ms; first "
                                "estimate at %.3f ms; K landed at %.3f, V at %.3f ms; estimates alone %.3f ms (%s), every rank's "
                                "at once %.3f ms\n",
                                g, t.total_ms, t.estimate_ms, t.apply_ms, t.exposed_ms, t.first_wait_ms,
                                t.k_exchange_ms, t.v_exchange_ms, t.estimate_alone_ms, chunks.c_str(),
                                t.estimate_together_ms);
                }
                info << line;
                if (s.timeline && G > 1) print_timeline(info, t, chunks_of[g]);
                info << std::flush;
              }
            }
  if (rows) rows->finish();
  if (!ok) std::cerr << "error: I differed between runs or from the single-GPU row (NO above)\n";
  return ok ? kOk : kFailed;
}
#endif

int run_sweep(const StreamSweep& s) {
  namespace fc = flashlab::cuda;
  require_gpu("bench stream");
  if (!s.gpus.empty()) {
#ifdef FLASHLAB_HAVE_RING
    return run_sharded(s);
#else
    throw UsageError("--gpus needs a build with NCCL", "install NCCL beside CUDA and rebuild");
#endif
  }
  if (s.check_indices) return run_index_check(s);
  fc::StreamBenchConfig b;
  b.seqs = s.seqs;
  b.head_dims = s.dims;
  b.ks = s.ks;
  b.heads = s.heads;
  b.bq = s.bq;
  b.bk = s.bk;
  b.reps = s.reps;
  b.warmup = s.warmup;
  b.group = s.group;
  b.pass = s.trace_mass           ? fc::StreamBenchPass::trace_mass
           : s.trace              ? fc::StreamBenchPass::trace
           : s.estimate && s.apply ? fc::StreamBenchPass::both
           : s.apply               ? fc::StreamBenchPass::apply
                                   : fc::StreamBenchPass::estimate;
  b.kernel = s.fast ? fc::StreamKernel::fast : fc::StreamKernel::clear;
  b.dtype = s.fp16 ? flashlab::ref::Dtype::fp16 : flashlab::ref::Dtype::bf16;
  // JSON and CSV go to stdout alone (a file for stream_sdpa.py); the device line then goes to stderr.
  const bool data = s.format != OutputFormat::text;
  std::ostream& info = info_stream(data);
  info << "device: " << fc::device_description() << "\n"
       << "STREAM " << fc::to_string(b.kernel) << " kernels, H=" << s.heads << " b_q=" << s.bq << " b_k=" << s.bk
       << ", causal; per shape " << s.warmup << " warm-up + " << s.reps
       << " timed launches, each alone (CUDA events), L2 flushed before each; median (min, max)\n";
  std::optional<RowStream> rows;
  if (data) {
    rows.emplace(s.format, std::cout);
  } else {
    char line[200];
    std::snprintf(line, sizeof line, "%-5s %-4s %-8s %8s %4s %4s %3s %11s %11s %11s %12s\n", "impl", "type", "pass",
                  "T", "d", "k", "H", "ms", "min ms", "max ms", "extra bytes");
    std::cout << line << std::flush;
  }
  try {
    fc::bench_stream(b, [&](const fc::StreamBenchRow& r) { print_row(r, rows); });
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what(), "see flashlab bench stream --help for the accepted values");
  }
  if (rows) rows->finish();
  return kOk;
}
#endif

}  // namespace

int cmd_bench_stream(const Args& args) {
  return guarded("bench", [&]() -> int {
    const auto desc = options();
    const auto parsed = parse_subject_command(
        args, desc, {"bench", "benchmark", "stream", "flashlab bench stream --seq 1048576 --dim 128 --k 8", kUsageLine,
                     kSummary});
    if (!parsed) return kOk;  // --help was printed
    const StreamSweep sweep = parse_sweep(*parsed);
#ifdef FLASHLAB_HAVE_CUDA
    return run_sweep(sweep);
#else
    (void)sweep;
    throw built_without_cuda("bench stream times the GPU kernels");
#endif
  });
}

}  // namespace flashlab::app
