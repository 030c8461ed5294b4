// stream_fast_apply.cu — the fast STREAM mask application ("Real-Time Sparse Tracing at
// Million-Token Context", §6) and its trace (the edge records, at the end of the file) on tensor cores: bf16/fp16 in, fp32 accumulation, mma.sync
// m16n8k16. The clear fp32 kernel (stream_apply.cu) is the same procedure one scalar at a time.
//
// One thread block per group of G neighbouring query blocks q0 … q0 + G − 1 of one head h, four
// warps per query block (16 query rows each, b_q = b_k = 64):
//   1. Schedule (SRAM): the union of the G rows I[h, q, :], deduplicated and sorted by r, each
//      entry with a bit per query block that kept it. A K_r, V_r that several of the G query
//      blocks kept is loaded from HBM once for all of them.
//   2. Q_q of every query block: HBM → SRAM (cp.async) → registers (ldmatrix) once.
//   3. For each scheduled r, K_r, V_r: HBM → SRAM with cp.async, kStages buffers (the next tiles
//      are in flight while this one computes); the warps of a query block that did not keep r skip
//      the math. S = Q_q K_rᵀ (mma, fp32), −inf where s > t (only r = q can hold such pairs: b_q =
//      b_k, and I holds causally valid blocks only; keys ≥ T sit right of every row < T);
//      online softmax m_i, l_i in base 2 (ℓ·log2 e: the unscaled logits of the reference with
//      natural exponentials); P rounded to 16 bits in registers is the A operand of O += P V_r.
//   4. O_q = acc / l_i → HBM in the input dtype; l_i = 0 (no valid kept key) → 0. A NaN logit of
//      a valid pair reaches P and l_i and leaves the row NaN, as the reference's row.
// Rows ≥ T of a partial last block are computed on zero-filled Q rows and never stored; K, V rows
// ≥ T are zero-filled (cp.async src-size 0), so no stale SRAM reaches P·V.
#include "core/common.hpp"
#include "stream/stream_fast_common.hpp"
#include "core/tensor_core.cuh"

#include <cstdint>

namespace flashlab::cuda::stream::detail {
namespace {

using ::flashlab::cuda::detail::cp_async16;
using ::flashlab::cuda::detail::cp_async_commit;
using ::flashlab::cuda::detail::cp_async_wait;
using ::flashlab::cuda::detail::ex2;
using ::flashlab::cuda::detail::ldsm_x4;
using ::flashlab::cuda::detail::ldsm_x4_trans;
using ::flashlab::cuda::detail::mma16816;
using ::flashlab::cuda::detail::pack2;
using ::flashlab::cuda::detail::swz;

constexpr int kBlock = kFastBlock;    // b_q = b_k
constexpr int kWarpsPerQBlock = kBlock / 16;
constexpr float kLog2e = 1.4426950408889634f;

template <int HEAD_DIM, int G>
struct ApplyTraits {
  static constexpr int kThreads = 32 * kWarpsPerQBlock * G;
  static constexpr int kStages = 2;
  static constexpr int kChunks = HEAD_DIM / 8;                 // 16-byte chunks per row
  static constexpr int kTileBytes = kBlock * HEAD_DIM * 2;     // one 64-row tile
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static_assert(kBlock % kRowsPerPass == 0 && kRowsPerPass % 8 == 0, "swizzle must be pass-invariant");
  // One query block per thread block: Q_q is staged in the second K buffer (it moves to registers
  // before that buffer is first refilled): d = 128 fits three thread blocks per SM, d = 64 four.
  static constexpr bool kQInKStage = G == 1;
  static constexpr int kQBytes = kQInKStage ? 0 : G * kTileBytes;
  static constexpr int kTileSmem = kQBytes + 2 * kStages * kTileBytes;  // [Q_q …] K stages, V stages
  static constexpr int kMinBlocks = kQInKStage ? (HEAD_DIM == 128 ? 3 : 4) : 1;  // thread blocks per SM
};

/// Entries of the schedule buffer: G·k rounded up to a power of two (the bitonic sort's width).
__host__ __device__ inline int schedule_slots(int G, int k) {
  int n = 1;
  while (n < G * k) n *= 2;
  return n;
}

/// Rows [row0, row0 + 64) of head h of x ([T, H, d]) → a swizzled SRAM tile; rows ≥ T zero.
template <class Tr, int HEAD_DIM>
__device__ __forceinline__ void load_tile(uint32_t smem, const uint16_t* x, std::size_t head, std::size_t stride,
                                          int row0, int T) {
  const int r = int(threadIdx.x) / Tr::kChunks, c = int(threadIdx.x) % Tr::kChunks;
#pragma unroll
  for (int pass = 0; pass < kBlock / Tr::kRowsPerPass; ++pass) {
    const int rr = r + pass * Tr::kRowsPerPass, row = row0 + rr;
    const bool ok = row < T;
    cp_async16(smem + swz<HEAD_DIM>(rr, c), x + head + std::size_t(ok ? row : 0) * stride + 8 * c, ok);
  }
}

/// An L2 policy that marks the lines a load brings in as the first to evict: for tiles a thread
/// block reads for the last time, so that they do not push out the ones it will read again.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

/// load_tile with an L2 eviction policy on every 16-byte copy (cp.async's cache hint; the bytes
/// that land in SRAM are the same).
template <class Tr, int HEAD_DIM>
__device__ __forceinline__ void load_tile_hinted(uint32_t smem, const uint16_t* x, std::size_t head, std::size_t stride,
                                                 int row0, int T, uint64_t policy) {
  const int r = int(threadIdx.x) / Tr::kChunks, c = int(threadIdx.x) % Tr::kChunks;
#pragma unroll
  for (int pass = 0; pass < kBlock / Tr::kRowsPerPass; ++pass) {
    const int rr = r + pass * Tr::kRowsPerPass, row = row0 + rr;
    const bool ok = row < T;
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem + swz<HEAD_DIM>(rr, c)),
                 "l"(x + head + std::size_t(ok ? row : 0) * stride + 8 * c), "r"(ok ? 16 : 0), "l"(policy));
  }
}

