// `flashlab stream trace … --store DIR` (many layers and heads, traced head by head into a trace
// store) and `flashlab stream query DIR …` (reads, readers, routes, summaries, verification).
// Parsing and printing only: the store and its queries live in reference/src/stream/.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <tuple>

#include "core/commands.hpp"
#include "core/gpu_flags.hpp"
#include "core/input_checks.hpp"
#include "core/progress.hpp"
#include "core/report.hpp"
#include "stream/stream_flags.hpp"
#include "stream/stream_store_flags.hpp"
#include "flashlab/reference/npy.hpp"
#include "flashlab/reference/stream.hpp"
#include "flashlab/reference/stream_fidelity.hpp"
#include "flashlab/reference/stream_query.hpp"
#include "flashlab/reference/stream_store.hpp"
#if FLASHLAB_HAVE_CUDA
#include "flashlab/cuda/stream_layer.hpp"
#endif

#include <sys/resource.h>

namespace flashlab::app {

namespace {

namespace fs = std::filesystem;
namespace rs = flashlab::ref::stream;
using ref::Mat;

constexpr std::string_view kTraceUsage =
    "stream trace --store DIR --block-m BM --block-n BN --k K [--seq T --dim D] [--layers L] [--heads H]\n"
    "                       [--workload random|needles|structured] [--needle-layers LIST] [--needle-blocks N]\n"
    "                       [--needles M] [--inputs DIR] [--mask FILE] [--seed S] [--threads N] [--with-scores]\n"
    "                       [--resume] [--json|--csv]\n"
    "       flashlab stream trace --store DIR --device cuda --kernel fast --block-m 64 --block-n 64 --k K\n"
    "                       (--seq T [--dim 64|128] [--layers L] [--heads H] [--workload W …] | --inputs DIR)\n"
    "                       [--mask FILE] [--seed S] [--chunk N] [--heads-per-launch N] [--priority P]\n"
    "                       [--with-scores] [--resume] [--json|--csv]";
constexpr std::string_view kTraceSummary =
    "Traces layers × heads with the CPU reference (estimate, then apply with edge records) into a trace\n"
    "store: per (layer, head, query block) the kept key blocks and their mass, a reverse index, and a\n"
    "manifest (docs/stream.md, \"The trace store\"; NumPy reads it without flashlab). Inputs: q.npy k.npy\n"
    "v.npy from --inputs of shape [T, D], [T, H, D] or [L, T, H, D] (k and v may have fewer heads that\n"
    "divide H: grouped-query attention), else a synthetic workload per head: random (N(0, 1), Q scaled\n"
    "by 1/sqrt(D)), needles (planted needles with lead-in, the same plan in every needle layer) or\n"
    "structured (local window + sink + retrieval). Heads are written in order (layer-major) and each\n"
    "is committed on its own: --resume continues a store whose trace was interrupted.\n"
    "--device cuda --kernel fast traces on the GPU (d = 64 or 128, b_q = b_k = 64): per layer, the inputs\n"
    "as bf16 [T, H, D] on the device, then head by head the fast estimate and the fast trace on two\n"
    "streams (--priority: whose thread blocks the GPU starts first; trace, the default, hands each\n"
    "head's records to the writer soonest), the records copied to a ring of pinned chunks of --chunk\n"
    "query blocks and appended by a writer thread while the next head runs. The inputs: without\n"
    "--inputs and --workload, seeded N(0, 1) made on the device (Q scaled by 1/sqrt(D)); with --inputs,\n"
    "the CPU trace's files read a chunk of rows at a time (host memory stays bounded whatever T),\n"
    "converted to bf16 on the device, k and v repeated over the query heads they serve; with\n"
    "--workload, the CPU trace's values and planted needles, drawn one head at a time on the host.\n"
    "--mask and --resume follow the CPU trace's rules (a GPU store resumes only on the GPU). It prints\n"
    "each layer's time (inputs on the GPU to every head committed), the peak host RSS and the device\n"
    "memory beyond Q, K, V.";

constexpr std::string_view kQueryUsage =
    "stream query DIR (--reads POS | --readers BLOCK | --route SRC:DST | --summary | --verify)\n"
    "                       [--layer L|all] [--head H|all] [--top N] [--cumulative P] [--residual W]\n"
    "                       [--local TOKENS] [--far TOKENS] [--json|--csv]";
constexpr std::string_view kQuerySummary =
    "Questions to a trace store. --reads POS: the key blocks query block ⌊POS/b_q⌋ reads (POS a token;\n"
    "b<N> names a query block). --readers BLOCK: the query blocks that read key block BLOCK (t<S> names\n"
    "the key block holding token S). --route SRC:DST: mass-weighted routes from the target span DST\n"
    "(e.g. the answer) down through every layer to the source span SRC (e.g. a needle), spans FIRST-LAST\n"
    "in tokens; --residual is the weight of staying at a block per layer. --summary: each head's mass by\n"
    "distance (local < --local, far ≥ --far tokens). --verify: recompute the checksums and the reverse\n"
    "index. Answers are ordered by mass and cut at --top edges and at --cumulative of the total mass.";

struct TraceOptions : StreamFlags {
  std::string store, workload = "random", needle_layers, device = "cpu", kernel;
  long long layers = 1, heads = 1, needle_blocks = 4, needles = 4, chunk = 2048, heads_per_launch = 1;
  std::string priority = "trace";
  bool with_scores = false, resume = false, workload_given = false;
  OutputFormat output = OutputFormat::text;
};

std::string hex(std::uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(16) << std::setfill('0') << v;
  return os.str();
}

/// The layout of a traced store (the source is the caller's).
rs::StoreLayout store_layout(const rs::Geometry& g, std::size_t k, std::size_t layers, std::size_t heads, std::size_t D,
                             bool with_scores) {
  rs::StoreLayout layout;
  layout.geometry = g;
  layout.k = k;
  layout.layers = layers;
  layout.heads = heads;
  layout.d = D;
  layout.score = layout.value_norm = with_scores;
  return layout;
}

/// The store's source line: what the inputs were (checked by --resume, so one rule for both paths).
std::string trace_source(const TraceOptions& o, const TraceInputsShape* in) {
  std::ostringstream src;
  if (in) src << "inputs " << fs::path(o.inputs).filename().string() << " [L, T, H, D] = [" << in->L << ", " << in->T << ", "
              << in->H << ", " << in->D << "], " << in->H_kv << " key/value heads";
  else src << "workload " << o.workload << ", seed " << o.seed << ", d " << *o.dim;
  if (!o.mask.empty()) src << ", user block mask";
  return src.str();
}

/// A new store, or with --resume the interrupted one, checked to have been traced with the same
/// sizes and source (`layout`); the writer continues after its last committed head.
rs::StoreWriter open_store_writer(const TraceOptions& o, const rs::StoreLayout& layout) {
  if (!o.resume) return rs::StoreWriter::create(o.store, layout);
  rs::StoreWriter r = rs::StoreWriter::reopen(o.store);
  const auto& L = r.layout();
  const auto& g = layout.geometry;
  if (L.geometry.T != g.T || L.geometry.bq != g.bq || L.geometry.bk != g.bk || L.k != layout.k || L.layers != layout.layers ||
      L.heads != layout.heads || L.score != layout.score)
    throw UsageError("--resume: the store in " + o.store + " was traced with other sizes (T, b_q, b_k, k, layers, heads or "
                     "--with-scores)", "resume with the flags of the interrupted trace");
  if (L.source != layout.source)
    throw UsageError("--resume: the store in " + o.store + " was traced from \"" + L.source + "\"",
                     "resume with the same inputs, workload, seed and device");
  return r;
}

/// Appends the planted (layer, head, q, r) pairs of the heads traced now to planted.csv (a new
/// file when the trace started at the first head), for the viewer and for route queries.
void write_planted(const fs::path& dir, std::size_t first,
                   const std::vector<std::tuple<std::size_t, std::size_t, rs::Needle>>& planted) {
  if (planted.empty()) return;
  std::ofstream out(dir / "planted.csv", first == 0 ? std::ios::trunc : std::ios::app);
  if (first == 0) out << "layer,head,q,r\n";
  for (const auto& [l, h, n] : planted) out << l << ',' << h << ',' << n.q << ',' << n.r << '\n';
  if (!out) throw std::runtime_error((dir / "planted.csv").string() + ": cannot write");
}

/// Which layers get the needles (--needle-layers; default every layer).
std::vector<bool> needle_layers(const TraceOptions& o, std::size_t layers) {
  std::vector<bool> needle_layer(layers, true);
  if (!o.needle_layers.empty()) {
    std::fill(needle_layer.begin(), needle_layer.end(), false);
    for (long long l : integer_list("needle-layers", o.needle_layers, 0, (long long)layers - 1, "0,2")) needle_layer[std::size_t(l)] = true;
  }
  return needle_layer;
}

/// The synthetic inputs of head h of layer l, and its planted pairs (the CPU and the GPU trace
/// draw the same values).
rs::WorkloadInputs workload_head(const TraceOptions& o, const rs::Geometry& g, std::size_t D, std::size_t l, std::size_t h,
                                 std::size_t heads, const std::vector<bool>& needle_layer) {
  const auto workload = *rs::workload_from_name(o.workload);
  rs::WorkloadParams p{g, D, std::uint64_t(o.seed)};
  p.variant = l * heads + h;
  p.needle_blocks = std::size_t(o.needle_blocks);
  p.needles_per_block = std::size_t(o.needles);
  return rs::make_workload(workload == rs::Workload::needles && !needle_layer[l] ? rs::Workload::random : workload, p);
}

int run_trace(const TraceOptions& o) {
  std::optional<TraceInputs> in;
  if (!o.inputs.empty()) in = load_trace_inputs(o.inputs, o.policy, o.seq, o.dim, true);
  const std::size_t T = in ? in->T : std::size_t(*o.seq), D = in ? in->D : std::size_t(*o.dim);
  const std::size_t layers = in ? in->L : std::size_t(o.layers), heads = in ? in->H : std::size_t(o.heads);
  const rs::Geometry g{T, std::size_t(o.bq), std::size_t(o.bk)};
  const std::size_t k = std::size_t(o.k);
  const std::vector<bool> needle_layer = needle_layers(o, layers);
  const rs::BlockMask mask = o.mask.empty() ? rs::BlockMask(g) : rs::load_block_mask(o.mask, g, o.policy.memory_limit);

  rs::StoreLayout layout = store_layout(g, k, layers, heads, D, o.with_scores);
  layout.source = trace_source(o, in ? &*in : nullptr);
  const fs::path dir(o.store);
  rs::StoreWriter w = open_store_writer(o, layout);
  const std::size_t first = w.segments_committed();

  const rs::Bounds b = rs::stream_bounds(g, D, k);
  std::vector<Stage> stages;
  for (std::size_t s = first; s < layout.segments(); ++s)
    stages.push_back({"layer " + std::to_string(s / heads) + " head " + std::to_string(s % heads), 3 * b.work_paper});
  Progress progress("stream trace", stages.empty() ? std::vector<Stage>{{"nothing left", 1}} : stages);
  using clock = std::chrono::steady_clock;
  double t_inputs = 0, t_estimate = 0, t_apply = 0, t_store = 0;
  auto seconds = [](clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); };
  std::vector<std::tuple<std::size_t, std::size_t, rs::Needle>> planted;
  for (std::size_t s = first; s < layout.segments(); ++s) {
    const std::size_t l = s / heads, h = s % heads;
    auto t0 = clock::now();
    rs::WorkloadInputs head;
    if (in) {
      const std::size_t hk = h / (in->H / in->H_kv);
      head.Q = head_of(in->q, l, T, in->H, h, D);
      head.K = head_of(in->k, l, T, in->H_kv, hk, D);
      head.V = head_of(in->v, l, T, in->H_kv, hk, in->D_v);
    } else {
      head = workload_head(o, g, D, l, h, heads, needle_layer);
      for (const auto& n : head.planted) planted.emplace_back(l, h, n);
    }
    t_inputs += seconds(t0);
    t0 = clock::now();
    const auto est = rs::stream_estimate(head.Q, head.K, mask, rs::EstimateParams{k, std::size_t(o.threads)});
    t_estimate += seconds(t0);
    t0 = clock::now();
    const auto app = rs::stream_apply(head.Q, head.K, head.V, mask, est.indices, k, std::size_t(o.threads), true);
    t_apply += seconds(t0);
    t0 = clock::now();
    w.begin_head(l, h);
    w.append_edges(app.edges);
    w.end_head();
    t_store += seconds(t0);
    progress.next();
  }
  write_planted(dir, first, planted);
  w.close();
  const auto st = rs::Store::open(dir);
  if (o.output != OutputFormat::text) {
    ReportOutput report(o.output, std::cout);
    Json& j = report.json();
    j.begin_object();
    j.key("command").value("stream trace --store");
    j.key("store").value(o.store);
    j.key("T").value(std::uint64_t(T)).key("d").value(std::uint64_t(D)).key("block_m").value(std::uint64_t(g.bq));
    j.key("block_n").value(std::uint64_t(g.bk)).key("k").value(std::uint64_t(k));
    j.key("layers").value(std::uint64_t(layers)).key("heads").value(std::uint64_t(heads));
    j.key("source").value(layout.source);
    j.key("heads_written").value(std::uint64_t(layout.segments() - first));
    j.key("records").value(st.records()).key("bytes").value(st.bytes());
    j.key("checksum").value(hex(st.checksum()));
    j.key("seconds").begin_object().key("inputs").value(t_inputs).key("estimate").value(t_estimate);
    j.key("apply").value(t_apply).key("store").value(t_store).end_object();
    j.key("planted").begin_array();
    for (const auto& [l, h, n] : planted)
      j.begin_object().key("layer").value(std::uint64_t(l)).key("head").value(std::uint64_t(h)).key("q").value(std::uint64_t(n.q))
          .key("r").value(std::uint64_t(n.r)).end_object();
    j.end_array();
    j.end_object();
    report.finish();
  } else {
    std::cout << "stream trace -> store " << o.store << ": " << layers << " layer(s) x " << heads << " head(s), T=" << T
              << " d=" << D << " b_q=" << g.bq << " b_k=" << g.bk << " k=" << k << "; " << layout.source << "\n"
              << "  " << layout.segments() - first << " head(s) written" << (first ? " (resumed after " + std::to_string(first) + ")" : "")
              << ", " << st.records() << " records, " << st.bytes() << " bytes, checksum " << hex(st.checksum()) << "\n"
              << std::setprecision(3) << "  seconds: inputs " << t_inputs << ", estimate " << t_estimate << ", apply " << t_apply
              << ", store " << t_store << "\n";
    if (!planted.empty()) std::cout << "  " << planted.size() << " planted (layer, head, q, r) pairs in " << (dir / "planted.csv").string() << "\n";
    std::cout << "  next: flashlab stream query " << o.store << " --summary   |   flashlab stream serve " << o.store << "\n";
  }
  return kOk;
}

#if FLASHLAB_HAVE_CUDA
/// Peak resident set of this process so far, in bytes (getrusage: Linux reports kilobytes).
std::uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return std::uint64_t(u.ru_maxrss) * 1024;
}

