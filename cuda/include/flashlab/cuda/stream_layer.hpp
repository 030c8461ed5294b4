/// @file stream_layer.hpp
/// @brief A whole layer of STREAM traced to a trace store: the fast bf16 estimate and the fast
/// trace launched head by head (or a few heads at a time) on two CUDA streams, the records copied
/// to pinned host memory in bounded chunks while the next head's estimate runs, and a writer
/// thread appending them to a ref::stream::StoreWriter, so the GPU never waits on the disk.
///
/// The pipeline (cuda/src/stream/stream_layer.cpp; docs/stream.md, "A layer to the store"):
///
///     estimate stream:  E(0) E(1) E(2) …            I of head group g → I slot g mod 2
///     trace stream:          T(0) T(1) T(2) …       records of group g → record slot g mod 2
///     copy stream:                C(0) C(1) …       record slot → pinned chunk buffers (a ring)
///     writer thread:                 W(0) W(1) …    chunk → StoreWriter::append; end_head commits
///
/// E(g + 2) waits for T(g) (it reuses T(g)'s I slot), T(g + 2) for C(g) (its record slot); a chunk
/// copy waits on the host for a free pinned buffer, which the writer frees once the chunk is in
/// the store. Device memory besides Q, K, V: two I slots and two record slots of one head group;
/// host memory: the ring of pinned chunks, one chunk of scratch, and the writer's one head
/// (StoreWriter holds O(n_q·k) of the open head). Nothing grows with the number of heads or layers.
///
/// The store's bytes are those of the simple way (estimate, trace, download everything, append
/// head by head): the records of a head do not depend on the head grouping (HeadRange), the
/// chunking or the schedule, and the writer appends them in segment order.
#pragma once

#include "flashlab/cuda/stream_fast.hpp"
#include "flashlab/reference/stream_store.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace flashlab::cuda::stream {

/// Which kernel stream the GPU's block scheduler serves first when both have thread blocks waiting
/// (CUDA stream priorities): neither, the trace's, or the estimate's.
enum class LayerPriority {
  equal,    ///< neither: the block scheduler mixes them
  trace,    ///< the trace's: T(g) starts as soon as E(g) ends, E(g + 1) fills its last wave
  estimate  ///< the estimate's: E(g + 1) first, T(g) in its last wave
};

/// The name of a LayerPriority as the command line spells it ("equal", "trace", "estimate").
const char* layer_priority_name(LayerPriority p);

/// How the layer pipeline schedules and buffers (defaults: one head per launch, 2048 query blocks
/// per chunk, 8 pinned chunks, both kernel streams of equal priority).
struct LayerTraceOptions {
  std::size_t heads_per_launch = 1;  ///< heads per estimate and trace launch (1 … H)
  std::size_t chunk_rows = 2048;     ///< query blocks per device → host copy (≥ 1)
  std::size_t host_chunks = 8;       ///< pinned chunk buffers in the ring (≥ 2)
  LayerPriority priority = LayerPriority::equal;  ///< the kernel stream served first
};

/// What a LayerTracer did so far (summed over the layers it traced).
struct LayerTraceStats {
  std::size_t layers = 0;               ///< layers traced
  std::size_t chunks = 0;               ///< chunks copied and appended
  std::size_t max_chunks_in_flight = 0; ///< most pinned chunks copied but not yet appended at once
  std::size_t device_bytes = 0;         ///< device memory the pipeline holds (I and record slots)
  std::size_t pinned_bytes = 0;         ///< pinned host memory (the chunk ring)
  double estimate_ms = 0;               ///< Σ estimate launch times (CUDA events)
  double trace_ms = 0;                  ///< Σ trace launch times (CUDA events)
  double gpu_span_ms = 0;               ///< Σ over layers: first estimate start → last trace end
  double writer_busy_ms = 0;            ///< writer thread time in conversion and StoreWriter calls
  double end_head_ms = 0;               ///< of which StoreWriter::end_head (the commits)
};

