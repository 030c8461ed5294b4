// mta_fast_decode.cu — split-K Multi-Token Attention decode of the last 16 query rows, bf16/fp16,
// tensor cores for Q Kᵀ and P V, the convolution on chip (the reference's flash_infer, for 16
// output rows instead of one: 16 rows is one m16 tile, so the other 15 cost nothing extra).
//
//   1. mta_fast_decode_split_kernel   grid (splits, H, B), 128 threads: one range of key tiles
//   2. mta_fast_decode_combine_kernel grid (H, B): O = Σ_s 2^(m_s − M) O_s / Σ_s 2^(m_s − M) ℓ_s,
//      LSE = M + log2 Σ_s 2^(m_s − M) ℓ_s (base 2)
//
// QUERY TILE. Ŝ of the last 16 rows reads S up to Pq ≤ 15 rows above them, so each block loads the
// 32 rows N − 32 … N − 1 once (rows above token 0 zero-filled) and computes S on all 32; Ŝ, P and
// O only on the last 16 (tile rows 16 … 31).
// KEY TILES. Bc = kDecodeBlockN = 64 effective keys per tile, whatever the kernel: tile t owns
// keys [t·Bc, (t + 1)·Bc) and loads 80 from J_s = t·Bc − 8 (a fixed halo of 8 ≥ Pk keys each
// side; keys outside [0, N) zero-filled), so the convolution computes exactly the 64 owned
// columns (with a halo of Pk the 128 threads' 64 columns would hold only 64 − 2Pk owned ones:
// 16 % of the convolution wasted at ck = 11). Split s owns tiles [s·T_k, (s + 1)·T_k) ∩ [0, Tc);
// the host picks T_k so that no split is empty.
// ONE TILE: K_j, V_j were copied by cp.async during the previous tile (two stages).
//   a. S = scale · Q K_jᵀ (32 × 80, causal zeros) → SRAM fp32;
//   b. Ŝ on the last 16 rows × 64 owned keys, masked to −∞ in the future (and so past N), base 2;
//      for 3 × 3, 6 × 11 and 11 × 11 the kernel is compiled with the size fixed:
//      weights in registers, loops unrolled, 4 rows × 2 keys per thread sliding down a window read
//      as float2; any other size through a general strip of 8 rows × 1 key (W in SRAM);
//   c. online softmax per row: m_new, α = 2^(m − m_new), P = 2^(Ŝ − m_new) rounded to 16 bits →
//      SRAM, ℓ ← αℓ + Σ P (a row with nothing visible yet keeps m = −∞ and P = 0: no −∞ − (−∞));
//      the fixed sizes straight from the convolution's registers (a warp holds 4 whole rows), the
//      general one from Ŝ in SRAM after a barrier (8 threads per row);
//   d. O ← α O + P V_j (the 64 owned keys) in registers (4 warps × d/4 columns of the 16 rows).
// The split writes its unnormalised O_s, m_s and ℓ_s (fp32) for the combine kernel.
// Bytes: K and V are read from HBM once (the 16 halo keys of a tile were loaded by its neighbour
// just before: L2 hits, a quarter more L2 → SM traffic), Q once per block; the partials are
// splits·16·(d + 2) floats per head, far below N·d.
#include "mta/mta_fast_launch.hpp"
#include "core/tensor_core.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashlab::cuda::detail::mta_fast {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = 16;            // output rows
constexpr int kQRows = 32;           // loaded query rows (16 + the Pq ≤ 15 above)
constexpr int BLOCK_N = kDecodeBlockN;      // Bc: owned keys per tile
constexpr int kHalo = 8;                    // loaded keys each side of them
constexpr int kLoadN = BLOCK_N + 2 * kHalo;  // loaded keys per tile
constexpr int kPitch = kLoadN + 8;           // S fp32: conflict-free fragment stores and strip reads
constexpr int kPitchSh = BLOCK_N + 8;        // Ŝ fp32
static_assert(kHalo >= (kMaxCk - 1) / 2, "the halo must cover Pk");
static_assert(kLoadN % 16 == 0, "S is computed in n16 blocks");
constexpr int kStrip = 8;
constexpr int kWindow = kStrip + kMaxCq - 1;
constexpr float kLog2e = 1.4426950408889634f;

