// The STREAM entry points: flashlab_stream_problem checked once and turned into the family's types
// (ref::stream::Geometry and BlockMask); on the CPU the reference's estimate and apply (with edge
// records for the trace) on copies of the caller's strided rows; on CUDA the fast kernels'
// device-pointer entry points (flashlab/cuda/stream_fast_estimate.hpp, stream_fast.hpp).
#include "core.hpp"

#include "flashlab/reference/stream.hpp"

#if FLASHLAB_CAPI_HAVE_CUDA
#include "flashlab/cuda/stream_fast.hpp"
#include "flashlab/cuda/stream_fast_estimate.hpp"
#endif

#include <climits>
#include <cstddef>
#include <cstring>
#include <optional>
#include <vector>

namespace {

using namespace flashlab::capi;
namespace ref = flashlab::ref;
namespace rs = flashlab::ref::stream;


enum class Pass { estimate, apply, trace };

struct Stream {
  flashlab_stream_problem abi{};
  rs::Geometry g;
  std::size_t k = 0;
  std::int64_t n_q = 0, n_k = 0;
  Extents ext;  // [T, d]
};

// The fields every pass and the query-block count share (no device involved).
Stream checked_fields(const flashlab_stream_problem* problem) {
  Stream s;
  s.abi = read_struct(problem, "problem", "flashlab_stream_problem", flashlab_stream_defaults());
  const flashlab_stream_problem& a = s.abi;
  require_range("problem->tokens", a.tokens, 1, kMaxDim, "T, the tokens of the head; at least 1");
  require_range("problem->head_dim", a.head_dim, 1, kMaxDim, "give the head dimension, e.g. 64");
  require_range("problem->block_q", a.block_q, 1, kMaxDim, "b_q, tokens per query block, e.g. 64");
  require_range("problem->block_k", a.block_k, 1, kMaxDim, "b_k, tokens per key block, e.g. 64");
  require_range("problem->k_blocks", a.k_blocks, 1, kMaxDim, "k, key blocks kept per query block, e.g. 8");
  (void)checked_product({a.tokens, a.head_dim}, "T·d");
  s.g = rs::Geometry{std::size_t(a.tokens), std::size_t(a.block_q), std::size_t(a.block_k)};
  s.g.check();
  s.k = std::size_t(a.k_blocks);
  s.n_q = std::int64_t(s.g.n_q());
  s.n_k = std::int64_t(s.g.n_k());
  (void)checked_product({s.n_q, a.k_blocks}, "n_q·k");
  s.ext = Extents{1, a.tokens, 1, a.head_dim, true};
  return s;
}

#if FLASHLAB_CAPI_HAVE_CUDA
namespace fs = flashlab::cuda::stream;

fs::FastApplyShape apply_shape(const Stream& s) {
  fs::FastApplyShape shape;
  shape.T = s.g.T;
  shape.heads = 1;
  shape.dim = std::size_t(s.abi.head_dim);
  shape.k = s.k;
  shape.dtype = to_ref_dtype(s.abi.dtype);
  return shape;
}
// The fast kernels' limits, stated by check_fast_estimate() and check_fast_apply().
void cuda_limits(const Stream& s, Pass pass) {
  const flashlab_stream_problem& a = s.abi;
  if (pass == Pass::trace && a.dtype == FLASHLAB_DTYPE_F32) {
    // F32: the clear kernels, whose limits are make_problem's, checked by the size query of the
    // same front door.
    kernel_limits("the CUDA trace refuses this problem",
                  [&] { (void)fs::stream_trace_workspace_bytes(s.g, 1, std::size_t(a.head_dim)); });
    return;
  }
  if (pass == Pass::estimate) {
    if (a.dtype != FLASHLAB_DTYPE_BF16)
      fail(FLASHLAB_ERROR_UNSUPPORTED, "problem->dtype = FLASHLAB_DTYPE_F16: the CUDA estimate takes BF16 only",
           "convert q and k to bfloat16 for the estimate (the apply takes F16)");
    if (a.mask != nullptr)
      fail(FLASHLAB_ERROR_UNSUPPORTED, "problem->mask is set: the CUDA estimate takes the causal mask only",
           "set mask to NULL, or estimate with a user block mask on FLASHLAB_DEVICE_CPU");
    kernel_limits("the CUDA estimate refuses this problem",
                  [&] { fs::check_fast_estimate(s.g, 1, std::size_t(a.head_dim), s.k); });
    return;
  }
  // The apply and the 16-bit trace: the fast apply's limits.
  kernel_limits(pass == Pass::trace ? "the CUDA trace refuses this problem" : "the CUDA apply refuses this problem", [&] {
    if (s.g.bq != fs::kFastStreamBlock || s.g.bk != fs::kFastStreamBlock)
      throw rs::StreamError("problem->block_q = " + std::to_string(s.g.bq) + ", block_k = " + std::to_string(s.g.bk) +
                            ": the fast apply's blocks are " + std::to_string(fs::kFastStreamBlock) +
                            " (hint: set both to 64, or apply on FLASHLAB_DEVICE_CPU)");
    fs::check_fast_apply(apply_shape(s));
  });
}

#endif

Stream checked_problem(const flashlab_stream_problem* problem, flashlab_device device, Pass pass) {
  Stream s = checked_fields(problem);
  check_device(device);
  // The CUDA trace also takes F32 (the clear kernels); BF16 and F16 run the fast trace.
  if (!(device == FLASHLAB_DEVICE_CUDA && pass == Pass::trace && s.abi.dtype == FLASHLAB_DTYPE_F32))
    check_dtype(s.abi.dtype, device, "problem->dtype");
#if FLASHLAB_CAPI_HAVE_CUDA
  if (device == FLASHLAB_DEVICE_CUDA) cuda_limits(s, pass);
#else
  (void)pass;
#endif
  return s;
}

// C_blk: causal, and the caller's block mask when given (n_q × n_k bytes, each 0 or 1).
rs::BlockMask block_mask(const Stream& s) {
  if (s.abi.mask == nullptr) return rs::BlockMask(s.g);
  const std::int64_t bytes = checked_product({s.n_q, s.n_k}, "n_q·n_k (the mask's bytes)");
  return rs::BlockMask(s.g, std::vector<std::uint8_t>(s.abi.mask, s.abi.mask + bytes));
}

std::vector<std::int64_t> host_indices(const Stream& s, const std::int64_t* indices, const rs::BlockMask& mask) {
  std::vector<std::int64_t> I(indices, indices + s.n_q * std::int64_t(s.k));
  const std::string why = rs::validate_indices(I, s.k, mask);
  if (!why.empty())
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, "indices break the validity invariant: " + why,
         "pass the indices flashlab_stream_estimate wrote for this problem");
  return I;
}

