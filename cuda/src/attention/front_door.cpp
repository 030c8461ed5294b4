// The attention family's front door (attention.hpp, fast_attention.hpp): the limits of its
// kernels, each checked once, here and nowhere else (check_clear_problem, check_fast_problem, the
// backward's design and kernel), the kernel chosen for the device (fastest_forward_kernel,
// fastest_backward_kernel, the tiles that run: fast_forward_tiles), and the entry points on the
// caller's device memory (fast_attention_forward_device, fast_attention_backward_device and the
// backward's workspace size). Those launch on the caller's stream and do nothing else: no host
// copy, no allocation (the tma-ws forward's split tail and the split-KV forward take their partial
// slots from a stream-ordered pool, partial_pool.hpp), no synchronisation. The host-vector entries that the
// tests and the CLI use are thin wrappers over these, in host.cpp.
#include "core/common.hpp"
#include "core/device_pointer.hpp"
// GCC 12 at -O2/-O3 reports a false -Wrestrict inside std::string operator+ when inlining
// ref::Shape::str() (GCC bug 105329); nothing here overlaps.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include "flashlab/cuda/attention.hpp"
#include "flashlab/cuda/fast_attention.hpp"
#include "attention/front_door.hpp"
#include "attention/fwd_ws_config.hpp"
#include "attention/bwd_d256.hpp"
#include "attention/launchers.hpp"
#include "attention/splitkv.hpp"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace flashlab::cuda {

namespace {

[[noreturn]] void reject(const std::string& field, const std::string& value, const std::string& limit,
                         const std::string& hint) {
  throw std::invalid_argument("flashlab::cuda: clear kernels: " + field + " = " + value + " " + limit +
                              " (hint: " + hint + ")");
}

/// The kernels index their tensors with 32-bit integers: Q/O (B·N·H·d) and K/V (B·N_k·H_kv·d)
/// below 2^31 elements (LSE, B·H·N, is smaller still: d ≥ 1). `who` names the family. Packed
/// sequences: total_q·H·d and total_k·H_kv·d (`rows_q`, `rows_k` the packed rows; 0 when dense).
void require_int_sizes(const char* who, const ref::AttentionProblem& problem, std::size_t rows_q = 0,
                       std::size_t rows_k = 0) {
  constexpr std::size_t kLimit = std::size_t(1) << 31;
  const bool packed = rows_q > 0;
  const std::size_t q = (packed ? rows_q : problem.batch * problem.seq) * problem.heads * problem.head_dim;
  const std::size_t kv = (packed ? rows_k : problem.batch * problem.n_k()) * problem.h_kv() * problem.head_dim;
  const char* hint = "the kernels index with 32-bit integers; split the batch or the heads over several calls";
  if (q >= kLimit)
    throw std::invalid_argument(std::string("flashlab::cuda: ") + who + (packed ? ": total_q·H·d = " : ": B·N·H·d = ") +
                                std::to_string(q) + " is not below 2^31 (hint: " + hint + ")");
  if (kv >= kLimit)
    throw std::invalid_argument(
        std::string("flashlab::cuda: ") + who + (packed ? ": total_k·H_kv·d = " : ": B·N_k·H_kv·d = ") +
        std::to_string(kv) +
        (packed ? std::string() : " (seq_k N_k = " + std::to_string(problem.n_k()) + ")") +
        " is not below 2^31 (hint: " + hint + ")");
}

}  // namespace

void check_clear_problem(ref::Algorithm algorithm, const ref::AttentionProblem& problem) {
  problem.validate();
  if (const std::string feature = problem.extended_feature(); !feature.empty())
    throw std::invalid_argument("flashlab::cuda: clear kernels: " + feature +
                                " is not supported (hint: the fast kernels take it, in bf16 or fp16, and the CPU "
                                "reference: flashlab attention fwd|bwd)");
  if (algorithm == ref::Algorithm::naive_bwd)
    reject("algorithm", "naive_bwd", "has no CUDA kernels", "use bwd_two_kernel or bwd_atomic");
  if (problem.dtype != ref::Dtype::fp32)
    reject("dtype", std::string(ref::dtype_name(problem.dtype)), "is not fp32",
           "the clear kernels compute in fp32 on CUDA cores; bf16/fp16 run on the fast kernels");
  if (problem.n_k() != problem.n_q())
    reject("seq_k (N_k)", std::to_string(problem.n_k()), "differs from N = " + std::to_string(problem.n_q()),
           "the clear kernels are self-attention; the fast kernels, in bf16 or fp16, take N_k != N");
  if (problem.head_dim > kClearMaxHeadDim)
    reject("head_dim (d)", std::to_string(problem.head_dim), "is above 256", "the kernels keep whole rows of d in SRAM");
  if (problem.Br > kClearMaxTileRows)
    reject("Br", std::to_string(problem.Br), "is above 128", "one thread per tile row; try 64");
  if (problem.Bc > kClearMaxTileRows)
    reject("Bc", std::to_string(problem.Bc), "is above 128", "one thread per tile row; try 64");
  require_int_sizes("clear kernels", problem);
  if (algorithm == ref::Algorithm::naive_fwd && problem.seq > std::size_t(detail::naive_max_seq()))
    reject("seq (N)", std::to_string(problem.seq), "is above " + std::to_string(detail::naive_max_seq()),
           "the naive softmax holds one row of S in shared memory; use fa2_fwd");
}