template <int HEAD_DIM>
struct DecodeTraits {
  static constexpr int kTileQ = kQRows * HEAD_DIM * 2;
  static constexpr int kTileK = kLoadN * HEAD_DIM * 2;  // K_j or V_j, one stage
  static constexpr int kTileS = kQRows * kPitch * 4;    // S fp32
  static constexpr int kTileSh = kRows * kPitchSh * 4;  // Ŝ (base 2) fp32
  static constexpr int kTileP = kRows * BLOCK_N * 2;     // P 16-bit, swizzled [16][64]
  static constexpr int kSmem = kTileQ + 4 * kTileK + kTileS + kTileSh + kTileP + kRows * 4 + kMaxCq * kMaxCk * 4;
  static constexpr int kONT = HEAD_DIM / 32;  // n8 tiles of O per warp (d/4 columns)
};

template <int HEAD_DIM, int ROWS>
__device__ __forceinline__ void load_rows_async(uint32_t smem, const uint16_t* head, std::size_t stride, int row0,
                                                int N) {
  constexpr int kChunks = HEAD_DIM / 8;
  static_assert(ROWS * kChunks % kThreads == 0, "tile chunks must divide among the threads");
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / kThreads; ++it) {
    const int idx = int(threadIdx.x) + it * kThreads;
    const int r = idx / kChunks, c = idx % kChunks, row = row0 + r;
    const bool ok = row >= 0 && row < N;
    cp_async16(smem + swz<HEAD_DIM>(r, c), head + std::size_t(ok ? row : 0) * stride + c * 8, ok);
  }
}

/// Writes a strip's Ŝ (base 2) to SRAM, −∞ above token 0 and in the future (so also past N):
/// rows r0 … r0 + 7 (tile rows, ≥ 16) at loaded key c (an owned key: kHalo ≤ c < kHalo + Bc).
__device__ __forceinline__ void store_strip(const float (&acc)[kStrip], float* Sh, int r0, int c, int qs, int js) {
  const int gc = js + c;
#pragma unroll
  for (int y = 0; y < kStrip; ++y) {
    const int gr = qs + r0 + y;
    const bool visible = gr >= 0 && gc <= gr;
    Sh[(r0 - (kQRows - kRows) + y) * kPitchSh + c - kHalo] = visible ? acc[y] * kLog2e : -INFINITY;
  }
}

/// Ŝ of rows r0 … r0 + 7 at owned key c, any kernel size (cq, ck at run time, W in SRAM).
__device__ __forceinline__ void conv_strip(const Geometry& G, const float* S, float* Sh, const float* W, int r0, int c,
                                           int qs, int js) {
  const int pq = G.pq, pk = G.pk;
  float acc[kStrip] = {};
  for (int b = 0; b < G.ck; ++b) {
    float win[kWindow];
#pragma unroll
    for (int y = 0; y < kWindow; ++y) win[y] = y < kStrip + pq ? S[(r0 - pq + y) * kPitch + c + b - pk] : 0.f;
#pragma unroll
    for (int a = 0; a < kMaxCq; ++a)
      if (a < G.cq) {
        const float w = W[a * G.ck + b];
#pragma unroll
        for (int y = 0; y < kStrip; ++y) acc[y] = fmaf(w, win[y + a], acc[y]);
      }
  }
  store_strip(acc, Sh, r0, c, qs, js);
}

