// stream_sharded.cpp — STREAM with the sequence sharded over the GPUs of one process
// (flashlab/cuda/stream_sharded.hpp): the NCCL exchange of the key rows a causal shard needs, the
// fast kernels on each rank's query-block range, the host entry of the tests and the benchmark.
//
// One run, per rank g on its compute stream(s) and its communication stream:
//   comm:    K rows every rank needs from g, and g needs from the others: each rank's chunks
//            (one contiguous shard, or the zigzag chunks of shard_layout) to every rank whose last
//            chunk ends after them (grouped ncclSend/ncclRecv in one global order, so the pairs
//            match: ref::stream::layout_transfers); in pieces, one group per tier — tier i holds
//            the rows some rank's chunk i needs first — else one group
//   compute: per chunk, waits for the rows it needs (all K, or the tiers up to its own), then
//            the estimate of its query blocks                                        (App. A, B)
//   comm:    V rows the same way while the estimates run (NCCL: enqueued right behind K)
//   compute: waits for them, apply of the same query blocks                               (§6)
// Serial: one compute stream, the estimates in token order, then the applies. Overlap: each chunk
// on a compute stream of its own where the device's hardware queues allow (stream_of), the latest
// chunk enqueued first, so its long query blocks take the SMs first and the other chunks' blocks
// (and applies) fill the gaps a waiting or draining chunk leaves; with fewer streams than chunks,
// chunk c on stream c mod S in token order.
// copy_engines: each receiver pulls the same transfers with cudaMemcpyPeerAsync instead (no exchange
// kernel on the SMs), on one stream per source so the copies from its peers run side by side (on one
// stream they ran one after another); each group's landing joins those streams into the
// communication stream. No call depends on another rank's, so one host thread per rank enqueues
// K tier by tier, each tier's estimates behind it, then V and the applies (enqueue_pulled).
// The keys_visible scheme of the CPU model (reference/src/stream/stream_shards.cpp) for K; for V
// it sends every needed row, not only the kept blocks' (I is not known when the exchange starts,
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
#include <cmath>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <thread>

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

constexpr std::size_t kAllTiers = std::size_t(-1);

/// The work queues each device gives this process's streams: CUDA_DEVICE_MAX_CONNECTIONS as the
/// CUDA runtime reads it (1 … 32), else its default of 8.
std::size_t hardware_queues() {
  const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  if (!v || !*v) return 8;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end || n < 1 ? 8 : std::size_t(std::min(n, 32L));
}

/// Length of the union of [begin, end) intervals.
float union_ms(std::vector<std::pair<float, float>> v) {
  std::sort(v.begin(), v.end());
  float total = 0.f, lo = 0.f, hi = 0.f;
  bool open = false;
  for (const auto& [a, b] : v) {
    if (open && a <= hi) {
      hi = std::max(hi, b);
      continue;
    }
    if (open) total += hi - lo;
    lo = a;
    hi = b;
    open = true;
  }
  return open ? total + (hi - lo) : total;
}

}  // namespace

struct ShardedStream::Impl {
  ShardedStreamProblem p;
  const LocalRing* ring = nullptr;
  std::vector<std::vector<RankShard>> chunks;          // per rank, in token order
  std::vector<ref::stream::ChunkTransfer> transfers;   // one order for all ranks (layout_transfers)
  std::size_t k_groups = 1;                            // K exchange groups: one per tier with pieces, else one
  /// One rank's streams and events. compute[0] is the main compute stream (the run starts and
  /// ends on it); with overlap chunk c runs on compute[c mod compute.size()].
  struct Rank {
    std::vector<cudaStream_t> compute;
    cudaStream_t comm = nullptr;
    /// copy_engines: per source rank, the stream this rank pulls its rows on (none for itself), and
    /// the event that joins it into comm at the end of each group.
    std::vector<cudaStream_t> pull;
    std::vector<cudaEvent_t> pulled;
    cudaEvent_t start = nullptr, v_landed = nullptr;
    std::vector<cudaEvent_t> k_landed;               // after each K group
    std::vector<std::array<cudaEvent_t, 4>> chunk;   // per chunk: estimate start, end, apply start, end
    std::vector<cudaEvent_t> joined;                 // per compute stream: its last work, joined into compute[0]
  };
  std::vector<Rank> ranks;

  std::size_t row_bytes() const { return p.heads * p.dim * kElem; }
  int G() const { return int(chunks.size()); }
  bool holds(int g) const { return !chunks[std::size_t(g)].empty(); }
  /// Whether rank g receives rows of a tier ≤ `tier` (kAllTiers: any).
  bool receives(int g, std::size_t tier = kAllTiers) const {
    for (const auto& t : transfers)
      if (t.dst == std::size_t(g) && (tier == kAllTiers || t.tier <= tier)) return true;
    return false;
  }
  /// The K group whose landing chunk c of rank g waits for, or −1 when it receives nothing it needs.
  int k_group_for(int g, std::size_t c) const {
    if (!p.pieces) return receives(g) ? 0 : -1;
    return receives(g, c) ? int(c) : -1;
  }

