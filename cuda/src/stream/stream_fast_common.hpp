// The fast STREAM application's launch description and launcher (internal; stream_fast_apply.cu
// implements, the front door front_door.cpp calls). No reference headers here: nvcc compiles this
// as C++17.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace flashlab::cuda::stream::detail {

/// b_q = b_k of the fast kernels (the public kFastStreamBlock).
inline constexpr int kFastBlock = 64;

/// Everything the fast apply needs besides pointers (passed by value).
struct FastApplyLaunch {
  int T = 0;      ///< tokens
  int heads = 1;  ///< H
  int n_q = 0;    ///< ⌈T / b_q⌉ (= n_k)
  int k = 0;      ///< columns of I
};

/// SRAM bytes of one thread block: Q tiles, K/V stages and the schedule of kept blocks.
std::size_t fast_apply_smem_bytes(int head_dim, int group, int k);

/// Launches the fast apply: head_dim 64 or 128, group 1 or 2 query blocks per thread block,
/// bf16 (else fp16). Pointers are device pointers ([T, H, d] 16-bit; I [H, n_q, k] int64).
void launch_fast_apply(const FastApplyLaunch& p, int head_dim, int group, bool bf16, const void* Q, const void* K,
                       const void* V, const long long* I, void* O, cudaStream_t stream);

/// The fast apply of query blocks q_first … q_first + q_count − 1 only (a shard of the sequence),
/// one query block per thread block: Q and O hold their tokens from row 0 and I their rows
/// ([H, q_count, k]), while K and V are indexed by global token as T, q and every kept block r.
/// Each output row is bitwise launch_fast_apply's with group 1 (the same code, instantiated apart
/// so that the whole-sequence kernel stays as it was).
void launch_fast_apply_range(const FastApplyLaunch& p, int q_first, int q_count, int head_dim, bool bf16, const void* Q,
                             const void* K, const void* V, const long long* I, void* O, cudaStream_t stream);

/// One edge record of the fast trace, the C ABI's flashlab_stream_edge field for field (24 bytes):
/// query block, key block (−1 for an empty entry of I), slot in I's row, and the weights.
struct FastEdgeRecord {
  int q, r, slot;
  float score, mass, value_norm;
};

/// SRAM bytes of one fast trace thread block (K/V stages and the reduction slots).
std::size_t fast_trace_smem_bytes(int head_dim);

/// Launches the fast trace of heads head0 … head0 + head_count − 1 of Q, K, V ([T, p.heads, d]):
/// one record per entry of I ([head_count, n_q, k], row-major; edges has head_count·n_q·k records,
/// in that order), head_dim 64 or 128, bf16 (else fp16). Pointers are device pointers. Only query
/// blocks q_first … q_first + q_count − 1 are traced (q_count < 0: to the last), their records
/// written where the whole launch writes them. value_norm = false: V is not read and every
/// record's value_norm is NaN (score and mass are the same bits).
void launch_fast_trace(const FastApplyLaunch& p, int head0, int head_count, int head_dim, bool bf16, const void* Q,
                       const void* K, const void* V, const long long* I, FastEdgeRecord* edges, cudaStream_t stream,
                       int q_first = 0, int q_count = -1, bool value_norm = true);

/// stream_bench_inputs.cu: x[i] = N(0, 1) value of (seed, i); rounding 0 = none, 1 = to bf16,
/// 2 = to fp16 (the value stays a float). Default stream, asynchronous.
void fill_normal(float* x, std::size_t n, std::uint64_t seed, int rounding);
/// y[i] = scale · (the N(0, 1) value of (seed, first + i)) rounded to bf16 (else fp16), as bit
/// patterns, on `stream`, asynchronous: `first` makes a slice of a longer array (a shard of a
/// sequence) bitwise that array's elements.
void fill_normal_16bit(std::uint16_t* y, std::size_t n, std::uint64_t seed, float scale, bool bf16, cudaStream_t stream,
                       std::size_t first = 0);
/// y[i] = x[i] rounded to bf16 (else fp16), as bit patterns. Default stream, asynchronous.
void convert_to_16bit(const float* x, std::uint16_t* y, std::size_t n, bool bf16);

}  // namespace flashlab::cuda::stream::detail