/// `stream trace --store --device cuda --kernel fast`: the layer pipeline (stream_layer.hpp) on
/// inputs made on the GPU (seeded N(0, 1)), read from --inputs in chunks, or drawn per head by the
/// CPU trace's workload generator (--workload), each converted to bf16 on the device; then the
/// store opened (every check) and the run's figures printed. `in` holds the checked headers of
/// --inputs, when given; `mask` the block mask (checked against T).
int run_trace_cuda(const TraceOptions& o, const std::optional<TraceInputsShape>& in, const rs::BlockMask& mask) {
  namespace gs = flashlab::cuda::stream;
  require_gpu("stream trace --device cuda");
  const std::size_t T = in ? in->T : std::size_t(*o.seq), D = in ? in->D : std::size_t(*o.dim), k = std::size_t(o.k);
  const std::size_t layers = in ? in->L : std::size_t(o.layers), heads = in ? in->H : std::size_t(o.heads);
  const rs::Geometry g = mask.geometry();
  rs::StoreLayout layout = store_layout(g, k, layers, heads, D, o.with_scores);
  const bool device_random = !in && !o.workload_given;
  if (device_random)
    layout.source = "gpu random N(0, 1) bf16 (Q / sqrt(d)), seed " + std::to_string(o.seed) + ", d " + std::to_string(D) +
                    (o.mask.empty() ? "" : ", user block mask");
  else  // the CPU trace's source, marked: the bf16 records are not the CPU trace's, a resume must not mix them
    layout.source = trace_source(o, in ? &*in : nullptr) + ", bf16 on the GPU";
  const gs::FastApplyShape shape{T, heads, D, k, ref::Dtype::bf16, 0};
  gs::LayerTraceOptions lo;
  lo.heads_per_launch = std::size_t(o.heads_per_launch);
  lo.chunk_rows = std::size_t(o.chunk);
  lo.priority = o.priority == "trace" ? gs::LayerPriority::trace
                : o.priority == "estimate" ? gs::LayerPriority::estimate : gs::LayerPriority::equal;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  rs::StoreWriter w = open_store_writer(o, layout);
  const std::size_t first = w.segments_committed();
  const std::vector<bool> needle_layer = needle_layers(o, layers);
  std::vector<std::tuple<std::size_t, std::size_t, rs::Needle>> planted;
  std::optional<gs::LayerInputUploader> up;
  std::optional<TraceInputsReader> reader;
  gs::LayerInputFill fill;
  if (device_random) {
    fill = gs::layer_random_fill(shape, std::uint64_t(o.seed));  // the library's own, as its tests run it
  } else if (in) {
    // Every head of the layer from the files, a chunk of rows at a time: host memory is one chunk.
    up.emplace(T, heads, D);
    reader.emplace(*in, o.policy);
    fill = [&](std::size_t l, std::size_t, std::uint16_t* Q, std::uint16_t* K, std::uint16_t* V) {
      std::uint16_t* dst[3] = {Q, K, V};
      for (int which = 0; which < 3; ++which) {
        const std::size_t src_heads = which == 0 ? heads : in->H_kv, step = up->rows_per_chunk(src_heads);
        for (std::size_t t = 0; t < T; t += step) {
          const std::size_t rows = std::min(step, T - t);
          reader->read(which, l, t, rows, up->host_chunk());
          up->upload(src_heads, t, rows, gs::HeadRange{0, heads}, dst[which]);
        }
      }
    };
  } else {
    // The CPU trace's workload, head by head (the same values and planted pairs), uploaded in chunks.
    up.emplace(T, heads, D);
    fill = [&](std::size_t l, std::size_t h0, std::uint16_t* Q, std::uint16_t* K, std::uint16_t* V) {
      for (std::size_t h = h0; h < heads; ++h) {
        const rs::WorkloadInputs head = workload_head(o, g, D, l, h, heads, needle_layer);
        for (const auto& n : head.planted) planted.emplace_back(l, h, n);
        const std::pair<const ref::Mat<float>*, std::uint16_t*> parts[3] = {{&head.Q, Q}, {&head.K, K}, {&head.V, V}};
        const std::size_t step = up->rows_per_chunk(1);
        for (const auto& [m, dst] : parts)
          for (std::size_t t = 0; t < T; t += step) {
            const std::size_t rows = std::min(step, T - t);
            std::copy_n(m->data() + t * D, rows * D, up->host_chunk());
            up->upload(1, t, rows, gs::HeadRange{h, 1}, dst);
          }
      }
    };
  }
  const auto run = gs::layer_trace(shape, fill, lo, w, &mask);
  write_planted(o.store, first, planted);
  w.close();
  const double wall_s = std::chrono::duration<double>(clock::now() - t0).count();
  const std::uint64_t rss = peak_rss_bytes();
  const auto st = rs::Store::open(o.store);
  double traced_ms = 0;
  for (double ms : run.layer_ms) traced_ms += ms;
  const auto& s = run.stats;
  if (o.output != OutputFormat::text) {
    ReportOutput report(o.output, std::cout);
    Json& j = report.json();
    j.begin_object();
    j.key("command").value("stream trace --store --device cuda");
    j.key("store").value(o.store);
    j.key("T").value(std::uint64_t(T)).key("d").value(std::uint64_t(D)).key("k").value(std::uint64_t(k));
    j.key("layers").value(std::uint64_t(layers)).key("heads").value(std::uint64_t(heads));
    j.key("heads_per_launch").value(std::uint64_t(lo.heads_per_launch)).key("chunk").value(std::uint64_t(lo.chunk_rows));
    j.key("priority").value(gs::layer_priority_name(lo.priority));
    j.key("source").value(layout.source);
    j.key("heads_written").value(std::uint64_t(layout.segments() - first));
    j.key("records").value(st.records()).key("bytes").value(st.bytes()).key("checksum").value(hex(st.checksum()));
    j.key("planted").begin_array();
    for (const auto& [l, h, n] : planted)
      j.begin_object().key("layer").value(std::uint64_t(l)).key("head").value(std::uint64_t(h)).key("q").value(std::uint64_t(n.q))
          .key("r").value(std::uint64_t(n.r)).end_object();
    j.end_array();
    j.key("layer_ms").begin_array();
    for (double ms : run.layer_ms) j.value(ms);
    j.end_array();
    j.key("traced_ms").value(traced_ms).key("inputs_ms").value(run.inputs_ms).key("wall_s").value(wall_s);
    j.key("estimate_ms").value(s.estimate_ms).key("trace_ms").value(s.trace_ms).key("gpu_span_ms").value(s.gpu_span_ms);
    j.key("writer_busy_ms").value(s.writer_busy_ms).key("end_head_ms").value(s.end_head_ms);
    j.key("chunks").value(std::uint64_t(s.chunks)).key("max_chunks_in_flight").value(std::uint64_t(s.max_chunks_in_flight));
    j.key("qkv_device_bytes").value(std::uint64_t(run.qkv_bytes));
    j.key("device_bytes_beyond_qkv").value(std::uint64_t(s.device_bytes + (up ? up->device_bytes() : 0)));
    j.key("upload_device_bytes").value(std::uint64_t(up ? up->device_bytes() : 0));
    j.key("device_bytes_beyond_qkv_measured").value(std::uint64_t(run.tracer_device_bytes_measured));
    j.key("pinned_bytes").value(std::uint64_t(s.pinned_bytes + (up ? up->host_bytes() : 0)));
    j.key("peak_rss_bytes").value(rss);
    j.end_object();
    report.finish();
    return kOk;
  }
  std::cout << "stream trace --device cuda -> store " << o.store << ": " << layers << " layer(s) x " << heads << " head(s), T=" << T
            << " d=" << D << " k=" << k << ", " << lo.heads_per_launch << " head(s) per launch, chunks of " << lo.chunk_rows
            << " query blocks, priority " << gs::layer_priority_name(lo.priority) << "; " << layout.source << "\n"
            << "  " << layout.segments() - first << " head(s) written" << (first ? " (resumed after " + std::to_string(first) + ")" : "")
            << ", " << st.records() << " records, " << st.bytes() << " bytes, checksum " << hex(st.checksum()) << "\n"
            << std::fixed << std::setprecision(1) << "  per layer (inputs on the GPU -> every head committed), ms:";
  for (double ms : run.layer_ms) std::cout << ' ' << ms;
  std::cout << "\n  traced " << traced_ms << " ms in all (inputs " << (device_random ? "made on the GPU" : in ? "read and uploaded" : "drawn and uploaded")
            << ": " << run.inputs_ms << " ms more); wall "
            << std::setprecision(2) << wall_s << " s with the store's creation\n"
            << std::setprecision(1) << "  GPU: estimate " << s.estimate_ms << " ms, trace " << s.trace_ms
            << " ms (launch times, they overlap), first estimate to last trace " << s.gpu_span_ms << " ms\n"
            << "  writer: busy " << s.writer_busy_ms << " ms (commits " << s.end_head_ms << " ms), " << s.chunks
            << " chunks, at most " << s.max_chunks_in_flight << " in flight\n"
            << "  memory: device beyond Q, K, V " << s.device_bytes + (up ? up->device_bytes() : 0) << " bytes (upload chunks "
            << (up ? up->device_bytes() : 0) << "; free memory dropped by "
            << run.tracer_device_bytes_measured << "; Q, K, V " << run.qkv_bytes << "), pinned host "
            << s.pinned_bytes + (up ? up->host_bytes() : 0) << " bytes, peak host RSS " << rss << " bytes\n"
            << std::defaultfloat;
  if (!planted.empty())
    std::cout << "  " << planted.size() << " planted (layer, head, q, r) pairs in " << (fs::path(o.store) / "planted.csv").string() << "\n";
  return kOk;
}
#endif