  /// One NCCL exchange group (K or V): the transfers of `tier` (kAllTiers: every one), every rank
  /// issuing its sends and receives in the one order of `transfers`, so the pairs match.
  void exchange(const std::vector<ShardedStreamBuffers>& b, void* ShardedStreamBuffers::*field, std::size_t tier) {
    SHARDED_NCCL(ncclGroupStart(), nullptr);
    try {
      for (int g = 0; g < G(); ++g) {
        auto* c = static_cast<ncclComm_t>(ring->comm(g));
        char* base = static_cast<char*>(b[std::size_t(g)].*field);
        for (const auto& t : transfers) {
          if ((tier != kAllTiers && t.tier != tier) || (t.src != std::size_t(g) && t.dst != std::size_t(g))) continue;
          char* at = base + t.chunk.token_begin * row_bytes();
          const std::size_t n = (t.chunk.token_end - t.chunk.token_begin) * row_bytes();
          const cudaStream_t s = ranks[std::size_t(g)].comm;
          if (t.dst == std::size_t(g)) SHARDED_NCCL(ncclRecv(at, n, ncclUint8, int(t.src), c, s), c);
          else SHARDED_NCCL(ncclSend(at, n, ncclUint8, int(t.dst), c, s), c);
        }
      }
    } catch (...) {
      ncclGroupEnd();  // an open group would hang the next NCCL call
      throw;
    }
    SHARDED_NCCL(ncclGroupEnd(), nullptr);
  }

  /// copy_engines: rank g pulls the rows of `tier` (kAllTiers: every one) it receives, from each
  /// source on that source's stream, so the copies from its peers run side by side.
  void pull(int g, const std::vector<ShardedStreamBuffers>& b, void* ShardedStreamBuffers::*field, std::size_t tier) {
    const int dst = ring->device(g);
    for (const auto& t : transfers) {
      if (t.dst != std::size_t(g) || (tier != kAllTiers && t.tier != tier)) continue;
      const std::size_t at = t.chunk.token_begin * row_bytes();
      const std::size_t n = (t.chunk.token_end - t.chunk.token_begin) * row_bytes();
      // The source rows are the sender's own, which no run writes: no wait on the sender.
      FLASHLAB_CUDA_CHECK(cudaMemcpyPeerAsync(static_cast<char*>(b[t.dst].*field) + at, dst,
                                              static_cast<const char*>(b[t.src].*field) + at, ring->device(int(t.src)),
                                              n, ranks[t.dst].pull[t.src]));
    }
  }

  // Chunk c's rows of Q, O (tokens) and of I, scores (query blocks) follow the earlier chunks'.
  std::size_t token_offset(int g, std::size_t c) const {
    std::size_t t = 0;
    for (std::size_t i = 0; i < c; ++i) t += chunks[std::size_t(g)][i].token_end - chunks[std::size_t(g)][i].token_begin;
    return t * row_bytes();
  }
  std::size_t block_offset(int g, std::size_t c) const {
    std::size_t q = 0;
    for (std::size_t i = 0; i < c; ++i) q += chunks[std::size_t(g)][i].q_end - chunks[std::size_t(g)][i].q_begin;
    return p.heads * q * p.k;
  }
  /// The stream chunk c of rank g runs on: with fewer compute streams than chunks, chunk c on
  /// stream c mod S, so each stream takes its chunks in token order, the order their rows land.
  cudaStream_t stream_of(int g, std::size_t c) const {
    const auto& r = ranks[std::size_t(g)];
    return r.compute[c % r.compute.size()];
  }
  /// The order rank g's estimates are enqueued in: with a stream per chunk the latest (dearest)
  /// first, so its query blocks take the SMs first and the others fill its tail; else token order
  /// (a stream runs its chunks in the order they are enqueued).
  std::vector<std::size_t> launch_order(int g) const {
    const std::size_t n = chunks[std::size_t(g)].size();
    const bool latest_first = ranks[std::size_t(g)].compute.size() == n && n > 1;
    std::vector<std::size_t> order(n);
    for (std::size_t c = 0; c < n; ++c) order[c] = latest_first ? n - 1 - c : c;
    return order;
  }

