// attention_fwd_splitkv.cu — the split-KV forward: few query rows against many keys (decoding one
// token, a chunk of a prompt against a long cache), bf16/fp16, `mma.sync` m16n8k16 with fp32
// accumulation, so it runs on any GPU from sm_80 on.
//
// Why: the other fast forwards give each block one query tile of one head and walk every key. One
// query row against 128k keys then launches B·H blocks of a 128-row tile: a handful of SMs busy,
// 127 of 128 rows wasted, K and V streamed at a few percent of the HBM bandwidth.
// What this one does instead (the same algorithm, names and base-2 online softmax as
// attention_fwd_tc.cu, plus the MTA decode's combine, mta_fast_decode.cu):
//   1. split_kv_fwd_kernel, grid (H_kv · row tiles, splits, B), 4 warps:
//      - Packed rows: the query rows of the H/H_kv heads that share K/V head hk are one list of
//        (H/H_kv)·N rows, row r = query i·(H/H_kv) + head h − hk·(H/H_kv) (query-major, so a row
//        tile spans few query positions and its causal key range stays short). Each K_j/V_j
//        tile is loaded once for the whole group (grouped-query attention by sharing, not by
//        re-reading).
//      - Row tiles of Br = 16 (rows ≤ 16: the four warps split every K/V tile's 64 keys, 16 each,
//        all on the same 16 rows) or Br = 64 (four warps of 16 rows, each over all 64 keys).
//      - Key ranges: the key tiles are cut into `splits` ranges of whole tiles (plan_split_kv: as
//        many as keep one wave of blocks on the device), one block per (row tile, range); causal
//        ranges past the tile's last row's diagonal load nothing.
//      - Per key tile: K_j, V_j HBM → SRAM by cp.async, kStages stages in flight (16-byte chunks,
//        XOR-swizzled, zero-filled past N_k); S = Q_i K_jᵀ and O += P V_j on mma.sync, P in
//        registers; masks (keys ≥ N_k, causal keys > i + N_k − N) only on the tiles that straddle
//        them.
//      - End of the range: the warps' (m_i, l_i, O) are merged through SRAM (several warps share
//        rows in the Br = 16 tiles) into the range's partial: unnormalised O and (m_i, l_i) in
//        fp32. With one range the block writes O = O/l_i in the input dtype and LSE = m_i +
//        log2(l_i) itself (no partials, no second kernel).
//   2. split_kv_combine_kernel, one block of four warps per packed row: M = max m_s,
//      L = Σ 2^(m_s − M) l_s, O = Σ 2^(m_s − M) O_s / L in a fixed order, LSE = M + log2 L (a range
//      that saw no key of the row, m_s = −∞, weighs 0; a row that saw no key at all: O = 0,
//      LSE = −∞). From sm_90 on it is a programmatic dependent launch: it starts while the
//      partial kernel streams and waits for its partials, so the second launch adds no gap.
// Bytes: K and V once from HBM per row tile (once in all when (H/H_kv)·N ≤ Br), Q once, partials
// B·H·N·splits·(d + 2) fp32 written and read once. The partials come from the forwards' pool
// (partial_pool.hpp): the device entry point takes no workspace.
// Instantiations: d ∈ {64, 128} × {bf16, fp16} × {Br = 16, 64}; causal is a run-time flag (the
// mask runs on few tiles, and a decode step is bound by HBM, not by these branches).
//
// Why not more: mma.sync, not wgmma; a Br = 64 block re-reads Q from registers only, so at large
// N the regular forwards (more rows per block, Hopper's instructions) are faster: the front door
// chooses this kernel only where they would leave SMs idle (fastest_forward_kernel(problem)).
//
// How to run: through the attention front door (front_door.cpp), FastForwardKernel::split_kv or the
// automatic choice; `flashlab bench attention --fwd-kernel splitkv` times it.

