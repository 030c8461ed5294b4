// The attention family's context-parallel ring (flashlab_ring_*): the whole problem read from a
// flashlab_attention_problem, checked, and one rank of the ring
// (flashlab/cuda/context_parallel.hpp) run on the caller's device memory. Built with the ring only
// where NCCL was found (FLASHLAB_CAPI_HAVE_RING); elsewhere every call says so.
#include "core.hpp"

#include "flashlab/reference/attention_problem.hpp"
#include "flashlab/reference/context_parallel.hpp"

#if FLASHLAB_CAPI_HAVE_RING
#include "flashlab/cuda/context_parallel.hpp"
#include "flashlab/cuda/options.hpp"

#include <cuda_runtime.h>
#endif

#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <sstream>
#include <memory>
#include <string>
#include <utility>

#if FLASHLAB_CAPI_HAVE_RING
/// One rank's end of a ring (opaque to callers).
struct flashlab_ring {
  int gpus = 1;          // G
  int rank = 0;          // this end's place in the ring
  int device = 0;        // the CUDA device current when it was made
  void* comm = nullptr;  // its ncclComm_t; nullptr when G = 1
};
#endif

namespace {

using namespace flashlab::capi;
namespace ref = flashlab::ref;

// The size of flashlab_attention_problem in ABI minor version 0 (before the window and packed
// fields), read as flashlab_attention_forward() reads it.
constexpr std::size_t kProblemSizeMinor0 = offsetof(flashlab_attention_problem, window_left);

#if !FLASHLAB_CAPI_HAVE_RING
[[noreturn]] void no_ring() {
  fail(FLASHLAB_ERROR_UNSUPPORTED, "this build of libflashlab.so has no context-parallel ring",
       "build with the CUDA kernels and NCCL (nccl.h and libnccl in the CUDA installation); flashlab_has_ring() "
       "tells which build you have");
}
#endif

// The whole problem over `gpus` ranks, and whether the backward must be deterministic.
struct RingProblem {
  ref::ContextParallelProblem p;
  bool deterministic = false;
};

// The fields the ring takes, checked and converted. The refusals of the attention problem's own
// rules name its fields; the ring's (N a multiple of the chunks, the fast kernels' limits) are
// UNSUPPORTED with the ring's message.
RingProblem ring_problem(const flashlab_attention_problem* problem, flashlab_ring_layout layout, int gpus) {
  const flashlab_attention_problem s = read_struct(problem, "problem", "flashlab_attention_problem",
                                                   flashlab_attention_defaults(), {kProblemSizeMinor0});
  require_range("gpus", gpus, 1, std::int64_t(ref::kMaxRanks), "the ranks of the ring");
  require_range("layout", int(layout), 0, 1, "FLASHLAB_RING_ZIGZAG or FLASHLAB_RING_CONTIGUOUS");
  require_range("problem->batch", s.batch, 1, kMaxDim, "tensors are [B, N, H, d]; B is at least 1");
  require_range("problem->seq_q", s.seq_q, 1, kMaxDim, "N, the whole sequence over every rank");
  require_range("problem->heads", s.heads, 1, kMaxDim, "tensors are [B, N, H, d]; H is at least 1");
  require_range("problem->heads_kv", s.heads_kv, 0, kMaxDim, "0 means H_kv = H");
  require_range("problem->head_dim", s.head_dim, 1, kMaxDim, "give the head dimension, e.g. 128");
  require_range("problem->causal", s.causal, 0, 1, "0 (no mask) or 1 (causal)");
  require_range("problem->deterministic", s.deterministic, 0, 1, "0 or 1");
  if (!(s.scale >= 0.0) || !std::isfinite(s.scale)) {
    std::ostringstream v;
    v << s.scale;
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, "problem->scale = " + v.str() + " is not finite and non-negative",
         "0 means 1/sqrt(d)");
  }
  check_dtype(s.dtype, FLASHLAB_DEVICE_CUDA, "problem->dtype");
  if (s.cu_seqlens_q != nullptr || s.cu_seqlens_k != nullptr)
    fail(FLASHLAB_ERROR_UNSUPPORTED, "problem->cu_seqlens_q is set: the ring takes one dense [B, N, H, d] problem",
         "pad the sequences into a dense batch");
  if (s.seq_k != 0 && s.seq_k != s.seq_q)
    fail(FLASHLAB_ERROR_UNSUPPORTED,
         "problem->seq_k = " + std::to_string(s.seq_k) + " differs from seq_q = " + std::to_string(s.seq_q) +
             ": the ring is self-attention over one sequence",
         "0 means N_k = N");
  if (s.window_left != -1 || s.window_right != -1)
    fail(FLASHLAB_ERROR_UNSUPPORTED,
         "problem->window_left/window_right = (" + std::to_string(s.window_left) + ", " +
             std::to_string(s.window_right) + "): the ring takes no window",
         "the single-GPU flashlab_attention_forward() and flashlab_attention_backward() take windows");
  const std::int64_t heads_kv = s.heads_kv ? s.heads_kv : s.heads;
  (void)checked_product({s.batch, s.seq_q, s.heads, s.head_dim}, "B·N·H·d");
  RingProblem out;
  out.deterministic = s.deterministic != 0;
  ref::ContextParallelProblem& p = out.p;
  p.attention.batch = std::size_t(s.batch);
  p.attention.seq = std::size_t(s.seq_q);
  p.attention.heads = std::size_t(s.heads);
  p.attention.head_dim = std::size_t(s.head_dim);
  p.attention.causal = s.causal != 0;
  p.attention.scale = s.scale;
  p.attention.dtype = to_ref_dtype(s.dtype);
  p.heads_kv = heads_kv == s.heads ? 0 : std::size_t(heads_kv);
  p.gpus = std::size_t(gpus);
  p.layout = layout == FLASHLAB_RING_ZIGZAG ? ref::ShardLayout::zigzag : ref::ShardLayout::contiguous;
  try {
    p.validate();
  } catch (const ref::ProblemError& e) {
    const std::string field = e.field() == "seq" ? "seq_q" : e.field();
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT, (field == "gpus" ? field : "problem->" + field) + ": " + e.what());
  }
  return out;
}

