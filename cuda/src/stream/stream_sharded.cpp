// stream_sharded.cpp — STREAM with the sequence sharded over the GPUs of one process
// (flashlab/cuda/stream_sharded.hpp): the NCCL exchange of the key rows a causal shard needs, the
// fast kernels on each rank's query-block range, the host entry of the tests and the benchmark.
//
// One run, per rank g on its own compute stream and communication stream:
//   comm:    K rows of every earlier rank → K[0, token_begin_g)   (grouped ncclSend/ncclRecv; g
//            sends its own rows to every later rank that holds query blocks)
//   compute: waits for them (g > 0), estimate of q_begin_g … q_end_g − 1         (App. A, B)
//   comm:    V rows the same way, while the estimate runs
//   compute: waits for them (g > 0), apply of the same query blocks                      (§6)
// The keys_visible scheme of the CPU model (reference/src/stream/stream_shards.cpp) for K; for V
// it sends every earlier row, not only the kept blocks' (I is not known when the exchange starts,
// so the V exchange overlaps the estimate instead of waiting for it): the benchmark reports both.
#include "flashlab/cuda/stream_sharded.hpp"

#include "core/bench_timing.hpp"
#include "core/common.hpp"
#include "flashlab/cuda/context_parallel.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"
#include "stream/stream_fast_common.hpp"

#include <nccl.h>

#include <algorithm>
#include <array>
#include <sstream>
#include <string>

namespace flashlab::cuda::stream {

using ::flashlab::cuda::detail::DeviceBuffer;
using ref::stream::RankShard;
using ref::stream::StreamError;

namespace {

[[noreturn]] void throw_nccl(ncclResult_t r, ncclComm_t comm, const char* expr, int line) {
  std::ostringstream os;
  os << "NCCL error in " << expr << ": " << ncclGetErrorString(r);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) os << " (" << last << ")";
  os << " at " << __FILE__ << ":" << line;
  throw CudaError(os.str());
}

#define SHARDED_NCCL(expr, comm)                                        \
  do {                                                                  \
    const ncclResult_t sharded_nccl_ = (expr);                          \
    if (sharded_nccl_ != ncclSuccess) throw_nccl(sharded_nccl_, comm, #expr, __LINE__); \
  } while (0)

constexpr std::size_t kElem = 2;  // bf16 on the links and in HBM

ref::stream::BlockMask causal_mask(std::size_t T) {
  return ref::stream::BlockMask(ref::stream::Geometry{T, kFastStreamBlock, kFastStreamBlock});
}

bool holds_queries(const RankShard& s) { return s.q_end > s.q_begin; }

}  // namespace

struct ShardedStream::Impl {
  ShardedStreamProblem p;
  const LocalRing* ring = nullptr;
  std::vector<RankShard> shards;
  std::vector<cudaStream_t> compute, comm;
  // Per rank: start, K landed, estimate start/end, V landed, apply start/end.
  enum { kStart, kK, kE0, kE1, kV, kA0, kA1, kEvents };
  std::vector<std::array<cudaEvent_t, kEvents>> events;

  std::size_t row_bytes() const { return p.heads * p.dim * kElem; }
  int G() const { return int(shards.size()); }

