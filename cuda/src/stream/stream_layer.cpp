// A layer of STREAM traced to a store (stream_layer.hpp): the fast estimate and the fast trace per
// head group on two streams, the records copied in bounded chunks to a ring of pinned buffers on a
// third, and a writer thread that turns each chunk into a RowChunk and appends it to the store.
//
// Who waits for whom (g = head group, s = g mod 2 its slot):
//   estimate stream  E(g): waits for T(g − 2)            (T(g − 2) reads I slot s)
//   trace stream     T(g): waits for E(g) and C(g − 2)   (C(g − 2) reads record slot s)
//   copy stream      C(g): waits for T(g); each chunk also waits, on the host, for a free pinned
//                          buffer, and records an event the writer waits on before reading it.
//                          The last group's trace is launched chunk by chunk and each of its chunks
//                          waits only for its own launch: nothing else is left to overlap the
//                          writer's last head with, so its first chunks go to the writer while the
//                          rest are traced
//   writer thread:   pops chunks in order, appends, commits a head after its last chunk, frees
//                    the buffer
// The host enqueues E(g) and T(g) before it enqueues (and waits for buffers for) C(g − 1), so the
// GPU has the next head's estimate queued while the records of the last one drain to the disk.
// With LayerPriority::trace the trace stream has the device's greatest priority: when E(g) ends,
// T(g)'s thread blocks start before E(g + 1)'s, so each head's records reach the writer soonest.
#include "flashlab/cuda/stream_layer.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"

#include "core/common.hpp"
#include "stream/stream_fast_common.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace flashlab::cuda::stream {

using ::flashlab::cuda::detail::DeviceBuffer;
using ref::stream::StreamError;