// ----------------------------------------------------------------------------- the fast kernels

namespace {

// The fast kernels' limits on d, stated here only (check_fast_problem, check_forward_kernel,
// fast_bwd_problem and fast_forward_tiles call these): every fast kernel takes d = 64 and 128;
// the mma and tma-ws forwards take 256 too, and so do the atomic design's mma, wgmma-ws and
// wgmma-ws-det backwards, in kernels of their own (attention_bwd_d256.cu, attention_bwd_d256_ws.cu:
// the d = 64 / 128 layouts hold dK_j and dV_j of a 128-key block in registers, d registers per
// thread, 256 at d = 256 against the 255 a thread has).
constexpr const char* kD256Kernels =
    "the mma and tma-ws forwards and the bwd_atomic mma, wgmma-ws and wgmma-ws-det backwards";

void require_fast_head_dim(std::size_t head_dim) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    throw std::invalid_argument("flashlab::cuda: fast kernels: head_dim (d) = " + std::to_string(head_dim) +
                                " is not 64, 128 or 256 (hint: the fast kernels are compiled for d = 64 and 128, " +
                                kD256Kernels + " for d = 256 too; the clear fa2 kernel takes any d up to 256)");
}

/// d = 256 on a kernel that takes d = 64 and 128 only (`who`: "wgmma forward", "fp32-sum backward", ...).
void require_d64_d128(std::size_t head_dim, const std::string& who) {
  if (head_dim == 256)
    throw std::invalid_argument("flashlab::cuda: " + who + ": head_dim (d) = 256 is not supported: it takes d = 64 "
                                "and 128 (hint: d = 256 runs on " + std::string(kD256Kernels) + ")");
}

/// Compute capability 9.0 (H100, H200): sm_90a code runs there only (its "a" features are not
/// forward-compatible).
bool device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;
}