/// A range launch's description: the whole problem and the query blocks q_first … q_first + q_count − 1.
struct FastApplyRange {
  FastApplyLaunch p;
  int q_first = 0;
  int q_count = 0;
};

/// The query blocks a launch covers: the whole sequence (0 … n_q − 1) …
struct WholeSequence {
  int n_q;
  __device__ __forceinline__ int first() const { return 0; }
  __device__ __forceinline__ int count() const { return n_q; }
};

/// … or a range (FastApplyRange), its bounds read where they are used. (Each form keeps the machine
/// code its kernel had when it was measured: cuda/bench/cubin_diff.py.)
struct QueryBlockSpan {
  const FastApplyRange& r;
  __device__ __forceinline__ int first() const { return r.q_first; }
  __device__ __forceinline__ int count() const { return r.q_count; }
};

/// Step 1: the union of the G rows I[h, q0 … q0 + G − 1, :] as packed entries (r << 4) | bits
/// (bit g: query block q0 + g kept r; G ≤ 2), sorted by r, duplicates merged, in sched[0 … n); returns
/// n. Bitonic sort of (r << 2 | g) keys over all threads, then one thread merges the runs (at
/// most G equal r in a row: I has no duplicates within a row). All threads; ends with a barrier.
template <class Span>
__device__ int build_schedule(const FastApplyLaunch& p, const Span& span, const long long* __restrict__ I, int q0, int G,
                              int* sched) {
  const int q_end = span.first() + span.count();  // I holds the span's rows
  const int n = G * p.k, width = schedule_slots(G, p.k), h = blockIdx.y;
  constexpr int kEmpty = 0x7fffffff;  // sorts last
  for (int e = threadIdx.x; e < width; e += blockDim.x) {
    const int q = q0 + e / p.k;
    const long long r =
        e < n && q < q_end ? I[(std::size_t(h) * span.count() + (q - span.first())) * p.k + e % p.k] : -1;
    sched[e] = r < 0 ? kEmpty : int(r) << 2 | (e / p.k);
  }
  for (int size = 2; size <= width; size *= 2)
    for (int stride = size / 2; stride > 0; stride /= 2) {
      __syncthreads();
      for (int e = threadIdx.x; e < width; e += blockDim.x) {
        const int partner = e ^ stride;
        if (partner <= e) continue;
        const bool ascending = (e & size) == 0;
        const int a = sched[e], b = sched[partner];
        if ((a > b) == ascending) sched[e] = b, sched[partner] = a;
      }
    }
  __syncthreads();
  __shared__ int count;
  if (threadIdx.x == 0) {
    int out = 0;  // in place: the write position never passes the read position
    for (int e = 0; e < width && sched[e] != kEmpty;) {
      const int r = sched[e] >> 2;
      int bits = 0;
      for (; e < width && sched[e] != kEmpty && sched[e] >> 2 == r; ++e) bits |= 1 << (sched[e] & 3);
      sched[out++] = r << 4 | bits;
    }
    count = out;
  }
  __syncthreads();
  return count;
}

/// S = Q_q K_rᵀ for the warp's 16 rows (raw logits, fp32): B fragments of K_r by ldmatrix from the
/// stage at `k_base` (lane address, swizzle xor `k_xor`).
template <int HEAD_DIM, bool kBf16>
__device__ __forceinline__ void scores_tile(float (&s)[kBlock / 8][4], const uint32_t (&q_frag)[HEAD_DIM / 16][4],
                                            uint32_t k_base, uint32_t k_xor) {
#pragma unroll
  for (int n = 0; n < kBlock / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
#pragma unroll
    for (int np = 0; np < kBlock / 16; ++np) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(k_base + 16 * np * HEAD_DIM * 2 + ((32 * kk) ^ k_xor), b0, b1, b2, b3);
      mma16816<kBf16>(s[2 * np], q_frag[kk], b0, b1);
      mma16816<kBf16>(s[2 * np + 1], q_frag[kk], b2, b3);
    }
}

/// The diagonal block r = q: s > t → −inf (this also covers keys ≥ T of a partial last block).
/// Thread (g, t) holds rows warp_m0 + g (+ 8) and columns 8n + 2t (+ 1).
__device__ __forceinline__ void mask_diagonal(float (&s)[kBlock / 8][4], int warp_m0, int g, int t) {
#pragma unroll
  for (int n = 0; n < kBlock / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (8 * n + 2 * t + (e & 1) > warp_m0 + g + 8 * (e >> 1)) s[n][e] = __int_as_float(0xff800000);
}

/// Online softmax of rows g and g + 8 in base 2 (ℓ·log2 e: the reference's natural exponentials):
/// m_new = max(m_i, rowmax ℓ·log2 e), P = 2^(ℓ·log2 e − m_new) in place of S,
/// l_i = l_i·2^(m_i − m_new) + rowsum P (per-thread partial sums), acc rescaled alike.
template <int HEAD_DIM>
__device__ __forceinline__ void online_softmax(float (&s)[kBlock / 8][4], float (&m_i)[2], float (&l_i)[2],
                                               float (&acc)[HEAD_DIM / 8][4]) {
  const float NEG_INF = __int_as_float(0xff800000);
  float alpha[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float raw_max = NEG_INF;  // fmaxf skips NaN: a NaN logit reaches P through ex2 below
#pragma unroll
    for (int n = 0; n < kBlock / 8; ++n) raw_max = fmaxf(raw_max, fmaxf(s[n][2 * rr], s[n][2 * rr + 1]));
    raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 1));  // a quad holds one row
    raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 2));
    const float m_new = fmaxf(m_i[rr], raw_max * kLog2e);
    const float m_ref = m_new == NEG_INF ? 0.f : m_new;  // all −inf so far: 2^(−inf − 0) = 0, not NaN
    alpha[rr] = ex2(m_i[rr] - m_ref);
    m_i[rr] = m_new;
    float row_sum = 0.f;