namespace {

/// One chunk handed to the writer: records [q0, q0 + rows) of head `head` in pinned buffer `buf`.
struct ChunkJob {
  int buf = -1;  // −1: no more chunks of this layer
  std::size_t head = 0, q0 = 0, rows = 0;
  bool first = false, last = false;  // the head's first / last chunk
};

/// An owned cudaEvent_t.
class Event {
 public:
  explicit Event(bool timing) {
    FLASHLAB_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() {
    if (e_) cudaEventDestroy(e_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

/// An owned non-blocking cudaStream_t; `priority` as cudaStreamCreateWithPriority takes it (lower
/// is served first; 0 is the default).
class Stream {
 public:
  explicit Stream(int priority = 0) {
    FLASHLAB_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
  }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

/// Pinned host memory of `bytes` bytes.
class Pinned {
 public:
  explicit Pinned(std::size_t bytes) { FLASHLAB_CUDA_CHECK(cudaMallocHost(&p_, bytes)); }
  ~Pinned() {
    if (p_) cudaFreeHost(p_);
  }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  Pinned(Pinned&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

/// The CUDA priority of the trace stream (`trace`) or of the estimate stream: the greatest the
/// device offers for the stream `p` puts first, the least (the default) otherwise.
int stream_priority(LayerPriority p, bool trace) {
  int least = 0, greatest = 0;
  FLASHLAB_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const bool first = trace ? p == LayerPriority::trace : p == LayerPriority::estimate;
  return first ? greatest : least;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

FastApplyShape checked_shape(FastApplyShape shape, const LayerTraceOptions& opt, const ref::stream::BlockMask* mask) {
  if (mask != nullptr && (mask->geometry().T != shape.T || mask->geometry().bq != kFastStreamBlock ||
                          mask->geometry().bk != kFastStreamBlock))
    throw StreamError("layer pipeline: the block mask's geometry (T = " + std::to_string(mask->geometry().T) +
                      ", b_q = " + std::to_string(mask->geometry().bq) + ", b_k = " +
                      std::to_string(mask->geometry().bk) + ") is not the tracer's (T = " + std::to_string(shape.T) +
                      ", b_q = b_k = 64)");
  if (shape.dtype != ref::Dtype::bf16)
    throw StreamError("the layer pipeline takes bf16 inputs (the fast estimate's dtype), not " +
                      std::string(ref::dtype_name(shape.dtype)));
  check_fast_apply(shape);
  const ref::stream::Geometry g{shape.T, kFastStreamBlock, kFastStreamBlock};
  check_fast_estimate(g, shape.heads, shape.dim, shape.k);
  if (opt.heads_per_launch == 0 || opt.heads_per_launch > shape.heads)
    throw StreamError("heads per launch = " + std::to_string(opt.heads_per_launch) + " must be in 1.." +
                      std::to_string(shape.heads) + " (H)");
  if (opt.chunk_rows == 0) throw StreamError("chunk rows must be at least 1 (query blocks per device → host copy)");
  if (opt.host_chunks < 2)
    throw StreamError("host chunks = " + std::to_string(opt.host_chunks) +
                      " must be at least 2 (one buffer filling while the writer reads another)");
  if (opt.chunk_rows > (std::size_t(1) << 24) || opt.host_chunks > 1024)
    throw StreamError("chunk rows (≤ 2^24) or host chunks (≤ 1024) too large: the ring is meant to stay small");
  return shape;
}

}  // namespace

const char* layer_priority_name(LayerPriority p) {
  switch (p) {
    case LayerPriority::trace: return "trace";
    case LayerPriority::estimate: return "estimate";
    case LayerPriority::equal: break;
  }
  return "equal";
}

std::size_t layer_trace_device_bytes(const FastApplyShape& shape, const LayerTraceOptions& opt) {
  const std::size_t n_q = (shape.T + kFastStreamBlock - 1) / kFastStreamBlock;
  const std::size_t entries = opt.heads_per_launch * n_q * shape.k;
  return 2 * entries * (sizeof(long long) + sizeof(FastEdge));
}

struct LayerTracer::Impl {
  FastApplyShape shape;
  LayerTraceOptions opt;
  ref::stream::BlockMask mask;
  DeviceBuffer<std::uint64_t> packed_mask;  // C_blk as the estimate reads it; empty when causal only
  std::size_t n_q = 0, rows_per_chunk = 0, groups = 0;
  std::size_t first_head = 0;  // the layer's first traced head (a resumed layer starts later)
  DeviceBuffer<long long> I[2];
  DeviceBuffer<FastEdge> E[2];
  Stream est_stream, trace_stream, copy_stream;
  std::vector<Pinned> ring;
  std::vector<Event> ring_ready;        // one per pinned buffer: its copy has landed
  Event est_done[2] = {Event(false), Event(false)}, trace_done[2] = {Event(false), Event(false)},
        copied[2] = {Event(false), Event(false)};
  std::vector<Event> est_t0, est_t1, trace_t0, trace_t1;  // per group: launch times
  std::vector<Event> piece_done;        // the last group's trace, one per chunk of query blocks
  LayerTraceStats stats;

  // Shared with the writer thread.
  std::mutex mu;
  std::condition_variable cv_free, cv_jobs;
  std::vector<int> free_bufs;
  std::deque<ChunkJob> jobs;
  std::size_t in_flight = 0;
  bool failed = false;
  std::exception_ptr error;

  Impl(const FastApplyShape& s, const LayerTraceOptions& o, const ref::stream::BlockMask* m)
      : shape(checked_shape(s, o, m)),
        opt(o),
        mask(m ? *m : ref::stream::BlockMask(ref::stream::Geometry{s.T, kFastStreamBlock, kFastStreamBlock})),
        est_stream(stream_priority(o.priority, false)),
        trace_stream(stream_priority(o.priority, true)) {
    n_q = mask.geometry().n_q();
    if (mask.has_user_mask()) {
      const std::vector<std::uint64_t> packed = pack_block_mask(mask);
      packed_mask = DeviceBuffer<std::uint64_t>(packed.size());
      FLASHLAB_CUDA_CHECK(cudaMemcpy(packed_mask.get(), packed.data(), packed.size() * sizeof(std::uint64_t),
                                     cudaMemcpyHostToDevice));
    }
    rows_per_chunk = std::min(opt.chunk_rows, n_q);
    const std::size_t entries = opt.heads_per_launch * n_q * shape.k;
    for (int i = 0; i < 2; ++i) {
      I[i] = DeviceBuffer<long long>(entries);
      E[i] = DeviceBuffer<FastEdge>(entries);
    }
    const std::size_t chunk_bytes = rows_per_chunk * shape.k * sizeof(FastEdge);
    for (std::size_t b = 0; b < opt.host_chunks; ++b) {
      ring.emplace_back(chunk_bytes);
      ring_ready.emplace_back(false);
    }
    groups = (shape.heads + opt.heads_per_launch - 1) / opt.heads_per_launch;
    for (std::size_t q0 = 0; q0 < n_q; q0 += rows_per_chunk) piece_done.emplace_back(false);
    for (std::size_t g = 0; g < groups; ++g) {
      est_t0.emplace_back(true);
      est_t1.emplace_back(true);
      trace_t0.emplace_back(true);
      trace_t1.emplace_back(true);
    }
    stats.device_bytes = layer_trace_device_bytes(shape, opt) + packed_mask.bytes();
    stats.pinned_bytes = opt.host_chunks * chunk_bytes;
  }

  /// A free pinned buffer, waiting for the writer to release one; −1 when the writer failed.
  int acquire() {
    std::unique_lock<std::mutex> lock(mu);
    cv_free.wait(lock, [&] { return failed || !free_bufs.empty(); });
    if (failed) return -1;
    const int b = free_bufs.back();
    free_bufs.pop_back();
    stats.max_chunks_in_flight = std::max(stats.max_chunks_in_flight, ++in_flight);
    return b;
  }

  void push(const ChunkJob& job) {
    {
      std::lock_guard<std::mutex> lock(mu);
      jobs.push_back(job);
    }
    cv_jobs.notify_one();
  }

  /// The writer thread: chunks in order → RowChunk → the store; a head is committed after its last.
  void writer_loop(std::size_t layer, ref::stream::StoreWriter& w) {
    const std::size_t k = shape.k, cap = rows_per_chunk * k;
    const bool keep_score = w.layout().score, keep_vn = w.layout().value_norm;
    std::vector<std::int64_t> idx(cap);
    std::vector<float> mass(cap), score(keep_score ? cap : 0), vn(keep_vn ? cap : 0);
    for (;;) {
      ChunkJob job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv_jobs.wait(lock, [&] { return !jobs.empty(); });
        job = jobs.front();
        jobs.pop_front();
      }
      if (job.buf < 0) return;
      try {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (failed) continue;  // drain the queue without touching the store
        }
        FLASHLAB_CUDA_CHECK(cudaEventSynchronize(ring_ready[std::size_t(job.buf)].get()));
        const auto t0 = std::chrono::steady_clock::now();
        const auto* rec = static_cast<const FastEdge*>(ring[std::size_t(job.buf)].get());
        for (std::size_t i = 0; i < job.rows; ++i)
          for (std::size_t j = 0; j < k; ++j) {
            const FastEdge& e = rec[i * k + j];
            // The trace writes every entry of its rows in I's order; anything else is a bug upstream.
            if (e.q != std::int32_t(job.q0 + i) || e.slot != std::int32_t(j))
              throw StreamError("layer pipeline: head " + std::to_string(job.head) + " query block " +
                                std::to_string(job.q0 + i) + " slot " + std::to_string(j) + " holds the record of (" +
                                std::to_string(e.q) + ", " + std::to_string(e.slot) + ")");
            idx[i * k + j] = e.r;
            mass[i * k + j] = e.mass;
            if (keep_score) score[i * k + j] = e.score;
            if (keep_vn) vn[i * k + j] = e.value_norm;
          }
        if (job.first) w.begin_head(layer, job.head);
        w.append(ref::stream::RowChunk{job.q0, job.rows, idx.data(), mass.data(), keep_score ? score.data() : nullptr,
                                       keep_vn ? vn.data() : nullptr});
        if (job.last) {
          const auto t1 = std::chrono::steady_clock::now();
          w.end_head();
          stats.end_head_ms += ms_since(t1);
        }
        stats.writer_busy_ms += ms_since(t0);
        {
          std::lock_guard<std::mutex> lock(mu);
          free_bufs.push_back(job.buf);
          --in_flight;
        }
        cv_free.notify_one();
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu);
          failed = true;
          if (!error) error = std::current_exception();
        }
        cv_free.notify_all();
      }
    }
  }

  /// C(g): the records of group g, chunk by chunk, into the ring and on to the writer. False when
  /// the writer failed (nothing more is enqueued).
  bool drain(std::size_t g) {
    const std::size_t slot = g % 2, h0 = first_head + g * opt.heads_per_launch;
    const std::size_t count = std::min(opt.heads_per_launch, shape.heads - h0);
    const bool in_pieces = g + 1 == groups;  // launch() traced it chunk by chunk
    if (!in_pieces) FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(copy_stream.get(), trace_done[slot].get(), 0));
    for (std::size_t hh = 0; hh < count; ++hh)
      for (std::size_t q0 = 0; q0 < n_q; q0 += rows_per_chunk) {
        const std::size_t rows = std::min(rows_per_chunk, n_q - q0);
        const int b = acquire();
        if (b < 0) return false;
        if (in_pieces)
          FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(copy_stream.get(), piece_done[q0 / rows_per_chunk].get(), 0));
        const FastEdge* src = E[slot].get() + (hh * n_q + q0) * shape.k;
        FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(ring[std::size_t(b)].get(), src, rows * shape.k * sizeof(FastEdge),
                                            cudaMemcpyDeviceToHost, copy_stream.get()));
        FLASHLAB_CUDA_CHECK(cudaEventRecord(ring_ready[std::size_t(b)].get(), copy_stream.get()));
        push(ChunkJob{b, h0 + hh, q0, rows, q0 == 0, q0 + rows == n_q});
        ++stats.chunks;
      }
    FLASHLAB_CUDA_CHECK(cudaEventRecord(copied[slot].get(), copy_stream.get()));
    return true;
  }