#include "attention/partial_pool.hpp"
#include "attention/splitkv.hpp"
#include "core/tensor_core.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace flashlab::cuda::detail {
namespace {

// ----------------------------------------------------------------------------- tile parameters
/// One configuration: head dim, warps along the packed rows (16 rows each; the rest of the four
/// warps split each K/V tile's keys), K/V stages.
template <int HEAD_DIM, int kWarpsM_, int kStages_>
struct SplitKvTraits {
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpsM = kWarpsM_;          // warps along the rows
  static constexpr int kWarpsN = kWarps / kWarpsM;  // warps along each tile's keys
  static constexpr int BLOCK_M = 16 * kWarpsM;      // Br
  static constexpr int BLOCK_N = kSplitKvBlockN;    // Bc
  static constexpr int kKeysPerWarp = BLOCK_N / kWarpsN;
  static constexpr int kStages = kStages_;
  static constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row
  static constexpr int kRowBytes = HEAD_DIM * 2;
  static constexpr int kTileQBytes = BLOCK_M * kRowBytes;
  static constexpr int kTileKVBytes = BLOCK_N * kRowBytes;
  static constexpr int kSmemBytes = kTileQBytes + 2 * kStages * kTileKVBytes;
  // End of the range: each warp's fp32 O rows (pitch d + 8: the fragment stores of 8 rows fall in
  // different banks two by two), m and l per warp and row, the block's M and L per row; staged over
  // the K/V stages, which are idle by then.
  static constexpr int kPitch = HEAD_DIM + 8;
  static constexpr int kStageFloats = kWarpsN * BLOCK_M * kPitch + 2 * kWarpsN * BLOCK_M + 2 * BLOCK_M;
  static_assert(kStageFloats * 4 <= 2 * kStages * kTileKVBytes, "the merge fits in the K/V stages");
  static_assert(kKeysPerWarp % 16 == 0, "a warp's keys are whole k16 steps of P·V");
  static_assert(BLOCK_N * kChunks % kThreads == 0, "every thread copies the same number of chunks");
  static_assert(kStages >= 2, "at least double buffering");
};
// d = 128: 3 stages (Br = 64: 112 KiB of SRAM, 2 blocks per SM); d = 64: 4 stages (72 KiB).
template <int HEAD_DIM>
using ShortTraits = SplitKvTraits<HEAD_DIM, 1, HEAD_DIM == 64 ? 4 : 3>;  // Br = 16: decoding
template <int HEAD_DIM>
using RowsTraits = SplitKvTraits<HEAD_DIM, 4, HEAD_DIM == 64 ? 4 : 3>;  // Br = 64

/// Pointers and the plan of one launch.
struct SplitKvArgs {
  const uint16_t* Q;
  const uint16_t* K;
  const uint16_t* V;
  uint16_t* O;
  float* LSE;
  float* O_part;   // [B·H_kv·R][splits][d] unnormalised O of each range (splits > 1)
  float* ml_part;  // [B·H_kv·R][splits][2] (m_i, l_i) of each range (splits > 1)
  int splits, tiles_per_split;
};

// ----------------------------------------------------------------------------- the kernels
/// Grid (H_kv · row tiles, splits, B), 128 threads, T::kSmemBytes of dynamic SRAM:
/// [Q_i: Br × d][K_j: kStages × Bc × d][V_j: kStages × Bc × d], all swizzled.
template <class T, bool kBf16>
__global__ void __launch_bounds__(T::kThreads, 2) split_kv_fwd_kernel(Problem p, SplitKvArgs a) {
  constexpr int D = T::kHeadDim, BLOCK_M = T::BLOCK_M, BLOCK_N = T::BLOCK_N, KW = T::kKeysPerWarp;
  constexpr int kKStepsQK = D / 16;  // k-steps of S = Q Kᵀ (over d)
  constexpr int kNTilesS = KW / 8;   // n8 tiles of this warp's S_ij
  constexpr int kKStepsPV = KW / 16; // k-steps of O += P V (over this warp's keys)
  constexpr int kNTilesO = D / 8;    // n8 tiles of O_i
  constexpr int kRowBytes = T::kRowBytes;
  const float NEG_INF = __int_as_float(0xff800000);  // −inf
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The combine kernel may start now (programmatic dependent launch): its blocks take their SM
  // slots and wait for this grid's partials while the keys stream, instead of launching after the
  // last block has finished. A no-op where no such launch follows (one range).
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif

  const int group = p.heads / p.heads_kv;  // query heads per K/V head
  const int R = group * p.seq;             // packed rows of this (b, hk)
  const int row_tiles = (R + BLOCK_M - 1) / BLOCK_M;
  const int tile = int(blockIdx.x) % row_tiles, hk = int(blockIdx.x) / row_tiles;
  const int split = blockIdx.y, b = blockIdx.z;
  const int row0 = tile * BLOCK_M;
  const int Nk = p.seq_k, offset = p.causal_offset();  // causal: row of query i sees keys ≤ i + offset
  const bool causal = p.causal;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates: row group, thread in group
  const int wm = warp % T::kWarpsM, wn = warp / T::kWarpsM;
  const int warp_m0 = 16 * wm;  // this warp's first row inside the tile

  // This block's key tiles: its range, cut at the diagonal of the tile's last row (causal).
  const int last_row = min(R, row0 + BLOCK_M) - 1;
  const int n_end = causal ? max(0, min(Nk, last_row / group + offset + 1)) : Nk;
  const int t_begin = split * a.tiles_per_split;
  const int t_end = min(t_begin + a.tiles_per_split, (n_end + BLOCK_N - 1) / BLOCK_N);

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sQ = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sK = sQ + T::kTileQBytes;                // + stage · kTileKVBytes
  const uint32_t sV = sK + T::kStages * T::kTileKVBytes;  // + stage · kTileKVBytes

  // The warp's rows: valid ones (< R) and their diagonals (query position + offset).
  const int warp_first = row0 + warp_m0;
  const bool warp_rows = warp_first < R;
  const int warp_diag_min = warp_first / group + offset;
  const int warp_diag_max = (min(R, warp_first + 16) - 1) / group + offset;
  int diag[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) diag[r] = (warp_first + g + 8 * r) / group + offset;

  // acc = 0 (unnormalised O_i), m_i = −inf, l_i = 0; rows g and g + 8 of the warp's m16 tile.
  float acc[kNTilesO][4];
#pragma unroll
  for (int n = 0; n < kNTilesO; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m_i[2] = {NEG_INF, NEG_INF}, l_i[2] = {0.f, 0.f};  // l_i: per-thread partial row sums

  const std::size_t kv_stride = p.kv_row_stride(), kv_base = p.kv_head_offset(b, hk);
  // Load K_j, V_j: HBM → SRAM stage `stage` (keys ≥ N_k zero-filled: no stale SRAM reaches P·V).
  auto load_kv = [&](int j, int stage) {
    const uint32_t off = uint32_t(stage * T::kTileKVBytes);
#pragma unroll
    for (int k = 0; k < BLOCK_N * T::kChunks / T::kThreads; ++k) {
      const int idx = tid + k * T::kThreads, r = idx / T::kChunks, c = idx % T::kChunks;
      const int key = j * BLOCK_N + r;
      const bool ok = key < Nk;
      const std::size_t src = kv_base + std::size_t(ok ? key : 0) * kv_stride + 8 * c;
      cp_async16(sK + off + swz<D>(r, c), a.K + src, ok);
      cp_async16(sV + off + swz<D>(r, c), a.V + src, ok);
    }
  };

  if (t_begin < t_end) {
    // Load Q_i (the packed rows: query i, head hk·group + r mod group) and K_{t_begin}, V_{t_begin}:
    // one cp.async group; then one group per further stage (empty where there is no tile, so the
    // group count stays uniform).
    for (int idx = tid; idx < BLOCK_M * T::kChunks; idx += T::kThreads) {
      const int r = idx / T::kChunks, c = idx % T::kChunks, pr = row0 + r;
      const bool ok = pr < R;
      const int i = ok ? pr / group : 0, h = hk * group + (ok ? pr % group : 0);
      cp_async16(sQ + swz<D>(r, c), a.Q + p.head_offset(b, h) + std::size_t(i) * p.row_stride() + 8 * c, ok);
    }
    load_kv(t_begin, 0);
    cp_async_commit();
#pragma unroll
    for (int st = 1; st < T::kStages - 1; ++st) {
      if (t_begin + st < t_end) load_kv(t_begin + st, st);
      cp_async_commit();
    }

    // ldmatrix lane addresses, as attention_fwd_tc.cu: every fragment row this lane addresses is
    // ≡ lane (mod 8), so the swizzle is a per-lane xor on the chunk offset.
    const int mi = lane >> 3;
    const uint32_t q_lane = sQ + uint32_t((warp_m0 + (lane & 15)) * kRowBytes);
    const uint32_t q_xor = uint32_t(((lane >> 4) ^ (lane & 7)) << 4);
    const uint32_t k_lane = sK + uint32_t((wn * KW + (lane & 7) + ((mi >> 1) << 3)) * kRowBytes);
    const uint32_t k_xor = uint32_t(((mi & 1) ^ (lane & 7)) << 4);
    const uint32_t v_lane = sV + uint32_t((wn * KW + (lane & 7) + ((mi & 1) << 3)) * kRowBytes);
    const uint32_t v_xor = uint32_t(((mi >> 1) ^ (lane & 7)) << 4);
    uint32_t q_frag[kKStepsQK][4];

    for (int j = t_begin; j < t_end; ++j) {
      const int jj = j - t_begin;
      const uint32_t stage_off = uint32_t((jj % T::kStages) * T::kTileKVBytes);
      // kStages − 1 + jj groups are committed; the (jj+1)-th holds K_j, V_j: wait for it.
      cp_async_wait<T::kStages - 2>();
      // Every thread's copies of K_j, V_j (and Q_i) are visible to all warps, and every warp has
      // finished the previous tile, so the stage it read may be refilled below.
      __syncthreads();
      {
        const int jn = j + T::kStages - 1;  // K_jn, V_jn: HBM → SRAM while tile j computes
        if (jn < t_end) load_kv(jn, (jn - t_begin) % T::kStages);
        cp_async_commit();
      }
      if (jj == 0) {
        // Q_i: SRAM → registers once, as mma A fragments.
#pragma unroll
        for (int kk = 0; kk < kKStepsQK; ++kk)
          ldsm_x4(q_lane + ((32 * kk) ^ q_xor), q_frag[kk][0], q_frag[kk][1], q_frag[kk][2], q_frag[kk][3]);
      }

      // This warp's keys of the tile; a warp with no valid row, or (causal) whose rows all lie left
      // of its keys, has nothing to add.
      const int kn0 = j * BLOCK_N + wn * KW;
      if (!warp_rows || kn0 >= Nk || (causal && kn0 > warp_diag_max)) continue;

      // S_ij = Q_i K_jᵀ (raw scores, fp32, registers); K_j B fragments via ldmatrix (non-trans).
      float s[kNTilesS][4];
#pragma unroll
      for (int n = 0; n < kNTilesS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kKStepsQK; ++kk)
#pragma unroll
        for (int np = 0; np < kNTilesS / 2; ++np) {
          uint32_t b0, b1, b2, b3;  // keys 16·np + [0, 16) of the warp's, dims 16·kk + [0, 16)
          ldsm_x4(k_lane + stage_off + 16 * np * kRowBytes + ((32 * kk) ^ k_xor), b0, b1, b2, b3);
          mma16816<kBf16>(s[2 * np], q_frag[kk], b0, b1);
          mma16816<kBf16>(s[2 * np + 1], q_frag[kk], b2, b3);
        }

      // Masks (the Triton walkthrough, "Out-of-Sequence Masking"): keys ≥ N_k, and causal keys
      // > i + N_k − N → −inf; only where the warp's keys straddle N_k or a diagonal.
      if (kn0 + KW > Nk || (causal && kn0 + KW - 1 > warp_diag_min)) {
#pragma unroll
        for (int n = 0; n < kNTilesS; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = kn0 + 8 * n + 2 * t + (e & 1);
            if (col >= Nk || (causal && col > diag[e >> 1])) s[n][e] = NEG_INF;
          }
      }

      // Online softmax (base 2), rows r = g and g + 8: m_new = max(m_i, rowmax(S)·scale·log2 e),
      // P = 2^(S·scale·log2 e − m_new), alpha = 2^(m_i − m_new), l_i = alpha·l_i + rowsum(P),
      // acc = diag(alpha)·acc. A row that has seen only masked scores keeps m = −inf and
      // subtracts 0 instead (2^(−inf) = 0, never 2^(−inf + inf)).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float raw_max = NEG_INF;
#pragma unroll
        for (int n = 0; n < kNTilesS; ++n) raw_max = fmaxf(raw_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
        raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 1));  // the quad holds the row
        raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 2));
        const float m_new = fmaxf(m_i[r], raw_max * p.scale_log2);
        const float m_ref = m_new == NEG_INF ? 0.f : m_new;
        const float alpha = ex2(m_i[r] - m_ref);
        m_i[r] = m_new;
        float row_sum = 0.f;
#pragma unroll
        for (int n = 0; n < kNTilesS; ++n) {
          s[n][2 * r] = ex2(fmaf(s[n][2 * r], p.scale_log2, -m_ref));
          s[n][2 * r + 1] = ex2(fmaf(s[n][2 * r + 1], p.scale_log2, -m_ref));
          row_sum += s[n][2 * r] + s[n][2 * r + 1];
        }
        l_i[r] = l_i[r] * alpha + row_sum;
#pragma unroll
        for (int n = 0; n < kNTilesO; ++n) {
          acc[n][2 * r] *= alpha;
          acc[n][2 * r + 1] *= alpha;
        }
      }