int device_sms() {
  int dev = 0, sms = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

/// A device pointer argument of an entry point (core/device_pointer.hpp).
void require_device_pointer(const char* entry, const char* name, const void* ptr, std::size_t alignment) {
  const std::string why = detail::device_pointer_problem(ptr, alignment);
  if (!why.empty()) throw std::invalid_argument(std::string("flashlab::cuda: ") + entry + ": " + name + " " + why);
}

/// Byte offset of the atomic design's dQ accumulator in the workspace: after D (B·H·N floats),
/// rounded up to 256 bytes (float4 accesses, and a cache-line start).
std::size_t dq_accum_offset(std::size_t stats) { return (stats * sizeof(float) + 255) / 256 * 256; }

/// Packed sequences on the backward: the atomic design's mma and wgmma-ws kernels and the two-kernel
/// design take them (their blocks walk the packed numberings, attention_bwd_tc_atomic.cu,
/// attention_bwd_ws.cu, attention_bwd_tc.cu); the deterministic wgmma-ws kernel refuses them by name.
/// `kernel` null: the design alone is checked. `count`: "B " where the host knows B, or empty.
void require_packed_backward(ref::Algorithm design, const FastBackwardKernel* kernel, const std::string& count) {
  if (design != ref::Algorithm::bwd_atomic || kernel == nullptr || *kernel != FastBackwardKernel::wgmma_ws_deterministic)
    return;
  throw std::invalid_argument(
      "flashlab::cuda: fast backward: cu_seqlens (" + count + "packed sequences) are not supported by the " +
      std::string(to_string(*kernel)) +
      " kernel: the bwd_two_kernel design (deterministic too) and the bwd_atomic design's mma and wgmma-ws kernels "
      "take them (hint: design bwd_two_kernel for bit-reproducible gradients, or bwd_atomic with kernel mma or "
      "wgmma-ws)");
}

/// The packed backward's launch: causal, its key tiles (⌊total_k / Bc⌋ + B, Bc = 128) are the
/// grid's y dimension (attention_bwd_tc_atomic.cu), at most 65535.
const detail::Problem& require_packed_key_tiles(const detail::Problem& p) {
  constexpr long long kMaxY = 65535, kBc = 128;
  const long long tiles = p.total_k / kBc + p.batch;
  if (p.causal && tiles > kMaxY)
    throw std::invalid_argument("flashlab::cuda: fast backward: causal packed sequences with total_k = " +
                                std::to_string(p.total_k) + " and B = " + std::to_string(p.batch) + " make " +
                                std::to_string(tiles) + " key tiles of 128, above the 65535 one launch takes (hint: "
                                "split the sequences over several calls)");
  return p;
}

// The checked launch description of a fast backward; each launcher sets its kernels' tiles. A
// window, grouped K/V (H_kv < H) and N_k ≠ N: the atomic design's mma and wgmma-ws kernels and the
// two-kernel design take them (attention_bwd_tc_atomic.cu, attention_bwd_ws.cu,
// attention_bwd_tc.cu), and at d = 256 the deterministic wgmma-ws kernel (attention_bwd_d256_ws.cu);
// at d = 64 and 128 that kernel refuses each by name, before anything else, pointing to the
// two-kernel design (deterministic too). `kernel` null (the workspace's size, which these leave
// alone): the design alone is checked.
detail::Problem fast_bwd_problem(ref::Algorithm design, const ref::AttentionProblem& problem,
                                 const FastBackwardKernel* kernel = nullptr) {
  check_fast_problem(problem);
  if (problem.is_packed()) require_packed_backward(design, kernel, std::to_string(problem.packed->count()) + " ");
  if (problem.head_dim == 256 && design == ref::Algorithm::bwd_two_kernel)
    // d = 256: the atomic design's mma, wgmma-ws and wgmma-ws-det kernels (attention_bwd_d256.cu,
    // attention_bwd_d256_ws.cu, the last with dQ's sums in a fixed order).
    throw std::invalid_argument("flashlab::cuda: fast backward: head_dim (d) = 256 is not supported by the "
                                "bwd_two_kernel design: at d = 256 the backward runs on the bwd_atomic design's mma, "
                                "wgmma-ws and wgmma-ws-det kernels (hint: design bwd_atomic; kernel wgmma-ws-det for "
                                "bit-reproducible gradients, on an H100/H200 build with sm_90a)");
  // The d = 256 fixed-order kernel takes windows, grouped K/V and N_k ≠ N (the band kernel's order,
  // attention_bwd_d256_ws.cu); the d = 64 / 128 one takes none of them.
  const bool fixed_order_ws = design == ref::Algorithm::bwd_atomic && kernel != nullptr &&
                              *kernel == FastBackwardKernel::wgmma_ws_deterministic && problem.head_dim != 256;
  if (fixed_order_ws) {
    const std::string who = "the " + std::string(to_string(*kernel)) + " kernel";
    const auto refuse = [&](const std::string& what, const std::string& takes) {
      throw std::invalid_argument("flashlab::cuda: fast backward: " + what + " is not supported by " + who +
                                  ": the bwd_two_kernel design (deterministic too: no atomics) and the bwd_atomic "
                                  "design's mma and wgmma-ws kernels take " + takes +
                                  " (hint: design bwd_two_kernel for bit-reproducible gradients, or bwd_atomic with "
                                  "kernel mma or wgmma-ws)");
    };
    if (problem.has_window())
      refuse("window (" + std::to_string(problem.window_left) + "," + std::to_string(problem.window_right) + ")",
             "windows");
    if (problem.h_kv() != problem.heads)
      refuse("heads_kv (H_kv) = " + std::to_string(problem.h_kv()) + " (differs from heads (H) = " +
                 std::to_string(problem.heads) + ")",
             "grouped K/V");
    if (problem.n_k() != problem.n_q())
      refuse("seq_k (N_k) = " + std::to_string(problem.n_k()) + " (differs from seq (N) = " +
                 std::to_string(problem.n_q()) + ")",
             "N_k != N");
  }
  if (design != ref::Algorithm::bwd_two_kernel && design != ref::Algorithm::bwd_atomic)
    throw std::invalid_argument("flashlab::cuda: fast backward: algorithm = " +
                                std::string(ref::algorithm_name(design)) +
                                " is not a fast backward design (hint: bwd_two_kernel or bwd_atomic)");
  const detail::Problem p = detail::make_problem(problem);
  return p.packed() ? require_packed_key_tiles(p) : p;
}

/// The plain wgmma forward reads K and V with Q's heads and length and masks no window: grouped
/// K/V, N_k ≠ N and windows run on tma_ws and mma_sync. The split-KV forward masks no window either.
void check_forward_kernel(const ref::AttentionProblem& problem, FastForwardKernel kernel, bool packed = false) {
  const char* hint = "use the tma-ws or mma forward kernel";
  if (packed && (kernel == FastForwardKernel::split_kv || kernel == FastForwardKernel::wgmma))
    throw std::invalid_argument(std::string("flashlab::cuda: ") + to_string(kernel) +
                                " forward: cu_seqlens (packed sequences) are not supported: the " + to_string(kernel) +
                                " forward takes dense batches only (hint: " + hint + ")");
  if (kernel == FastForwardKernel::split_kv) require_d64_d128(problem.head_dim, "split-KV forward");
  if (kernel == FastForwardKernel::wgmma) require_d64_d128(problem.head_dim, "wgmma forward");
  if (kernel == FastForwardKernel::split_kv && problem.has_window())
    throw std::invalid_argument("flashlab::cuda: split-KV forward: window (" + std::to_string(problem.window_left) +
                                "," + std::to_string(problem.window_right) +
                                ") is not supported: the split-KV forward takes no window (hint: " + hint + ")");
  if (kernel != FastForwardKernel::wgmma) return;
  if (problem.h_kv() != problem.heads)
    throw std::invalid_argument("flashlab::cuda: wgmma forward: heads_kv (H_kv) = " + std::to_string(problem.h_kv()) +
                                " differs from heads (H) = " + std::to_string(problem.heads) +
                                ": the wgmma forward takes H_kv = H (hint: " + hint + ")");
  if (problem.n_k() != problem.n_q())
    throw std::invalid_argument("flashlab::cuda: wgmma forward: seq_k (N_k) = " + std::to_string(problem.n_k()) +
                                " differs from seq (N) = " + std::to_string(problem.n_q()) +
                                ": the wgmma forward takes N_k = N (hint: " + hint + ")");
  if (problem.has_window())
    throw std::invalid_argument("flashlab::cuda: wgmma forward: window (" + std::to_string(problem.window_left) + "," +
                                std::to_string(problem.window_right) + ") is not supported: the wgmma forward takes "
                                "no window (hint: " + hint + ")");
}

/// The kernel choice's limits: wgmma_ws runs bwd_atomic only, and only where it was built.
void check_bwd_kernel(ref::Algorithm design, FastBackwardKernel kernel) {
  if (kernel == FastBackwardKernel::mma_sync) return;
  if (design != ref::Algorithm::bwd_atomic)
    throw std::invalid_argument("flashlab::cuda: the wgmma-ws backward kernel runs the bwd_atomic design only (hint: "
                                "design bwd_atomic, or kernel mma_sync for bwd_two_kernel)");
  if (!fast_forward_wgmma_built())
    throw std::invalid_argument("flashlab::cuda: the wgmma-ws backward kernel is not in this build (hint: configure "
                                "with CMAKE_CUDA_ARCHITECTURES including 90)");
}

void require_wgmma_built(FastForwardKernel kernel) {
  const bool portable = kernel == FastForwardKernel::mma_sync || kernel == FastForwardKernel::split_kv;
  if (!portable && !fast_forward_wgmma_built())
    throw std::invalid_argument(
        std::string("flashlab::cuda: the ") + to_string(kernel) +
        " forward is not in this build (hint: configure with CMAKE_CUDA_ARCHITECTURES including 90; it needs an "
        "sm_90 GPU)");
}

}  // namespace

