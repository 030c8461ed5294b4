// stream_fast_estimate.cu — STREAM mask estimation, the fast bf16 kernel ("Real-Time Sparse
// Tracing at Million-Token Context", §2, §5, App. A/B): the procedure of the clear kernel
// (stream_estimate.cu) and the reference (reference/src/stream/stream_estimate.cpp), with the
// tile scores on tensor cores and every branch kept in shared memory.
//
// One thread block of 4 warps per (query block q, head h); b_q = b_k = 64, d ∈ {64, 128}:
//   Q_q: HBM → SRAM → registers once, as mma A fragments (the 4 warps split each 64 × 64 tile
//        2 × 2: warp w owns query rows 32·(w mod 2) + [0, 32) and keys 32·(w div 2) + [0, 32),
//        so each warp reads half of every K_r tile from SRAM)
//   [lo, hi], the k initial branches and their representatives (first valid block)   (App. A)
//   every round: split each kept branch; the half holding the parent's representative inherits
//   it and its score, the other half gets a fresh representative — the round's only new K
//   blocks (≤ k); score them; keep the top k by τ                                     (App. B)
//   I[q, j] = representative of the j-th kept branch
// Scoring a round's fresh representatives is a pipeline over their K_r tiles: cp.async copies
// HBM → SRAM through kStages swizzled buffers (kStages − 1 tiles in flight while one is scored),
// each warp computes its 32 × 32 slice of S = Q_q K_rᵀ with mma.sync (bf16 in, fp32 accumulate,
// the k-steps over d in a fixed order), takes the masked max over its registers and the warp
// (order-free: `v > best`, so NaN never wins and counts as −inf), and the 4 warp maxima are
// combined in a fixed order. Four thread blocks share an SM (at d = 128 three K_r buffers each, so
// that four fit), so while one waits for its next round's K tiles the others compute: the L2 → SM
// stream of K tiles, not the round-to-round latency, sets the time (docs/stream.md, "The fast bf16
// estimate").
//
// τ: the candidates of one round have disjoint ranges, so their representatives are distinct and
// (score ↓, r ↑) decides τ completely; branch_id and split_bit (the reference's last keys) can
// never be reached and are not stored. Top-k is a rank sort (candidate i goes to position
// #{j : τ puts j first}), so there are no atomics and I is the same in every run.
// Query blocks are launched last first: the work per block grows with its admissible range, so
// the long ones start early and the short ones fill the tail.
#include "stream/stream_common.hpp"
#include "stream/stream_tile.cuh"
#include "core/tensor_core.cuh"
#include "stream/stream_fast_common.hpp"
#include "stream/stream_fast_estimate_launch.hpp"

