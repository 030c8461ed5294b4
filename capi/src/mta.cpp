// The Multi-Token Attention entry points: flashlab_mta_problem checked once and turned into the
// family's types (ref::mta::Params for the reference, cuda::mta::FastShape for the kernels); on
// the CPU the reference's flash forward, flash backward and split-K inference on dense copies of
// the caller's tensors; on CUDA the fast kernels' device-pointer entry points
// (flashlab/cuda/mta_fast.hpp, mta_fast_backward.hpp).
#include "core.hpp"

#include "flashlab/reference/mta.hpp"

#if FLASHLAB_CAPI_HAVE_CUDA
#include "flashlab/cuda/mta_fast.hpp"
#include "flashlab/cuda/mta_fast_backward.hpp"
#endif

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <sstream>

namespace {

using namespace flashlab::capi;
namespace ref = flashlab::ref;
namespace rm = flashlab::ref::mta;

constexpr double kLog2e = 1.4426950408889634;  // log2(e): LSE in base 2 = natural LSE · log2 e
constexpr double kLn2 = 0.6931471805599453;

// Key splits of the CPU decode's split-K inference: several, so that the combine step runs too.
constexpr std::size_t kCpuDecodeSplits = 4;

struct Mta {
  flashlab_mta_problem abi{};
  rm::Params p;
  Extents ext;
  std::int64_t stats = 0;       // B·H·N
  std::size_t w_elements = 0;   // H·cq·ck
  std::int64_t decode_rows = 0; // R = min(16, N)
#if FLASHLAB_CAPI_HAVE_CUDA
  flashlab::cuda::mta::FastShape fast;
#endif
};

#if FLASHLAB_CAPI_HAVE_CUDA
namespace fm = flashlab::cuda::mta;

// The fast kernels' limits, stated by check_fast_shape(); their shape type holds ints.
void cuda_limits(Mta& m) {
  const flashlab_mta_problem& s = m.abi;
  const std::pair<const char*, std::int64_t> fields[] = {{"problem->batch", s.batch},   {"problem->seq", s.seq},
                                                         {"problem->heads", s.heads},   {"problem->head_dim", s.head_dim},
                                                         {"problem->cq", s.cq},         {"problem->ck", s.ck}};
  for (const auto& [field, value] : fields)
    if (value > INT_MAX)
      fail(FLASHLAB_ERROR_UNSUPPORTED, std::string(field) + " = " + std::to_string(value) + " is above the CUDA kernels' 32-bit sizes",
           "split the problem over several calls");
  m.fast.batch = int(s.batch);
  m.fast.seq = int(s.seq);
  m.fast.heads = int(s.heads);
  m.fast.head_dim = int(s.head_dim);
  m.fast.cq = int(s.cq);
  m.fast.ck = int(s.ck);
  m.fast.dtype = to_ref_dtype(s.dtype);
  m.fast.scale = float(s.scale);
  kernel_limits("the CUDA kernels refuse this problem", [&] { fm::check_fast_shape(m.fast); });
}
#endif

Mta checked_problem(const flashlab_mta_problem* problem, flashlab_device device) {
  Mta m;
  m.abi = read_struct(problem, "problem", "flashlab_mta_problem", flashlab_mta_defaults());
  check_device(device);
  const flashlab_mta_problem& s = m.abi;
  require_range("problem->batch", s.batch, 1, kMaxDim, "tensors are [B, N, H, d]; B is at least 1");
  require_range("problem->seq", s.seq, 1, kMaxDim, "give at least one token");
  require_range("problem->heads", s.heads, 1, kMaxDim, "tensors are [B, N, H, d]; H is at least 1");
  require_range("problem->head_dim", s.head_dim, 1, kMaxDim, "give the head dimension, e.g. 64");
  require_range("problem->cq", s.cq, 1, 1 << 20, "kernel rows: the row itself and cq - 1 past queries");
  require_range("problem->ck", s.ck, 1, 1 << 20, "kernel columns, odd: (ck - 1)/2 keys on each side");
  if (s.ck % 2 == 0)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, "problem->ck = " + std::to_string(s.ck) + " is even",
         "ck must be odd so that (ck - 1)/2 key columns pad each side");
  if (!(s.scale >= 0.0) || !std::isfinite(s.scale)) {
    std::ostringstream v;
    v << s.scale;
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, "problem->scale = " + v.str() + " is not finite and non-negative",
         "0 means 1/sqrt(d)");
  }
  check_dtype(s.dtype, device, "problem->dtype");
  (void)checked_product({s.batch, s.seq, s.heads, s.head_dim}, "B·N·H·d");
  m.stats = checked_product({s.batch, s.heads, s.seq}, "B·H·N");
  m.w_elements = std::size_t(checked_product({s.heads, s.cq, s.ck}, "H·cq·ck"));
  m.p.cq = std::size_t(s.cq);
  m.p.ck = std::size_t(s.ck);
  // The reference's loaded tile B: any B above the halos gives the same result; this one leaves
  // every pass (the backward's doubled halos too) at least 64 effective rows and columns.
  m.p.block = 2 * m.p.pq() + 4 * m.p.pk() + 64;
  m.p.splits = 1;
  if (s.scale != 0.0) m.p.scale = s.scale;
  m.ext = Extents{s.batch, s.seq, s.heads, s.head_dim};
  m.decode_rows = std::min<std::int64_t>(FLASHLAB_MTA_DECODE_ROWS, s.seq);