  /// E(g) and T(g) for head group g. Without `value_norm` (a store that keeps key blocks and mass
  /// only) the trace reads no V and computes no value norms: the same key blocks and mass bits.
  void launch(std::size_t g, const void* Q, const void* K, const void* V, bool value_norm) {
    const std::size_t slot = g % 2, h0 = first_head + g * opt.heads_per_launch;
    const HeadRange range{h0, std::min(opt.heads_per_launch, shape.heads - h0)};
    if (g >= 2) FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(est_stream.get(), trace_done[slot].get(), 0));
    FLASHLAB_CUDA_CHECK(cudaEventRecord(est_t0[g].get(), est_stream.get()));
    stream_fast_estimate_device(mask, shape.heads, shape.dim, shape.k, Q, K,
                                mask.has_user_mask() ? packed_mask.get() : nullptr, I[slot].get(), nullptr, nullptr,
                                est_stream.get(), range);
    FLASHLAB_CUDA_CHECK(cudaEventRecord(est_t1[g].get(), est_stream.get()));
    FLASHLAB_CUDA_CHECK(cudaEventRecord(est_done[slot].get(), est_stream.get()));
    FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(trace_stream.get(), est_done[slot].get(), 0));
    if (g >= 2) FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(trace_stream.get(), copied[slot].get(), 0));
    FLASHLAB_CUDA_CHECK(cudaEventRecord(trace_t0[g].get(), trace_stream.get()));
    const auto* I_slot = reinterpret_cast<const std::int64_t*>(I[slot].get());
    if (g + 1 < groups) {
      stream_fast_trace_device(shape, Q, K, V, I_slot, E[slot].get(), trace_stream.get(), range, 0, 0, value_norm);
    } else {  // the last group: chunk by chunk, so that its records drain while the rest are traced
      for (std::size_t q0 = 0; q0 < n_q; q0 += rows_per_chunk) {
        stream_fast_trace_device(shape, Q, K, V, I_slot, E[slot].get(), trace_stream.get(), range, q0,
                                 std::min(rows_per_chunk, n_q - q0), value_norm);
        FLASHLAB_CUDA_CHECK(cudaEventRecord(piece_done[q0 / rows_per_chunk].get(), trace_stream.get()));
      }
    }
    FLASHLAB_CUDA_CHECK(cudaEventRecord(trace_t1[g].get(), trace_stream.get()));
    FLASHLAB_CUDA_CHECK(cudaEventRecord(trace_done[slot].get(), trace_stream.get()));
  }
};

