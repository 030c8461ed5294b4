// The Multi-Token Attention family's front door (mta.hpp, mta_fast.hpp, mta_fast_backward.hpp):
// the limits of its kernels, each checked once, here and nowhere else (the clear kernels' launch
// description, make_launch; the fast kernels' check_fast_shape and the source-order variant's
// limits), the choices made for the device (the linear path, the decode's key splits), and the
// entry points on the caller's device memory: fast_forward_device, fast_backward_device and
// fast_decode_device with their workspace sizes. Those check their pointers, launch on the
// caller's stream and do nothing else: no host copy, no allocation, no synchronisation (the
// backward zeroes its accumulators with cudaMemsetAsync on that stream), so they may run from
// several host threads on several streams at once and under CUDA graph capture. The host-tensor
// entries of the tests and the CLI are thin wrappers over these, in host.cpp.
#include "core/common.hpp"
#include "core/device_pointer.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/mta.hpp"
#include "flashlab/cuda/mta_fast.hpp"
#include "flashlab/cuda/mta_fast_backward.hpp"
#include "mta/front_door.hpp"
#include "mta/mta_fast_launch.hpp"
#include "mta/mta_fast_tile.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace flashlab::cuda::detail::mta {

static_assert(kInferQueryRows == int(ref::mta::kInferQueryRows), "the device query tile must match the reference's");

namespace {
int to_int(std::size_t v, const char* what) {
  if (v > (std::size_t(1) << 30))
    throw std::invalid_argument(std::string("flashlab::cuda::mta: ") + what + " = " + std::to_string(v) +
                                " is too large for the kernels' int indexing");
  return int(v);
}
}  // namespace

Launch make_launch(const ref::Shape& shape, const ref::mta::Params& p, bool backward) {
  const ref::mta::Tiling t = backward ? ref::mta::backward_tiling(shape.seq, p) : ref::mta::forward_tiling(shape.seq, p);
  Launch L;
  L.batch = to_int(shape.batch, "batch");
  L.seq = to_int(shape.seq, "SEQ");
  L.heads = to_int(shape.heads, "HEAD_NUM");
  L.head_dim = to_int(shape.head_dim, "HEAD_DIM");
  if (std::size_t(L.batch) * L.seq * L.heads * std::size_t(L.head_dim) > (std::size_t(1) << 34))
    throw std::invalid_argument("flashlab::cuda::mta: tensors of " + shape.str() + " are too large");
  L.cq = to_int(p.cq, "cq");
  L.ck = to_int(p.ck, "ck");
  L.pq = int(p.pq());
  L.pk = int(p.pk());
  L.block = to_int(p.block, "block B");
  L.br = int(t.br);
  L.bc = int(t.bc);
  L.tr = int(t.tr);
  L.tc = int(t.tc);
  L.splits = to_int(p.splits, "splits");
  L.tk = (L.seq + L.splits * L.bc - 1) / (L.splits * L.bc);  // T_k = ⌈N / (N_splits · Bc)⌉
  L.scale = float(ref::mta::resolve_scale(p, shape.head_dim));
  if (L.heads > 65535 || L.batch > 65535)
    throw std::invalid_argument("flashlab::cuda::mta: HEAD_NUM and batch must be at most 65535 (grid dimensions)");
  return L;
}

void set_smem(const void* kernel, std::size_t bytes, const char* kernel_name, const Launch& L) {
  ::flashlab::cuda::detail::opt_in_smem(kernel, bytes, [&](std::size_t optin) {
    std::ostringstream os;
    os << "flashlab::cuda::mta: " << kernel_name << " needs " << bytes << " bytes of shared memory for block B = "
       << L.block << ", HEAD_DIM = " << L.head_dim << ", cq x ck = " << L.cq << " x " << L.ck
       << " but the device allows " << optin << " (hint: use a smaller --block, e.g. 32)";
    throw std::invalid_argument(os.str());
  });
}

}  // namespace flashlab::cuda::detail::mta

