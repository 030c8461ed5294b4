// The ring's timing harness (flashlab/cuda/context_parallel.hpp, bench_context_parallel): seeded
// inputs made on each GPU where they are used, warm-ups, timed runs with a timed RingTrace, and
// the single-GPU fast kernels on the same inputs for the scaling figures.
//
// Method. A run's time is the slowest rank's whole ring, from its first to its last event on its
// compute stream (the ring synchronises the ranks through NCCL, so a rank that starts early waits
// for the others inside its time); the median over --reps runs is reported, and the fastest and
// slowest. The single-GPU time is the median of the fast forward (or backward) on the whole
// problem on the device of rank 0, timed alone with CUDA events. No L2 flush: at the lengths the
// ring is for, a block's K/V (tens of MB) do not stay in L2 anyway.
#include "flashlab/cuda/context_parallel.hpp"

#include "attention/context_parallel_kernels.hpp"
#include "core/common.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

namespace flashlab::cuda {

namespace {

constexpr unsigned long long kSeedQ = 101, kSeedK = 102, kSeedV = 103, kSeedDO = 104;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One rank's tensors (local layout) and scratch.
struct RankMemory {
  int device = 0;
  cudaStream_t stream = nullptr;
  detail::DeviceBuffer<std::uint16_t> Q, K, V, O, dO, dQ, dK, dV;
  detail::DeviceBuffer<float> LSE;
  detail::DeviceBuffer<unsigned char> ws_forward, ws_backward;
  RankMemory() = default;
  RankMemory(const RankMemory&) = delete;
  RankMemory& operator=(const RankMemory&) = delete;
  ~RankMemory() {
    if (stream) {
      cudaSetDevice(device);
      cudaStreamDestroy(stream);
    }
  }
};

// Fills a rank's chunks of a global tensor of `heads` heads (K/V heads: group 1).
void fill_local(const ref::ContextParallelProblem& p, std::uint16_t* dst, std::size_t rank, std::size_t heads,
                unsigned long long seed, cudaStream_t stream) {
  const auto& a = p.attention;
  const std::size_t c = p.chunk_len(), chunk = a.batch * c * heads * a.head_dim;
  for (std::size_t slot = 0; slot < p.chunks_per_rank(); ++slot)
    detail::fill_rows_random(a.dtype == ref::Dtype::bf16, dst + slot * chunk, a.batch, c, heads, 1, a.head_dim,
                             p.chunk_of(rank, slot) * c, a.seq, seed, 1.f, stream);
}

double pass_flops(const ref::ContextParallelProblem& p, ref::RingPass pass) {
  const auto& a = p.attention;
  const double n = double(a.seq);
  double f = 4.0 * double(a.batch) * double(a.heads) * double(a.head_dim) * n * n;
  if (a.causal) f /= 2;
  return pass == ref::RingPass::forward ? f : 2.5 * f;
}

// Times `launch` (a whole ring on every rank) as the file comment says.
template <typename Launch>
RingBenchPass time_ring(const ref::ContextParallelProblem& p, ref::RingPass pass, const RingBenchConfig& cfg,
                        std::vector<std::unique_ptr<RankMemory>>& ranks, Launch launch) {
  auto sync = [&] {
    for (auto& r : ranks) {
      FLASHLAB_CUDA_CHECK(cudaSetDevice(r->device));
      FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(r->stream));
    }
  };
  for (int w = 0; w < cfg.warmups; ++w) {
    launch(nullptr);
    sync();
  }
  std::vector<double> totals;
  std::unique_ptr<RingTrace> last;
  for (int rep = 0; rep < std::max(cfg.reps, 1); ++rep) {
    auto trace = std::make_unique<RingTrace>(true);
    launch(trace.get());
    sync();
    const auto per_rank = trace->total_ms();
    totals.push_back(*std::max_element(per_rank.begin(), per_rank.end()));
    last = std::move(trace);
  }
  RingBenchPass out;
  out.pass = pass;
  out.ring_ms = median(totals);
  out.ring_min_ms = *std::min_element(totals.begin(), totals.end());
  out.ring_max_ms = *std::max_element(totals.begin(), totals.end());
  out.flops = pass_flops(p, pass);
  for (std::size_t s = 0; s < ref::ring_steps(p, pass); ++s) out.model_bytes += ref::ring_link_bytes(p, pass, s).total();
  std::vector<std::uint64_t> sent(p.gpus, 0);
  for (const auto& row : last->steps()) sent[row.rank] += row.sent.total();
  out.counted_bytes = *std::max_element(sent.begin(), sent.end());
  out.counted_equals_model = ref::counted_equals_model(p, pass, last->steps());
  const auto per_rank = last->total_ms();
  const std::size_t slowest = std::size_t(std::max_element(per_rank.begin(), per_rank.end()) - per_rank.begin());
  double compute_of_slowest = 0;
  for (const auto& t : last->times()) {
    out.exchange_ms_max = std::max(out.exchange_ms_max, double(t.exchange_ms));
    out.compute_ms_max = std::max(out.compute_ms_max, double(t.compute_ms));
    if (t.rank == slowest) compute_of_slowest += t.compute_ms;
  }
  out.exposed_ms = std::max(0.0, double(per_rank[slowest]) - compute_of_slowest);
  return out;
}

// One GPU's fast kernels on the whole problem (grouped K/V as the ring holds them), median ms of
// forward and backward; {−1, −1} when it does not fit one launch or the device's free memory.
std::pair<double, double> time_single(const RingBenchConfig& cfg, int device) {
  const ref::ContextParallelProblem& p = cfg.problem;
  ref::AttentionProblem g = p.attention;
  g.seq_k = 0;
  g.heads_kv = p.group() > 1 ? p.kv_heads() : 0;
  const std::size_t numel = g.batch * g.seq * g.heads * g.head_dim;
  const std::size_t kv_numel = g.batch * g.seq * g.h_kv() * g.head_dim;
  if (numel >= (std::size_t(1) << 31)) return {-1, -1};
  FLASHLAB_CUDA_CHECK(cudaSetDevice(device));
  const std::size_t ws_bytes = fast_attention_backward_workspace_bytes(ref::Algorithm::bwd_atomic, g);
  std::size_t free = 0, total = 0;
  FLASHLAB_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  if ((4 * numel + 4 * kv_numel) * 2 + ws_bytes + g.batch * g.heads * g.seq * 4 > free * 9 / 10) return {-1, -1};
  detail::DeviceBuffer<std::uint16_t> Q(numel), K(kv_numel), V(kv_numel), O(numel), dO(numel), dQ(numel), dK(kv_numel),
      dV(kv_numel);
  detail::DeviceBuffer<float> LSE(g.batch * g.heads * g.seq);
  detail::DeviceBuffer<unsigned char> ws(ws_bytes);
  cudaStream_t stream = nullptr;
  FLASHLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t begin = nullptr, end = nullptr;
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&begin));
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&end));
  struct Release {
    cudaStream_t s;
    cudaEvent_t a, b;
    ~Release() {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
      cudaStreamDestroy(s);
    }
  } release{stream, begin, end};
  const bool bf16 = g.dtype == ref::Dtype::bf16;
  detail::fill_rows_random(bf16, Q.get(), g.batch, g.seq, g.heads, 1, g.head_dim, 0, g.seq, kSeedQ, 1.f, stream);
  detail::fill_rows_random(bf16, K.get(), g.batch, g.seq, g.h_kv(), 1, g.head_dim, 0, g.seq, kSeedK, 1.f, stream);
  detail::fill_rows_random(bf16, V.get(), g.batch, g.seq, g.h_kv(), 1, g.head_dim, 0, g.seq, kSeedV, 1.f, stream);
  detail::fill_rows_random(bf16, dO.get(), g.batch, g.seq, g.heads, 1, g.head_dim, 0, g.seq, kSeedDO, 1.f, stream);
  auto timed = [&](auto run) {
    for (int w = 0; w < cfg.warmups; ++w) run();
    std::vector<double> ms;
    for (int rep = 0; rep < std::max(cfg.reps, 1); ++rep) {
      FLASHLAB_CUDA_CHECK(cudaEventRecord(begin, stream));
      run();
      FLASHLAB_CUDA_CHECK(cudaEventRecord(end, stream));
      FLASHLAB_CUDA_CHECK(cudaEventSynchronize(end));
      float t = 0;
      FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&t, begin, end));
      ms.push_back(t);
    }
    return median(ms);
  };
  auto forward = [&] {
    fast_attention_forward_device(g, cfg.forward_kernel, Q.get(), K.get(), V.get(), O.get(), LSE.get(), stream);
  };
  double f = -1, b = -1;
  if (cfg.forward) f = timed(forward);
  if (cfg.backward) {
    forward();  // O and LSE for the backward
    b = timed([&] {
      fast_attention_backward_device(ref::Algorithm::bwd_atomic, g, Q.get(), K.get(), V.get(), O.get(), dO.get(),
                                     LSE.get(), dQ.get(), dK.get(), dV.get(), ws.get(), stream, cfg.backward_kernel);
    });
  }
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  return {f, b};
}

}  // namespace