/// Ŝ of this thread's 4 rows × 2 owned keys for a kernel size known at compile time: keys
/// c0, c0 + 1 (c0 = kHalo + 2·(tid % 32)), tile rows r0 … r0 + 3 (r0 = 16 + 4·(tid / 32): a warp
/// holds 4 whole rows). The cq·ck weights sit in registers (loaded once per block) and every loop
/// has a constant trip count: the strip slides down its 4 + Pq window rows, reads each once as
/// float2 pairs (2Pk + 2 keys and one more, from an even column) and feeds every (output row, tap
/// row) pair that uses it, with no load of a weight in between (the general strip's weight
/// loads, each waited for, kept 11 × 11 far from the bandwidth's bound).
template <int CQ, int CK>
__device__ __forceinline__ void conv_quad_fixed(const float* S, const float (&w)[CQ * CK], int qs, int js,
                                                float (&sh)[4][2]) {
  constexpr int PQ = CQ - 1, PK = (CK - 1) / 2, kRowsOut = 4, kWinRows = kRowsOut + PQ;
  constexpr int kLead = PK + (PK & 1);          // the window starts at column c0 − kLead (even)
  constexpr int kPairs = (kLead + PK + 3) / 2;  // float2s per window row: through column c0 + 1 + PK
  static_assert(kHalo >= kLead && kHalo + BLOCK_N - kLead + 2 * kPairs <= kLoadN, "the window lies inside S");
  const int c0 = kHalo + 2 * int(threadIdx.x % 32), r0 = kQRows - kRows + kRowsOut * int(threadIdx.x / 32);
  const float* window = S + (r0 - PQ) * kPitch + c0 - kLead;
  float acc[kRowsOut][2] = {};
#pragma unroll
  for (int yw = 0; yw < kWinRows; ++yw) {  // window row yw is S row r0 − Pq + yw
    float v[2 * kPairs];
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      const float2 f = *reinterpret_cast<const float2*>(window + yw * kPitch + 2 * p);
      v[2 * p] = f.x;
      v[2 * p + 1] = f.y;
    }
#pragma unroll
    for (int y = 0; y < kRowsOut; ++y) {
      const int a = yw - y;  // output row r0 + y reads S row r0 + y − (Pq − a) with tap row a
      if (a < 0 || a >= CQ) continue;
#pragma unroll
      for (int bk = 0; bk < CK; ++bk)
#pragma unroll
        for (int x = 0; x < 2; ++x) acc[y][x] = fmaf(w[a * CK + bk], v[kLead - PK + x + bk], acc[y][x]);
    }
  }
#pragma unroll
  for (int y = 0; y < kRowsOut; ++y) {  // −∞ above token 0 and in the future (so also past N)
    const int gr = qs + r0 + y, gc = js + c0;
    sh[y][0] = gr >= 0 && gc <= gr ? acc[y][0] * kLog2e : -INFINITY;
    sh[y][1] = gr >= 0 && gc + 1 <= gr ? acc[y][1] * kLog2e : -INFINITY;
  }
}

/// Online-softmax state of the fixed-size path: this warp's rows 4·warp + y; m is the same in the
/// whole warp, ℓ is this thread's share (its 2 keys of every tile), summed over the warp at the end.
struct QuadStats {
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  float l[4] = {};
};

/// c. (fixed-size path) The online softmax of the warp's 4 rows straight from the registers the
/// convolution left them in (a warp holds whole rows: a shuffle reduction gives the row maximum,
/// no round trip through SRAM and no barrier): m_new, α = 2^(m − m_new), P = 2^(Ŝ − m_new)
/// (16-bit → sP), ℓ ← αℓ + this thread's P; α → alpha_s. A row with nothing visible yet keeps
/// m = −∞ and P = 0 (no −∞ − (−∞)).
template <bool kBf16>
__device__ __forceinline__ void quad_softmax(const float (&sh)[4][2], uint32_t sP, float* alpha_s, QuadStats& st) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int y = 0; y < 4; ++y) {
    float mx = fmaxf(sh[y][0], sh[y][1]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float m_new = fmaxf(st.m[y], mx);
    const bool none = m_new == -INFINITY;
    const float alpha = none ? 1.f : ex2(st.m[y] - m_new);
    const float p0 = none ? 0.f : ex2(sh[y][0] - m_new), p1 = none ? 0.f : ex2(sh[y][1] - m_new);
    st.l[y] = alpha * st.l[y] + p0 + p1;
    st.m[y] = m_new;
    const int row = 4 * warp + y;  // keys 2·lane, 2·lane + 1: 16-byte chunk lane / 4 of the row
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + swz<BLOCK_N>(row, lane / 4) + 4 * (lane % 4)),
                 "r"(pack2<kBf16>(p0, p1)));
    if (lane == 0) alpha_s[row] = alpha;
  }
}

