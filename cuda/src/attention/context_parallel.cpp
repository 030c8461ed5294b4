// Context-parallel (ring) attention over NCCL: the host side that drives the fast kernels and
// the ring's transfers on each GPU (flashlab/cuda/context_parallel.hpp). The schedule is the
// reference's ref::ring_blocks(); the small kernels are context_parallel_kernels.cu.
//
// Streams and events, per rank (s = step):
//   compute stream (the caller's): [init] → compute 0 → compute 1 → … → [finish]
//   comm stream (ours):              exchange 0 → exchange 1 → …      (backward: … → exchange G)
//   exchange s waits for compute s − 1 (it overwrites the buffer step s − 1 read, and in the
//   backward sends the sums step s − 1 added to); compute s waits for exchange s − 1 (its K/V);
//   the backward's compute s also waits for exchange s before adding its part to the incoming
//   sums. One event per step and stream marks "done" (compute_done, exchange_done).
// When one thread drives several GPUs the NCCL calls of all of them sit in one ncclGroupStart /
// ncclGroupEnd per exchange: NCCL would otherwise wait in the first send for a peer whose receive
// this thread has not posted yet.
#include "flashlab/cuda/context_parallel.hpp"

#include "attention/context_parallel_kernels.hpp"
#include "attention/front_door.hpp"
#include "core/common.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

namespace flashlab::cuda {

namespace {

[[noreturn]] void throw_nccl_error(ncclResult_t r, ncclComm_t comm, const char* expr, const char* file, int line) {
  std::ostringstream os;
  os << "NCCL error in " << expr << ": " << ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) os << " (" << last << ")";
  os << " at " << file << ":" << line;
  throw CudaError(os.str());
}

#define FLASHLAB_NCCL_CHECK(expr, comm)                                                 \
  do {                                                                                  \
    ncclResult_t flashlab_nccl_ = (expr);                                               \
    if (flashlab_nccl_ != ncclSuccess) throw_nccl_error(flashlab_nccl_, comm, #expr, __FILE__, __LINE__); \
  } while (0)

/// Restores the current device when the call returns or throws.
class DeviceGuard {
 public:
  DeviceGuard() { FLASHLAB_CUDA_CHECK(cudaGetDevice(&device_)); }
  ~DeviceGuard() { cudaSetDevice(device_); }  // destructor: nothing to do with an error
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_ = 0;
};

/// Ends an NCCL group however the scope is left (an open group would hang the next NCCL call).
class NcclGroup {
 public:
  NcclGroup() { FLASHLAB_NCCL_CHECK(ncclGroupStart(), nullptr); }
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  void end() {
    open_ = false;
    FLASHLAB_NCCL_CHECK(ncclGroupEnd(), nullptr);
  }

 private:
  bool open_ = true;
};

// The sizes of one rank's tensors, in elements.
struct Sizes {
  std::size_t B, c, H, H_kv, d, slots, group;
  explicit Sizes(const ref::ContextParallelProblem& p)
      : B(p.attention.batch), c(p.chunk_len()), H(p.attention.heads), H_kv(p.kv_heads()), d(p.attention.head_dim),
        slots(p.chunks_per_rank()), group(p.group()) {}
  std::size_t q_chunk() const { return B * c * H * d; }       // one chunk of Q, O, dO, dQ
  std::size_t kv_chunk() const { return B * c * H_kv * d; }   // one chunk of K, V, dK, dV
  std::size_t q_local() const { return slots * q_chunk(); }
  std::size_t kv_local() const { return slots * kv_chunk(); }  // all the K (or V) rows a rank holds
  std::size_t stats_chunk() const { return B * H * c; }        // one chunk of LSE
};

// Cuts a workspace into 256-byte aligned pieces; with no base it only adds up the bytes.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<unsigned char*>(base)) {}
  template <typename T>
  T* take(std::size_t count) {
    offset_ = (offset_ + 255) / 256 * 256;
    T* p = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += count * sizeof(T);
    return p;
  }
  std::size_t bytes() const { return offset_; }

 private:
  unsigned char* base_;
  std::size_t offset_ = 0;
};

// The forward's scratch. kv[i] holds a rank's K rows then its V rows (one NCCL transfer moves both).
// A block's partial O_s is fp32, unrounded (fast_forward_f32_device): rounding each partial to 16
// bits before the merge would add an error per step that one GPU's kernel never makes.
struct ForwardSpace {
  std::uint16_t* kv[2];
  float* O_acc;            // running O, fp32, local layout
  float* O_part;           // one block's O_s, fp32
  float* LSE_part;         // one block's LSE_s
};

ForwardSpace carve_forward(const Sizes& z, Carver& w) {
  ForwardSpace s{};
  s.kv[0] = w.take<std::uint16_t>(2 * z.kv_local());
  s.kv[1] = w.take<std::uint16_t>(2 * z.kv_local());
  s.O_acc = w.take<float>(z.q_local());
  s.O_part = w.take<float>(z.q_chunk());
  s.LSE_part = w.take<float>(z.stats_chunk());
  return s;
}

// The backward's scratch. sums[i] holds dK then dV (fp32) of the chunks a rank holds; `part` the
// step's own dK, dV before they join the incoming sums. The kernels add each block's dQ, dK, dV
// (H_kv heads: the kernel sums each group) into dQ_acc and `part` unrounded
// (fast_backward_add_f32_device), so every gradient is rounded to 16 bits once, at the end.
struct BackwardSpace {
  std::uint16_t* kv[2];
  float* sums[2];
  float* part;
  float* dQ_acc;
  void* kernel_ws;  // the atomic backward's workspace (D, its fp32 dQ accumulator)
};

// The problem a block runs on the fast kernels: the reference's block (c queries against c keys,
// causal for a diagonal block) with the H_kv heads of K and V as they are held. The fast kernels
// read each K/V tile once for the query heads of its group and sum dK, dV over them, so the held
// chunks are used in place and each block's dK, dV come out per K/V head.
ref::AttentionProblem gpu_block(const ref::ContextParallelProblem& p, const ref::RingBlock& blk) {
  ref::AttentionProblem a = ref::block_problem(p, blk);
  a.heads_kv = p.group() > 1 ? p.kv_heads() : 0;
  return a;
}

// Any block's problem: the backward workspace depends on B, c, H, H_kv, d only.
ref::AttentionProblem any_block(const ref::ContextParallelProblem& p) {
  ref::RingBlock full;
  full.valid_keys = p.chunk_len();
  return gpu_block(p, full);
}

BackwardSpace carve_backward(const ref::ContextParallelProblem& p, const Sizes& z, FastBackwardKernel kernel, Carver& w) {
  (void)kernel;  // every kernel runs the bwd_atomic design: one workspace size
  BackwardSpace s{};
  s.kv[0] = w.take<std::uint16_t>(2 * z.kv_local());
  s.kv[1] = w.take<std::uint16_t>(2 * z.kv_local());
  s.sums[0] = w.take<float>(2 * z.kv_local());
  s.sums[1] = w.take<float>(2 * z.kv_local());
  s.part = w.take<float>(2 * z.kv_local());
  s.dQ_acc = w.take<float>(z.q_local());
  s.kernel_ws = w.take<unsigned char>(fast_attention_backward_workspace_bytes(ref::Algorithm::bwd_atomic, any_block(p)));
  return s;
}

template <typename T>
const T* at(const void* base, std::size_t offset) {
  return static_cast<const T*>(base) + offset;
}
template <typename T>
T* at(void* base, std::size_t offset) {
  return static_cast<T*>(base) + offset;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The trace: bytes handed to NCCL (always) and, when timed, the events around each step.
// ---------------------------------------------------------------------------------------------
struct RingTrace::Impl {
  bool timed = false;
  std::vector<ref::RankStep> steps;
  struct StepEvents {
    int device = 0;
    std::size_t step = 0, rank = 0;
    cudaEvent_t compute_begin = nullptr, compute_end = nullptr, exchange_begin = nullptr, exchange_end = nullptr;
  };
  std::vector<StepEvents> events;
  struct Whole {
    int device = 0;
    cudaEvent_t begin = nullptr, end = nullptr;
  };
  std::vector<Whole> wholes;
  std::vector<cudaEvent_t> owned;  // every event above, destroyed with the trace

  cudaEvent_t make(int device) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(device));
    cudaEvent_t e = nullptr;
    FLASHLAB_CUDA_CHECK(cudaEventCreate(&e));
    owned.push_back(e);
    return e;
  }
  ~Impl() {
    for (cudaEvent_t e : owned) cudaEventDestroy(e);  // destructor: nothing to do with an error
  }
};

