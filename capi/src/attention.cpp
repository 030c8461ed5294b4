// The attention entry points: flashlab_attention_problem checked once and turned into the
// family's problem type (ref::AttentionProblem); on the CPU the reference's FA2 forward and
// two-kernel backward on dense copies of the caller's strided tensors; on CUDA the fast kernels'
// device-pointer entry points (flashlab/cuda/fast_attention.hpp), the fastest kernel the device has.
#include "core.hpp"

#include "flashlab/reference/attention.hpp"
#include "flashlab/reference/attention_problem.hpp"

#if FLASHLAB_CAPI_HAVE_CUDA
#include "flashlab/cuda/fast_attention.hpp"
#endif

#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

namespace {

using namespace flashlab::capi;
namespace ref = flashlab::ref;

// Largest value of one dimension: products stay checked (checked_product), this only keeps every
// single field sane.
constexpr std::int64_t kMaxDim = std::int64_t(1) << 40;

// A problem checked for one device, with the family's problem type built from it.
struct Attention {
  flashlab_attention_problem abi{};
  ref::AttentionProblem p;
  Extents q_ext, kv_ext;
  std::int64_t stats = 0;  // B·H·N, the entries of LSE and D
};

#if FLASHLAB_CAPI_HAVE_CUDA
namespace fc = flashlab::cuda;

// The fast kernels' limits: check_fast_problem() states them; N_k = N and the 32-bit element
// count are enforced where the launch builds its parameters, so they are checked here as well for
// flashlab_attention_check() and the size queries to see them before any launch.
void cuda_limits(const Attention& a) {
  kernel_limits("the CUDA kernels refuse this problem", [&] { fc::check_fast_problem(a.p); });
  if (a.p.n_k() != a.p.n_q())
    fail(FLASHLAB_ERROR_UNSUPPORTED,
         "problem->seq_k = " + std::to_string(a.abi.seq_k) + " differs from seq_q = " + std::to_string(a.abi.seq_q) +
             ": the CUDA kernels take N_k = N",
         "run N_k != N on FLASHLAB_DEVICE_CPU");
  const std::int64_t numel = a.abi.batch * a.abi.seq_q * a.abi.heads * a.abi.head_dim;
  if (numel >= (std::int64_t(1) << 31))
    fail(FLASHLAB_ERROR_UNSUPPORTED,
         "B·N·H·d = " + std::to_string(numel) + " is not below 2^31: the CUDA kernels index with 32-bit integers",
         "split the batch or the heads over several calls");
}
#endif

Attention checked_problem(const flashlab_attention_problem* problem, flashlab_device device) {
  Attention a;
  a.abi = read_struct(problem, "problem", "flashlab_attention_problem");
  check_device(device);
  const flashlab_attention_problem& s = a.abi;
  require_range("problem->batch", s.batch, 1, kMaxDim, "tensors are [B, N, H, d]; B is at least 1");
  require_range("problem->seq_q", s.seq_q, 1, kMaxDim, "give at least one query");
  require_range("problem->seq_k", s.seq_k, 0, kMaxDim, "0 means N_k = N");
  require_range("problem->heads", s.heads, 1, kMaxDim, "tensors are [B, N, H, d]; H is at least 1");
  require_range("problem->heads_kv", s.heads_kv, 0, kMaxDim, "0 means H_kv = H");
  require_range("problem->head_dim", s.head_dim, 1, kMaxDim, "give the head dimension, e.g. 64");
  if (!(s.scale >= 0.0) || !std::isfinite(s.scale)) {
    std::ostringstream v;
    v << s.scale;
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, "problem->scale = " + v.str() + " is not finite and non-negative",
         "0 means 1/sqrt(d)");
  }
  require_range("problem->causal", s.causal, 0, 1, "0 (no mask) or 1 (causal)");
  require_range("problem->deterministic", s.deterministic, 0, 1, "0 or 1");
  check_dtype(s.dtype, device, "problem->dtype");
  const std::int64_t seq_k = s.seq_k ? s.seq_k : s.seq_q;
  const std::int64_t heads_kv = s.heads_kv ? s.heads_kv : s.heads;
  if (heads_kv != s.heads) {
    if (s.heads % heads_kv != 0)
      fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
           "problem->heads_kv = " + std::to_string(heads_kv) + " does not divide heads = " + std::to_string(s.heads),
           "each key/value head serves H / H_kv query heads");
    fail(FLASHLAB_ERROR_UNSUPPORTED,
         "problem->heads_kv = " + std::to_string(heads_kv) + " differs from heads = " + std::to_string(s.heads) +
             ": grouped-query attention (H_kv < H) is not supported yet",
         "repeat each key/value head H / H_kv times into [B, N_k, H, d] tensors and set heads_kv = 0");
  }
  (void)checked_product({s.batch, s.seq_q, s.heads, s.head_dim}, "B·N·H·d");
  (void)checked_product({s.batch, seq_k, heads_kv, s.head_dim}, "B·N_k·H_kv·d");
  a.stats = checked_product({s.batch, s.heads, s.seq_q}, "B·H·N");
  a.p.batch = std::size_t(s.batch);
  a.p.seq = std::size_t(s.seq_q);
  a.p.seq_k = seq_k == s.seq_q ? 0 : std::size_t(seq_k);
  a.p.heads = std::size_t(s.heads);
  a.p.head_dim = std::size_t(s.head_dim);
  a.p.causal = s.causal != 0;
  a.p.scale = s.scale;
  a.p.dtype = to_ref_dtype(s.dtype);
  a.p.validate();
  a.q_ext = Extents{s.batch, s.seq_q, s.heads, s.head_dim};
  a.kv_ext = Extents{s.batch, seq_k, heads_kv, s.head_dim};