struct QueryOptions {
  std::string store, reads, readers, route, layer = "all", head = "all";
  bool summary = false, verify = false;
  OutputFormat output = OutputFormat::text;
  long long top = 20, local = 512, far = 8192;
  double cumulative = 1.0, residual = 0.5;
};

void print_edges(const rs::Store& st, const rs::EdgeList& list, OutputFormat output, const std::string& what) {
  const auto& g = st.layout().geometry;
  if (output != OutputFormat::text) {
    ReportOutput report(output, std::cout);
    Json& j = report.json();
    j.begin_object().key("query").value(what).key("candidates").value(std::uint64_t(list.candidates));
    j.key("total_mass").value(list.total_mass).key("edges").begin_array();
    for (const auto& e : list.edges) {
      j.begin_object().key("layer").value(std::uint64_t(e.layer)).key("head").value(std::uint64_t(e.head));
      j.key("q").value(std::uint64_t(e.q)).key("r").value(std::uint64_t(e.r)).key("slot").value(std::uint64_t(e.slot));
      j.key("mass").value(e.mass).key("share").value(e.share).key("score").value(e.score);
      j.key("query_tokens").begin_array().value(std::uint64_t(e.q * g.bq)).value(std::uint64_t(e.q * g.bq + g.q_rows(e.q))).end_array();
      j.key("key_tokens").begin_array().value(std::uint64_t(e.r * g.bk)).value(std::uint64_t(e.r * g.bk + g.k_rows(e.r))).end_array();
      j.end_object();
    }
    j.end_array().end_object();
    report.finish();
    return;
  }
  std::cout << what << ": " << list.candidates << " edges, total mass " << std::setprecision(4) << list.total_mass
            << "; showing " << list.edges.size() << "\n";
  std::cout << "  layer  head  query block (tokens)     key block (tokens)          mass     share     score\n";
  for (const auto& e : list.edges) {
    std::ostringstream qs, ks;
    qs << e.q << " (" << e.q * g.bq << ".." << e.q * g.bq + g.q_rows(e.q) - 1 << ")";
    ks << e.r << " (" << e.r * g.bk << ".." << e.r * g.bk + g.k_rows(e.r) - 1 << ")";
    std::cout << "  " << std::setw(5) << e.layer << std::setw(6) << e.head << "  " << std::left << std::setw(23) << qs.str()
              << std::setw(24) << ks.str() << std::right << std::setw(10) << std::setprecision(4) << e.mass << std::setw(10)
              << e.share << std::setw(10) << e.score << "\n";
  }
}