RingTrace::RingTrace(bool timed) : impl_(std::make_unique<Impl>()) { impl_->timed = timed; }
RingTrace::~RingTrace() = default;

const std::vector<ref::RankStep>& RingTrace::steps() const { return impl_->steps; }

std::vector<RingTrace::StepTime> RingTrace::times() const {
  if (!impl_->timed) throw std::logic_error("RingTrace::times: the trace was not timed (RingTrace(true))");
  std::vector<StepTime> out;
  for (const auto& e : impl_->events) {
    StepTime t;
    t.step = e.step;
    t.rank = e.rank;
    if (e.compute_begin) {
      FLASHLAB_CUDA_CHECK(cudaEventSynchronize(e.compute_end));
      FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&t.compute_ms, e.compute_begin, e.compute_end));
    }
    if (e.exchange_begin) {
      FLASHLAB_CUDA_CHECK(cudaEventSynchronize(e.exchange_end));
      FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&t.exchange_ms, e.exchange_begin, e.exchange_end));
    }
    out.push_back(t);
  }
  return out;
}

std::vector<float> RingTrace::total_ms() const {
  if (!impl_->timed) throw std::logic_error("RingTrace::total_ms: the trace was not timed (RingTrace(true))");
  std::vector<float> out;
  for (const auto& w : impl_->wholes) {
    FLASHLAB_CUDA_CHECK(cudaEventSynchronize(w.end));
    float ms = 0;
    FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, w.begin, w.end));
    out.push_back(ms);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Checks and sizes
// ---------------------------------------------------------------------------------------------
void check_context_parallel_problem(const ref::ContextParallelProblem& problem) {
  problem.validate();
  if (problem.attention.seq % problem.chunks() != 0)
    throw std::invalid_argument(
        "flashlab::cuda: context parallel: seq (N) = " + std::to_string(problem.attention.seq) +
        " is not a multiple of the " + std::to_string(problem.chunks()) + " chunks of the " +
        std::string(ref::layout_name(problem.layout)) + " layout on " + std::to_string(problem.gpus) +
        " GPUs (hint: the GPU ring takes whole chunks, the fast kernels have no key mask for padding: pad N to a "
        "multiple of " + std::to_string(problem.chunks()) + " and drop the padded rows, as the CPU reference does)");
  // The ring's blocks mask by their kind alone (full or diagonal): a window would need the band
  // cut at chunk boundaries, which the blocks do not carry (one GPU's fast forward and backward take one).
  if (problem.attention.has_window())
    throw std::invalid_argument("flashlab::cuda: context parallel: window (" +
                                std::to_string(problem.attention.window_left) + "," +
                                std::to_string(problem.attention.window_right) +
                                ") is not supported (hint: the single-GPU fast forward and backward take windows)");
  // Every block is a c×c problem with the whole problem's B, H, H_kv, d, dtype.
  check_fast_problem(any_block(problem));
  // The blocks' fp32 partials and sums come from the kernels' fp32 instantiations, built for
  // d = 64 and 128 only (the fp32-output forward and the fp32-sum backward refuse d = 256).
  if (problem.attention.head_dim != 64 && problem.attention.head_dim != 128)
    throw std::invalid_argument("flashlab::cuda: context parallel: head_dim (d) = " +
                                std::to_string(problem.attention.head_dim) +
                                " is not supported (hint: the GPU ring takes d = 64 or 128; d = 256 runs on one GPU's "
                                "fast forward and backward)");
}

std::size_t context_parallel_forward_workspace_bytes(const ref::ContextParallelProblem& problem) {
  check_context_parallel_problem(problem);
  Carver w(nullptr);
  (void)carve_forward(Sizes(problem), w);
  return w.bytes();
}