#pragma unroll
    for (int n = 0; n < kBlock / 8; ++n) {
      s[n][2 * rr] = ex2(fmaf(s[n][2 * rr], kLog2e, -m_ref));
      s[n][2 * rr + 1] = ex2(fmaf(s[n][2 * rr + 1], kLog2e, -m_ref));
      row_sum += s[n][2 * rr] + s[n][2 * rr + 1];
    }
    l_i[rr] = l_i[rr] * alpha[rr] + row_sum;
  }
#pragma unroll
  for (int n = 0; n < HEAD_DIM / 8; ++n) {
    acc[n][0] *= alpha[0];
    acc[n][1] *= alpha[0];
    acc[n][2] *= alpha[1];
    acc[n][3] *= alpha[1];
  }
}

/// acc += P V_r: P rounded to 16 bits in registers is the A operand (the C layout of two n8 tiles
/// is the A layout of one k16 step); V_r fragments by ldmatrix.trans from the stage at `v_base`.
template <int HEAD_DIM, bool kBf16>
__device__ __forceinline__ void accumulate_pv(float (&acc)[HEAD_DIM / 8][4], const float (&s)[kBlock / 8][4],
                                              uint32_t v_base, uint32_t v_xor) {
#pragma unroll
  for (int kk = 0; kk < kBlock / 16; ++kk) {
    uint32_t a[4];
    a[0] = pack2<kBf16>(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack2<kBf16>(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack2<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack2<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
    for (int np = 0; np < HEAD_DIM / 16; ++np) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_trans(v_base + 16 * kk * HEAD_DIM * 2 + ((32 * np) ^ v_xor), b0, b1, b2, b3);
      mma16816<kBf16>(acc[2 * np], a, b0, b1);
      mma16816<kBf16>(acc[2 * np + 1], a, b2, b3);
    }
  }
}

/// O rows = acc / l_i → HBM in the input dtype (rows row0 + g and row0 + 8 + g, those < T);
/// l_i = 0 (no valid kept key) → 0, l_i NaN (a NaN logit) → NaN.
template <int HEAD_DIM, bool kBf16>
__device__ __forceinline__ void store_rows(uint16_t* __restrict__ O, const float (&acc)[HEAD_DIM / 8][4],
                                           const float (&l_i)[2], int row0, int T, std::size_t head,
                                           std::size_t stride, int g, int t) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = l_i[rr];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv_l = l > 0.f ? 1.f / l : (l == 0.f ? 0.f : __int_as_float(0x7fc00000));
    const int row = row0 + g + 8 * rr;
    if (row < T) {
      uint16_t* out = O + head + std::size_t(row) * stride + 2 * t;
#pragma unroll
      for (int n = 0; n < HEAD_DIM / 8; ++n)
        *reinterpret_cast<uint32_t*>(out + 8 * n) = pack2<kBf16>(acc[n][2 * rr] * inv_l, acc[n][2 * rr + 1] * inv_l);
    }
  }
}

