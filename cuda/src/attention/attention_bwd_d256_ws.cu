// attention_bwd_d256_ws.cu — the atomic backward at head dim d = 256 on Hopper: wgmma for all five
// products, TMA loads from a producer warpgroup, two consumer warpgroups (the structure of
// attention_bwd_ws.cu, with the work split that d = 256 needs). Selected with
// FastBackwardKernel::wgmma_ws at d = 256; built for sm_90a alone (object library flashlab_cuda_wgmma).
//
// WHY A SPLIT OF ITS OWN. attention_bwd_ws.cu gives each consumer 64 keys of a 128-key block and
// keeps its dK_c, dV_c (64 keys × d fp32) in registers: d registers per thread, 256 at d = 256, more
// than the 240 a consumer has. Here a block owns Bc = 64 keys and the two consumers split the
// columns of d instead: consumer c holds dK_j, dV_j columns [128c, 128c + 128) of all 64 keys
// (64 + 64 registers). The products that sum over d (Sᵀ, dPᵀ) cannot be split by columns without
// adding partial sums through SRAM, so those are split by queries, and the 16-bit Pᵀ, dSᵀ of the
// whole step meet in SRAM (FlashAttention-3's hdim-256 backward splits the same way: two MMA
// warpgroups, dK/dV split along d, Br = 64, Bc = 80 there):
//   consumer c, queries [32c, 32c + 32) of Q_i, dO_i (Br = 64):
//       Sᵀ_c  = K_j Q_cᵀ,  dPᵀ_c = V_j dO_cᵀ            (m64n32, k = 256, SRAM × SRAM)
//       Pᵀ_c = 2^(Sᵀ·scale·log2 e − LSE),  dSᵀ_c = Pᵀ_c ∘ (dPᵀ_c − D)   → 16 bits → SRAM
//   the two consumers meet (named barrier): Pᵀ, dSᵀ [64 keys][64 queries] complete;
//   consumer c, columns [128c, 128c + 128) (m64n128, k = 64, SRAM × SRAM):
//       dQ_i partial = dS_ij K_j      (A: dSᵀ MN-major, B: K_j MN-major)
//       dV_j += Pᵀ dO_i,  dK_j += dSᵀ Q_i   (A: Pᵀ, dSᵀ K-major; B: dO_i, Q_i MN-major)
//   the dQ partial goes from registers into the fp32 accumulator by vector reductions
//   (red.global.add.v4.f32, 16 per thread, 2 KiB contiguous per warpgroup instruction) while dK, dV
//   still run on the tensor cores: the SRAM a staging slice would take (2 × 32 KiB) holds the second
//   stage of Q_i, dO_i instead.
// Pᵀ and dSᵀ have two buffers each (step n uses n & 1): a consumer writes buffer n & 1 after the
// meeting of step n − 1, which the other consumer reached only after waiting for all its products of
// step n − 2, the last readers of that buffer.
// Producer warpgroup (setmaxnreg 24): thread 0 loads K_j, V_j once and Q_i, dO_i per step (TMA, two
// stages), warp 1 copies LSE_i, D_i into the stage (as attention_bwd_ws.cu: full[s] waits for the
// TMA bytes and the 32 lanes; empty[s] for the 256 consumer threads). Consumers: setmaxnreg 240.
//
// MASKS AND SHAPES as attention_bwd_d256.cu: causal, and (kBand) windows, grouped K/V (the block
// loops over the G query heads of its K/V head, dK_j, dV_j summed over the group in registers) and
// N_k ≠ N through the band window_lo … window_hi; masked P = 0 selected after 2^x; TMA fills rows
// past N (N_k) with zeros, the stats warp writes LSE = D = 0 there. A block whose keys no query sees
// runs no step and writes dK_j = dV_j = 0. No fp32-sum entry (BwdPointers::add_f32: refused).
//
// DETERMINISTIC (FastBackwardKernel::wgmma_ws_deterministic; kDeterministic): the same kernel with
// dQ's sums over key blocks in a fixed order, one counter per accumulator tile (the workspace's, as
// attention_bwd_ws.cu's fixed order has them). The key blocks that see query tile i are consecutive,
// … j_last (under every mask: the keys a tile sees are an interval), and they add from j_last down:
// both consumers of block j add their partial (disjoint columns, so the two need no order between
// them) once the counter reads 2·(j_last − j), every later block's two consumers having added
// theirs. Descending because of causal: block j's first tile is its diagonal one, where it goes
// first, and at each later tile it waits only on block j + 1, one step ahead of it (ascending, block
// j would wait on j − 1 at every tile and the blocks of a head would run one after another). A
// consumer's thread 0 spins on the counter (acquire) before the adds while the others wait at a
// named barrier (a first read at the start of the step, to hide its latency, ran 4 % slower, causal
// or not: docs/cuda.md); after the adds each thread fences, the consumer meets again, thread 0 adds
// 1 (release). The grid launches key blocks in reverse (blockIdx.x = Tc − 1 − j, the lightest
// causal blocks first): block j waits only on blocks j' > j of its head, launched earlier, which
// never wait on j, so the waits close no cycle. dK_j, dV_j are sums in
// registers in a fixed order already: with dQ fixed, all three gradients are bit-reproducible. The
// adds wait in line (no step of slack as in attention_bwd_ws.cu's lagged dQ).
// SRAM (dynamic): K_j, V_j 32 KiB each; 2 stages of Q_i, dO_i (128 KiB); Pᵀ, dSᵀ two buffers of
// 8 KiB each; stats; barriers; alignment: 231,464 bytes of the 232,448 a block may have.
// REGISTERS (ptxas, sm_90a): 168 at launch (384 threads, 1 block per SM), then 24 for the producer
// and 240 for the consumers; no spills, no wgmma serialisation. Measured on the H100 and compared
// with the mma kernel: docs/cuda.md, the backward at head dim 256.
// dQaccum: TILED per (b, h, query tile i of 64 rows), 64·256 floats; consumer c's slice (columns
// [128c, +128)) is 8192 floats in wgmma fragment order (float4 number t·128 + thread = the thread's
// accumulator registers 4t … 4t + 3: rows r, r + 8, columns 8t + 2·(lane % 4), + 1); the convert
// back to [B, N, H, d] is the one both d = 256 backwards share (bwd_d256_dq.cuh, D256WsDqLayout).
#include "attention/attention_bwd_tc.cuh"
#include "attention/bwd_d256.hpp"
#include "attention/bwd_d256_dq.cuh"
#include "core/common.hpp"
#include "core/hopper.cuh"
#include "core/tensor_core.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace flashlab::cuda::detail {
namespace {

struct D256Ws {
  static constexpr int kHeadDim = 256;
  static constexpr int BLOCK_M = 64;  // Br: query rows per step
  static constexpr int BLOCK_N = 64;  // Bc: keys per block (m of every wgmma but dQ's)
  static constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers), kConsumerThreads = 128 * kConsumers;
  static constexpr int kStages = 2;
  static constexpr int kColBlocks = kHeadDim / 64;        // 64-column TMA boxes per tile
  static constexpr int kQueries = BLOCK_M / kConsumers;  // Sᵀ, dPᵀ queries per consumer
  static constexpr int kCols = kHeadDim / kConsumers;    // dK, dV, dQ columns per consumer
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static constexpr int kTileQ = BLOCK_M * kHeadDim * 2;   // Q_i or dO_i, one stage
  static constexpr int kTileKV = BLOCK_N * kHeadDim * 2;  // K_j or V_j
  static constexpr int kBoxQ = BLOCK_M * 128;             // one 64-column box of a Q_i / dO_i tile
  static constexpr int kBoxKV = BLOCK_N * 128;            // one 64-column box of K_j / V_j
  static constexpr int kTileP = BLOCK_N * BLOCK_M * 2;    // Pᵀ or dSᵀ, [key][query], 16-bit
  static constexpr int kStats = 2 * BLOCK_M * 4;          // LSE_i then D_i, one stage
  static constexpr int kOffV = kTileKV;
  static constexpr int kOffQ = 2 * kTileKV;
  static constexpr int kOffDo = kOffQ + kStages * kTileQ;
  static constexpr int kOffP = kOffDo + kStages * kTileQ;
  static constexpr int kOffDs = kOffP + 2 * kTileP;
  static constexpr int kOffStats = kOffDs + 2 * kTileP;
  static constexpr int kOffBar = kOffStats + kStages * kStats;
  static constexpr int kBarriers = 1 + 2 * kStages;  // kv_full, full[], empty[]
  static constexpr int kSmemBytes = kOffBar + 8 * kBarriers + 1024;  // + alignment to 1024
  static constexpr int kSliceDq = BLOCK_M * kCols;  // floats of one consumer's dQ partial
  static_assert(kSmemBytes <= 227 * 1024, "dynamic SRAM of one block on sm_90");
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536, "register file");
  static_assert(BLOCK_M == 64 && BLOCK_N == 64, "one 128-byte swizzle box of Pᵀ, dSᵀ per step");
  static_assert(BLOCK_N % BLOCK_M == 0, "causal: a key block's first visible query tile starts at its first key");
  static_assert(kAtomicDqTileRows % BLOCK_M == 0, "the workspace holds whole dQ tiles of this BLOCK_M");
  static_assert(BLOCK_M == kDqOrderTileRows, "the workspace has an order counter for every accumulator tile");
};

