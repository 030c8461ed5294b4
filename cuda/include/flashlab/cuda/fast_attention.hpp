/// @file fast_attention.hpp
/// @brief Host API of the fast tensor-core attention forward (issue 7, first step): bf16 or fp16
/// inputs, fp32 accumulation, `mma.sync` m16n8k16 or (FastForwardKernel::wgmma, sm_90a) Hopper's
/// `wgmma.mma_async`. No CUDA types here: 16-bit values travel as
/// `uint16_t` storage (their bit patterns), so CPU-only code may include this header.
///
/// Layout as the clear kernels: Q, K, V, O are `[B, N, H, d]` row-major; LSE is `[B, H, N]` fp32,
/// base 2 of the base-2 scores (seed 001): LSE_i = m_i + log2(l_i) with scores S·scale·log2(e).
/// Head dims 64 and 128 only; any N ≥ 1; causal (key j visible to query i iff j ≤ i) or not.
///
/// Backward, two designs (FastBackwardDesign): two_kernel (D preprocessing, dQ kernel, dK/dV
/// kernel: cuda/src/attention_bwd_tc.cu) and atomic (D preprocessing, one kernel over K_j/V_j
/// blocks with dQ accumulated in fp32 by atomics, dQ conversion: cuda/src/attention_bwd_tc_atomic.cu).
/// fast_attention_backward() takes Q, K, V, O, dO and the forward's LSE and returns dQ, dK, dV in
/// the same dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flashlab::cuda {

/// Storage type of the 16-bit inputs and output.
enum class FastDtype {
  bf16,  ///< bfloat16 (8 exponent bits, 7 mantissa bits)
  fp16   ///< IEEE binary16 (5 exponent bits, 10 mantissa bits)
};

/// Which fast forward kernel runs (issue 7). Both compute the same O and LSE (same algorithm,
/// tiles aside) from the same inputs.
enum class FastForwardKernel {
  /// `mma.sync` m16n8k16 (cuda/src/attention_fwd_tc.cu): the default, sm_90 build.
  mma_sync,
  /// Hopper's warpgroup MMA, `wgmma.mma_async` (cuda/src/attention_fwd_wgmma.cu): compiled for
  /// sm_90a, so it runs on compute capability 9.0 GPUs only (H100/H200), and only in builds whose
  /// CMAKE_CUDA_ARCHITECTURES include 90 (fast_forward_wgmma_built()).
  wgmma
};

/// "mma" or "wgmma" (the names the `flashlab bench attention --fwd-kernel` flag takes).
const char* to_string(FastForwardKernel kernel);

/// Whether this build contains the wgmma forward (CMAKE_CUDA_ARCHITECTURES included 90).
bool fast_forward_wgmma_built();

/// Shape and options of one fast forward call.
struct FastForwardConfig {
  int batch = 1;                   ///< B
  int seq = 0;                     ///< N (SEQ), any value ≥ 1
  int heads = 1;                   ///< H (HEAD_NUM)
  int head_dim = 64;               ///< d (HEAD_DIM): 64 or 128
  bool causal = false;             ///< causal mask: query i sees keys j ≤ i
  double scale = 0.0;              ///< softmax scale; 0 means 1/sqrt(HEAD_DIM)
  FastDtype dtype = FastDtype::bf16;  ///< storage type of Q, K, V and O
  FastForwardKernel kernel = FastForwardKernel::mma_sync;  ///< forward kernel (ignored by the backward)
};

/// Results of a fast forward pass copied back to the host.
struct FastForwardResult {
  std::vector<std::uint16_t> O;  ///< output, [B, N, H, d], bit patterns of `dtype`
  std::vector<float> LSE;        ///< base-2 log-sum-exp, [B, H, N]
};

/// Tile sizes the fast kernel uses for `head_dim` (fixed at compile time): BLOCK_M, BLOCK_N.
struct FastTiles {
  int block_m;  ///< BLOCK_M = Br, query rows per thread block
  int block_n;  ///< BLOCK_N = Bc, key rows per pipeline stage
};

/// The tiles of the fast forward `kernel` for `head_dim`; throws std::invalid_argument for
/// d ∉ {64, 128}.
FastTiles fast_forward_tiles(int head_dim, FastForwardKernel kernel = FastForwardKernel::mma_sync);

/// Uploads Q, K, V (each `[B, N, H, d]` as 16-bit bit patterns), poisons O and LSE with NaN,
/// runs the fast forward, checks every CUDA call and downloads O and LSE. Throws
/// std::invalid_argument for a bad shape or size, CudaError for a CUDA failure.
FastForwardResult fast_attention_forward(const FastForwardConfig& cfg, const std::vector<std::uint16_t>& Q,
                                         const std::vector<std::uint16_t>& K,
                                         const std::vector<std::uint16_t>& V);

/// Launches the fast forward on device pointers (no copies, no synchronisation) on `stream`
/// (a cudaStream_t passed as void*; nullptr is the default stream). For benchmarks. Throws
/// std::invalid_argument for a bad shape, CudaError if the launch fails.
void fast_attention_forward_device(const FastForwardConfig& cfg, const void* Q, const void* K, const void* V,
                                   void* O, float* LSE, void* stream = nullptr);