/// One thread block's G query blocks q_first + G·x … of head y: Q and O rows are local to the
/// range's first query block, I holds the range's rows, K and V rows are global (the whole-sequence
/// kernel below: q_first = 0, q_count = n_q). Dynamic SRAM: [Q_q: G × 64 × d]
/// [K_r: kStages × 64 × d][V_r: kStages × 64 × d] (swizzled) [schedule].
template <int HEAD_DIM, int G, bool kBf16, class Span>
__device__ __forceinline__ void apply_query_blocks(const FastApplyLaunch& p, const Span& span,
                                                   const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                                                   const uint16_t* __restrict__ V, const long long* __restrict__ I,
                                                   uint16_t* __restrict__ O) {
  using Tr = ApplyTraits<HEAD_DIM, G>;
  constexpr int kKStepsQK = HEAD_DIM / 16, kNTilesO = HEAD_DIM / 8, kRowBytes = HEAD_DIM * 2;
  const float NEG_INF = __int_as_float(0xff800000);
  const int q0 = span.first() + int(blockIdx.x) * G, h = blockIdx.y;
  const int local_rows = p.T - span.first() * kBlock;  // rows of Q and O from the span's first token on
  const std::size_t stride = std::size_t(p.heads) * HEAD_DIM, head = std::size_t(h) * HEAD_DIM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gq = warp / kWarpsPerQBlock, q = q0 + gq;  // this warp's query block
  const int warp_m0 = 16 * (warp % kWarpsPerQBlock);    // its first row inside Q_q
  const int g = lane >> 2, t = lane & 3;                // mma fragment row group, thread in group

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sK = base + Tr::kQBytes, sV = sK + Tr::kStages * Tr::kTileBytes;
  const uint32_t sQ = Tr::kQInKStage ? sK + Tr::kTileBytes : base;
  int* sched = reinterpret_cast<int*>(smem_raw + Tr::kTileSmem);

  // Q_q of the G query blocks: one cp.async group, in flight while the schedule is built.
  for (int b = 0; b < G; ++b)
    load_tile<Tr, HEAD_DIM>(sQ + b * Tr::kTileBytes, Q, head, stride, (q0 + b - span.first()) * kBlock,
                                           local_rows);
  cp_async_commit();
  const int n_sched = build_schedule(p, span, I, q0, G, sched);
  for (int st = 0; st < Tr::kStages - 1; ++st) {
    if (st < n_sched) {
      const int r = sched[st] >> 4;
      load_tile<Tr, HEAD_DIM>(sK + st * Tr::kTileBytes, K, head, stride, r * kBlock, p.T);
      load_tile<Tr, HEAD_DIM>(sV + st * Tr::kTileBytes, V, head, stride, r * kBlock, p.T);
    }
    cp_async_commit();
  }

  // ldmatrix row addresses (as attention_fwd_tc.cu: lane base + ((32·k) ^ lane xor)).
  const int mi = lane >> 3;
  const uint32_t q_lane = sQ + uint32_t(gq * Tr::kTileBytes + (warp_m0 + (lane & 15)) * kRowBytes);
  const uint32_t q_xor = uint32_t(((lane >> 4) ^ (lane & 7)) << 4);
  const uint32_t k_lane = sK + uint32_t(((lane & 7) + ((mi >> 1) << 3)) * kRowBytes);
  const uint32_t k_xor = uint32_t(((mi & 1) ^ (lane & 7)) << 4);
  const uint32_t v_lane = sV + uint32_t(((lane & 7) + ((mi & 1) << 3)) * kRowBytes);
  const uint32_t v_xor = uint32_t(((mi >> 1) ^ (lane & 7)) << 4);

  float acc[kNTilesO][4];
#pragma unroll
  for (int n = 0; n < kNTilesO; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m_i[2] = {NEG_INF, NEG_INF}, l_i[2] = {0.f, 0.f};  // m_i in base-2 units; l_i per thread
  uint32_t q_frag[kKStepsQK][4];

  for (int j = 0; j < n_sched; ++j) {
    const uint32_t stage_off = uint32_t((j % Tr::kStages) * Tr::kTileBytes);
    cp_async_wait<Tr::kStages - 2>();  // K_r, V_r of step j (and Q_q) have landed for this thread
    __syncthreads();                   // … for every thread; step j − 1's stage is free
    if (j == 0) {  // Q_q: SRAM → registers once
#pragma unroll
      for (int kk = 0; kk < kKStepsQK; ++kk)
        ldsm_x4(q_lane + ((32 * kk) ^ q_xor), q_frag[kk][0], q_frag[kk][1], q_frag[kk][2], q_frag[kk][3]);
      if (Tr::kQInKStage) __syncthreads();  // every warp has its Q_q before the buffer is refilled
    }
    const int jn = j + Tr::kStages - 1;
    if (jn < n_sched) {
      const uint32_t next = uint32_t((jn % Tr::kStages) * Tr::kTileBytes);
      const int rn = sched[jn] >> 4;
      load_tile<Tr, HEAD_DIM>(sK + next, K, head, stride, rn * kBlock, p.T);
      load_tile<Tr, HEAD_DIM>(sV + next, V, head, stride, rn * kBlock, p.T);
    }
    cp_async_commit();
    const int entry = sched[j], r = entry >> 4;
    if (!((entry >> gq) & 1)) continue;  // this warp's query block did not keep r (warp-uniform)

    float s[kBlock / 8][4];
    scores_tile<HEAD_DIM, kBf16>(s, q_frag, k_lane + stage_off, k_xor);
    if (r == q) mask_diagonal(s, warp_m0, g, t);
    online_softmax<HEAD_DIM>(s, m_i, l_i, acc);
    accumulate_pv<HEAD_DIM, kBf16>(acc, s, v_lane + stage_off, v_xor);
  }
  cp_async_wait<0>();  // no copy may still be writing SRAM when the block exits

  if (q < span.first() + span.count())
    store_rows<HEAD_DIM, kBf16>(O, acc, l_i, (q - span.first()) * kBlock + warp_m0, local_rows, head, stride, g, t);
}

/// Grid (⌈n_q / G⌉, H), ApplyTraits::kThreads threads: the whole sequence (apply_query_blocks).
template <int HEAD_DIM, int G, bool kBf16>
__global__ void __launch_bounds__(ApplyTraits<HEAD_DIM, G>::kThreads, ApplyTraits<HEAD_DIM, G>::kMinBlocks)
    stream_fast_apply_kernel(FastApplyLaunch p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                             const uint16_t* __restrict__ V, const long long* __restrict__ I,
                             uint16_t* __restrict__ O) {
  apply_query_blocks<HEAD_DIM, G, kBf16>(p, WholeSequence{p.n_q}, Q, K, V, I, O);
}

/// Grid (q_count, H), one query block per thread block: the range's query blocks.
template <int HEAD_DIM, bool kBf16>
__global__ void __launch_bounds__(ApplyTraits<HEAD_DIM, 1>::kThreads, ApplyTraits<HEAD_DIM, 1>::kMinBlocks)
    stream_fast_apply_range_kernel(FastApplyRange range, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                                   const uint16_t* __restrict__ V, const long long* __restrict__ I,
                                   uint16_t* __restrict__ O) {
  apply_query_blocks<HEAD_DIM, 1, kBf16>(range.p, QueryBlockSpan{range}, Q, K, V, I, O);
}

template <int HEAD_DIM, bool kBf16>
void launch_range(const FastApplyLaunch& p, int q_first, int q_count, const void* Q, const void* K, const void* V,
                  const long long* I, void* O, cudaStream_t stream) {
  using Tr = ApplyTraits<HEAD_DIM, 1>;
  auto kernel = &stream_fast_apply_range_kernel<HEAD_DIM, kBf16>;
  const std::size_t smem = std::size_t(Tr::kTileSmem) + std::size_t(schedule_slots(1, p.k)) * sizeof(int);
  ::flashlab::cuda::detail::opt_in_smem(reinterpret_cast<const void*>(kernel), smem,
                                        "stream_fast_apply_range_kernel");
  ::flashlab::cuda::detail::announce("stream_fast_apply_range_kernel");
  FastApplyRange range;
  range.p = p;
  range.q_first = q_first;
  range.q_count = q_count;
  kernel<<<dim3(unsigned(q_count), unsigned(p.heads)), Tr::kThreads, smem, stream>>>(
      range, static_cast<const uint16_t*>(Q), static_cast<const uint16_t*>(K), static_cast<const uint16_t*>(V), I,
      static_cast<uint16_t*>(O));
  FLASHLAB_CUDA_CHECK_LAUNCH("stream_fast_apply_range_kernel");
}

template <int HEAD_DIM, int G>
std::size_t smem_bytes(int k) {
  return std::size_t(ApplyTraits<HEAD_DIM, G>::kTileSmem) + std::size_t(schedule_slots(G, k)) * sizeof(int);
}

template <int HEAD_DIM, int G, bool kBf16>
void launch_one(const FastApplyLaunch& p, const void* Q, const void* K, const void* V, const long long* I, void* O,
                cudaStream_t stream) {
  using Tr = ApplyTraits<HEAD_DIM, G>;
  auto kernel = &stream_fast_apply_kernel<HEAD_DIM, G, kBf16>;
  const std::size_t smem = smem_bytes<HEAD_DIM, G>(p.k);
  ::flashlab::cuda::detail::opt_in_smem(reinterpret_cast<const void*>(kernel), smem,
                                        "stream_fast_apply_kernel");
  ::flashlab::cuda::detail::announce("stream_fast_apply_kernel");
  const dim3 grid((p.n_q + G - 1) / G, p.heads);
  kernel<<<grid, Tr::kThreads, smem, stream>>>(p, static_cast<const uint16_t*>(Q), static_cast<const uint16_t*>(K),
                                               static_cast<const uint16_t*>(V), I, static_cast<uint16_t*>(O));
  FLASHLAB_CUDA_CHECK_LAUNCH("stream_fast_apply_kernel");
}

template <int HEAD_DIM, bool kBf16>
void launch_dim(const FastApplyLaunch& p, int group, const void* Q, const void* K, const void* V, const long long* I,
                void* O, cudaStream_t stream) {
  if (group == 1) launch_one<HEAD_DIM, 1, kBf16>(p, Q, K, V, I, O, stream);
  else launch_one<HEAD_DIM, 2, kBf16>(p, Q, K, V, I, O, stream);
}


// ---------------------------------------------------------------------------------- trace
// The fast trace: one record (q, r, slot, score, mass, value_norm) per entry of I, the clear
// trace kernel's quantities (stream_apply.cu) on tensor cores. Only the records are wanted, so
// no O is written: one thread block per (query block, head), four warps of 16 rows, two passes
// over the kept blocks —
//   A. S = Q_q K_rᵀ for every kept r (K only, three tiles in flight): each row's final m_i, l_i
//      (base 2, as the apply);
//   B. last slot first: S again, P = 2^(S·log2 e − m_i) / l_i on the valid pairs, and per block
//      pair: the largest raw logit (score), Σ P (mass), and ‖colsum(P V_r)‖ (value_norm) from P V_r
//      on tensor cores (P rounded to 16 bits as the apply's A operand) summed over the 64 rows.
//      Without value_norm (kValueNorm = false: a store that keeps only key blocks and mass) pass B
//      reads no V: it streams K like pass A, starting from the four tiles pass A left in SRAM, and
//      computes score and mass by the same instructions in the same order, so they are the same
//      bits; value_norm is NaN.
// Records go in I's slot order, whatever the schedule: slot j of (h, q) at ((h·n_q + q)·k + j).

/// Sum over the 32 lanes of a warp; every lane gets it.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Maximum over the 32 lanes of a warp (NaN skipped, as fmaxf); every lane gets it.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Grid (n_q, heads launched), 128 threads: grid row y is head head0 + y of Q, K, V and row y of I
/// and of the records (the launch's heads only, in head order); dynamic SRAM: [K_r: 2 stages][V_r:
/// 2 stages] (swizzled; pass A streams K through all four, and Q_q passes through one of them),
/// then the reduction slots [4 warps][2 + d] floats. kValueNorm = false: no V is read and no
/// value_norm computed (NaN), pass B streams K through all four buffers (see the file's top).
template <int HEAD_DIM, bool kBf16, bool kValueNorm>
__global__ void __launch_bounds__(128, 3)
    stream_fast_trace_kernel(FastApplyLaunch p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                             const uint16_t* __restrict__ V, const long long* __restrict__ I,
                             FastEdgeRecord* __restrict__ edges, int head0, int q_first) {
  using Tr = ApplyTraits<HEAD_DIM, 1>;
  constexpr int kKStepsQK = HEAD_DIM / 16, kNTilesO = HEAD_DIM / 8, kRowBytes = HEAD_DIM * 2;
  constexpr int kStages = Tr::kStages;
  static_assert(kStages == 2, "the passes alternate two stages");
  const float NEG_INF = __int_as_float(0xff800000);
  const int q = q_first + int(blockIdx.x), h = head0 + int(blockIdx.y);
  const std::size_t stride = std::size_t(p.heads) * HEAD_DIM, head = std::size_t(h) * HEAD_DIM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m0 = 16 * warp, g = lane >> 2, t = lane & 3;
  const long long* row_I = I + (std::size_t(blockIdx.y) * p.n_q + q) * p.k;
  FastEdgeRecord* out = edges + (std::size_t(blockIdx.y) * p.n_q + q) * p.k;

  // Kept entries come first in a row of I (empties are last): n_kept of them.
  __shared__ int n_kept_s;
  if (threadIdx.x == 0) {
    int n = 0;
    while (n < p.k && row_I[n] >= 0) ++n;
    n_kept_s = n;
  }
  for (int j = threadIdx.x; j < p.k; j += blockDim.x)
    if (row_I[j] < 0) out[j] = FastEdgeRecord{q, -1, j, 0.f, 0.f, 0.f};
  __syncthreads();
  const int n_kept = n_kept_s;
  if (n_kept == 0) return;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem_raw));
  const uint32_t sK = base, sV = sK + kStages * Tr::kTileBytes;
  float* red = reinterpret_cast<float*>(smem_raw + Tr::kTileSmem);  // [4][2 + HEAD_DIM]
  // Pass A needs no V, so it streams K through all four tile buffers (K stages, then V stages:
  // buffer b at base + b·tile), three tiles in flight instead of one. Slot j goes to buffer
  // (n_kept − 1 − j) mod 4, so pass A ends with the last slot in buffer 0 and the one before in
  // buffer 1 — K stages 0 and 1 of pass B, which starts there. Q_q passes through the buffer of
  // slot 3, filled only after Q_q is in registers.
  const auto buf_a = [&](int j) { return base + uint32_t(((n_kept - 1 - j) & 3) * Tr::kTileBytes); };
  const uint32_t sQ = buf_a(3);
  // Q_q and V_r are read once, and pass B reads each K_r for the last time: their lines go first
  // when L2 needs room, so pass A's K_r lines stay for pass B to read again.
  const uint64_t last_use = l2_evict_first_policy();

  load_tile_hinted<Tr, HEAD_DIM>(sQ, Q, head, stride, q * kBlock, p.T, last_use);
  cp_async_commit();
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    if (j < n_kept) load_tile<Tr, HEAD_DIM>(buf_a(j), K, head, stride, int(row_I[j]) * kBlock, p.T);
    cp_async_commit();
  }

  const int mi = lane >> 3;
  const uint32_t q_lane = sQ + uint32_t((warp_m0 + (lane & 15)) * kRowBytes);
  const uint32_t q_xor = uint32_t(((lane >> 4) ^ (lane & 7)) << 4);
  const uint32_t k_lane = sK + uint32_t(((lane & 7) + ((mi >> 1) << 3)) * kRowBytes);
  const uint32_t k_xor = uint32_t(((mi & 1) ^ (lane & 7)) << 4);
  const uint32_t v_lane = sV + uint32_t(((lane & 7) + ((mi & 1) << 3)) * kRowBytes);
  const uint32_t v_xor = uint32_t(((mi >> 1) ^ (lane & 7)) << 4);

  // Q_q → registers before its buffer (slot 3's) is filled.
  uint32_t q_frag[kKStepsQK][4];
  cp_async_wait<3>();
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < kKStepsQK; ++kk)
    ldsm_x4(q_lane + ((32 * kk) ^ q_xor), q_frag[kk][0], q_frag[kk][1], q_frag[kk][2], q_frag[kk][3]);
  __syncthreads();

  // Pass A: the rows' final statistics over every kept block (K only).
  float m_i[2] = {NEG_INF, NEG_INF}, l_i[2] = {0.f, 0.f};
  for (int j = 0; j < n_kept; ++j) {
    // Slot j + 3 goes to the buffer of slot j − 1, which every warp has finished.
    if (j + 3 < n_kept) load_tile<Tr, HEAD_DIM>(buf_a(j + 3), K, head, stride, int(row_I[j + 3]) * kBlock, p.T);
    cp_async_commit();
    cp_async_wait<3>();  // K_r of step j has landed for this thread
    __syncthreads();     // … for every thread
    const int r = int(row_I[j]);
    float s[kBlock / 8][4];
    scores_tile<HEAD_DIM, kBf16>(s, q_frag, k_lane + (buf_a(j) - base), k_xor);
    if (r == q) mask_diagonal(s, warp_m0, g, t);
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float raw_max = NEG_INF;
#pragma unroll
      for (int n = 0; n < kBlock / 8; ++n) raw_max = fmaxf(raw_max, fmaxf(s[n][2 * rr], s[n][2 * rr + 1]));
      raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 1));
      raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 2));
      const float m_new = fmaxf(m_i[rr], raw_max * kLog2e);
      const float m_ref = m_new == NEG_INF ? 0.f : m_new;
      float row_sum = 0.f;