      // acc += P_ij V_j: P rounded to 16 bits in registers is the A fragment; V_j B fragments via
      // ldmatrix.trans.
#pragma unroll
      for (int kk = 0; kk < kKStepsPV; ++kk) {
        uint32_t pa[4];
        pa[0] = pack2<kBf16>(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = pack2<kBf16>(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = pack2<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = pack2<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int np = 0; np < kNTilesO / 2; ++np) {
          uint32_t b0, b1, b2, b3;  // keys 16·kk + [0, 16) of the warp's, dims 16·np + [0, 16)
          ldsm_x4_trans(v_lane + stage_off + 16 * kk * kRowBytes + ((32 * np) ^ v_xor), b0, b1, b2, b3);
          mma16816<kBf16>(acc[2 * np], pa, b0, b1);
          mma16816<kBf16>(acc[2 * np + 1], pa, b2, b3);
        }
      }
    }
  }
  // No copy may still write SRAM (empty groups included), and every warp is done with K_j/V_j: the
  // stages now hold the merge.
  cp_async_wait<0>();
  __syncthreads();

  float* st_o = reinterpret_cast<float*>(smem_raw + T::kTileQBytes);  // [kWarpsN][Br][kPitch]
  float* st_m = st_o + T::kWarpsN * BLOCK_M * T::kPitch;               // [kWarpsN][Br]
  float* st_l = st_m + T::kWarpsN * BLOCK_M;                           // [kWarpsN][Br]
  float* st_M = st_l + T::kWarpsN * BLOCK_M;                           // [Br]
  float* st_L = st_M + BLOCK_M;                                        // [Br]
  // m_i and l_i (reduced over the quad) of each warp's rows → SRAM.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_i[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t == 0) {
      st_m[wn * BLOCK_M + warp_m0 + g + 8 * r] = m_i[r];
      st_l[wn * BLOCK_M + warp_m0 + g + 8 * r] = l;
    }
  }
  __syncthreads();  // every warp's m_i, l_i are in SRAM
  // The block's M = max over its warps, L = Σ 2^(m_w − M) l_w (a warp that saw nothing: m = −inf).
  if (tid < BLOCK_M) {
    float M = NEG_INF;
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) M = fmaxf(M, st_m[w * BLOCK_M + tid]);
    float L = 0.f;
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) {
      const float m = st_m[w * BLOCK_M + tid];
      if (m != NEG_INF) L += st_l[w * BLOCK_M + tid] * ex2(m - M);
    }
    st_M[tid] = M;
    st_L[tid] = L;
  }
  __syncthreads();  // M and L of every row are in SRAM
  // 2^(m_w − M)·acc → SRAM (0 for a warp that saw nothing of the row).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp_m0 + g + 8 * r;
    const float w = m_i[r] == NEG_INF ? 0.f : ex2(m_i[r] - st_M[row]);
    float* dst = st_o + (wn * BLOCK_M + row) * T::kPitch + 2 * t;
