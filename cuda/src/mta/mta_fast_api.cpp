// Host API of the fast MTA forward (mta_fast.hpp): the limits (check_fast_shape, the one place
// they are stated), the device-pointer launch and the host-level call on reference tensors.
#include "core/common.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/cuda/mta_fast.hpp"
#include "mta/mta_fast_tile.cuh"

#include <cmath>
#include <stdexcept>
#include <string>

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

FastForwardOutput fast_forward(const ref::Tensor<float>& q, const ref::Tensor<float>& k, const ref::Tensor<float>& v,
                               const ref::mta::Weights<float>& w, const ref::mta::Params& p, ref::Dtype dtype,
                               int linear_path, FastOOrder order) {
  ref::mta::validate(q, k, v, w, p);
  const ref::Shape& sh = q.shape();
  FastShape shape;
  auto narrow = [](std::size_t x) { return x > (std::size_t(1) << 30) ? -1 : int(x); };  // refused below
  shape.batch = narrow(sh.batch);
  shape.seq = narrow(sh.seq);
  shape.heads = narrow(sh.heads);
  shape.head_dim = narrow(sh.head_dim);
  shape.cq = narrow(p.cq);
  shape.ck = narrow(p.ck);
  shape.dtype = dtype;
  shape.scale = float(ref::mta::resolve_scale(p, sh.head_dim));
  shape.linear_path = linear_path;
  if (order == FastOOrder::source) check_fast_source_order(shape);
  else check_fast_shape(shape);
  const bool bf16 = dtype == ref::Dtype::bf16;
  auto to16 = [&](const ref::Tensor<float>& x) {
    std::vector<std::uint16_t> out(x.numel());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = bf16 ? float_to_bf16(x.data()[i]) : float_to_fp16(x.data()[i]);
    detail::DeviceBuffer<std::uint16_t> d(out.size());
    d.upload(out.data());
    return d;
  };
  detail::DeviceBuffer<std::uint16_t> dq = to16(q), dk = to16(k), dv = to16(v), dO(q.numel());
  detail::DeviceBuffer<float> dw(w.numel()), dlse(sh.batch * sh.heads * sh.seq);
  dw.upload(w.data());
  dO.poison();  // 0xFFFF is a NaN in bf16 and fp16 alike
  dlse.poison();
  if (order == FastOOrder::source) {
    detail::DeviceBuffer<float> workspace(fast_source_order_workspace_bytes(shape) / 4);
    workspace.poison();  // the kernel must not read what it has not written
    fast_forward_source_order_device(shape, dq.get(), dk.get(), dv.get(), dw.get(), dO.get(), dlse.get(),
                                     workspace.get(), nullptr);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());  // before the workspace is freed
  } else {
    fast_forward_device(shape, dq.get(), dk.get(), dv.get(), dw.get(), dO.get(), dlse.get(), nullptr);
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::uint16_t> o16(q.numel());
  dO.download(o16.data());
  FastForwardOutput out{ref::Tensor<float>(sh), std::vector<float>(dlse.size())};
  for (std::size_t i = 0; i < o16.size(); ++i) out.o.data()[i] = bf16 ? bf16_to_float(o16[i]) : fp16_to_float(o16[i]);
  dlse.download(out.lse.data());
  return out;
}

}  // namespace flashlab::cuda::mta