#pragma unroll
      for (int n = 0; n < kBlock / 8; ++n)
        row_sum += ex2(fmaf(s[n][2 * rr], kLog2e, -m_ref)) + ex2(fmaf(s[n][2 * rr + 1], kLog2e, -m_ref));
      l_i[rr] = l_i[rr] * ex2(m_i[rr] - m_ref) + row_sum;
      m_i[rr] = m_new;
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  // l_i over the quad: each row's full sum; rows ≥ T and rows that see no kept key attend to nothing.
  float inv_l[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = l_i[rr];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = q * kBlock + warp_m0 + g + 8 * rr;
    inv_l[rr] = row < p.T && l > 0.f ? 1.f / l : 0.f;
    if (!(l == l)) inv_l[rr] = l;  // a NaN logit leaves the row NaN, as the apply's
  }

  float* red_w = red + warp * (2 + HEAD_DIM);
  // score: the largest raw logit of a valid pair (−inf entries are the masked ones; rows ≥ T are
  // left out); mass: Σ P. Both passes B compute them with these instructions, so a store of mass
  // only gets the bits of one with value_norm. On return s holds P (0 on rows ≥ T).
  const auto score_mass = [&](float (&s)[kBlock / 8][4], float& best, float& mass) {
    best = NEG_INF;
    mass = 0.f;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const bool row_ok = q * kBlock + warp_m0 + g + 8 * rr < p.T;
      const float m_ref = m_i[rr] == NEG_INF ? 0.f : m_i[rr];
#pragma unroll
      for (int n = 0; n < kBlock / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[n][2 * rr + e];
          if (row_ok) best = fmaxf(best, x);
          x = row_ok ? ex2(fmaf(x, kLog2e, -m_ref)) * inv_l[rr] : 0.f;
          mass += x;
        }
    }
  };

  if constexpr (!kValueNorm) {
    // Pass B without V, last slot first: step b handles slot j = n_kept − 1 − b in buffer
    // buf_a(j) = b mod 4. Pass A ended with its last four slots in the four buffers, so steps 0 … 3
    // load nothing; step b ≥ 1 loads the tile of step b + 3 into the buffer of step b − 1, which
    // every warp has finished (the second barrier of step b − 1).
    for (int b = 0; b < n_kept; ++b) {
      const int j = n_kept - 1 - b;
      if (b >= 1 && j >= 3)
        load_tile_hinted<Tr, HEAD_DIM>(buf_a(j - 3), K, head, stride, int(row_I[j - 3]) * kBlock, p.T, last_use);
      cp_async_commit();
      cp_async_wait<3>();  // the tile of step b (committed at step b − 3, or by pass A) has landed
      __syncthreads();     // … for every thread
      const int r = int(row_I[j]);
      float s[kBlock / 8][4];
      scores_tile<HEAD_DIM, kBf16>(s, q_frag, k_lane + (buf_a(j) - base), k_xor);
      if (r == q) mask_diagonal(s, warp_m0, g, t);
      float best, mass;
      score_mass(s, best, mass);
      best = warp_max(best);
      mass = warp_sum(mass);
      if (lane == 0) red_w[0] = best, red_w[1] = mass;
      // Every warp is done with this step's buffer and its slots are written. The next step's
      // slot writes come after its first barrier, which thread 0 reaches only after reading these.
      __syncthreads();
      if (threadIdx.x == 0) {
        const float sc = fmaxf(fmaxf(red[0], red[2 + HEAD_DIM]), fmaxf(red[2 * (2 + HEAD_DIM)], red[3 * (2 + HEAD_DIM)]));
        const float ms = red[1] + red[(2 + HEAD_DIM) + 1] + red[2 * (2 + HEAD_DIM) + 1] + red[3 * (2 + HEAD_DIM) + 1];
        out[j] = FastEdgeRecord{q, r, j, sc, ms, __int_as_float(0x7fc00000)};
      }
    }
    cp_async_wait<0>();
    return;
  }

  // Pass B: the records, K_r and V_r of each kept block, last slot first: step b handles slot
  // n_kept − 1 − b in stage b mod 2. K_r of the first two steps is still in K stages 0 and 1 from
  // pass A, so only their V_r is loaded (two tiles fewer per query block), and the K_r loaded again
  // are the ones pass A read most recently. A record depends only on its own block and the rows'
  // final statistics, so the order moves no bit.
  load_tile_hinted<Tr, HEAD_DIM>(sV, V, head, stride, int(row_I[n_kept - 1]) * kBlock, p.T, last_use);
  cp_async_commit();
  for (int b = 0; b < n_kept; ++b) {
    const int j = n_kept - 1 - b;
    const uint32_t stage_off = uint32_t((b % kStages) * Tr::kTileBytes);
    if (j > 0) {
      const uint32_t next = uint32_t(((b + 1) % kStages) * Tr::kTileBytes);
      if (b >= 1) load_tile_hinted<Tr, HEAD_DIM>(sK + next, K, head, stride, int(row_I[j - 1]) * kBlock, p.T, last_use);
      load_tile_hinted<Tr, HEAD_DIM>(sV + next, V, head, stride, int(row_I[j - 1]) * kBlock, p.T, last_use);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int r = int(row_I[j]);
    float s[kBlock / 8][4];
    scores_tile<HEAD_DIM, kBf16>(s, q_frag, k_lane + stage_off, k_xor);
    if (r == q) mask_diagonal(s, warp_m0, g, t);
    float best, mass;
    score_mass(s, best, mass);
    float acc[kNTilesO][4];
#pragma unroll
    for (int n = 0; n < kNTilesO; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    accumulate_pv<HEAD_DIM, kBf16>(acc, s, v_lane + stage_off, v_xor);
    best = warp_max(best);
    mass = warp_sum(mass);
    // Column sums of P V_r over the warp's 16 rows: rows g and g + 8 in a thread, then over g.
#pragma unroll
    for (int n = 0; n < kNTilesO; ++n) {
      float c0 = acc[n][0] + acc[n][2], c1 = acc[n][1] + acc[n][3];
#pragma unroll
      for (int o = 4; o < 32; o *= 2) {
        c0 += __shfl_xor_sync(0xffffffffu, c0, o);
        c1 += __shfl_xor_sync(0xffffffffu, c1, o);
      }
      if (g == 0) red_w[2 + 8 * n + 2 * t] = c0, red_w[2 + 8 * n + 2 * t + 1] = c1;
    }
    if (lane == 0) red_w[0] = best, red_w[1] = mass;
    __syncthreads();
    // One warp combines the four: score, mass, and the squared norm of the summed columns.
    if (warp == 0) {
      float sq = 0.f;
      for (int c = lane; c < HEAD_DIM; c += 32) {
        const float v = red[2 + c] + red[(2 + HEAD_DIM) + 2 + c] + red[2 * (2 + HEAD_DIM) + 2 + c] +
                        red[3 * (2 + HEAD_DIM) + 2 + c];
        sq += v * v;
      }
      sq = warp_sum(sq);
      if (lane == 0) {
        const float sc = fmaxf(fmaxf(red[0], red[2 + HEAD_DIM]), fmaxf(red[2 * (2 + HEAD_DIM)], red[3 * (2 + HEAD_DIM)]));
        const float ms = red[1] + red[(2 + HEAD_DIM) + 1] + red[2 * (2 + HEAD_DIM) + 1] + red[3 * (2 + HEAD_DIM) + 1];
        out[j] = FastEdgeRecord{q, r, j, sc, ms, sqrtf(sq)};
      }
    }
    __syncthreads();  // the stage and the reduction slots are free again
  }
  cp_async_wait<0>();
}

template <int HEAD_DIM>
std::size_t trace_smem() {
  return std::size_t(ApplyTraits<HEAD_DIM, 1>::kTileSmem) + 4 * (2 + HEAD_DIM) * sizeof(float);
}

template <int HEAD_DIM, bool kBf16>
void launch_trace_one(const FastApplyLaunch& p, int head0, int head_count, const void* Q, const void* K,
                      const void* V, const long long* I, FastEdgeRecord* edges, cudaStream_t stream,
                      int q_first, int q_count, bool value_norm) {
  auto kernel = value_norm ? &stream_fast_trace_kernel<HEAD_DIM, kBf16, true>
                           : &stream_fast_trace_kernel<HEAD_DIM, kBf16, false>;
  const std::size_t smem = trace_smem<HEAD_DIM>();
  ::flashlab::cuda::detail::opt_in_smem(reinterpret_cast<const void*>(kernel), smem, "stream_fast_trace_kernel");
  ::flashlab::cuda::detail::announce("stream_fast_trace_kernel");
  kernel<<<dim3(q_count, head_count), 128, smem, stream>>>(p, static_cast<const uint16_t*>(Q),
                                                         static_cast<const uint16_t*>(K),
                                                         static_cast<const uint16_t*>(V), I, edges, head0, q_first);
  FLASHLAB_CUDA_CHECK_LAUNCH("stream_fast_trace_kernel");
}

}  // namespace