#pragma unroll
    for (int n = 0; n < kNTilesO; ++n)
      *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(acc[n][2 * r] * w, acc[n][2 * r + 1] * w);
  }
  __syncthreads();  // every warp's scaled O rows are in SRAM

  // Σ over the warps, four columns per thread, consecutive threads on consecutive columns: the
  // range's partial (fp32), or (one range) O = O/L in the input dtype and LSE = M + log2 L.
  constexpr int kQuads = D / 4;
  for (int idx = tid; idx < BLOCK_M * kQuads; idx += T::kThreads) {
    const int row = idx / kQuads, c = 4 * (idx % kQuads), pr = row0 + row;
    if (pr >= R) continue;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) {
      const float4 v = *reinterpret_cast<const float4*>(st_o + (w * BLOCK_M + row) * T::kPitch + c);
      o.x += v.x, o.y += v.y, o.z += v.z, o.w += v.w;
    }
    const float M = st_M[row], L = st_L[row];
    if (a.splits == 1) {
      const float inv_l = L > 0.f ? 1.f / L : 0.f;  // no key seen: O = 0, LSE = −inf
      const int i = pr / group, h = hk * group + pr % group;
      uint16_t* dst = a.O + p.head_offset(b, h) + std::size_t(i) * p.row_stride() + c;
      *reinterpret_cast<uint2*>(dst) =
          make_uint2(pack2<kBf16>(o.x * inv_l, o.y * inv_l), pack2<kBf16>(o.z * inv_l, o.w * inv_l));
      if (c == 0) a.LSE[p.stat_offset(b, h) + i] = L > 0.f ? M + log2f(L) : NEG_INF;
    } else {
      const std::size_t part = ((std::size_t(b) * p.heads_kv + hk) * R + pr) * a.splits + split;
      *reinterpret_cast<float4*>(a.O_part + part * D + c) = o;
      if (c == 0) *reinterpret_cast<float2*>(a.ml_part + 2 * part) = make_float2(M, L);
    }
  }
}

