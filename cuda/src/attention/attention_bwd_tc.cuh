// cuda/src/attention/attention_bwd_tc.cuh — pieces shared by the two fast tensor-core backward designs:
// attention_bwd_tc.cu (two kernels: dQ kernel, dK/dV kernel) and
// attention_bwd_tc_atomic.cu (one kernel over K_j/V_j blocks, dQ accumulated in fp32 by bulk
// asynchronous reductions in L2), the Hopper version of the latter, attention_bwd_ws.cu, the two
// backwards at d = 256 (through bwd_d256_dq.cuh) and the MTA backward (D alone).
// The Triton walkthrough, "Backward Pass": D_i = rowsum(dO_i ∘ O_i) is computed once, before either
// design; every design that adds dQ into an fp32 accumulator converts it with dq_convert_kernel.
// Internal to cuda/src. The device helpers and the kernels sit in an unnamed namespace (each
// translation unit gets its own copy, as they had before being shared); the host-side declarations
// are in detail proper.
#pragma once

#include "attention/launchers.hpp"
#include "attention/packed.cuh"
#include "core/common.hpp"
#include "core/tensor_core.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace flashlab::cuda::detail {

// BwdPointers, the workspace constants and the launchers are declared in launchers.hpp.

namespace {

/// Two 16-bit values in one register → two floats (exact).
template <bool kBf16>
__device__ __forceinline__ float2 unpack2(uint32_t r) {
  if constexpr (kBf16) {
    __nv_bfloat162 v;
    memcpy(&v, &r, 4);
    return __bfloat1622float2(v);
  } else {
    __half2 v;
    memcpy(&v, &r, 4);
    return __half22float2(v);
  }
}

/// Issue cp.async for rows [row0, row0 + ROWS) of one head into a swizzled SRAM tile
/// ([ROWS][HEAD_DIM], 16-bit), THREADS threads sharing the 16-byte chunks; rows ≥ N are
/// zero-filled (src-size 0), so no stale SRAM ever reaches an mma.
template <int HEAD_DIM, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const uint16_t* head, std::size_t stride, int row0,
                                                int N) {
  constexpr int kChunks = HEAD_DIM / 8;
  static_assert(ROWS * kChunks % THREADS == 0, "tile chunks must divide among the threads");
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / THREADS; ++it) {
    const int idx = int(threadIdx.x) + it * THREADS;
    const int r = idx / kChunks, c = idx % kChunks;
    const int row = row0 + r;
    const bool ok = row < N;
    const uint16_t* src = head + std::size_t(ok ? row : 0) * stride + c * 8;
    cp_async16(smem + swz<HEAD_DIM>(r, c), src, ok);
  }
}

/// Rows r and r + 8 of a warp's 16 × 8·NT fp32 accumulator (mma C fragments), times `scale`,
/// registers → HBM in the input dtype (4-byte stores) at out_head[row][0 .. 8·NT) (out_head
/// already points at the first column); rows ≥ N are not written.
template <int NT, bool kBf16>
__device__ __forceinline__ void store_rows16(uint16_t* out_head, std::size_t stride, int warp_row0, int N,
                                             const float (&acc)[NT][4], float scale, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp_row0 + g + 8 * r;
    if (row < N) {
      uint16_t* out = out_head + std::size_t(row) * stride + 2 * t;
#pragma unroll
      for (int n = 0; n < NT; ++n)
        *reinterpret_cast<uint32_t*>(out + 8 * n) =
            pack2<kBf16>(acc[n][2 * r] * scale, acc[n][2 * r + 1] * scale);
    }
  }
}