std::size_t context_parallel_backward_workspace_bytes(const ref::ContextParallelProblem& problem,
                                                      FastBackwardKernel kernel) {
  check_context_parallel_problem(problem);
  Carver w(nullptr);
  (void)carve_backward(problem, Sizes(problem), kernel, w);
  return w.bytes();
}

// ---------------------------------------------------------------------------------------------
// The ring
// ---------------------------------------------------------------------------------------------
namespace {

// One rank as this call drives it: what the caller gave, its streams and events.
struct RankRun {
  int device = 0;
  std::size_t rank = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;       // compute (the caller's)
  cudaStream_t comm_stream = nullptr;  // ours
  std::vector<cudaEvent_t> compute_done, exchange_done;  // per step
  cudaEvent_t ready = nullptr;         // the start: buffers set up on the compute stream
  std::vector<cudaEvent_t> sync_events;  // made here, destroyed at the end of the call
};

// Everything one call makes and must release (the comm streams, the events not in a trace).
class Runs {
 public:
  Runs(const ref::ContextParallelProblem& p, std::size_t exchanges, RingTrace* trace) : p_(p), exchanges_(exchanges), trace_(trace) {}
  ~Runs() {
    for (auto& r : runs_) {
      cudaSetDevice(r.device);
      for (cudaEvent_t e : r.sync_events) cudaEventDestroy(e);  // released once the work completes
      if (r.comm_stream) cudaStreamDestroy(r.comm_stream);
    }
  }
  Runs(const Runs&) = delete;
  Runs& operator=(const Runs&) = delete;

  RankRun& add(int device, std::size_t rank, void* comm, void* stream) {
    runs_.emplace_back();
    RankRun& r = runs_.back();
    r.device = device;
    r.rank = rank;
    r.comm = static_cast<ncclComm_t>(comm);
    r.stream = static_cast<cudaStream_t>(stream);
    FLASHLAB_CUDA_CHECK(cudaSetDevice(device));
    FLASHLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&r.comm_stream, cudaStreamNonBlocking));
    const bool timed = trace_ && trace_->impl().timed;
    auto event = [&]() {
      cudaEvent_t e = nullptr;
      if (timed) return trace_->impl().make(device);
      FLASHLAB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      r.sync_events.push_back(e);
      return e;
    };
    for (std::size_t s = 0; s < p_.gpus; ++s) r.compute_done.push_back(event());
    for (std::size_t s = 0; s < exchanges_; ++s) r.exchange_done.push_back(event());
    r.ready = event();
    if (timed) {
      auto& t = trace_->impl();
      for (std::size_t s = 0; s < std::max(p_.gpus, exchanges_); ++s) {
        RingTrace::Impl::StepEvents e;
        e.device = device;
        e.step = s;
        e.rank = rank;
        if (s < p_.gpus) {
          e.compute_begin = t.make(device);
          e.compute_end = r.compute_done[s];
        }
        if (s < exchanges_) {
          e.exchange_begin = t.make(device);
          e.exchange_end = r.exchange_done[s];
        }
        t.events.push_back(e);
      }
      t.wholes.push_back({device, t.make(device), t.make(device)});
      FLASHLAB_CUDA_CHECK(cudaSetDevice(device));
      FLASHLAB_CUDA_CHECK(cudaEventRecord(t.wholes.back().begin, r.stream));
    }
    return r;
  }
  std::vector<RankRun>& all() { return runs_; }
  // The trace's events of one rank and step (nullptr when not timed).
  RingTrace::Impl::StepEvents* events(const RankRun& r, std::size_t step) {
    if (!trace_ || !trace_->impl().timed) return nullptr;
    auto& ev = trace_->impl().events;
    for (auto it = ev.rbegin(); it != ev.rend(); ++it)
      if (it->step == step && it->rank == r.rank && it->device == r.device) return &*it;
    return nullptr;
  }
  void record_end(const RankRun& r) {
    if (!trace_ || !trace_->impl().timed) return;
    auto& w = trace_->impl().wholes;
    for (auto it = w.rbegin(); it != w.rend(); ++it)
      if (it->device == r.device) {
        FLASHLAB_CUDA_CHECK(cudaEventRecord(it->end, r.stream));
        return;
      }
  }

 private:
  const ref::ContextParallelProblem& p_;
  std::size_t exchanges_;
  RingTrace* trace_;
  std::vector<RankRun> runs_;  // reserved by the caller: RankRun& stay valid
};

// What one rank sends to rank + 1 and receives from rank − 1 in one exchange.
struct Transfer {
  const void* send;
  void* recv;
  std::size_t bytes;
};

// Exchange `s` for every rank driven here: after compute s − 1 (or the set-up), on the comm
// streams, all NCCL calls in one group.
void exchange(Runs& runs, std::size_t s, std::size_t G, const std::vector<std::vector<Transfer>>& transfers) {
  for (auto& r : runs.all()) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(r.device));
    FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(r.comm_stream, s == 0 ? r.ready : r.compute_done[s - 1], 0));
    if (auto* e = runs.events(r, s)) FLASHLAB_CUDA_CHECK(cudaEventRecord(e->exchange_begin, r.comm_stream));
  }
  NcclGroup group;
  for (std::size_t i = 0; i < runs.all().size(); ++i) {
    RankRun& r = runs.all()[i];
    const int next = int((r.rank + 1) % G), prev = int((r.rank + G - 1) % G);
    for (const Transfer& t : transfers[i]) {
      FLASHLAB_NCCL_CHECK(ncclSend(t.send, t.bytes, ncclChar, next, r.comm, r.comm_stream), r.comm);
      FLASHLAB_NCCL_CHECK(ncclRecv(t.recv, t.bytes, ncclChar, prev, r.comm, r.comm_stream), r.comm);
    }
  }
  group.end();
  for (auto& r : runs.all()) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(r.device));
    FLASHLAB_CUDA_CHECK(cudaEventRecord(r.exchange_done[s], r.comm_stream));
  }
}