template <typename T>
void cpu_estimate(const Stream& s, const Strided& q, const Strided& k, std::int64_t* indices) {
  const rs::EstimateResult r =
      rs::stream_estimate<T>(gather_rows<T>(q), gather_rows<T>(k), block_mask(s), rs::EstimateParams{s.k, 1});
  std::memcpy(indices, r.indices.data(), r.indices.size() * sizeof(std::int64_t));
}

template <typename T>
void cpu_apply(const Stream& s, const Qkv& in, const std::int64_t* indices, const std::optional<Strided>& o,
               flashlab_stream_edge* edges) {
  const rs::BlockMask mask = block_mask(s);
  const std::vector<std::int64_t> I = host_indices(s, indices, mask);
  const rs::ApplyResult<T> r =
      rs::stream_apply<T>(gather_rows<T>(in.q), gather_rows<T>(in.k), gather_rows<T>(in.v), mask, I, s.k, 1, edges != nullptr);
  if (o) scatter_rows(r.O, *o);
  if (!edges) return;
  // One record per entry of I: the reference lists the non-empty ones; the rest say r = −1.
  for (std::int64_t q_block = 0; q_block < s.n_q; ++q_block)
    for (std::size_t j = 0; j < s.k; ++j)
      edges[std::size_t(q_block) * s.k + j] = flashlab_stream_edge{std::int32_t(q_block), -1, std::int32_t(j), 0.f, 0.f, 0.f};
  for (const rs::Edge& e : r.edges)
    edges[std::size_t(e.q) * s.k + std::size_t(e.slot)] =
        flashlab_stream_edge{std::int32_t(e.q),   std::int32_t(e.r),  std::int32_t(e.slot),
                             float(e.score),      float(e.mass),      float(e.value_norm)};
}

#if FLASHLAB_CAPI_HAVE_CUDA
// The CUDA trace's workspace. F32 (the clear kernels): the front door's scratch (μ, λ and room for
// O), then, from the next 256-byte boundary, its wide records, which the narrowing writes into
// `edges`. BF16, F16: none (the fast trace writes flashlab_stream_edge itself).
std::size_t trace_records_offset(const Stream& s) {
  return (fs::stream_trace_workspace_bytes(s.g, 1, std::size_t(s.abi.head_dim)) + 255) / 256 * 256;
}
std::size_t trace_workspace(const Stream& s) {
  if (s.abi.dtype != FLASHLAB_DTYPE_F32) return 0;
  return trace_records_offset(s) + std::size_t(s.n_q) * s.k * sizeof(rs::Edge);
}
#endif

