// stream_bench.cpp — the timing harness of the STREAM kernels (flashlab/cuda/stream_bench.hpp):
// the one implementation behind `flashlab bench stream`.
//
// Per shape: fill fp32 Q, K, V on the device (N(0, 1), rounded to the 16-bit dtype when the fast
// kernels are timed: stream_bench_inputs.cu), run the estimate once, untimed, for the apply's I
// (or time it) — the fast bf16 estimate for the fast bf16 kernels, else the clear one; then per
// pass warmup + reps launches, each alone between two events after a cudaMemsetAsync of the flush
// buffer (outside the event pair). The fast kernels read 16-bit copies of the same values.
#include "core/bench_timing.hpp"
#include "core/common.hpp"
#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/cuda/stream_bench.hpp"
#include "flashlab/cuda/stream_fast.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"
#include "flashlab/reference/stream.hpp"
#include "stream/stream_common.hpp"
#include "stream/stream_fast_common.hpp"

#include <stdexcept>
#include <string>

namespace flashlab::cuda {

namespace {

using detail::DeviceBuffer;
using stream::detail::StreamProblem;

void validate(const StreamBenchConfig& b) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("flashlab::cuda::bench_stream: " + what); };
  if (b.seqs.empty()) bad("no sequence lengths given");
  if (b.head_dims.empty()) bad("no head dims given");
  if (b.ks.empty()) bad("no k given");
  if (b.reps < 1) bad("reps = " + std::to_string(b.reps) + " must be >= 1");
  if (b.warmup < 0) bad("warmup = " + std::to_string(b.warmup) + " must be >= 0");
  if (b.heads < 1) bad("heads must be >= 1");
  if (b.bq < 1 || b.bk < 1) bad("b_q and b_k must be >= 1");
  for (int n : b.seqs)
    if (n < 1) bad("sequence length " + std::to_string(n) + " must be >= 1");
  for (int k : b.ks)
    if (k < 1) bad("k = " + std::to_string(k) + " must be >= 1");
  if (b.kernel == StreamKernel::fast && b.dtype != ref::Dtype::bf16 && b.dtype != ref::Dtype::fp16)
    bad("the fast kernels take bf16 or fp16 inputs");
  const bool trace = b.pass == StreamBenchPass::trace || b.pass == StreamBenchPass::trace_mass;
  if (b.kernel == StreamKernel::fast && b.pass != StreamBenchPass::apply && !trace && b.dtype != ref::Dtype::bf16)
    bad("the fast estimate takes bf16 inputs (hint: --dtype bf16, or --pass apply for the fp16 apply)");
  if (trace && b.kernel != StreamKernel::fast)
    bad("the trace pass times the fast trace (hint: --kernel fast)");
  if (b.kernel == StreamKernel::fast && (b.bq != int(stream::kFastStreamBlock) || b.bk != int(stream::kFastStreamBlock)))
    bad("the fast kernels have b_q = b_k = " + std::to_string(stream::kFastStreamBlock) + " (hint: --block-m 64 --block-n 64)");
}

/// warmup + reps launches, each alone between the events after an L2 flush; the row's times.
void time_launches(const StreamBenchConfig& bench, detail::LaunchTimer& timer, const std::function<void()>& launch,
                   StreamBenchRow& row) {
  const detail::LaunchTimes t = timer.time(bench.warmup, bench.reps, [&](int) { launch(); });
  row.reps = bench.reps;
  row.median_ms = t.median_ms;
  row.min_ms = t.min_ms;
  row.max_ms = t.max_ms;
}

/// Buffers of the clear estimate besides Q and K (causal only: no packed mask).
struct EstimateBuffers {
  DeviceBuffer<unsigned char> work;
  DeviceBuffer<float> scores, margins;
  std::size_t bytes(const DeviceBuffer<long long>& I) const {
    return work.bytes() + scores.bytes() + margins.bytes() + I.bytes();
  }
};

