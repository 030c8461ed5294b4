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

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <sstream>
#include <vector>

namespace {

using namespace flashlab::capi;
namespace ref = flashlab::ref;

// Largest value of one dimension: products stay checked (checked_product), this only keeps every
// single field sane.

// A problem checked for one device, with the family's problem type built from it.
struct Attention {
  flashlab_attention_problem abi{};
  ref::AttentionProblem p;  // packed on CUDA: dense-shaped (B, max_seqlen_q, max_seqlen_k), lists on the device
  Extents q_ext, kv_ext;
  std::int64_t stats = 0;  // B·H·N, the entries of LSE and D
  bool device_packed = false;  // packed sequences whose lists are in device memory (CUDA)
};

#if FLASHLAB_CAPI_HAVE_CUDA
namespace fc = flashlab::cuda;

fc::FastPackedSequences device_lists(const Attention& a) {
  return {a.abi.cu_seqlens_q, a.abi.cu_seqlens_k, std::size_t(a.abi.total_q), std::size_t(a.abi.total_k)};
}
#endif

// The size of flashlab_attention_problem in ABI minor version 0, before the window and packed
// fields: a caller built with that header passes it, and gets those fields' defaults.
constexpr std::size_t kProblemSizeMinor0 = offsetof(flashlab_attention_problem, window_left);

// One prefix-sum list read from the caller's host memory (B + 1 entries), checked for what the
// reference cannot see: negative entries and the last entry against the packed tensor's rows.
// The reference checks the rest (starts at 0, never decreases).
std::vector<std::int32_t> prefix_sums(const char* field, const std::int32_t* cu, std::size_t entries,
                                      const char* total_field, std::int64_t total) {
  std::vector<std::int32_t> out(cu, cu + entries);
  for (std::size_t b = 0; b < entries; ++b)
    if (out[b] < 0)
      fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
           std::string("problem->") + field + "[" + std::to_string(b) + "] = " + std::to_string(out[b]) + " is negative",
           "prefix sums of the sequence lengths: 0, len_0, len_0 + len_1, ...");
  if (out.back() != total)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
         std::string("problem->") + field + "[" + std::to_string(entries - 1) + "] = " + std::to_string(out.back()) +
             " differs from problem->" + total_field + " = " + std::to_string(total),
         "the last prefix sum is the packed tensor's rows; B = problem->batch sequences take B + 1 entries");
  return out;
}

// The packed sequences of a problem with cu_seqlens set, checked against seq_q and seq_k
// (max_seqlen_q, max_seqlen_k: at least the longest sequence).
ref::PackedSequences packed_sequences(const flashlab_attention_problem& s) {
  if ((s.cu_seqlens_q == nullptr) != (s.cu_seqlens_k == nullptr))
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
         std::string("problem->") + (s.cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q") + " is NULL but " +
             (s.cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k") + " is set",
         "packed sequences take both prefix-sum lists (the same pointer twice for self-attention)");
  const std::size_t entries = std::size_t(s.batch) + 1;
  ref::PackedSequences packed(prefix_sums("cu_seqlens_q", s.cu_seqlens_q, entries, "total_q", s.total_q),
                              prefix_sums("cu_seqlens_k", s.cu_seqlens_k, entries, "total_k", s.total_k));
  const std::int64_t seq_k = s.seq_k ? s.seq_k : s.seq_q;
  if (std::int64_t(packed.max_len_q()) > s.seq_q)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
         "problem->cu_seqlens_q holds a sequence of " + std::to_string(packed.max_len_q()) +
             " queries, longer than problem->seq_q = " + std::to_string(s.seq_q) + " (max_seqlen_q)",
         "set seq_q to the longest query sequence");
  if (std::int64_t(packed.max_len_k()) > seq_k)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
         "problem->cu_seqlens_k holds a sequence of " + std::to_string(packed.max_len_k()) +
             " keys, longer than problem->seq_k = " + std::to_string(seq_k) + " (max_seqlen_k)",
         "set seq_k to the longest key sequence (0 means seq_q)");
  return packed;
}

