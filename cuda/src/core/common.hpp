// Shared plumbing of the CUDA kernels (internal: not installed, not part of the public API).
//
// - FLASHLAB_CUDA_CHECK(expr): every CUDA runtime call goes through it; a failure throws
//   flashlab::cuda::CudaError whose message names the call, the error and file:line. Libraries
//   never exit().
// - DeviceBuffer<T>: RAII owner of one cudaMalloc'ed array (move-only).
// - Problem: the launch-time description shared by every kernel, built by make_problem() from a
//   validated ref::AttentionProblem: B, N, H, d, the tiles Br and Bc the launched kernel really
//   uses, causal, the softmax scale and scale·log2(e) (scores in base-2 units, so exp2 replaces
//   exp), N_k and H_kv (K and V are [B, N_k, H_kv, d]; only the fast kernels take them unequal to
//   N and H), and the window (window_left, window_right: the fast kernels alone take one). Its
//   layout is part of every kernel's parameters: keep the members and their order, and add new
//   ones at the end.
// - Layout: Q, K, V, O, dO, dQ, dK, dV are [B, N, H, d] row-major, as the reference's Tensor;
//   one head is an N × d matrix whose rows are H·d floats apart. LSE and D are [B, H, N].
#pragma once

#include "flashlab/cuda/options.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <string>
#include <utility>

#if defined(__CUDACC__)
#define FLASHLAB_HD __host__ __device__
#else
#define FLASHLAB_HD
#endif

namespace flashlab::ref {
struct AttentionProblem;
}