/// Which fast backward runs (issue 7). Both compute the same gradients from the same inputs.
enum class FastBackwardDesign {
  /// D preprocessing, a dQ kernel (one block per Q_i) and a dK/dV kernel (one block per K_j):
  /// no atomics, bit-reproducible, but S and dP are recomputed in both kernels (14·N²·d FLOPs of
  /// products). Workspace: D only.
  two_kernel,
  /// D preprocessing, one kernel per K_j/V_j block looping over Q_i that adds dQ_i's partial sums
  /// into an fp32 accumulator with atomics (FlashAttention-2's design; 10·N²·d FLOPs), then a
  /// conversion dQ = scale · accumulator. Workspace: D and the B·N·H·d fp32 accumulator. The
  /// fp32 summation order of dQ varies run to run (not bit-reproducible).
  atomic
};

/// Shape and options of one fast backward call: the forward's fields (the configuration of the
/// forward whose O and LSE the backward consumes) plus the design. A FastBackwardConfig may be
/// passed wherever a FastForwardConfig is expected.
struct FastBackwardConfig : FastForwardConfig {
  FastBackwardDesign design = FastBackwardDesign::atomic;  ///< which backward runs (default: the faster, atomic)
};

/// "two-kernel" or "atomic" (the names the `flashlab bench attention --bwd-design` flag takes).
const char* to_string(FastBackwardDesign design);

/// Gradients of a fast backward pass copied back to the host (loss L = Σ O∘dO).
struct FastBackwardResult {
  std::vector<std::uint16_t> dQ;  ///< ∂L/∂Q, [B, N, H, d], bit patterns of `dtype`
  std::vector<std::uint16_t> dK;  ///< ∂L/∂K, [B, N, H, d], bit patterns of `dtype`
  std::vector<std::uint16_t> dV;  ///< ∂L/∂V, [B, N, H, d], bit patterns of `dtype`
  std::vector<float> D;           ///< D_i = rowsum(dO_i ∘ O_i) in fp32, [B, H, N]
};

/// Fast backward of design `cfg.design`: uploads Q, K, V, O, dO (each `[B, N, H, d]`, 16-bit bit
/// patterns) and the forward's base-2 LSE (`[B, H, N]`), poisons the outputs and the workspace
/// with NaN, runs the design's kernels, checks every CUDA call and downloads dQ, dK, dV and D.
/// Throws std::invalid_argument for a bad shape or size, CudaError for a CUDA failure.
FastBackwardResult fast_attention_backward(const FastBackwardConfig& cfg, const std::vector<std::uint16_t>& Q,
                                           const std::vector<std::uint16_t>& K, const std::vector<std::uint16_t>& V,
                                           const std::vector<std::uint16_t>& O, const std::vector<std::uint16_t>& dO,
                                           const std::vector<float>& LSE);

/// Bytes of device scratch fast_attention_backward_device() needs for `cfg` (its design and
/// shape): D (fp32, B·H·N) at offset 0, then, for the atomic design, the fp32 dQ accumulator
/// (B·H·⌈N/128⌉·128·d floats: whole query tiles) at the next multiple of 256 bytes. Throws
/// std::invalid_argument for a bad shape.
std::size_t fast_attention_backward_workspace_bytes(const FastBackwardConfig& cfg);

/// Launches the fast backward of design `cfg.design` on device pointers, no copies, no
/// allocation, no synchronisation, on `stream` (a cudaStream_t passed as void*; nullptr is the
/// default stream). `workspace` is device memory of at least
/// fast_attention_backward_workspace_bytes(cfg) bytes, 256-byte aligned (cudaMalloc's pointers
/// are); on return its first B·H·N floats hold D = rowsum(dO ∘ O) ([B, H, N]). Throws
/// std::invalid_argument for a bad shape or a null workspace, CudaError if a launch fails.
void fast_attention_backward_device(const FastBackwardConfig& cfg, const void* Q, const void* K, const void* V,
                                    const void* O, const void* dO, const float* LSE, void* dQ, void* dK, void* dV,
                                    void* workspace, void* stream = nullptr);

/// Median time in milliseconds of `reps` fast backward passes of design `cfg.design` (after two
/// warm-up passes; workspace allocated once, outside the timed range) on
/// device 0, each timed with a pair of CUDA events, L2 flushed by a 256 MiB memset before each;
/// inputs are a fixed pseudo-random pattern. Throws std::invalid_argument for reps < 1 or a bad
/// shape, CudaError for a CUDA failure.
double fast_attention_backward_time_ms(const FastBackwardConfig& cfg, int reps);

/// Rounds a float to the nearest bfloat16 (ties to even) and returns its bit pattern.
std::uint16_t float_to_bf16(float x);
/// The float value of a bfloat16 bit pattern (exact).
float bf16_to_float(std::uint16_t bits);
/// Rounds a float to the nearest IEEE binary16 (ties to even) and returns its bit pattern.
std::uint16_t float_to_fp16(float x);
/// The float value of a binary16 bit pattern (exact).
float fp16_to_float(std::uint16_t bits);

}  // namespace flashlab::cuda