// The compute stream of `r` may start step s: its K/V arrived with exchange s − 1.
void begin_compute(Runs& runs, RankRun& r, std::size_t s, std::size_t G) {
  FLASHLAB_CUDA_CHECK(cudaSetDevice(r.device));
  if (G > 1 && s >= 1) FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(r.stream, r.exchange_done[s - 1], 0));
  if (auto* e = runs.events(r, s)) FLASHLAB_CUDA_CHECK(cudaEventRecord(e->compute_begin, r.stream));
}

// The per-call checks every entry point shares.
void check_ranks(const ref::ContextParallelProblem& p, std::size_t count, bool local) {
  if (local && count != p.gpus)
    throw std::invalid_argument("flashlab::cuda: context parallel: " + std::to_string(count) +
                                " ranks given for G = " + std::to_string(p.gpus) +
                                " (hint: one entry per rank of the ring, rank r at index r)");
}

void check_comm(const ref::ContextParallelProblem& p, std::size_t rank, void* comm) {
  if (p.gpus == 1) return;
  if (comm == nullptr)
    throw std::invalid_argument("flashlab::cuda: context parallel: rank " + std::to_string(rank) +
                                " has no NCCL communicator (hint: ncclCommInitRank or LocalRing)");
  int count = 0, me = 0;
  auto* c = static_cast<ncclComm_t>(comm);
  FLASHLAB_NCCL_CHECK(ncclCommCount(c, &count), c);
  FLASHLAB_NCCL_CHECK(ncclCommUserRank(c, &me), c);
  if (std::size_t(count) != p.gpus || std::size_t(me) != rank)
    throw std::invalid_argument("flashlab::cuda: context parallel: the communicator of rank " + std::to_string(rank) +
                                " is rank " + std::to_string(me) + " of " + std::to_string(count) +
                                " (hint: a communicator of G = " + std::to_string(p.gpus) +
                                " ranks, numbered in ring order)");
}


ref::RankStep step_row(const ref::ContextParallelProblem& p, std::size_t s, std::size_t rank) {
  ref::RankStep row;
  row.step = s;
  row.rank = rank;
  row.kv_source = ref::ring_source(p.gpus, rank, s);
  return row;
}

// Adds what exchange `s` hands to NCCL for every driven rank to the trace's rows of step s.
void count_exchange(std::vector<ref::RankStep>& rows, std::size_t kv_bytes, std::size_t grad_bytes) {
  for (auto& row : rows) {
    row.sent.K += kv_bytes;
    row.sent.V += kv_bytes;
    row.received.K += kv_bytes;
    row.received.V += kv_bytes;
    row.sent.dK += grad_bytes;
    row.sent.dV += grad_bytes;
    row.received.dK += grad_bytes;
    row.received.dV += grad_bytes;
  }
}

template <typename Buffers>
struct Driven {
  std::size_t rank;
  const RingRank<Buffers>* args;
};

// One driven rank's number, pointers (named, for the message), workspace and communicator.
template <typename Buffers>
void check_rank(const ref::ContextParallelProblem& p, std::size_t rank, const RingRank<Buffers>& args,
                std::initializer_list<std::pair<const void*, const char*>> pointers) {
  if (rank >= p.gpus)
    throw std::invalid_argument("flashlab::cuda: context parallel: rank " + std::to_string(rank) +
                                " is not below G = " + std::to_string(p.gpus));
  for (const auto& [ptr, what] : pointers)
    if (ptr == nullptr)
      throw std::invalid_argument(std::string("flashlab::cuda: context parallel: ") + what + " of rank " +
                                  std::to_string(rank) + " is null");
  if (args.workspace == nullptr)
    throw std::invalid_argument("flashlab::cuda: context parallel: the workspace of rank " + std::to_string(rank) +
                                " is null (hint: context_parallel_*_workspace_bytes)");
  check_comm(p, rank, args.comm);
}

// The start of a pass on one rank: its own K and V rows into the first ring buffer (K then V),
// then `ready` on the compute stream (exchange 0 waits for it).
void load_own_kv(const Sizes& z, const void* K, const void* V, std::uint16_t* kv, const RankRun& r) {
  const std::size_t bytes = z.kv_local() * sizeof(std::uint16_t);
  FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(kv, K, bytes, cudaMemcpyDeviceToDevice, r.stream));
  FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(kv + z.kv_local(), V, bytes, cudaMemcpyDeviceToDevice, r.stream));
  FLASHLAB_CUDA_CHECK(cudaEventRecord(r.ready, r.stream));
}

// The K_j, V_j a block reads from the held ring buffer: the chunk of its slot, H_kv heads, in place.
std::pair<const void*, const void*> block_kv(const Sizes& z, const std::uint16_t* held, const ref::RingBlock& blk) {
  return {held + blk.kv_slot * z.kv_chunk(), held + z.kv_local() + blk.kv_slot * z.kv_chunk()};
}