const char* to_string(FastForwardKernel kernel) {
  switch (kernel) {
    case FastForwardKernel::wgmma: return "wgmma";
    case FastForwardKernel::tma_ws: return "tma-ws";
    case FastForwardKernel::split_kv: return "splitkv";
    default: return "mma";
  }
}

const char* to_string(FastBackwardKernel kernel) {
  switch (kernel) {
    case FastBackwardKernel::wgmma_ws: return "wgmma-ws";
    case FastBackwardKernel::wgmma_ws_deterministic: return "wgmma-ws-det";
    default: return "mma";
  }
}

bool fast_forward_wgmma_built() {
#ifdef FLASHLAB_HAVE_WGMMA
  return true;
#else
  return false;
#endif
}

FastForwardKernel fastest_forward_kernel() {
  return fast_forward_wgmma_built() && device_is_sm90() ? FastForwardKernel::tma_ws : FastForwardKernel::mma_sync;
}

FastForwardKernel fastest_forward_kernel(const ref::AttentionProblem& problem) {
  check_fast_problem(problem);
  if (problem.is_packed()) return fastest_forward_kernel();  // split_kv takes no packed sequences
  // The split-KV rule, stated here only (measured on the H100: docs/cuda.md, the split-KV forward):
  // at most 16 query rows always (a decode step: a 128-row tile would waste the other rows, and
  // packing the H/H_kv heads reads each K/V tile once), else when the regular forwards' blocks (one
  // per 128-row query tile and head) would fill at most 1/kSplitKvSmShare of the SMs.
  constexpr std::size_t kShortList = 16, kRegularBr = 128, kSplitKvSmShare = 4;
  const std::size_t regular_blocks = problem.batch * problem.heads * ((problem.seq + kRegularBr - 1) / kRegularBr);
  // A window runs on the regular forwards (the split-KV forward masks none), and so does d = 256
  // (the split-KV forward is compiled for d = 64 and 128).
  if (!problem.has_window() && problem.head_dim != 256 &&
      (problem.seq <= kShortList || regular_blocks * kSplitKvSmShare <= std::size_t(device_sms())))
    return FastForwardKernel::split_kv;
  return fastest_forward_kernel();
}

FastBackwardKernel fastest_backward_kernel() {
  // The same condition as the forward's tma_ws: sm_90a code built, a compute capability 9.0 device.
  return fastest_forward_kernel() == FastForwardKernel::tma_ws ? FastBackwardKernel::wgmma_ws
                                                               : FastBackwardKernel::mma_sync;
}

FastBackwardKernel fastest_backward_kernel(const ref::AttentionProblem& /*problem*/) {
  // Every problem follows fastest_backward_kernel(): packed sequences (d = 64 and 128 only,
  // check_fast_problem) and d = 256 run on the wgmma-ws kernel where it runs, as dense d = 64 and
  // 128 do (at d = 256 it measured faster than the mma kernel on the H100, causal or not:
  // docs/cuda.md, the backward at head dim 256).
  return fastest_backward_kernel();
}

FastTiles fast_forward_tiles(int head_dim, FastForwardKernel kernel) {
  const std::size_t d = head_dim < 0 ? 0 : std::size_t(head_dim);
  require_fast_head_dim(d);
  if (kernel == FastForwardKernel::split_kv) require_d64_d128(d, "split-KV forward");
  if (kernel == FastForwardKernel::wgmma) require_d64_d128(d, "wgmma forward");
  if (kernel == FastForwardKernel::wgmma) return {detail::kWgmmaBlockM, detail::kWgmmaBlockN};
  if (kernel == FastForwardKernel::tma_ws) {  // the configuration of a short work list
    detail::Problem p{};
    p.head_dim = head_dim;
    p.seq = p.seq_k = p.heads = p.heads_kv = p.batch = 1;
    const detail::WsConfig c = detail::choose_ws_config(p, true, 1);
    return {c.block_m(), c.block_n};
  }
  if (kernel == FastForwardKernel::split_kv) return {16, detail::kSplitKvBlockN};  // at most 16 packed rows
  return {detail::kMmaBlockM, detail::kMmaBlockN};
}