/// D[64×128] (+)= A[64×16] · B[16×128] from SRAM, B MN-major; A K-major (dV += Pᵀ dO_i, dK += dSᵀ
/// Q_i) or MN-major (kTransA: dQ_i = dS_ij K_j, A = dSᵀ stored [key][query]).
template <bool kBf16, bool kTransA>
__device__ __forceinline__ void wgmma_n128_tb(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if FLASHLAB_WGMMA_OK
  if constexpr (kTransA) FL_WGMMA_SS_T_TYPES(128, FL_D64, "%64", "%65", "%66", 1, 1, FL_ACC64(d));
  else FL_WGMMA_SS_T_TYPES(128, FL_D64, "%64", "%65", "%66", 0, 1, FL_ACC64(d));
#endif
}

/// Four fp32 adds into global memory by one vector reduction ("red", .v4.f32: sm_90).
__device__ __forceinline__ void red_add_v4(float* dst, float a, float b, float c, float d) {
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}

/// The fixed order of dQ's sums (the deterministic kernel): consumer c's thread 0 spins until the
/// tile's counter reaches `turn` (acquire), then the consumer's 128 threads go on (named barrier
/// 2 + c: their reductions come after the acquire).
__device__ __forceinline__ void wait_dq_turn(const int* counter, int turn, int c, int tid) {
  if (tid == 0) {
    int seen;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < turn);
  }
  named_bar_sync(2 + c, 128);
}
/// Every thread's reductions performed at GPU scope (fence), the consumer's threads met, then the
/// counter + 1 (release): the next block's acquire sees all 128 threads' adds.
__device__ __forceinline__ void pass_dq_turn(int* counter, int c, int tid) {
  __threadfence();
  named_bar_sync(2 + c, 128);
  if (tid == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

struct Smem {
  uint32_t base;
  __device__ uint32_t k() const { return base; }
  __device__ uint32_t v() const { return base + D256Ws::kOffV; }
  __device__ uint32_t q(int s) const { return base + D256Ws::kOffQ + uint32_t(s) * D256Ws::kTileQ; }
  __device__ uint32_t dO(int s) const { return base + D256Ws::kOffDo + uint32_t(s) * D256Ws::kTileQ; }
  __device__ uint32_t p(int n) const { return base + D256Ws::kOffP + uint32_t(n & 1) * D256Ws::kTileP; }
  __device__ uint32_t ds(int n) const { return base + D256Ws::kOffDs + uint32_t(n & 1) * D256Ws::kTileP; }
  __device__ uint32_t stats(int s) const { return base + D256Ws::kOffStats + uint32_t(s) * D256Ws::kStats; }
  __device__ uint32_t kv_full() const { return base + D256Ws::kOffBar; }
  __device__ uint32_t full(int s) const { return kv_full() + 8u * uint32_t(1 + s); }
  __device__ uint32_t empty(int s) const { return kv_full() + 8u * uint32_t(1 + D256Ws::kStages + s); }
};

/// A block's work: key tile start_n of K/V head h, batch b; query heads h0 … h0 + G − 1 (one, h,
/// unless kBand groups them), each over query tiles i_begin … i_end − 1; the band lo … hi.
struct Work {
  int start_n, h, b, h0, G, i_begin, i_end, Tr, lo, hi;
};

/// Issue the four 64-column TMA boxes of a [kRows][256] tile (rows from token row0 of head h).
template <int kRows>
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap* map, int row0, int h, int b, uint32_t bar) {
#pragma unroll
  for (int c = 0; c < D256Ws::kColBlocks; ++c) tma_load_4d(dst + uint32_t(c) * kRows * 128, map, 64 * c, h, row0, b, bar);
}

/// Grid (Tc = ceil(N_k / 64), H_kv, B) under every mask: the blocks of one head run together, so
/// its dQ accumulator (N·d fp32, 8 MiB at N = 8192) and its Q, dO stay in L2 while they add and
/// read. All heads of key block j before j + 1 (the heaviest blocks first over the whole grid)
/// spread each step over every head's tiles, more than L2 holds: measured 1.33× slower causal
/// (docs/cuda.md). Within a head the heaviest come first, but for the fixed order (the lightest
/// first: blockIdx.x = Tc − 1 − j, see DETERMINISTIC above).
/// kBand: windows, grouped K/V or N_k ≠ N, masked by the band (causal folded in); else H_kv = H,
/// N_k = N, causal by p.causal. kDeterministic: dQ's partials added in the fixed order
/// (wait_dq_turn, pass_dq_turn; dq_order: one counter per accumulator tile, zeroed); else dq_order
/// is unused.
template <bool kBf16, bool kBand, bool kDeterministic>
__global__ void __launch_bounds__(D256Ws::kThreads, 1)
    fast_bwd_d256_ws_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                            const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
                            Problem p, const float* __restrict__ LSE, const float* __restrict__ D,
                            float* __restrict__ dQaccum, int* __restrict__ dq_order, uint16_t* __restrict__ dK,
                            uint16_t* __restrict__ dV) {
#if FLASHLAB_WGMMA_OK
  using T = D256Ws;
  constexpr int BM = T::BLOCK_M, BN = T::BLOCK_N;
  extern __shared__ uint8_t smem_raw[];
  const Smem sm{(uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u};
  const int N = p.seq, Nk = kBand ? p.seq_k : N;
  Work w;
  // The fixed order adds a tile's partials from its last key block down (below): those blocks are
  // launched first, so a block only ever waits on blocks launched before it.
  const int j = kDeterministic ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  w.h = blockIdx.y;
  w.b = blockIdx.z;
  w.start_n = j * BN;
  w.G = kBand ? p.heads / p.heads_kv : 1;
  w.h0 = w.h * w.G;
  w.Tr = (N + BM - 1) / BM;
  w.i_begin = p.causal && !kBand ? w.start_n / BM : 0;
  w.i_end = w.Tr;
  w.lo = kBand ? p.window_lo() : 0;
  w.hi = kBand ? p.window_hi() : 0;
  if constexpr (kBand) {  // keys start_n … key_last are seen by queries key − hi … key − lo
    const int key_last = min(w.start_n + BN, Nk) - 1;
    const int q_first = max(0, w.start_n - w.hi), q_last = min(N - 1, key_last - w.lo);
    w.i_begin = q_first / BM;
    w.i_end = q_last < q_first ? w.i_begin : q_last / BM + 1;
  }
  const int steps = w.G * (w.i_end - w.i_begin);  // step n: query head h0 + n / tiles, tile i_begin + n % tiles
  const int tiles = w.i_end - w.i_begin;

  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    tma_prefetch_map(&map_q);
    tma_prefetch_map(&map_k);
    tma_prefetch_map(&map_v);
    tma_prefetch_map(&map_do);
    mbar_init(sm.kv_full(), 1);
    for (int s = 0; s < T::kStages; ++s) {
      mbar_init(sm.full(s), 1 + 32);  // the TMA thread's expect_tx + the stats warp's lanes
      mbar_init(sm.empty(s), T::kConsumerThreads);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer warpgroup
    regs_release<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(sm.kv_full(), 2 * T::kTileKV);
      tma_tile<BN>(sm.k(), &map_k, w.start_n, w.h, w.b, sm.kv_full());
      tma_tile<BN>(sm.v(), &map_v, w.start_n, w.h, w.b, sm.kv_full());
      for (int n = 0; n < steps; ++n) {
        const int s = n % T::kStages, hq = w.h0 + n / tiles, i = w.i_begin + n % tiles;
        if (n >= T::kStages) mbar_wait(sm.empty(s), uint32_t(n / T::kStages - 1) & 1u);
        mbar_arrive_expect_tx(sm.full(s), 2 * T::kTileQ);
        tma_tile<BM>(sm.q(s), &map_q, i * BM, hq, w.b, sm.full(s));
        tma_tile<BM>(sm.dO(s), &map_do, i * BM, hq, w.b, sm.full(s));
      }
    } else if (threadIdx.x / 32 == 1) {
      const int lane = threadIdx.x % 32;
      for (int n = 0; n < steps; ++n) {
        const int s = n % T::kStages, hq = w.h0 + n / tiles, i = w.i_begin + n % tiles;
        const std::size_t stat = p.stat_offset(w.b, hq);
        if (n >= T::kStages) mbar_wait(sm.empty(s), uint32_t(n / T::kStages - 1) & 1u);
#pragma unroll
        for (int r = lane; r < BM; r += 32) {
          const int row = i * BM + r;
          const float lse = row < N ? LSE[stat + row] : 0.f, dd = row < N ? D[stat + row] : 0.f;
          asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sm.stats(s) + 4u * uint32_t(r)), "f"(lse) : "memory");
          asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sm.stats(s) + 4u * uint32_t(BM + r)), "f"(dd) : "memory");
        }
        mbar_arrive(sm.full(s));  // release: the stores above before the phase completes
      }
    }
    return;  // every load is consumed before the consumers exit
  }

  // ---- consumer warpgroup c
  regs_claim<T::kConsumerRegs>();
  const int c = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, t4 = lane % 4;
  const int key_local = 16 * warp + lane / 4;  // this thread's key rows: key_local, + 8
  const int key_row = w.start_n + key_local, qc = T::kQueries * c;
  float acc_dv[T::kCols / 2], acc_dk[T::kCols / 2];
