/// @file context_parallel.hpp
/// @brief Context-parallel (ring) attention on several GPUs over NCCL: each GPU holds a shard of
///        the sequence, K/V shards travel around a ring of NCCL send/receive pairs on a stream of
///        their own while the fast kernels compute with the shard in hand, and partial outputs
///        are merged by LSE; the backward passes the dK/dV sums around the ring as well.
///
/// The algorithm, the sharding and the schedule are the reference's (flashlab/reference/
/// context_parallel.hpp): this side runs ref::ring_blocks() for each rank and step, one fast
/// kernel launch per block, so the CPU simulation and the GPUs make the same decisions. Every
/// block is a whole chunk against a whole chunk: the `full` ones run the non-causal kernel, the
/// `diagonal` ones the causal kernel (N_k = N, offset 0), which is all the fast kernels take.
/// With the zigzag layout each step has the same work on every GPU.
///
/// Per rank and step, on two streams (the caller's for compute, one of its own for NCCL):
///   exchange s (s < G − 1): send the K/V chunks held to rank + 1, receive the next from rank − 1
///       (after step s − 1 has stopped reading the receiving buffer); backward, s ≥ 1: also the
///       dK/dV sums of step s − 1, and once more after the last step to bring them home
///   compute s (after exchange s − 1): for each block, run the fast forward on the held K/V
///       chunk (its H_kv heads, GQA read in place) into an fp32 partial O_s and LSE_s and merge it
///       into the running fp32 O and the LSE; backward: run the fast backward with the final O and
///       LSE, which adds dQ_s into an fp32 sum and dK_s, dV_s (each K/V head's query heads summed
///       in the kernel) into the step's fp32 part, and add that part to the incoming sums once
///       exchange s has delivered them.
/// Nothing is allocated on the device: the caller gives a workspace of the size the *_bytes
/// functions state. Streams and events are created per call; no host synchronisation.
///
/// Local layout on a rank: its chunks_per_rank() chunks one after the other, each `[B, c, H, d]`
/// for Q, O, dO, dQ and `[B, c, H_kv, d]` for K, V, dK, dV (16-bit bit patterns of the problem's
/// dtype); LSE `[chunks][B, H, c]` fp32, base 2. ref::shard_rows() makes it from `[B, N, H, d]`.
///
/// Precision: nothing between the kernels is 16-bit. Each block's partial O_s leaves its kernel in
/// fp32 (the forwards' fp32-output instantiations), its dQ, dK, dV are added unrounded into fp32
/// sums by the backward kernel itself, the running O and the travelling dK/dV sums are fp32, and
/// O, dQ, dK, dV are rounded to 16 bits once, at the end — as one kernel over the whole sequence
/// rounds them (docs/context-parallel.md, the precision paragraph and its measurement).
#pragma once

#include "flashlab/cuda/fast_attention.hpp"
#include "flashlab/reference/context_parallel.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace flashlab::cuda {

/// The GPU ring's limits beyond ref::ContextParallelProblem::validate(), checked here and nowhere
/// else: each block's problem within the fast kernels' limits (check_fast_problem(): bf16 or fp16,
/// B·c·H·d below 2³¹), d ∈ {64, 128} (the head dims of the kernels' fp32 instantiations and of the
/// backward), and N a multiple of chunks(), so that no chunk holds padding (the fast kernels have
/// no key mask for it). Throws std::invalid_argument naming the field, the value, the limit and a
/// hint.
void check_context_parallel_problem(const ref::ContextParallelProblem& problem);

/// One rank's device memory for the forward, in the local layout (see the file comment).
struct RingForwardBuffers {
  const void* Q = nullptr;  ///< `[chunks][B, c, H, d]`
  const void* K = nullptr;  ///< `[chunks][B, c, H_kv, d]`
  const void* V = nullptr;  ///< `[chunks][B, c, H_kv, d]`
  void* O = nullptr;        ///< `[chunks][B, c, H, d]`, written
  float* LSE = nullptr;     ///< `[chunks][B, H, c]`, written (base 2)
};