namespace flashlab::cuda::stream::detail {

namespace {

using ::flashlab::cuda::detail::cp_async16;
using ::flashlab::cuda::detail::cp_async_commit;
using ::flashlab::cuda::detail::cp_async_wait;
using ::flashlab::cuda::detail::ldsm_x4;
using ::flashlab::cuda::detail::mma16816;
using ::flashlab::cuda::detail::swz;

constexpr int kBlock = kFastBlock;  // b_q = b_k
constexpr int kWarps = 4;   // 2 × 2 warps over the 64 × 64 tile
constexpr int kWarpRows = 32;  // query rows per warp (two m16 tiles)
constexpr int kWarpKeys = 32;  // keys per warp (four n8 tiles)
constexpr int kFastThreads = 32 * kWarps;

/// Compile-time shape of one instantiation: head dim, K_r buffers, thread blocks per SM.
template <int HEAD_DIM>
struct FastEstimateTraits {
  static constexpr int kStages = HEAD_DIM == 128 ? 3 : 4;  // K_r tiles in SRAM (kStages − 1 in flight)
  static constexpr int kMinBlocks = 4;
  static constexpr int kRowBytes = HEAD_DIM * 2;
  static constexpr int kTileBytes = kBlock * kRowBytes;  // one 64 × d bf16 tile
  static constexpr int kKSteps = HEAD_DIM / 16;          // mma k-steps over d
};

/// One candidate of a round: its branch [lo, hi], representative r (−1: no valid block) and score
/// (never NaN: a NaN product never wins the max). `fresh`: r is new and its score not yet computed.
struct FastCandidate {
  float score;
  int r;
  int lo, hi;
  int fresh;
};

/// τ restricted to what can decide it within a round (tau_before_by_score): valid first, score
/// descending, r ascending.
__device__ __forceinline__ bool tau_before(const FastCandidate& a, const FastCandidate& b) {
  return tau_before_by_score(a.r, a.score, b.r, b.score);
}

/// max that a NaN never wins (the reference's `v > best ? v : best`).
__device__ __forceinline__ float max_no_nan(float best, float v) { return v > best ? v : best; }

/// Per-block state shared by all threads.
struct FastShared {
  int lo, hi;     // admissible range [lo, hi] of C_blk[q, *]; lo = −1: no valid block
  int n_cur;      // kept branches in cur (τ order)
  int n_fresh;    // fresh representatives listed in `fresh`
  int splittable; // some kept branch has more than one block
  float dropped;  // score of the best dropped candidate (rank k) of the last round
  float margin;   // smallest decision gap so far
};

/// Shared memory besides the K_r buffers: cur [k], next [2k], the fresh list [k], warp maxima [4k].
struct FastArrays {
  FastCandidate* cur;
  FastCandidate* next;
  int* fresh;
  float* warp_max;
};

/// rows t0 .. t0 + 63 of head h of X ([rows, H, d] bf16) → a swizzled SRAM tile; rows ≥ `rows` are
/// zero-filled (cp.async src-size 0; the address is then row 0's, never read), so no stale SRAM
/// reaches the mma. All threads; no commit. A thread copies the same 16-byte chunk c of every
/// kFastThreads / kChunks-th row, so its source advances by a fixed stride: one pointer step per
/// row instead of a [T, H, d] index product (this runs once per scored tile).
template <int HEAD_DIM>
__device__ __forceinline__ void load_tile_async(uint32_t dst, const uint16_t* __restrict__ X, const StreamProblem& p,
                                                int h, int t0, int rows) {
  constexpr int kChunks = HEAD_DIM / 8;                  // 16-byte chunks per row
  constexpr int kRowsPerStep = kFastThreads / kChunks;   // rows the block covers per step
  const int c = int(threadIdx.x) % kChunks, row0 = int(threadIdx.x) / kChunks;
  const std::size_t stride = std::size_t(p.heads) * HEAD_DIM;  // elements from one token's row to the next
  const uint16_t* head0 = X + p.at(0, h, HEAD_DIM) + 8 * c;    // this thread's chunk of token 0
  const uint16_t* src = head0 + std::size_t(t0 + row0) * stride;
#pragma unroll
  for (int it = 0; it < kBlock / kRowsPerStep; ++it) {
    const int row = row0 + it * kRowsPerStep;
    const bool ok = t0 + row < rows;
    cp_async16(dst + swz<HEAD_DIM>(row, c), ok ? src : head0, ok);
    src += kRowsPerStep * stride;
  }
}

/// This warp's part of score(q, r): the max over its 32 query rows × 32 keys of S = Q_q K_rᵀ
/// (warp w: rows 32·(w mod 2) + [0, 32), keys 32·(w div 2) + [0, 32)), token-valid entries only
/// (s ≤ t, t < T). `qf`: this warp's Q_q fragments (two m16 tiles); `k_lane_addr`: this lane's
/// ldmatrix row address in the K_r tile being scored.
template <int HEAD_DIM>
__device__ __forceinline__ float warp_tile_max(const uint32_t (&qf)[2][HEAD_DIM / 16][4], uint32_t k_lane_addr,
                                               uint32_t k_xor, const StreamProblem& p, int q, int r) {
  using T = FastEstimateTraits<HEAD_DIM>;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int m0 = kWarpRows * (warp & 1), n0 = kWarpKeys * (warp >> 1);
  float s[2][kWarpKeys / 8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < kWarpKeys / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < T::kKSteps; ++kk)
#pragma unroll
    for (int np = 0; np < kWarpKeys / 16; ++np) {
      uint32_t b0, b1, b2, b3;  // keys n0 + 16·np + [0, 16), dims 16·kk + [0, 16)
      ldsm_x4(k_lane_addr + (n0 + 16 * np) * T::kRowBytes + ((32 * kk) ^ k_xor), b0, b1, b2, b3);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma16816<true>(s[mt][2 * np], qf[mt][kk], b0, b1);
        mma16816<true>(s[mt][2 * np + 1], qf[mt][kk], b2, b3);
      }
    }
  // Fragment coordinates: in m16 tile mt this thread holds rows g, g + 8 and columns 8n + 2c + {0, 1}.
  const int g = lane >> 2, c = lane & 3;
  const int t0 = q * kBlock + m0, s0 = r * kBlock + n0;
  // Only a slice that reaches the diagonal or the end of the sequence has invalid entries; the
  // others (nearly all) take the max without the per-entry validity test. Both paths visit the
  // entries in the same order, so the result is the same bits.
  const bool need_mask = s0 + kWarpKeys - 1 > t0 || t0 + kWarpRows - 1 >= p.T;
  float best = stream_neg_inf();
  if (!need_mask) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int n = 0; n < kWarpKeys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) best = max_no_nan(best, s[mt][n][e]);
  } else {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int n = 0; n < kWarpKeys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = t0 + 16 * mt + g + 8 * (e >> 1), sk = s0 + 8 * n + 2 * c + (e & 1);
          if (t < p.T && sk <= t) best = max_no_nan(best, s[mt][n][e]);
        }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) best = max_no_nan(best, __shfl_xor_sync(0xffffffffu, best, off));
  return best;
}