// The reference's refusal of a field, renamed to this struct's field: "problem->seq_q" for the
// reference's "seq", and so on for every field it names.
[[noreturn]] void refuse_field(const ref::ProblemError& e) {
  const std::string& f = e.field();
  const std::string field = f == "seq" ? "seq_q" : f;
  fail(FLASHLAB_ERROR_INVALID_ARGUMENT, "problem->" + field + ": " + e.what());
}

void validated(const ref::AttentionProblem& p) {
  try {
    p.validate();
  } catch (const ref::ProblemError& e) {
    refuse_field(e);
  }
}

ref::PackedSequences validated_packed(const flashlab_attention_problem& s) {
  try {
    return packed_sequences(s);
  } catch (const ref::ProblemError& e) {
    refuse_field(e);
  }
}

void require_window(const char* field, std::int64_t v) {
  require_range(field, v, -1, ref::kMaxWindow, "keys seen on that side of the diagonal; -1 means unbounded");
}

Attention checked_problem(const flashlab_attention_problem* problem, flashlab_device device) {
  Attention a;
  a.abi = read_struct(problem, "problem", "flashlab_attention_problem", flashlab_attention_defaults(),
                      {kProblemSizeMinor0});
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
  require_window("problem->window_left", s.window_left);
  require_window("problem->window_right", s.window_right);
  check_dtype(s.dtype, device, "problem->dtype");
  const bool packed = s.cu_seqlens_q != nullptr || s.cu_seqlens_k != nullptr;
  const char* total_hint = packed ? "the rows of the packed tensor (the last prefix sum)"
                                  : "total_q and total_k are for packed sequences: 0 unless cu_seqlens are set";
  require_range("problem->total_q", s.total_q, 0, packed ? INT32_MAX : 0, total_hint);
  require_range("problem->total_k", s.total_k, 0, packed ? INT32_MAX : 0, total_hint);
  const std::int64_t seq_k = s.seq_k ? s.seq_k : s.seq_q;
  const std::int64_t heads_kv = s.heads_kv ? s.heads_kv : s.heads;
  a.p.heads = std::size_t(s.heads);
  a.p.heads_kv = heads_kv == s.heads ? 0 : std::size_t(heads_kv);
  a.p.head_dim = std::size_t(s.head_dim);
  a.p.causal = s.causal != 0;
  a.p.scale = s.scale;
  a.p.dtype = to_ref_dtype(s.dtype);
  a.p.window_left = s.window_left;
  a.p.window_right = s.window_right;
  if (packed) {
    (void)checked_product({s.total_q, s.heads, s.head_dim}, "total_q·H·d");
    (void)checked_product({s.total_k, heads_kv, s.head_dim}, "total_k·H_kv·d");
    a.stats = checked_product({s.heads, s.total_q}, "H·total_q");
    a.q_ext = Extents{1, s.total_q, s.heads, s.head_dim};
    a.kv_ext = Extents{1, s.total_k, heads_kv, s.head_dim};
    if (device == FLASHLAB_DEVICE_CUDA) {
      // The lists are device memory: reading them here would take a host copy and a
      // synchronisation, which no CUDA call makes. The kernels read them (FastPackedSequences);
      // the problem carries B and the longest lengths as the caller states them.
      if ((s.cu_seqlens_q == nullptr) != (s.cu_seqlens_k == nullptr))
        fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
             std::string("problem->") + (s.cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q") + " is NULL but " +
                 (s.cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k") + " is set",
             "packed sequences take both prefix-sum lists (the same pointer twice for self-attention)");
      require_range("problem->total_q", s.total_q, 1, INT32_MAX, total_hint);
      require_range("problem->total_k", s.total_k, 1, INT32_MAX, total_hint);
      a.device_packed = true;
      a.p.batch = std::size_t(s.batch);
      a.p.seq = std::size_t(s.seq_q);
      a.p.seq_k = seq_k == s.seq_q ? 0 : std::size_t(seq_k);
    } else {
      a.p.set_packed(validated_packed(s));
    }
  } else {
    (void)checked_product({s.batch, s.seq_q, s.heads, s.head_dim}, "B·N·H·d");
    (void)checked_product({s.batch, seq_k, heads_kv, s.head_dim}, "B·N_k·H_kv·d");
    a.stats = checked_product({s.batch, s.heads, s.seq_q}, "B·H·N");
    a.p.batch = std::size_t(s.batch);
    a.p.seq = std::size_t(s.seq_q);
    a.p.seq_k = seq_k == s.seq_q ? 0 : std::size_t(seq_k);
    a.q_ext = Extents{s.batch, s.seq_q, s.heads, s.head_dim};
    a.kv_ext = Extents{s.batch, seq_k, heads_kv, s.head_dim};
  }
  validated(a.p);
#if FLASHLAB_CAPI_HAVE_CUDA
  // The kernels' limits, stated once by their front door (check_fast_problem); any it states only
  // where a launch builds its parameters surfaces there, with the same status.
  if (device == FLASHLAB_DEVICE_CUDA)
    kernel_limits("the CUDA kernels refuse this problem", [&] {
      if (a.device_packed) fc::check_fast_packed(a.p, device_lists(a));
      else fc::check_fast_problem(a.p);
    });
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
// dQ of the Hopper kernel where there is one and it takes the problem (d = 256: dense; d = 64 and
// 128: dense, H_kv = H, N_k = N, no window), else the two-kernel design (no atomics at all; it takes
// all of those at d = 64 and 128, and refuses d = 256 by name).
struct BackwardChoice {
  ref::Algorithm design;
  fc::FastBackwardKernel kernel;
};
BackwardChoice backward_choice(const Attention& a) {
  const fc::FastBackwardKernel fastest = fc::fastest_backward_kernel(a.p);
  if (!a.abi.deterministic) return {ref::Algorithm::bwd_atomic, fastest};
  const bool hopper_det_takes_it =
      !a.device_packed &&
      (a.p.head_dim == 256 || (a.p.h_kv() == a.p.heads && a.p.n_k() == a.p.n_q() && !a.p.has_window()));
  if (fastest == fc::FastBackwardKernel::wgmma_ws && hopper_det_takes_it)
    return {ref::Algorithm::bwd_atomic, fc::FastBackwardKernel::wgmma_ws_deterministic};
  return {ref::Algorithm::bwd_two_kernel, fc::FastBackwardKernel::mma_sync};
}
#endif


std::size_t backward_workspace(const Attention& a, flashlab_device device) {
#if FLASHLAB_CAPI_HAVE_CUDA
  if (device == FLASHLAB_DEVICE_CUDA) {
    const BackwardChoice c = backward_choice(a);
    std::size_t bytes = 0;
    kernel_limits("the CUDA backward refuses this problem", [&] {
      bytes = a.device_packed ? fc::fast_attention_backward_workspace_bytes(c.design, a.p, device_lists(a))
                              : fc::fast_attention_backward_workspace_bytes(c.design, a.p);
    });
    return bytes;
  }
#else
  (void)a;
  (void)device;
#endif
  return 0;
}

// The forward and the backward, shared by the argument-list entries and the call-struct ones.
void forward(const flashlab_attention_problem* problem, flashlab_device device, const flashlab_tensor& q,
             const flashlab_tensor& k, const flashlab_tensor& v, const flashlab_tensor& o, void* lse, void* workspace,
             size_t workspace_bytes, void* stream) {
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
    if (a.device_packed)
      fc::fast_attention_forward_device(a.p, device_lists(a), fc::fastest_forward_kernel(), in.q.data, in.k.data,
                                        in.v.data, os.data, L, stream);
    else
      fc::fast_attention_forward_device(a.p, fc::fastest_forward_kernel(a.p), in.q.data, in.k.data, in.v.data,
                                        os.data, L, stream);
  });
#else
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
#endif
}