namespace flashlab::cuda::mta {

static_assert(kFastBr == detail::mta::kFastBr && kFastBc == detail::mta::kFastBc,
              "the public tile sizes are the kernel's");
static_assert(kFastLinearMaxCk == detail::mta::kLinearMaxCk, "the public linear-path limit is the kernel's");
static_assert(kFastMaxCq <= detail::mta::kHaloRows && (kFastMaxCk - 1) / 2 <= detail::mta::kHaloCols,
              "the fixed halos hold the largest kernel");

namespace {

[[noreturn]] void refuse(const std::string& field, long long value, const std::string& rule) {
  throw std::invalid_argument("flashlab::cuda::mta fast forward: " + field + " = " + std::to_string(value) + " " +
                              rule);
}

float scale_of(const FastShape& s) { return s.scale > 0.f ? s.scale : 1.f / std::sqrt(float(s.head_dim)); }

/// A device pointer argument of an entry point (core/device_pointer.hpp).
void require_device_pointer(const char* entry, const char* name, const void* ptr, std::size_t alignment) {
  const std::string why = detail::device_pointer_problem(ptr, alignment);
  if (!why.empty()) throw std::invalid_argument(std::string("flashlab::cuda::mta: ") + entry + ": " + name + " " + why);
}
}  // namespace

void check_fast_shape(const FastShape& s) {
  if (s.batch < 1 || s.batch > 65535) refuse("batch", s.batch, "must be in [1, 65535] (grid dimension)");
  if (s.heads < 1 || s.heads > 65535) refuse("HEAD_NUM", s.heads, "must be in [1, 65535] (grid dimension)");
  if (s.seq < 1) refuse("SEQ", s.seq, "must be >= 1");
  if (s.head_dim != 64 && s.head_dim != 128)
    refuse("HEAD_DIM", s.head_dim, "is not 64 or 128 (hint: the fast kernels are compiled for d = 64 and 128; "
                                   "the clear kernels take any d)");
  if (s.cq < 1 || s.cq > kFastMaxCq)
    refuse("cq", s.cq, "is outside [1, " + std::to_string(kFastMaxCq) + "] (hint: the 16-row halo holds Pq <= 15)");
  if (s.ck < 1 || s.ck > kFastMaxCk || s.ck % 2 == 0)
    refuse("ck", s.ck, "is not odd in [1, " + std::to_string(kFastMaxCk) + "] (hint: the 8-key halos hold Pk <= 7)");
  if (s.dtype != ref::Dtype::bf16 && s.dtype != ref::Dtype::fp16)
    throw std::invalid_argument("flashlab::cuda::mta fast forward: dtype = " + std::string(ref::dtype_name(s.dtype)) +
                                " is not bf16 or fp16 (hint: fp32 runs on the clear kernels)");
  if (!(s.scale >= 0.f) || !std::isfinite(s.scale))
    throw std::invalid_argument("flashlab::cuda::mta fast forward: scale must be finite and >= 0 (0: 1/sqrt(d))");
  if (double(s.batch) * s.seq * s.heads * s.head_dim >= double(1u << 31))
    throw std::invalid_argument("flashlab::cuda::mta fast forward: B*N*H*d must be below 2^31 (int indexing)");
  if (s.linear_path < -1 || s.linear_path > 1)
    refuse("linear_path", s.linear_path, "is not -1 (policy), 0 (off) or 1 (on)");
  if (s.linear_path == 1 && (s.dtype != ref::Dtype::bf16 || s.ck > kFastLinearMaxCk))
    refuse("linear_path", s.linear_path,
           "needs bf16 and ck <= " + std::to_string(kFastLinearMaxCk) +
               " (hint: 0 or -1 for fp16 or wider kernels: their Q~ would overflow fp16 or SRAM)");
}

bool fast_uses_linear_path(const FastShape& s) {
  if (s.linear_path >= 0) return s.linear_path == 1;
  return s.dtype == ref::Dtype::bf16 && s.head_dim == 64 && s.ck <= kFastLinearMaxCk && s.ck <= s.cq;
}

namespace {

detail::mta::FastLaunch launch_of(const FastShape& shape) {
  detail::mta::FastLaunch L;
  L.batch = shape.batch;
  L.seq = shape.seq;
  L.heads = shape.heads;
  L.head_dim = shape.head_dim;
  L.cq = shape.cq;
  L.ck = shape.ck;
  L.bf16 = shape.dtype == ref::Dtype::bf16;
  L.scale_log2 = float(double(scale_of(shape)) * 1.4426950408889634);  // · log2(e)
  L.linear = fast_uses_linear_path(shape);
  return L;
}

}  // namespace

void fast_forward_device(const FastShape& shape, const void* Q, const void* K, const void* V, const float* W, void* O,
                         float* LSE, void* stream) {
  check_fast_shape(shape);
  for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"Q", Q}, {"K", K}, {"V", V}, {"O", O}})
    require_device_pointer("fast_forward_device", name, ptr, 16);
  require_device_pointer("fast_forward_device", "W", W, 4);
  require_device_pointer("fast_forward_device", "LSE", LSE, 4);
  detail::mta::launch_fast_forward(launch_of(shape), Q, K, V, W, O, LSE, static_cast<cudaStream_t>(stream));
}

