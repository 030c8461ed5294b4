// Host API of the clear STREAM kernels (flashlab/cuda/stream.hpp): validates parameters with the
// reference's rules and messages, packs C_blk, uploads, poisons outputs, launches, downloads.
#include "flashlab/cuda/stream.hpp"

#include "stream/stream_common.hpp"

#include <algorithm>
#include <climits>
#include <limits>
#include <string>

namespace flashlab::cuda::stream {

using ::flashlab::cuda::detail::DeviceBuffer;
using ref::stream::StreamError;
using detail::StreamProblem;

namespace {

int to_int(std::size_t v, const char* what) {
  if (v > std::size_t(INT_MAX)) throw StreamError(std::string(what) + " = " + std::to_string(v) + " exceeds the GPU kernels' 32-bit indices");
  return int(v);
}

/// The launch description for inputs of `heads` heads, head dims d / d_v, and k; throws
/// StreamError naming the parameter and the limit.
StreamProblem make_problem(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d, std::size_t dv,
                           std::size_t k) {
  const ref::stream::Geometry& g = mask.geometry();
  g.check();
  if (k == 0) throw StreamError("k must be at least 1");
  if (heads == 0) throw StreamError("heads must be at least 1");
  if (d == 0 || d > kMaxHeadDim || dv == 0 || dv > kMaxHeadDim)
    throw StreamError("head dims d = " + std::to_string(d) + ", d_v = " + std::to_string(dv) + " must be in 1.." +
                      std::to_string(kMaxHeadDim) + " (the clear kernels hold whole rows in shared memory)");
  if (g.bq > kMaxBlock || g.bk > kMaxBlock)
    throw StreamError("b_q = " + std::to_string(g.bq) + ", b_k = " + std::to_string(g.bk) + " must be at most " +
                      std::to_string(kMaxBlock) + " on the GPU (hint: --bq 64 --bk 64)");
  if (ref::stream::ceil_log2(k) + g.n_it() > 62)
    throw StreamError("k·2^n_it overflows the 64-bit branch identifiers of τ");
  to_int(g.T, "T");
  to_int(g.T * heads, "T·H");  // [T, H, d] row indices must fit the kernels' int arithmetic
  to_int(heads, "heads");
  to_int(k, "k");
  if (g.n_q() * heads * k > std::size_t(INT_MAX)) throw StreamError("n_q·H·k is too large for the GPU index tensor");
  return detail::describe_stream_problem(mask, heads, d, dv, k);
}

/// Throws StreamError when a kernel's shared memory exceeds what the device gives one block.
void check_smem(std::size_t bytes, const char* kernel, const StreamProblem& p) {
  int dev = 0, optin = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > std::size_t(optin))
    throw StreamError(std::string(kernel) + " needs " + std::to_string(bytes) + " bytes of shared memory for b_q = " +
                      std::to_string(p.bq) + ", b_k = " + std::to_string(p.bk) + ", d = " + std::to_string(p.d) +
                      ", d_v = " + std::to_string(p.dv) + "; the device allows " + std::to_string(optin) +
                      " (hint: smaller blocks)");
}

void check_input(const HostHeads& x, const char* name, std::size_t heads) {
  if (x.data == nullptr) throw StreamError(std::string(name) + " is missing");
  if (x.heads != heads)
    throw StreamError(std::string(name) + " has " + std::to_string(x.heads) + " heads, Q has " + std::to_string(heads));
}

DeviceBuffer<float> upload(const HostHeads& x, const StreamProblem& p) {
  DeviceBuffer<float> d(std::size_t(p.T) * x.heads * x.dim);
  d.upload(x.data);
  return d;
}

/// C_blk packed as the kernels read it: n_q rows of words_per_row words, causality ANDed in.
DeviceBuffer<std::uint64_t> upload_mask(const ref::stream::BlockMask& mask, const StreamProblem& p) {
  if (p.words_per_row == 0) return {};
  const std::vector<std::uint64_t> words = pack_block_mask(mask);
  DeviceBuffer<std::uint64_t> d(words.size());
  d.upload(words.data());
  return d;
}

/// The reference's check of I before application: every entry −1 or a valid block of its row.
DeviceBuffer<long long> upload_indices(const std::vector<std::int64_t>& indices, const ref::stream::BlockMask& mask,
                                       const StreamProblem& p) {
  const std::size_t rows = std::size_t(p.heads) * p.n_q;
  if (indices.size() != rows * p.k)
    throw StreamError("index tensor has " + std::to_string(indices.size()) + " entries, expected H·n_q·k = " +
                      std::to_string(p.heads) + "·" + std::to_string(p.n_q) + "·" + std::to_string(p.k));
  for (std::size_t row = 0; row < rows; ++row) {
    const std::size_t q = row % std::size_t(p.n_q);
    for (int j = 0; j < p.k; ++j) {
      const std::int64_t r = indices[row * p.k + j];
      if (r == -1) continue;
      if (r < -1 || r >= p.n_k || !mask.valid(q, std::size_t(r)))
        throw StreamError("I[" + std::to_string(row / p.n_q) + ", " + std::to_string(q) + ", " + std::to_string(j) +
                          "] = " + std::to_string(r) + " is not a valid key block for query block " +
                          std::to_string(q) + " under C_blk");
    }
  }
  static_assert(sizeof(long long) == sizeof(std::int64_t));
  DeviceBuffer<long long> d(indices.size());
  d.upload(reinterpret_cast<const long long*>(indices.data()));
  return d;
}

}  // namespace

