// The STREAM family's front door (stream.hpp, stream_fast.hpp, stream_fast_estimate.hpp): the
// limits of its kernels, each checked once, here and nowhere else (the clear kernels' launch
// description, make_problem; the fast apply's check_fast_apply; the fast estimate's
// check_fast_estimate), the kernel chosen for a run (StreamKernel: the clear fp32 kernels or the
// fast 16-bit ones, with the rounding of the inputs that choice implies), and the entry points on
// the caller's device memory and stream: stream_fast_estimate_device, stream_fast_apply_device and
// stream_trace_device (and narrow_edges_device, its records in the C ABI's 24 bytes), with their
// workspace sizes. Those launch and return: no host copy, no
// allocation, no synchronisation. The host-array entries of the tests and the CLI are wrappers
// over the same launchers, in host.cpp.
#include "flashlab/cuda/dtype16.hpp"
#include "flashlab/cuda/stream.hpp"
#include "flashlab/cuda/stream_fast.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"
#include "flashlab/cuda/stream_sharded.hpp"

#include "core/device_pointer.hpp"
#include "stream/front_door.hpp"
#include "stream/stream_common.hpp"
#include "stream/stream_fast_common.hpp"
#include "stream/stream_fast_estimate_launch.hpp"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

namespace flashlab::cuda {

const char* to_string(StreamKernel kernel) { return kernel == StreamKernel::fast ? "fast" : "clear"; }

}  // namespace flashlab::cuda

namespace flashlab::cuda::stream {

using ref::stream::StreamError;
using detail::StreamProblem;

static_assert(kFastStreamBlock == std::size_t(detail::kFastBlock), "one b_q = b_k for the API and the kernel");
static_assert(sizeof(long long) == sizeof(std::int64_t));

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
                      std::to_string(kMaxBlock) + " on the GPU (hint: --block-m 64 --block-n 64)");
  if (ref::stream::ceil_log2(k) + g.n_it() > 62)
    throw StreamError("k·2^n_it overflows the 64-bit branch identifiers of τ");
  to_int(g.T, "T");
  to_int(g.T * heads, "T·H");  // [T, H, d] row indices must fit the kernels' int arithmetic
  to_int(heads, "heads");
  to_int(k, "k");
  if (g.n_q() * heads * k > std::size_t(INT_MAX)) throw StreamError("n_q·H·k is too large for the GPU index tensor");
  return detail::describe_stream_problem(mask, heads, d, dv, k);
}

/// A device pointer argument of an entry point (core/device_pointer.hpp).
void require_device_pointer(const char* entry, const char* name, const void* ptr, std::size_t alignment) {
  const std::string why = ::flashlab::cuda::detail::device_pointer_problem(ptr, alignment);
  if (!why.empty()) throw StreamError(std::string(entry) + ": " + name + " " + why);
}

/// The launch description of a checked fast apply or trace shape.
detail::FastApplyLaunch fast_apply_launch(const FastApplyShape& shape) {
  detail::FastApplyLaunch p;
  p.T = int(shape.T);
  p.heads = int(shape.heads);
  p.n_q = int((shape.T + kFastStreamBlock - 1) / kFastStreamBlock);
  p.k = int(shape.k);
  return p;
}