void check_fast_source_order(const FastShape& shape) {
  check_fast_shape(shape);
  if (shape.dtype != ref::Dtype::bf16 || shape.head_dim != 64)
    throw std::invalid_argument("flashlab::cuda::mta fast forward: the source-order variant is compiled for bf16 at "
                                "d = 64 only, not " + std::string(ref::dtype_name(shape.dtype)) + " at d = " +
                                std::to_string(shape.head_dim) + " (hint: the on-chip order takes every shape)");
}

std::size_t fast_source_order_workspace_bytes(const FastShape& shape) {
  check_fast_source_order(shape);
  const std::size_t rows = std::size_t((shape.seq + kFastBr - 1) / kFastBr) * kFastBr;
  return 4 * std::size_t(shape.batch) * std::size_t(shape.heads) * rows * std::size_t(shape.head_dim + 2);
}

void fast_forward_source_order_device(const FastShape& shape, const void* Q, const void* K, const void* V,
                                      const float* W, void* O, float* LSE, void* workspace, void* stream) {
  check_fast_source_order(shape);
  detail::mta::launch_fast_forward_source_order(launch_of(shape), Q, K, V, W, O, LSE, static_cast<float*>(workspace),
                                                static_cast<cudaStream_t>(stream));
}

// ---------------------------------------------------------------------------------- backward

namespace dmf = detail::mta_fast;

namespace {

std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

/// Backward geometry: Br = 64 − 2Pq, Bc = 128 − 4Pk (≥ 34 and ≥ 100 within the limits).
dmf::Geometry make_geometry(const FastShape& shape) {
  check_fast_shape(shape);
  dmf::Geometry g;
  g.batch = shape.batch;
  g.seq = shape.seq;
  g.heads = shape.heads;
  g.head_dim = shape.head_dim;
  g.cq = shape.cq;
  g.ck = shape.ck;
  g.pq = g.cq - 1;
  g.pk = (g.ck - 1) / 2;
  g.br = dmf::kBwdBlockM - 2 * g.pq;
  g.bc = dmf::kBwdBlockN - 4 * g.pk;
  g.tr = (g.seq + g.br - 1) / g.br;
  g.tc = (g.seq + g.bc - 1) / g.bc;
  g.scale = shape.scale > 0.f ? shape.scale : 1.f / std::sqrt(float(shape.head_dim));
  return g;
}

std::size_t numel(const FastShape& s) { return std::size_t(s.batch) * s.seq * s.heads * s.head_dim; }
std::size_t stats(const FastShape& s) { return std::size_t(s.batch) * s.heads * s.seq; }

}  // namespace

std::size_t fast_backward_workspace_bytes(const FastShape& shape) {
  return align256(stats(shape) * sizeof(float)) + align256(numel(shape) * sizeof(float));
}

