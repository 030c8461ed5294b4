// stream_estimate.cu — STREAM mask estimation, the clear fp32 kernel ("Real-Time Sparse Tracing
// at Million-Token Context", §2, §5, App. A/B), step for step the reference's stream_estimate
// (reference/src/stream/stream_estimate.cpp).
//
// One thread block per (query block q, head h), kThreads threads:
//   load Q_q into shared memory once                                     (§5)
//   [lo, hi] = first .. last valid r of C_blk[q, *]; k branches = equal split, longer ones first
//   score each branch's representative (first valid block)              (App. A)
//   repeat n_it times: split every kept branch; the half holding the parent's representative
//   inherits its score, the other half gets a fresh representative and one K_r tile; keep the
//   top k by τ                                                           (App. B)
//   I[q, j] = representative of the j-th kept branch
// Every score is one b_q × b_k tile reduced to a scalar by score_tile (fixed-order dot products,
// block-wide max). Top-k is a rank sort: candidate i goes to position #{j : τ(j) before τ(i)} —
// τ is a total order on the candidates of a round (their representatives are distinct), so the
// result needs no atomics and is the same in every run.
//
// Candidates live in global memory (3k per block: k kept, 2k children), so k is not limited by
// shared memory; this kernel is written to be read beside the reference, not to be fast.
#include "stream/stream_tile.cuh"

namespace flashlab::cuda::stream::detail {

namespace {

/// One candidate of a refinement round, the reference's Candidate in device types.
struct Candidate {
  float score;                    ///< representative score (NaN stored as −inf)
  int r;                          ///< representative key block, −1: no valid block in [lo, hi]
  int lo, hi;                     ///< the branch's key-block range (inclusive)
  int split_bit;                  ///< 0 = left half, 1 = right half
  int pending;                    ///< 1: r is a fresh representative whose score is not computed yet
  unsigned long long branch_id;   ///< initial branch i; child of b is 2b + split_bit
};

/// τ (App. B): valid first, then score descending, r (tau_before_by_score), then branch_id, split_bit
/// ascending.
__device__ bool tau_before(const Candidate& a, const Candidate& b) {
  if (!tau_keys_tie(a.r, a.score, b.r, b.score)) return tau_before_by_score(a.r, a.score, b.r, b.score);
  if (a.branch_id != b.branch_id) return a.branch_id < b.branch_id;
  return a.split_bit < b.split_bit;
}

/// Per-block state shared by all threads.
struct EstimateShared {
  int lo, hi, n_branches;  // admissible range and initial branch count
  int n_cand;              // candidates in `next`
  int n_cur;               // kept branches in `cur`
  float dropped;           // score of the best dropped candidate (rank k), when one exists
  float margin;            // smallest decision gap so far
};

/// Scores every pending candidate of `cand[0..n)`, one K_r tile at a time (all threads).
__device__ void score_pending(const StreamProblem& p, Candidate* cand, int n, const float* K, int h, int q,
                              const float* Qs, float* Ks, float* red) {
  for (int i = 0; i < n; ++i) {
    if (!cand[i].pending) continue;  // uniform: every thread reads the same candidate
    const int r = cand[i].r;
    __syncthreads();  // the previous tile's reads are done before K_r overwrites it
    load_tile(Ks, K, p, h, p.d, r * p.bk, p.k_rows(r), p.bk);  // K_r: HBM → SRAM
    __syncthreads();
    const float s = score_tile(p, Qs, Ks, q, r, red);
    if (threadIdx.x == 0) {
      cand[i].score = s;
      cand[i].pending = 0;
    }
  }
  __syncthreads();  // scores visible to every thread before the rank sort
}

/// Top-k of cand[0..n) by τ into cur[0..min(k, valid)); records the decision gap at rank k.
__device__ void keep_top_k(const StreamProblem& p, const Candidate* cand, int n, Candidate* cur, EstimateShared& st) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (cand[i].r < 0) continue;  // invalid: never kept
    int rank = 0;
    for (int j = 0; j < n; ++j) rank += tau_before(cand[j], cand[i]) ? 1 : 0;
    if (rank < p.k) cur[rank] = cand[i];
    if (rank == p.k) st.dropped = cand[i].score;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int valid = 0;
    for (int i = 0; i < n; ++i) valid += cand[i].r >= 0 ? 1 : 0;
    st.n_cur = valid < p.k ? valid : p.k;
    if (valid > p.k) st.margin = fminf(st.margin, score_gap(cur[p.k - 1].score, st.dropped));
  }
  __syncthreads();
}

/// Initial partition of [lo, hi] into nb = min(k, L) branches, the first L mod nb one longer
/// (the reference's remainder convention); a branch without a valid block gets r = −1.
__device__ void initial_branches(const StreamProblem& p, const std::uint64_t* mask, int q, const EstimateShared& st,
                                 Candidate* next) {
  const int L = st.hi - st.lo + 1, nb = st.n_branches;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) {
    const int extra = i < L % nb ? i : L % nb;  // longer branches before branch i
    const int a = st.lo + i * (L / nb) + extra, len = L / nb + (i < L % nb ? 1 : 0);
    Candidate c;
    c.lo = a;
    c.hi = a + len - 1;
    c.branch_id = static_cast<unsigned long long>(i);
    c.split_bit = 0;
    c.r = first_valid(p, mask, q, c.lo, c.hi);
    c.score = stream_neg_inf();
    c.pending = c.r >= 0 ? 1 : 0;
    next[i] = c;
  }
}