/// The launch description of a checked fast-estimate problem (the clear kernels' StreamProblem; d = d_v).
StreamProblem fast_problem(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d, std::size_t k) {
  check_fast_estimate(mask.geometry(), heads, d, k);
  return detail::describe_stream_problem(mask, heads, d, d, k);
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

// ---------------------------------------------------------------------------------- fast apply

int fast_apply_default_group() { return 1; }

void check_fast_apply(const FastApplyShape& s) {
  if (s.T == 0) throw StreamError("T must be at least 1");
  if (s.heads == 0 || s.heads > 65535)
    throw StreamError("heads = " + std::to_string(s.heads) + " must be in 1..65535 (one grid row per head)");
  if (s.dim != 64 && s.dim != 128)
    throw StreamError("head dim d = " + std::to_string(s.dim) +
                      " is not 64 or 128 (hint: the fast apply is compiled for d = 64 and 128; the clear kernel "
                      "takes any d up to 256)");
  if (s.k == 0 || s.k > kFastStreamMaxK)
    throw StreamError("k = " + std::to_string(s.k) + " must be in 1.." + std::to_string(kFastStreamMaxK) +
                      " for the fast apply (its schedule of kept blocks lives in shared memory)");
  if (s.dtype != ref::Dtype::bf16 && s.dtype != ref::Dtype::fp16)
    throw StreamError("the fast apply takes bf16 or fp16 inputs, not " + std::string(ref::dtype_name(s.dtype)) +
                      " (hint: fp32 runs on the clear kernel)");
  if (s.group < 0 || s.group > 2)
    throw StreamError("group = " + std::to_string(s.group) + " query blocks per thread block must be 1 or 2 (0: the default)");
  if (s.T > std::size_t(INT_MAX) / s.heads)
    throw StreamError("T·H = " + std::to_string(s.T) + "·" + std::to_string(s.heads) +
                      " exceeds the fast kernel's 32-bit row indices");
}

std::size_t fast_apply_workspace_bytes(const FastApplyShape& shape) {
  check_fast_apply(shape);
  return 0;
}

void stream_fast_apply_device(const FastApplyShape& shape, const void* Q, const void* K, const void* V,
                              const std::int64_t* I, void* O, void* stream) {
  check_fast_apply(shape);
  const detail::FastApplyLaunch p = fast_apply_launch(shape);
  const int group = shape.group == 0 ? fast_apply_default_group() : shape.group;
  static_assert(sizeof(long long) == sizeof(std::int64_t));
  detail::launch_fast_apply(p, int(shape.dim), group, shape.dtype == ref::Dtype::bf16, Q, K, V,
                            reinterpret_cast<const long long*>(I), O, static_cast<cudaStream_t>(stream));
}

HeadRange resolve_head_range(HeadRange range, std::size_t heads) {
  if (range.first >= heads)
    throw StreamError("head range starts at head " + std::to_string(range.first) + " of H = " + std::to_string(heads) +
                      " (hint: heads are numbered 0 .. H − 1)");
  if (range.count == 0) range.count = heads - range.first;
  if (range.count > heads - range.first)
    throw StreamError("head range " + std::to_string(range.first) + " + " + std::to_string(range.count) +
                      " runs past H = " + std::to_string(heads) + " (hint: first + count ≤ H)");
  return range;
}

void stream_fast_trace_device(const FastApplyShape& shape, const void* Q, const void* K, const void* V,
                              const std::int64_t* I, FastEdge* edges, void* stream, HeadRange range,
                              std::size_t q_first, std::size_t q_count, bool value_norm) {
  check_fast_apply(shape);
  range = resolve_head_range(range, shape.heads);
  const std::size_t n_q = (shape.T + kFastStreamBlock - 1) / kFastStreamBlock;
  if (q_count == 0) q_count = q_first < n_q ? n_q - q_first : 0;
  if (q_first >= n_q || q_count > n_q - q_first)
    throw StreamError("query blocks " + std::to_string(q_first) + " … " + std::to_string(q_first + q_count) +
                      " (exclusive) run past n_q = " + std::to_string(n_q) + " (hint: q_first < n_q, q_first + q_count ≤ n_q)");
  static_assert(sizeof(FastEdge) == sizeof(detail::FastEdgeRecord) && sizeof(FastEdge) == 24,
                "the fast trace writes FastEdge's layout");
  const detail::FastApplyLaunch p = fast_apply_launch(shape);
  detail::launch_fast_trace(p, int(range.first), int(range.count), int(shape.dim), shape.dtype == ref::Dtype::bf16, Q, K, V,
                            reinterpret_cast<const long long*>(I), reinterpret_cast<detail::FastEdgeRecord*>(edges),
                            static_cast<cudaStream_t>(stream), int(q_first), int(q_count), value_norm);
}

// ---------------------------------------------------------------------------------- fast estimate

void check_fast_estimate(const ref::stream::Geometry& g, std::size_t heads, std::size_t d, std::size_t k) {
  g.check();
  if (g.bq != kFastEstimateBlock || g.bk != kFastEstimateBlock)
    throw StreamError("the fast estimate takes b_q = b_k = 64 only (got b_q = " + std::to_string(g.bq) +
                      ", b_k = " + std::to_string(g.bk) + "; hint: --block-m 64 --block-n 64, or the clear kernel)");
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

void stream_fast_estimate_device(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d, std::size_t k,
                                 const void* Q, const void* K, const std::uint64_t* packed_mask, long long* I,
                                 float* scores, float* margins, void* stream, HeadRange range) {
  const StreamProblem p = fast_problem(mask, heads, d, k);
  range = resolve_head_range(range, heads);
  if ((packed_mask != nullptr) != mask.has_user_mask())
    throw StreamError(mask.has_user_mask() ? "the block mask has a user part but no packed C_blk was given"
                                           : "a packed C_blk was given for a causal-only block mask");
  if (Q == nullptr || K == nullptr || I == nullptr) throw StreamError("Q, K and I must be device pointers");
  detail::launch_fast_estimate(p, int(range.first), int(range.count), Q, K, packed_mask, I, scores, margins, stream);
}

// ---------------------------------------------------------------------------------- one shard

namespace {

/// `blocks` resolved against n_q (count 0 → to the end); throws StreamError when empty or past n_q.
QueryBlockRange resolve_blocks(QueryBlockRange blocks, std::size_t n_q) {
  if (blocks.first >= n_q)
    throw StreamError("query-block range starts at block " + std::to_string(blocks.first) + " of n_q = " +
                      std::to_string(n_q) + " (hint: blocks are numbered 0 .. n_q − 1)");
  if (blocks.count == 0) blocks.count = n_q - blocks.first;
  if (blocks.count > n_q - blocks.first)
    throw StreamError("query-block range " + std::to_string(blocks.first) + " + " + std::to_string(blocks.count) +
                      " runs past n_q = " + std::to_string(n_q) + " (hint: first + count ≤ n_q)");
  return blocks;
}

}  // namespace

void stream_fast_estimate_shard_device(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d,
                                       std::size_t k, QueryBlockRange blocks, const void* Q, const void* K,
                                       long long* I, float* scores, float* margins, void* stream) {
  const StreamProblem p = fast_problem(mask, heads, d, k);
  if (mask.has_user_mask())
    throw StreamError("the estimate of a query-block range takes a causal-only mask (hint: a user mask would "
                      "change which key rows a shard needs)");
  blocks = resolve_blocks(blocks, mask.geometry().n_q());
  if (Q == nullptr || K == nullptr || I == nullptr) throw StreamError("Q, K and I must be device pointers");
  detail::launch_fast_estimate_range(p, int(blocks.first), int(blocks.count), Q, K, I, scores, margins, stream);
}

void stream_fast_apply_shard_device(const FastApplyShape& shape, QueryBlockRange blocks, const void* Q, const void* K,
                                    const void* V, const std::int64_t* I, void* O, void* stream) {
  check_fast_apply(shape);
  const detail::FastApplyLaunch p = fast_apply_launch(shape);
  blocks = resolve_blocks(blocks, std::size_t(p.n_q));
  if (Q == nullptr || K == nullptr || V == nullptr || I == nullptr || O == nullptr)
    throw StreamError("Q, K, V, I and O must be device pointers");
  detail::launch_fast_apply_range(p, int(blocks.first), int(blocks.count), int(shape.dim),
                                  shape.dtype == ref::Dtype::bf16, Q, K, V, reinterpret_cast<const long long*>(I), O,
                                  static_cast<cudaStream_t>(stream));
}

std::vector<ref::stream::RankShard> fast_stream_shards(std::size_t T, std::size_t gpus) {
  return ref::stream::shard_sequence(ref::stream::Geometry{T, kFastStreamBlock, kFastStreamBlock}, gpus);
}

// ---------------------------------------------------------------------------------- trace

std::size_t stream_trace_workspace_bytes(const ref::stream::Geometry& g, std::size_t heads, std::size_t dv) {
  return (2 * g.T * heads + g.T * heads * dv) * sizeof(float);
}

void stream_trace_device(const ref::stream::BlockMask& mask, std::size_t heads, std::size_t d, std::size_t dv,
                         std::size_t k, const float* Q, const float* K, const float* V, const std::int64_t* I, float* O,
                         ref::stream::Edge* edges, void* workspace, void* stream) {
  const StreamProblem p = make_problem(mask, heads, d, dv, k);
  if (k > 65535 || heads > 65535)
    throw StreamError("the trace takes k ≤ 65535 and H ≤ 65535 (one grid dimension each; got k = " +
                      std::to_string(k) + ", H = " + std::to_string(heads) + ")");
  detail::check_smem(detail::apply_smem_bytes(p), "stream_apply_kernel", p);
  detail::check_smem(detail::trace_smem_bytes(p), "stream_trace_kernel", p);
  constexpr const char* kEntry = "stream_trace_device";
  require_device_pointer(kEntry, "Q", Q, 4);
  require_device_pointer(kEntry, "K", K, 4);
  require_device_pointer(kEntry, "V", V, 4);
  require_device_pointer(kEntry, "I", I, 8);
  require_device_pointer(kEntry, "edges", edges, 8);
  require_device_pointer(kEntry, "workspace", workspace, 4);
  if (O != nullptr) require_device_pointer(kEntry, "O", O, 4);
  // The trace kernel writes ref::stream::Edge's layout (detail::EdgeRecord, field for field).
  static_assert(sizeof(detail::EdgeRecord) == sizeof(ref::stream::Edge) &&
                offsetof(detail::EdgeRecord, r) == offsetof(ref::stream::Edge, r) &&
                offsetof(detail::EdgeRecord, slot) == offsetof(ref::stream::Edge, slot) &&
                offsetof(detail::EdgeRecord, score) == offsetof(ref::stream::Edge, score) &&
                offsetof(detail::EdgeRecord, mass) == offsetof(ref::stream::Edge, mass) &&
                offsetof(detail::EdgeRecord, value_norm) == offsetof(ref::stream::Edge, value_norm));
  auto* mu = static_cast<float*>(workspace);
  float* lam = mu + std::size_t(p.T) * p.heads;
  float* out = O != nullptr ? O : lam + std::size_t(p.T) * p.heads;
  const auto s = static_cast<cudaStream_t>(stream);
  const auto* dI = reinterpret_cast<const long long*>(I);
  // The application for the final softmax statistics (μ, λ) of every row, then one record per
  // entry of I: [H, n_q, k] in row-major order, an empty entry r = −1 with zero weights.
  detail::launch_apply(p, Q, K, V, dI, out, mu, lam, s);
  detail::launch_trace(p, 0, p.n_q, Q, K, V, dI, mu, lam, reinterpret_cast<detail::EdgeRecord*>(edges), s);
}

void narrow_edges_device(const ref::stream::Edge* edges, CompactEdge* out, std::size_t count, void* stream) {
  if (count == 0) return;
  constexpr const char* kEntry = "narrow_edges_device";
  require_device_pointer(kEntry, "edges", edges, 8);
  require_device_pointer(kEntry, "out", out, 4);
  static_assert(sizeof(CompactEdge) == 24 && sizeof(detail::CompactEdgeRecord) == sizeof(CompactEdge) &&
                    offsetof(detail::CompactEdgeRecord, r) == offsetof(CompactEdge, r) &&
                    offsetof(detail::CompactEdgeRecord, slot) == offsetof(CompactEdge, slot) &&
                    offsetof(detail::CompactEdgeRecord, score) == offsetof(CompactEdge, score) &&
                    offsetof(detail::CompactEdgeRecord, mass) == offsetof(CompactEdge, mass) &&
                    offsetof(detail::CompactEdgeRecord, value_norm) == offsetof(CompactEdge, value_norm),
                "the narrowing kernel writes CompactEdge's layout");
  detail::launch_narrow_edges(reinterpret_cast<const detail::EdgeRecord*>(edges),
                              reinterpret_cast<detail::CompactEdgeRecord*>(out), count, static_cast<cudaStream_t>(stream));
}

}  // namespace flashlab::cuda::stream
