// mta_fast_fwd.cu — the fast Multi-Token Attention forward on tensor cores (mta_fast.hpp).
//
// One thread block (4 warps) per query tile of Br = 64 effective rows of one (batch, head), in
// the FlashAttention-2 order: O_i (fp32 mma accumulators), m_i and ℓ_i stay in registers across
// the key tiles and O_i is written once at the end — the clear kernel (mta_fwd.cu) instead
// read-modify-writes O in HBM per key tile, as the source does. Per key tile j (Bc = 64 keys):
//   1. S = scale·log2(e)·Q Kᵀ on tensor cores (mma.sync m16n8k16, fp32) for the tile with its
//      halo: query rows i0 − 16 … i0 + 63 and keys j0 − 8 … j0 + 71 (mta_fast_tile.cuh), causal
//      zeros (key > query → 0), written to SRAM in fp32. Each warp owns 16 rows of the tile (its
//      Q fragments stay in registers) and a share of the 16 halo rows (skipped when Pq = 0);
//      n8 tiles entirely right of the diagonal are written as zeros without an mma.
//   2. Ŝ = Conv2D(S, W) on CUDA cores in fp32 (conv_strip: 32 keys of one row per thread), then
//      −∞ where key > query, to SRAM.
//   3. Online softmax in base 2 on Ŝ read back in the mma fragment layout, P rounded to the input
//      dtype as the A fragment of O_i += P V_j (V_j via ldmatrix.trans).
// K_j and V_j have one SRAM buffer each, refilled as soon as the previous step is done with them
// (K_{j+1} is loaded during the convolution and softmax of step j, V_j during S and the
// convolution), so the copies overlap the math; three barriers per step.
// Key tiles entirely right of the block's last row are never loaded: Br = Bc, so query tile i
// visits key tiles 0 … i. Blocks of the bottom query tiles (the most key tiles) start first.
// Rows outside [0, N) of every tile are zero-filled by cp.async: they are exactly the zero
// padding of the convolution (S = 0 there), so no branch treats the sequence ends specially.
#include "mta_fast_tile.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashlab::cuda::detail::mta {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxTaps = 16 * 15;  // cq ≤ 16, ck ≤ 15 (check_fast_shape)
static_assert(kFastBr == 16 * kWarps, "one m16 row block of the tile per warp");
static_assert(kFastBr == kFastBc, "query tile i visits key tiles 0 … i only when Br = Bc");
static_assert(kWarps * 32 * kConvStrip == kFastBr * kFastBc, "the convolution gives every thread one strip");

/// SRAM layout (byte offsets): Q tile [80][d], K tile [80][d], V tile [64][d] (16-bit, swizzled),
/// S [80][kLdS] fp32, Ŝ [64][kLdP] fp32, W [cq·ck] fp32.
template <int HEAD_DIM>
struct FwdSmem {
  static constexpr int kRowBytes = HEAD_DIM * 2;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kSRows * kRowBytes;
  static constexpr int kV = kK + kSCols * kRowBytes;
  static constexpr int kS = kV + kFastBc * kRowBytes;
  static constexpr int kP = kS + kSRows * kLdS * 4;
  static constexpr int kW = kP + kFastBr * kLdP * 4;
  static constexpr int kBytes = kW + kMaxTaps * 4;
  /// Blocks per SM the SRAM allows (228 KiB per SM, 1 KiB reserved per block).
  static constexpr int kMinBlocks = (228 * 1024) / (kBytes + 1024);
};