  /// Rank g's start: the exchange writes K, V rows the previous run's kernels may still read, so it
  /// starts after them (every compute stream of the previous run was joined into compute[0]); so do
  /// the other compute streams.
  void begin(int g) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring->device(g)));
    Rank& r = ranks[std::size_t(g)];
    FLASHLAB_CUDA_CHECK(cudaEventRecord(r.start, r.compute[0]));
    FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(r.comm, r.start, 0));
    for (auto s : r.pull)
      if (s) FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(s, r.start, 0));
    for (std::size_t i = 1; i < r.compute.size(); ++i) FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(r.compute[i], r.start, 0));
  }
  /// Records `landed` on rank g's communication stream once the group enqueued last has landed:
  /// with copy engines, when every pull stream is past it. Each pull stream keeps its groups in
  /// order (K tier by tier, then V), and re-recording its one join event is safe: comm's wait took
  /// the record before it. A chunk's wait is enqueued after its group's landing is recorded (a wait
  /// on an event not yet recorded in this run would take the previous run's).
  void land(int g, cudaEvent_t landed) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring->device(g)));
    Rank& r = ranks[std::size_t(g)];
    for (std::size_t src = 0; src < r.pull.size(); ++src) {
      if (!r.pull[src]) continue;
      FLASHLAB_CUDA_CHECK(cudaEventRecord(r.pulled[src], r.pull[src]));
      FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(r.comm, r.pulled[src], 0));
    }
    FLASHLAB_CUDA_CHECK(cudaEventRecord(landed, r.comm));
  }
  /// Chunk c's estimate on rank g, after the K group it needs (a rank waits only for rows it
  /// receives: never for its own sends alone).
  void estimate(int g, std::size_t c, const ShardedStreamBuffers& b) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring->device(g)));
    Rank& r = ranks[std::size_t(g)];
    cudaStream_t st = stream_of(g, c);
    if (const int k = k_group_for(g, c); k >= 0) FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(st, r.k_landed[std::size_t(k)], 0));
    FLASHLAB_CUDA_CHECK(cudaEventRecord(r.chunk[c][0], st));
    const auto mask = causal_mask(p.T);
    if (G() == 1) {  // the single-GPU entry itself: the anchor of every comparison
      stream_fast_estimate_device(mask, p.heads, p.dim, p.k, b.Q, b.K, nullptr, b.I, b.scores, nullptr, st);
    } else {
      const RankShard& s = chunks[std::size_t(g)][c];
      stream_fast_estimate_shard_device(mask, p.heads, p.dim, p.k, {s.q_begin, s.q_end - s.q_begin},
                                        static_cast<const char*>(b.Q) + token_offset(g, c), b.K, b.I + block_offset(g, c),
                                        b.scores ? b.scores + block_offset(g, c) : nullptr, nullptr, st);
    }
    FLASHLAB_CUDA_CHECK(cudaEventRecord(r.chunk[c][1], st));
  }
  /// Rank g's applies, each after V has landed and on its chunk's stream (after its estimate), then
  /// the end of the run: the compute streams join compute[0].
  void finish(int g, const ShardedStreamBuffers& b) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring->device(g)));
    Rank& r = ranks[std::size_t(g)];
    const FastApplyShape shape{p.T, p.heads, p.dim, p.k, ref::Dtype::bf16, 1};
    if (receives(g))
      for (auto s : r.compute) FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(s, r.v_landed, 0));
    for (const std::size_t c : launch_order(g)) {
      cudaStream_t st = stream_of(g, c);
      FLASHLAB_CUDA_CHECK(cudaEventRecord(r.chunk[c][2], st));
      const RankShard& s = chunks[std::size_t(g)][c];
      const auto* I = reinterpret_cast<const std::int64_t*>(b.I + block_offset(g, c));
      if (G() == 1)
        stream_fast_apply_device(shape, b.Q, b.K, b.V, I, b.O, st);
      else
        stream_fast_apply_shard_device(shape, {s.q_begin, s.q_end - s.q_begin},
                                       static_cast<const char*>(b.Q) + token_offset(g, c), b.K, b.V, I,
                                       static_cast<char*>(b.O) + token_offset(g, c), st);
      FLASHLAB_CUDA_CHECK(cudaEventRecord(r.chunk[c][3], st));
    }
    for (std::size_t i = 1; i < r.compute.size(); ++i) {
      FLASHLAB_CUDA_CHECK(cudaEventRecord(r.joined[i], r.compute[i]));
      FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(r.compute[0], r.joined[i], 0));
    }
  }
  /// copy_engines: everything rank g does in a run, on the calling thread. K tier by tier, each
  /// tier's estimates right behind its landing (enqueuing every copy first held the first estimates
  /// back), V after the estimates, which do not need it and lose no SM to a copy; then the applies.
  void enqueue_pulled(int g, const std::vector<ShardedStreamBuffers>& b) {
    begin(g);
    const std::vector<std::size_t> order = launch_order(g);
    for (std::size_t i = 0; i < k_groups; ++i) {
      pull(g, b, &ShardedStreamBuffers::K, p.pieces ? i : kAllTiers);
      land(g, ranks[std::size_t(g)].k_landed[i]);
      for (const std::size_t c : order) {
        const int k = k_group_for(g, c);
        if (k == int(i) || (i == 0 && k < 0)) estimate(g, c, b[std::size_t(g)]);
      }
    }
    pull(g, b, &ShardedStreamBuffers::V, kAllTiers);
    land(g, ranks[std::size_t(g)].v_landed);
    finish(g, b[std::size_t(g)]);
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
  const ref::stream::Geometry geo{problem.T, kFastStreamBlock, kFastStreamBlock};
  const std::size_t G = std::size_t(ring.size());
  m.chunks = ref::stream::shard_layout(geo, G, problem.layout, problem.folds);
  if (G > 1) m.transfers = ref::stream::layout_transfers(geo, G, problem.layout, problem.folds);
  if (problem.pieces)
    for (const auto& c : m.chunks) m.k_groups = std::max(m.k_groups, c.size());
  int current = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&current));
  if (problem.copy_engines) {  // every pair both ways: without peer access a copy would stage through the host
    for (int a = 0; a < ring.size() && G > 1; ++a)
      for (int b = 0; b < ring.size(); ++b) {
        if (a == b) continue;
        int ok = 0;
        FLASHLAB_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, ring.device(a), ring.device(b)));
        if (!ok)
          throw StreamError("sharded run: GPU " + std::to_string(ring.device(a)) + " cannot reach GPU " +
                            std::to_string(ring.device(b)) + "'s memory (hint: move the rows with NCCL: copy_engines = false, on the command line --transport nccl)");
        FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(a)));
        const cudaError_t e = cudaDeviceEnablePeerAccess(ring.device(b), 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();  // enabled by an earlier run
        else FLASHLAB_CUDA_CHECK(e);
      }
  }
  for (int g = 0; g < ring.size(); ++g) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(g)));
    m.ranks.emplace_back();
    Impl::Rank& r = m.ranks.back();
    const std::size_t n_chunks = m.chunks[std::size_t(g)].size();
    // Streams beyond the device's hardware queues share one: a chunk waiting for its rows then
    // holds back the queued work of streams that need nothing (the copies, other chunks). So at
    // most as many compute streams as leave a queue to the communication and each pull stream.
    const std::size_t side = 1 + (problem.copy_engines && G > 1 ? G - 1 : 0);
    const std::size_t queues = hardware_queues();
    const std::size_t n_compute =
        problem.overlap ? std::clamp<std::size_t>(queues > side ? queues - side : 1, 1, std::max<std::size_t>(1, n_chunks)) : 1;
    int least = 0, greatest = 0;
    FLASHLAB_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    for (std::size_t i = 0; i <= n_compute; ++i) {  // the compute streams, then the communication stream
      cudaStream_t s = nullptr;
      const bool high = i == n_compute && problem.comm_priority;
      FLASHLAB_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high ? greatest : least));
      if (i < n_compute) r.compute.push_back(s);
      else r.comm = s;
    }
    auto event = [] {
      cudaEvent_t e = nullptr;
      FLASHLAB_CUDA_CHECK(cudaEventCreate(&e));
      return e;
    };
    if (problem.copy_engines && G > 1) {
      r.pull.assign(G, nullptr);
      r.pulled.assign(G, nullptr);
      for (std::size_t src = 0; src < G; ++src) {
        if (src == std::size_t(g)) continue;
        FLASHLAB_CUDA_CHECK(cudaStreamCreateWithPriority(&r.pull[src], cudaStreamNonBlocking,
                                                         problem.comm_priority ? greatest : least));
        FLASHLAB_CUDA_CHECK(cudaEventCreateWithFlags(&r.pulled[src], cudaEventDisableTiming));  // a join only
      }
    }
    r.start = event();
    r.v_landed = event();
    for (std::size_t i = 0; i < m.k_groups; ++i) r.k_landed.push_back(event());
    for (std::size_t c = 0; c < n_chunks; ++c) r.chunk.push_back({event(), event(), event(), event()});
    for (std::size_t i = 0; i < n_compute; ++i) r.joined.push_back(event());
  }
  FLASHLAB_CUDA_CHECK(cudaSetDevice(current));
}