/// Scores the fresh representatives next[fresh[0 .. n)]: a cp.async pipeline over their K_r tiles
/// (kStages − 1 in flight), each tile reduced by all 4 warps; the warp maxima are combined in a
/// fixed order (warp 0 first). Every thread calls it; on return the scores are visible to all.
template <int HEAD_DIM>
__device__ __forceinline__ void score_fresh(const StreamProblem& p, const uint16_t* __restrict__ K, int q, int h, int k,
                            const uint32_t (&qf)[2][HEAD_DIM / 16][4], uint32_t sK, uint32_t k_lane, uint32_t k_xor,
                            FastArrays a, int n) {
  using T = FastEstimateTraits<HEAD_DIM>;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
#pragma unroll
  for (int st = 0; st < T::kStages - 1; ++st) {
    if (st < n) load_tile_async<HEAD_DIM>(sK + st * T::kTileBytes, K, p, h, a.next[a.fresh[st]].r * kBlock, p.T);
    cp_async_commit();  // an empty group where there is no tile keeps the group count uniform
  }
  for (int i = 0; i < n; ++i) {
    // kStages − 1 + i groups are committed; the (i+1)-th holds tile i.
    cp_async_wait<T::kStages - 2>();
    __syncthreads();  // tile i visible to every warp; every warp is done with tile i − 1's buffer
    const int in = i + T::kStages - 1;
    if (in < n)
      load_tile_async<HEAD_DIM>(sK + (in % T::kStages) * T::kTileBytes, K, p, h, a.next[a.fresh[in]].r * kBlock, p.T);
    cp_async_commit();
    const int r = a.next[a.fresh[i]].r;
    const float m = warp_tile_max<HEAD_DIM>(qf, k_lane + uint32_t((i % T::kStages) * T::kTileBytes), k_xor, p, q, r);
    if (lane == 0) a.warp_max[warp * k + i] = m;
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < n; i += kFastThreads) {
    float best = a.warp_max[i];
    for (int w = 1; w < kWarps; ++w) best = max_no_nan(best, a.warp_max[w * k + i]);
    a.next[a.fresh[i]].score = best;
    a.next[a.fresh[i]].fresh = 0;
  }
  __syncthreads();
}

/// The fresh list: indices of next[0 .. n) whose representative needs a score, in index order
/// (warp 0, one ballot per 32 candidates).
__device__ void list_fresh(FastArrays a, int n, FastShared& st) {
  if (threadIdx.x < 32) {
    const int lane = int(threadIdx.x);
    int count = 0;
    for (int base = 0; base < n; base += 32) {
      const int i = base + lane;
      const bool f = i < n && a.next[i].fresh;
      const unsigned ballot = __ballot_sync(0xffffffffu, f);
      if (f) a.fresh[count + __popc(ballot & ((1u << lane) - 1u))] = i;
      count += __popc(ballot);
    }
    if (lane == 0) st.n_fresh = count;
  }
  __syncthreads();
}