/// Warps of the combine kernel: one block per packed row, its ranges dealt out round robin.
constexpr int kCombineWarps = 4;

/// One block of kCombineWarps warps per packed row (B·H_kv·R of them): every warp finds M = max m_s
/// and L = Σ 2^(m_s − M) l_s (lanes over the ranges, then shuffles); warp w adds 2^(m_s − M) O_s of
/// the ranges s ≡ w (mod kCombineWarps), d/32 columns per lane, ascending s; the warps' sums meet in
/// SRAM and warp 0 adds them in warp order: O = Σ / L, LSE = M + log2 L. The order is fixed, so the
/// result does not depend on timing. A range with m_s = −inf saw no key of the row: its weight is 0
/// (its O_s, written as 0, adds nothing); a row no range saw gets O = 0, LSE = −inf.
/// Why this shape: the partials were written a moment ago and sit in L2, so the time is L2 round
/// trips: the weights come from the lanes' own (m_s, l_s) loads by shuffle (S ≤ 32) and every O_s
/// load is independent of the others and of the weights, all in flight together with the (m_s, l_s)
/// loads.
template <int D, bool kBf16>
__global__ void __launch_bounds__(32 * kCombineWarps) split_kv_combine_kernel(Problem p, SplitKvArgs a) {
  const float NEG_INF = __int_as_float(0xff800000);  // −inf
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched early (programmatic dependent launch): wait until the partial kernel has finished and
  // its partials are visible. Returns at once after an ordinary launch.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  constexpr int kCols = D / 32;  // 4 (d = 128) or 2 (d = 64) columns per lane
  __shared__ __align__(16) float st_o[kCombineWarps][D];
  const int group = p.heads / p.heads_kv, R = group * p.seq;
  const long long prow = blockIdx.x;  // (b·H_kv + hk)·R + pr
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int S = a.splits;
  const std::size_t first = std::size_t(prow) * S;
  // S ≤ 32 (every decoding plan on today's GPUs): the warp's O_s loads go out now, beside the
  // (m_s, l_s) loads below, not after the weights are known: one L2 round trip instead of two.
  constexpr int kPre = 32 / kCombineWarps;  // ranges per warp when S ≤ 32
  float pre[kPre][kCols];
  if (S <= 32) {
#pragma unroll
    for (int k = 0; k < kPre; ++k) {
      const int s = warp + k * kCombineWarps;
      const float* src = a.O_part + (first + s) * D + lane * kCols;
      if constexpr (kCols == 4) {
        const float4 v = s < S ? *reinterpret_cast<const float4*>(src) : make_float4(0.f, 0.f, 0.f, 0.f);
        pre[k][0] = v.x, pre[k][1] = v.y, pre[k][2] = v.z, pre[k][3] = v.w;
      } else {
        const float2 v = s < S ? *reinterpret_cast<const float2*>(src) : make_float2(0.f, 0.f);
        pre[k][0] = v.x, pre[k][1] = v.y;
      }
    }
  }
  float M = NEG_INF, L = 0.f, m_lane = NEG_INF;  // m_lane: m_s of range s = lane
  for (int s = lane; s < S; s += 32) {
    const float2 ml = *reinterpret_cast<const float2*>(a.ml_part + 2 * (first + s));
    if (s == lane) m_lane = ml.x;
    if (ml.x == NEG_INF) continue;
    const float m_new = fmaxf(M, ml.x);
    L = (M == NEG_INF ? 0.f : L * ex2(M - m_new)) + ml.y * ex2(ml.x - m_new);
    M = m_new;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float M_o = __shfl_xor_sync(0xffffffffu, M, off), L_o = __shfl_xor_sync(0xffffffffu, L, off);
    const float m_new = fmaxf(M, M_o);
    if (m_new == NEG_INF) continue;  // neither side saw a key (uniform per pair: both stay −inf, 0)
    L = (M == NEG_INF ? 0.f : L * ex2(M - m_new)) + (M_o == NEG_INF ? 0.f : L_o * ex2(M_o - m_new));
    M = m_new;
  }
  const float w_lane = m_lane == NEG_INF ? 0.f : ex2(m_lane - M);  // weight of range s = lane
  float o[kCols] = {};
  if (S <= 32) {
#pragma unroll
    for (int k = 0; k < kPre; ++k) {
      const int s = warp + k * kCombineWarps;
      const float w = __shfl_sync(0xffffffffu, w_lane, s);  // every lane: s < 32
      if (s < S) {
#pragma unroll
        for (int c = 0; c < kCols; ++c) o[c] = fmaf(w, pre[k][c], o[c]);
      }
    }
  }
#pragma unroll 8
  for (int s = warp; S > 32 && s < S; s += kCombineWarps) {  // more ranges than lanes: weights loaded here
    const float m = a.ml_part[2 * (first + s)];
    const float w = m == NEG_INF ? 0.f : ex2(m - M);
    const float* src = a.O_part + (first + s) * D + lane * kCols;
    if constexpr (kCols == 4) {
      const float4 v = *reinterpret_cast<const float4*>(src);
      o[0] = fmaf(w, v.x, o[0]), o[1] = fmaf(w, v.y, o[1]), o[2] = fmaf(w, v.z, o[2]), o[3] = fmaf(w, v.w, o[3]);
    } else {
      const float2 v = *reinterpret_cast<const float2*>(src);
      o[0] = fmaf(w, v.x, o[0]), o[1] = fmaf(w, v.y, o[1]);
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) st_o[warp][lane * kCols + c] = o[c];
  __syncthreads();  // every warp's sum is in SRAM
  if (warp != 0) return;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    o[c] = st_o[0][lane * kCols + c];
#pragma unroll
    for (int w = 1; w < kCombineWarps; ++w) o[c] += st_o[w][lane * kCols + c];
  }
  const int pr = int(prow % R), bk = int(prow / R), hk = bk % p.heads_kv, b = bk / p.heads_kv;
  const int i = pr / group, h = hk * group + pr % group;
  const float inv_l = L > 0.f ? 1.f / L : 0.f;
  uint16_t* dst = a.O + p.head_offset(b, h) + std::size_t(i) * p.row_stride() + lane * kCols;
  if constexpr (kCols == 4)
    *reinterpret_cast<uint2*>(dst) =
        make_uint2(pack2<kBf16>(o[0] * inv_l, o[1] * inv_l), pack2<kBf16>(o[2] * inv_l, o[3] * inv_l));
  else
    *reinterpret_cast<uint32_t*>(dst) = pack2<kBf16>(o[0] * inv_l, o[1] * inv_l);
  if (lane == 0) a.LSE[p.stat_offset(b, h) + i] = L > 0.f ? M + log2f(L) : NEG_INF;
}

