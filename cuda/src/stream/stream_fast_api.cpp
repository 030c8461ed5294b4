// Host API of the fast STREAM application (flashlab/cuda/stream_fast.hpp): the one place of its
// limits, the reference's index check, upload, poison, launch, download.
#include "flashlab/cuda/stream_fast.hpp"

#include "core/common.hpp"
#include "stream/stream_fast_common.hpp"

#include <climits>
#include <string>

namespace flashlab::cuda::stream {

using ::flashlab::cuda::detail::DeviceBuffer;
using ref::stream::StreamError;

static_assert(kFastStreamBlock == std::size_t(detail::kFastBlock), "one b_q = b_k for the API and the kernel");

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
  detail::FastApplyLaunch p;
  p.T = int(shape.T);
  p.heads = int(shape.heads);
  p.n_q = int((shape.T + kFastStreamBlock - 1) / kFastStreamBlock);
  p.k = int(shape.k);
  const int group = shape.group == 0 ? fast_apply_default_group() : shape.group;
  static_assert(sizeof(long long) == sizeof(std::int64_t));
  detail::launch_fast_apply(p, int(shape.dim), group, shape.dtype == ref::Dtype::bf16, Q, K, V,
                            reinterpret_cast<const long long*>(I), O, static_cast<cudaStream_t>(stream));
}

std::vector<std::uint16_t> stream_fast_apply(ref::Dtype dtype, const HostHeads16& Q, const HostHeads16& K,
                                             const HostHeads16& V, const ref::stream::BlockMask& mask,
                                             const std::vector<std::int64_t>& indices, std::size_t k, int group) {
  const ref::stream::Geometry& g = mask.geometry();
  g.check();
  if (g.bq != kFastStreamBlock || g.bk != kFastStreamBlock)
    throw StreamError("b_q = " + std::to_string(g.bq) + ", b_k = " + std::to_string(g.bk) + ": the fast apply has b_q = b_k = " +
                      std::to_string(kFastStreamBlock) + " (hint: --bq 64 --bk 64, or the clear kernel)");
  for (const auto& [x, name] : {std::pair{&Q, "Q"}, std::pair{&K, "K"}, std::pair{&V, "V"}}) {
    if (x->data == nullptr) throw StreamError(std::string(name) + " is missing");
    if (x->heads != Q.heads || x->dim != Q.dim)
      throw StreamError(std::string(name) + " is [T, " + std::to_string(x->heads) + ", " + std::to_string(x->dim) +
                        "], Q is [T, " + std::to_string(Q.heads) + ", " + std::to_string(Q.dim) +
                        "] (the fast apply takes d_v = d)");
  }
  const FastApplyShape shape{g.T, Q.heads, Q.dim, k, dtype, group};
  check_fast_apply(shape);
  const std::size_t per_head = g.n_q() * k;
  if (indices.size() != per_head * Q.heads)
    throw StreamError("index tensor has " + std::to_string(indices.size()) + " entries, expected H·n_q·k = " +
                      std::to_string(Q.heads) + "·" + std::to_string(g.n_q()) + "·" + std::to_string(k));
  for (std::size_t h = 0; h < Q.heads; ++h) {
    const std::vector<std::int64_t> row(indices.begin() + std::ptrdiff_t(h * per_head),
                                        indices.begin() + std::ptrdiff_t((h + 1) * per_head));
    const std::string why = ref::stream::validate_indices(row, k, mask);
    if (!why.empty()) throw StreamError("I of head " + std::to_string(h) + ": " + why);
  }
  const std::size_t numel = g.T * Q.heads * Q.dim;
  DeviceBuffer<std::uint16_t> dQ(numel), dK(numel), dV(numel), dO(numel);
  DeviceBuffer<long long> dI(indices.size());
  dQ.upload(Q.data);
  dK.upload(K.data);
  dV.upload(V.data);
  dI.upload(reinterpret_cast<const long long*>(indices.data()));
  dO.poison();  // 0xFFFF is a NaN in bf16 and fp16: an unwritten row fails every comparison
  stream_fast_apply_device(shape, dQ.get(), dK.get(), dV.get(), reinterpret_cast<const std::int64_t*>(dI.get()),
                           dO.get(), nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::uint16_t> O(numel);
  dO.download(O.data());
  return O;
}

}  // namespace flashlab::cuda::stream