/// Step 1: this warp's part of S (base-2 units, causal zeros) for key tile j0 into SRAM.
/// Own rows: S-tile rows 16 + 16·warp … +15, all 80 keys, A fragments from `q_frag`. Halo rows
/// 0 … 15 (only when Pq > 0): key pairs (16 keys) np ≡ warp (mod 4), A fragments from SRAM.
template <int HEAD_DIM, bool kBf16>
__device__ __forceinline__ void scores_to_smem(float* __restrict__ sS, const uint32_t (&q_frag)[HEAD_DIM / 16][4],
                                               uint32_t q_lane, uint32_t q_xor, uint32_t k_lane, uint32_t k_xor,
                                               int warp, int g, int t, int i0, int j0, int pq, float scale_log2) {
  constexpr int kRowBytes = HEAD_DIM * 2;
  constexpr int kPairs = kSCols / 16;  // 5 pairs of n8 tiles
  // Writes one m16n8 C fragment (S-tile rows row_s0 + g (+8), keys 8·n + 2t (+1)) with the causal zeros.
  auto store = [&](const float (&c)[4], int row_s0, int n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row_s0 + g + 8 * (e >> 1), col = 8 * n + 2 * t + (e & 1);
      const int gi = i0 - kHaloRows + row, gj = j0 - kHaloCols + col;
      sS[row * kLdS + col] = gj > gi ? 0.f : c[e] * scale_log2;
    }
  };
  {  // own rows
    const int row_s0 = kHaloRows + 16 * warp;
    const int last_row = i0 + 16 * warp + 15;
    float s[2 * kPairs][4];
#pragma unroll
    for (int n = 0; n < 2 * kPairs; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int np = 0; np < kPairs; ++np) {
      if (j0 - kHaloCols + 16 * np > last_row) continue;  // right of the diagonal: S = 0
#pragma unroll
      for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        uint32_t b0, b1, b2, b3;  // keys 16·np + [0, 16), dims 16·kk + [0, 16)
        ldsm_x4(k_lane + 16 * np * kRowBytes + ((32 * kk) ^ k_xor), b0, b1, b2, b3);
        mma16816<kBf16>(s[2 * np], q_frag[kk], b0, b1);
        mma16816<kBf16>(s[2 * np + 1], q_frag[kk], b2, b3);
      }
    }
#pragma unroll
    for (int n = 0; n < 2 * kPairs; ++n) store(s[n], row_s0, n);
  }
  if (pq == 0) return;  // the convolution reads no halo row
  for (int np = warp; np < kPairs; np += kWarps) {  // halo rows i0 − 16 … i0 − 1
    float s[2][4] = {};
    if (j0 - kHaloCols + 16 * np <= i0 - 1) {
#pragma unroll
      for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        uint32_t a[4], b0, b1, b2, b3;
        ldsm_x4(q_lane + ((32 * kk) ^ q_xor), a[0], a[1], a[2], a[3]);
        ldsm_x4(k_lane + 16 * np * kRowBytes + ((32 * kk) ^ k_xor), b0, b1, b2, b3);
        mma16816<kBf16>(s[0], a, b0, b1);
        mma16816<kBf16>(s[1], a, b2, b3);
      }
    }
    store(s[0], 0, 2 * np);
    store(s[1], 0, 2 * np + 1);
  }
}

/// Step 2: this thread's strip of Ŝ (row r = 32·(warp mod 2) + lane, keys 32·(warp div 2) + [0, 32))
/// = Conv2D(S, W), −∞ where key > query, into SRAM. A strip entirely right of the diagonal is
/// −∞ without a convolution.
__device__ __forceinline__ void convolve_to_smem(float* __restrict__ sP, const float* __restrict__ sS,
                                                 const float* __restrict__ sW, int warp, int lane, int i0, int j0,
                                                 int cq, int ck) {
  const float NEG_INF = __int_as_float(0xff800000);
  const int r = 32 * (warp & 1) + lane, c0 = kConvStrip * (warp >> 1);
  const int gi = i0 + r, gj0 = j0 + c0;
  float* out = sP + r * kLdP + c0;
  if (gj0 > gi) {
#pragma unroll
    for (int x = 0; x < kConvStrip; ++x) out[x] = NEG_INF;
    return;
  }
  float acc[kConvStrip];
  // Tap (a, b) of output (r, c) reads S[i + a − Pq, j + b − Pk]: S-tile row 16 + r + a − Pq, column 8 + c + b − Pk.
  conv_strip_any(ck, sS, kLdS, sW, cq, kHaloRows + r - (cq - 1), kHaloCols + c0 - (ck - 1) / 2, acc);
#pragma unroll
  for (int x = 0; x < kConvStrip; ++x) out[x] = gj0 + x > gi ? NEG_INF : acc[x];
}