#if FLASHLAB_CAPI_HAVE_CUDA
  if (device == FLASHLAB_DEVICE_CUDA) cuda_limits(m);
#endif
  return m;
}

// The decode's own limit on both devices: its 16-row query tile holds the Pq rows above.
void decode_limits(const Mta& m) {
  if (m.abi.cq > FLASHLAB_MTA_DECODE_ROWS)
    fail(FLASHLAB_ERROR_UNSUPPORTED,
         "problem->cq = " + std::to_string(m.abi.cq) + " is above 16: the decode's 16-row query tile holds cq - 1 rows above",
         "run the forward and read its last rows");
}

template <typename T>
rm::Weights<T> weights(const Mta& m, const void* w) {
  rm::Weights<T> out(std::size_t(m.abi.heads), m.p.cq, m.p.ck);
  std::memcpy(out.data(), w, m.w_elements * sizeof(T));
  return out;
}

template <typename T>
void cpu_forward(const Mta& m, const Qkv& in, const void* w, const Strided& o, void* lse) {
  const auto f = rm::flash_forward<T>(gather<T>(in.q), gather<T>(in.k), gather<T>(in.v), weights<T>(m, w), m.p);
  scatter(f.o, o);
  // LSE `[B, H, N]` in base 2 from the reference's M and ℓ (`[B, N, H, 1]`, natural units):
  // LSE_i = (m_i + ln ℓ_i) · log2 e.
  T* L = static_cast<T*>(lse);
  const flashlab_mta_problem& s = m.abi;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads; ++h)
      for (std::int64_t n = 0; n < s.seq; ++n) {
        const auto i = [&](const ref::Tensor<T>& t) { return t.at(std::size_t(b), std::size_t(n), std::size_t(h), 0); };
        L[(b * s.heads + h) * s.seq + n] = T((double(i(f.m)) + std::log(double(i(f.l)))) * kLog2e);
      }
}

template <typename T>
void cpu_backward(const Mta& m, const Qkv& in, const void* w, const Strided& o, const void* lse, const Strided& d_o,
                  const Strided& dq, const Strided& dk, const Strided& dv, void* dw) {
  const flashlab_mta_problem& s = m.abi;
  // The reference's backward reads M and ℓ and forms LSE = M + ln ℓ: M = LSE in natural units and
  // ℓ = 1 give it the caller's LSE exactly.
  const ref::Shape stat{std::size_t(s.batch), std::size_t(s.seq), std::size_t(s.heads), 1};
  ref::Tensor<T> M(stat), L(stat);
  L.fill(T(1));
  const T* lse_b2 = static_cast<const T*>(lse);
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads; ++h)
      for (std::int64_t n = 0; n < s.seq; ++n)
        M.at(std::size_t(b), std::size_t(n), std::size_t(h), 0) = T(double(lse_b2[(b * s.heads + h) * s.seq + n]) * kLn2);
  const auto g = rm::flash_backward<T>(gather<T>(in.q), gather<T>(in.k), gather<T>(in.v), weights<T>(m, w), gather<T>(o),
                                       M, L, gather<T>(d_o), m.p);
  scatter(g.dq, dq);
  scatter(g.dk, dk);
  scatter(g.dv, dv);
  std::memcpy(dw, g.dw.data(), m.w_elements * sizeof(T));
}

// The first `rows` tokens of a [B, N, H, d] tensor.
template <typename T>
ref::Tensor<T> prefix(const ref::Tensor<T>& x, std::size_t rows) {
  const ref::Shape& s = x.shape();
  ref::Tensor<T> out(ref::Shape{s.batch, rows, s.heads, s.head_dim});
  const std::size_t token = s.heads * s.head_dim;
  for (std::size_t b = 0; b < s.batch; ++b)
    std::memcpy(out.data() + b * rows * token, x.data() + b * s.seq * token, rows * token * sizeof(T));
  return out;
}