void run_forward(const ref::ContextParallelProblem& p, const std::vector<Driven<RingForwardBuffers>>& ranks,
                 FastForwardKernel kernel, RingTrace* trace) {
  check_context_parallel_problem(p);
  if (kernel != FastForwardKernel::mma_sync && kernel != FastForwardKernel::tma_ws)
    throw std::invalid_argument(std::string("flashlab::cuda: context parallel: the ") + to_string(kernel) +
                                " forward kernel has no fp32 output for the ring's partials (hint: tma-ws, the "
                                "fastest on H100/H200, or mma)");
  const std::size_t G = p.gpus;
  const Sizes z(p);
  const bool bf16 = p.attention.dtype == ref::Dtype::bf16;
  for (const auto& d : ranks) {
    const RingForwardBuffers& b = d.args->buffers;
    check_rank(p, d.rank, *d.args, {{b.Q, "Q"}, {b.K, "K"}, {b.V, "V"}, {b.O, "O"}, {b.LSE, "LSE"}});
  }
  DeviceGuard guard;
  const std::size_t exchanges = G > 1 ? G - 1 : 0;
  Runs runs(p, exchanges, trace);
  runs.all().reserve(ranks.size());
  std::vector<ForwardSpace> space;
  for (const auto& d : ranks) {
    RankRun& r = runs.add(d.args->device, d.rank, d.args->comm, d.args->stream);
    Carver w(d.args->workspace);
    space.push_back(carve_forward(z, w));
    const ForwardSpace& sp = space.back();
    const RingForwardBuffers& b = d.args->buffers;
    // Start: O = 0, LSE = −inf (nothing seen); the own K/V chunks into the first ring buffer.
    detail::ring_init(sp.O_acc, z.q_local(), b.LSE, z.slots * z.stats_chunk(), r.stream);
    load_own_kv(z, b.K, b.V, sp.kv[0], r);
  }
  const std::size_t kv_bytes = z.kv_local() * sizeof(std::uint16_t);
  for (std::size_t s = 0; s < G; ++s) {
    std::vector<ref::RankStep> rows;
    for (const auto& d : ranks) rows.push_back(step_row(p, s, d.rank));
    // exchange s: the K/V chunks held now go to rank + 1; the next ones come from rank − 1
    if (s + 1 < G) {
      std::vector<std::vector<Transfer>> t;
      for (std::size_t i = 0; i < ranks.size(); ++i)
        t.push_back({{space[i].kv[s % 2], space[i].kv[(s + 1) % 2], 2 * kv_bytes}});
      exchange(runs, s, G, t);
      count_exchange(rows, kv_bytes, 0);
    }
    // compute s: one fast kernel per block, its partial merged into the running O and LSE
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      RankRun& r = runs.all()[i];
      const ForwardSpace& sp = space[i];
      const RingForwardBuffers& b = ranks[i].args->buffers;
      begin_compute(runs, r, s, G);
      const std::uint16_t* held = sp.kv[s % 2];
      const auto blocks = ref::ring_blocks(p, r.rank, s);
      for (const ref::RingBlock& blk : blocks) {
        const auto [K_j, V_j] = block_kv(z, held, blk);
        detail::fast_forward_f32_device(gpu_block(p, blk), kernel, at<std::uint16_t>(b.Q, blk.q_slot * z.q_chunk()),
                                        K_j, V_j, sp.O_part, sp.LSE_part, r.stream);
        detail::ring_merge(sp.O_acc + blk.q_slot * z.q_chunk(), b.LSE + blk.q_slot * z.stats_chunk(), sp.O_part,
                           sp.LSE_part, int(z.B), int(z.c), int(z.H), int(z.d), r.stream);
        rows[i].flops += ref::block_flops(p, blk, ref::RingPass::forward);
      }
      rows[i].blocks = blocks.size();
      FLASHLAB_CUDA_CHECK(cudaEventRecord(r.compute_done[s], r.stream));
    }
    if (trace) trace->impl().steps.insert(trace->impl().steps.end(), rows.begin(), rows.end());
  }
  // Finish: O rounded to 16 bits, once (LSE was merged in place).
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    RankRun& r = runs.all()[i];
    FLASHLAB_CUDA_CHECK(cudaSetDevice(r.device));
    detail::ring_round(bf16, space[i].O_acc, ranks[i].args->buffers.O, z.q_local(), r.stream);
    runs.record_end(r);
  }
}

void run_backward(const ref::ContextParallelProblem& p, const std::vector<Driven<RingBackwardBuffers>>& ranks,
                  FastBackwardKernel kernel, RingTrace* trace) {
  check_context_parallel_problem(p);
  const std::size_t G = p.gpus;
  const Sizes z(p);
  const bool bf16 = p.attention.dtype == ref::Dtype::bf16;
  for (const auto& d : ranks) {
    const RingBackwardBuffers& b = d.args->buffers;
    check_rank(p, d.rank, *d.args,
               {{b.Q, "Q"}, {b.K, "K"}, {b.V, "V"}, {b.O, "O"}, {b.dO, "dO"}, {b.LSE, "LSE"}, {b.dQ, "dQ"},
                {b.dK, "dK"}, {b.dV, "dV"}});
  }
  DeviceGuard guard;
  // Exchanges 0 … G − 2 carry K/V, 1 … G the dK/dV sums: G + 1 in all (none for G = 1).
  const std::size_t exchanges = G > 1 ? G + 1 : 0;
  Runs runs(p, exchanges, trace);
  runs.all().reserve(ranks.size());
  std::vector<BackwardSpace> space;
  for (const auto& d : ranks) {
    RankRun& r = runs.add(d.args->device, d.rank, d.args->comm, d.args->stream);
    Carver w(d.args->workspace);
    space.push_back(carve_backward(p, z, kernel, w));
    const BackwardSpace& sp = space.back();
    const RingBackwardBuffers& b = d.args->buffers;
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(sp.dQ_acc, 0, z.q_local() * sizeof(float), r.stream));
    load_own_kv(z, b.K, b.V, sp.kv[0], r);
  }
  const std::size_t kv_bytes = z.kv_local() * sizeof(std::uint16_t), grad_bytes = z.kv_local() * sizeof(float);
  for (std::size_t s = 0; s <= G; ++s) {
    if (s == G && G == 1) break;  // one rank: no homeward hop
    std::vector<ref::RankStep> rows;
    for (const auto& d : ranks) rows.push_back(step_row(p, s, d.rank));
    // exchange s: K/V of step s + 1 (s < G − 1) and the sums of step s − 1 (s ≥ 1)
    if (G > 1) {
      std::vector<std::vector<Transfer>> t(ranks.size());
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        if (s + 1 < G) t[i].push_back({space[i].kv[s % 2], space[i].kv[(s + 1) % 2], 2 * kv_bytes});
        if (s >= 1) t[i].push_back({space[i].sums[(s - 1) % 2], space[i].sums[s % 2], 2 * grad_bytes});
      }
      exchange(runs, s, G, t);
      count_exchange(rows, s + 1 < G ? kv_bytes : 0, s >= 1 ? grad_bytes : 0);
    }
    if (s < G) {
      // compute s: blocks with the final O and LSE; the kernels add dQ into its fp32 sum and dK, dV
      // into the step's part, unrounded
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        RankRun& r = runs.all()[i];
        const BackwardSpace& sp = space[i];
        const RingBackwardBuffers& b = ranks[i].args->buffers;
        begin_compute(runs, r, s, G);
        const bool joins = G > 1 && s >= 1;  // sums arrive from rank − 1 with exchange s
        float* part = joins ? sp.part : sp.sums[0];
        FLASHLAB_CUDA_CHECK(cudaMemsetAsync(part, 0, 2 * z.kv_local() * sizeof(float), r.stream));
        const std::uint16_t* held = sp.kv[s % 2];
        const auto blocks = ref::ring_blocks(p, r.rank, s);
        for (const ref::RingBlock& blk : blocks) {
          const auto [K_j, V_j] = block_kv(z, held, blk);
          const std::size_t q = blk.q_slot * z.q_chunk();
          detail::fast_backward_add_f32_device(gpu_block(p, blk), at<std::uint16_t>(b.Q, q), K_j, V_j,
                                               at<std::uint16_t>(b.O, q), at<std::uint16_t>(b.dO, q),
                                               b.LSE + blk.q_slot * z.stats_chunk(), sp.dQ_acc + q,
                                               part + blk.kv_slot * z.kv_chunk(),
                                               part + z.kv_local() + blk.kv_slot * z.kv_chunk(), sp.kernel_ws,
                                               r.stream, kernel);
          rows[i].flops += ref::block_flops(p, blk, ref::RingPass::backward);
        }
        rows[i].blocks = blocks.size();
        if (joins) {  // the incoming sums (exchange s) plus this step's part
          FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(r.stream, r.exchange_done[s], 0));
          detail::add_into(sp.sums[s % 2], sp.part, 2 * z.kv_local(), r.stream);
        }
        FLASHLAB_CUDA_CHECK(cudaEventRecord(r.compute_done[s], r.stream));
      }
    }
    if (trace) trace->impl().steps.insert(trace->impl().steps.end(), rows.begin(), rows.end());
  }
  // Finish: the sums that came home (exchange G; sums[0] for one rank) and dQ, each rounded to 16
  // bits once.
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    RankRun& r = runs.all()[i];
    const BackwardSpace& sp = space[i];
    const RingBackwardBuffers& b = ranks[i].args->buffers;
    FLASHLAB_CUDA_CHECK(cudaSetDevice(r.device));
    const float* home = sp.sums[G > 1 ? G % 2 : 0];
    if (G > 1) FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(r.stream, r.exchange_done[G], 0));
    detail::ring_round(bf16, home, b.dK, z.kv_local(), r.stream);
    detail::ring_round(bf16, home + z.kv_local(), b.dV, z.kv_local(), r.stream);
    detail::ring_round(bf16, sp.dQ_acc, b.dQ, z.q_local(), r.stream);
    runs.record_end(r);
  }
}

}  // namespace