/// Grid (⌈N/Br⌉, H, B), kThreads threads, FwdSmem::kBytes of dynamic SRAM.
template <int HEAD_DIM, bool kBf16>
__global__ void __launch_bounds__(kThreads, FwdSmem<HEAD_DIM>::kMinBlocks)
    mta_fast_fwd_kernel(FastLaunch L, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                        const uint16_t* __restrict__ V, const float* __restrict__ W, uint16_t* __restrict__ O,
                        float* __restrict__ LSE) {
  using Sm = FwdSmem<HEAD_DIM>;
  constexpr int kRowBytes = HEAD_DIM * 2;
  constexpr int kKSteps = HEAD_DIM / 16;  // k-steps of S = Q Kᵀ
  constexpr int kNTilesP = kFastBc / 8;   // n8 tiles of Ŝ per warp row block
  constexpr int kNTilesO = HEAD_DIM / 8;  // n8 tiles of O_i
  const float NEG_INF = __int_as_float(0xff800000);

  const int N = L.seq;
  const int tile = int(gridDim.x) - 1 - int(blockIdx.x);  // bottom query tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  const int i0 = tile * kFastBr;
  const std::size_t stride = L.row_stride(), base = L.head_offset(b, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates
  const int taps = L.cq * L.ck;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t s0 = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sQ = s0 + Sm::kQ, sK = s0 + Sm::kK, sV = s0 + Sm::kV;
  float* sS = reinterpret_cast<float*>(smem_raw + Sm::kS);
  float* sP = reinterpret_cast<float*>(smem_raw + Sm::kP);
  float* sW = reinterpret_cast<float*>(smem_raw + Sm::kW);

  // W → SRAM (visible after the first barrier); Q rows i0 − 16 … i0 + 63 and K_0 (keys −8 … 71).
  for (int x = threadIdx.x; x < taps; x += kThreads) sW[x] = W[std::size_t(h) * taps + x];
  load_rows<HEAD_DIM, kSRows, kThreads>(sQ, Q + base, stride, i0 - kHaloRows, N);
  load_rows<HEAD_DIM, kSCols, kThreads>(sK, K + base, stride, -kHaloCols, N);
  cp_async_commit();

  // ldmatrix lane addresses, as attention_fwd_tc.cu (every block base is a multiple of 8 rows).
  const int mi = lane >> 3;
  const uint32_t q_lane = sQ + uint32_t((lane & 15) * kRowBytes);
  const uint32_t q_xor = uint32_t(((lane >> 4) ^ (lane & 7)) << 4);
  const uint32_t k_lane = sK + uint32_t(((lane & 7) + ((mi >> 1) << 3)) * kRowBytes);
  const uint32_t k_xor = uint32_t(((mi & 1) ^ (lane & 7)) << 4);
  const uint32_t v_lane = sV + uint32_t(((lane & 7) + ((mi & 1) << 3)) * kRowBytes);
  const uint32_t v_xor = uint32_t(((mi >> 1) ^ (lane & 7)) << 4);

  float acc[kNTilesO][4];  // unnormalised O_i, rows g and g + 8 of this warp's 16
#pragma unroll
  for (int n = 0; n < kNTilesO; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m_i[2] = {NEG_INF, NEG_INF}, l_i[2] = {0.f, 0.f};  // l_i: per-thread partial row sums
  uint32_t q_frag[kKSteps][4];

  const int Tc = tile + 1;
  for (int j = 0; j < Tc; ++j) {
    const int j0 = j * kFastBc;
    cp_async_wait<0>();  // K_j (and Q on the first step) landed for this thread
    __syncthreads();     // … for all; every warp is done with V_{j−1}, Ŝ_{j−1}, S_{j−1}
    load_rows<HEAD_DIM, kFastBc, kThreads>(sV, V + base, stride, j0, N);
    cp_async_commit();
    if (j == 0) {  // this warp's 16 own Q rows: SRAM → registers once, as A fragments
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
        ldsm_x4(q_lane + (kHaloRows + 16 * warp) * kRowBytes + ((32 * kk) ^ q_xor), q_frag[kk][0], q_frag[kk][1],
                q_frag[kk][2], q_frag[kk][3]);
    }
    scores_to_smem<HEAD_DIM, kBf16>(sS, q_frag, q_lane, q_xor, k_lane, k_xor, warp, g, t, i0, j0, L.cq - 1,
                                    L.scale_log2);
    __syncthreads();  // S complete; K_j may be refilled
    if (j + 1 < Tc) load_rows<HEAD_DIM, kSCols, kThreads>(sK, K + base, stride, j0 + kFastBc - kHaloCols, N);
    cp_async_commit();
    convolve_to_smem(sP, sS, sW, warp, lane, i0, j0, L.cq, L.ck);
    cp_async_wait<1>();  // V_j landed (K_{j+1} may still be in flight)
    __syncthreads();     // Ŝ complete, V_j visible

    // Step 3: online softmax (base 2) on this warp's rows of Ŝ, in the mma C layout.
    float s[kNTilesP][4];
#pragma unroll
    for (int n = 0; n < kNTilesP; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = sP[(16 * warp + g + 8 * (e >> 1)) * kLdP + 8 * n + 2 * t + (e & 1)];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = NEG_INF;
#pragma unroll
      for (int n = 0; n < kNTilesP; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the quad holds one row
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_i[r], mx);
      // A row with only −∞ so far keeps m = −∞; subtracting 0 then avoids 2^(−∞ + ∞) = NaN.
      const float m_ref = m_new == NEG_INF ? 0.f : m_new;
      const float alpha = ex2(m_i[r] - m_ref);
      float row_sum = 0.f;
#pragma unroll
      for (int n = 0; n < kNTilesP; ++n) {
        s[n][2 * r] = ex2(s[n][2 * r] - m_ref);
        s[n][2 * r + 1] = ex2(s[n][2 * r + 1] - m_ref);
        row_sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      l_i[r] = l_i[r] * alpha + row_sum;
      m_i[r] = m_new;
#pragma unroll
      for (int n = 0; n < kNTilesO; ++n) {
        acc[n][2 * r] *= alpha;
        acc[n][2 * r + 1] *= alpha;
      }
    }
    // O_i += P V_j: P rounded to 16 bits is the A fragment (C layout of two n8 tiles = A layout of one k16 step).
#pragma unroll
    for (int kk = 0; kk < kFastBc / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack2<kBf16>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2<kBf16>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int np = 0; np < kNTilesO / 2; ++np) {
        uint32_t b0, b1, b2, b3;  // keys 16·kk + [0, 16), dims 16·np + [0, 16)
        ldsm_x4_trans(v_lane + 16 * kk * kRowBytes + ((32 * np) ^ v_xor), b0, b1, b2, b3);
        mma16816<kBf16>(acc[2 * np], a, b0, b1);
        mma16816<kBf16>(acc[2 * np + 1], a, b2, b3);
      }
    }
  }
  cp_async_wait<0>();  // no copy may still be writing SRAM when the block exits

  // O_i = acc / ℓ_i (input dtype) and LSE_i = m_i + log2(ℓ_i) (fp32, base 2): registers → HBM.
  // ℓ_i = 0 (no visible key; not reachable for rows < N) stores O = 0, LSE = −∞; NaN stays NaN.
  const std::size_t stat = L.stat_offset(b, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_i[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv_l = l == 0.f ? 0.f : 1.f / l;
    const int row = i0 + 16 * warp + g + 8 * r;
    if (row < N) {
      uint16_t* out = O + base + std::size_t(row) * stride + 2 * t;
#pragma unroll
      for (int n = 0; n < kNTilesO; ++n)
        *reinterpret_cast<uint32_t*>(out + 8 * n) = pack2<kBf16>(acc[n][2 * r] * inv_l, acc[n][2 * r + 1] * inv_l);
      if (t == 0) LSE[stat + row] = l == 0.f ? NEG_INF : m_i[r] + log2f(l);
    }
  }
}

template <int HEAD_DIM, bool kBf16>
void launch_one(const FastLaunch& L, const void* Q, const void* K, const void* V, const float* W, void* O, float* LSE,
                cudaStream_t stream) {
  using Sm = FwdSmem<HEAD_DIM>;
  auto kernel = &mta_fast_fwd_kernel<HEAD_DIM, kBf16>;
  // Opt in to > 48 KiB of dynamic SRAM once per instantiation (thread-safe static init).
  static const bool opted_in = [&] {
    FLASHLAB_CUDA_CHECK(
        cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Sm::kBytes));
    return true;
  }();
  (void)opted_in;
  const dim3 grid((L.seq + kFastBr - 1) / kFastBr, L.heads, L.batch);
  announce("mta_fast_fwd_kernel");
  kernel<<<grid, kThreads, Sm::kBytes, stream>>>(L, static_cast<const uint16_t*>(Q), static_cast<const uint16_t*>(K),
                                                 static_cast<const uint16_t*>(V), W, static_cast<uint16_t*>(O), LSE);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_fast_fwd_kernel");
}

}  // namespace

void launch_fast_forward(const FastLaunch& L, const void* Q, const void* K, const void* V, const float* W, void* O,
                         float* LSE, cudaStream_t stream) {
  if (L.head_dim == 64) {
    if (L.bf16) launch_one<64, true>(L, Q, K, V, W, O, LSE, stream);
    else launch_one<64, false>(L, Q, K, V, W, O, LSE, stream);
  } else {
    if (L.bf16) launch_one<128, true>(L, Q, K, V, W, O, LSE, stream);
    else launch_one<128, false>(L, Q, K, V, W, O, LSE, stream);
  }
}

}  // namespace flashlab::cuda::detail::mta