namespace detail {

StreamProblem describe_stream_problem(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d,
                                      std::size_t dv, std::size_t k) {
  const ref::stream::Geometry& g = mask.geometry();
  StreamProblem p;
  p.T = int(g.T);
  p.bq = int(g.bq);
  p.bk = int(g.bk);
  p.n_q = int(g.n_q());
  p.n_k = int(g.n_k());
  p.n_it = int(g.n_it());
  p.heads = int(heads);
  p.d = int(d);
  p.dv = int(dv);
  p.k = int(k);
  p.words_per_row = mask.has_user_mask() ? int((g.n_k() + 63) / 64) : 0;
  return p;
}

EstimateOutput download_estimate(const DeviceBuffer<long long>& I, const DeviceBuffer<float>& scores,
                                 const DeviceBuffer<float>& margins, std::size_t k) {
  EstimateOutput out;
  out.k = k;
  out.indices.resize(I.size());
  out.scores.resize(scores.size());
  out.margins.resize(margins.size());
  static_assert(sizeof(long long) == sizeof(std::int64_t));
  I.download(reinterpret_cast<long long*>(out.indices.data()));
  scores.download(out.scores.data());
  margins.download(out.margins.data());
  return out;
}

StreamProblem make_stream_problem(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d, std::size_t dv,
                                  std::size_t k) {
  return make_problem(mask, heads, d, dv, k);
}
}  // namespace detail

std::vector<std::uint64_t> pack_block_mask(const ref::stream::BlockMask& mask) {
  if (!mask.has_user_mask()) return {};
  const ref::stream::Geometry& g = mask.geometry();
  const std::size_t words_per_row = (g.n_k() + 63) / 64;
  std::vector<std::uint64_t> words(g.n_q() * words_per_row, 0);
  for (std::size_t q = 0; q < g.n_q(); ++q)
    for (std::size_t r = 0; r <= mask.causal_last(q); ++r)
      if (mask.valid(q, r)) words[q * words_per_row + r / 64] |= 1ull << (r % 64);
  return words;
}