/// One rank's device memory for the backward, in the local layout.
struct RingBackwardBuffers {
  const void* Q = nullptr;     ///< `[chunks][B, c, H, d]`
  const void* K = nullptr;     ///< `[chunks][B, c, H_kv, d]`
  const void* V = nullptr;     ///< `[chunks][B, c, H_kv, d]`
  const void* O = nullptr;     ///< the forward's output, `[chunks][B, c, H, d]`
  const void* dO = nullptr;    ///< `[chunks][B, c, H, d]`
  const float* LSE = nullptr;  ///< the forward's LSE, `[chunks][B, H, c]`
  void* dQ = nullptr;          ///< `[chunks][B, c, H, d]`, written
  void* dK = nullptr;          ///< `[chunks][B, c, H_kv, d]`, written
  void* dV = nullptr;          ///< `[chunks][B, c, H_kv, d]`, written
};

/// Bytes of device scratch one rank's forward needs (256-byte aligned pieces): two K/V buffers
/// for the ring, the fp32 running O, a block's fp32 partial O and its LSE.
std::size_t context_parallel_forward_workspace_bytes(const ref::ContextParallelProblem& problem);

/// Bytes of device scratch one rank's backward needs: two K/V buffers, two dK/dV sum buffers and
/// the step's part (fp32), the fp32 dQ sum and the fast backward's own workspace (bwd_atomic
/// design with `kernel`; its kernels add each block's gradients into the sums directly).
std::size_t context_parallel_backward_workspace_bytes(const ref::ContextParallelProblem& problem,
                                                      FastBackwardKernel kernel = FastBackwardKernel::mma_sync);

/// What the ring handed to NCCL, and (when asked) how long each step took, per local rank.
class RingTrace {
 public:
  /// `timed`: also record CUDA events around each step's compute and each exchange.
  explicit RingTrace(bool timed = false);
  ~RingTrace();
  RingTrace(const RingTrace&) = delete;
  RingTrace& operator=(const RingTrace&) = delete;

  /// Bytes passed to ncclSend and ncclRecv, per step and rank (ref::RankStep: sent, received,
  /// kv_source, blocks), filled while the ring is enqueued; compare with ref::ring_link_bytes().
  [[nodiscard]] const std::vector<ref::RankStep>& steps() const;

  /// Milliseconds of one step on one rank.
  struct StepTime {
    std::size_t step = 0;   ///< ring step (the backward's step G is the last dK/dV hop)
    std::size_t rank = 0;   ///< the rank
    float compute_ms = 0;   ///< the step's kernels on the compute stream, from when its K/V had arrived
    float exchange_ms = 0;  ///< the exchange on the communication stream, from when it could start (the
                            ///< peer's readiness included); 0 for a step without one
  };
  /// Per step and rank, once the ring's streams have finished (synchronises on the events).
  /// Throws std::logic_error when the trace was not timed.
  [[nodiscard]] std::vector<StepTime> times() const;
  /// Each rank's whole ring, first to last event of the call on its compute stream (ms), in the
  /// order the ranks were given. Throws std::logic_error when the trace was not timed.
  [[nodiscard]] std::vector<float> total_ms() const;