// The decode on the CPU: the reference's split-K inference computes the last token's output, so
// row N − R + r is the inference over the first N − R + r + 1 tokens.
template <typename T>
void cpu_decode(const Mta& m, const Qkv& in, const void* w, const Strided& o) {
  const flashlab_mta_problem& s = m.abi;
  const ref::Tensor<T> Q = gather<T>(in.q), K = gather<T>(in.k), V = gather<T>(in.v);
  const rm::Weights<T> W = weights<T>(m, w);
  rm::Params p = m.p;
  p.splits = kCpuDecodeSplits;
  ref::Tensor<T> out(ref::Shape{std::size_t(s.batch), std::size_t(m.decode_rows), std::size_t(s.heads),
                                std::size_t(s.head_dim)});
  for (std::int64_t r = 0; r < m.decode_rows; ++r) {
    const std::size_t tokens = std::size_t(s.seq - m.decode_rows + r + 1);
    const ref::Tensor<T> last = rm::flash_infer<T>(prefix(Q, tokens), prefix(K, tokens), prefix(V, tokens), W, p);
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h)
        for (std::int64_t c = 0; c < s.head_dim; ++c)
          out.at(std::size_t(b), std::size_t(r), std::size_t(h), std::size_t(c)) =
              last.at(std::size_t(b), 0, std::size_t(h), std::size_t(c));
  }
  scatter(out, o);
}

std::size_t backward_workspace(const Mta& m, flashlab_device device) {
#if FLASHLAB_CAPI_HAVE_CUDA
  if (device == FLASHLAB_DEVICE_CUDA) return fm::fast_backward_workspace_bytes(m.fast);
#else
  (void)m;
  (void)device;
#endif
  return 0;
}

std::size_t decode_workspace(const Mta& m, flashlab_device device) {
#if FLASHLAB_CAPI_HAVE_CUDA
  if (device == FLASHLAB_DEVICE_CUDA) {
    std::size_t bytes = 0;
    kernel_limits("the CUDA decode refuses this problem", [&] { bytes = fm::fast_decode_workspace_bytes(m.fast); });
    return bytes;
  }
#else
  (void)m;
  (void)device;
#endif
  return 0;
}

}  // namespace