ShardedStream::~ShardedStream() {
  Impl& m = *impl_;
  for (std::size_t g = 0; g < m.ranks.size(); ++g) {  // destructor: nothing to do with an error
    cudaSetDevice(m.ring->device(int(g)));
    Impl::Rank& r = m.ranks[g];
    for (auto s : r.compute) cudaStreamSynchronize(s);
    if (r.comm) cudaStreamSynchronize(r.comm);
    for (auto s : r.pull)
      if (s) cudaStreamSynchronize(s);
    std::vector<cudaEvent_t> events{r.start, r.v_landed};
    events.insert(events.end(), r.pulled.begin(), r.pulled.end());
    events.insert(events.end(), r.k_landed.begin(), r.k_landed.end());
    events.insert(events.end(), r.joined.begin(), r.joined.end());
    for (const auto& c : r.chunk) events.insert(events.end(), c.begin(), c.end());
    for (auto e : events)
      if (e) cudaEventDestroy(e);
    for (auto s : r.compute) cudaStreamDestroy(s);
    if (r.comm) cudaStreamDestroy(r.comm);
    for (auto s : r.pull)
      if (s) cudaStreamDestroy(s);
  }
}

const std::vector<std::vector<RankShard>>& ShardedStream::chunks() const { return impl_->chunks; }