/// Top-k of next[0 .. n) by τ into cur[0 .. min(k, valid)); records the decision gap at rank k and
/// whether another round can split anything.
__device__ void keep_top_k(FastArrays a, int n, int k, FastShared& st) {
  int valid = 0;  // uniform: every thread gets the block-wide count
  for (int base = 0; base < n; base += kFastThreads) {
    const int i = base + int(threadIdx.x);
    valid += __syncthreads_count(i < n && a.next[i].r >= 0);
  }
  for (int i = int(threadIdx.x); i < n; i += kFastThreads) {
    const FastCandidate c = a.next[i];
    if (c.r < 0) continue;  // invalid: never kept
    int rank = 0;
    for (int j = 0; j < n; ++j) rank += tau_before(a.next[j], c) ? 1 : 0;
    if (rank < k) a.cur[rank] = c;
    if (rank == k) st.dropped = c.score;
  }
  __syncthreads();
  const int n_cur = valid < k ? valid : k;
  const int tid = int(threadIdx.x);
  const int splittable = __syncthreads_or(tid < n_cur && a.cur[tid].lo < a.cur[tid].hi);
  if (tid == 0) {
    st.n_cur = n_cur;
    st.splittable = splittable;
    if (valid > k) st.margin = fminf(st.margin, score_gap(a.cur[k - 1].score, st.dropped));
  }
  __syncthreads();
}

/// The initial partition of [lo, hi]: nb = min(k, L) branches, the first L mod nb one block longer;
/// each gets its first valid block as a fresh representative (r = −1 for a user-mask hole).
__device__ void initial_branches(const StreamProblem& p, const std::uint64_t* mask, int q, FastArrays a, int nb,
                                 const FastShared& st) {
  const int L = st.hi - st.lo + 1;
  for (int i = int(threadIdx.x); i < nb; i += kFastThreads) {
    const int extra = i < L % nb ? i : L % nb;  // longer branches before branch i
    FastCandidate c;
    c.lo = st.lo + i * (L / nb) + extra;
    c.hi = c.lo + L / nb + (i < L % nb ? 1 : 0) - 1;
    c.r = first_valid(p, mask, q, c.lo, c.hi);
    c.score = stream_neg_inf();
    c.fresh = c.r >= 0 ? 1 : 0;
    a.next[i] = c;
  }
  __syncthreads();
}

/// Splits kept branch cur[i] into next[2i] (left, ⌈len/2⌉ blocks) and next[2i+1] (right). The half
/// that holds the parent's representative inherits it and its score; the other half's first
/// valid block is fresh. A one-block branch is its own left half; its right half is invalid.
__device__ void split_branches(const StreamProblem& p, const std::uint64_t* mask, int q, FastArrays a, int n) {
  for (int i = int(threadIdx.x); i < n; i += kFastThreads) {
    const FastCandidate b = a.cur[i];
    FastCandidate left, right;
    const bool right_fresh = bisect_branch(b, left, right);
    left.fresh = right.fresh = 0;
    if (right_fresh) {
      right.r = first_valid(p, mask, q, right.lo, right.hi);
      right.score = stream_neg_inf();
      right.fresh = right.r >= 0 ? 1 : 0;
    }
    a.next[2 * i] = left;
    a.next[2 * i + 1] = right;
  }
  __syncthreads();
}

/// I[q, ·], the scores beside it and the margin (−1 / NaN for missing entries).
__device__ void write_row(const StreamProblem& p, FastArrays a, const FastShared& st, long long* I, float* scores,
                          float* margins, std::size_t row) {
  for (int j = int(threadIdx.x); j < p.k; j += kFastThreads) {
    I[row * p.k + j] = j < st.n_cur ? a.cur[j].r : -1;
    if (scores) scores[row * p.k + j] = j < st.n_cur ? a.cur[j].score : NAN;
  }
  if (threadIdx.x == 0 && margins) {
    float m = st.margin;  // neighbours of the final list: their order is I's order
    for (int j = 1; j < st.n_cur; ++j) m = fminf(m, score_gap(a.cur[j - 1].score, a.cur[j].score));
    margins[row] = m;
  }
}