int run_query(const QueryOptions& o, const po::variables_map& vm) {
  const int modes = int(!o.reads.empty()) + int(!o.readers.empty()) + int(!o.route.empty()) + int(o.summary) + int(o.verify);
  if (modes != 1)
    throw UsageError(modes == 0 ? "nothing to ask" : "one question at a time",
                     "pass exactly one of --reads POS, --readers BLOCK, --route SRC:DST, --summary, --verify");
  require_range("top", o.top, 1, 100000);
  if (!(o.cumulative > 0 && o.cumulative <= 1))
    throw UsageError("--cumulative " + std::to_string(o.cumulative) + " is outside (0, 1]", "e.g. --cumulative 0.9");
  if (!(o.residual >= 0 && o.residual < 1))
    throw UsageError("--residual " + std::to_string(o.residual) + " is outside [0, 1)", "0.5 weighs attention and the residual stream equally");
  require_range("local", o.local, 0, 1LL << 40);
  require_range("far", o.far, 0, 1LL << 40);
  if (o.local > o.far) throw UsageError("--local " + std::to_string(o.local) + " exceeds --far " + std::to_string(o.far), "local < far");
  auto flag_value = [](const char* flag, auto&& parse) {
    try {
      return parse();
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--") + flag + ": " + e.what(), "flashlab stream query --help");
    }
  };
  rs::HeadSelection sel;
  sel.layer = flag_value("layer", [&] { return parse_all_or_index(o.layer); });
  sel.head = flag_value("head", [&] { return parse_all_or_index(o.head); });
  const rs::Pruning pruning{std::size_t(o.top), o.cumulative};
  const auto st = rs::Store::open(o.store);
  const auto& g = st.layout().geometry;
  if (!o.reads.empty() || !o.readers.empty()) {
    // Reads name a query block (a token's, or b<N>); readers a key block (t<S>'s, or a number).
    const bool reads = !o.reads.empty();
    const std::string flag = reads ? "reads" : "readers", &text = reads ? o.reads : o.readers;
    const auto p = flag_value(flag.c_str(), [&] { return parse_position(text, !reads); });
    const std::size_t b = reads ? g.bq : g.bk, block = p.block ? p.value : p.value / b;
    if (!p.block && p.value >= g.T)
      throw UsageError("--" + flag + " " + text + ": token " + std::to_string(p.value) + " is outside [0, T = " + std::to_string(g.T) + ")",
                       reads ? "positions are token indices below T, or b<N> for a query block"
                             : "BLOCK is a key block index, or t<S> for the key block holding token S");
    const auto list = reads ? rs::top_reads(st, block, sel, pruning) : rs::top_readers(st, block, sel, pruning);
    const std::size_t rows = reads ? g.q_rows(block) : g.k_rows(block);  // the block exists: the query checked it
    print_edges(st, list, o.output,
                std::string(reads ? "reads of query block " : "readers of key block ") + std::to_string(block) + " (tokens " +
                    std::to_string(block * b) + ".." + std::to_string(block * b + rows - 1) + ")");
    return kOk;
  }
  if (!o.route.empty()) {
    const auto colon = o.route.find(':');
    if (colon == std::string::npos) throw UsageError("--route " + o.route + ": expected SRC:DST", "e.g. --route 100-163:1900-1963");
    const auto src = flag_value("route", [&] { return parse_span(std::string_view(o.route).substr(0, colon)); });
    const auto dst = flag_value("route", [&] { return parse_span(std::string_view(o.route).substr(colon + 1)); });
    if (sel.layer) throw UsageError("--route crosses every layer; --layer does not apply", "drop --layer (--head picks one head)");
    rs::RouteParams p;
    p.head = sel.head;
    p.residual = o.residual;
    p.pruning = {std::size_t(vm["top"].defaulted() ? 16 : o.top), vm["cumulative"].defaulted() ? 0.9 : o.cumulative};
    const auto route = rs::route(st, src, dst, p);
    if (o.output != OutputFormat::text) {
      ReportOutput report(o.output, std::cout);
      Json& j = report.json();
      j.begin_object().key("query").value("route").key("source").begin_array().value(std::uint64_t(src.begin)).value(std::uint64_t(src.end)).end_array();
      j.key("target").begin_array().value(std::uint64_t(dst.begin)).value(std::uint64_t(dst.end)).end_array();
      j.key("residual").value(o.residual).key("total").value(route.total).key("layers").begin_array();
      for (const auto& rl : route.layers) {
        j.begin_object().key("layer").value(std::uint64_t(rl.layer)).key("attention").value(rl.attention).key("residual").value(rl.residual);
        j.key("edges").begin_array();
        for (const auto& e : rl.edges) {
          j.begin_object();
          if (e.head) j.key("head").value(std::uint64_t(*e.head));
          else j.key("head").null();
          j.key("q").value(std::uint64_t(e.q)).key("r").value(std::uint64_t(e.r)).key("weight").value(e.weight).end_object();
        }
        j.end_array().end_object();
      }
      j.end_array().end_object();
      report.finish();
      return kOk;
    }
    std::cout << "route from target tokens " << dst.begin << ".." << dst.end - 1 << " down to source tokens " << src.begin
              << ".." << src.end - 1 << " (residual " << o.residual << "): total " << std::setprecision(4) << route.total << "\n";
    for (const auto& rl : route.layers) {
      std::cout << "  layer " << rl.layer << ": attention " << rl.attention << ", residual " << rl.residual << "\n";
      for (const auto& e : rl.edges) {
        if (e.head) std::cout << "    head " << std::setw(3) << *e.head << "  q " << std::setw(7) << e.q << " -> r " << std::setw(7) << e.r;
        else std::cout << "    residual  at block " << std::setw(7) << e.q << "       ";
        std::cout << "   " << e.weight << "\n";
      }
    }
    return kOk;
  }
  if (o.summary) {
    const auto sums = rs::summarize(st, rs::DistanceBands{std::size_t(o.local), std::size_t(o.far)});
    if (o.output != OutputFormat::text) {
      ReportOutput report(o.output, std::cout);
      Json& j = report.json();
      j.begin_object().key("query").value("summary").key("local").value(std::uint64_t(o.local)).key("far").value(std::uint64_t(o.far));
      j.key("heads").begin_array();
      for (const auto& h : sums) {
        if (!sel.contains(h.layer, h.head)) continue;
        j.begin_object().key("layer").value(std::uint64_t(h.layer)).key("head").value(std::uint64_t(h.head));
        j.key("records").value(h.records).key("empty_rows").value(std::uint64_t(h.empty_rows)).key("mass").value(h.mass);
        j.key("local").value(h.local).key("mid").value(h.mid).key("far").value(h.far).key("mean_distance").value(h.mean_distance);
        j.end_object();
      }
      j.end_array().end_object();
      report.finish();
      return kOk;
    }
    std::cout << "store " << o.store << ": " << st.layout().source << "; T=" << g.T << " b_q=" << g.bq << " b_k=" << g.bk
              << " k=" << st.layout().k << ", " << st.segments() << " of " << st.layout().segments() << " heads, "
              << st.records() << " records\n"
              << "mass by distance: local < " << o.local << " tokens, far >= " << o.far << "\n"
              << "  layer  head   records   mass      local    mid      far      mean distance\n";
    for (const auto& h : sums) {
      if (!sel.contains(h.layer, h.head)) continue;
      std::cout << std::fixed << std::setprecision(3) << "  " << std::setw(5) << h.layer << std::setw(6) << h.head << std::setw(10)
                << h.records << std::setw(10) << std::setprecision(1) << h.mass << std::setprecision(3) << std::setw(9) << h.local
                << std::setw(9) << h.mid << std::setw(9) << h.far << std::setw(12) << std::setprecision(1) << h.mean_distance << "\n"
                << std::defaultfloat;
    }
    return kOk;
  }
  const std::string problem = st.verify();
  if (o.output != OutputFormat::text) {
    ReportOutput report(o.output, std::cout);
    Json& j = report.json();
    j.begin_object().key("query").value("verify").key("records").value(st.records()).key("checksum").value(hex(st.checksum()));
    j.key("ok").value(problem.empty()).key("problem").value(problem).end_object();
    report.finish();
  } else if (problem.empty()) {
    std::cout << "store " << o.store << ": " << st.segments() << " heads, " << st.records() << " records; checksums and reverse index verified ("
              << hex(st.checksum()) << ")\n";
  }
  if (!problem.empty()) {
    std::cerr << "error: store " << o.store << " does not verify: " << problem << "\n";
    return kFailed;
  }
  return kOk;
}

}  // namespace