void context_parallel_forward_device(const ref::ContextParallelProblem& problem, int rank, void* nccl_comm,
                                     const RingForwardBuffers& buffers, void* workspace, void* stream,
                                     FastForwardKernel kernel, RingTrace* trace) {
  int device = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  if (rank < 0) throw std::invalid_argument("flashlab::cuda: context parallel: rank " + std::to_string(rank) + " < 0");
  const RingRank<RingForwardBuffers> one{device, nccl_comm, buffers, workspace, stream};
  run_forward(problem, {{std::size_t(rank), &one}}, kernel, trace);
}

void context_parallel_backward_device(const ref::ContextParallelProblem& problem, int rank, void* nccl_comm,
                                      const RingBackwardBuffers& buffers, void* workspace, void* stream,
                                      FastBackwardKernel kernel, RingTrace* trace) {
  int device = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  if (rank < 0) throw std::invalid_argument("flashlab::cuda: context parallel: rank " + std::to_string(rank) + " < 0");
  const RingRank<RingBackwardBuffers> one{device, nccl_comm, buffers, workspace, stream};
  run_backward(problem, {{std::size_t(rank), &one}}, kernel, trace);
}

void context_parallel_forward_local(const ref::ContextParallelProblem& problem,
                                    const std::vector<RingRank<RingForwardBuffers>>& ranks, FastForwardKernel kernel,
                                    RingTrace* trace) {
  problem.validate();
  check_ranks(problem, ranks.size(), true);
  std::vector<Driven<RingForwardBuffers>> driven;
  for (std::size_t r = 0; r < ranks.size(); ++r) driven.push_back({r, &ranks[r]});
  run_forward(problem, driven, kernel, trace);
}

void context_parallel_backward_local(const ref::ContextParallelProblem& problem,
                                     const std::vector<RingRank<RingBackwardBuffers>>& ranks,
                                     FastBackwardKernel kernel, RingTrace* trace) {
  problem.validate();
  check_ranks(problem, ranks.size(), true);
  std::vector<Driven<RingBackwardBuffers>> driven;
  for (std::size_t r = 0; r < ranks.size(); ++r) driven.push_back({r, &ranks[r]});
  run_backward(problem, driven, kernel, trace);
}

// ---------------------------------------------------------------------------------------------
// One rank per process
// ---------------------------------------------------------------------------------------------
static_assert(sizeof(ncclUniqueId) == kRingIdBytes, "kRingIdBytes is NCCL's unique id");

std::array<unsigned char, kRingIdBytes> ring_unique_id() {
  ncclUniqueId id;
  FLASHLAB_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  std::array<unsigned char, kRingIdBytes> out{};
  std::memcpy(out.data(), &id, kRingIdBytes);
  return out;
}

void* ring_comm_create(const std::array<unsigned char, kRingIdBytes>& id, int gpus, int rank) {
  if (gpus < 1 || std::size_t(gpus) > ref::kMaxRanks)
    throw std::invalid_argument("flashlab::cuda: ring: gpus (G) = " + std::to_string(gpus) + " is not in 1 … " +
                                std::to_string(ref::kMaxRanks) + " (hint: the ranks of the ring)");
  if (rank < 0 || rank >= gpus)
    throw std::invalid_argument("flashlab::cuda: ring: rank = " + std::to_string(rank) + " is not in 0 … " +
                                std::to_string(gpus - 1) + " (hint: this process's place in the ring)");
  if (gpus == 1) return nullptr;  // one rank: no ring, no communicator
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast stays off unless the caller decided otherwise
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), kRingIdBytes);
  ncclComm_t comm = nullptr;
  FLASHLAB_NCCL_CHECK(ncclCommInitRank(&comm, gpus, nid, rank), nullptr);
  return comm;
}