  /// The implementation's state (events, counts); not for callers.
  struct Impl;
  /// The implementation's state.
  [[nodiscard]] Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

/// One rank of the ring forward, for one process (or one thread) per GPU: `nccl_comm` is this
/// rank's `ncclComm_t` (passed as void*) in a communicator of G ranks whose rank numbers are the
/// ring order, `rank` its number; the current device must be the rank's, `stream` a
/// cudaStream_t on it (void*; nullptr is the default stream). Enqueues everything and returns
/// (no host synchronisation). `workspace`: context_parallel_forward_workspace_bytes() bytes.
/// `kernel`: mma_sync or tma_ws, the forwards with an fp32-output instantiation (wgmma and
/// split_kv are refused). Throws std::invalid_argument for a bad problem, kernel or a null
/// pointer, CudaError when a CUDA or NCCL call fails.
void context_parallel_forward_device(const ref::ContextParallelProblem& problem, int rank, void* nccl_comm,
                                     const RingForwardBuffers& buffers, void* workspace, void* stream = nullptr,
                                     FastForwardKernel kernel = FastForwardKernel::mma_sync, RingTrace* trace = nullptr);

/// One rank of the ring backward (loss L = Σ O∘dO), as context_parallel_forward_device();
/// `workspace`: context_parallel_backward_workspace_bytes(problem, kernel) bytes.
void context_parallel_backward_device(const ref::ContextParallelProblem& problem, int rank, void* nccl_comm,
                                      const RingBackwardBuffers& buffers, void* workspace, void* stream = nullptr,
                                      FastBackwardKernel kernel = FastBackwardKernel::mma_sync,
                                      RingTrace* trace = nullptr);

/// One rank driven by this thread: its device, communicator, buffers, workspace and stream.
template <typename Buffers>
struct RingRank {
  int device = 0;            ///< CUDA device of the rank
  void* comm = nullptr;      ///< its ncclComm_t (void*); unused when G = 1
  Buffers buffers;           ///< its local tensors
  void* workspace = nullptr; ///< its scratch
  void* stream = nullptr;    ///< cudaStream_t on `device` (void*; nullptr: the default stream)
};

/// Every rank of the ring driven from this thread (`ranks[r]` is rank r, G entries): the NCCL
/// calls of all ranks are grouped per exchange, as NCCL requires when one thread drives several
/// devices. Enqueues and returns; restores the current device.
void context_parallel_forward_local(const ref::ContextParallelProblem& problem,
                                    const std::vector<RingRank<RingForwardBuffers>>& ranks,
                                    FastForwardKernel kernel = FastForwardKernel::mma_sync, RingTrace* trace = nullptr);

/// The backward of every rank from this thread, as context_parallel_forward_local().
void context_parallel_backward_local(const ref::ContextParallelProblem& problem,
                                     const std::vector<RingRank<RingBackwardBuffers>>& ranks,
                                     FastBackwardKernel kernel = FastBackwardKernel::mma_sync,
                                     RingTrace* trace = nullptr);

/// Bytes of the id every rank of a ring needs to make its communicator (NCCL's `ncclUniqueId`).
inline constexpr std::size_t kRingIdBytes = 128;
/// The id of a new ring (`ncclGetUniqueId`): made by one rank and given to every other one over
/// the caller's own channel (a torch.distributed broadcast, MPI, a file). Throws CudaError when
/// NCCL fails.
std::array<unsigned char, kRingIdBytes> ring_unique_id();
/// This process's (or thread's) rank of a ring of `gpus` ranks made from `id`, on the current
/// device (`ncclCommInitRank`; every rank calls it, and the call returns once all have): its
/// ncclComm_t as void*, for context_parallel_forward_device() and ring_comm_destroy(). One rank
/// (`gpus` 1) needs no communicator: nullptr. Sets NCCL_NVLS_ENABLE=0 unless it is set. Throws
/// std::invalid_argument for `gpus` outside 1 … ref::kMaxRanks or `rank` outside 0 … gpus − 1,
/// CudaError when NCCL fails.
void* ring_comm_create(const std::array<unsigned char, kRingIdBytes>& id, int gpus, int rank);
/// Releases a communicator of ring_comm_create() (nullptr: nothing); never throws.
void ring_comm_destroy(void* comm) noexcept;

/// G GPUs of this process, one NCCL communicator each (ncclCommInitAll): rank r on devices[r].
/// Sets NCCL_NVLS_ENABLE=0 in the environment unless it is set (NVLink multicast stays off).
class LocalRing {
 public:
  /// Throws std::invalid_argument for an empty or repeated device list, CudaError when NCCL fails.
  explicit LocalRing(std::vector<int> devices);
  ~LocalRing();
  LocalRing(const LocalRing&) = delete;
  LocalRing& operator=(const LocalRing&) = delete;
  /// G.
  [[nodiscard]] int size() const { return int(devices_.size()); }
  /// Device of rank r.
  [[nodiscard]] int device(int r) const { return devices_.at(std::size_t(r)); }
  /// ncclComm_t of rank r (void*); nullptr when G = 1 (no communicator is made).
  [[nodiscard]] void* comm(int r) const { return comms_.at(std::size_t(r)); }