#pragma unroll
  for (int k = 0; k < T::kCols / 2; ++k) acc_dv[k] = acc_dk[k] = 0.f;
  mbar_wait(sm.kv_full(), 0);

  for (int n = 0; n < steps; ++n) {
    const int s = n % T::kStages, hq = w.h0 + n / tiles, i = w.i_begin + n % tiles, q0 = i * BM;
    mbar_wait(sm.full(s), uint32_t(n / T::kStages) & 1u);
    const std::size_t tile = (std::size_t(w.b) * p.heads + hq) * std::size_t(w.Tr) + std::size_t(i);
    // Deterministic: this tile's turn. The key blocks that see query tile i are consecutive (the keys
    // a tile sees are an interval), … j_last; they add from j_last down, and both consumers of block
    // j go when the 2·(j_last − j) consumers of the blocks after it have added (the two own other
    // columns: no order between them). Causal, j_last = i: each block adds first to its diagonal tile
    // and then waits only on a block one step ahead of it.
    int turn = 0;
    if constexpr (kDeterministic) {
      const int j_last = kBand ? min(Nk - 1, min(N - 1, q0 + BM - 1) + w.hi) / BN
                               : (p.causal ? i : int(gridDim.x) - 1);
      turn = 2 * (j_last - j);
    }
    // Sᵀ_c = K_j Q_cᵀ and dPᵀ_c = V_j dO_cᵀ: 16 k-steps over d (box kk / 4, k16 (kk % 4) inside it).
    float st[T::kQueries / 2], dpt[T::kQueries / 2];
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
      const uint32_t box = uint32_t(kk / 4), k32 = uint32_t(kk % 4) * 32;
      wgmma_ss_t<kBf16, T::kQueries, false, false>(st, smem_desc(sm.k() + box * T::kBoxKV + k32, 16, 1024),
                                                   smem_desc(sm.q(s) + box * T::kBoxQ + uint32_t(qc) * 128 + k32, 16, 1024),
                                                   kk > 0);
    }
    wg_commit();