FastTiles fast_forward_tiles(const ref::AttentionProblem& problem, FastForwardKernel kernel) {
  check_fast_problem(problem);
  check_forward_kernel(problem, kernel, problem.is_packed());
  if (kernel == FastForwardKernel::split_kv)
    return {detail::split_kv_block_m(detail::make_problem(problem)), detail::kSplitKvBlockN};
  if (kernel != FastForwardKernel::tma_ws) return fast_forward_tiles(int(problem.head_dim), kernel);
  const detail::WsConfig c =
      detail::choose_ws_config(detail::make_problem(problem), problem.dtype == ref::Dtype::bf16, device_sms());
  return {c.block_m(), c.block_n};
}

namespace {

/// check_fast_problem() but the sizes: the problem's limits, its features, d and the dtype.
void check_fast_shape(const ref::AttentionProblem& problem) {
  problem.validate();
  // Grouped K/V (heads_kv), N_k ≠ N, windows and packed sequences: the plain wgmma forward and, at
  // d = 64 and 128, the deterministic wgmma-ws backward kernel refuse the first three
  // (check_forward_kernel, fast_bwd_problem); split_kv, wgmma and the deterministic wgmma-ws
  // backward kernel refuse packed sequences.
  ref::AttentionProblem beyond = problem;
  beyond.heads_kv = 0;
  beyond.window_left = beyond.window_right = -1;
  beyond.packed.reset();
  if (const std::string feature = beyond.extended_feature(); !feature.empty())
    throw std::invalid_argument("flashlab::cuda: fast kernels: " + feature +
                                " is not supported yet (hint: the CPU reference supports it: flashlab attention fwd|bwd)");
  require_fast_head_dim(problem.head_dim);
  if (problem.dtype != ref::Dtype::bf16 && problem.dtype != ref::Dtype::fp16)
    throw std::invalid_argument("flashlab::cuda: fast kernels: dtype = " + std::string(ref::dtype_name(problem.dtype)) +
                                " is not bf16 or fp16 (hint: the fast kernels take 16-bit inputs; fp32 runs on "
                                "the clear kernels)");
}

}  // namespace

namespace {

/// Packed sequences run at d = 64 and 128, forward and backward (their instantiations were not
/// built at d = 256).
void require_packed_head_dim(const ref::AttentionProblem& problem) {
  if (problem.head_dim == 256)
    throw std::invalid_argument("flashlab::cuda: fast kernels: cu_seqlens (packed sequences) with head_dim (d) = 256 "
                                "are not supported yet: the packed forwards and backwards take d = 64 and 128 (hint: pad the "
                                "sequences into a dense batch, or run them on the CPU reference)");
}

}  // namespace

void check_fast_problem(const ref::AttentionProblem& problem) {
  check_fast_shape(problem);
  if (problem.packed) require_packed_head_dim(problem);
  if (problem.packed)
    require_int_sizes("fast kernels", problem, problem.packed->total_q(), problem.packed->total_k());
  else
    require_int_sizes("fast kernels", problem);
}

namespace {

void require_forward_pointers(const void* Q, const void* K, const void* V, void* O, float* LSE) {
  constexpr const char* kEntry = "fast_attention_forward_device";
  require_device_pointer(kEntry, "Q", Q, 16);
  require_device_pointer(kEntry, "K", K, 16);
  require_device_pointer(kEntry, "V", V, 16);
  require_device_pointer(kEntry, "O", O, 16);
  require_device_pointer(kEntry, "LSE", LSE, 4);
}

/// The launch of `kernel` (`lists`: packed sequences' prefix sums, for mma and tma-ws alone).
void launch_forward(const detail::Problem& p, bool bf16, FastForwardKernel kernel, const void* Q, const void* K,
                    const void* V, void* O, float* LSE, void* stream, const detail::PackedLists& lists = {}) {
  const auto s = static_cast<cudaStream_t>(stream);
#ifdef FLASHLAB_HAVE_WGMMA
  if (kernel == FastForwardKernel::wgmma) return detail::launch_fast_wgmma(p, bf16, Q, K, V, O, LSE, s);
  if (kernel == FastForwardKernel::tma_ws) return detail::launch_fast_tma_ws(p, bf16, Q, K, V, O, LSE, s, lists);
#endif
  if (kernel == FastForwardKernel::split_kv) return detail::launch_fast_split_kv(p, bf16, Q, K, V, O, LSE, s);
  detail::launch_fast_mma(p, bf16, Q, K, V, O, LSE, s, lists);
}

/// One total of a packed call (`name` "total_q" or "total_k"): at least 1 (every packed problem
/// has a query and a key in all), below 2^31, and equal to the problem's own list's when it has one.
void require_packed_total(const char* name, std::size_t total, const std::optional<ref::PackedSequences>& lists,
                          bool queries) {
  const std::string field = std::string("flashlab::cuda: fast_attention_forward_device: packed.") + name + " = " +
                            std::to_string(total);
  if (total == 0 || total >= (std::size_t(1) << 31))
    throw std::invalid_argument(field + " is not 1 … 2^31 − 1 (hint: the rows of the packed " +
                                (queries ? "Q" : "K and V") + " tensor, the last entry of cu_seqlens_" +
                                (queries ? "q" : "k") + ")");
  if (!lists) return;
  const std::size_t own = queries ? lists->total_q() : lists->total_k();
  if (own != total)
    throw std::invalid_argument(field + " differs from the problem's cu_seqlens_" + (queries ? "q" : "k") +
                                ", which ends at " + std::to_string(own) +
                                " (hint: the device lists and the problem's describe the same sequences)");
}

}  // namespace