/// b. The convolution of one tile: Ŝ of tile rows 16 … 31 × the 64 owned keys. For a kernel size
/// fixed at compile time (CQ, CK > 0) the weights are in registers (load() reads the head's W from
/// HBM, the same addresses in every thread) and each thread computes 4 rows × 2 keys into
/// registers (quad()); otherwise (CQ = CK = 0) the general strip reads W from SRAM, thread → owned
/// key kHalo + tid % 64, rows 16 + 8·(tid / 64) … + 7, into Ŝ in SRAM (tile()).
template <int CQ, int CK>
struct ConvTaps {
  float w[CQ * CK];
  __device__ __forceinline__ void load(const float* W) {
#pragma unroll
    for (int t = 0; t < CQ * CK; ++t) w[t] = W[t];
  }
  __device__ __forceinline__ void quad(const float* S, int qs, int js, float (&sh)[4][2]) const {
    conv_quad_fixed<CQ, CK>(S, w, qs, js, sh);
  }
};
template <>
struct ConvTaps<0, 0> {
  __device__ __forceinline__ void load(const float*) {}
  __device__ __forceinline__ void tile(const Geometry& G, const float* S, float* Sh, const float* W, int qs,
                                       int js) const {
    conv_strip(G, S, Sh, W, kQRows - kRows + kStrip * int(threadIdx.x / BLOCK_N), kHalo + int(threadIdx.x % BLOCK_N),
               qs, js);
  }
};

/// Stores one m16n8 accumulator of S (tile rows row0 …, loaded keys col0 …) × scale as fp32 →
/// SRAM, with the causal zeros (tile row 0 is token qs, loaded key 0 is token js) when `causal`
/// (the tile reaches past its first row; false on every tile but the last one or two).
__device__ __forceinline__ void store_scores(const Geometry& G, const float (&acc)[4], float* S, int row0, int col0,
                                             int qs, int js, bool causal) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r, col = col0 + 2 * t, gr = qs + row, gc = js + col;
    float2 v = make_float2(acc[2 * r] * G.scale, acc[2 * r + 1] * G.scale);
    if (causal) {
      v.x = gc > gr ? 0.f : v.x;
      v.y = gc + 1 > gr ? 0.f : v.y;
    }
    *reinterpret_cast<float2*>(S + row * kPitch + col) = v;
  }
}

/// a. S = scale · Q K_jᵀ with the causal zeros, 32 rows × 80 loaded keys on tensor cores, fp32 →
/// SRAM: warp w computes all 32 rows × keys [16w, 16w + 16), and of the last 16 keys the m16n8
/// piece rows 16·(w / 2) …, keys 64 + 8·(w % 2) … (the same number of MMAs for every warp).
template <int HEAD_DIM, bool kBf16>
__device__ __forceinline__ void scores_to_smem(const Geometry& G, uint32_t sQ, uint32_t sK, float* S, int qs, int js) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, mi = lane >> 3;
  const int em = warp >> 1, en = warp & 1;  // this warp's piece of keys 64 … 79
  float s[2][2][4] = {}, e[4] = {};
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    uint32_t a[2][4], bf[4], be[4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      ldsm_x4(sQ + swz<HEAD_DIM>(16 * mt + (lane & 15), 2 * kk + (lane >> 4)), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
    ldsm_x4(sK + swz<HEAD_DIM>(16 * warp + (lane & 7) + ((mi >> 1) << 3), 2 * kk + (mi & 1)), bf[0], bf[1], bf[2], bf[3]);
    ldsm_x4(sK + swz<HEAD_DIM>(64 + (lane & 7) + ((mi >> 1) << 3), 2 * kk + (mi & 1)), be[0], be[1], be[2], be[3]);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      mma16816<kBf16>(s[mt][0], a[mt], bf[0], bf[1]);
      mma16816<kBf16>(s[mt][1], a[mt], bf[2], bf[3]);
    }
    uint32_t ae[4];  // selects, not a run-time index (which would put a[] in local memory)
#pragma unroll
    for (int i = 0; i < 4; ++i) ae[i] = em ? a[1][i] : a[0][i];
    mma16816<kBf16>(e, ae, en ? be[2] : be[0], en ? be[3] : be[1]);
  }
  const bool causal = js + kLoadN - 1 > qs;  // some key of the tile lies after tile row 0
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < 2; ++n) store_scores(G, s[mt][n], S, 16 * mt, 16 * warp + 8 * n, qs, js, causal);
  store_scores(G, e, S, 16 * em, 64 + 8 * en, qs, js, causal);
}