#pragma unroll
    for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
      const uint32_t box = uint32_t(kk / 4), k32 = uint32_t(kk % 4) * 32;
      wgmma_ss_t<kBf16, T::kQueries, false, false>(dpt, smem_desc(sm.v() + box * T::kBoxKV + k32, 16, 1024),
                                                   smem_desc(sm.dO(s) + box * T::kBoxQ + uint32_t(qc) * 128 + k32, 16, 1024),
                                                   kk > 0);
    }
    wg_commit();
    wg_wait<1>();
    reg_fence(st);
    // Pᵀ while dPᵀ still runs. Entry 4t + 2r + e: key key_row + 8r, query q0 + qc + 8t + 2·t4 + e.
    const bool need_mask = q0 + BM > N || w.start_n + BN > Nk ||
                           (!kBand && p.causal && w.start_n + BN - 1 > q0) ||
                           (kBand && (q0 + BM - 1 + w.lo > w.start_n || w.start_n + BN - 1 > q0 + w.hi));
#pragma unroll
    for (int t = 0; t < T::kQueries / 8; ++t) {
      float2 lse;
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                   : "=f"(lse.x), "=f"(lse.y)
                   : "r"(sm.stats(s) + 4u * uint32_t(qc + 8 * t + 2 * t4)));
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int idx = 4 * t + 2 * r + e;
          float pv = ex2(fmaf(st[idx], p.scale_log2, -(e ? lse.y : lse.x)));
          if (need_mask) {  // masked: 2^x computed, then SELECTED to 0 (it may be +inf: never multiplied)
            const int query = q0 + qc + 8 * t + 2 * t4 + e, key = key_row + 8 * r;
            const bool seen = kBand ? key - query >= w.lo && key - query <= w.hi : !p.causal || key <= query;
            pv = query < N && key < Nk && seen ? pv : 0.f;
          }
          st[idx] = pv;
        }
    }
    wg_wait<0>();
    reg_fence(dpt);
    // dSᵀ = Pᵀ ∘ (dPᵀ − D_i); both rounded once to 16 bits into this step's buffers, 128-byte
    // swizzle (16-byte chunk q / 8 of key row k at chunk (q / 8) ^ (k % 8)).
    const uint32_t sP = sm.p(n), sDs = sm.ds(n);