/// D preprocessing (the Triton walkthrough, "Backward Pass"): D_i = rowsum(dO_i ∘ O_i) in fp32,
/// into D [B, H, N] (LSE's layout). O and dO are [B, N, H, d]: row R = (b·N + n)·H + h starts at
/// element R·d, so the rows are taken in that memory order, d / 8 lanes per row each reading 16
/// bytes of O and of dO (a warp reads whole 128-byte lines), kPreprocessUnroll rows per thread in
/// flight before any sum, the lanes of a row summed by shuffles. With `zero4` > 0 the same launch
/// also writes zeros into the zero4 float4s at `zero` (the atomic designs' fp32 dQ accumulator,
/// only ever added into): its writes go out beside the reads of O and dO, with one launch fewer.
/// HBM traffic: O and dO read once, D written once (and the zeros).
constexpr int kPreprocessThreads = 256;
constexpr int kPreprocessUnroll = 4;
template <int HEAD_DIM, bool kBf16>
__global__ void __launch_bounds__(kPreprocessThreads)
    fast_bwd_preprocess_kernel(Problem p, const uint16_t* __restrict__ O, const uint16_t* __restrict__ dO,
                               float* __restrict__ D, float4* __restrict__ zero, std::size_t zero4) {
  constexpr int kLanes = HEAD_DIM / 8;  // lanes per row, 16 bytes each
  static_assert(HEAD_DIM % 8 == 0 && 32 % kLanes == 0, "a row's lanes must tile a warp");
  constexpr int kRowsPerPass = kPreprocessThreads / kLanes;
  const std::size_t threads = std::size_t(gridDim.x) * kPreprocessThreads;
  for (std::size_t k = blockIdx.x * std::size_t(kPreprocessThreads) + threadIdx.x; k < zero4; k += threads)
    zero[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  const std::size_t rows = std::size_t(p.batch) * p.seq * p.heads;
  const int lane = int(threadIdx.x) % kLanes;
  // The block's first row of each pass is the same for all its threads, so every warp runs the
  // loop (and its shuffles) the same number of times; rows past the end sum nothing.
  for (std::size_t first = std::size_t(blockIdx.x) * kRowsPerPass * kPreprocessUnroll; first < rows;
       first += std::size_t(gridDim.x) * kRowsPerPass * kPreprocessUnroll) {
    uint4 o[kPreprocessUnroll], g[kPreprocessUnroll];
#pragma unroll
    for (int u = 0; u < kPreprocessUnroll; ++u) {
      const std::size_t row = first + std::size_t(u) * kRowsPerPass + threadIdx.x / kLanes;
      o[u] = g[u] = make_uint4(0u, 0u, 0u, 0u);
      if (row < rows) {
        o[u] = *reinterpret_cast<const uint4*>(O + row * HEAD_DIM + 8 * lane);
        g[u] = *reinterpret_cast<const uint4*>(dO + row * HEAD_DIM + 8 * lane);
      }
    }
#pragma unroll
    for (int u = 0; u < kPreprocessUnroll; ++u) {
      const uint32_t ow[4] = {o[u].x, o[u].y, o[u].z, o[u].w}, gw[4] = {g[u].x, g[u].y, g[u].z, g[u].w};
      float sum = 0.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = unpack2<kBf16>(ow[e]), b = unpack2<kBf16>(gw[e]);
        sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
      }
#pragma unroll
      for (int off = kLanes / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      const std::size_t row = first + std::size_t(u) * kRowsPerPass + threadIdx.x / kLanes;
      if (lane == 0 && row < rows) {
        const std::size_t h = row % std::size_t(p.heads), token = row / std::size_t(p.heads);
        const std::size_t n = token % std::size_t(p.seq), b = token / std::size_t(p.seq);
        D[(b * std::size_t(p.heads) + h) * std::size_t(p.seq) + n] = sum;
      }
    }
  }
}

/// Host side: launch the preprocess kernel (announced and checked); with `zero` and `zero_floats`
/// (a multiple of 4, 16-byte aligned) it also zeroes those floats.
template <int HEAD_DIM, bool kBf16>
void launch_fast_bwd_preprocess(const Problem& p, const BwdPointers& a, cudaStream_t stream, float* zero = nullptr,
                                std::size_t zero_floats = 0) {
  const std::size_t rows = std::size_t(p.batch) * p.seq * p.heads;
  constexpr std::size_t kRowsPerBlock = std::size_t(kPreprocessThreads) / (HEAD_DIM / 8) * kPreprocessUnroll;
  // One pass per block where that is a grid of at most 2^20 blocks, else a grid-stride loop; at least
  // enough blocks that the zeros take 16 float4s a thread or fewer.
  const std::size_t for_rows = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const std::size_t for_zeros = (zero_floats / 4 + 16 * kPreprocessThreads - 1) / (16 * kPreprocessThreads);
  const std::size_t wanted = std::max<std::size_t>(1, std::max(for_rows, for_zeros));
  const unsigned blocks = unsigned(std::min<std::size_t>(wanted, 1u << 20));
  announce("fast_bwd_preprocess_kernel");
  fast_bwd_preprocess_kernel<HEAD_DIM, kBf16><<<blocks, kPreprocessThreads, 0, stream>>>(
      p, static_cast<const uint16_t*>(a.O), static_cast<const uint16_t*>(a.dO), a.D, reinterpret_cast<float4*>(zero),
      zero_floats / 4);
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_bwd_preprocess_kernel");
}

/// The dQ convert of the atomic designs (attention_bwd_tc_atomic.cu, attention_bwd_ws.cu and the
/// two at d = 256, bwd_d256_dq.cuh): each adds its dQ partials into an fp32 accumulator TILED per
/// (b, h, query tile i) (packed: per (h, tile of the packed numbering)), BLOCK_M × d floats in the
/// fragment order of its own warps, which a Layout gives:
///   Layout::BLOCK_M, Layout::kHeadDim            the tile's query rows and columns;
///   Layout::place(k, row, col) (device)         float4 number k of a tile holds the elements
///                                               (row, col), (row, col + 1), (row + 8, col),
///                                               (row + 8, col + 1), row counted in the tile.
/// One tile per block of kDqConvertThreads and pass, staged in SRAM as rows (a pitch of d + 8
/// floats: the 8-byte writes of a half-warp, rows four apart by 8 banks, meet no conflict), so both
/// sides of HBM are whole lines: the tile read as float4s in its fragment order, dQ written 16
/// bytes (8 columns) a thread, a row's threads side by side. Read straight from the fragments, each
/// 4 lanes wrote 16 bytes of a row, half a sector, and the index arithmetic ran per float4.
constexpr int kDqConvertThreads = 256;
template <class Layout>
struct DqConvertTile {
  static constexpr int kPitch = Layout::kHeadDim + 8;
  static constexpr int kTile4 = Layout::BLOCK_M * Layout::kHeadDim / 4;
  static constexpr int kChunks = Layout::kHeadDim / 8;  // 16-byte chunks of a 16-bit dQ row
  static constexpr int kSmemBytes = Layout::BLOCK_M * kPitch * 4;
  /// Tile `tile` of the accumulator → `rows` (every thread of the block; ends with a barrier).
  __device__ static void stage(float* rows, const float4* __restrict__ acc, std::size_t tile) {
    const float4* src = acc + tile * kTile4;
    for (int k = int(threadIdx.x); k < kTile4; k += kDqConvertThreads) {
      int row = 0, col = 0;
      Layout::place(k, row, col);
      const float4 v = src[k];
      *reinterpret_cast<float2*>(rows + row * kPitch + col) = make_float2(v.x, v.y);
      *reinterpret_cast<float2*>(rows + (row + 8) * kPitch + col) = make_float2(v.z, v.w);
    }
    __syncthreads();
  }
  /// Eight floats of a staged row, times `scale`.
  __device__ static void read8(const float* rows, int row, int chunk, float scale, float (&x)[8]) {
    const float4 a = *reinterpret_cast<const float4*>(rows + row * kPitch + 8 * chunk);
    const float4 b = *reinterpret_cast<const float4*>(rows + row * kPitch + 8 * chunk + 4);
    x[0] = a.x * scale, x[1] = a.y * scale, x[2] = a.z * scale, x[3] = a.w * scale;
    x[4] = b.x * scale, x[5] = b.y * scale, x[6] = b.z * scale, x[7] = b.w * scale;
  }
};

/// Eight floats → eight 16-bit values, one 16-byte store.
template <bool kBf16>
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  return make_uint4(pack2<kBf16>(x[0], x[1]), pack2<kBf16>(x[2], x[3]), pack2<kBf16>(x[4], x[5]),
                    pack2<kBf16>(x[6], x[7]));
}