EstimateOutput stream_estimate(const HostHeads& Q, const HostHeads& K, const ref::stream::BlockMask& mask,
                               std::size_t k) {
  check_input(Q, "Q", Q.heads);
  check_input(K, "K", Q.heads);
  if (K.dim != Q.dim) throw StreamError("Q and K must have the same head dim d ≥ 1");
  const StreamProblem p = make_problem(mask, Q.heads, Q.dim, Q.dim, k);
  check_smem(detail::estimate_smem_bytes(p), "stream_estimate_kernel", p);
  DeviceBuffer<float> dQ = upload(Q, p), dK = upload(K, p);
  DeviceBuffer<std::uint64_t> dmask = upload_mask(mask, p);
  const std::size_t rows = std::size_t(p.heads) * p.n_q;
  DeviceBuffer<unsigned char> work(detail::estimate_work_bytes(p));
  DeviceBuffer<long long> dI(rows * k);
  DeviceBuffer<float> dscores(rows * k), dmargins(rows);
  dI.poison();
  dscores.poison();
  dmargins.poison();
  work.poison();
  detail::launch_estimate(p, dQ.get(), dK.get(), dmask.get(), work.get(), dI.get(), dscores.get(), dmargins.get());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  return detail::download_estimate(dI, dscores, dmargins, k);
}

namespace {

/// Uploads everything the application needs, runs it; row statistics only when wanted.
struct ApplyRun {
  StreamProblem p;
  DeviceBuffer<float> Q, K, V, O, mu, lam;
  DeviceBuffer<long long> I;
};

ApplyRun run_apply(const HostHeads& Q, const HostHeads& K, const HostHeads& V, const ref::stream::BlockMask& mask,
                   const std::vector<std::int64_t>& indices, std::size_t k, bool keep_stats) {
  check_input(Q, "Q", Q.heads);
  check_input(K, "K", Q.heads);
  check_input(V, "V", Q.heads);
  if (K.dim != Q.dim) throw StreamError("Q and K must share the head dim d ≥ 1, and V must have d_v ≥ 1 columns");
  ApplyRun run;
  run.p = make_problem(mask, Q.heads, Q.dim, V.dim, k);
  const StreamProblem& p = run.p;
  check_smem(detail::apply_smem_bytes(p), "stream_apply_kernel", p);
  run.I = upload_indices(indices, mask, p);
  run.Q = upload(Q, p);
  run.K = upload(K, p);
  run.V = upload(V, p);
  run.O = DeviceBuffer<float>(std::size_t(p.T) * p.heads * p.dv);
  run.O.poison();
  if (keep_stats) {
    run.mu = DeviceBuffer<float>(std::size_t(p.T) * p.heads);
    run.lam = DeviceBuffer<float>(std::size_t(p.T) * p.heads);
    run.mu.poison();
    run.lam.poison();
  }
  detail::launch_apply(p, run.Q.get(), run.K.get(), run.V.get(), run.I.get(), run.O.get(), run.mu.get(),
                       run.lam.get());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  return run;
}

}  // namespace

std::vector<float> stream_apply(const HostHeads& Q, const HostHeads& K, const HostHeads& V,
                                const ref::stream::BlockMask& mask, const std::vector<std::int64_t>& indices,
                                std::size_t k) {
  const ApplyRun run = run_apply(Q, K, V, mask, indices, k, false);
  std::vector<float> O(run.O.size());
  run.O.download(O.data());
  return O;
}

std::vector<float> stream_trace(const HostHeads& Q, const HostHeads& K, const HostHeads& V,
                                const ref::stream::BlockMask& mask, const std::vector<std::int64_t>& indices,
                                std::size_t k, std::size_t chunk_query_blocks,
                                const std::function<void(const std::vector<HeadEdge>&)>& sink) {
  if (chunk_query_blocks == 0) throw StreamError("the trace chunk must hold at least one query block");
  const ApplyRun run = run_apply(Q, K, V, mask, indices, k, true);
  const StreamProblem& p = run.p;
  check_smem(detail::trace_smem_bytes(p), "stream_trace_kernel", p);
  const int chunk = int(std::min<std::size_t>(chunk_query_blocks, std::size_t(p.n_q)));
  // The only record storage on the device: one chunk of H·chunk·k records.
  DeviceBuffer<detail::EdgeRecord> records(std::size_t(p.heads) * chunk * p.k);
  std::vector<detail::EdgeRecord> host(records.size());
  std::vector<HeadEdge> batch;
  for (int q0 = 0; q0 < p.n_q; q0 += chunk) {
    const int count = std::min(chunk, p.n_q - q0);
    records.poison();
    detail::launch_trace(p, q0, count, run.Q.get(), run.K.get(), run.V.get(), run.I.get(), run.mu.get(),
                         run.lam.get(), records.get());
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    records.download(host.data());
    batch.clear();
    for (int h = 0; h < p.heads; ++h)
      for (std::size_t i = 0; i < std::size_t(count) * p.k; ++i) {
        const detail::EdgeRecord& e = host[std::size_t(h) * count * p.k + i];
        if (e.r < 0) continue;  // empty slot of I
        batch.push_back(HeadEdge{std::size_t(h), ref::stream::Edge{e.q, e.r, e.slot, e.score, e.mass, e.value_norm}});
      }
    sink(batch);
  }
  std::vector<float> O(run.O.size());
  run.O.download(O.data());
  return O;
}