  /// One exchange (K or V) over every rank: buffers[g].*field, rows of each sender's shard.
  void exchange(const std::vector<ShardedStreamBuffers>& b, void* ShardedStreamBuffers::*field) {
    SHARDED_NCCL(ncclGroupStart(), nullptr);
    try {
      for (int g = 0; g < G(); ++g) {
        auto* c = static_cast<ncclComm_t>(ring->comm(g));
        char* base = static_cast<char*>(b[std::size_t(g)].*field);
        const RankShard& me = shards[std::size_t(g)];
        for (int src = 0; src < g && holds_queries(me); ++src) {
          const RankShard& s = shards[std::size_t(src)];
          if (s.token_end == s.token_begin) continue;
          SHARDED_NCCL(ncclRecv(base + s.token_begin * row_bytes(), (s.token_end - s.token_begin) * row_bytes(), ncclUint8,
                                src, c, comm[std::size_t(g)]),
                       c);
        }
        for (int dst = g + 1; dst < G() && me.token_end > me.token_begin; ++dst) {
          if (!holds_queries(shards[std::size_t(dst)])) continue;
          SHARDED_NCCL(ncclSend(base + me.token_begin * row_bytes(), (me.token_end - me.token_begin) * row_bytes(),
                                ncclUint8, dst, c, comm[std::size_t(g)]),
                       c);
        }
      }
    } catch (...) {
      ncclGroupEnd();  // an open group would hang the next NCCL call
      throw;
    }
    SHARDED_NCCL(ncclGroupEnd(), nullptr);
  }
};

ShardedStream::ShardedStream(const ShardedStreamProblem& problem, const LocalRing& ring) : impl_(new Impl) {
  Impl& m = *impl_;
  m.p = problem;
  m.ring = &ring;
  const auto mask = causal_mask(problem.T);
  check_fast_estimate(mask.geometry(), problem.heads, problem.dim, problem.k);
  FastApplyShape shape{problem.T, problem.heads, problem.dim, problem.k, ref::Dtype::bf16, 1};
  check_fast_apply(shape);
  m.shards = fast_stream_shards(problem.T, std::size_t(ring.size()));
  int current = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&current));
  for (int g = 0; g < ring.size(); ++g) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(g)));
    cudaStream_t s = nullptr, x = nullptr;
    FLASHLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    m.compute.push_back(s);
    FLASHLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
    m.comm.push_back(x);
    std::array<cudaEvent_t, Impl::kEvents> ev{};
    for (auto& e : ev) FLASHLAB_CUDA_CHECK(cudaEventCreate(&e));
    m.events.push_back(ev);
  }
  FLASHLAB_CUDA_CHECK(cudaSetDevice(current));
}

ShardedStream::~ShardedStream() {
  Impl& m = *impl_;
  for (std::size_t g = 0; g < m.compute.size(); ++g) {  // destructor: nothing to do with an error
    cudaSetDevice(m.ring->device(int(g)));
    cudaStreamSynchronize(m.compute[g]);
    cudaStreamSynchronize(m.comm[g]);
    for (auto e : m.events[g]) cudaEventDestroy(e);
    cudaStreamDestroy(m.compute[g]);
    cudaStreamDestroy(m.comm[g]);
  }
}

const std::vector<RankShard>& ShardedStream::shards() const { return impl_->shards; }