/// Splits kept branch cur[i] into next[2i] (left, ⌈len/2⌉ blocks) and next[2i+1] (right). The half
/// that holds the parent's representative inherits it and its score; a one-block branch keeps
/// itself as the left half and has an empty (invalid) right half.
__device__ void split_branches(const StreamProblem& p, const std::uint64_t* mask, int q, const Candidate* cur, int n,
                               Candidate* next) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const Candidate b = cur[i];
    Candidate left, right;
    const bool right_fresh = bisect_branch(b, left, right);
    left.branch_id = 2 * b.branch_id;
    left.split_bit = 0;
    right.branch_id = 2 * b.branch_id + 1;
    right.split_bit = 1;
    left.pending = right.pending = 0;
    if (right_fresh) {
      right.r = first_valid(p, mask, q, right.lo, right.hi);  // fresh representative
      right.score = stream_neg_inf();
      right.pending = right.r >= 0 ? 1 : 0;
    }
    next[2 * i] = left;
    next[2 * i + 1] = right;
  }
  __syncthreads();
}

/// Writes I[q, ·], the scores beside it and the margin (−1 / NaN for missing entries).
__device__ void write_row(const StreamProblem& p, const Candidate* cur, const EstimateShared& st, long long* I,
                          float* scores, float* margins, std::size_t row) {
  for (int j = threadIdx.x; j < p.k; j += blockDim.x) {
    I[row * p.k + j] = j < st.n_cur ? cur[j].r : -1;
    scores[row * p.k + j] = j < st.n_cur ? cur[j].score : NAN;
  }
  if (threadIdx.x == 0) {
    float m = st.margin;  // neighbours of the final list: their order is I's order
    for (int j = 1; j < st.n_cur; ++j) m = fminf(m, score_gap(cur[j - 1].score, cur[j].score));
    margins[row] = m;
  }
}

/// Grid (n_q, H). Dynamic shared memory: Q_q [b_q][d+1], K_r [b_k][d+1], one float per warp.
__global__ void stream_estimate_kernel(StreamProblem p, const float* __restrict__ Q, const float* __restrict__ K,
                                       const std::uint64_t* __restrict__ mask, Candidate* __restrict__ work,
                                       long long* __restrict__ I, float* __restrict__ scores,
                                       float* __restrict__ margins) {
  const int q = blockIdx.x, h = blockIdx.y;
  const std::size_t row = std::size_t(h) * p.n_q + q;
  extern __shared__ float smem[];
  float* Qs = smem;                                  // Q_q
  float* Ks = Qs + p.bq * StreamProblem::pitch(p.d);  // the representative K_r being scored
  float* red = Ks + p.bk * StreamProblem::pitch(p.d);
  __shared__ EstimateShared st;
  Candidate* cur = work + row * 3 * std::size_t(p.k);  // kept branches, τ order
  Candidate* next = cur + p.k;                       // 2k children of a round

  load_tile(Qs, Q, p, h, p.d, q * p.bq, p.q_rows(q), p.bq);  // Q_q: HBM → SRAM, once
  if (threadIdx.x == 0) {
    const int last_c = p.causal_last(q);
    st.lo = first_valid(p, mask, q, 0, last_c);
    st.hi = st.lo >= 0 ? last_valid(p, mask, q, st.lo, last_c) : -1;
    const int L = st.hi - st.lo + 1;
    st.n_branches = st.lo >= 0 ? (L < p.k ? L : p.k) : 0;
    st.n_cur = 0;
    st.margin = INFINITY;
  }
  __syncthreads();
  if (st.lo >= 0) {
    initial_branches(p, mask, q, st, next);
    __syncthreads();
    score_pending(p, next, st.n_branches, K, h, q, Qs, Ks, red);
    keep_top_k(p, next, st.n_branches, cur, st);
    for (int it = 0; it < p.n_it; ++it) {
      const int n = st.n_cur;
      split_branches(p, mask, q, cur, n, next);
      score_pending(p, next, 2 * n, K, h, q, Qs, Ks, red);
      keep_top_k(p, next, 2 * n, cur, st);
    }
  }
  write_row(p, cur, st, I, scores, margins, row);
}

}  // namespace

std::size_t estimate_smem_bytes(const StreamProblem& p) {
  const std::size_t ld = StreamProblem::pitch(p.d);
  return ((std::size_t(p.bq) + p.bk) * ld + kThreads / 32) * sizeof(float);
}

std::size_t estimate_work_bytes(const StreamProblem& p) {
  return std::size_t(p.heads) * p.n_q * 3 * std::size_t(p.k) * sizeof(Candidate);
}

void launch_estimate(const StreamProblem& p, const float* Q, const float* K, const std::uint64_t* mask, void* work,
                     long long* I, float* scores, float* margins) {
  const std::size_t smem = estimate_smem_bytes(p);
  ::flashlab::cuda::detail::opt_in_smem(reinterpret_cast<const void*>(&stream_estimate_kernel), smem,
                                        "stream_estimate_kernel");
  const dim3 grid(p.n_q, p.heads);
  ::flashlab::cuda::detail::announce("stream_estimate_kernel");
  stream_estimate_kernel<<<grid, kThreads, smem>>>(p, Q, K, mask, static_cast<Candidate*>(work), I, scores,
                                                   margins);
  FLASHLAB_CUDA_CHECK_LAUNCH("stream_estimate_kernel");
}

}  // namespace flashlab::cuda::stream::detail