int cmd_stream_trace_store(const Args& args) {
  return guarded("stream trace", [&]() -> int {
    TraceOptions o;
    po::options_description desc("Options");
    desc.add_options()("help,h", "show this help");
    add_stream_options(desc, 1);
    desc.add_options()
        ("store", po::value<std::string>(&o.store), "directory of the trace store (created; must not hold a store unless --resume)")
        ("layers", po::value<long long>(&o.layers)->default_value(1), "layers to trace (synthetic inputs)")
        ("heads", po::value<long long>(&o.heads)->default_value(1), "heads per layer (synthetic inputs)")
        ("workload", po::value<std::string>(&o.workload)->default_value("random"), "random | needles | structured (without --inputs)")
        ("needle-layers", po::value<std::string>(&o.needle_layers), "layers that get the needles (needles workload; default all, e.g. 0,2)")
        ("needle-blocks", po::value<long long>(&o.needle_blocks)->default_value(4), "needles / structured: query blocks with needles or retrievals")
        ("needles", po::value<long long>(&o.needles)->default_value(4), "needles / structured: needles or retrieving tokens per such block")
        ("with-scores", po::bool_switch(&o.with_scores),
         "also store each record's score and value norm (--device cuda: the trace then reads V too)")
        ("resume", po::bool_switch(&o.resume), "continue an interrupted trace into the same --store (same flags and device)")
        ("kernel", po::value<std::string>(&o.kernel), "fast (with --device cuda: the fast bf16 estimate and trace)")
        ("chunk", po::value<long long>(&o.chunk)->default_value(2048), "--device cuda: query blocks per streamed chunk of records")
        ("heads-per-launch", po::value<long long>(&o.heads_per_launch)->default_value(1), "--device cuda: heads per estimate and trace launch")
        ("priority", po::value<std::string>(&o.priority)->default_value("trace"), "--device cuda: trace|estimate|equal, the kernel stream the GPU serves first")
        ;
    add_output_options(desc);
    po::positional_options_description pos;
    pos.add("sub", 1);
    const auto vm = parse(args, desc, &pos);
    if (vm.count("help")) {
      print_help(std::cout, kTraceUsage, kTraceSummary, desc);
      return kOk;
    }
    if (vm.count("device")) o.device = vm["device"].as<std::string>();
    if (o.device != "cpu" && o.device != "cuda") throw UsageError("--device '" + o.device + "' is unknown", "choose cpu or cuda");
    static_cast<StreamFlags&>(o) = stream_flags(vm);
    o.output = output_format(vm);
    if (o.store.empty()) throw UsageError("--store needs a directory", "e.g. --store trace_dir");
    if (!o.save.empty()) throw UsageError("--save and --store both choose where the trace goes", "use one of them");
    if (!vm["format"].defaulted()) throw UsageError("--format applies to --save", "a store has one format (docs/stream.md)");
    if (!rs::workload_from_name(o.workload)) throw UsageError("--workload '" + o.workload + "' is unknown", "random, needles or structured");
    if (!o.inputs.empty() && (!vm["workload"].defaulted() || !vm["layers"].defaulted() || !vm["heads"].defaulted()))
      throw UsageError("--inputs gives the layers and heads (q.npy [L, T, H, D]); --workload, --layers, --heads make synthetic ones",
                       "drop --workload/--layers/--heads, or drop --inputs");
    if (vm.count("needle-layers") && o.workload != "needles")
      throw UsageError("--needle-layers applies to --workload needles", "add --workload needles");
    require_range("layers", o.layers, 1, 4096);
    require_range("heads", o.heads, 1, 4096);
    if (o.layers * o.heads > 65536) throw UsageError("--layers x --heads exceeds 65536", "trace fewer heads per store");
    require_range("needle-blocks", o.needle_blocks, 1, 1 << 20);
    require_range("needles", o.needles, 1, 4096);
    o.workload_given = !vm["workload"].defaulted();
    if (o.device == "cuda") {
      // The GPU path: the fast kernels' shapes; inputs made on the device, read from --inputs or
      // drawn by --workload. The files, the mask and the resume follow the CPU trace's rules.
      if (o.kernel != "fast")
        throw UsageError("--device cuda traces into a store with the fast kernels only", "add --kernel fast");
      if (o.bq != 64 || o.bk != 64) throw UsageError("--kernel fast takes --block-m 64 --block-n 64", "pass --block-m 64 --block-n 64");
      std::optional<TraceInputsShape> in;
      if (!o.inputs.empty()) in = check_trace_inputs(o.inputs, o.seq, o.dim, true);
      const std::size_t D = in ? in->D : std::size_t(*o.dim), heads = in ? in->H : std::size_t(o.heads);
      if (D != 64 && D != 128)
        throw UsageError(in ? "--inputs " + o.inputs + ": q.npy's head dim D = " + std::to_string(D) + "; --kernel fast takes 64 or 128"
                            : "--kernel fast takes --dim 64 or 128",
                         in ? "pad or project the heads to d = 64 or 128" : "e.g. --dim 128");
      if (in && in->D_v != in->D)
        throw UsageError("--inputs " + o.inputs + ": v.npy's head dim " + std::to_string(in->D_v) + " differs from q.npy's " +
                             std::to_string(in->D) + "; --kernel fast takes one d for Q, K and V",
                         "trace these inputs on the CPU reference (drop --device cuda)");
      require_range("k", o.k, 1, 128);
      require_range("heads-per-launch", o.heads_per_launch, 1, (long long)heads);
      require_range("chunk", o.chunk, 1, 1LL << 24);
      if (o.priority != "equal" && o.priority != "trace" && o.priority != "estimate")
        throw UsageError("--priority " + o.priority + ": expected equal, trace or estimate",
                         "e.g. --priority trace (the trace's thread blocks first)");
      if (!in && o.workload_given) {
        // The workload is drawn on the host one head at a time (the CPU trace's generator).
        MemoryPlan plan;
        plan.add("one head's Q, K, V", checked_size({std::uint64_t(*o.seq), std::uint64_t(*o.dim), 3}, "T x D"), 4);
        plan.require_within(o.policy, "stream trace --store --device cuda --workload");
      }
      return with_store_errors([&]() -> int {
        // The mask file is read here, so that its errors need no GPU.
        const rs::Geometry g{in ? in->T : std::size_t(*o.seq), 64, 64};
        const rs::BlockMask mask = o.mask.empty() ? rs::BlockMask(g) : rs::load_block_mask(o.mask, g, o.policy.memory_limit);
#if FLASHLAB_HAVE_CUDA
        return run_trace_cuda(o, in, mask);
#else
        (void)mask;
        throw built_without_cuda("stream trace --device cuda", "use --device cpu");
#endif
      });
    }
    if (!o.kernel.empty()) throw UsageError("--kernel applies to --device cuda", "add --device cuda --kernel fast, or drop --kernel");
    if (!vm["chunk"].defaulted() || !vm["heads-per-launch"].defaulted() || !vm["priority"].defaulted())
      throw UsageError("--chunk, --heads-per-launch and --priority apply to --device cuda",
                       "drop them, or add --device cuda --kernel fast");
    if (o.inputs.empty()) {
      MemoryPlan plan;
      plan.add("one head's Q, K, V, O", checked_size({std::uint64_t(*o.seq), std::uint64_t(*o.dim), 4}, "T x D"), 4);
      plan.add("one head's I and edge records", checked_size({std::uint64_t(*o.seq / o.bq + 1), std::uint64_t(o.k)}, "n_q x k"), 8 + 48 + 28);
      plan.require_within(o.policy, "stream trace --store");
    }
    return with_store_errors([&] { return run_trace(o); });
  });
}