namespace flashlab::cuda::detail {

/// Throws CudaError "CUDA error in <expr>: <name> (<text>) at file:line".
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

#define FLASHLAB_CUDA_CHECK(expr)                                                        \
  do {                                                                                   \
    cudaError_t flashlab_err_ = (expr);                                                  \
    if (flashlab_err_ != cudaSuccess)                                                    \
      ::flashlab::cuda::detail::throw_cuda_error(flashlab_err_, #expr, __FILE__, __LINE__); \
  } while (0)

/// After a <<<...>>> launch: a bad configuration shows up in cudaGetLastError(); the message
/// names the kernel (`kernel_name` is a string literal).
#define FLASHLAB_CUDA_CHECK_LAUNCH(kernel_name)                                                     \
  do {                                                                                              \
    cudaError_t flashlab_err_ = cudaGetLastError();                                                 \
    if (flashlab_err_ != cudaSuccess)                                                               \
      ::flashlab::cuda::detail::throw_cuda_error(flashlab_err_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)

/// RAII device array of `count` elements of T.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    if (count_ > 0) FLASHLAB_CUDA_CHECK(cudaMalloc(&ptr_, count_ * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);  // destructor: nothing useful to do with an error here
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFree(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  T* get() const { return ptr_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  void upload(const T* host) {
    if (count_) FLASHLAB_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes(), cudaMemcpyHostToDevice));
  }
  void download(T* host) const {
    if (count_) FLASHLAB_CUDA_CHECK(cudaMemcpy(host, ptr_, bytes(), cudaMemcpyDeviceToHost));
  }
  /// Fills every byte with 0xFF: as fp32 that is a NaN, so an element a kernel forgets to write
  /// fails every comparison (outputs are poisoned before each run).
  void poison() {
    if (count_) FLASHLAB_CUDA_CHECK(cudaMemset(ptr_, 0xFF, bytes()));
  }
  void zero() {
    if (count_) FLASHLAB_CUDA_CHECK(cudaMemset(ptr_, 0, bytes()));
  }

 private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

/// Everything a kernel needs besides its pointers (passed by value to every kernel).
struct Problem {
  int batch = 1;       ///< B
  int seq = 0;         ///< N (SEQ)
  int heads = 1;       ///< H (HEAD_NUM)
  int head_dim = 0;    ///< d (HEAD_DIM)
  int Br = 0;          ///< query rows per tile of the launched kernel (set by with_tiles(); 0: no tiles)
  int Bc = 0;          ///< key rows per tile of the launched kernel (set by with_tiles(); 0: no tiles)
  bool causal = false; ///< key j visible to query i only when j <= i
  float scale = 0.f;   ///< softmax scale (1/sqrt(d) by default)
  float scale_log2 = 0.f;  ///< scale · log2(e): scores in base-2 units
  int seq_k = 0;       ///< N_k, keys per sequence (make_problem sets it; N_k = N but in the fast kernels)
  int heads_kv = 0;    ///< H_kv, heads of K and V, dividing H (make_problem sets it; H_kv = H but in the fast kernels)
  /// Keys a query sees left of its diagonal, −1 unbounded (only the fast kernels take a bounded
  /// one). make_problem caps it at N_k, where every row already sees key 0.
  int window_left = -1;
  /// Keys a query sees right of its diagonal, −1 unbounded; make_problem folds causal in (0) and
  /// caps it at N, where every row already sees key N_k − 1.
  int window_right = -1;
  /// Packed sequences (the fast kernels alone take them): Q, O are then [1, total_q, H, d], K, V
  /// [1, total_k, H_kv, d], LSE [1, H, total_q]; `batch` is B, `seq` and `seq_k` the longest
  /// lengths (or more: the kernels read the lengths from the prefix sums, PackedLists, and use
  /// `seq`, `seq_k` only to choose tiles). 0 when dense.
  int total_q = 0;
  int total_k = 0;  ///< packed: rows of K and V (cu_seqlens_k[B])

  /// Elements between two tokens of one head (H·d).
  FLASHLAB_HD std::size_t row_stride() const { return std::size_t(heads) * head_dim; }
  /// Offset of element (b, token 0, h, 0) in a [B, N, H, d] tensor.
  FLASHLAB_HD std::size_t head_offset(int b, int h) const {
    return std::size_t(b) * seq * row_stride() + std::size_t(h) * head_dim;
  }
  /// Offset of row 0 of head (b, h) in a [B, H, N] statistics vector (LSE, D).
  FLASHLAB_HD std::size_t stat_offset(int b, int h) const {
    return (std::size_t(b) * heads + h) * std::size_t(seq);
  }
  /// Elements between two tokens of one K/V head (H_kv·d).
  FLASHLAB_HD std::size_t kv_row_stride() const { return std::size_t(heads_kv) * head_dim; }
  /// Offset of element (b, key 0, hk, 0) in a [B, N_k, H_kv, d] tensor (K, V).
  FLASHLAB_HD std::size_t kv_head_offset(int b, int hk) const {
    return std::size_t(b) * seq_k * kv_row_stride() + std::size_t(hk) * head_dim;
  }
  /// The K/V head query head `h` reads: h / (H / H_kv) (grouped-query attention).
  FLASHLAB_HD int kv_head(int h) const { return h / (heads / heads_kv); }
  /// The causal diagonal's offset N_k − N (bottom-right aligned): query i sees key j iff
  /// j ≤ i + causal_offset().
  FLASHLAB_HD int causal_offset() const { return seq_k - seq; }
  /// A window beyond what the causal kernels mask (a bounded left side, or a bounded right side
  /// without causal): the fast forwards' window instantiations run it.
  FLASHLAB_HD bool windowed() const { return window_left >= 0 || (window_right >= 0 && !causal); }
  /// The band of the mask: query i sees key j iff i + window_lo() ≤ j ≤ i + window_hi() (and
  /// 0 ≤ j < N_k), the reference's rule (attention_problem.hpp) with the offset N_k − N folded
  /// in; an unbounded side is ∓2^30, past every key (|N_k − N| and the capped sides stay below 2^26).
  FLASHLAB_HD int window_lo() const { return window_left >= 0 ? causal_offset() - window_left : -(1 << 30); }
  FLASHLAB_HD int window_hi() const { return window_right >= 0 ? causal_offset() + window_right : (1 << 30); }
  /// This description with the tiles of the kernel about to be launched.
  Problem with_tiles(int query_rows, int key_rows) const {
    Problem p = *this;
    p.Br = query_rows;
    p.Bc = key_rows;
    return p;
  }
  /// True when the sequences are packed (total_q set; the kernels then read PackedLists).
  FLASHLAB_HD bool packed() const { return total_q > 0; }
  /// Packed: query tiles of `rows` rows per head in the launch's tile numbering (packed_tile()):
  /// ⌊total_q / rows⌋ + B, at least Σ_b ⌈len_q(b) / rows⌉ and at most B more.
  FLASHLAB_HD int packed_tiles(int rows) const { return total_q / rows + batch; }
  /// The band's edges of one sequence whose diagonal has offset len_k − len_q (packed: each
  /// sequence its own); window_lo(), window_hi() above are these at the offset N_k − N, written
  /// out so that the kernels that read them compile as they did.
  FLASHLAB_HD int window_lo(int offset) const { return window_left >= 0 ? offset - window_left : -(1 << 30); }
  FLASHLAB_HD int window_hi(int offset) const { return window_right >= 0 ? offset + window_right : (1 << 30); }
  /// Number of query tiles Tr = ceil(N / Br).
  FLASHLAB_HD int Tr() const { return (seq + Br - 1) / Br; }
  /// Number of key tiles Tc = ceil(N / Bc).
  FLASHLAB_HD int Tc() const { return (seq + Bc - 1) / Bc; }
};

/// The launch description of `problem` (already checked by its kernel family's front door, which
/// states the limits: B·N·H·d and B·N_k·H_kv·d below 2^31, and which features each kernel takes):
/// sizes as int (std::logic_error if they do not fit, a problem no front door checked), N_k and
/// H_kv resolved, the scale resolved and scale·log2(e). Br and Bc are 0: each launcher passes its kernel
/// `with_tiles(...)` of the tiles that kernel uses (the problem's for the clear kernels, the
/// compile-time ones for the fast kernels).
Problem make_problem(const ref::AttentionProblem& problem);

/// make_problem() of packed sequences whose lists the host may not know: B, the longest lengths
/// (or more) and the rest from `problem` (dense-shaped, or packed), `total_q` and `total_k` (≥ 1)
/// the packed tensors' rows; the prefix sums travel beside it (PackedLists).
/// std::logic_error when total_q·H·d or total_k·H_kv·d is not below 2^31 (the front door's check).
Problem make_packed_problem(const ref::AttentionProblem& problem, std::size_t total_q, std::size_t total_k);

/// The fields make_problem() sets, without its size check (its helper).
Problem problem_fields(const ref::AttentionProblem& problem);

/// The prefix sums of packed sequences (Problem::packed()), B + 1 int32 each in device memory, as
/// FlashAttention's varlen call takes them: a kernel parameter of their own after the others, so
/// that Problem keeps its 4-byte members (pointers in it would align it to 8 bytes and change the
/// parameter loads of every kernel that takes it); nullptr when dense.
struct PackedLists {
  const int* cu_seqlens_q = nullptr;  ///< query prefix sums
  const int* cu_seqlens_k = nullptr;  ///< key prefix sums
};

/// Threads per block of every attention kernel (4 warps).
inline constexpr int kThreads = 128;

/// Shared-memory row pitch for a tile whose rows hold `head_dim` floats: one float of padding
/// so that threads reading column k of consecutive rows hit different banks (d = 64 and 128
/// are multiples of 32 banks; without the pad a K_j column read would be a 32-way conflict).
FLASHLAB_HD inline int smem_pitch(int head_dim) { return head_dim + 1; }

/// Opts `kernel` into `bytes` of dynamic shared memory on the current device: the one opt-in of
/// every family. Cheap and safe to call before every launch, from any number of host threads: a
/// mutex guards the record of what each (device, kernel) was given, and cudaFuncSetAttribute runs
/// only when a device meets a kernel for the first time (or needs more than it was given). When
/// the device allows less than `bytes` per block, calls `refuse(optin)`, which must throw the
/// family's error naming the kernel, its tiles and a hint (nothing is set then).
void opt_in_smem(const void* kernel, std::size_t bytes, const std::function<void(std::size_t optin)>& refuse);

/// opt_in_smem() whose refusal is a CudaError naming the kernel, its need and the device's limit
/// (for kernels whose SRAM is fixed at compile time: a refusal means another GPU, not bad input).
void opt_in_smem(const void* kernel, std::size_t bytes, const char* kernel_name);

/// opt_in_smem() for an attention kernel: the refusal names the kernel and the tile sizes.
void set_smem(const void* kernel, std::size_t bytes, const char* kernel_name, const Problem& p);

/// Launch hook: the traffic probe installs one to flush L2 before every measured kernel and to
/// remember which kernel each profiler range belongs to. nullptr (the default) does nothing.
struct LaunchHook {
  virtual ~LaunchHook() = default;
  /// Called right before the launch of the kernel called `name`.
  virtual void before(const char* name) = 0;
};

/// The hook of the current thread (nullptr when not measuring).
LaunchHook*& launch_hook();
/// Calls the hook (if any); every launcher calls this right before its <<<...>>>.
inline void announce(const char* name) {
  if (LaunchHook* h = launch_hook()) h->before(name);
}

}  // namespace flashlab::cuda::detail