/// dQ = scale · accumulator → 16 bits, [B, N, H, d]; rows ≥ N (the last tile's padding) are not
/// written. kAddF32: dQ is an fp32 sum [B, N, H, d] that scale · accumulator is added into,
/// unrounded (BwdPointers::add_f32; each element is one thread's, the ring's calls run in turn).
template <class Layout, bool kBf16, bool kAddF32>
__global__ void __launch_bounds__(kDqConvertThreads)
    dq_convert_kernel(Problem p, const float4* __restrict__ acc, void* __restrict__ dQ, int tiles) {
  using C = DqConvertTile<Layout>;
  extern __shared__ __align__(16) float dq_rows[];
  const int Tr = (p.seq + Layout::BLOCK_M - 1) / Layout::BLOCK_M;
  for (int tile = int(blockIdx.x); tile < tiles; tile += int(gridDim.x)) {
    C::stage(dq_rows, acc, std::size_t(tile));
    const int i = tile % Tr, h = tile / Tr % p.heads, b = tile / Tr / p.heads;
    for (int e = int(threadIdx.x); e < Layout::BLOCK_M * C::kChunks; e += kDqConvertThreads) {
      const int row = e / C::kChunks, chunk = e % C::kChunks, n = i * Layout::BLOCK_M + row;
      if (n >= p.seq) break;  // e grows with the row
      float x[8];
      C::read8(dq_rows, row, chunk, p.scale, x);
      const std::size_t at = p.head_offset(b, h) + std::size_t(n) * p.row_stride() + 8 * chunk;
      if constexpr (kAddF32) {
        float4* out = reinterpret_cast<float4*>(static_cast<float*>(dQ) + at);
        float4 s0 = out[0], s1 = out[1];
        s0.x += x[0], s0.y += x[1], s0.z += x[2], s0.w += x[3];
        s1.x += x[4], s1.y += x[5], s1.z += x[6], s1.w += x[7];
        out[0] = s0, out[1] = s1;
      } else {
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(dQ) + at) = pack8<kBf16>(x);
      }
    }
    __syncthreads();  // the next pass stages over these rows
  }
}