LayerTracer::LayerTracer(const FastApplyShape& shape, const LayerTraceOptions& opt, const ref::stream::BlockMask* mask)
    : impl_(std::make_unique<Impl>(shape, opt, mask)) {}
LayerTracer::~LayerTracer() = default;

const LayerTraceStats& LayerTracer::stats() const { return impl_->stats; }

void LayerTracer::trace_layer(std::size_t layer, const void* Q, const void* K, const void* V,
                              ref::stream::StoreWriter& writer, std::size_t first_head) {
  Impl& m = *impl_;
  const auto& L = writer.layout();
  if (L.geometry.T != m.shape.T || L.geometry.bq != kFastStreamBlock || L.geometry.bk != kFastStreamBlock ||
      L.k != m.shape.k || L.heads != m.shape.heads)
    throw StreamError("layer pipeline: the store's layout (T = " + std::to_string(L.geometry.T) + ", b_q = " +
                      std::to_string(L.geometry.bq) + ", b_k = " + std::to_string(L.geometry.bk) + ", k = " +
                      std::to_string(L.k) + ", H = " + std::to_string(L.heads) + ") is not the tracer's (T = " +
                      std::to_string(m.shape.T) + ", b_q = b_k = 64, k = " + std::to_string(m.shape.k) + ", H = " +
                      std::to_string(m.shape.heads) + ")");
  if (first_head >= m.shape.heads)
    throw StreamError("layer pipeline: first head " + std::to_string(first_head) + " is outside [0, H = " +
                      std::to_string(m.shape.heads) + ")");
  if (writer.next_head() != std::pair<std::size_t, std::size_t>{layer, first_head})
    throw StreamError("layer pipeline: the store's next head is (layer " + std::to_string(writer.next_head().first) +
                      ", head " + std::to_string(writer.next_head().second) + "), not (layer " + std::to_string(layer) +
                      ", head " + std::to_string(first_head) + ")");
  if (Q == nullptr || K == nullptr || V == nullptr) throw StreamError("layer pipeline: Q, K and V must be device pointers");

  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.free_bufs.clear();
    for (int b = 0; b < int(m.ring.size()); ++b) m.free_bufs.push_back(b);
    m.jobs.clear();
    m.in_flight = 0;
    m.failed = false;
    m.error = nullptr;
  }
  m.first_head = first_head;
  m.groups = (m.shape.heads - first_head + m.opt.heads_per_launch - 1) / m.opt.heads_per_launch;
  // Work the caller queued on the default stream (the inputs) comes first: the legacy default
  // stream does not order non-blocking streams.
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  std::thread writer_thread([&] { m.writer_loop(layer, writer); });
  std::exception_ptr producer_error;
  const std::size_t groups = m.groups;
  try {
    bool ok = true;
    for (std::size_t g = 0; g < groups && ok; ++g) {
      m.launch(g, Q, K, V, writer.layout().value_norm);
      if (g >= 1) ok = m.drain(g - 1);
    }
    if (ok) m.drain(groups - 1);
  } catch (...) {
    producer_error = std::current_exception();
  }
  m.push(ChunkJob{});  // end of the layer
  writer_thread.join();
  const cudaError_t sync = cudaDeviceSynchronize();
  if (producer_error) std::rethrow_exception(producer_error);
  if (m.error) std::rethrow_exception(m.error);
  FLASHLAB_CUDA_CHECK(sync);
  for (std::size_t g = 0; g < groups; ++g) {
    float e = 0, t = 0;
    FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&e, m.est_t0[g].get(), m.est_t1[g].get()));
    FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&t, m.trace_t0[g].get(), m.trace_t1[g].get()));
    m.stats.estimate_ms += e;
    m.stats.trace_ms += t;
  }
  float span = 0;
  FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&span, m.est_t0[0].get(), m.trace_t1[groups - 1].get()));
  m.stats.gpu_span_ms += span;
  ++m.stats.layers;
}