/// The fast apply on 16-bit copies of the same values (already rounded) and the estimate's I.
void time_fast_apply(const StreamBenchConfig& bench, const StreamProblem& p, const DeviceBuffer<float> (&qkv)[3],
                     const DeviceBuffer<long long>& I, detail::LaunchTimer& timer,
                     StreamBenchRow& row) {
  const stream::FastApplyShape shape{std::size_t(p.T), std::size_t(p.heads), std::size_t(p.d), std::size_t(p.k),
                                     bench.dtype, bench.group};
  DeviceBuffer<std::uint16_t> x16[3];
  for (int i = 0; i < 3; ++i) {
    x16[i] = DeviceBuffer<std::uint16_t>(qkv[i].size());
    stream::detail::convert_to_16bit(qkv[i].get(), x16[i].get(), qkv[i].size(), bench.dtype == ref::Dtype::bf16);
  }
  DeviceBuffer<std::uint16_t> O(qkv[2].size());
  const auto* dI = reinterpret_cast<const std::int64_t*>(I.get());
  time_launches(
      bench, timer,
      [&] { stream::stream_fast_apply_device(shape, x16[0].get(), x16[1].get(), x16[2].get(), dI, O.get()); }, row);
  row.extra_bytes = I.bytes() + stream::fast_apply_workspace_bytes(shape);
  row.stream.group = bench.group == 0 ? stream::fast_apply_default_group() : bench.group;
}

/// The fast trace on 16-bit copies of the same values and the estimate's I: the records, no O
/// (without value norms when row.stream.value_norm is false).
void time_fast_trace(const StreamBenchConfig& bench, const StreamProblem& p, const DeviceBuffer<float> (&qkv)[3],
                     const DeviceBuffer<long long>& I, detail::LaunchTimer& timer, StreamBenchRow& row) {
  const stream::FastApplyShape shape{std::size_t(p.T), std::size_t(p.heads), std::size_t(p.d), std::size_t(p.k),
                                     bench.dtype, 1};
  DeviceBuffer<std::uint16_t> x16[3];
  for (int i = 0; i < 3; ++i) {
    x16[i] = DeviceBuffer<std::uint16_t>(qkv[i].size());
    stream::detail::convert_to_16bit(qkv[i].get(), x16[i].get(), qkv[i].size(), bench.dtype == ref::Dtype::bf16);
  }
  DeviceBuffer<stream::FastEdge> edges(I.size());
  const auto* dI = reinterpret_cast<const std::int64_t*>(I.get());
  time_launches(
      bench, timer,
      [&] {
        stream::stream_fast_trace_device(shape, x16[0].get(), x16[1].get(), x16[2].get(), dI, edges.get(), nullptr, {},
                                         0, 0, row.stream.value_norm);
      },
      row);
  row.extra_bytes = I.bytes() + edges.bytes();
  row.stream.group = 1;
}