std::vector<MeasuredStreamKernel> measure_stream_traffic(const HostHeads& Q, const HostHeads& K, const HostHeads& V,
                                                         const ref::stream::BlockMask& mask, std::size_t k,
                                                         std::vector<std::int64_t>* indices, std::size_t flush_bytes) {
  if (flush_bytes < (std::size_t(64) << 20))
    throw StreamError("an L2 flush of " + std::to_string(flush_bytes) + " bytes cannot flush a 50 MB L2 (hint: ≥ 128 MiB)");
  check_input(Q, "Q", Q.heads);
  check_input(K, "K", Q.heads);
  check_input(V, "V", Q.heads);
  if (K.dim != Q.dim) throw StreamError("Q and K must have the same head dim d ≥ 1");
  const StreamProblem p = make_problem(mask, Q.heads, Q.dim, V.dim, k);
  check_smem(detail::estimate_smem_bytes(p), "stream_estimate_kernel", p);
  check_smem(detail::apply_smem_bytes(p), "stream_apply_kernel", p);
  DeviceBuffer<float> dQ = upload(Q, p), dK = upload(K, p), dV = upload(V, p);
  DeviceBuffer<std::uint64_t> dmask = upload_mask(mask, p);
  const std::size_t rows = std::size_t(p.heads) * p.n_q;
  DeviceBuffer<unsigned char> work(detail::estimate_work_bytes(p));
  DeviceBuffer<long long> dI(rows * k);
  DeviceBuffer<float> dscores(rows * k), dmargins(rows), dO(std::size_t(p.T) * p.heads * p.dv);
  DeviceBuffer<unsigned char> flush(flush_bytes);
  const std::function<void()> launches[] = {
      [&] { detail::launch_estimate(p, dQ.get(), dK.get(), dmask.get(), work.get(), dI.get(), dscores.get(), dmargins.get()); },
      [&] { detail::launch_apply(p, dQ.get(), dK.get(), dV.get(), dI.get(), dO.get(), nullptr, nullptr); }};
  std::vector<MeasuredStreamKernel> out{{"stream_estimate_kernel", {}}, {"stream_apply_kernel", {}}};
  launches[0]();  // I for the apply's sessions (the estimate is idempotent: every output is overwritten)
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  // One metric per session so that each session is one pass: the kernel runs once, after a flush.
  for (const std::string& metric : RangeProfiler::all_metrics()) {
    RangeProfiler profiler({metric});
    if (!profiler.unavailable_metrics().empty()) continue;  // the counter stays 0
    for (std::size_t i = 0; i < out.size(); ++i) {
      FLASHLAB_CUDA_CHECK(cudaMemset(flush.get(), int(i + 1), flush.bytes()));
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<KernelCounters> ranges = profiler.profile(launches[i], 4);
      if (ranges.size() != 1)
        throw CudaError("CUPTI returned " + std::to_string(ranges.size()) + " ranges for one launch of " + out[i].kernel);
      RangeProfiler::accumulate(out[i].counters, ranges[0]);
    }
  }
  if (indices) {
    indices->resize(rows * k);
    dI.download(reinterpret_cast<long long*>(indices->data()));
  }
  return out;
}

}  // namespace flashlab::cuda::stream