void ShardedStream::run(const std::vector<ShardedStreamBuffers>& buffers) {
  Impl& m = *impl_;
  if (buffers.size() != m.shards.size())
    throw StreamError("sharded run: " + std::to_string(buffers.size()) + " buffer sets for " +
                      std::to_string(m.shards.size()) + " ranks (hint: one per rank of the ring)");
  for (std::size_t g = 0; g < buffers.size(); ++g) {
    const auto& b = buffers[g];
    if (holds_queries(m.shards[g]) && (!b.Q || !b.K || !b.V || !b.I || !b.O))
      throw StreamError("sharded run: rank " + std::to_string(g) + " lacks a Q, K, V, I or O buffer");
  }
  const auto mask = causal_mask(m.p.T);
  const FastApplyShape shape{m.p.T, m.p.heads, m.p.dim, m.p.k, ref::Dtype::bf16, 1};
  int current = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&current));
  const int G = m.G();
  for (int g = 0; g < G; ++g) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(m.ring->device(g)));
    FLASHLAB_CUDA_CHECK(cudaEventRecord(m.events[std::size_t(g)][Impl::kStart], m.compute[std::size_t(g)]));
    // The exchange writes K, V rows the previous run's kernels may still read: it starts after them.
    FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(m.comm[std::size_t(g)], m.events[std::size_t(g)][Impl::kStart], 0));
  }
  if (G > 1) m.exchange(buffers, &ShardedStreamBuffers::K);
  auto kernels_after = [&](int g, int landed, int before, int after, const auto& launch) {
    const auto gi = std::size_t(g);
    auto& ev = m.events[gi];
    FLASHLAB_CUDA_CHECK(cudaEventRecord(ev[std::size_t(landed)], m.comm[gi]));
    // Rank 0 receives nothing: its kernels never wait for its own sends.
    if (g > 0) FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(m.compute[gi], ev[std::size_t(landed)], 0));
    FLASHLAB_CUDA_CHECK(cudaEventRecord(ev[std::size_t(before)], m.compute[gi]));
    if (holds_queries(m.shards[gi])) launch(g);
    FLASHLAB_CUDA_CHECK(cudaEventRecord(ev[std::size_t(after)], m.compute[gi]));
  };
  for (int g = 0; g < G; ++g) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(m.ring->device(g)));
    kernels_after(g, Impl::kK, Impl::kE0, Impl::kE1, [&](int r) {
      const RankShard& s = m.shards[std::size_t(r)];
      const ShardedStreamBuffers& b = buffers[std::size_t(r)];
      if (G == 1)  // the single-GPU entry itself: the anchor of every comparison
        stream_fast_estimate_device(mask, m.p.heads, m.p.dim, m.p.k, b.Q, b.K, nullptr, b.I, b.scores, nullptr,
                                    m.compute[0]);
      else
        stream_fast_estimate_shard_device(mask, m.p.heads, m.p.dim, m.p.k, {s.q_begin, s.q_end - s.q_begin}, b.Q, b.K,
                                          b.I, b.scores, nullptr, m.compute[std::size_t(r)]);
    });
  }
  if (G > 1) m.exchange(buffers, &ShardedStreamBuffers::V);
  for (int g = 0; g < G; ++g) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(m.ring->device(g)));
    kernels_after(g, Impl::kV, Impl::kA0, Impl::kA1, [&](int r) {
      const RankShard& s = m.shards[std::size_t(r)];
      const ShardedStreamBuffers& b = buffers[std::size_t(r)];
      const auto* I = reinterpret_cast<const std::int64_t*>(b.I);
      if (G == 1)
        stream_fast_apply_device(shape, b.Q, b.K, b.V, I, b.O, m.compute[0]);
      else
        stream_fast_apply_shard_device(shape, {s.q_begin, s.q_end - s.q_begin}, b.Q, b.K, b.V, I, b.O,
                                       m.compute[std::size_t(r)]);
    });
  }
  FLASHLAB_CUDA_CHECK(cudaSetDevice(current));
}

std::vector<ShardedRankTimes> ShardedStream::wait() {
  Impl& m = *impl_;
  std::vector<ShardedRankTimes> out(m.shards.size());
  int current = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&current));
  for (std::size_t g = 0; g < out.size(); ++g) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(m.ring->device(int(g))));
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(m.comm[g]));
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(m.compute[g]));
    const auto& ev = m.events[g];
    auto ms = [&](int a, int b) {
      float t = 0.f;
      FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&t, ev[std::size_t(a)], ev[std::size_t(b)]));
      return t;
    };
    ShardedRankTimes& t = out[g];
    t.total_ms = ms(Impl::kStart, Impl::kA1);
    t.estimate_ms = ms(Impl::kE0, Impl::kE1);
    t.apply_ms = ms(Impl::kA0, Impl::kA1);
    t.exposed_ms = std::max(0.f, t.total_ms - t.estimate_ms - t.apply_ms);
    t.k_exchange_ms = g > 0 ? ms(Impl::kStart, Impl::kK) : 0.f;
  }
  FLASHLAB_CUDA_CHECK(cudaSetDevice(current));
  return out;
}