/// One thread block's query block: grid column x is query block q_first + q_count − 1 − x, grid row
/// y head head0 + y of Q and K and row y of I, scores and margins (the launch's heads and query
/// blocks only, in that order). Q holds the tokens of query blocks q_first … from its row 0; K is
/// indexed by global token, like q, T, n_k and every score, so a range's rows are bitwise those of a
/// whole-sequence launch (q_first = 0, q_count = n_q: the kernel below). Dynamic SRAM: kStages K_r
/// tiles (Q_q passes through the first), then cur [k], next [2k], the fresh list [k], the warp
/// maxima [4k].
template <int HEAD_DIM>
__device__ __forceinline__ void estimate_query_block(const StreamProblem& p, const uint16_t* __restrict__ Q,
                                                     const uint16_t* __restrict__ K,
                                                     const std::uint64_t* __restrict__ mask, long long* __restrict__ I,
                                                     float* __restrict__ scores, float* __restrict__ margins,
                                                     int head0, int q_first, int q_count) {
  using T = FastEstimateTraits<HEAD_DIM>;
  const int q_local = q_count - 1 - int(blockIdx.x), h = head0 + int(blockIdx.y);  // longest ranges first
  const int q = q_first + q_local;
  const std::size_t row = std::size_t(blockIdx.y) * q_count + q_local;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sK = uint32_t(__cvta_generic_to_shared(smem_raw));
  FastArrays a;
  a.cur = reinterpret_cast<FastCandidate*>(smem_raw + T::kStages * T::kTileBytes);
  a.next = a.cur + p.k;
  a.fresh = reinterpret_cast<int*>(a.next + 2 * p.k);
  a.warp_max = reinterpret_cast<float*>(a.fresh + p.k);
  __shared__ FastShared st;

  // Q_q: HBM → SRAM (the first K buffer) → registers, once (§5).
  load_tile_async<HEAD_DIM>(sK, Q, p, h, q_local * kBlock, p.T - q_first * kBlock);
  cp_async_commit();
  if (threadIdx.x == 0) {
    const int last_c = p.causal_last(q);
    st.lo = first_valid(p, mask, q, 0, last_c);
    st.hi = st.lo >= 0 ? last_valid(p, mask, q, st.lo, last_c) : -1;
    st.n_cur = 0;
    st.margin = INFINITY;
  }
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[2][T::kKSteps][4];  // this warp's 32 rows of Q_q: two m16 tiles
  {
    const uint32_t q_lane = sK + uint32_t((kWarpRows * (warp & 1) + (lane & 15)) * T::kRowBytes);
    const uint32_t q_xor = uint32_t(((lane >> 4) ^ (lane & 7)) << 4);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int kk = 0; kk < T::kKSteps; ++kk)
        ldsm_x4(q_lane + 16 * mt * T::kRowBytes + ((32 * kk) ^ q_xor), qf[mt][kk][0], qf[mt][kk][1], qf[mt][kk][2],
                qf[mt][kk][3]);
  }
  __syncthreads();  // Q_q's buffer is free for K tiles
  // ldmatrix row addresses of K_r as the B operand (keys × dims, not transposed).
  const int mi = lane >> 3;
  const uint32_t k_lane = sK + uint32_t(((lane & 7) + ((mi >> 1) << 3)) * T::kRowBytes);
  const uint32_t k_xor = uint32_t(((mi & 1) ^ (lane & 7)) << 4);

  if (st.lo >= 0) {
    const int L = st.hi - st.lo + 1, nb = L < p.k ? L : p.k;
    initial_branches(p, mask, q, a, nb, st);
    list_fresh(a, nb, st);
    score_fresh<HEAD_DIM>(p, K, q, h, p.k, qf, sK, k_lane, k_xor, a, st.n_fresh);
    keep_top_k(a, nb, p.k, st);
    // After a round in which every kept branch is one block, the rounds left change nothing.
    for (int it = 0; it < p.n_it && st.splittable; ++it) {
      const int n = st.n_cur;
      split_branches(p, mask, q, a, n);
      list_fresh(a, 2 * n, st);
      score_fresh<HEAD_DIM>(p, K, q, h, p.k, qf, sK, k_lane, k_xor, a, st.n_fresh);
      keep_top_k(a, 2 * n, p.k, st);
    }
  }
  write_row(p, a, st, I, scores, margins, row);
}

/// Grid (n_q, heads launched), 128 threads: the whole sequence (estimate_query_block).
template <int HEAD_DIM>
__global__ void __launch_bounds__(kFastThreads, FastEstimateTraits<HEAD_DIM>::kMinBlocks)
    stream_fast_estimate_kernel(StreamProblem p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                                const std::uint64_t* __restrict__ mask, long long* __restrict__ I,
                                float* __restrict__ scores, float* __restrict__ margins, int head0) {
  estimate_query_block<HEAD_DIM>(p, Q, K, mask, I, scores, margins, head0, 0, p.n_q);
}