/// Device memory a LayerTracer holds for `shape` (T, H, d, k) and `opt`: two slots of I (int64)
/// and of records (FastEdge) for one head group. The one formula (benchmarks report it).
std::size_t layer_trace_device_bytes(const FastApplyShape& shape, const LayerTraceOptions& opt);

/// Traces layers of `[T, H, d]` bf16 inputs on the device into a store, one layer per call.
class LayerTracer {
 public:
  /// Checks the shape (the fast estimate's and the fast trace's limits; bf16 only, b_q = b_k = 64)
  /// and the options, creates the streams and allocates the slots and the pinned ring. `mask`,
  /// when given, is the block mask of every layer (geometry T, 64, 64; a user C_blk is packed and
  /// uploaded once, pack_block_mask(), and counted in LayerTraceStats::device_bytes); without it
  /// the mask is causal only. Throws ref::stream::StreamError for bad parameters, CudaError for
  /// CUDA failures.
  LayerTracer(const FastApplyShape& shape, const LayerTraceOptions& opt = {},
              const ref::stream::BlockMask* mask = nullptr);
  ~LayerTracer();
  LayerTracer(const LayerTracer&) = delete;
  LayerTracer& operator=(const LayerTracer&) = delete;

  /// Traces heads `first_head` … H − 1 of layer `layer`: Q, K, V are device pointers to bf16
  /// `[T, H, d]` (the tracer's mask), every head h written to `writer` as segment (layer, h);
  /// (layer, first_head) must be the writer's next head (first_head > 0 continues a layer of a
  /// reopened store: each head's records do not depend on which heads share its launch) and its
  /// layout must have the tracer's T, b_q = b_k = 64, k and H. When that layout keeps no value
  /// norms (a store without scores, the command's default) the trace reads no V
  /// (stream_fast_trace_device with value_norm false; V must still be given): the same key blocks
  /// and mass bits, at a lower cost (docs/stream.md, "The fast trace on tensor cores"). Returns
  /// when every head is committed. Work of earlier calls on the default stream is ordered before it. Throws
  /// StreamError or StoreError (writer, layout), CudaError (CUDA); after a throw the store holds
  /// the heads committed before it (StoreWriter::reopen continues there).
  void trace_layer(std::size_t layer, const void* Q, const void* K, const void* V, ref::stream::StoreWriter& writer,
                   std::size_t first_head = 0);

  /// Counters and times so far.
  [[nodiscard]] const LayerTraceStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Host float values put into a `[T, H, d]` bf16 device array in bounded chunks: the caller
/// fills host_chunk() with `rows` rows of `src_heads` heads (`[rows, src_heads, d]` float32,
/// C order), upload() copies them to a device staging buffer, converts them to bf16 on the device
/// (round to nearest even) and writes them to rows t0 … t0 + rows − 1 of heads `dst.first` …
/// `dst.first + dst.count − 1`, destination head j of the range reading source head
/// j / (dst.count / src_heads) (grouped-query inputs: K and V of fewer heads, repeated).
/// Memory: one pinned host chunk and one device chunk (float and bf16) of at most
/// max(chunk_bytes / 4, H·d) floats; nothing grows with T.
class LayerInputUploader {
 public:
  /// Checks the sizes (T, H, d ≥ 1) and allocates the two chunks. Throws StreamError, CudaError.
  LayerInputUploader(std::size_t T, std::size_t heads, std::size_t d, std::size_t chunk_bytes = std::size_t(32) << 20);
  ~LayerInputUploader();
  LayerInputUploader(const LayerInputUploader&) = delete;
  LayerInputUploader& operator=(const LayerInputUploader&) = delete;