void fast_attention_forward_device(const ref::AttentionProblem& problem, FastForwardKernel kernel, const void* Q,
                                   const void* K, const void* V, void* O, float* LSE, void* stream) {
  check_fast_problem(problem);
  if (problem.is_packed())
    throw std::invalid_argument("flashlab::cuda: fast_attention_forward_device: the problem has cu_seqlens (" +
                                std::to_string(problem.packed->count()) +
                                " packed sequences), whose prefix sums the kernels read from device memory (hint: pass them with the "
                                "overload that takes FastPackedSequences)");
  check_forward_kernel(problem, kernel);
  require_wgmma_built(kernel);
  require_forward_pointers(Q, K, V, O, LSE);
  const FastTiles tiles = fast_forward_tiles(problem, kernel);
  const detail::Problem p = detail::make_problem(problem).with_tiles(tiles.Br, tiles.Bc);
  launch_forward(p, problem.dtype == ref::Dtype::bf16, kernel, Q, K, V, O, LSE, stream);
}

void check_fast_packed(const ref::AttentionProblem& problem, const FastPackedSequences& packed) {
  check_fast_shape(problem);
  require_packed_head_dim(problem);
  require_packed_total("total_q", packed.total_q, problem.packed, true);
  require_packed_total("total_k", packed.total_k, problem.packed, false);
  require_int_sizes("fast kernels", problem, packed.total_q, packed.total_k);
}

void fast_attention_forward_device(const ref::AttentionProblem& problem, const FastPackedSequences& packed,
                                   FastForwardKernel kernel, const void* Q, const void* K, const void* V, void* O,
                                   float* LSE, void* stream) {
  check_fast_packed(problem, packed);
  check_forward_kernel(problem, kernel, true);
  require_wgmma_built(kernel);
  require_forward_pointers(Q, K, V, O, LSE);
  constexpr const char* kEntry = "fast_attention_forward_device";
  require_device_pointer(kEntry, "packed.cu_seqlens_q", packed.cu_seqlens_q, 4);
  require_device_pointer(kEntry, "packed.cu_seqlens_k", packed.cu_seqlens_k, 4);
  const detail::Problem p = detail::make_packed_problem(problem, packed.total_q, packed.total_k);
  const detail::PackedLists lists{packed.cu_seqlens_q, packed.cu_seqlens_k};
  const bool bf16 = problem.dtype == ref::Dtype::bf16;
  int Br = detail::kMmaBlockM, Bc = detail::kMmaBlockN;
  if (kernel == FastForwardKernel::tma_ws) {
    const detail::WsConfig c = detail::choose_ws_config(p, bf16, device_sms());
    Br = c.block_m();
    Bc = c.block_n;
  }
  launch_forward(p.with_tiles(Br, Bc), bf16, kernel, Q, K, V, O, LSE, stream, lists);
}

namespace {

/// The dQ accumulator's floats in the atomic design's packed workspace: H·(⌊total_q / Br⌋ + B) whole
/// tiles in the packed numbering (attention_bwd_tc_atomic.cu), at most H·(total_q +
/// B·kAtomicDqTileRows)·d floats for either Br.
std::size_t packed_dq_accum_numel(const detail::Problem& p) {
  return (std::size_t(p.total_q) + std::size_t(p.batch) * detail::kAtomicDqTileRows) * p.row_stride();
}

/// The workspace of the atomic design's packed backward: D [H, total_q], the dQ accumulator
/// (packed_dq_accum_numel), then the wgmma-ws kernel's work counter (one int). The two-kernel
/// design: D alone.
std::size_t packed_backward_workspace_bytes(ref::Algorithm design, const detail::Problem& p) {
  const std::size_t stats = std::size_t(p.heads) * std::size_t(p.total_q);
  if (design == ref::Algorithm::bwd_two_kernel) return stats * sizeof(float);
  return dq_accum_offset(stats) + packed_dq_accum_numel(p) * sizeof(float) + sizeof(int);
}

/// The checks of a packed backward whose lists are on the device (`kernel` null: the design
/// alone): the packed problem's (check_fast_packed: its sizes are the totals', not B·N·H·d), the
/// backward's head dims, and the designs and kernels that take packed sequences.
detail::Problem check_packed_backward(ref::Algorithm design, const ref::AttentionProblem& problem,
                                      const FastPackedSequences& packed, const FastBackwardKernel* kernel) {
  check_fast_packed(problem, packed);
  require_packed_backward(design, kernel, problem.is_packed() ? std::to_string(problem.packed->count()) + " " : "");
  if (kernel != nullptr) check_bwd_kernel(design, *kernel);
  return require_packed_key_tiles(detail::make_packed_problem(problem, packed.total_q, packed.total_k));
}

}  // namespace