int cmd_stream_query(const Args& args) {
  return guarded("stream query", [&]() -> int {
    QueryOptions o;
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("sub", po::value<std::string>(), "query")
        ("store", po::value<std::string>(&o.store), "the trace store directory")
        ("reads", po::value<std::string>(&o.reads), "what token POS reads (b<N>: query block N)")
        ("readers", po::value<std::string>(&o.readers), "who reads key block BLOCK (t<S>: the key block of token S)")
        ("route", po::value<std::string>(&o.route), "routes SRC:DST, spans FIRST-LAST in tokens (SRC earlier, DST later)")
        ("summary", po::bool_switch(&o.summary), "each head's mass by distance (local / mid / far)")
        ("verify", po::bool_switch(&o.verify), "recompute the checksums and the reverse index")
        ("layer", po::value<std::string>(&o.layer)->default_value("all"), "a layer, or all")
        ("head", po::value<std::string>(&o.head)->default_value("all"), "a head, or all")
        ("top", po::value<long long>(&o.top)->default_value(20), "at most this many edges (per layer for --route, default 16)")
        ("cumulative", po::value<double>(&o.cumulative)->default_value(1.0), "keep edges until this share of the mass (--route: 0.9)")
        ("residual", po::value<double>(&o.residual)->default_value(0.5), "--route: weight of the residual stream per layer, [0, 1)")
        ("local", po::value<long long>(&o.local)->default_value(512), "--summary: local means distance < this many tokens")
        ("far", po::value<long long>(&o.far)->default_value(8192), "--summary: far means distance >= this many tokens")
        ;
    add_output_options(desc);
    po::positional_options_description pos;
    pos.add("sub", 1).add("store", 1);
    const auto vm = parse(args, desc, &pos);
    if (vm.count("help")) {
      print_help(std::cout, kQueryUsage, kQuerySummary, desc);
      return kOk;
    }
    o.output = output_format(vm);
    if (o.store.empty()) throw UsageError("missing the store directory", "flashlab stream query DIR --summary");
    return with_store_errors([&] { return run_query(o, vm); });
  });
}

}  // namespace flashlab::app