/// c. Online softmax of the 16 output rows over this key tile, 8 threads per row (row tid / 8,
/// keys 8·(tid % 8) …): m_new, α = 2^(m − m_new), P = 2^(Ŝ − m_new) (16-bit → sP), ℓ ← αℓ + Σ P;
/// the row's α → alpha_s. A row with nothing visible yet keeps m = −∞ and P = 0 (no −∞ − (−∞)).
template <bool kBf16>
__device__ __forceinline__ void online_softmax(const float* Sh, uint32_t sP, float* alpha_s, float& m_row,
                                               float& l_row) {
  const int srow = threadIdx.x / 8, spart = threadIdx.x % 8;
  float x[8], mx = -INFINITY;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    x[e] = Sh[srow * kPitchSh + 8 * spart + e];
    mx = fmaxf(mx, x[e]);
  }
#pragma unroll
  for (int off = 4; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  const float m_new = fmaxf(m_row, mx);
  const bool none = m_new == -INFINITY;  // nothing visible yet in this row
  const float alpha = none ? 1.f : ex2(m_row - m_new);
  float sum = 0.f;
  uint32_t packed[4];
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    const float p0 = none ? 0.f : ex2(x[e] - m_new), p1 = none ? 0.f : ex2(x[e + 1] - m_new);
    sum += p0 + p1;
    packed[e / 2] = pack2<kBf16>(p0, p1);
  }
#pragma unroll
  for (int off = 4; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  l_row = alpha * l_row + sum;
  m_row = m_new;
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(sP + swz<BLOCK_N>(srow, spart)), "r"(packed[0]),
               "r"(packed[1]), "r"(packed[2]), "r"(packed[3]));
  if (spart == 0) alpha_s[srow] = alpha;
}

/// d. O ← α O + P V_j in registers (V_j's owned keys: loaded rows kHalo …): warp w, the 16 rows
/// × columns [w·d/4, (w + 1)·d/4).
template <int HEAD_DIM, bool kBf16>
__device__ __forceinline__ void accumulate_pv(float (&o)[HEAD_DIM / 32][4], const float* alpha_s, uint32_t sP,
                                              uint32_t sV) {
  constexpr int kONT = HEAD_DIM / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, mi = lane >> 3;
  const float a0 = alpha_s[g], a1 = alpha_s[g + 8];
#pragma unroll
  for (int n = 0; n < kONT; ++n) {
    o[n][0] *= a0;
    o[n][1] *= a0;
    o[n][2] *= a1;
    o[n][3] *= a1;
  }
  const int col0 = warp * (HEAD_DIM / 4);
#pragma unroll
  for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
    uint32_t a[4];
    ldsm_x4(sP + swz<BLOCK_N>(lane & 15, 2 * kk + (lane >> 4)), a[0], a[1], a[2], a[3]);
#pragma unroll
    for (int np = 0; np < kONT / 2; ++np) {
      uint32_t bf[4];
      const int row = kHalo + 16 * kk + (lane & 7) + ((mi & 1) << 3);
      ldsm_x4_trans(sV + swz<HEAD_DIM>(row, col0 / 8 + 2 * np + (mi >> 1)), bf[0], bf[1], bf[2], bf[3]);
      mma16816<kBf16>(o[2 * np], a, bf[0], bf[1]);
      mma16816<kBf16>(o[2 * np + 1], a, bf[2], bf[3]);
    }
  }
}