void backward(const flashlab_attention_problem* problem, flashlab_device device, const flashlab_tensor& q,
              const flashlab_tensor& k, const flashlab_tensor& v, const flashlab_tensor& o, const void* lse,
              const flashlab_tensor& d_o, const flashlab_tensor& dq, const flashlab_tensor& dk,
              const flashlab_tensor& dv, void* workspace, size_t workspace_bytes, void* stream) {
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
    if (a.device_packed)
      fc::fast_attention_backward_device(c.design, a.p, device_lists(a), in.q.data, in.k.data, in.v.data, os.data,
                                         dos.data, static_cast<const float*>(lse), dqs.data, dks.data, dvs.data,
                                         workspace, stream, c.kernel);
    else
      fc::fast_attention_backward_device(c.design, a.p, in.q.data, in.k.data, in.v.data, os.data, dos.data,
                                         static_cast<const float*>(lse), dqs.data, dks.data, dvs.data, workspace,
                                         stream, c.kernel);
  });
#else
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
#endif
}

// A caller's flashlab_attention_call, checked as the problem structs are (one version so far).
flashlab_attention_call read_call(const flashlab_attention_call* call) {
  flashlab_attention_call defaults{};
  defaults.struct_size = sizeof defaults;
  return read_struct(call, "call", "flashlab_attention_call", defaults, {},
                     "zeroed bytes and struct_size = sizeof(flashlab_attention_call)");
}

}  // namespace