std::size_t fast_apply_smem_bytes(int head_dim, int group, int k) {
  if (head_dim == 64) return group == 1 ? smem_bytes<64, 1>(k) : smem_bytes<64, 2>(k);
  return group == 1 ? smem_bytes<128, 1>(k) : smem_bytes<128, 2>(k);
}

void launch_fast_apply(const FastApplyLaunch& p, int head_dim, int group, bool bf16, const void* Q, const void* K,
                       const void* V, const long long* I, void* O, cudaStream_t stream) {
  if (head_dim == 64) {
    if (bf16) launch_dim<64, true>(p, group, Q, K, V, I, O, stream);
    else launch_dim<64, false>(p, group, Q, K, V, I, O, stream);
  } else {
    if (bf16) launch_dim<128, true>(p, group, Q, K, V, I, O, stream);
    else launch_dim<128, false>(p, group, Q, K, V, I, O, stream);
  }
}

void launch_fast_apply_range(const FastApplyLaunch& p, int q_first, int q_count, int head_dim, bool bf16, const void* Q,
                             const void* K, const void* V, const long long* I, void* O, cudaStream_t stream) {
  if (head_dim == 64) {
    if (bf16) launch_range<64, true>(p, q_first, q_count, Q, K, V, I, O, stream);
    else launch_range<64, false>(p, q_first, q_count, Q, K, V, I, O, stream);
  } else {
    if (bf16) launch_range<128, true>(p, q_first, q_count, Q, K, V, I, O, stream);
    else launch_range<128, false>(p, q_first, q_count, Q, K, V, I, O, stream);
  }
}

std::size_t fast_trace_smem_bytes(int head_dim) { return head_dim == 64 ? trace_smem<64>() : trace_smem<128>(); }

void launch_fast_trace(const FastApplyLaunch& p, int head0, int head_count, int head_dim, bool bf16, const void* Q,
                       const void* K, const void* V, const long long* I, FastEdgeRecord* edges, cudaStream_t stream,
                       int q_first, int q_count, bool value_norm) {
  if (q_count < 0) q_count = p.n_q - q_first;
  if (head_dim == 64) {
    if (bf16) launch_trace_one<64, true>(p, head0, head_count, Q, K, V, I, edges, stream, q_first, q_count, value_norm);
    else launch_trace_one<64, false>(p, head0, head_count, Q, K, V, I, edges, stream, q_first, q_count, value_norm);
  } else {
    if (bf16) launch_trace_one<128, true>(p, head0, head_count, Q, K, V, I, edges, stream, q_first, q_count, value_norm);
    else launch_trace_one<128, false>(p, head0, head_count, Q, K, V, I, edges, stream, q_first, q_count, value_norm);
  }
}

}  // namespace flashlab::cuda::stream::detail
