// Host API of the fast bf16 STREAM estimate (flashlab/cuda/stream_fast_estimate.hpp): its limits,
// the packed C_blk, upload, poison, launch, download. The kernel is stream_fast_estimate.cu.
#include "flashlab/cuda/stream_fast_estimate.hpp"

#include "core/bench_timing.hpp"
#include "stream/stream_fast_common.hpp"
#include "stream/stream_fast_estimate_launch.hpp"

#include <algorithm>
#include <climits>
#include <functional>
#include <cmath>
#include <string>
#include <vector>

namespace flashlab::cuda::stream {

using ::flashlab::cuda::detail::DeviceBuffer;
using ::flashlab::cuda::detail::LaunchTimer;
using ::flashlab::cuda::detail::LaunchTimes;
using detail::StreamProblem;
using ref::stream::StreamError;

void check_fast_estimate(const ref::stream::Geometry& g, std::size_t heads, std::size_t d, std::size_t k) {
  g.check();
  if (g.bq != kFastEstimateBlock || g.bk != kFastEstimateBlock)
    throw StreamError("the fast estimate takes b_q = b_k = 64 only (got b_q = " + std::to_string(g.bq) +
                      ", b_k = " + std::to_string(g.bk) + "; hint: --bq 64 --bk 64, or the clear kernel)");
  if (d != 64 && d != 128)
    throw StreamError("the fast estimate takes head dim d = 64 or 128 (got " + std::to_string(d) +
                      "; hint: the clear kernel takes d up to 256)");
  if (k == 0 || k > kFastEstimateMaxK)
    throw StreamError("the fast estimate takes 1 ≤ k ≤ " + std::to_string(kFastEstimateMaxK) + " (got " +
                      std::to_string(k) + "; hint: the clear kernel has no such limit)");
  if (heads == 0 || heads > 65535)
    throw StreamError("the fast estimate takes 1 ≤ H ≤ 65535 heads (got " + std::to_string(heads) +
                      "; one grid row per head; hint: fewer heads per call)");
  if (g.T * heads > std::size_t(INT_MAX) || g.n_q() * heads * k > std::size_t(INT_MAX))
    throw StreamError("T·H = " + std::to_string(g.T * heads) + " or n_q·H·k = " + std::to_string(g.n_q() * heads * k) +
                      " exceeds the kernel's 32-bit indices (hint: fewer heads per call)");
}

std::size_t fast_estimate_extra_bytes(const ref::stream::Geometry& g, std::size_t heads, std::size_t k,
                                      bool user_mask) {
  const std::size_t rows = heads * g.n_q();
  const std::size_t mask_words = user_mask ? g.n_q() * ((g.n_k() + 63) / 64) : 0;
  return rows * k * (sizeof(long long) + sizeof(float)) + rows * sizeof(float) + mask_words * sizeof(std::uint64_t);
}

namespace {

/// The launch description of a checked problem (the clear kernels' StreamProblem; d = d_v).
StreamProblem fast_problem(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d, std::size_t k) {
  check_fast_estimate(mask.geometry(), heads, d, k);
  return detail::describe_stream_problem(mask, heads, d, d, k);
}

}  // namespace

void stream_fast_estimate_device(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d, std::size_t k,
                                 const void* Q, const void* K, const std::uint64_t* packed_mask, long long* I,
                                 float* scores, float* margins, void* stream) {
  const StreamProblem p = fast_problem(mask, heads, d, k);
  if ((packed_mask != nullptr) != mask.has_user_mask())
    throw StreamError(mask.has_user_mask() ? "the block mask has a user part but no packed C_blk was given"
                                           : "a packed C_blk was given for a causal-only block mask");
  if (Q == nullptr || K == nullptr || I == nullptr) throw StreamError("Q, K and I must be device pointers");
  detail::launch_fast_estimate(p, Q, K, packed_mask, I, scores, margins, stream);
}

EstimateOutput stream_fast_estimate(const HostHeadsBf16& Q, const HostHeadsBf16& K,
                                    const ref::stream::BlockMask& mask, std::size_t k) {
  if (Q.data == nullptr || K.data == nullptr) throw StreamError("Q and K must be given");
  if (K.heads != Q.heads || K.dim != Q.dim)
    throw StreamError("K has " + std::to_string(K.heads) + " heads of dim " + std::to_string(K.dim) + ", Q has " +
                      std::to_string(Q.heads) + " of dim " + std::to_string(Q.dim) + "; they must agree");
  const StreamProblem p = fast_problem(mask, Q.heads, Q.dim, k);
  const std::size_t elems = std::size_t(p.T) * Q.heads * Q.dim, rows = std::size_t(p.heads) * p.n_q;
  DeviceBuffer<std::uint16_t> dQ(elems), dK(elems);
  dQ.upload(Q.data);
  dK.upload(K.data);
  const std::vector<std::uint64_t> words = pack_block_mask(mask);
  DeviceBuffer<std::uint64_t> dmask(words.size());
  dmask.upload(words.data());
  DeviceBuffer<long long> dI(rows * k);
  DeviceBuffer<float> dscores(rows * k), dmargins(rows);
  // 0x7f… is a huge block index, not the −1 of an empty entry: an entry the kernel failed to
  // write breaks the validity invariant instead of passing as empty.
  FLASHLAB_CUDA_CHECK(cudaMemset(dI.get(), 0x7f, dI.bytes()));
  dscores.poison();
  dmargins.poison();
  stream_fast_estimate_device(mask, Q.heads, Q.dim, k, dQ.get(), dK.get(), words.empty() ? nullptr : dmask.get(),
                              dI.get(), dscores.get(), dmargins.get(), nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  return detail::download_estimate(dI, dscores, dmargins, k);
}

namespace {

/// Seeded N(0, 1) bf16 Q and K made on the device (the inputs of `flashlab bench stream`,
/// stream_bench_inputs.cu), and the outputs of one launch.
struct BenchInputs {
  DeviceBuffer<std::uint16_t> Q, K;
  DeviceBuffer<long long> I;
  DeviceBuffer<float> scores, margins;
  BenchInputs(const ref::stream::Geometry& g, std::size_t heads, std::size_t d, std::size_t k, std::uint64_t seed) {
    check_fast_estimate(g, heads, d, k);
    const std::size_t elems = g.T * heads * d, rows = heads * g.n_q();
    Q = DeviceBuffer<std::uint16_t>(elems);
    K = DeviceBuffer<std::uint16_t>(elems);
    {
      DeviceBuffer<float> values(elems);  // freed before the timing
      for (int i = 0; i < 2; ++i) {
        detail::fill_normal(values.get(), elems, seed + std::uint64_t(i), 1);
        detail::convert_to_16bit(values.get(), (i == 0 ? Q : K).get(), elems, true);
      }
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    }
    I = DeviceBuffer<long long>(rows * k);
    scores = DeviceBuffer<float>(rows * k);
    margins = DeviceBuffer<float>(rows);
  }
};

}  // namespace

KernelCounters measure_fast_estimate_traffic(std::size_t T, std::size_t heads, std::size_t d, std::size_t k,
                                             std::uint64_t seed, std::size_t flush_bytes) {
  if (flush_bytes < (std::size_t(64) << 20))
    throw StreamError("an L2 flush of " + std::to_string(flush_bytes) + " bytes cannot flush a 50 MB L2 (hint: ≥ 128 MiB)");
  const ref::stream::Geometry g{T, kFastEstimateBlock, kFastEstimateBlock};
  const ref::stream::BlockMask mask(g);
  BenchInputs in(g, heads, d, k, seed);
  DeviceBuffer<unsigned char> flush(flush_bytes);
  const std::function<void()> launch = [&] {
    stream_fast_estimate_device(mask, heads, d, k, in.Q.get(), in.K.get(), nullptr, in.I.get(), in.scores.get(),
                                in.margins.get(), nullptr);
  };
  KernelCounters out;
  int salt = 0;
  // One metric per session, so that each session is one pass: the kernel runs once, after a flush.
  for (const std::string& metric : RangeProfiler::all_metrics()) {
    RangeProfiler profiler({metric});
    if (!profiler.unavailable_metrics().empty()) continue;  // the counter stays 0
    FLASHLAB_CUDA_CHECK(cudaMemset(flush.get(), ++salt & 0xff, flush.bytes()));
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<KernelCounters> ranges = profiler.profile(launch, 4);
    if (ranges.size() != 1)
      throw CudaError("CUPTI returned " + std::to_string(ranges.size()) + " ranges for one launch of the fast estimate");
    RangeProfiler::accumulate(out, ranges[0]);
    out.range_name = ranges[0].range_name;
  }
  return out;
}

FastEstimateTiming time_stream_fast_estimate(std::size_t T, std::size_t heads, std::size_t d, std::size_t k, int reps,
                                             int warmup, std::uint64_t seed, std::size_t flush_bytes) {
  if (reps < 1 || warmup < 0) throw StreamError("reps must be at least 1 and warmup at least 0");
  const ref::stream::Geometry g{T, kFastEstimateBlock, kFastEstimateBlock};
  const ref::stream::BlockMask mask(g);
  BenchInputs in(g, heads, d, k, seed);
  const std::size_t rows = heads * g.n_q();
  LaunchTimer timer(flush_bytes);
  FastEstimateTiming out;
  out.T = T;
  out.heads = heads;
  out.d = d;
  out.k = k;
  out.extra_bytes = fast_estimate_extra_bytes(g, heads, k, false);
  out.same_every_launch = true;
  std::vector<std::int64_t> first, now(rows * k);
  auto poison_I = [&] { FLASHLAB_CUDA_CHECK(cudaMemset(in.I.get(), 0x7f, in.I.bytes())); };  // not −1 (empty)
  poison_I();
  const LaunchTimes t = timer.time(
      warmup, reps,
      [&](int) {
        stream_fast_estimate_device(mask, heads, d, k, in.Q.get(), in.K.get(), nullptr, in.I.get(), in.scores.get(),
                                    in.margins.get(), nullptr);
      },
      [&](int) {  // outside the timed range: I of this launch, then poisoned for the next
        in.I.download(reinterpret_cast<long long*>(now.data()));
        if (first.empty()) first = now;
        out.same_every_launch = out.same_every_launch && now == first;
        poison_I();
      });
  out.median_ms = t.median_ms;
  out.min_ms = t.min_ms;
  out.max_ms = t.max_ms;
  out.indices_checksum = ref::stream::indices_checksum(first);
  return out;
}

}  // namespace flashlab::cuda::stream