void ShardedStream::run(const std::vector<ShardedStreamBuffers>& buffers) {
  Impl& m = *impl_;
  if (buffers.size() != m.chunks.size())
    throw StreamError("sharded run: " + std::to_string(buffers.size()) + " buffer sets for " +
                      std::to_string(m.chunks.size()) + " ranks (hint: one per rank of the ring)");
  for (std::size_t g = 0; g < buffers.size(); ++g) {
    const auto& b = buffers[g];
    if (m.holds(int(g)) && (!b.Q || !b.K || !b.V || !b.I || !b.O))
      throw StreamError("sharded run: rank " + std::to_string(g) + " lacks a Q, K, V, I or O buffer");
  }
  int current = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&current));
  const int G = m.G();
  if (m.p.copy_engines && G > 1) {
    // Each rank pulls its own rows, so no call of one rank's enqueue depends on another's: one host
    // thread per rank. On one thread the enqueue (7–30 µs a call, some 1,500 calls at 8 folds on
    // 4 GPUs) took longer than the first chunks' estimates, and the GPUs waited for the host.
    std::vector<std::exception_ptr> failed(static_cast<std::size_t>(G));
    std::vector<std::thread> threads;
    for (int g = 0; g < G; ++g)
      threads.emplace_back([&, g] {
        try {
          m.enqueue_pulled(g, buffers);
        } catch (...) {
          failed[std::size_t(g)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (const auto& e : failed)
      if (e) std::rethrow_exception(e);
  } else {
    // NCCL: one group call spans every rank, so one thread enqueues them all. V right behind K,
    // before the estimates: its kernel then comes before their blocks in launch order, so the
    // estimates, which do not need V, cannot hold it back until they drain (enqueued after four
    // or more estimate launches, it landed only as they ended).
    for (int g = 0; g < G; ++g) m.begin(g);
    for (std::size_t i = 0; i < m.k_groups; ++i) {
      if (G > 1) m.exchange(buffers, &ShardedStreamBuffers::K, m.p.pieces ? i : kAllTiers);
      for (int g = 0; g < G; ++g) m.land(g, m.ranks[std::size_t(g)].k_landed[i]);
    }
    if (G > 1) m.exchange(buffers, &ShardedStreamBuffers::V, kAllTiers);
    for (int g = 0; g < G; ++g) m.land(g, m.ranks[std::size_t(g)].v_landed);
    for (int g = 0; g < G; ++g)
      for (const std::size_t c : m.launch_order(g)) m.estimate(g, c, buffers[std::size_t(g)]);
    for (int g = 0; g < G; ++g) m.finish(g, buffers[std::size_t(g)]);
  }
  FLASHLAB_CUDA_CHECK(cudaSetDevice(current));
}

std::vector<ShardedRankTimes> ShardedStream::wait() {
  Impl& m = *impl_;
  std::vector<ShardedRankTimes> out(m.chunks.size());
  int current = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&current));
  for (std::size_t g = 0; g < out.size(); ++g) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(m.ring->device(int(g))));
    Impl::Rank& r = m.ranks[g];
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(r.comm));  // it has joined every pull stream
    for (auto s : r.compute) FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(s));
    auto at = [&](cudaEvent_t e) {
      float t = 0.f;
      FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&t, r.start, e));
      return t;
    };
    ShardedRankTimes& t = out[g];
    if (m.receives(int(g))) {
      t.k_exchange_ms = at(r.k_landed.back());
      t.v_exchange_ms = at(r.v_landed);
      for (auto e : r.k_landed) t.k_group_landed_ms.push_back(at(e));
    }
    for (const auto& c : r.chunk) t.chunk_spans.push_back({at(c[0]), at(c[1]), at(c[2]), at(c[3])});
    if (r.chunk.empty()) continue;
    std::vector<std::pair<float, float>> est, busy;
    t.first_wait_ms = at(r.chunk[0][0]);
    for (const auto& c : r.chunk) {
      est.push_back({at(c[0]), at(c[1])});
      busy.push_back(est.back());
      busy.push_back({at(c[2]), at(c[3])});
      t.first_wait_ms = std::min(t.first_wait_ms, est.back().first);
      t.total_ms = std::max(t.total_ms, busy.back().second);
    }
    t.estimate_ms = union_ms(est);
    const float busy_ms = union_ms(busy);
    t.apply_ms = std::max(0.f, busy_ms - t.estimate_ms);
    t.exposed_ms = std::max(0.f, t.total_ms - busy_ms);
  }
  FLASHLAB_CUDA_CHECK(cudaSetDevice(current));
  return out;
}