#pragma unroll
    for (int t = 0; t < T::kQueries / 8; ++t) {
      float2 dd;
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                   : "=f"(dd.x), "=f"(dd.y)
                   : "r"(sm.stats(s) + 4u * uint32_t(BM + qc + 8 * t + 2 * t4)));
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int idx = 4 * t + 2 * r, row = key_local + 8 * r, chunk = qc / 8 + t;
        const uint32_t off = uint32_t(row) * 128 + (uint32_t(chunk ^ (row & 7)) << 4) + 4u * uint32_t(t4);
        const float ds0 = st[idx] * (dpt[idx] - dd.x), ds1 = st[idx + 1] * (dpt[idx + 1] - dd.y);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + off), "r"(pack2<kBf16>(st[idx], st[idx + 1])) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sDs + off), "r"(pack2<kBf16>(ds0, ds1)) : "memory");
      }
    }
    fence_proxy_async_shared();  // the generic-proxy stores before wgmma's (async-proxy) reads
    named_bar_sync(1, T::kConsumerThreads);  // Pᵀ, dSᵀ of both consumers complete

    // dQ_i partial, columns [128c, +128): A = dSᵀ (MN-major: 16 keys = 2048 bytes), B = K_j
    // (MN-major: boxes 2c, 2c + 1, LBO = the box stride).
    float dq[T::kCols / 2];
    const uint32_t col_kv = uint32_t(2 * c) * T::kBoxKV, col_q = uint32_t(2 * c) * T::kBoxQ;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      wgmma_n128_tb<kBf16, true>(dq, smem_desc(sDs + uint32_t(kk) * 2048, T::kBoxKV, 1024),
                                 smem_desc(sm.k() + col_kv + uint32_t(kk) * 2048, T::kBoxKV, 1024), kk > 0);
    wg_commit();
    // dV_j += Pᵀ dO_i, dK_j += dSᵀ Q_i over the 64 queries: A K-major (k16 = 32 bytes of a row),
    // B MN-major (16 rows = 2048 bytes, LBO = the box stride).
    reg_fence(acc_dv);
    reg_fence(acc_dk);
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
      wgmma_n128_tb<kBf16, false>(acc_dv, smem_desc(sP + uint32_t(kk) * 32, 16, 1024),
                                  smem_desc(sm.dO(s) + col_q + uint32_t(kk) * 2048, T::kBoxQ, 1024), 1);
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
      wgmma_n128_tb<kBf16, false>(acc_dk, smem_desc(sDs + uint32_t(kk) * 32, 16, 1024),
                                  smem_desc(sm.q(s) + col_q + uint32_t(kk) * 2048, T::kBoxQ, 1024), 1);
    wg_commit();
    wg_wait<1>();  // dQ done; dV, dK still on the tensor cores while its reductions go out
    reg_fence(dq);
    float* dst = dQaccum + tile * (BM * T::kHeadDim) + std::size_t(c) * T::kSliceDq + 4 * std::size_t(tid);
    if constexpr (kDeterministic) wait_dq_turn(dq_order + tile, turn, c, tid);