void ring_comm_destroy(void* comm) noexcept {
  if (comm) ncclCommDestroy(static_cast<ncclComm_t>(comm));
}

// ---------------------------------------------------------------------------------------------
// LocalRing
// ---------------------------------------------------------------------------------------------
LocalRing::LocalRing(std::vector<int> devices) : devices_(std::move(devices)) {
  if (devices_.empty()) throw std::invalid_argument("flashlab::cuda: LocalRing: no devices (hint: e.g. {0, 1})");
  if (std::set<int>(devices_.begin(), devices_.end()).size() != devices_.size())
    throw std::invalid_argument("flashlab::cuda: LocalRing: a device is listed twice (hint: one rank per GPU)");
  int count = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int d : devices_)
    if (d < 0 || d >= count)
      throw std::invalid_argument("flashlab::cuda: LocalRing: device " + std::to_string(d) + " is not on this machine (" +
                                  std::to_string(count) + " GPUs: 0 … " + std::to_string(count - 1) +
                                  ") (hint: ask for at most " + std::to_string(count) + " GPUs)");
  // NVLink multicast (NVLS) stays off unless the caller decided otherwise.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  comms_.assign(devices_.size(), nullptr);
  if (devices_.size() == 1) return;  // one rank: no ring, no communicator
  std::vector<ncclComm_t> comms(devices_.size());
  DeviceGuard guard;
  FLASHLAB_NCCL_CHECK(ncclCommInitAll(comms.data(), int(devices_.size()), devices_.data()), nullptr);
  for (std::size_t r = 0; r < comms.size(); ++r) comms_[r] = comms[r];
}

LocalRing::~LocalRing() {
  for (void* c : comms_)
    if (c) ncclCommDestroy(static_cast<ncclComm_t>(c));  // destructor: nothing to do with an error
}

// ---------------------------------------------------------------------------------------------
// Whole problems from the host (tests)
// ---------------------------------------------------------------------------------------------
namespace {

using Bits = std::vector<std::uint16_t>;

ref::Tensor<std::uint16_t> as_tensor(const Bits& v, const ref::Shape& s, const char* name) {
  if (v.size() != s.numel())
    throw std::invalid_argument(std::string("flashlab::cuda: context parallel: ") + name + " has " +
                                std::to_string(v.size()) + " elements, expected " + std::to_string(s.numel()) +
                                " (hint: Q, O, dO are [B, N, H, d]; K, V are [B, N, H_kv, d])");
  ref::Tensor<std::uint16_t> t(s);
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

// One rank's device copy of its chunks of a global tensor (local layout), on the current device.
detail::DeviceBuffer<std::uint16_t> upload_shard(const ref::ContextParallelProblem& p,
                                                 const ref::Tensor<std::uint16_t>& global, std::size_t rank) {
  Bits local;
  for (const auto& chunk : ref::shard_rows(p, global, rank)) local.insert(local.end(), chunk.data(), chunk.data() + chunk.numel());
  detail::DeviceBuffer<std::uint16_t> d(local.size());
  d.upload(local.data());
  return d;
}

detail::DeviceBuffer<float> upload_stats(const ref::ContextParallelProblem& p, const std::vector<float>& global,
                                         std::size_t rank) {
  std::vector<float> local;
  for (const auto& chunk : ref::shard_stats(p, global, rank)) local.insert(local.end(), chunk.begin(), chunk.end());
  detail::DeviceBuffer<float> d(local.size());
  d.upload(local.data());
  return d;
}

// The global tensor from every rank's device copy (local layout) of `heads` heads.
Bits gather_rows(const ref::ContextParallelProblem& p, const std::vector<detail::DeviceBuffer<std::uint16_t>>& parts,
                 std::size_t heads) {
  const ref::Shape chunk{p.attention.batch, p.chunk_len(), heads, p.attention.head_dim};
  std::vector<std::vector<ref::Tensor<std::uint16_t>>> per_rank(p.gpus);
  for (std::size_t r = 0; r < p.gpus; ++r) {
    Bits local(parts[r].size());
    parts[r].download(local.data());
    for (std::size_t slot = 0; slot < p.chunks_per_rank(); ++slot) {
      ref::Tensor<std::uint16_t> t(chunk);
      std::copy_n(local.data() + slot * chunk.numel(), chunk.numel(), t.data());
      per_rank[r].push_back(std::move(t));
    }
  }
  return ref::unshard_rows(p, per_rank).storage();
}

std::vector<float> gather_stats(const ref::ContextParallelProblem& p, const std::vector<detail::DeviceBuffer<float>>& parts) {
  const std::size_t n = p.attention.batch * p.attention.heads * p.chunk_len();
  std::vector<std::vector<std::vector<float>>> per_rank(p.gpus);
  for (std::size_t r = 0; r < p.gpus; ++r) {
    std::vector<float> local(parts[r].size());
    parts[r].download(local.data());
    for (std::size_t slot = 0; slot < p.chunks_per_rank(); ++slot)
      per_rank[r].emplace_back(local.begin() + std::ptrdiff_t(slot * n), local.begin() + std::ptrdiff_t((slot + 1) * n));
  }
  return ref::unshard_stats(p, per_rank);
}

// Streams of every rank, destroyed at the end.
class RankStreams {
 public:
  explicit RankStreams(const LocalRing& ring) {
    for (int r = 0; r < ring.size(); ++r) {
      FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(r)));
      cudaStream_t s = nullptr;
      FLASHLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      devices_.push_back(ring.device(r));
      streams_.push_back(s);
    }
  }
  ~RankStreams() {
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      cudaSetDevice(devices_[i]);
      cudaStreamDestroy(streams_[i]);
    }
  }
  RankStreams(const RankStreams&) = delete;
  RankStreams& operator=(const RankStreams&) = delete;
  void* get(int r) const { return streams_.at(std::size_t(r)); }
  void synchronize() const {
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      FLASHLAB_CUDA_CHECK(cudaSetDevice(devices_[i]));
      FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(streams_[i]));
    }
  }

 private:
  std::vector<int> devices_;
  std::vector<cudaStream_t> streams_;
};