/// Grid (q_count, heads launched), 128 threads: query blocks q_first … q_first + q_count − 1
/// (estimate_query_block; the sharded run passes every head and no user mask).
template <int HEAD_DIM>
__global__ void __launch_bounds__(kFastThreads, FastEstimateTraits<HEAD_DIM>::kMinBlocks)
    stream_fast_estimate_range_kernel(StreamProblem p, const uint16_t* __restrict__ Q, const uint16_t* __restrict__ K,
                                      const std::uint64_t* __restrict__ mask, long long* __restrict__ I,
                                      float* __restrict__ scores, float* __restrict__ margins, int head0,
                                      int q_first, int q_count) {
  estimate_query_block<HEAD_DIM>(p, Q, K, mask, I, scores, margins, head0, q_first, q_count);
}

template <int HEAD_DIM>
std::size_t fast_smem_bytes(int k) {
  using T = FastEstimateTraits<HEAD_DIM>;
  return std::size_t(T::kStages) * T::kTileBytes + std::size_t(k) * (3 * sizeof(FastCandidate) + sizeof(int) +
                                                                     kWarps * sizeof(float));
}

template <int HEAD_DIM>
void launch_fast(const StreamProblem& p, int head0, int head_count, const uint16_t* Q, const uint16_t* K,
                 const std::uint64_t* mask, long long* I, float* scores, float* margins, cudaStream_t stream) {
  const std::size_t smem = fast_smem_bytes<HEAD_DIM>(p.k);
  ::flashlab::cuda::detail::opt_in_smem(reinterpret_cast<const void*>(&stream_fast_estimate_kernel<HEAD_DIM>), smem,
                                        "stream_fast_estimate_kernel");
  const dim3 grid(unsigned(p.n_q), unsigned(head_count));
  ::flashlab::cuda::detail::announce("stream_fast_estimate_kernel");
  stream_fast_estimate_kernel<HEAD_DIM><<<grid, kFastThreads, smem, stream>>>(p, Q, K, mask, I, scores, margins, head0);
  FLASHLAB_CUDA_CHECK_LAUNCH("stream_fast_estimate_kernel");
}

template <int HEAD_DIM>
void launch_fast_range(const StreamProblem& p, int q_first, int q_count, const uint16_t* Q, const uint16_t* K,
                       long long* I, float* scores, float* margins, cudaStream_t stream) {
  const std::size_t smem = fast_smem_bytes<HEAD_DIM>(p.k);
  ::flashlab::cuda::detail::opt_in_smem(reinterpret_cast<const void*>(&stream_fast_estimate_range_kernel<HEAD_DIM>),
                                        smem, "stream_fast_estimate_range_kernel");
  const dim3 grid{unsigned(q_count), unsigned(p.heads)};
  ::flashlab::cuda::detail::announce("stream_fast_estimate_range_kernel");
  stream_fast_estimate_range_kernel<HEAD_DIM><<<grid, kFastThreads, smem, stream>>>(p, Q, K, nullptr, I, scores,
                                                                                    margins, 0, q_first, q_count);
  FLASHLAB_CUDA_CHECK_LAUNCH("stream_fast_estimate_range_kernel");
}

}  // namespace

void launch_fast_estimate_range(const StreamProblem& p, int q_first, int q_count, const void* Q, const void* K,
                                long long* I, float* scores, float* margins, void* stream) {
  const auto* q16 = static_cast<const uint16_t*>(Q);
  const auto* k16 = static_cast<const uint16_t*>(K);
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.d == 64)
    launch_fast_range<64>(p, q_first, q_count, q16, k16, I, scores, margins, s);
  else
    launch_fast_range<128>(p, q_first, q_count, q16, k16, I, scores, margins, s);
}

void launch_fast_estimate(const StreamProblem& p, int head0, int head_count, const void* Q, const void* K,
                          const std::uint64_t* mask, long long* I, float* scores, float* margins, void* stream) {
  const auto* q16 = static_cast<const uint16_t*>(Q);
  const auto* k16 = static_cast<const uint16_t*>(K);
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.d == 64)
    launch_fast<64>(p, head0, head_count, q16, k16, mask, I, scores, margins, s);
  else
    launch_fast<128>(p, head0, head_count, q16, k16, mask, I, scores, margins, s);
}

}  // namespace flashlab::cuda::stream::detail