std::vector<ShardedRankBytes> sharded_bytes(const ShardedStreamProblem& p, std::size_t gpus,
                                            const std::vector<std::int64_t>& indices) {
  const ref::stream::Geometry geo{p.T, kFastStreamBlock, kFastStreamBlock};
  const std::size_t n_q = geo.n_q();
  if (indices.size() != p.heads * n_q * p.k)
    throw StreamError("sharded_bytes: I has " + std::to_string(indices.size()) + " entries, expected H·n_q·k = " +
                      std::to_string(p.heads * n_q * p.k));
  std::vector<ShardedRankBytes> out(gpus);
  const std::size_t row = p.heads * p.dim * kElem;
  if (gpus > 1) {  // K and V: every remote row before the end of the rank's last chunk
    const auto rows = ref::stream::layout_exchange_rows(geo, gpus, p.layout, p.folds);
    for (std::size_t g = 0; g < gpus; ++g) {
      out[g].received = 2 * rows[g].rows_in * row;
      out[g].sent = 2 * rows[g].rows_out * row;
    }
  }
  for (std::size_t h = 0; h < p.heads; ++h) {
    const std::vector<std::int64_t> head(indices.begin() + std::ptrdiff_t(h * n_q * p.k),
                                         indices.begin() + std::ptrdiff_t((h + 1) * n_q * p.k));
    // One head's rows of a [T, H, d] tensor are d elements per token: the model per head.
    const auto model = ref::stream::keys_visible_causal_traffic(geo, gpus, head, p.k, p.dim, kElem, p.layout, p.folds);
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

/// The buffers of a rank holding `chunks` (ShardedStreamBuffers' shapes), on the current device;
/// scores only where asked.
RankBuffers rank_buffers(const std::vector<RankShard>& chunks, const ShardedStreamProblem& p, bool scores) {
  std::size_t tokens = 0, blocks = 0, rows_end = 0;
  for (const RankShard& s : chunks) {
    tokens += s.token_end - s.token_begin;
    blocks += s.q_end - s.q_begin;
    rows_end = std::max(rows_end, s.token_end);
  }
  const std::size_t row = p.heads * p.dim;
  RankBuffers b;
  b.Q = DeviceBuffer<std::uint16_t>(tokens * row);
  b.O = DeviceBuffer<std::uint16_t>(tokens * row);
  b.K = DeviceBuffer<std::uint16_t>(rows_end * row);
  b.V = DeviceBuffer<std::uint16_t>(rows_end * row);
  b.I = DeviceBuffer<long long>(p.heads * blocks * p.k);
  if (scores) b.scores = DeviceBuffer<float>(p.heads * blocks * p.k);
  return b;
}

}  // namespace

ShardedStreamOutput stream_sharded_host(const ShardedStreamProblem& p, const LocalRing& ring, const HostHeads16& Q,
                                        const HostHeads16& K, const HostHeads16& V) {
  const std::size_t row = p.heads * p.dim;  // elements per token
  for (const HostHeads16* x : {&Q, &K, &V})
    if (x->data == nullptr || x->heads != p.heads || x->dim != p.dim)
      throw StreamError("stream_sharded_host: an input is not [T, H, d] = [" + std::to_string(p.T) + ", " +
                        std::to_string(p.heads) + ", " + std::to_string(p.dim) + "] (hint: H and d of the problem)");
  ShardedStream run(p, ring);
  const auto& chunks = run.chunks();
  const std::size_t n_q = (p.T + kFastStreamBlock - 1) / kFastStreamBlock;
  int current = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&current));
  std::vector<RankBuffers> bufs(chunks.size());
  std::vector<ShardedStreamBuffers> views(chunks.size());
  for (std::size_t g = 0; g < chunks.size(); ++g) {
    if (chunks[g].empty()) continue;
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
    RankBuffers& b = bufs[g];
    b = rank_buffers(chunks[g], p, true);
    // 0xFFFF is a bf16 NaN: a K or V row the exchange missed turns scores and outputs NaN.
    for (auto* y : {&b.K, &b.V, &b.O}) FLASHLAB_CUDA_CHECK(cudaMemset(y->get(), 0xff, y->bytes()));
    FLASHLAB_CUDA_CHECK(cudaMemset(b.I.get(), 0xff, b.I.bytes()));
    FLASHLAB_CUDA_CHECK(cudaMemset(b.scores.get(), 0xff, b.scores.bytes()));
    std::size_t q_row = 0;
    for (const RankShard& s : chunks[g]) {
      const std::size_t off = s.token_begin * row, n = (s.token_end - s.token_begin) * row;
      FLASHLAB_CUDA_CHECK(cudaMemcpy(b.Q.get() + q_row, Q.data + off, n * kElem, cudaMemcpyHostToDevice));
      FLASHLAB_CUDA_CHECK(cudaMemcpy(b.K.get() + off, K.data + off, n * kElem, cudaMemcpyHostToDevice));
      FLASHLAB_CUDA_CHECK(cudaMemcpy(b.V.get() + off, V.data + off, n * kElem, cudaMemcpyHostToDevice));
      q_row += n;
    }
    views[g] = {b.Q.get(), b.K.get(), b.V.get(), b.I.get(), b.scores.get(), b.O.get()};
  }
  for (std::size_t g = 0; g < chunks.size(); ++g) {  // the uploads are done before the exchange reads them
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  }
  run.run(views);
  run.wait();
  ShardedStreamOutput out;
  out.indices.assign(p.heads * n_q * p.k, -1);
  out.scores.assign(p.heads * n_q * p.k, 0.f);
  out.O.assign(p.T * row, 0);
  for (std::size_t g = 0; g < chunks.size(); ++g) {
    if (chunks[g].empty()) continue;
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
    const RankBuffers& b = bufs[g];
    std::vector<long long> I(b.I.size());
    std::vector<float> sc(b.scores.size());
    std::vector<std::uint16_t> O(b.O.size());
    b.I.download(I.data());
    b.scores.download(sc.data());
    b.O.download(O.data());
    std::size_t q_row = 0, i_row = 0;  // the chunk's first rows of O and of I
    for (const RankShard& s : chunks[g]) {
      const std::size_t nq = s.q_end - s.q_begin, n = (s.token_end - s.token_begin) * row;
      for (std::size_t h = 0; h < p.heads; ++h)
        for (std::size_t i = 0; i < nq * p.k; ++i) {
          out.indices[(h * n_q + s.q_begin) * p.k + i] = I[i_row + h * nq * p.k + i];
          out.scores[(h * n_q + s.q_begin) * p.k + i] = sc[i_row + h * nq * p.k + i];
        }
      std::copy(O.begin() + std::ptrdiff_t(q_row), O.begin() + std::ptrdiff_t(q_row + n),
                out.O.begin() + std::ptrdiff_t(s.token_begin * row));
      q_row += n;
      i_row += p.heads * nq * p.k;
    }
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
  const auto& chunks = run.chunks();
  const std::size_t row = p.heads * p.dim, n_q = (p.T + kFastStreamBlock - 1) / kFastStreamBlock;
  constexpr std::size_t kFlush = std::size_t(256) << 20;
  int current = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&current));
  std::vector<RankBuffers> bufs(gpus);
  std::vector<DeviceBuffer<unsigned char>> flush(gpus);
  std::vector<ShardedStreamBuffers> views(gpus);
  // The inputs of the whole sequence, each rank making its own rows: Q, K, V are the seeded
  // N(0, 1) arrays of seeds 3·seed + {0, 1, 2}, element i of a chunk's slice being element
  // token_begin·H·d + i of the whole array, so every G and layout runs on the same values.
  for (std::size_t g = 0; g < gpus; ++g) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
    flush[g] = DeviceBuffer<unsigned char>(kFlush);
    if (chunks[g].empty()) continue;
    RankBuffers& b = bufs[g];
    b = rank_buffers(chunks[g], p, false);
    // Rows the exchange fills (and any it should not need) start as NaN.
    FLASHLAB_CUDA_CHECK(cudaMemset(b.K.get(), 0xff, b.K.bytes()));
    FLASHLAB_CUDA_CHECK(cudaMemset(b.V.get(), 0xff, b.V.bytes()));
    std::size_t q_row = 0;
    for (const RankShard& s : chunks[g]) {
      const std::size_t off = s.token_begin * row, n = (s.token_end - s.token_begin) * row;
      detail::fill_normal_16bit(b.Q.get() + q_row, n, seed * 3 + 0, 1.f, true, nullptr, off);
      detail::fill_normal_16bit(b.K.get() + off, n, seed * 3 + 1, 1.f, true, nullptr, off);
      detail::fill_normal_16bit(b.V.get() + off, n, seed * 3 + 2, 1.f, true, nullptr, off);
      q_row += n;
    }
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    views[g] = {b.Q.get(), b.K.get(), b.V.get(), b.I.get(), nullptr, b.O.get()};
  }
  auto gather_I = [&] {
    std::vector<std::int64_t> I(p.heads * n_q * p.k, -1);
    for (std::size_t g = 0; g < gpus; ++g) {
      if (chunks[g].empty()) continue;
      FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
      std::vector<long long> part(bufs[g].I.size());
      bufs[g].I.download(part.data());
      std::size_t i_row = 0;
      for (const RankShard& s : chunks[g]) {
        const std::size_t nq = s.q_end - s.q_begin;
        for (std::size_t h = 0; h < p.heads; ++h)
          std::copy(part.begin() + std::ptrdiff_t(i_row + h * nq * p.k),
                    part.begin() + std::ptrdiff_t(i_row + (h + 1) * nq * p.k),
                    I.begin() + std::ptrdiff_t((h * n_q + s.q_begin) * p.k));
        i_row += p.heads * nq * p.k;
      }
    }
    return I;
  };
  ShardedBenchRow out;
  out.gpus = gpus;
  out.layout = p.layout;
  out.pieces = p.pieces;
  out.folds = p.folds;
  out.overlap = p.overlap;
  out.comm_priority = p.comm_priority;
  out.copy_engines = p.copy_engines;
  out.T = p.T;
  out.dim = p.dim;
  out.k = p.k;
  out.reps = reps;
  std::vector<double> total, est, app, exposed, first_wait;
  std::vector<std::vector<ShardedRankTimes>> per_rep;
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
    double t = 0, e = 0, a = 0, x = 0, w = 0;
    for (const auto& r : times) {
      t = std::max<double>(t, r.total_ms);
      e = std::max<double>(e, r.estimate_ms);
      a = std::max<double>(a, r.apply_ms);
      x = std::max<double>(x, r.exposed_ms);
      w = std::max<double>(w, r.first_wait_ms);
    }
    total.push_back(t);
    est.push_back(e);
    app.push_back(a);
    exposed.push_back(x);
    first_wait.push_back(w);
    per_rep.push_back(times);
    const auto I = gather_I();
    if (first.empty()) first = I;
    else if (I != first) out.same_every_launch = false;
  }
  // Each rank's estimates again without the run around them: no exchange (every row a rank needs is
  // in place from the runs), back to back on one stream in token order, L2 flushed before; first
  // rank after rank, no other GPU busy ("alone"), then every rank at once ("together"). The same
  // launches as the run's, so I must come out the same. Alone against the run's estimate is what the
  // run around them costs, together against alone what the other GPUs' work costs (power, clocks),
  // the ranks' sum alone against one GPU's what the split into query-block ranges costs.
  // [rank][chunk … , the rank's span][rep], alone; [rank][rep], together.
  std::vector<std::vector<std::vector<double>>> alone(gpus);
  std::vector<std::vector<double>> together(gpus);
  std::vector<std::vector<cudaEvent_t>> ev(gpus);
  for (std::size_t g = 0; g < gpus; ++g) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
    ev[g].resize(chunks[g].size() + 1);
    for (auto& e : ev[g]) FLASHLAB_CUDA_CHECK(cudaEventCreate(&e));
    alone[g].resize(chunks[g].empty() ? 0 : chunks[g].size() + 1);
  }
  auto launch_estimates = [&](std::size_t g) {  // on the current device (rank g's), default stream
    std::size_t q_row = 0, i_row = 0;
    FLASHLAB_CUDA_CHECK(cudaEventRecord(ev[g][0], nullptr));
    for (std::size_t c = 0; c < chunks[g].size(); ++c) {
      const RankShard& s = chunks[g][c];
      stream_fast_estimate_shard_device(causal_mask(p.T), p.heads, p.dim, p.k, {s.q_begin, s.q_end - s.q_begin},
                                        bufs[g].Q.get() + q_row, bufs[g].K.get(), bufs[g].I.get() + i_row, nullptr,
                                        nullptr, nullptr);
      FLASHLAB_CUDA_CHECK(cudaEventRecord(ev[g][c + 1], nullptr));
      q_row += (s.token_end - s.token_begin) * row;
      i_row += p.heads * (s.q_end - s.q_begin) * p.k;
    }
  };
  auto elapsed = [&](std::size_t g, std::size_t from, std::size_t to) {
    float t = 0.f;
    FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&t, ev[g][from], ev[g][to]));
    return double(t);
  };
  for (const bool at_once : {false, true})
    for (int it = 0; it < reps; ++it) {
      for (std::size_t g = 0; g < gpus; ++g) {
        FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
        FLASHLAB_CUDA_CHECK(cudaMemset(flush[g].get(), it & 0xff, kFlush));
        FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      }
      for (std::size_t g = 0; g < gpus; ++g) {
        if (chunks[g].empty()) continue;
        FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
        launch_estimates(g);
        if (!at_once) FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      }
      for (std::size_t g = 0; g < gpus; ++g) {
        if (chunks[g].empty()) continue;
        FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
        FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
        const std::size_t n = chunks[g].size();
        if (at_once) {
          together[g].push_back(elapsed(g, 0, n));
          continue;
        }
        for (std::size_t c = 0; c < n; ++c) alone[g][c].push_back(elapsed(g, c, c + 1));
        alone[g][n].push_back(elapsed(g, 0, n));
      }
    }
  for (std::size_t g = 0; g < gpus; ++g) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(int(g))));
    for (auto e : ev[g]) FLASHLAB_CUDA_CHECK(cudaEventDestroy(e));
  }
  if (gather_I() != first) out.same_every_launch = false;
  out.total_ms = ::flashlab::cuda::detail::launch_statistics(total).median_ms;
  out.estimate_ms = ::flashlab::cuda::detail::launch_statistics(est).median_ms;
  out.apply_ms = ::flashlab::cuda::detail::launch_statistics(app).median_ms;
  out.exposed_ms = ::flashlab::cuda::detail::launch_statistics(exposed).median_ms;
  out.first_wait_ms = ::flashlab::cuda::detail::launch_statistics(first_wait).median_ms;
  out.ranks.resize(gpus);
  // The run whose slowest rank's total is the median's (the nearer one of the middle two when even).
  std::size_t median_rep = 0;
  for (std::size_t i = 0; i < total.size(); ++i)
    if (std::abs(total[i] - out.total_ms) < std::abs(total[median_rep] - out.total_ms)) median_rep = i;
  for (std::size_t g = 0; g < gpus; ++g) {  // each time's median over the reps, rank by rank
    auto median = [&](float ShardedRankTimes::*field) {
      std::vector<double> v;
      for (const auto& rep : per_rep) v.push_back(rep[g].*field);
      return float(::flashlab::cuda::detail::launch_statistics(v).median_ms);
    };
    for (auto field : {&ShardedRankTimes::total_ms, &ShardedRankTimes::estimate_ms, &ShardedRankTimes::apply_ms,
                       &ShardedRankTimes::exposed_ms, &ShardedRankTimes::first_wait_ms, &ShardedRankTimes::k_exchange_ms,
                       &ShardedRankTimes::v_exchange_ms})
      out.ranks[g].*field = median(field);
    out.ranks[g].k_group_landed_ms = per_rep[median_rep][g].k_group_landed_ms;
    out.ranks[g].chunk_spans = per_rep[median_rep][g].chunk_spans;
    if (alone[g].empty()) continue;
    for (std::size_t c = 0; c + 1 < alone[g].size(); ++c)
      out.ranks[g].chunk_alone_ms.push_back(float(::flashlab::cuda::detail::launch_statistics(alone[g][c]).median_ms));
    out.ranks[g].estimate_alone_ms = float(::flashlab::cuda::detail::launch_statistics(alone[g].back()).median_ms);
    out.ranks[g].estimate_together_ms = float(::flashlab::cuda::detail::launch_statistics(together[g]).median_ms);
    out.estimate_alone_ms = std::max<double>(out.estimate_alone_ms, out.ranks[g].estimate_alone_ms);
    out.estimate_together_ms = std::max<double>(out.estimate_together_ms, out.ranks[g].estimate_together_ms);
    out.estimate_alone_sum_ms += out.ranks[g].estimate_alone_ms;
  }
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