extern "C" {

FLASHLAB_API flashlab_mta_problem flashlab_mta_defaults(void) {
  flashlab_mta_problem p{};
  p.struct_size = sizeof p;
  p.batch = 1;
  p.heads = 1;
  p.cq = 1;
  p.ck = 1;
  p.dtype = FLASHLAB_DTYPE_BF16;
  return p;
}

FLASHLAB_API flashlab_status flashlab_mta_forward_workspace_size(const flashlab_mta_problem* problem,
                                                                 flashlab_device device, size_t* bytes) {
  return size_query("flashlab_mta_forward_workspace_size", bytes, [&] {
    (void)checked_problem(problem, device);
    return std::size_t(0);
  });
}

FLASHLAB_API flashlab_status flashlab_mta_forward(const flashlab_mta_problem* problem, flashlab_device device,
                                                  flashlab_tensor q, flashlab_tensor k, flashlab_tensor v,
                                                  const void* w, flashlab_tensor o, void* lse, void* workspace,
                                                  size_t workspace_bytes, void* stream) {
  return guard("flashlab_mta_forward", [&] {
    const Mta m = checked_problem(problem, device);
    const flashlab_dtype dt = m.abi.dtype;
    const Qkv in = qkv_args(q, k, v, m.ext, m.ext, dt, device);
    array_arg("w", w, device);
    const Strided os = tensor_arg("o", o, m.ext, dt, device, Role::output);
    array_arg("lse", lse, device);
    (void)workspace;
    (void)workspace_bytes;
    if (device == FLASHLAB_DEVICE_CPU) {
      if (dt == FLASHLAB_DTYPE_F64) cpu_forward<double>(m, in, w, os, lse);
      else cpu_forward<float>(m, in, w, os, lse);
      return;
    }
#if FLASHLAB_CAPI_HAVE_CUDA
    kernel_limits("the CUDA forward refuses this problem", [&] {
      fm::fast_forward_device(m.fast, in.q.data, in.k.data, in.v.data, static_cast<const float*>(w), os.data,
                              static_cast<float*>(lse), stream);
    });
#else
    (void)stream;
#endif
  });
}

FLASHLAB_API flashlab_status flashlab_mta_backward_workspace_size(const flashlab_mta_problem* problem,
                                                                  flashlab_device device, size_t* bytes) {
  return size_query("flashlab_mta_backward_workspace_size", bytes,
                    [&] { return backward_workspace(checked_problem(problem, device), device); });
}

FLASHLAB_API flashlab_status flashlab_mta_backward(const flashlab_mta_problem* problem, flashlab_device device,
                                                   flashlab_tensor q, flashlab_tensor k, flashlab_tensor v,
                                                   const void* w, flashlab_tensor o, const void* lse,
                                                   flashlab_tensor d_o, flashlab_tensor dq, flashlab_tensor dk,
                                                   flashlab_tensor dv, void* dw, void* workspace,
                                                   size_t workspace_bytes, void* stream) {
  return guard("flashlab_mta_backward", [&] {
    const Mta m = checked_problem(problem, device);
    const flashlab_dtype dt = m.abi.dtype;
    const Qkv in = qkv_args(q, k, v, m.ext, m.ext, dt, device);
    array_arg("w", w, device);
    const Strided os = tensor_arg("o", o, m.ext, dt, device, Role::input);
    array_arg("lse", lse, device);
    const Strided dos = tensor_arg("d_o", d_o, m.ext, dt, device, Role::input);
    const Strided dqs = tensor_arg("dq", dq, m.ext, dt, device, Role::output);
    const Strided dks = tensor_arg("dk", dk, m.ext, dt, device, Role::output);
    const Strided dvs = tensor_arg("dv", dv, m.ext, dt, device, Role::output);
    array_arg("dw", dw, device);
    if (device == FLASHLAB_DEVICE_CPU) {
      if (dt == FLASHLAB_DTYPE_F64) cpu_backward<double>(m, in, w, os, lse, dos, dqs, dks, dvs, dw);
      else cpu_backward<float>(m, in, w, os, lse, dos, dqs, dks, dvs, dw);
      return;
    }
#if FLASHLAB_CAPI_HAVE_CUDA
    workspace_arg(workspace, workspace_bytes, backward_workspace(m, device), device);
    fm::FastBackwardPointers ptrs{in.q.data,
                                  in.k.data,
                                  in.v.data,
                                  static_cast<const float*>(w),
                                  os.data,
                                  dos.data,
                                  static_cast<const float*>(lse),
                                  dqs.data,
                                  dks.data,
                                  dvs.data,
                                  static_cast<float*>(dw)};
    kernel_limits("the CUDA backward refuses this problem",
                  [&] { fm::fast_backward_device(m.fast, ptrs, workspace, stream); });
#else
    (void)workspace;
    (void)workspace_bytes;
    (void)stream;
#endif
  });
}

FLASHLAB_API flashlab_status flashlab_mta_decode_workspace_size(const flashlab_mta_problem* problem,
                                                                flashlab_device device, size_t* bytes) {
  return size_query("flashlab_mta_decode_workspace_size", bytes, [&] {
    const Mta m = checked_problem(problem, device);
    decode_limits(m);
    return decode_workspace(m, device);
  });
}

FLASHLAB_API flashlab_status flashlab_mta_decode(const flashlab_mta_problem* problem, flashlab_device device,
                                                 flashlab_tensor q, flashlab_tensor k, flashlab_tensor v,
                                                 const void* w, flashlab_tensor o, void* workspace,
                                                 size_t workspace_bytes, void* stream) {
  return guard("flashlab_mta_decode", [&] {
    const Mta m = checked_problem(problem, device);
    decode_limits(m);
    const flashlab_dtype dt = m.abi.dtype;
    const Qkv in = qkv_args(q, k, v, m.ext, m.ext, dt, device);
    array_arg("w", w, device);
    Extents out = m.ext;
    out.n = m.decode_rows;
    const Strided os = tensor_arg("o", o, out, dt, device, Role::output);
    if (device == FLASHLAB_DEVICE_CPU) {
      if (dt == FLASHLAB_DTYPE_F64) cpu_decode<double>(m, in, w, os);
      else cpu_decode<float>(m, in, w, os);
      return;
    }
#if FLASHLAB_CAPI_HAVE_CUDA
    workspace_arg(workspace, workspace_bytes, decode_workspace(m, device), device);
    fm::FastDecodePointers ptrs{in.q.data, in.k.data, in.v.data, static_cast<const float*>(w), os.data, nullptr};
    kernel_limits("the CUDA decode refuses this problem",
                  [&] { fm::fast_decode_device(m.fast, ptrs, workspace, stream); });
#else
    (void)workspace;
    (void)workspace_bytes;
    (void)stream;
#endif
  });
}

}  // extern "C"