struct LayerInputUploader::Impl {
  std::size_t T = 0, heads = 0, d = 0, capacity = 0;  // capacity: floats of one chunk
  Pinned host;
  DeviceBuffer<float> dev_f32;
  DeviceBuffer<std::uint16_t> dev_16;
  Impl(std::size_t t, std::size_t h, std::size_t dim, std::size_t cap)
      : T(t), heads(h), d(dim), capacity(cap), host(cap * sizeof(float)), dev_f32(cap), dev_16(cap) {}
};

namespace {
std::size_t uploader_capacity(std::size_t T, std::size_t heads, std::size_t d, std::size_t chunk_bytes) {
  if (T == 0 || heads == 0 || d == 0)
    throw StreamError("input upload: T, H and d must be at least 1 (T = " + std::to_string(T) + ", H = " +
                      std::to_string(heads) + ", d = " + std::to_string(d) + ")");
  if (heads > (std::size_t(1) << 16) || d > 1024)
    throw StreamError("input upload: H ≤ 65536 and d ≤ 1024 (H = " + std::to_string(heads) + ", d = " +
                      std::to_string(d) + ")");
  // At least one row of every head; never more than the whole array.
  return std::min(std::max(chunk_bytes / sizeof(float), heads * d), T * heads * d);
}
}  // namespace