std::vector<RingBenchPass> bench_context_parallel(const RingBenchConfig& cfg, const LocalRing& ring) {
  const ref::ContextParallelProblem& p = cfg.problem;
  check_context_parallel_problem(p);
  if (std::size_t(ring.size()) != p.gpus)
    throw std::invalid_argument("flashlab::cuda: bench_context_parallel: the ring has " + std::to_string(ring.size()) +
                                " GPUs, the problem G = " + std::to_string(p.gpus));
  int previous = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&previous));
  const auto& a = p.attention;
  const std::size_t c = p.chunk_len(), slots = p.chunks_per_rank();
  const std::size_t q_local = slots * a.batch * c * a.heads * a.head_dim;
  const std::size_t kv_local = slots * a.batch * c * p.kv_heads() * a.head_dim;
  std::vector<RingBenchPass> out;
  {
    std::vector<std::unique_ptr<RankMemory>> ranks;
    for (int r = 0; r < ring.size(); ++r) {
      auto m = std::make_unique<RankMemory>();
      m->device = ring.device(r);
      FLASHLAB_CUDA_CHECK(cudaSetDevice(m->device));
      FLASHLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
      m->Q = detail::DeviceBuffer<std::uint16_t>(q_local);
      m->K = detail::DeviceBuffer<std::uint16_t>(kv_local);
      m->V = detail::DeviceBuffer<std::uint16_t>(kv_local);
      m->O = detail::DeviceBuffer<std::uint16_t>(q_local);
      m->LSE = detail::DeviceBuffer<float>(slots * a.batch * a.heads * c);
      if (cfg.forward || cfg.backward)
        m->ws_forward = detail::DeviceBuffer<unsigned char>(context_parallel_forward_workspace_bytes(p));
      if (cfg.backward) {
        m->dO = detail::DeviceBuffer<std::uint16_t>(q_local);
        m->dQ = detail::DeviceBuffer<std::uint16_t>(q_local);
        m->dK = detail::DeviceBuffer<std::uint16_t>(kv_local);
        m->dV = detail::DeviceBuffer<std::uint16_t>(kv_local);
        m->ws_backward =
            detail::DeviceBuffer<unsigned char>(context_parallel_backward_workspace_bytes(p, cfg.backward_kernel));
        fill_local(p, m->dO.get(), std::size_t(r), a.heads, kSeedDO, m->stream);
      }
      fill_local(p, m->Q.get(), std::size_t(r), a.heads, kSeedQ, m->stream);
      fill_local(p, m->K.get(), std::size_t(r), p.kv_heads(), kSeedK, m->stream);
      fill_local(p, m->V.get(), std::size_t(r), p.kv_heads(), kSeedV, m->stream);
      ranks.push_back(std::move(m));
    }
    std::vector<RingRank<RingForwardBuffers>> fwd;
    std::vector<RingRank<RingBackwardBuffers>> bwd;
    for (int r = 0; r < ring.size(); ++r) {
      RankMemory& m = *ranks[std::size_t(r)];
      fwd.push_back({m.device, ring.comm(r), {m.Q.get(), m.K.get(), m.V.get(), m.O.get(), m.LSE.get()},
                     m.ws_forward.get(), m.stream});
      bwd.push_back({m.device, ring.comm(r),
                     {m.Q.get(), m.K.get(), m.V.get(), m.O.get(), m.dO.get(), m.LSE.get(), m.dQ.get(), m.dK.get(),
                      m.dV.get()},
                     m.ws_backward.get(), m.stream});
    }
    auto forward = [&](RingTrace* t) { context_parallel_forward_local(p, fwd, cfg.forward_kernel, t); };
    if (cfg.forward) out.push_back(time_ring(p, ref::RingPass::forward, cfg, ranks, forward));
    if (cfg.backward) {
      forward(nullptr);  // O and LSE for the backward
      out.push_back(time_ring(p, ref::RingPass::backward, cfg, ranks,
                              [&](RingTrace* t) { context_parallel_backward_local(p, bwd, cfg.backward_kernel, t); }));
    }
  }  // the ring's memory is freed before the single-GPU run
  if (cfg.single) {
    const auto [f, b] = time_single(cfg, ring.device(0));
    for (auto& pass : out) pass.single_ms = pass.pass == ref::RingPass::forward ? f : b;
  }
  FLASHLAB_CUDA_CHECK(cudaSetDevice(previous));
  return out;
}

}  // namespace flashlab::cuda