#if FLASHLAB_CAPI_HAVE_CUDA
  if (device == FLASHLAB_DEVICE_CUDA) cuda_limits(a);
#endif
  return a;
}

std::size_t forward_workspace(const Attention& a, flashlab_device device) {
  return device == FLASHLAB_DEVICE_CUDA ? std::size_t(a.stats) * sizeof(float) : 0;
}

template <typename T>
void cpu_forward(const Attention& a, const Qkv& in, const Strided& o, void* lse) {
  const auto f = ref::flash_forward_fa2<T>(a.p, gather<T>(in.q), gather<T>(in.k), gather<T>(in.v));
  scatter(f.O, o);
  if (lse) std::memcpy(lse, f.LSE.data(), f.LSE.size() * sizeof(T));
}

template <typename T>
void cpu_backward(const Attention& a, const Qkv& in, const Strided& o, const void* lse, const Strided& d_o,
                  const Strided& dq, const Strided& dk, const Strided& dv) {
  std::vector<T> L(std::size_t(a.stats));
  std::memcpy(L.data(), lse, L.size() * sizeof(T));
  const auto g = ref::flash_backward_two_kernel<T>(a.p, gather<T>(in.q), gather<T>(in.k), gather<T>(in.v), gather<T>(o),
                                                   L, gather<T>(d_o));
  scatter(g.dQ, dq);
  scatter(g.dK, dk);
  scatter(g.dV, dv);
}

#if FLASHLAB_CAPI_HAVE_CUDA
// The backward the device runs: the fastest (atomic dQ), or with `deterministic` the fixed-order
// dQ of the Hopper kernel where there is one, else the two-kernel design (no atomics at all).
struct BackwardChoice {
  ref::Algorithm design;
  fc::FastBackwardKernel kernel;
};
BackwardChoice backward_choice(const Attention& a) {
  const fc::FastBackwardKernel fastest = fc::fastest_backward_kernel();
  if (!a.abi.deterministic) return {ref::Algorithm::bwd_atomic, fastest};
  if (fastest == fc::FastBackwardKernel::wgmma_ws)
    return {ref::Algorithm::bwd_atomic, fc::FastBackwardKernel::wgmma_ws_deterministic};
  return {ref::Algorithm::bwd_two_kernel, fc::FastBackwardKernel::mma_sync};
}
#endif

std::size_t backward_workspace(const Attention& a, flashlab_device device) {
#if FLASHLAB_CAPI_HAVE_CUDA
  if (device == FLASHLAB_DEVICE_CUDA) {
    const BackwardChoice c = backward_choice(a);
    std::size_t bytes = 0;
    kernel_limits("the CUDA backward refuses this problem",
                  [&] { bytes = fc::fast_attention_backward_workspace_bytes(c.design, a.p); });
    return bytes;
  }
#else
  (void)a;
  (void)device;
#endif
  return 0;
}

void size_arg(size_t* bytes) { require_pointer(bytes, "bytes"); }

}  // namespace