#pragma unroll
    for (int t = 0; t < T::kCols / 8; ++t) red_add_v4(dst + 512 * t, dq[4 * t], dq[4 * t + 1], dq[4 * t + 2], dq[4 * t + 3]);
    if constexpr (kDeterministic) pass_dq_turn(dq_order + tile, c, tid);
    wg_wait<0>();
    reg_fence(acc_dv);
    reg_fence(acc_dk);
    mbar_arrive(sm.empty(s));  // every thread: its reads of the stage (stats, and its wgmmas') are done
  }

  // dK_j = scale · acc_dk, dV_j = acc_dv, columns [128c, +128), rows ≥ N_k skipped.
  const std::size_t base = kBand ? p.kv_head_offset(w.b, w.h) : p.head_offset(w.b, w.h);
  const std::size_t stride = kBand ? p.kv_row_stride() : p.row_stride();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = key_row + 8 * r;
    if (row >= Nk) continue;
    uint16_t* k_out = dK + base + std::size_t(row) * stride + T::kCols * c + 2 * t4;
    uint16_t* v_out = dV + base + std::size_t(row) * stride + T::kCols * c + 2 * t4;
#pragma unroll
    for (int t = 0; t < T::kCols / 8; ++t) {
      *reinterpret_cast<uint32_t*>(k_out + 8 * t) =
          pack2<kBf16>(acc_dk[4 * t + 2 * r] * p.scale, acc_dk[4 * t + 2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(v_out + 8 * t) = pack2<kBf16>(acc_dv[4 * t + 2 * r], acc_dv[4 * t + 2 * r + 1]);
    }
  }
#else
  __trap();  // built without sm_90a: never launched
#endif
}