#if FLASHLAB_CAPI_HAVE_RING
namespace fc = flashlab::cuda;

// A CUDA runtime call of this file: its failure becomes FLASHLAB_ERROR_CUDA naming it.
void cuda_call(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw fc::CudaError(std::string(what) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// The backward kernel of the ring: the fastest, or with `deterministic` the fixed-order dQ of
// the Hopper kernel (the only backward of the atomic design, which the ring runs, that has one).
fc::FastBackwardKernel ring_backward_kernel(bool deterministic) {
  const fc::FastBackwardKernel fastest = fc::fastest_backward_kernel();
  if (!deterministic) return fastest;
  if (fastest != fc::FastBackwardKernel::wgmma_ws)
    fail(FLASHLAB_ERROR_UNSUPPORTED, "problem->deterministic = 1: the ring's deterministic backward needs the Hopper kernel",
         "run on an H100/H200 build with sm_90a, or set deterministic = 0");
  return fc::FastBackwardKernel::wgmma_ws_deterministic;
}

// The ring, its device made current for the call (and the caller's restored after it).
class OnRingDevice {
 public:
  explicit OnRingDevice(const flashlab_ring* ring) {
    require_pointer(ring, "ring");
    cuda_call(cudaGetDevice(&caller_), "cudaGetDevice");
    if (caller_ != ring->device) cuda_call(cudaSetDevice(ring->device), "cudaSetDevice");
  }
  ~OnRingDevice() { cudaSetDevice(caller_); }  // destructor: nothing to do with an error
  OnRingDevice(const OnRingDevice&) = delete;
  OnRingDevice& operator=(const OnRingDevice&) = delete;

 private:
  int caller_ = 0;
};

void require_workspace(void* workspace, std::size_t given, std::size_t needed) {
  if (given < needed)
    fail(FLASHLAB_ERROR_INVALID_ARGUMENT,
         "workspace_bytes = " + std::to_string(given) + " is below the " + std::to_string(needed) + " bytes needed",
         "ask flashlab_ring_workspace_size()");
  if (needed > 0) require_pointer(workspace, "workspace");
}
#endif

}  // namespace

extern "C" {

FLASHLAB_API int flashlab_has_ring(void) {
#if FLASHLAB_CAPI_HAVE_RING
  return have_cuda() ? 1 : 0;
#else
  return 0;
#endif
}

FLASHLAB_API flashlab_status flashlab_ring_unique_id(unsigned char* id) {
  return guard("flashlab_ring_unique_id", [&] {
#if FLASHLAB_CAPI_HAVE_RING
    require_pointer(id, "id");
    const std::array<unsigned char, fc::kRingIdBytes> made = fc::ring_unique_id();
    std::memcpy(id, made.data(), made.size());
#else
    (void)id;
    no_ring();
#endif
  });
}

FLASHLAB_API flashlab_status flashlab_ring_create(const unsigned char* id, int gpus, int rank, flashlab_ring** ring) {
  return guard("flashlab_ring_create", [&] {
#if FLASHLAB_CAPI_HAVE_RING
    check_device(FLASHLAB_DEVICE_CUDA);
    require_pointer(id, "id");
    require_pointer(ring, "ring");
    require_range("gpus", gpus, 1, std::int64_t(ref::kMaxRanks), "the ranks of the ring");
    require_range("rank", rank, 0, gpus - 1, "this process's place in the ring, 0 … gpus − 1");
    std::array<unsigned char, fc::kRingIdBytes> key{};
    std::memcpy(key.data(), id, key.size());
    auto made = std::make_unique<flashlab_ring>();
    made->gpus = gpus;
    made->rank = rank;
    cuda_call(cudaGetDevice(&made->device), "cudaGetDevice");
    made->comm = fc::ring_comm_create(key, gpus, rank);
    *ring = made.release();
#else
    (void)id;
    (void)gpus;
    (void)rank;
    (void)ring;
    no_ring();
#endif
  });
}

FLASHLAB_API flashlab_status flashlab_ring_destroy(flashlab_ring* ring) {
  return guard("flashlab_ring_destroy", [&] {
#if FLASHLAB_CAPI_HAVE_RING
    if (!ring) return;
    fc::ring_comm_destroy(ring->comm);
    delete ring;
#else
    if (ring) no_ring();
#endif
  });
}

FLASHLAB_API flashlab_status flashlab_ring_workspace_size(const flashlab_attention_problem* problem,
                                                          flashlab_ring_layout layout, int gpus, int backward,
                                                          size_t* bytes) {
  return size_query("flashlab_ring_workspace_size", bytes, [&]() -> std::size_t {
    const RingProblem r = ring_problem(problem, layout, gpus);
    const ref::ContextParallelProblem& p = r.p;
    require_range("backward", backward, 0, 1, "0 for the forward's workspace, 1 for the backward's");
#if FLASHLAB_CAPI_HAVE_RING
    check_device(FLASHLAB_DEVICE_CUDA);
    std::size_t n = 0;
    kernel_limits("the ring refuses this problem", [&] {
      n = backward ? fc::context_parallel_backward_workspace_bytes(p, ring_backward_kernel(r.deterministic))
                   : fc::context_parallel_forward_workspace_bytes(p);
    });
    return n;
#else
    (void)p;
    no_ring();
#endif
  });
}

FLASHLAB_API flashlab_status flashlab_ring_forward(const flashlab_attention_problem* problem,
                                                   flashlab_ring_layout layout, flashlab_ring* ring, const void* q,
                                                   const void* k, const void* v, void* o, float* lse, void* workspace,
                                                   size_t workspace_bytes, void* stream) {
  return guard("flashlab_ring_forward", [&] {
#if FLASHLAB_CAPI_HAVE_RING
    check_device(FLASHLAB_DEVICE_CUDA);
    require_pointer(ring, "ring");
    const ref::ContextParallelProblem p = ring_problem(problem, layout, ring->gpus).p;
    for (auto [ptr, name] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"}, {lse, "lse"}})
      require_pointer(ptr, name);
    const OnRingDevice on(ring);
    std::size_t needed = 0;
    kernel_limits("the ring refuses this problem", [&] { needed = fc::context_parallel_forward_workspace_bytes(p); });
    require_workspace(workspace, workspace_bytes, needed);
    fc::RingForwardBuffers b;
    b.Q = q;
    b.K = k;
    b.V = v;
    b.O = o;
    b.LSE = lse;
    kernel_limits("the ring refuses this problem", [&] {
      fc::context_parallel_forward_device(p, ring->rank, ring->comm, b, workspace, stream,
                                          fc::fastest_forward_kernel());
    });
#else
    (void)problem, (void)layout, (void)ring, (void)q, (void)k, (void)v, (void)o, (void)lse, (void)workspace;
    (void)workspace_bytes, (void)stream;
    no_ring();
#endif
  });
}

FLASHLAB_API flashlab_status flashlab_ring_backward(const flashlab_attention_problem* problem,
                                                    flashlab_ring_layout layout, flashlab_ring* ring, const void* q,
                                                    const void* k, const void* v, const void* o, const float* lse,
                                                    const void* d_o, void* dq, void* dk, void* dv, void* workspace,
                                                    size_t workspace_bytes, void* stream) {
  return guard("flashlab_ring_backward", [&] {
#if FLASHLAB_CAPI_HAVE_RING
    check_device(FLASHLAB_DEVICE_CUDA);
    require_pointer(ring, "ring");
    const RingProblem r = ring_problem(problem, layout, ring->gpus);
    const ref::ContextParallelProblem& p = r.p;
    for (auto [ptr, name] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"}, {lse, "lse"},
                             {d_o, "d_o"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"}})
      require_pointer(ptr, name);
    const OnRingDevice on(ring);
    fc::FastBackwardKernel kernel = fc::FastBackwardKernel::mma_sync;
    std::size_t needed = 0;
    kernel_limits("the ring refuses this problem", [&] {
      kernel = ring_backward_kernel(r.deterministic);
      needed = fc::context_parallel_backward_workspace_bytes(p, kernel);
    });
    require_workspace(workspace, workspace_bytes, needed);
    fc::RingBackwardBuffers b;
    b.Q = q;
    b.K = k;
    b.V = v;
    b.O = o;
    b.dO = d_o;
    b.LSE = lse;
    b.dQ = dq;
    b.dK = dk;
    b.dV = dv;
    kernel_limits("the ring refuses this problem",
                  [&] { fc::context_parallel_backward_device(p, ring->rank, ring->comm, b, workspace, stream, kernel); });
#else
    (void)problem, (void)layout, (void)ring, (void)q, (void)k, (void)v, (void)o, (void)lse, (void)d_o, (void)dq;
    (void)dk, (void)dv, (void)workspace, (void)workspace_bytes, (void)stream;
    no_ring();
#endif
  });
}

}  // extern "C"