void check_ring_size(const ref::ContextParallelProblem& p, const LocalRing& ring) {
  if (std::size_t(ring.size()) != p.gpus)
    throw std::invalid_argument("flashlab::cuda: context parallel: the ring has " + std::to_string(ring.size()) +
                                " GPUs, the problem G = " + std::to_string(p.gpus));
}

}  // namespace

RingForwardResult context_parallel_forward(const ref::ContextParallelProblem& problem, const LocalRing& ring,
                                           const Bits& Q, const Bits& K, const Bits& V, FastForwardKernel kernel) {
  check_context_parallel_problem(problem);
  check_ring_size(problem, ring);
  const auto& a = problem.attention;
  const auto gQ = as_tensor(Q, {a.batch, a.seq, a.heads, a.head_dim}, "Q");
  const auto gK = as_tensor(K, {a.batch, a.seq, problem.kv_heads(), a.head_dim}, "K");
  const auto gV = as_tensor(V, {a.batch, a.seq, problem.kv_heads(), a.head_dim}, "V");
  DeviceGuard guard;
  const Sizes z(problem);
  const std::size_t ws_bytes = context_parallel_forward_workspace_bytes(problem);
  std::vector<detail::DeviceBuffer<std::uint16_t>> dQ, dK, dV, dO;
  std::vector<detail::DeviceBuffer<float>> dLSE;
  std::vector<detail::DeviceBuffer<unsigned char>> ws;
  RankStreams streams(ring);
  std::vector<RingRank<RingForwardBuffers>> ranks;
  for (int r = 0; r < ring.size(); ++r) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(r)));
    dQ.push_back(upload_shard(problem, gQ, std::size_t(r)));
    dK.push_back(upload_shard(problem, gK, std::size_t(r)));
    dV.push_back(upload_shard(problem, gV, std::size_t(r)));
    dO.emplace_back(z.q_local());
    dLSE.emplace_back(z.slots * z.stats_chunk());
    ws.emplace_back(ws_bytes);
    dO.back().poison();  // NaN unless written
    dLSE.back().poison();
    ws.back().poison();
  }
  for (int r = 0; r < ring.size(); ++r)
    ranks.push_back({ring.device(r), ring.comm(r),
                     RingForwardBuffers{dQ[r].get(), dK[r].get(), dV[r].get(), dO[r].get(), dLSE[r].get()},
                     ws[r].get(), streams.get(r)});
  RingTrace trace;
  context_parallel_forward_local(problem, ranks, kernel, &trace);
  streams.synchronize();
  RingForwardResult out;
  out.O = gather_rows(problem, dO, a.heads);
  out.LSE = gather_stats(problem, dLSE);
  out.steps = trace.steps();
  return out;
}

RingBackwardResult context_parallel_backward(const ref::ContextParallelProblem& problem, const LocalRing& ring,
                                             const Bits& Q, const Bits& K, const Bits& V, const Bits& O, const Bits& dO,
                                             const std::vector<float>& LSE, FastBackwardKernel kernel) {
  check_context_parallel_problem(problem);
  check_ring_size(problem, ring);
  const auto& a = problem.attention;
  const ref::Shape qs{a.batch, a.seq, a.heads, a.head_dim}, kvs{a.batch, a.seq, problem.kv_heads(), a.head_dim};
  const auto gQ = as_tensor(Q, qs, "Q"), gO = as_tensor(O, qs, "O"), gdO = as_tensor(dO, qs, "dO");
  const auto gK = as_tensor(K, kvs, "K"), gV = as_tensor(V, kvs, "V");
  if (LSE.size() != a.batch * a.heads * a.seq)
    throw std::invalid_argument("flashlab::cuda: context parallel: LSE has " + std::to_string(LSE.size()) +
                                " elements, expected B*H*N = " + std::to_string(a.batch * a.heads * a.seq));
  DeviceGuard guard;
  const Sizes z(problem);
  const std::size_t ws_bytes = context_parallel_backward_workspace_bytes(problem, kernel);
  std::vector<detail::DeviceBuffer<std::uint16_t>> bQ, bK, bV, bO, bdO, bdQ, bdK, bdV;
  std::vector<detail::DeviceBuffer<float>> bLSE;
  std::vector<detail::DeviceBuffer<unsigned char>> ws;
  RankStreams streams(ring);
  for (int r = 0; r < ring.size(); ++r) {
    FLASHLAB_CUDA_CHECK(cudaSetDevice(ring.device(r)));
    bQ.push_back(upload_shard(problem, gQ, std::size_t(r)));
    bK.push_back(upload_shard(problem, gK, std::size_t(r)));
    bV.push_back(upload_shard(problem, gV, std::size_t(r)));
    bO.push_back(upload_shard(problem, gO, std::size_t(r)));
    bdO.push_back(upload_shard(problem, gdO, std::size_t(r)));
    bLSE.push_back(upload_stats(problem, LSE, std::size_t(r)));
    bdQ.emplace_back(z.q_local());
    bdK.emplace_back(z.kv_local());
    bdV.emplace_back(z.kv_local());
    ws.emplace_back(ws_bytes);
    bdQ.back().poison();
    bdK.back().poison();
    bdV.back().poison();
    ws.back().poison();
  }
  std::vector<RingRank<RingBackwardBuffers>> ranks;
  for (int r = 0; r < ring.size(); ++r)
    ranks.push_back({ring.device(r), ring.comm(r),
                     RingBackwardBuffers{bQ[r].get(), bK[r].get(), bV[r].get(), bO[r].get(), bdO[r].get(),
                                         bLSE[r].get(), bdQ[r].get(), bdK[r].get(), bdV[r].get()},
                     ws[r].get(), streams.get(r)});
  RingTrace trace;
  context_parallel_backward_local(problem, ranks, kernel, &trace);
  streams.synchronize();
  RingBackwardResult out;
  out.dQ = gather_rows(problem, bdQ, a.heads);
  out.dK = gather_rows(problem, bdK, problem.kv_heads());
  out.dV = gather_rows(problem, bdV, problem.kv_heads());
  out.steps = trace.steps();
  return out;
}

}  // namespace flashlab::cuda