 private:
  std::vector<int> devices_;
  std::vector<void*> comms_;
};

/// The forward of a whole problem on `ring`: global Q `[B, N, H, d]`, K, V `[B, N, H_kv, d]` (16-bit
/// bit patterns) sharded, uploaded, run, synchronised, gathered: O `[B, N, H, d]`, LSE `[B, H, N]`,
/// and the bytes handed to NCCL per step and rank. Outputs are poisoned with NaN first. For tests.
struct RingForwardResult {
  std::vector<std::uint16_t> O;        ///< `[B, N, H, d]`
  std::vector<float> LSE;              ///< `[B, H, N]`
  std::vector<ref::RankStep> steps;    ///< bytes handed to NCCL
};
/// See RingForwardResult. Throws as context_parallel_forward_device(), and std::invalid_argument
/// for a ring of another size than G or operands of the wrong size.
RingForwardResult context_parallel_forward(const ref::ContextParallelProblem& problem, const LocalRing& ring,
                                           const std::vector<std::uint16_t>& Q, const std::vector<std::uint16_t>& K,
                                           const std::vector<std::uint16_t>& V,
                                           FastForwardKernel kernel = FastForwardKernel::mma_sync);

/// The backward of a whole problem on `ring`, as context_parallel_forward(): dQ `[B, N, H, d]`,
/// dK, dV `[B, N, H_kv, d]` and the bytes handed to NCCL.
struct RingBackwardResult {
  std::vector<std::uint16_t> dQ;       ///< `[B, N, H, d]`
  std::vector<std::uint16_t> dK;       ///< `[B, N, H_kv, d]`
  std::vector<std::uint16_t> dV;       ///< `[B, N, H_kv, d]`
  std::vector<ref::RankStep> steps;    ///< bytes handed to NCCL
};
/// See RingBackwardResult.
RingBackwardResult context_parallel_backward(const ref::ContextParallelProblem& problem, const LocalRing& ring,
                                             const std::vector<std::uint16_t>& Q, const std::vector<std::uint16_t>& K,
                                             const std::vector<std::uint16_t>& V, const std::vector<std::uint16_t>& O,
                                             const std::vector<std::uint16_t>& dO, const std::vector<float>& LSE,
                                             FastBackwardKernel kernel = FastBackwardKernel::mma_sync);

/// One configuration of the ring's timing harness (`flashlab bench attention --gpus`).
struct RingBenchConfig {
  ref::ContextParallelProblem problem;  ///< G, B, N, H, H_kv, d, causal, layout, dtype
  bool forward = true;                  ///< time the forward
  bool backward = true;                 ///< time the backward (its O and LSE from one forward)
  int warmups = 1;                      ///< untimed runs first
  int reps = 5;                         ///< timed runs; the median is reported
  bool single = true;  ///< also time one GPU's fast kernels on the whole problem (the device of rank 0),
                       ///< where it fits one launch (B·N·H·d below 2³¹) and the memory
  FastForwardKernel forward_kernel = FastForwardKernel::mma_sync;    ///< every block's forward kernel
  FastBackwardKernel backward_kernel = FastBackwardKernel::mma_sync; ///< every block's backward kernel
};

/// The timings of one pass of a RingBenchConfig.
struct RingBenchPass {
  ref::RingPass pass = ref::RingPass::forward;  ///< which pass
  double ring_ms = 0;      ///< median over the reps of the slowest rank's whole ring (its first to last event)
  double ring_min_ms = 0;  ///< fastest rep
  double ring_max_ms = 0;  ///< slowest rep
  double single_ms = -1;   ///< median of one GPU's fast kernel(s) on the whole problem; −1 when not run
  double flops = 0;        ///< the pass's FLOPs (4·B·H·N²·d forward, halved for causal; backward 2.5×)
  std::uint64_t model_bytes = 0;    ///< bytes one GPU sends in the pass, by ref::ring_link_bytes()
  std::uint64_t counted_bytes = 0;  ///< bytes one GPU handed to ncclSend in the last rep (the largest over ranks)
  bool counted_equals_model = false;  ///< ref::counted_equals_model() on the last rep's counts
  double exchange_ms_max = 0;  ///< longest exchange of the last rep (comm stream, the peer's readiness included)
  double compute_ms_max = 0;   ///< longest step's compute of the last rep
  double exposed_ms = 0;  ///< last rep, slowest rank: its whole ring less the sum of its steps' compute
};

/// Runs `config` on `ring` (G = ring.size()): seeded inputs made on each GPU (a chunk holds the
/// rows of the whole tensor, see the harness), warm-ups, then `reps` timed runs of each pass with
/// a timed RingTrace; the single-GPU fast kernels on the same inputs when asked and possible.
/// Throws as the ring's entry points.
std::vector<RingBenchPass> bench_context_parallel(const RingBenchConfig& config, const LocalRing& ring);

}  // namespace flashlab::cuda