extern "C" {

FLASHLAB_API flashlab_attention_problem flashlab_attention_defaults(void) {
  flashlab_attention_problem p{};
  p.struct_size = sizeof p;
  p.batch = 1;
  p.heads = 1;
  p.dtype = FLASHLAB_DTYPE_BF16;
  p.window_left = -1;
  p.window_right = -1;
  return p;
}

FLASHLAB_API flashlab_status flashlab_attention_check(const flashlab_attention_problem* problem,
                                                      flashlab_device device) {
  return guard("flashlab_attention_check", [&] { (void)checked_problem(problem, device); });
}

FLASHLAB_API flashlab_status flashlab_attention_forward_workspace_size(const flashlab_attention_problem* problem,
                                                                       flashlab_device device, size_t* bytes) {
  return size_query("flashlab_attention_forward_workspace_size", bytes,
                    [&] { return forward_workspace(checked_problem(problem, device), device); });
}

FLASHLAB_API flashlab_status flashlab_attention_forward(const flashlab_attention_problem* problem,
                                                        flashlab_device device, flashlab_tensor q, flashlab_tensor k,
                                                        flashlab_tensor v, flashlab_tensor o, void* lse,
                                                        void* workspace, size_t workspace_bytes, void* stream) {
  return guard("flashlab_attention_forward",
               [&] { forward(problem, device, q, k, v, o, lse, workspace, workspace_bytes, stream); });
}

FLASHLAB_API flashlab_status flashlab_attention_forward_call(const flashlab_attention_call* call) {
  return guard("flashlab_attention_forward_call", [&] {
    const flashlab_attention_call c = read_call(call);
    forward(c.problem, c.device, c.q, c.k, c.v, c.o, c.lse, c.workspace, c.workspace_bytes, c.stream);
  });
}

FLASHLAB_API flashlab_status flashlab_attention_backward_workspace_size(const flashlab_attention_problem* problem,
                                                                        flashlab_device device, size_t* bytes) {
  return size_query("flashlab_attention_backward_workspace_size", bytes,
                    [&] { return backward_workspace(checked_problem(problem, device), device); });
}

FLASHLAB_API flashlab_status flashlab_attention_backward(const flashlab_attention_problem* problem,
                                                         flashlab_device device, flashlab_tensor q, flashlab_tensor k,
                                                         flashlab_tensor v, flashlab_tensor o, const void* lse,
                                                         flashlab_tensor d_o, flashlab_tensor dq, flashlab_tensor dk,
                                                         flashlab_tensor dv, void* workspace, size_t workspace_bytes,
                                                         void* stream) {
  return guard("flashlab_attention_backward", [&] {
    backward(problem, device, q, k, v, o, lse, d_o, dq, dk, dv, workspace, workspace_bytes, stream);
  });
}

FLASHLAB_API flashlab_status flashlab_attention_backward_call(const flashlab_attention_call* call) {
  return guard("flashlab_attention_backward_call", [&] {
    const flashlab_attention_call c = read_call(call);
    backward(c.problem, c.device, c.q, c.k, c.v, c.o, c.lse, c.d_o, c.dq, c.dk, c.dv, c.workspace, c.workspace_bytes,
             c.stream);
  });
}

}  // extern "C"