// ----------------------------------------------------------------------------- launchers
/// The current device's SM count and compute capability (major).
struct DeviceShape {
  int sms = 0, major = 0;
};
DeviceShape device_shape() {
  int dev = 0;
  DeviceShape d;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev));
  return d;
}

template <class T, bool kBf16>
void launch_one(const Problem& p, SplitKvArgs a, cudaStream_t stream) {
  auto kernel = &split_kv_fwd_kernel<T, kBf16>;
  // > 48 KiB of dynamic SRAM: opted in per device (set_smem keeps the record, thread-safe).
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmemBytes, "split_kv_fwd_kernel", p);
  int resident = 0;
  FLASHLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, T::kThreads, T::kSmemBytes));
  const DeviceShape dev = device_shape();
  const SplitKvPlan plan = plan_split_kv(p, dev.sms, std::max(1, resident));
  a.splits = plan.splits;
  a.tiles_per_split = plan.tiles_per_split;
  const std::size_t rows = std::size_t(p.batch) * p.heads * p.seq;  // B·H_kv·R packed rows
  void* partials = nullptr;
  if (plan.splits > 1) {
    const std::size_t slots = rows * std::size_t(plan.splits);
    partials = allocate_partials(slots * (T::kHeadDim + 2) * sizeof(float), stream);
    a.O_part = static_cast<float*>(partials);
    a.ml_part = a.O_part + slots * T::kHeadDim;
  }
  const dim3 grid(unsigned(p.heads_kv) * unsigned(plan.row_tiles), unsigned(plan.splits), unsigned(p.batch));
  announce("split_kv_fwd_kernel");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p, a);
  FLASHLAB_CUDA_CHECK_LAUNCH("split_kv_fwd_kernel");
  if (plan.splits == 1) return;
  announce("split_kv_combine_kernel");
  // One block per packed row; from sm_90 on a programmatic dependent launch (the partial kernel
  // lets it start early, it waits in griddepcontrol.wait): the launch latency hides behind the
  // partial kernel instead of following it. Stream capture records it as a programmatic edge.
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(rows));
  config.blockDim = dim3(32 * kCombineWarps);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute early{};
  early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &early;
  config.numAttrs = dev.major >= 9 ? 1 : 0;
  FLASHLAB_CUDA_CHECK(cudaLaunchKernelEx(&config, split_kv_combine_kernel<T::kHeadDim, kBf16>, p, a));
  FLASHLAB_CUDA_CHECK_LAUNCH("split_kv_combine_kernel");
  free_partials(partials, stream);
}