std::size_t no_workspace(const flashlab_stream_problem* problem, flashlab_device device, Pass pass) {
  (void)checked_problem(problem, device, pass);
  return 0;
}

}  // namespace

extern "C" {

FLASHLAB_API flashlab_stream_problem flashlab_stream_defaults(void) {
  flashlab_stream_problem p{};
  p.struct_size = sizeof p;
  p.block_q = 64;
  p.block_k = 64;
  p.k_blocks = 8;
  p.dtype = FLASHLAB_DTYPE_BF16;
  return p;
}

FLASHLAB_API flashlab_status flashlab_stream_query_blocks(const flashlab_stream_problem* problem, int64_t* n_q) {
  return guard("flashlab_stream_query_blocks", [&] {
    const Stream s = checked_fields(problem);
    require_pointer(n_q, "n_q");
    *n_q = s.n_q;
  });
}

FLASHLAB_API flashlab_status flashlab_stream_estimate_workspace_size(const flashlab_stream_problem* problem,
                                                                     flashlab_device device, size_t* bytes) {
  return size_query("flashlab_stream_estimate_workspace_size", bytes,
                    [&] { return no_workspace(problem, device, Pass::estimate); });
}

FLASHLAB_API flashlab_status flashlab_stream_estimate(const flashlab_stream_problem* problem, flashlab_device device,
                                                      flashlab_tensor q, flashlab_tensor k, int64_t* indices,
                                                      void* workspace, size_t workspace_bytes, void* stream) {
  return guard("flashlab_stream_estimate", [&] {
    const Stream s = checked_problem(problem, device, Pass::estimate);
    const flashlab_dtype dt = s.abi.dtype;
    const Strided qs = tensor_arg("q", q, s.ext, dt, device, Role::input);
    const Strided ks = tensor_arg("k", k, s.ext, dt, device, Role::input);
    array_arg("indices", indices, device);
    (void)workspace;
    (void)workspace_bytes;
    if (device == FLASHLAB_DEVICE_CPU) {
      if (dt == FLASHLAB_DTYPE_F64) cpu_estimate<double>(s, qs, ks, indices);
      else cpu_estimate<float>(s, qs, ks, indices);
      return;
    }
#if FLASHLAB_CAPI_HAVE_CUDA
    kernel_limits("the CUDA estimate refuses this problem", [&] {
      fs::stream_fast_estimate_device(rs::BlockMask(s.g), 1, std::size_t(s.abi.head_dim), s.k, qs.data, ks.data,
                                      nullptr, reinterpret_cast<long long*>(indices), nullptr, nullptr, stream);
    });
#else
    (void)stream;
#endif
  });
}

FLASHLAB_API flashlab_status flashlab_stream_apply_workspace_size(const flashlab_stream_problem* problem,
                                                                  flashlab_device device, size_t* bytes) {
  return size_query("flashlab_stream_apply_workspace_size", bytes,
                    [&] { return no_workspace(problem, device, Pass::apply); });
}

FLASHLAB_API flashlab_status flashlab_stream_apply(const flashlab_stream_problem* problem, flashlab_device device,
                                                   flashlab_tensor q, flashlab_tensor k, flashlab_tensor v,
                                                   const int64_t* indices, flashlab_tensor o, void* workspace,
                                                   size_t workspace_bytes, void* stream) {
  return guard("flashlab_stream_apply", [&] {
    const Stream s = checked_problem(problem, device, Pass::apply);
    const flashlab_dtype dt = s.abi.dtype;
    const Qkv in = qkv_args(q, k, v, s.ext, s.ext, dt, device);
    array_arg("indices", indices, device);
    const Strided os = tensor_arg("o", o, s.ext, dt, device, Role::output);
    (void)workspace;
    (void)workspace_bytes;
    if (device == FLASHLAB_DEVICE_CPU) {
      if (dt == FLASHLAB_DTYPE_F64) cpu_apply<double>(s, in, indices, os, nullptr);
      else cpu_apply<float>(s, in, indices, os, nullptr);
      return;
    }
#if FLASHLAB_CAPI_HAVE_CUDA
    kernel_limits("the CUDA apply refuses this problem",
                  [&] { fs::stream_fast_apply_device(apply_shape(s), in.q.data, in.k.data, in.v.data, indices, os.data, stream); });
#else
    (void)stream;
#endif
  });
}

FLASHLAB_API flashlab_status flashlab_stream_trace_workspace_size(const flashlab_stream_problem* problem,
                                                                  flashlab_device device, size_t* bytes) {
  return size_query("flashlab_stream_trace_workspace_size", bytes, [&] {
    const Stream s = checked_problem(problem, device, Pass::trace);
#if FLASHLAB_CAPI_HAVE_CUDA
    if (device == FLASHLAB_DEVICE_CUDA) return trace_workspace(s);
#else
    (void)s;
#endif
    return std::size_t(0);
  });
}

FLASHLAB_API flashlab_status flashlab_stream_trace(const flashlab_stream_problem* problem, flashlab_device device,
                                                   flashlab_tensor q, flashlab_tensor k, flashlab_tensor v,
                                                   const int64_t* indices, flashlab_tensor o,
                                                   flashlab_stream_edge* edges, void* workspace,
                                                   size_t workspace_bytes, void* stream) {
  return guard("flashlab_stream_trace", [&] {
    const Stream s = checked_problem(problem, device, Pass::trace);
    if (s.n_q > INT32_MAX || s.n_k > INT32_MAX)
      fail(FLASHLAB_ERROR_UNSUPPORTED, "n_q = " + std::to_string(s.n_q) + ", n_k = " + std::to_string(s.n_k) +
                                           ": the edge records hold 32-bit block indices",
           "use larger blocks (block_q, block_k)");
    const flashlab_dtype dt = s.abi.dtype;
    const Qkv in = qkv_args(q, k, v, s.ext, s.ext, dt, device);
    array_arg("indices", indices, device);
    std::optional<Strided> os;
    if (o.data != nullptr) os = tensor_arg("o", o, s.ext, dt, device, Role::output);
    array_arg("edges", edges, device);
    if (device == FLASHLAB_DEVICE_CPU) {
      (void)workspace;
      (void)workspace_bytes;
      (void)stream;
      if (dt == FLASHLAB_DTYPE_F64) cpu_apply<double>(s, in, indices, os, edges);
      else cpu_apply<float>(s, in, indices, os, edges);
      return;
    }
#if FLASHLAB_CAPI_HAVE_CUDA
    workspace_arg(workspace, workspace_bytes, trace_workspace(s), device);
    if (dt != FLASHLAB_DTYPE_F32) {
      // The fast trace writes the records only: O, when wanted, comes from the fast apply.
      static_assert(sizeof(fs::FastEdge) == sizeof(flashlab_stream_edge) &&
                        offsetof(fs::FastEdge, slot) == offsetof(flashlab_stream_edge, slot) &&
                        offsetof(fs::FastEdge, value_norm) == offsetof(flashlab_stream_edge, value_norm),
                    "the fast trace writes flashlab_stream_edge");
      kernel_limits("the CUDA trace refuses this problem", [&] {
        if (os) fs::stream_fast_apply_device(apply_shape(s), in.q.data, in.k.data, in.v.data, indices, os->data, stream);
        fs::stream_fast_trace_device(apply_shape(s), in.q.data, in.k.data, in.v.data, indices,
                                     reinterpret_cast<fs::FastEdge*>(edges), stream);
      });
      return;
    }
    auto* records = reinterpret_cast<rs::Edge*>(static_cast<char*>(workspace) + trace_records_offset(s));
    static_assert(sizeof(fs::CompactEdge) == sizeof(flashlab_stream_edge) &&
                      offsetof(fs::CompactEdge, slot) == offsetof(flashlab_stream_edge, slot) &&
                      offsetof(fs::CompactEdge, value_norm) == offsetof(flashlab_stream_edge, value_norm),
                  "the narrowed records are flashlab_stream_edge");
    kernel_limits("the CUDA trace refuses this problem", [&] {
      fs::stream_trace_device(block_mask(s), 1, std::size_t(s.abi.head_dim), std::size_t(s.abi.head_dim), s.k,
                              reinterpret_cast<const float*>(in.q.data), reinterpret_cast<const float*>(in.k.data),
                              reinterpret_cast<const float*>(in.v.data), indices,
                              os ? reinterpret_cast<float*>(os->data) : nullptr, records, workspace, stream);
      fs::narrow_edges_device(records, reinterpret_cast<fs::CompactEdge*>(edges), std::size_t(s.n_q) * s.k, stream);
    });
#else
    (void)workspace;
    (void)workspace_bytes;
    (void)stream;
#endif
  });
}

}  // extern "C"