/// The fast bf16 estimate on 16-bit copies of Q and K (already rounded): timed when the pass asks,
/// else run once; either way its I is the apply's.
void time_fast_estimate(const StreamBenchConfig& bench, const StreamProblem& p, const DeviceBuffer<float> (&qkv)[3],
                        DeviceBuffer<long long>& I, detail::LaunchTimer& timer,
                        const StreamBenchRow& base, std::vector<StreamBenchRow>& rows,
                        const std::function<void(const StreamBenchRow&)>& on_row) {
  DeviceBuffer<std::uint16_t> x16[2];
  for (int i = 0; i < 2; ++i) {
    x16[i] = DeviceBuffer<std::uint16_t>(qkv[i].size());
    stream::detail::convert_to_16bit(qkv[i].get(), x16[i].get(), qkv[i].size(), true);
  }
  const ref::stream::Geometry g{std::size_t(p.T), std::size_t(p.bq), std::size_t(p.bk)};
  const ref::stream::BlockMask mask(g);
  DeviceBuffer<float> scores(I.size()), margins(std::size_t(p.heads) * p.n_q);
  auto estimate = [&] {
    stream::stream_fast_estimate_device(mask, std::size_t(p.heads), std::size_t(p.d), std::size_t(p.k), x16[0].get(),
                                        x16[1].get(), nullptr, I.get(), scores.get(), margins.get());
  };
  if (bench.pass != StreamBenchPass::apply && bench.pass != StreamBenchPass::trace &&
      bench.pass != StreamBenchPass::trace_mass) {
    StreamBenchRow row = base;
    time_launches(bench, timer, estimate, row);
    row.extra_bytes = stream::fast_estimate_extra_bytes(g, std::size_t(p.heads), std::size_t(p.k), false);
    rows.push_back(row);
    if (on_row) on_row(row);
  } else {
    estimate();
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

/// Times one shape: the estimate (timed when the pass asks, else once for I), then the apply.
void bench_shape(const StreamBenchConfig& bench, const StreamProblem& p, detail::LaunchTimer& timer,
                 std::vector<StreamBenchRow>& rows,
                 const std::function<void(const StreamBenchRow&)>& on_row) {
  StreamBenchRow base;
  base.seq = p.T;
  base.head_dim = p.d;
  base.heads = p.heads;
  base.stream.k = p.k;
  base.stream.bq = p.bq;
  base.stream.bk = p.bk;
  base.stream.kernel = bench.kernel;
  base.dtype = bench.kernel == StreamKernel::fast ? bench.dtype : ref::Dtype::fp32;
  // Q, K, V as fp32 on the device, already rounded to the fast kernels' dtype when those are timed.
  const int rounding = bench.kernel == StreamKernel::clear ? 0 : bench.dtype == ref::Dtype::bf16 ? 1 : 2;
  const std::uint64_t seed = (std::uint64_t(bench.seed) << 32) ^ (std::uint64_t(p.T) << 8) ^ std::uint64_t(p.d);
  DeviceBuffer<float> qkv[3];
  for (int i = 0; i < 3; ++i) {
    qkv[i] = DeviceBuffer<float>(std::size_t(p.T) * p.heads * (i < 2 ? p.d : p.dv));
    stream::detail::fill_normal(qkv[i].get(), qkv[i].size(), seed * 3 + std::uint64_t(i), rounding);
  }
  DeviceBuffer<long long> I(std::size_t(p.heads) * p.n_q * p.k);
  if (bench.kernel == StreamKernel::fast && bench.dtype == ref::Dtype::bf16) {
    time_fast_estimate(bench, p, qkv, I, timer, base, rows, on_row);  // I for the apply too
  } else {
    EstimateBuffers e{DeviceBuffer<unsigned char>(stream::detail::estimate_work_bytes(p)),
                      DeviceBuffer<float>(I.size()), DeviceBuffer<float>(std::size_t(p.heads) * p.n_q)};
    auto estimate = [&] {
      stream::detail::launch_estimate(p, qkv[0].get(), qkv[1].get(), nullptr, e.work.get(), I.get(), e.scores.get(),
                                      e.margins.get());
    };
    if (bench.pass != StreamBenchPass::apply && bench.pass != StreamBenchPass::trace &&
      bench.pass != StreamBenchPass::trace_mass) {
      StreamBenchRow row = base;
      time_launches(bench, timer, estimate, row);
      row.extra_bytes = e.bytes(I);
      rows.push_back(row);
      if (on_row) on_row(row);
    } else {
      estimate();  // I for the apply, untimed
    }
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  }
  if (bench.pass == StreamBenchPass::estimate) return;

  StreamBenchRow row = base;
  row.stream.trace = bench.pass == StreamBenchPass::trace || bench.pass == StreamBenchPass::trace_mass;
  row.stream.apply = !row.stream.trace;
  row.stream.value_norm = bench.pass != StreamBenchPass::trace_mass;
  if (row.stream.trace) time_fast_trace(bench, p, qkv, I, timer, row);
  else if (bench.kernel == StreamKernel::fast) time_fast_apply(bench, p, qkv, I, timer, row);
  else {
    DeviceBuffer<float> O(qkv[2].size());
    time_launches(
        bench, timer,
        [&] {
          stream::detail::launch_apply(p, qkv[0].get(), qkv[1].get(), qkv[2].get(), I.get(), O.get(), nullptr, nullptr);
        },
        row);
    row.extra_bytes = I.bytes();
  }
  rows.push_back(row);
  if (on_row) on_row(row);
}

}  // namespace

std::vector<StreamBenchRow> bench_stream(const StreamBenchConfig& bench,
                                         const std::function<void(const StreamBenchRow&)>& on_row) {
  validate(bench);
  std::string why;
  if (!device_available(&why)) throw CudaError("no usable CUDA device: " + why);
  // Every shape's parameters before any timing: a refused shape fails fast.
  std::vector<StreamProblem> shapes;
  for (int d : bench.head_dims)
    for (int k : bench.ks)
      for (int T : bench.seqs) {
        ref::stream::Geometry g{std::size_t(T), std::size_t(bench.bq), std::size_t(bench.bk)};
        if (bench.kernel == StreamKernel::fast && bench.dtype == ref::Dtype::bf16)
          stream::check_fast_estimate(g, std::size_t(bench.heads), std::size_t(d), std::size_t(k));
        shapes.push_back(stream::detail::make_stream_problem(ref::stream::BlockMask(g), std::size_t(bench.heads),
                                                             std::size_t(d), std::size_t(d), std::size_t(k)));
      }
  detail::LaunchTimer timer(bench.flush_bytes);
  std::vector<StreamBenchRow> rows;
  for (const StreamProblem& p : shapes) bench_shape(bench, p, timer, rows, on_row);
  return rows;
}

}  // namespace flashlab::cuda