LayerInputUploader::LayerInputUploader(std::size_t T, std::size_t heads, std::size_t d, std::size_t chunk_bytes)
    : impl_(std::make_unique<Impl>(T, heads, d, uploader_capacity(T, heads, d, chunk_bytes))) {}
LayerInputUploader::~LayerInputUploader() = default;

std::size_t LayerInputUploader::rows_per_chunk(std::size_t src_heads) const {
  if (src_heads == 0 || src_heads > impl_->heads)
    throw StreamError("input upload: " + std::to_string(src_heads) + " source heads, expected 1 … H = " +
                      std::to_string(impl_->heads));
  return std::min(impl_->T, impl_->capacity / (src_heads * impl_->d));
}

float* LayerInputUploader::host_chunk() const { return static_cast<float*>(impl_->host.get()); }

std::size_t LayerInputUploader::device_bytes() const { return impl_->dev_f32.bytes() + impl_->dev_16.bytes(); }

std::size_t LayerInputUploader::host_bytes() const { return impl_->capacity * sizeof(float); }

void LayerInputUploader::upload(std::size_t src_heads, std::size_t t0, std::size_t rows, HeadRange dst,
                                std::uint16_t* out) {
  Impl& m = *impl_;
  const HeadRange r = resolve_head_range(dst, m.heads);
  if (rows == 0 || rows > rows_per_chunk(src_heads) || t0 > m.T || rows > m.T - t0)
    throw StreamError("input upload: rows " + std::to_string(t0) + " + " + std::to_string(rows) + " outside [0, T = " +
                      std::to_string(m.T) + ") or above the chunk's " + std::to_string(rows_per_chunk(src_heads)));
  if (r.count % src_heads != 0)
    throw StreamError("input upload: " + std::to_string(r.count) + " destination heads are not a multiple of " +
                      std::to_string(src_heads) + " source heads");
  if (out == nullptr) throw StreamError("input upload: the destination must be a device pointer");
  const std::size_t n = rows * src_heads * m.d, group = r.count / src_heads;
  FLASHLAB_CUDA_CHECK(cudaMemcpy(m.dev_f32.get(), m.host.get(), n * sizeof(float), cudaMemcpyHostToDevice));
  detail::convert_to_16bit(m.dev_f32.get(), m.dev_16.get(), n, true);
  const std::size_t row_bytes = m.d * sizeof(std::uint16_t);
  if (src_heads == m.heads && r.count == m.heads) {  // the whole row of every head: one copy
    FLASHLAB_CUDA_CHECK(cudaMemcpy(out + t0 * m.heads * m.d, m.dev_16.get(), n * sizeof(std::uint16_t),
                                   cudaMemcpyDeviceToDevice));
  } else {
    for (std::size_t j = 0; j < r.count; ++j)
      FLASHLAB_CUDA_CHECK(cudaMemcpy2D(out + (t0 * m.heads + r.first + j) * m.d, m.heads * row_bytes,
                                       m.dev_16.get() + (j / group) * m.d, src_heads * row_bytes, row_bytes, rows,
                                       cudaMemcpyDeviceToDevice));
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

void layer_random_inputs_device(std::uint16_t* out, std::size_t n, std::uint64_t seed, std::size_t layer, int tensor,
                                std::size_t d) {
  // One stream of values per (seed, layer, tensor): a distinct odd multiplier keeps them apart.
  const std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + (3 * std::uint64_t(layer) + std::uint64_t(tensor) + 1) *
                                                            0xd1b54a32d192ed03ull;
  const float scale = tensor == 0 ? float(1.0 / std::sqrt(double(d))) : 1.0f;
  detail::fill_normal_16bit(out, n, s, scale, true, nullptr);
}

LayerTraceRun layer_trace(const FastApplyShape& shape, const LayerInputFill& fill, const LayerTraceOptions& opt,
                          ref::stream::StoreWriter& writer, const ref::stream::BlockMask* mask) {
  if (!fill) throw StreamError("layer pipeline: no input fill given");
  LayerTraceRun run;
  std::size_t free_before = 0, free_after = 0, total = 0;
  FLASHLAB_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
  LayerTracer tracer(shape, opt, mask);
  FLASHLAB_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
  run.tracer_device_bytes_measured = free_before > free_after ? free_before - free_after : 0;
  const std::size_t n = shape.T * shape.heads * shape.dim;
  DeviceBuffer<std::uint16_t> Q(n), K(n), V(n);
  // Heads a resumed layer skips are never filled: zeros, not whatever the allocator held.
  for (auto* b : {&Q, &K, &V}) FLASHLAB_CUDA_CHECK(cudaMemset(b->get(), 0, b->bytes()));
  run.qkv_bytes = Q.bytes() + K.bytes() + V.bytes();
  const std::size_t layers = writer.layout().layers;
  for (auto [l, h0] = writer.next_head(); l < layers && !writer.complete(); l = writer.next_head().first,
                                          h0 = writer.next_head().second) {
    auto t0 = std::chrono::steady_clock::now();
    fill(l, h0, Q.get(), K.get(), V.get());
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    run.inputs_ms += ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    tracer.trace_layer(l, Q.get(), K.get(), V.get(), writer, h0);
    run.layer_ms.push_back(ms_since(t0));
  }
  run.stats = tracer.stats();
  return run;
}

LayerTraceRun layer_trace_random(const FastApplyShape& shape, std::size_t layers, std::uint64_t seed,
                                 const LayerTraceOptions& opt, ref::stream::StoreWriter& writer) {
  if (layers == 0) throw StreamError("layers must be at least 1");
  if (writer.layout().layers != layers)
    throw StreamError("layer pipeline: " + std::to_string(layers) + " layers asked, the store's layout has " +
                      std::to_string(writer.layout().layers));
  if (writer.next_head() != std::pair<std::size_t, std::size_t>{0, 0})
    throw StreamError("layer pipeline: random inputs start at (layer 0, head 0), the store's next head is (layer " +
                      std::to_string(writer.next_head().first) + ", head " + std::to_string(writer.next_head().second) +
                      ")");
  return layer_trace(shape, layer_random_fill(shape, seed), opt, writer);
}

LayerInputFill layer_random_fill(const FastApplyShape& shape, std::uint64_t seed) {
  const std::size_t n = shape.T * shape.heads * shape.dim, d = shape.dim;
  return [n, d, seed](std::size_t l, std::size_t, std::uint16_t* Q, std::uint16_t* K, std::uint16_t* V) {
    layer_random_inputs_device(Q, n, seed, l, 0, d);
    layer_random_inputs_device(K, n, seed, l, 1, d);
    layer_random_inputs_device(V, n, seed, l, 2, d);
  };
}

}  // namespace flashlab::cuda::stream