/// dq_convert_kernel over packed sequences: Tq = Problem::packed_tiles(BLOCK_M) tiles per head in
/// the packed query numbering (packed.cuh), head-major; a tile's rows map to its sequence's rows
/// of dQ [1, total_q, H, d], and rows past the sequence's end (its last tile's padding, a tile past
/// its end) are not written.
template <class Layout, bool kBf16>
__global__ void __launch_bounds__(kDqConvertThreads)
    dq_convert_packed_kernel(Problem p, const float4* __restrict__ acc, uint16_t* __restrict__ dQ, int tiles,
                             PackedLists lists) {
  using C = DqConvertTile<Layout>;
  extern __shared__ __align__(16) float dq_rows[];
  const int Tq = p.packed_tiles(Layout::BLOCK_M);
  for (int tile = int(blockIdx.x); tile < tiles; tile += int(gridDim.x)) {
    const PackedTile pt = packed_tile(p, lists, tile % Tq, Layout::BLOCK_M);
    if (pt.row0 >= pt.len_q) continue;  // past its sequence's end (the same for the whole block)
    C::stage(dq_rows, acc, std::size_t(tile));
    const std::size_t head = std::size_t(tile / Tq) * Layout::kHeadDim;
    for (int e = int(threadIdx.x); e < Layout::BLOCK_M * C::kChunks; e += kDqConvertThreads) {
      const int row = e / C::kChunks, chunk = e % C::kChunks;
      if (pt.row0 + row >= pt.len_q) break;  // e grows with the row
      float x[8];
      C::read8(dq_rows, row, chunk, p.scale, x);
      *reinterpret_cast<uint4*>(dQ + std::size_t(pt.q_start + pt.row0 + row) * p.row_stride() + head + 8 * chunk) =
          pack8<kBf16>(x);
    }
    __syncthreads();  // the next pass stages over these rows
  }
}

/// Host side: the convert over the whole accumulator a.dQaccum → a.dQ (packed with `lists`;
/// a.add_f32: added into the fp32 sum), announced and checked.
template <class Layout, bool kBf16>
void launch_dq_convert(const Problem& p, const BwdPointers& a, cudaStream_t stream,
                       const PackedLists* lists = nullptr) {
  using C = DqConvertTile<Layout>;
  const std::size_t tiles = p.packed() ? std::size_t(p.heads) * std::size_t(p.packed_tiles(Layout::BLOCK_M))
                                       : std::size_t(p.batch) * p.heads *
                                             std::size_t((p.seq + Layout::BLOCK_M - 1) / Layout::BLOCK_M);
  if (tiles > std::size_t(INT32_MAX))
    throw_cuda_error(cudaErrorInvalidValue, "dQ convert: more than 2^31 − 1 accumulator tiles", __FILE__, __LINE__);
  const unsigned blocks = unsigned(std::min<std::size_t>(tiles, 1u << 20));
  const auto* base = reinterpret_cast<const float4*>(a.dQaccum);
  if (p.packed()) {
    if (lists == nullptr || a.add_f32)
      throw_cuda_error(cudaErrorInvalidValue,
                       "dQ convert of packed sequences: needs their prefix sums, takes no fp32 sums", __FILE__,
                       __LINE__);
    auto kernel = &dq_convert_packed_kernel<Layout, kBf16>;
    set_smem(reinterpret_cast<const void*>(kernel), C::kSmemBytes, "dq_convert_packed_kernel", p);
    announce("dq_convert_packed_kernel");
    kernel<<<blocks, kDqConvertThreads, C::kSmemBytes, stream>>>(p, base, static_cast<uint16_t*>(a.dQ), int(tiles),
                                                                 *lists);
    FLASHLAB_CUDA_CHECK_LAUNCH("dq_convert_packed_kernel");
    return;
  }
  auto kernel = a.add_f32 ? &dq_convert_kernel<Layout, kBf16, true> : &dq_convert_kernel<Layout, kBf16, false>;
  set_smem(reinterpret_cast<const void*>(kernel), C::kSmemBytes, "dq_convert_kernel", p);
  announce("dq_convert_kernel");
  kernel<<<blocks, kDqConvertThreads, C::kSmemBytes, stream>>>(p, base, a.dQ, int(tiles));
  FLASHLAB_CUDA_CHECK_LAUNCH("dq_convert_kernel");
}

}  // namespace
}  // namespace flashlab::cuda::detail