void fast_backward_device(const FastShape& shape, const FastBackwardPointers& ptrs, void* workspace, void* stream) {
  const dmf::Geometry g = make_geometry(shape);
  constexpr const char* kEntry = "fast_backward_device";
  for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"Q", ptrs.Q}, {"K", ptrs.K}, {"V", ptrs.V},
                                  {"O", ptrs.O}, {"dO", ptrs.dO}, {"dQ", ptrs.dQ}, {"dK", ptrs.dK}, {"dV", ptrs.dV}})
    require_device_pointer(kEntry, name, ptr, 16);
  for (const auto& [name, ptr] :
       {std::pair<const char*, const void*>{"W", ptrs.W}, {"LSE", ptrs.LSE}, {"dW", ptrs.dW}})
    require_device_pointer(kEntry, name, ptr, 4);
  require_device_pointer(kEntry, "workspace", workspace, 256);
  auto* ws = static_cast<unsigned char*>(workspace);
  dmf::BwdArgs a{};
  a.Q = static_cast<const std::uint16_t*>(ptrs.Q);
  a.K = static_cast<const std::uint16_t*>(ptrs.K);
  a.V = static_cast<const std::uint16_t*>(ptrs.V);
  a.O = static_cast<const std::uint16_t*>(ptrs.O);
  a.dO = static_cast<const std::uint16_t*>(ptrs.dO);
  a.W = ptrs.W;
  a.LSE = ptrs.LSE;
  a.D = reinterpret_cast<float*>(ws);
  a.dQaccum = reinterpret_cast<float*>(ws + align256(stats(shape) * sizeof(float)));
  a.dQ = static_cast<std::uint16_t*>(ptrs.dQ);
  a.dK = static_cast<std::uint16_t*>(ptrs.dK);
  a.dV = static_cast<std::uint16_t*>(ptrs.dV);
  a.dW = ptrs.dW;
  dmf::launch_backward(g, shape.dtype == ref::Dtype::bf16, a, static_cast<cudaStream_t>(stream));
}

namespace {

/// Decode geometry: Bc = kDecodeBlockN owned keys per tile (any kernel size), T_k whole tiles
/// per split.
dmf::Geometry decode_geometry(const FastShape& shape) {
  dmf::Geometry g = make_geometry(shape);
  const int bc = dmf::kDecodeBlockN, tiles = (g.seq + bc - 1) / bc;
  int dev = 0, sms = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  // One wave: as many splits per head as the device's resident blocks allow (each split then
  // streams an equal share of the keys; a second, partial wave would leave most SMs idle).
  const int heads = g.batch * g.heads, wanted = std::max(1, sms * dmf::kDecodeBlocksPerSm / heads);
  const int per_split = (tiles + wanted - 1) / std::min(wanted, tiles);
  g.splits = (tiles + per_split - 1) / per_split;  // every split has at least one tile
  g.keys_per_split = per_split * bc;
  return g;
}

}  // namespace

int fast_decode_splits(const FastShape& shape) { return decode_geometry(shape).splits; }

std::size_t fast_decode_workspace_bytes(const FastShape& shape) {
  const std::size_t parts = stats(shape) / shape.seq * std::size_t(fast_decode_splits(shape)) * kDecodeRows;
  return align256(parts * shape.head_dim * sizeof(float)) + 2 * align256(parts * sizeof(float));
}

void fast_decode_device(const FastShape& shape, const FastDecodePointers& ptrs, void* workspace, void* stream) {
  const dmf::Geometry g = decode_geometry(shape);
  constexpr const char* kEntry = "fast_decode_device";
  for (const auto& [name, ptr] :
       {std::pair<const char*, const void*>{"Q", ptrs.Q}, {"K", ptrs.K}, {"V", ptrs.V}, {"O", ptrs.O}})
    require_device_pointer(kEntry, name, ptr, 16);
  require_device_pointer(kEntry, "W", ptrs.W, 4);
  if (ptrs.LSE != nullptr) require_device_pointer(kEntry, "LSE", ptrs.LSE, 4);
  require_device_pointer(kEntry, "workspace", workspace, 256);
  const std::size_t parts = stats(shape) / shape.seq * std::size_t(g.splits) * kDecodeRows;
  auto* ws = static_cast<unsigned char*>(workspace);
  dmf::DecodeArgs a{};
  a.Q = static_cast<const std::uint16_t*>(ptrs.Q);
  a.K = static_cast<const std::uint16_t*>(ptrs.K);
  a.V = static_cast<const std::uint16_t*>(ptrs.V);
  a.W = ptrs.W;
  a.O_s = reinterpret_cast<float*>(ws);
  a.m_s = reinterpret_cast<float*>(ws + align256(parts * shape.head_dim * sizeof(float)));
  a.l_s = reinterpret_cast<float*>(ws + align256(parts * shape.head_dim * sizeof(float)) + align256(parts * sizeof(float)));
  a.O = static_cast<std::uint16_t*>(ptrs.O);
  a.LSE = ptrs.LSE;
  dmf::launch_decode(g, shape.dtype == ref::Dtype::bf16, a, static_cast<cudaStream_t>(stream));
}

}  // namespace flashlab::cuda::mta