template <int HEAD_DIM, bool kBf16>
void launch_dim(const Problem& p, const SplitKvArgs& a, cudaStream_t stream) {
  if (split_kv_block_m(p) == ShortTraits<HEAD_DIM>::BLOCK_M) launch_one<ShortTraits<HEAD_DIM>, kBf16>(p, a, stream);
  else launch_one<RowsTraits<HEAD_DIM>, kBf16>(p, a, stream);
}

}  // namespace

int split_kv_block_m(const Problem& p) {
  static_assert(ShortTraits<64>::BLOCK_M == ShortTraits<128>::BLOCK_M && RowsTraits<64>::BLOCK_M == RowsTraits<128>::BLOCK_M,
                "one Br per list length at both head dims");
  const long long rows = (long long)(p.heads / p.heads_kv) * p.seq;
  return rows <= ShortTraits<64>::BLOCK_M ? ShortTraits<64>::BLOCK_M : RowsTraits<64>::BLOCK_M;
}

SplitKvPlan plan_split_kv(const Problem& p, int sms, int resident) {
  SplitKvPlan plan;
  plan.block_m = split_kv_block_m(p);
  const long long rows = (long long)(p.heads / p.heads_kv) * p.seq;
  const long long row_tiles = (rows + plan.block_m - 1) / plan.block_m;
  if (row_tiles * p.heads_kv > 0x7fffffffLL || p.batch > 65535)
    throw std::invalid_argument("flashlab::cuda: split-KV forward: B = " + std::to_string(p.batch) + ", H_kv = " +
                                std::to_string(p.heads_kv) + " and " + std::to_string(row_tiles) +
                                " row tiles exceed the grid (hint: at most 65535 sequences per call)");
  plan.row_tiles = int(row_tiles);
  const long long blocks = (long long)p.batch * p.heads_kv * row_tiles;  // one per row tile and range
  const long long key_tiles = std::max(1LL, ((long long)p.seq_k + kSplitKvBlockN - 1) / kSplitKvBlockN);
  // As many ranges as keep every block in one wave (at least one, at most one per key tile), then
  // as few as hold those tiles evenly.
  const long long wave = (long long)std::max(1, sms) * std::max(1, resident);
  const long long splits = std::min(key_tiles, std::max(1LL, wave / blocks));
  plan.tiles_per_split = int((key_tiles + splits - 1) / splits);
  plan.splits = int((key_tiles + plan.tiles_per_split - 1) / plan.tiles_per_split);
  return plan;
}

void launch_fast_split_kv(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, void* O,
                          float* LSE, cudaStream_t stream) {
  const SplitKvArgs a{static_cast<const uint16_t*>(Q), static_cast<const uint16_t*>(K), static_cast<const uint16_t*>(V),
                      static_cast<uint16_t*>(O), LSE, nullptr, nullptr, 1, 0};
  if (p.head_dim == 64) {
    if (bf16) launch_dim<64, true>(p, a, stream);
    else launch_dim<64, false>(p, a, stream);
  } else {
    if (bf16) launch_dim<128, true>(p, a, stream);
    else launch_dim<128, false>(p, a, stream);
  }
}

}  // namespace flashlab::cuda::detail