std::size_t fast_attention_backward_workspace_bytes(ref::Algorithm design, const ref::AttentionProblem& problem,
                                                    const FastPackedSequences& packed) {
  return packed_backward_workspace_bytes(design, check_packed_backward(design, problem, packed, nullptr));
}

std::size_t fast_attention_backward_workspace_bytes(ref::Algorithm design, const ref::AttentionProblem& problem) {
  const detail::Problem p = fast_bwd_problem(design, problem);
  if (p.packed()) return packed_backward_workspace_bytes(design, p);
  const std::size_t stats = std::size_t(p.batch) * p.heads * p.seq;
  if (design == ref::Algorithm::bwd_two_kernel) return stats * sizeof(float);
  // The atomic design's dQ accumulator holds whole query tiles per (b, h) (attention_bwd_tc_atomic.cu,
  // tiled layout): N rounded up to kAtomicDqTileRows.
  constexpr std::size_t kTile = detail::kAtomicDqTileRows;
  const std::size_t rows = (std::size_t(p.seq) + kTile - 1) / kTile * kTile;
  const std::size_t numel = std::size_t(p.batch) * rows * p.row_stride();
  const std::size_t counters =
      std::size_t(p.batch) * p.heads * ((std::size_t(p.seq) + detail::kDqOrderTileRows - 1) / detail::kDqOrderTileRows);
  return dq_accum_offset(stats) + numel * sizeof(float) + counters * sizeof(int);
}

namespace {

/// The checks on the pointers of a backward on device memory.
void require_backward_pointers(const void* Q, const void* K, const void* V, const void* O, const void* dO,
                               const float* LSE, void* dQ, void* dK, void* dV, void* workspace) {
  if (workspace == nullptr)
    throw std::invalid_argument(
        "flashlab::cuda: fast_attention_backward_device needs a workspace (hint: allocate "
        "fast_attention_backward_workspace_bytes(design, problem) bytes of device memory)");
  constexpr const char* kEntry = "fast_attention_backward_device";
  for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"Q", Q}, {"K", K}, {"V", V}, {"O", O},
                                  {"dO", dO}, {"dQ", dQ}, {"dK", dK}, {"dV", dV}})
    require_device_pointer(kEntry, name, ptr, 16);
  require_device_pointer(kEntry, "LSE", LSE, 4);
  require_device_pointer(kEntry, "workspace", workspace, 256);
}

/// fast_attention_backward_device() and its fp32-sum twin (detail::fast_backward_add_f32_device):
/// `add_f32` adds the gradients into fp32 dQ, dK, dV (BwdPointers::add_f32), the atomic design only.
void backward_device(ref::Algorithm design, const ref::AttentionProblem& problem, const void* Q, const void* K,
                     const void* V, const void* O, const void* dO, const float* LSE, void* dQ, void* dK, void* dV,
                     void* workspace, void* stream, FastBackwardKernel kernel, bool add_f32) {
  const detail::Problem p = detail::check_fast_backward(design, problem, kernel);
  if (problem.is_packed())
    throw std::invalid_argument("flashlab::cuda: fast_attention_backward_device: the problem has cu_seqlens (" +
                                std::to_string(problem.packed->count()) +
                                " packed sequences), whose prefix sums the kernels read from device memory (hint: pass "
                                "them with the overload that takes FastPackedSequences)");
  require_backward_pointers(Q, K, V, O, dO, LSE, dQ, dK, dV, workspace);
  const auto s = static_cast<cudaStream_t>(stream);
  const std::size_t stats = std::size_t(p.batch) * p.heads * p.seq;
  auto* ws = static_cast<unsigned char*>(workspace);
  float* D = reinterpret_cast<float*>(ws);
  const bool atomic = design == ref::Algorithm::bwd_atomic;
  float* dQaccum = atomic ? reinterpret_cast<float*>(ws + dq_accum_offset(stats)) : nullptr;
  const detail::BwdPointers a{Q, K, V, O, dO, LSE, dQ, dK, dV, D, dQaccum, add_f32};
  const bool bf16 = problem.dtype == ref::Dtype::bf16;
  if (!atomic) return detail::launch_fast_bwd_two_kernel(p, bf16, a, s);
#ifdef FLASHLAB_HAVE_WGMMA
  if (kernel != FastBackwardKernel::mma_sync) {
    // The order counters follow the accumulator (fast_attention_backward_workspace_bytes).
    constexpr std::size_t kTile = detail::kAtomicDqTileRows;
    const std::size_t acc_numel =
        std::size_t(p.batch) * ((std::size_t(p.seq) + kTile - 1) / kTile * kTile) * p.row_stride();
    const bool fixed_order = kernel == FastBackwardKernel::wgmma_ws_deterministic;
    int* order = fixed_order ? reinterpret_cast<int*>(dQaccum + acc_numel) : nullptr;
    if (p.head_dim == 256) return detail::launch_fast_bwd_d256_ws(p, bf16, a, order, s);
    return detail::launch_fast_bwd_ws(p, bf16, a, order, s);
  }
#endif
  if (p.head_dim == 256) return detail::launch_fast_bwd_d256(p, bf16, a, s);
  detail::launch_fast_bwd_atomic(p, bf16, a, s);
}

}  // namespace