std::vector<ShardedRankBytes> sharded_bytes(const ShardedStreamProblem& p, std::size_t gpus,
                                            const std::vector<std::int64_t>& indices) {
  const ref::stream::Geometry geo{p.T, kFastStreamBlock, kFastStreamBlock};
  const auto shards = ref::stream::shard_sequence(geo, gpus);
  const std::size_t n_q = geo.n_q();
  if (indices.size() != p.heads * n_q * p.k)
    throw StreamError("sharded_bytes: I has " + std::to_string(indices.size()) + " entries, expected H·n_q·k = " +
                      std::to_string(p.heads * n_q * p.k));
  std::vector<ShardedRankBytes> out(gpus);
  const std::size_t row = p.heads * p.dim * kElem;
  for (std::size_t g = 0; g < gpus && gpus > 1; ++g)
    for (std::size_t s = 0; s < gpus; ++s) {
      const RankShard &me = shards[g], &o = shards[s];
      if (s < g && holds_queries(me)) out[g].received += 2 * (o.token_end - o.token_begin) * row;
      if (s > g && holds_queries(o)) out[g].sent += 2 * (me.token_end - me.token_begin) * row;
    }
  for (std::size_t h = 0; h < p.heads; ++h) {
    const std::vector<std::int64_t> head(indices.begin() + std::ptrdiff_t(h * n_q * p.k),
                                         indices.begin() + std::ptrdiff_t((h + 1) * n_q * p.k));
    // One head's rows of a [T, H, d] tensor are d elements per token: the model per head.
    const auto model = ref::stream::keys_visible_causal_traffic(geo, gpus, head, p.k, p.dim, kElem);
    for (std::size_t g = 0; g < gpus; ++g) {
      out[g].model_sent += model[g].estimate_out + model[g].apply_out;
      out[g].model_received += model[g].estimate_in + model[g].apply_in;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------- host entry

namespace {

/// One rank's device buffers (on its GPU).
struct RankBuffers {
  DeviceBuffer<std::uint16_t> Q, K, V, O;
  DeviceBuffer<long long> I;
  DeviceBuffer<float> scores;
};

}  // namespace

ShardedStreamOutput stream_sharded_host(const ShardedStreamProblem& p, const LocalRing& ring, const HostHeads16& Q,
                                        const HostHeads16& K, const HostHeads16& V) {
  const std::size_t row = p.heads * p.dim;  // elements per token
  for (const HostHeads16* x : {&Q, &K, &V})
    if (x->data == nullptr || x->heads != p.heads || x->dim != p.dim)
      throw StreamError("stream_sharded_host: an input is not [T, H, d] = [" + std::to_string(p.T) + ", " +
                        std::to_string(p.heads) + ", " + std::to_string(p.dim) + "] (hint: H and d of the problem)");
  ShardedStream run(p, ring);
  const auto& shards = run.shards();
  const std::size_t n_q = (p.T + kFastStreamBlock - 1) / kFastStreamBlock;
  int current = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&current));
  std::vector<RankBuffers> bufs(shards.size());
  std::vector<ShardedStreamBuffers> views(shards.size());
  for (std::size_t g = 0; g < shards.size(); ++g) {
    const RankShard& s = shards[g];
    if (!holds_queries(s)) continue;
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
    RankBuffers& b = bufs[g];
    const std::size_t rows = s.token_end - s.token_begin, nq = s.q_end - s.q_begin;
    b.Q = DeviceBuffer<std::uint16_t>(rows * row);
    b.O = DeviceBuffer<std::uint16_t>(rows * row);
    b.K = DeviceBuffer<std::uint16_t>(s.token_end * row);
    b.V = DeviceBuffer<std::uint16_t>(s.token_end * row);
    b.I = DeviceBuffer<long long>(p.heads * nq * p.k);
    b.scores = DeviceBuffer<float>(p.heads * nq * p.k);
    // 0xFFFF is a bf16 NaN: a K or V row the exchange missed turns scores and outputs NaN.
    for (auto* x : {&b.K, &b.V, &b.O}) FLASHLAB_CUDA_CHECK(cudaMemset(x->get(), 0xff, x->bytes()));
    FLASHLAB_CUDA_CHECK(cudaMemset(b.I.get(), 0xff, b.I.bytes()));
    FLASHLAB_CUDA_CHECK(cudaMemset(b.scores.get(), 0xff, b.scores.bytes()));
    const std::size_t off = s.token_begin * row, n = rows * row;
    FLASHLAB_CUDA_CHECK(cudaMemcpy(b.Q.get(), Q.data + off, n * kElem, cudaMemcpyHostToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(b.K.get() + off, K.data + off, n * kElem, cudaMemcpyHostToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(b.V.get() + off, V.data + off, n * kElem, cudaMemcpyHostToDevice));
    views[g] = {b.Q.get(), b.K.get(), b.V.get(), b.I.get(), b.scores.get(), b.O.get()};
  }
  for (std::size_t g = 0; g < shards.size(); ++g) {  // the uploads are done before the exchange reads them
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  }
  run.run(views);
  run.wait();
  ShardedStreamOutput out;
  out.indices.assign(p.heads * n_q * p.k, -1);
  out.scores.assign(p.heads * n_q * p.k, 0.f);
  out.O.assign(p.T * row, 0);
  for (std::size_t g = 0; g < shards.size(); ++g) {
    const RankShard& s = shards[g];
    if (!holds_queries(s)) continue;
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
    const RankBuffers& b = bufs[g];
    const std::size_t nq = s.q_end - s.q_begin, rows = s.token_end - s.token_begin;
    std::vector<long long> I(b.I.size());
    std::vector<float> sc(b.scores.size());
    b.I.download(I.data());
    b.scores.download(sc.data());
    for (std::size_t h = 0; h < p.heads; ++h)
      for (std::size_t i = 0; i < nq * p.k; ++i) {
        out.indices[(h * n_q + s.q_begin) * p.k + i] = I[h * nq * p.k + i];
        out.scores[(h * n_q + s.q_begin) * p.k + i] = sc[h * nq * p.k + i];
      }
    FLASHLAB_CUDA_CHECK(cudaMemcpy(out.O.data() + s.token_begin * row, b.O.get(), rows * row * kElem,
                                   cudaMemcpyDeviceToHost));
  }
  bufs.clear();
  FLASHLAB_CUDA_CHECK(cudaSetDevice(current));
  return out;
}

// ---------------------------------------------------------------------------------- benchmark

ShardedBenchRow bench_stream_sharded(const ShardedStreamProblem& p, const LocalRing& ring, int reps, int warmup,
                                     std::uint64_t seed) {
  if (reps < 1 || warmup < 0) throw StreamError("bench: reps must be ≥ 1 and warmup ≥ 0");
  const std::size_t gpus = std::size_t(ring.size());
  ShardedStream run(p, ring);
  const auto& shards = run.shards();
  const std::size_t row = p.heads * p.dim, n_q = (p.T + kFastStreamBlock - 1) / kFastStreamBlock;
  constexpr std::size_t kFlush = std::size_t(256) << 20;
  int current = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&current));
  std::vector<RankBuffers> bufs(gpus);
  std::vector<DeviceBuffer<unsigned char>> flush(gpus);
  std::vector<ShardedStreamBuffers> views(gpus);
  // The inputs of the whole sequence, each rank making its own rows: Q, K, V are the seeded
  // N(0, 1) arrays of seeds 3·seed + {0, 1, 2}, element i of a rank's slice being element
  // token_begin·H·d + i of the whole array, so every G runs on the same values.
  for (std::size_t g = 0; g < gpus; ++g) {
    const RankShard& s = shards[g];
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
    flush[g] = DeviceBuffer<unsigned char>(kFlush);
    if (!holds_queries(s)) continue;
    RankBuffers& b = bufs[g];
    const std::size_t rows = s.token_end - s.token_begin, nq = s.q_end - s.q_begin, off = s.token_begin * row;
    b.Q = DeviceBuffer<std::uint16_t>(rows * row);
    b.O = DeviceBuffer<std::uint16_t>(rows * row);
    b.K = DeviceBuffer<std::uint16_t>(s.token_end * row);
    b.V = DeviceBuffer<std::uint16_t>(s.token_end * row);
    b.I = DeviceBuffer<long long>(p.heads * nq * p.k);
    FLASHLAB_CUDA_CHECK(cudaMemset(b.K.get(), 0xff, off * kElem));  // filled only by the exchange
    FLASHLAB_CUDA_CHECK(cudaMemset(b.V.get(), 0xff, off * kElem));
    detail::fill_normal_16bit(b.Q.get(), rows * row, seed * 3 + 0, 1.f, true, nullptr, off);
    detail::fill_normal_16bit(b.K.get() + off, rows * row, seed * 3 + 1, 1.f, true, nullptr, off);
    detail::fill_normal_16bit(b.V.get() + off, rows * row, seed * 3 + 2, 1.f, true, nullptr, off);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    views[g] = {b.Q.get(), b.K.get(), b.V.get(), b.I.get(), nullptr, b.O.get()};
  }
  auto gather_I = [&] {
    std::vector<std::int64_t> I(p.heads * n_q * p.k, -1);
    for (std::size_t g = 0; g < gpus; ++g) {
      const RankShard& s = shards[g];
      if (!holds_queries(s)) continue;
      FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
      const std::size_t nq = s.q_end - s.q_begin;
      std::vector<long long> part(bufs[g].I.size());
      bufs[g].I.download(part.data());
      for (std::size_t h = 0; h < p.heads; ++h)
        std::copy(part.begin() + std::ptrdiff_t(h * nq * p.k), part.begin() + std::ptrdiff_t((h + 1) * nq * p.k),
                  I.begin() + std::ptrdiff_t((h * n_q + s.q_begin) * p.k));
    }
    return I;
  };
  ShardedBenchRow out;
  out.gpus = gpus;
  out.T = p.T;
  out.dim = p.dim;
  out.k = p.k;
  out.reps = reps;
  std::vector<double> total, est, app, exposed;
  std::vector<std::int64_t> first;
  for (int it = 0; it < warmup + reps; ++it) {
    for (std::size_t g = 0; g < gpus; ++g) {  // flush every L2, outside the timed range
      FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
      FLASHLAB_CUDA_CHECK(cudaMemset(flush[g].get(), it & 0xff, kFlush));
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    }
    run.run(views);
    const auto times = run.wait();
    if (it < warmup) continue;
    double t = 0, e = 0, a = 0, x = 0;
    for (const auto& r : times) {
      t = std::max<double>(t, r.total_ms);
      e = std::max<double>(e, r.estimate_ms);
      a = std::max<double>(a, r.apply_ms);
      x = std::max<double>(x, r.exposed_ms);
    }
    total.push_back(t);
    est.push_back(e);
    app.push_back(a);
    exposed.push_back(x);
    const auto I = gather_I();
    if (first.empty()) first = I;
    else if (I != first) out.same_every_launch = false;
  }
  out.total_ms = ::flashlab::cuda::detail::launch_statistics(total).median_ms;
  out.estimate_ms = ::flashlab::cuda::detail::launch_statistics(est).median_ms;
  out.apply_ms = ::flashlab::cuda::detail::launch_statistics(app).median_ms;
  out.exposed_ms = ::flashlab::cuda::detail::launch_statistics(exposed).median_ms;
  out.indices_checksum = ref::stream::indices_checksum(first);
  for (const auto& b : sharded_bytes(p, gpus, first)) {
    out.sent_max = std::max(out.sent_max, b.sent);
    out.received_max = std::max(out.received_max, b.received);
    out.model_sent_max = std::max(out.model_sent_max, b.model_sent);
    out.model_received_max = std::max(out.model_received_max, b.model_received);
  }
  for (std::size_t g = 0; g < gpus; ++g) {  // free each rank's buffers on its own device
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
    bufs[g] = RankBuffers{};
    flush[g] = DeviceBuffer<unsigned char>{};
  }
  FLASHLAB_CUDA_CHECK(cudaSetDevice(current));
  return out;
}

}  // namespace flashlab::cuda::stream
