// Host-array entries of the STREAM family (stream.hpp, stream_fast.hpp, stream_fast_estimate.hpp):
// for the tests and the CLI, over the front door's limits and launchers (front_door.cpp). Each
// validates, packs C_blk, uploads, poisons its outputs, launches, synchronises and downloads; the
// kernel-choosing entries round the inputs to the fast kernels' dtype where the choice needs it.
// The timing and the traffic measurement of the fast estimate are here too (their inputs are made
// on the device).
#include "flashlab/cuda/dtype16.hpp"
#include "flashlab/cuda/stream.hpp"
#include "flashlab/cuda/stream_fast.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"

#include "core/bench_timing.hpp"
#include "core/probe.hpp"
#include "stream/front_door.hpp"
#include "stream/stream_common.hpp"
#include "stream/stream_fast_common.hpp"
#include "stream/stream_fast_estimate_launch.hpp"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace flashlab::cuda::stream {

using ::flashlab::cuda::detail::DeviceBuffer;
using ::flashlab::cuda::detail::LaunchTimer;
using ::flashlab::cuda::detail::LaunchTimes;
using detail::StreamProblem;
using ref::stream::StreamError;

namespace detail {

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

}  // namespace detail

namespace {

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

EstimateOutput stream_estimate(const HostHeads& Q, const HostHeads& K, const ref::stream::BlockMask& mask,
                               std::size_t k) {
  check_input(Q, "Q", Q.heads);
  check_input(K, "K", Q.heads);
  if (K.dim != Q.dim) throw StreamError("Q and K must have the same head dim d ≥ 1");
  const StreamProblem p = detail::make_stream_problem(mask, Q.heads, Q.dim, Q.dim, k);
  detail::check_smem(detail::estimate_smem_bytes(p), "stream_estimate_kernel", p);
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
  run.p = detail::make_stream_problem(mask, Q.heads, Q.dim, V.dim, k);
  const StreamProblem& p = run.p;
  detail::check_smem(detail::apply_smem_bytes(p), "stream_apply_kernel", p);
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
  detail::check_smem(detail::trace_smem_bytes(p), "stream_trace_kernel", p);
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
  const StreamProblem p = detail::make_stream_problem(mask, Q.heads, Q.dim, V.dim, k);
  detail::check_smem(detail::estimate_smem_bytes(p), "stream_estimate_kernel", p);
  detail::check_smem(detail::apply_smem_bytes(p), "stream_apply_kernel", p);
  DeviceBuffer<float> dQ = upload(Q, p), dK = upload(K, p), dV = upload(V, p);
  DeviceBuffer<std::uint64_t> dmask = upload_mask(mask, p);
  const std::size_t rows = std::size_t(p.heads) * p.n_q;
  DeviceBuffer<unsigned char> work(detail::estimate_work_bytes(p));
  DeviceBuffer<long long> dI(rows * k);
  DeviceBuffer<float> dscores(rows * k), dmargins(rows), dO(std::size_t(p.T) * p.heads * p.dv);
  // The estimate, then the apply on its I; both idempotent (every output is overwritten).
  const ProbeResult measured = ::flashlab::cuda::detail::probe_kernels(
      [&] {
        detail::launch_estimate(p, dQ.get(), dK.get(), dmask.get(), work.get(), dI.get(), dscores.get(),
                                dmargins.get());
        detail::launch_apply(p, dQ.get(), dK.get(), dV.get(), dI.get(), dO.get(), nullptr, nullptr);
      },
      flush_bytes);
  const std::vector<MeasuredStreamKernel>& out = measured.kernels;
  if (indices) {
    indices->resize(rows * k);
    dI.download(reinterpret_cast<long long*>(indices->data()));
  }
  return out;
}

// ---------------------------------------------------------------------------------- fast kernels

namespace {

/// Copies of the values of `x` rounded to bf16, as bit patterns (the fast kernels' inputs).
std::vector<std::uint16_t> bf16_bits(const HostHeads& x, std::size_t T) {
  return to_bits16(x.data, T * x.heads * x.dim, ref::Dtype::bf16);
}

}  // namespace

EstimateOutput stream_estimate(StreamKernel kernel, const HostHeads& Q, const HostHeads& K,
                               const ref::stream::BlockMask& mask, std::size_t k) {
  if (kernel == StreamKernel::clear) return stream_estimate(Q, K, mask, k);
  check_input(Q, "Q", Q.heads);
  check_input(K, "K", Q.heads);
  check_fast_estimate(mask.geometry(), Q.heads, Q.dim, k);  // before rounding T·H·d values
  const std::size_t T = mask.geometry().T;
  const std::vector<std::uint16_t> q16 = bf16_bits(Q, T), k16 = bf16_bits(K, T);
  return stream_fast_estimate({q16.data(), Q.heads, Q.dim}, {k16.data(), K.heads, K.dim}, mask, k);
}

std::vector<float> stream_apply(StreamKernel kernel, const HostHeads& Q, const HostHeads& K, const HostHeads& V,
                                const ref::stream::BlockMask& mask, const std::vector<std::int64_t>& indices,
                                std::size_t k) {
  if (kernel == StreamKernel::clear) return stream_apply(Q, K, V, mask, indices, k);
  check_input(Q, "Q", Q.heads);
  check_input(K, "K", Q.heads);
  check_input(V, "V", Q.heads);
  const std::size_t T = mask.geometry().T;
  const std::vector<std::uint16_t> q16 = bf16_bits(Q, T), k16 = bf16_bits(K, T), v16 = bf16_bits(V, T);
  const std::vector<std::uint16_t> o16 = stream_fast_apply(ref::Dtype::bf16, {q16.data(), Q.heads, Q.dim},
                                                           {k16.data(), K.heads, K.dim}, {v16.data(), V.heads, V.dim},
                                                           mask, indices, k);
  return from_bits16(o16, ref::Dtype::bf16);
}

namespace {

// The fast apply's and the fast trace's host checks, in one place: the geometry (b_q = b_k =
// kFastStreamBlock), the inputs, the shape and I (validate_indices per head, under `mask`).
FastApplyShape check_fast_host_call(ref::Dtype dtype, const HostHeads16& Q, const HostHeads16& K,
                                    const HostHeads16& V, const ref::stream::BlockMask& mask,
                                    const std::vector<std::int64_t>& indices, std::size_t k, int group) {
  const ref::stream::Geometry& g = mask.geometry();
  g.check();
  if (g.bq != kFastStreamBlock || g.bk != kFastStreamBlock)
    throw StreamError("b_q = " + std::to_string(g.bq) + ", b_k = " + std::to_string(g.bk) + ": the fast apply has b_q = b_k = " +
                      std::to_string(kFastStreamBlock) + " (hint: --block-m 64 --block-n 64, or the clear kernel)");
  for (const auto& [x, name] : {std::pair{&Q, "Q"}, std::pair{&K, "K"}, std::pair{&V, "V"}}) {
    if (x->data == nullptr) throw StreamError(std::string(name) + " is missing");
    if (x->heads != Q.heads || x->dim != Q.dim)
      throw StreamError(std::string(name) + " is [T, " + std::to_string(x->heads) + ", " + std::to_string(x->dim) +
                        "], Q is [T, " + std::to_string(Q.heads) + ", " + std::to_string(Q.dim) +
                        "] (the fast apply takes d_v = d)");
  }
  const FastApplyShape shape{g.T, Q.heads, Q.dim, k, dtype, group};
  check_fast_apply(shape);
  const std::size_t per_head = g.n_q() * k;
  if (indices.size() != per_head * Q.heads)
    throw StreamError("index tensor has " + std::to_string(indices.size()) + " entries, expected H·n_q·k = " +
                      std::to_string(Q.heads) + "·" + std::to_string(g.n_q()) + "·" + std::to_string(k));
  for (std::size_t h = 0; h < Q.heads; ++h) {
    const std::vector<std::int64_t> row(indices.begin() + std::ptrdiff_t(h * per_head),
                                        indices.begin() + std::ptrdiff_t((h + 1) * per_head));
    const std::string why = ref::stream::validate_indices(row, k, mask);
    if (!why.empty()) throw StreamError("I of head " + std::to_string(h) + ": " + why);
  }
  return shape;
}

}  // namespace

std::vector<std::uint16_t> stream_fast_apply(ref::Dtype dtype, const HostHeads16& Q, const HostHeads16& K,
                                             const HostHeads16& V, const ref::stream::BlockMask& mask,
                                             const std::vector<std::int64_t>& indices, std::size_t k, int group) {
  const FastApplyShape shape = check_fast_host_call(dtype, Q, K, V, mask, indices, k, group);
  const ref::stream::Geometry& g = mask.geometry();
  const std::size_t numel = g.T * Q.heads * Q.dim;
  DeviceBuffer<std::uint16_t> dQ(numel), dK(numel), dV(numel), dO(numel);
  DeviceBuffer<long long> dI(indices.size());
  dQ.upload(Q.data);
  dK.upload(K.data);
  dV.upload(V.data);
  dI.upload(reinterpret_cast<const long long*>(indices.data()));
  dO.poison();  // 0xFFFF is a NaN in bf16 and fp16: an unwritten row fails every comparison
  stream_fast_apply_device(shape, dQ.get(), dK.get(), dV.get(), reinterpret_cast<const std::int64_t*>(dI.get()),
                           dO.get(), nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::uint16_t> O(numel);
  dO.download(O.data());
  return O;
}

std::vector<FastEdge> stream_fast_trace(ref::Dtype dtype, const HostHeads16& Q, const HostHeads16& K,
                                        const HostHeads16& V, const ref::stream::BlockMask& mask,
                                        const std::vector<std::int64_t>& indices, std::size_t k) {
  const FastApplyShape shape = check_fast_host_call(dtype, Q, K, V, mask, indices, k, 0);
  const std::size_t numel = mask.geometry().T * Q.heads * Q.dim;
  DeviceBuffer<std::uint16_t> dQ(numel), dK(numel), dV(numel);
  DeviceBuffer<long long> dI(indices.size());
  DeviceBuffer<FastEdge> dE(indices.size());
  dQ.upload(Q.data);
  dK.upload(K.data);
  dV.upload(V.data);
  dI.upload(reinterpret_cast<const long long*>(indices.data()));
  dE.poison();  // a record the kernel does not write fails every comparison
  stream_fast_trace_device(shape, dQ.get(), dK.get(), dV.get(), reinterpret_cast<const std::int64_t*>(dI.get()),
                           dE.get(), nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<FastEdge> edges(indices.size());
  dE.download(edges.data());
  return edges;
}

EstimateOutput stream_fast_estimate(const HostHeadsBf16& Q, const HostHeadsBf16& K,
                                    const ref::stream::BlockMask& mask, std::size_t k) {
  if (Q.data == nullptr || K.data == nullptr) throw StreamError("Q and K must be given");
  if (K.heads != Q.heads || K.dim != Q.dim)
    throw StreamError("K has " + std::to_string(K.heads) + " heads of dim " + std::to_string(K.dim) + ", Q has " +
                      std::to_string(Q.heads) + " of dim " + std::to_string(Q.dim) + "; they must agree");
  check_fast_estimate(mask.geometry(), Q.heads, Q.dim, k);
  const StreamProblem p = detail::describe_stream_problem(mask, Q.heads, Q.dim, Q.dim, k);
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
  const ProbeResult measured = ::flashlab::cuda::detail::probe_kernels(
      [&] {
        stream_fast_estimate_device(mask, heads, d, k, in.Q.get(), in.K.get(), nullptr, in.I.get(), in.scores.get(),
                                    in.margins.get(), nullptr);
      },
      flush_bytes);
  if (measured.kernels.size() != 1)
    throw CudaError("the probe measured " + std::to_string(measured.kernels.size()) +
                    " kernels for one launch of the fast estimate");
  return measured.kernels[0].counters;
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
  out.seq = int(T);
  out.heads = int(heads);
  out.head_dim = int(d);
  out.stream.k = int(k);
  out.stream.bq = out.stream.bk = int(kFastEstimateBlock);
  out.stream.kernel = StreamKernel::fast;
  out.reps = reps;
  out.extra_bytes = fast_estimate_extra_bytes(g, heads, k, false);
  out.stream.same_every_launch = true;
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
        out.stream.same_every_launch = out.stream.same_every_launch && now == first;
        poison_I();
      });
  out.median_ms = t.median_ms;
  out.min_ms = t.min_ms;
  out.max_ms = t.max_ms;
  out.stream.indices_checksum = ref::stream::indices_checksum(first);
  return out;
}

}  // namespace flashlab::cuda::stream