template <int HEAD_DIM, bool kBf16, int CQ, int CK>
__global__ void __launch_bounds__(kThreads, kDecodeBlocksPerSm)
    mta_fast_decode_split_kernel(Geometry G, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                                 const uint16_t* __restrict__ V, const float* __restrict__ Wg, float* __restrict__ O_s,
                                 float* __restrict__ m_s, float* __restrict__ l_s) {
  using T = DecodeTraits<HEAD_DIM>;
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z, N = G.seq;
  const std::size_t stride = G.row_stride(), base = G.head_offset(b, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int tiles = (N + BLOCK_N - 1) / BLOCK_N, per_split = G.keys_per_split / BLOCK_N;
  const int t_begin = split * per_split, t_end = min(t_begin + per_split, tiles);
  const int qs = N - kQRows;  // global row of tile row 0

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sQ = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sKV = sQ + T::kTileQ;  // stage st: K at sKV + 2·st·kTileK, V after it
  float* S = reinterpret_cast<float*>(smem_raw + T::kTileQ + 4 * T::kTileK);
  float* Sh = S + kQRows * kPitch;
  const uint32_t sP = sQ + uint32_t(T::kTileQ + 4 * T::kTileK + T::kTileS + T::kTileSh);
  float* alpha_s = reinterpret_cast<float*>(smem_raw + T::kTileQ + 4 * T::kTileK + T::kTileS + T::kTileSh + T::kTileP);
  float* W = alpha_s + kRows;

  for (int tap = threadIdx.x; tap < G.taps(); tap += kThreads) W[tap] = Wg[std::size_t(h) * G.taps() + tap];
  ConvTaps<CQ, CK> taps;  // CQ, CK > 0: the weights in registers, read once (the same addresses in every thread)
  taps.load(Wg + std::size_t(h) * G.taps());
  load_rows_async<HEAD_DIM, kQRows>(sQ, Q + base, stride, qs, N);
  auto load_kv = [&](int tile, int st) {
    const int js = tile * BLOCK_N - kHalo;
    const uint32_t k_at = sKV + uint32_t(2 * st * T::kTileK);
    load_rows_async<HEAD_DIM, kLoadN>(k_at, K + base, stride, js, N);
    load_rows_async<HEAD_DIM, kLoadN>(k_at + T::kTileK, V + base, stride, js, N);
  };
  if (t_begin < t_end) load_kv(t_begin, 0);
  cp_async_commit();

  // Row statistics: thread (row = tid / 8, part = tid % 8) holds m, ℓ of its row (the 8 agree).
  const int srow = threadIdx.x / 8, spart = threadIdx.x % 8;
  float m_row = -INFINITY, l_row = 0.f;  // the general path
  QuadStats quad_stats;                   // the fixed-size path
  float o[T::kONT][4] = {};  // rows g, g + 8 of the 16 × d/4 slice of warp `warp`

  for (int tile = t_begin; tile < t_end; ++tile) {
    const int st = (tile - t_begin) & 1, js = tile * BLOCK_N - kHalo;
    const uint32_t sK = sKV + uint32_t(2 * st * T::kTileK), sV = sK + T::kTileK;
    cp_async_wait<0>();
    __syncthreads();  // K_j, V_j landed; every warp finished the previous tile (other stage free)
    if (tile + 1 < t_end) load_kv(tile + 1, st ^ 1);
    cp_async_commit();

    scores_to_smem<HEAD_DIM, kBf16>(G, sQ, sK, S, qs, js);  // a
    __syncthreads();  // S complete: the convolution reads neighbouring rows and keys

    if constexpr (CQ > 0) {
      float sh[4][2];
      taps.quad(S, qs, js, sh);                      // b
      quad_softmax<kBf16>(sh, sP, alpha_s, quad_stats);  // c
    } else {
      taps.tile(G, S, Sh, W, qs, js);  // b
      __syncthreads();                 // Ŝ complete: each row's statistics read all 64 keys
      online_softmax<kBf16>(Sh, sP, alpha_s, m_row, l_row);  // c
    }
    __syncthreads();  // P and α complete

    accumulate_pv<HEAD_DIM, kBf16>(o, alpha_s, sP, sV);  // d
  }
  cp_async_wait<0>();

  // Partials: O_s [B, H, splits, 16, d], m_s and ℓ_s [B, H, splits, 16].
  const std::size_t part = (std::size_t(b) * G.heads + h) * G.splits + split;
  float* out = O_s + part * kRows * HEAD_DIM + warp * (HEAD_DIM / 4) + 2 * t;
#pragma unroll
  for (int n = 0; n < T::kONT; ++n) {
    *reinterpret_cast<float2*>(out + g * HEAD_DIM + 8 * n) = make_float2(o[n][0], o[n][1]);
    *reinterpret_cast<float2*>(out + (g + 8) * HEAD_DIM + 8 * n) = make_float2(o[n][2], o[n][3]);
  }
  if constexpr (CQ > 0) {
#pragma unroll
    for (int y = 0; y < 4; ++y) {
      float l = quad_stats.l[y];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
      if (lane == 0) {
        m_s[part * kRows + 4 * warp + y] = quad_stats.m[y];
        l_s[part * kRows + 4 * warp + y] = l;
      }
    }
  } else if (spart == 0) {
    m_s[part * kRows + srow] = m_row;
    l_s[part * kRows + srow] = l_row;
  }
}

/// Grid (H, B), 128 threads: thread (row = tid / 8, part = tid % 8) merges the splits of one row
/// for d/8 columns and writes O of the rows that exist (global row ≥ 0); part 0 also the row's
/// LSE = M + log2 L (base 2) when LSE is not null. The row's M and L first: the 8 threads of the
/// row each merge every 8th split, then each other's by shuffles (loads in parallel rather than
/// one dependent load per split).
template <int HEAD_DIM, bool kBf16>
__global__ void __launch_bounds__(kThreads)
    mta_fast_decode_combine_kernel(Geometry G, const float* __restrict__ O_s, const float* __restrict__ m_s,
                                   const float* __restrict__ l_s, uint16_t* __restrict__ O, float* __restrict__ LSE) {
  const int h = blockIdx.x, b = blockIdx.y, row = threadIdx.x / 8, part = threadIdx.x % 8;
  const int rows_out = min(G.seq, kRows), out_row = row - (kRows - rows_out);
  const std::size_t first = (std::size_t(b) * G.heads + h) * G.splits;
  // A split with m = −∞ saw nothing of this row (its ℓ and O_s are 0): skipped, never 2^(−∞ − (−∞)).
  float M = -INFINITY, L = 0.f;
  for (int s = part; s < G.splits; s += 8) {
    const float m = m_s[(first + s) * kRows + row], l = l_s[(first + s) * kRows + row];
    if (m == -INFINITY) continue;
    const float m_new = fmaxf(M, m);
    L = (M == -INFINITY ? 0.f : L * ex2(M - m_new)) + l * ex2(m - m_new);
    M = m_new;
  }
#pragma unroll
  for (int off = 4; off > 0; off /= 2) {  // the 8 threads of a row are lanes 8k … 8k + 7
    const float M_o = __shfl_xor_sync(0xffffffffu, M, off), L_o = __shfl_xor_sync(0xffffffffu, L, off);
    const float m_new = fmaxf(M, M_o);
    L = (M == -INFINITY ? 0.f : L * ex2(M - m_new)) + (M_o == -INFINITY ? 0.f : L_o * ex2(M_o - m_new));
    M = m_new;
  }
  // O: every split's O_s is loaded unconditionally (so the loads of several splits are in flight
  // at once) and a split that saw nothing of the row is dropped by a select, not a multiply by 0
  // (its O_s may hold 0 · NaN from a key this row does not see).
  constexpr int kCols = HEAD_DIM / 8;
  float acc[kCols] = {};
#pragma unroll 8
  for (int s = 0; s < G.splits; ++s) {
    const float m = m_s[(first + s) * kRows + row];
    const float4* src = reinterpret_cast<const float4*>(O_s + ((first + s) * kRows + row) * HEAD_DIM + part * kCols);
    float4 v[kCols / 4];
#pragma unroll
    for (int e = 0; e < kCols / 4; ++e) v[e] = src[e];
    const bool seen = m != -INFINITY;
    const float w = seen ? ex2(m - M) : 0.f;
#pragma unroll
    for (int e = 0; e < kCols / 4; ++e) {
      acc[4 * e] = seen ? fmaf(w, v[e].x, acc[4 * e]) : acc[4 * e];
      acc[4 * e + 1] = seen ? fmaf(w, v[e].y, acc[4 * e + 1]) : acc[4 * e + 1];
      acc[4 * e + 2] = seen ? fmaf(w, v[e].z, acc[4 * e + 2]) : acc[4 * e + 2];
      acc[4 * e + 3] = seen ? fmaf(w, v[e].w, acc[4 * e + 3]) : acc[4 * e + 3];
    }
  }
  if (out_row < 0) return;  // above token 0 (N < 16)
  if (LSE != nullptr && part == 0) LSE[(std::size_t(b) * G.heads + h) * rows_out + out_row] = M + log2f(L);
  const float inv = 1.f / L;
  uint16_t* dst = O + ((std::size_t(b) * rows_out + out_row) * G.heads + h) * HEAD_DIM + part * kCols;
#pragma unroll
  for (int e = 0; e < kCols; e += 2) *reinterpret_cast<uint32_t*>(dst + e) = pack2<kBf16>(acc[e] * inv, acc[e + 1] * inv);
}

template <int HEAD_DIM, bool kBf16, int CQ, int CK>
void launch_split(const Geometry& G, const DecodeArgs& a, cudaStream_t stream) {
  using T = DecodeTraits<HEAD_DIM>;
  auto split_kernel = &mta_fast_decode_split_kernel<HEAD_DIM, kBf16, CQ, CK>;
  // > 48 KiB of dynamic SRAM: opted in per device (the record is kept, thread-safe: common.hpp).
  opt_in_smem(reinterpret_cast<const void*>(split_kernel), std::size_t(T::kSmem), "mta_fast_decode_split_kernel");
  announce("mta_fast_decode_split_kernel");
  split_kernel<<<dim3(G.splits, G.heads, G.batch), kThreads, T::kSmem, stream>>>(G, a.Q, a.K, a.V, a.W, a.O_s, a.m_s,
                                                                                a.l_s);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_fast_decode_split_kernel");
}

template <int HEAD_DIM, bool kBf16>
void launch(const Geometry& G, const DecodeArgs& a, cudaStream_t stream) {
  // The sizes the split kernel is compiled for (weights in registers); any other through the
  // general strip.
  if (G.cq == 3 && G.ck == 3) launch_split<HEAD_DIM, kBf16, 3, 3>(G, a, stream);
  else if (G.cq == 6 && G.ck == 11) launch_split<HEAD_DIM, kBf16, 6, 11>(G, a, stream);
  else if (G.cq == 11 && G.ck == 11) launch_split<HEAD_DIM, kBf16, 11, 11>(G, a, stream);
  else launch_split<HEAD_DIM, kBf16, 0, 0>(G, a, stream);
  announce("mta_fast_decode_combine_kernel");
  mta_fast_decode_combine_kernel<HEAD_DIM, kBf16><<<dim3(G.heads, G.batch), kThreads, 0, stream>>>(G, a.O_s, a.m_s,
                                                                                                   a.l_s, a.O, a.LSE);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_fast_decode_combine_kernel");
}

}  // namespace

void launch_decode(const Geometry& g, bool bf16, const DecodeArgs& a, cudaStream_t stream) {
  if (g.head_dim == 64) {
    if (bf16) launch<64, true>(g, a, stream);
    else launch<64, false>(g, a, stream);
  } else {
    if (bf16) launch<128, true>(g, a, stream);
    else launch<128, false>(g, a, stream);
  }
}

}  // namespace flashlab::cuda::detail::mta_fast