extern "C" {

FLASHLAB_API flashlab_attention_problem flashlab_attention_defaults(void) {
  flashlab_attention_problem p{};
  p.struct_size = sizeof p;
  p.batch = 1;
  p.heads = 1;
  p.dtype = FLASHLAB_DTYPE_BF16;
  return p;
}

FLASHLAB_API flashlab_status flashlab_attention_check(const flashlab_attention_problem* problem,
                                                      flashlab_device device) {
  return guard("flashlab_attention_check", [&] { (void)checked_problem(problem, device); });
}

FLASHLAB_API flashlab_status flashlab_attention_forward_workspace_size(const flashlab_attention_problem* problem,
                                                                       flashlab_device device, size_t* bytes) {
  return guard("flashlab_attention_forward_workspace_size", [&] {
    const Attention a = checked_problem(problem, device);
    size_arg(bytes);
    *bytes = forward_workspace(a, device);
  });
}

FLASHLAB_API flashlab_status flashlab_attention_forward(const flashlab_attention_problem* problem,
                                                        flashlab_device device, flashlab_tensor q, flashlab_tensor k,
                                                        flashlab_tensor v, flashlab_tensor o, void* lse,
                                                        void* workspace, size_t workspace_bytes, void* stream) {
  return guard("flashlab_attention_forward", [&] {
    const Attention a = checked_problem(problem, device);
    const flashlab_dtype dt = a.abi.dtype;
    const Qkv in = qkv_args(q, k, v, a.q_ext, a.kv_ext, dt, device);
    const Strided os = tensor_arg("o", o, a.q_ext, dt, device, Role::output);
    if (lse) array_arg("lse", lse, device);
    if (device == FLASHLAB_DEVICE_CPU) {
      if (dt == FLASHLAB_DTYPE_F64) cpu_forward<double>(a, in, os, lse);
      else cpu_forward<float>(a, in, os, lse);
      return;
    }
#if FLASHLAB_CAPI_HAVE_CUDA
    // The kernels always write LSE: without the caller's, it goes to the workspace.
    workspace_arg(workspace, workspace_bytes, lse ? 0 : forward_workspace(a, device), device);
    float* L = lse ? static_cast<float*>(lse) : static_cast<float*>(workspace);
    kernel_limits("the CUDA forward refuses this problem", [&] {
      fc::fast_attention_forward_device(a.p, fc::fastest_forward_kernel(), in.q.data, in.k.data, in.v.data, os.data,
                                        L, stream);
    });
#else
    (void)workspace;
    (void)workspace_bytes;
    (void)stream;
#endif
  });
}

FLASHLAB_API flashlab_status flashlab_attention_backward_workspace_size(const flashlab_attention_problem* problem,
                                                                        flashlab_device device, size_t* bytes) {
  return guard("flashlab_attention_backward_workspace_size", [&] {
    const Attention a = checked_problem(problem, device);
    size_arg(bytes);
    *bytes = backward_workspace(a, device);
  });
}

FLASHLAB_API flashlab_status flashlab_attention_backward(const flashlab_attention_problem* problem,
                                                         flashlab_device device, flashlab_tensor q, flashlab_tensor k,
                                                         flashlab_tensor v, flashlab_tensor o, const void* lse,
                                                         flashlab_tensor d_o, flashlab_tensor dq, flashlab_tensor dk,
                                                         flashlab_tensor dv, void* workspace, size_t workspace_bytes,
                                                         void* stream) {
  return guard("flashlab_attention_backward", [&] {
    const Attention a = checked_problem(problem, device);
    const flashlab_dtype dt = a.abi.dtype;
    const Qkv in = qkv_args(q, k, v, a.q_ext, a.kv_ext, dt, device);
    const Strided os = tensor_arg("o", o, a.q_ext, dt, device, Role::input);
    array_arg("lse", lse, device);
    const Strided dos = tensor_arg("d_o", d_o, a.q_ext, dt, device, Role::input);
    const Strided dqs = tensor_arg("dq", dq, a.q_ext, dt, device, Role::output);
    const Strided dks = tensor_arg("dk", dk, a.kv_ext, dt, device, Role::output);
    const Strided dvs = tensor_arg("dv", dv, a.kv_ext, dt, device, Role::output);
    if (device == FLASHLAB_DEVICE_CPU) {
      if (dt == FLASHLAB_DTYPE_F64) cpu_backward<double>(a, in, os, lse, dos, dqs, dks, dvs);
      else cpu_backward<float>(a, in, os, lse, dos, dqs, dks, dvs);
      return;
    }
#if FLASHLAB_CAPI_HAVE_CUDA
    const BackwardChoice c = backward_choice(a);
    workspace_arg(workspace, workspace_bytes, backward_workspace(a, device), device);
    kernel_limits("the CUDA backward refuses this problem", [&] {
      fc::fast_attention_backward_device(c.design, a.p, in.q.data, in.k.data, in.v.data, os.data, dos.data,
                                         static_cast<const float*>(lse), dqs.data, dks.data, dvs.data, workspace,
                                         stream, c.kernel);
    });
#else
    (void)workspace;
    (void)workspace_bytes;
    (void)stream;
#endif
  });
}

}  // extern "C"
