// cuda/src/core/warp_gemm.cuh — warp-level tensor-core products over swizzled 16-bit SRAM tiles, shared
// by the backward kernels that stream query tiles past resident key tiles
// (attention_bwd_tc_atomic.cu, mta_fast_bwd.cu): S = Q Kᵀ, dQ partial = dS K, dK/dV += Xᵀ B.
// Each warp holds two m16 tiles, so every B fragment read from SRAM feeds two mma.
// Internal to cuda/src; device code only.
#pragma once

#include "core/tensor_core.cuh"

#include <cstdint>

namespace flashlab::cuda::detail {
namespace {

// ----------------------------------------------------------------------------- warp-level products
// Each product runs K k-steps; a k-step loads two A fragments (two m16 tiles: 2 ldmatrix.x4) and
// NP B fragment pairs (NP ldmatrix.x4, two n8 tiles each), then issues 4·NP mma.
template <int NP>
struct Frags {
  uint32_t a[2][4];
  uint32_t b[NP][4];
};

template <int K, int NP, bool kBf16, int NT, class Load>
__device__ __forceinline__ void run_ksteps(float (&c)[2][NT][4], const Load& load) {
  static_assert(NT == 2 * NP, "two n8 tiles per B ldmatrix.x4");
#pragma unroll
  for (int kk = 0; kk < K; ++kk) {
    Frags<NP> f;
    load(kk, f);
#pragma unroll
    for (int np = 0; np < NP; ++np)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma16816<kBf16>(c[mt][2 * np], f.a[mt], f.b[np][0], f.b[np][1]);
        mma16816<kBf16>(c[mt][2 * np + 1], f.a[mt], f.b[np][2], f.b[np][3]);
      }
  }
}

/// c (32 × 8·NT, two m16 tiles × NT n8 tiles, fp32) = A Bᵀ over k = HEAD_DIM, A = rows
/// [a_row0, a_row0 + 32) of SRAM tile sA, B = rows [b_row0, b_row0 + 8·NT) of SRAM tile sB (both
/// [rows][HEAD_DIM], n-major). S = Q_i K_jᵀ and dP = dO_i V_jᵀ.
template <int HEAD_DIM, int NT, bool kBf16>
__device__ __forceinline__ void warp_gemm_abt(float (&c)[2][NT][4], uint32_t sA, int a_row0, uint32_t sB,
                                              int b_row0, int lane) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n) c[mt][n][0] = c[mt][n][1] = c[mt][n][2] = c[mt][n][3] = 0.f;
  const int mi = lane >> 3;
  run_ksteps<HEAD_DIM / 16, NT / 2, kBf16>(c, [&](int kk, Frags<NT / 2>& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      ldsm_x4(sA + swz<HEAD_DIM>(a_row0 + 16 * mt + (lane & 15), 2 * kk + (lane >> 4)), f.a[mt][0], f.a[mt][1],
              f.a[mt][2], f.a[mt][3]);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      const int row = b_row0 + 16 * np + (lane & 7) + ((mi >> 1) << 3);
      ldsm_x4(sB + swz<HEAD_DIM>(row, 2 * kk + (mi & 1)), f.b[np][0], f.b[np][1], f.b[np][2], f.b[np][3]);
    }
  });
}

/// acc (32 keys × 8·NT columns, fp32) += Xᵀ B over k = BLOCK_M query rows: X = the 16-bit SRAM
/// tile sX ([BLOCK_M][BLOCK_N], P_ij or dS_ij), its columns [key0, key0 + 32) read transposed
/// (ldmatrix.trans gives the A fragments of Xᵀ: m = keys, k = queries); B = SRAM tile sB
/// ([BLOCK_M][HEAD_DIM], k-major, dO_i or Q_i) columns [col0, col0 + 8·NT) via ldmatrix.trans.
/// dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i.
template <int HEAD_DIM, int BLOCK_M, int BLOCK_N, int NT, bool kBf16>
__device__ __forceinline__ void warp_gemm_xtb(float (&acc)[2][NT][4], uint32_t sX, int key0, uint32_t sB, int col0,
                                              int lane) {
  const int mi = lane >> 3;
  run_ksteps<BLOCK_M / 16, NT / 2, kBf16>(acc, [&](int kk, Frags<NT / 2>& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      ldsm_x4_trans(sX + swz<BLOCK_N>(16 * kk + (lane & 7) + ((mi >> 1) << 3), (key0 + 16 * mt) / 8 + (mi & 1)),
                    f.a[mt][0], f.a[mt][1], f.a[mt][2], f.a[mt][3]);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      const int row = 16 * kk + (lane & 7) + ((mi & 1) << 3);
      ldsm_x4_trans(sB + swz<HEAD_DIM>(row, col0 / 8 + 2 * np + (mi >> 1)), f.b[np][0], f.b[np][1], f.b[np][2],
                    f.b[np][3]);
    }
  });
}

/// c (32 query rows × 8·NT columns, fp32) = X B over k = BLOCK_N keys: X = rows [row0, row0 + 32)
/// of the 16-bit SRAM tile sX ([BLOCK_M][BLOCK_N], dS_ij), B = SRAM tile sB ([BLOCK_N][HEAD_DIM],
/// k-major, K_j) columns [col0, col0 + 8·NT) via ldmatrix.trans. dQ_i partial = dS_ij K_j.
template <int HEAD_DIM, int BLOCK_N, int NT, bool kBf16>
__device__ __forceinline__ void warp_gemm_xb(float (&c)[2][NT][4], uint32_t sX, int row0, uint32_t sB, int col0,
                                             int lane) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n) c[mt][n][0] = c[mt][n][1] = c[mt][n][2] = c[mt][n][3] = 0.f;
  const int mi = lane >> 3;
  run_ksteps<BLOCK_N / 16, NT / 2, kBf16>(c, [&](int kk, Frags<NT / 2>& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      ldsm_x4(sX + swz<BLOCK_N>(row0 + 16 * mt + (lane & 15), 2 * kk + (lane >> 4)), f.a[mt][0], f.a[mt][1],
              f.a[mt][2], f.a[mt][3]);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      const int row = 16 * kk + (lane & 7) + ((mi & 1) << 3);
      ldsm_x4_trans(sB + swz<HEAD_DIM>(row, col0 / 8 + 2 * np + (mi >> 1)), f.b[np][0], f.b[np][1], f.b[np][2],
                    f.b[np][3]);
    }
  });
}

}  // namespace
}  // namespace flashlab::cuda::detail