  /// The most rows of `src_heads` heads one upload() takes (≥ 1 for src_heads ≤ H).
  [[nodiscard]] std::size_t rows_per_chunk(std::size_t src_heads) const;
  /// The pinned host chunk the caller fills before upload().
  [[nodiscard]] float* host_chunk() const;
  /// Device bytes of the staging chunks (float and bf16).
  [[nodiscard]] std::size_t device_bytes() const;
  /// Pinned host bytes of the host chunk.
  [[nodiscard]] std::size_t host_bytes() const;
  /// Uploads host_chunk() as described above into `out` (a device pointer to bf16 `[T, H, d]`);
  /// synchronous. `dst.count` (0 = every head from `dst.first` on) must be a multiple of
  /// `src_heads`. Throws StreamError for rows or heads out of range, CudaError for CUDA failures.
  void upload(std::size_t src_heads, std::size_t t0, std::size_t rows, HeadRange dst, std::uint16_t* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One run of layer_trace() or layer_trace_random(): per traced layer the time from inputs on the device to the layer's
/// last head committed, and the pipeline's counters.
struct LayerTraceRun {
  std::vector<double> layer_ms;  ///< per layer: inputs ready on the device → every head committed
  double inputs_ms = 0;          ///< Σ time to make the inputs (not in layer_ms)
  std::size_t qkv_bytes = 0;     ///< device memory of one layer's Q, K, V
  /// Free device memory (cudaMemGetInfo) before the LayerTracer was made minus after: what its
  /// allocations took, in the driver's granularity (LayerTraceStats::device_bytes is the request).
  std::size_t tracer_device_bytes_measured = 0;
  LayerTraceStats stats;         ///< the LayerTracer's counters
};

/// Fills the inputs of layer `layer` before it is traced: Q, K, V are device pointers to bf16
/// `[T, H, d]`; heads below `first_head` are not traced (a resumed layer) and need not be filled.
/// Work may be left queued on the default stream (the layer waits for it).
using LayerInputFill =
    std::function<void(std::size_t layer, std::size_t first_head, std::uint16_t* Q, std::uint16_t* K, std::uint16_t* V)>;

/// Traces the layers of `writer`'s layout from its next head on (a new store: every layer; a
/// reopened one: the rest of the interrupted layer, then the others), each layer's inputs made by
/// `fill` into one set of Q, K, V buffers (zeroed once, reused by every layer) before the layer's
/// timer starts. `mask` as LayerTracer's. The store's bytes are those of an uninterrupted run.
/// Throws as LayerTracer, and whatever `fill` throws (the store then holds the heads committed).
LayerTraceRun layer_trace(const FastApplyShape& shape, const LayerInputFill& fill, const LayerTraceOptions& opt,
                          ref::stream::StoreWriter& writer, const ref::stream::BlockMask* mask = nullptr);

/// Traces `layers` layers of seeded random inputs made on the device into `writer`:/// Traces `layers` layers of seeded random inputs made on the device into `writer`: each layer's
/// Q, K, V (`[T, H, d]` bf16, one set of buffers reused by every layer) are N(0, 1) values of
/// (seed, layer, tensor, index), Q scaled by 1/√d (logits of unit variance), made on the GPU
/// before the layer's timer starts. The writer's next head must be (0, 0) and its layout must
/// have `layers` layers. Throws as LayerTracer.
LayerTraceRun layer_trace_random(const FastApplyShape& shape, std::size_t layers, std::uint64_t seed,
                                 const LayerTraceOptions& opt, ref::stream::StoreWriter& writer);

/// The fill layer_trace_random() uses (and `stream trace --store --device cuda` without inputs):
/// every layer's Q, K, V as layer_random_inputs_device() makes them. It holds its shape and seed
/// by value, so it outlives the caller's locals.
LayerInputFill layer_random_fill(const FastApplyShape& shape, std::uint64_t seed);

/// The inputs layer_trace_random() gives layer `layer` (for tests): `n` bf16 bit patterns of
/// tensor `tensor` (0 = Q, 1 = K, 2 = V) made on the device into `out` (a device pointer), Q
/// scaled by 1/√d. Default stream, asynchronous.
void layer_random_inputs_device(std::uint16_t* out, std::size_t n, std::uint64_t seed, std::size_t layer, int tensor,
                                std::size_t d);

}  // namespace flashlab::cuda::stream