void fast_attention_backward_device(ref::Algorithm design, const ref::AttentionProblem& problem,
                                    const FastPackedSequences& packed, const void* Q, const void* K, const void* V,
                                    const void* O, const void* dO, const float* LSE, void* dQ, void* dK, void* dV,
                                    void* workspace, void* stream, FastBackwardKernel kernel) {
  const detail::Problem p = check_packed_backward(design, problem, packed, &kernel);
  require_backward_pointers(Q, K, V, O, dO, LSE, dQ, dK, dV, workspace);
  constexpr const char* kEntry = "fast_attention_backward_device";
  require_device_pointer(kEntry, "packed.cu_seqlens_q", packed.cu_seqlens_q, 4);
  require_device_pointer(kEntry, "packed.cu_seqlens_k", packed.cu_seqlens_k, 4);
  auto* ws = static_cast<unsigned char*>(workspace);
  const std::size_t stats = std::size_t(p.heads) * std::size_t(p.total_q);
  float* D = reinterpret_cast<float*>(ws);
  const bool atomic = design == ref::Algorithm::bwd_atomic;
  float* dQaccum = atomic ? reinterpret_cast<float*>(ws + dq_accum_offset(stats)) : nullptr;
  const detail::BwdPointers a{Q, K, V, O, dO, LSE, dQ, dK, dV, D, dQaccum};
  const detail::PackedLists lists{packed.cu_seqlens_q, packed.cu_seqlens_k};
  const bool bf16 = problem.dtype == ref::Dtype::bf16;
  if (!atomic) return detail::launch_fast_bwd_two_kernel(p, bf16, a, static_cast<cudaStream_t>(stream), lists);
#ifdef FLASHLAB_HAVE_WGMMA
  if (kernel == FastBackwardKernel::wgmma_ws) {
    int* next_item = reinterpret_cast<int*>(dQaccum + packed_dq_accum_numel(p));  // after the accumulator
    return detail::launch_fast_bwd_ws_packed(p, bf16, a, lists, next_item, static_cast<cudaStream_t>(stream));
  }
#endif
  detail::launch_fast_bwd_atomic(p, bf16, a, static_cast<cudaStream_t>(stream), lists);
}

void fast_attention_backward_device(ref::Algorithm design, const ref::AttentionProblem& problem, const void* Q,
                                    const void* K, const void* V, const void* O, const void* dO, const float* LSE,
                                    void* dQ, void* dK, void* dV, void* workspace, void* stream,
                                    FastBackwardKernel kernel) {
  backward_device(design, problem, Q, K, V, O, dO, LSE, dQ, dK, dV, workspace, stream, kernel, false);
}

}  // namespace flashlab::cuda

namespace flashlab::cuda::detail {

Problem check_fast_backward(ref::Algorithm design, const ref::AttentionProblem& problem, FastBackwardKernel kernel) {
  const Problem p = fast_bwd_problem(design, problem, &kernel);
  check_bwd_kernel(design, kernel);
  return p;
}

namespace {

/// The fp32 entries' shared refusal: dense problems without a window, d = 64 or 128.
void require_f32_problem(const char* entry, const ref::AttentionProblem& problem) {
  check_fast_problem(problem);
  require_d64_d128(problem.head_dim, entry);
  if (problem.is_packed() || problem.has_window())
    throw std::invalid_argument(std::string("flashlab::cuda: ") + entry +
                                ": packed sequences and windows are not supported (hint: a dense problem without a "
                                "window, as the context-parallel ring's blocks are)");
}

}  // namespace

void fast_forward_f32_device(const ref::AttentionProblem& problem, FastForwardKernel kernel, const void* Q,
                             const void* K, const void* V, float* O, float* LSE, void* stream) {
  constexpr const char* kEntry = "fp32-output forward";
  require_f32_problem(kEntry, problem);
  if (kernel != FastForwardKernel::mma_sync && kernel != FastForwardKernel::tma_ws)
    throw std::invalid_argument(std::string("flashlab::cuda: ") + kEntry + ": the " + to_string(kernel) +
                                " forward has no fp32 output (hint: the mma or tma-ws forward kernel)");
  require_wgmma_built(kernel);
  require_forward_pointers(Q, K, V, O, LSE);
  const bool bf16 = problem.dtype == ref::Dtype::bf16;
  const Problem p = make_problem(problem);
  const auto s = static_cast<cudaStream_t>(stream);
#ifdef FLASHLAB_HAVE_WGMMA
  if (kernel == FastForwardKernel::tma_ws) {
    const WsConfig c = ws_fp32_config(choose_ws_config(p, bf16, device_sms()));
    return launch_fast_tma_ws_f32(p.with_tiles(c.block_m(), c.block_n), bf16, Q, K, V, O, LSE, s);
  }
#endif
  launch_fast_mma_f32(p.with_tiles(kMmaBlockM, kMmaBlockN), bf16, Q, K, V, O, LSE, s);
}

void fast_backward_add_f32_device(const ref::AttentionProblem& problem, const void* Q, const void* K, const void* V,
                                  const void* O, const void* dO, const float* LSE, float* dQ, float* dK, float* dV,
                                  void* workspace, void* stream, FastBackwardKernel kernel) {
  require_f32_problem("fp32-sum backward", problem);
  backward_device(ref::Algorithm::bwd_atomic, problem, Q, K, V, O, dO, LSE, dQ, dK, dV, workspace, stream, kernel,
                  true);
}

}  // namespace flashlab::cuda::detail