/// The accumulator's tiled order above, for the shared convert (bwd_d256_dq.cuh): tile (b, h, i)
/// holds 64·256 floats, consumer slice c 8192 of them; float4 number t·128 + thread of slice c holds
/// rows 16·(thread / 32) + (thread % 32) / 4, + 8 and columns 128c + 8t + 2·(thread % 4), + 1.
struct D256WsDqLayout {
  static constexpr int BLOCK_M = D256Ws::BLOCK_M;
  static constexpr int kHeadDim = D256Ws::kHeadDim;
  __device__ static void place(int f, int& row, int& col) {
    constexpr int kSlice4 = D256Ws::kSliceDq / 4;
    const int c = f / kSlice4, t = f % kSlice4 / 128, thr = f % 128;
    row = 16 * (thr / 32) + (thr % 32) / 4;
    col = D256Ws::kCols * c + 8 * t + 2 * (thr % 4);
  }
};

template <bool kBf16>
void launch_d256_ws(const Problem& p, const BwdPointers& a, int* dq_order, cudaStream_t stream) {
  using T = D256Ws;
  if (a.add_f32) throw_cuda_error(cudaErrorInvalidValue, "d = 256 wgmma-ws backward: no fp32 sums", __FILE__, __LINE__);
  const bool band = p.windowed() || p.heads_kv != p.heads || p.seq_k != p.seq;
  const bool det = dq_order != nullptr;
  auto kernel = band ? (det ? &fast_bwd_d256_ws_kernel<kBf16, true, true> : &fast_bwd_d256_ws_kernel<kBf16, true, false>)
                     : (det ? &fast_bwd_d256_ws_kernel<kBf16, false, true> : &fast_bwd_d256_ws_kernel<kBf16, false, false>);
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmemBytes, "fast_bwd_d256_ws_kernel", p);
  begin_d256_backward<D256WsDqLayout, kBf16>(p, a, stream);
  if (det)  // every tile's order starts at turn 0
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(
        dq_order, 0, d256_dq_accum_numel<D256WsDqLayout>(p) / (T::BLOCK_M * T::kHeadDim) * sizeof(int), stream));

  const CUtensorMap map_q = make_head_tile_map(a.Q, p, T::BLOCK_M);
  const CUtensorMap map_do = make_head_tile_map(a.dO, p, T::BLOCK_M);
  const CUtensorMap map_k = make_kv_tile_map(a.K, p, T::BLOCK_N);
  const CUtensorMap map_v = make_kv_tile_map(a.V, p, T::BLOCK_N);
  const unsigned tc = unsigned((p.seq_k + T::BLOCK_N - 1) / T::BLOCK_N);
  // Causal too: one head's key blocks, the heaviest (small j) first (see the grid's comment above).
  const dim3 grid(tc, p.heads_kv, p.batch);
  announce("fast_bwd_d256_ws_kernel");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(map_q, map_k, map_v, map_do, p.with_tiles(T::BLOCK_M, T::BLOCK_N),
                                                      a.LSE, a.D, a.dQaccum, dq_order, static_cast<uint16_t*>(a.dK),
                                                      static_cast<uint16_t*>(a.dV));
  FLASHLAB_CUDA_CHECK_LAUNCH("fast_bwd_d256_ws_kernel");

  launch_d256_dq_convert<D256WsDqLayout, kBf16>(p, a, stream);
}

}  // namespace

void launch_fast_bwd_d256_ws(const Problem& p, bool bf16, const BwdPointers& a, int* dq_order, cudaStream_t stream) {
  if (bf16) launch_d256_ws<true>(p, a, dq_order, stream);
  else launch_d256_ws<false>(p, a, dq_order, stream);
}

}  // namespace flashlab::cuda::detail
