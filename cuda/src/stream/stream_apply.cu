// stream_apply.cu — STREAM mask application and trace emission, the clear fp32 kernels ("Real-Time
// Sparse Tracing at Million-Token Context", §3, §6); the reference is stream_apply in
// reference/src/stream/stream_apply.cpp.
//
// Application, one thread block per (query block q, head h):
//   load Q_q once; for j = 0..k−1, r = I[q, j] (−1 skipped), in slot order:        (§6)
//     load K_r, V_r; S = Q_q K_rᵀ, ℓ = −inf where s > t or s ≥ T
//     μ' = max(μ, rowmax ℓ); P = e^{ℓ−μ'}; λ' = λ e^{μ−μ'} + rowsum P; o' = o e^{μ−μ'} + P V_r
//   O_q = o / λ (0 where λ = 0: no valid kept key; NaN where a logit was NaN)
// Natural exponentials and unscaled logits, as the reference (pre-scale Q for 1/√d).
//
// Trace, one thread block per (q, slot j, head h) of a chunk of query blocks: with the final
// (μ_t, λ_t) of every row (written by the application), p_{t,s} = e^{ℓ−μ_t}/λ_t — the same
// probability the reference gets by rescaling its per-slot partials by e^{μ_j−μ}/λ — so
//   score = score_tile (bitwise the estimator's), mass = Σ_t Σ_s p_{t,s},
//   value_norm = ‖Σ_t Σ_s p_{t,s} V_s‖₂,
// accumulated over rows in float64. One record per slot; the host squeezes out empty slots.
#include "stream/stream_tile.cuh"

namespace flashlab::cuda::stream::detail {

namespace {

/// Sum of a double over the thread block in a fixed order (per warp, then warps in order).
/// `red` holds one double per warp. All threads must call it; every thread gets the sum.
__device__ double block_sum(double v, double* red) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();  // red is free
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < int(blockDim.x + 31) / 32; ++w) s += red[w];
  return s;
}

/// S = Q_q K_rᵀ into `S` (pitch b_k + 1), −inf for token-invalid pairs and padding. All threads.
__device__ void logits_tile(const StreamProblem& p, const float* Qs, const float* Ks, int q, int r, float* S) {
  const int ld = StreamProblem::pitch(p.d), sp = p.bk + 1, rows = p.q_rows(q);
  for (int idx = threadIdx.x; idx < p.bq * p.bk; idx += blockDim.x) {
    const int m = idx / p.bk, n = idx % p.bk;
    const bool valid = m < rows && n < p.valid_cols(q, r, m);
    S[m * sp + n] = valid ? dot_fixed(Qs + m * ld, Ks + n * ld, p.d) : stream_neg_inf();
  }
}

/// The online-softmax update of one row m (§6): P overwrites S, corr = e^{μ−μ'}. A NaN logit
/// marks the row (the max skips NaN, which alone would look like "no valid key").
__device__ void online_row(const StreamProblem& p, float* S_row, int n_end, float& mu, float& lam, float& corr,
                           float& poisoned) {
  float row_max = stream_neg_inf();
  for (int n = 0; n < n_end; ++n) {
    row_max = S_row[n] > row_max ? S_row[n] : row_max;
    if (isnan(S_row[n])) poisoned = 1.f;
  }
  const float mu_new = row_max > mu ? row_max : mu;
  if (mu_new == stream_neg_inf()) {  // no valid key for this row so far
    corr = 1.f;
    for (int n = 0; n < p.bk; ++n) S_row[n] = 0.f;
    return;
  }
  corr = expf(mu - mu_new);  // e^{−inf} = 0 on the row's first valid block
  float sum = 0.f;
  for (int n = 0; n < p.bk; ++n) {
    S_row[n] = n < n_end ? expf(S_row[n] - mu_new) : 0.f;
    sum += S_row[n];
  }
  lam = lam * corr + sum;
  mu = mu_new;
}

/// Grid (n_q, H). Shared: Q_q, K_r [.][d+1]; V_r, o [.][d_v+1]; S/P [b_q][b_k+1]; μ, λ, corr,
/// poisoned [b_q].
__global__ void stream_apply_kernel(StreamProblem p, const float* __restrict__ Q, const float* __restrict__ K,
                                    const float* __restrict__ V, const long long* __restrict__ I,
                                    float* __restrict__ O, float* __restrict__ row_mu, float* __restrict__ row_lam) {
  const int q = blockIdx.x, h = blockIdx.y, rows = p.q_rows(q);
  const int ld = StreamProblem::pitch(p.d), ldv = StreamProblem::pitch(p.dv), sp = p.bk + 1;
  extern __shared__ float smem[];
  float* Qs = smem;
  float* Ks = Qs + p.bq * ld;
  float* Vs = Ks + p.bk * ld;
  float* o = Vs + p.bk * ldv;
  float* S = o + p.bq * ldv;
  float* mu = S + p.bq * sp;
  float* lam = mu + p.bq;
  float* corr = lam + p.bq;
  float* poisoned = corr + p.bq;

  load_tile(Qs, Q, p, h, p.d, q * p.bq, rows, p.bq);  // Q_q: HBM → SRAM once
  for (int idx = threadIdx.x; idx < p.bq * ldv; idx += blockDim.x) o[idx] = 0.f;
  for (int m = threadIdx.x; m < p.bq; m += blockDim.x) {
    mu[m] = stream_neg_inf();
    lam[m] = 0.f;
    poisoned[m] = 0.f;
  }
  const long long* I_q = I + (std::size_t(h) * p.n_q + q) * p.k;
  for (int j = 0; j < p.k; ++j) {
    const int r = int(I_q[j]);
    if (r < 0) continue;  // empty entry: nothing streamed
    __syncthreads();      // the previous slot's reads of K_r, V_r, P are done
    load_tile(Ks, K, p, h, p.d, r * p.bk, p.k_rows(r), p.bk);  // K_r, V_r: HBM → SRAM
    load_tile(Vs, V, p, h, p.dv, r * p.bk, p.k_rows(r), p.bk);
    __syncthreads();
    logits_tile(p, Qs, Ks, q, r, S);
    __syncthreads();  // whole rows of S before their owner thread reduces them
    for (int m = threadIdx.x; m < rows; m += blockDim.x)
      online_row(p, S + m * sp, p.valid_cols(q, r, m), mu[m], lam[m], corr[m], poisoned[m]);
    __syncthreads();  // P and corr final before o = corr·o + P V_r
    for (int idx = threadIdx.x; idx < rows * p.dv; idx += blockDim.x) {
      const int m = idx / p.dv, c = idx % p.dv;
      float pv = 0.f;
      for (int n = 0; n < p.bk; ++n) pv = fmaf(S[m * sp + n], Vs[n * ldv + c], pv);
      o[m * ldv + c] = o[m * ldv + c] * corr[m] + pv;
    }
  }
  __syncthreads();
  // O_q = o / λ → HBM.
  for (int idx = threadIdx.x; idx < rows * p.dv; idx += blockDim.x) {
    const int m = idx / p.dv, c = idx % p.dv;
    const float l = lam[m];
    O[p.at(q * p.bq + m, h, p.dv) + c] = poisoned[m] != 0.f ? NAN : (l > 0.f ? o[m * ldv + c] / l : 0.f);
  }
  if (row_mu == nullptr) return;
  for (int m = threadIdx.x; m < rows; m += blockDim.x) {
    row_mu[std::size_t(h) * p.T + q * p.bq + m] = mu[m];
    row_lam[std::size_t(h) * p.T + q * p.bq + m] = lam[m];
  }
}

/// Grid (count, k, H): record (q0 + blockIdx.x, slot blockIdx.y) of head blockIdx.z. Shared:
/// Q_q, K_r [.][d+1], V_r [b_k][d_v+1], P [b_q][b_k+1], one double per warp.
__global__ void stream_trace_kernel(StreamProblem p, int q0, const float* __restrict__ Q,
                                    const float* __restrict__ K, const float* __restrict__ V,
                                    const long long* __restrict__ I, const float* __restrict__ row_mu,
                                    const float* __restrict__ row_lam, EdgeRecord* __restrict__ edges) {
  const int q = q0 + blockIdx.x, j = blockIdx.y, h = blockIdx.z, rows = p.q_rows(q);
  const int ld = StreamProblem::pitch(p.d), ldv = StreamProblem::pitch(p.dv), sp = p.bk + 1;
  const int r = int(I[(std::size_t(h) * p.n_q + q) * p.k + j]);
  EdgeRecord& rec = edges[(std::size_t(h) * gridDim.x + blockIdx.x) * p.k + j];
  if (r < 0) {
    if (threadIdx.x == 0) rec = EdgeRecord{q, -1, j, 0.0, 0.0, 0.0};
    return;  // uniform over the block
  }
  extern __shared__ double smem_d[];  // double first: alignment of the reduction slots
  double* red_d = smem_d;
  float* Qs = reinterpret_cast<float*>(red_d + kThreads / 32);
  float* Ks = Qs + p.bq * ld;
  float* Vs = Ks + p.bk * ld;
  float* S = Vs + p.bk * ldv;
  float* red = S + p.bq * sp;

  load_tile(Qs, Q, p, h, p.d, q * p.bq, rows, p.bq);
  load_tile(Ks, K, p, h, p.d, r * p.bk, p.k_rows(r), p.bk);
  load_tile(Vs, V, p, h, p.dv, r * p.bk, p.k_rows(r), p.bk);
  __syncthreads();
  const float score = score_tile(p, Qs, Ks, q, r, red);  // w (i)
  logits_tile(p, Qs, Ks, q, r, S);
  __syncthreads();
  // p_{t,s} = e^{ℓ − μ_t} / λ_t over the row's valid keys; rows with λ ≤ 0 attend to nothing.
  double mass = 0;
  for (int m = threadIdx.x; m < p.bq; m += blockDim.x) {
    const std::size_t t = std::size_t(h) * p.T + q * p.bq + m;
    const int n_end = m < rows ? p.valid_cols(q, r, m) : 0;
    const float mu = m < rows ? row_mu[t] : 0.f, lam = m < rows ? row_lam[t] : 0.f;
    const bool attends = m < rows && !(lam <= 0.f);
    for (int n = 0; n < p.bk; ++n) {
      const float prob = attends && n < n_end ? expf(S[m * sp + n] - mu) / lam : 0.f;
      S[m * sp + n] = prob;
      mass += prob;
    }
  }
  mass = block_sum(mass, red_d);  // w (ii); its internal barrier also publishes P
  // Value summary Σ_t Σ_s p_{t,s} V_s, one column per thread, and its norm.
  double sq = 0;
  for (int c = threadIdx.x; c < p.dv; c += blockDim.x) {
    double col = 0;
    for (int m = 0; m < rows; ++m) {
      float pv = 0.f;
      for (int n = 0; n < p.bk; ++n) pv = fmaf(S[m * sp + n], Vs[n * ldv + c], pv);
      col += pv;
    }
    sq += col * col;
  }
  sq = block_sum(sq, red_d);
  if (threadIdx.x == 0) rec = EdgeRecord{q, r, j, double(score), mass, sqrt(sq)};
}

}  // namespace

std::size_t apply_smem_bytes(const StreamProblem& p) {
  const std::size_t ld = StreamProblem::pitch(p.d), ldv = StreamProblem::pitch(p.dv);
  return ((p.bq + std::size_t(p.bk)) * ld + (p.bk + std::size_t(p.bq)) * ldv + std::size_t(p.bq) * (p.bk + 1) +
          4 * std::size_t(p.bq)) *
         sizeof(float);
}

std::size_t trace_smem_bytes(const StreamProblem& p) {
  const std::size_t ld = StreamProblem::pitch(p.d), ldv = StreamProblem::pitch(p.dv);
  return (kThreads / 32) * sizeof(double) +
         ((p.bq + std::size_t(p.bk)) * ld + std::size_t(p.bk) * ldv + std::size_t(p.bq) * (p.bk + 1) + kThreads / 32) *
             sizeof(float);
}

void launch_apply(const StreamProblem& p, const float* Q, const float* K, const float* V, const long long* I,
                  float* O, float* row_mu, float* row_lam, cudaStream_t stream) {
  const std::size_t smem = apply_smem_bytes(p);
  ::flashlab::cuda::detail::opt_in_smem(reinterpret_cast<const void*>(&stream_apply_kernel), smem,
                                        "stream_apply_kernel");
  ::flashlab::cuda::detail::announce("stream_apply_kernel");
  stream_apply_kernel<<<dim3(p.n_q, p.heads), kThreads, smem, stream>>>(p, Q, K, V, I, O, row_mu, row_lam);
  FLASHLAB_CUDA_CHECK_LAUNCH("stream_apply_kernel");
}

void launch_trace(const StreamProblem& p, int q0, int count, const float* Q, const float* K, const float* V,
                  const long long* I, const float* row_mu, const float* row_lam, EdgeRecord* edges,
                  cudaStream_t stream) {
  const std::size_t smem = trace_smem_bytes(p);
  ::flashlab::cuda::detail::opt_in_smem(reinterpret_cast<const void*>(&stream_trace_kernel), smem,
                                        "stream_trace_kernel");
  ::flashlab::cuda::detail::announce("stream_trace_kernel");
  stream_trace_kernel<<<dim3(count, p.k, p.heads), kThreads, smem, stream>>>(p, q0, Q, K, V, I, row_mu, row_lam, edges);
  FLASHLAB_CUDA_CHECK_LAUNCH("stream_trace_kernel");
}

namespace {

// One thread per record: the indices fit 32 bits (the callers refuse n_q, n_k ≥ 2^31), the
// weights round to the nearest float.
__global__ void narrow_edges_kernel(const EdgeRecord* __restrict__ edges, CompactEdgeRecord* __restrict__ out,
                                    std::size_t count) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const EdgeRecord e = edges[i];
  out[i] = CompactEdgeRecord{int(e.q), int(e.r), int(e.slot), float(e.score), float(e.mass), float(e.value_norm)};
}

}  // namespace

void launch_narrow_edges(const EdgeRecord* edges, CompactEdgeRecord* out, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  constexpr int kNarrowThreads = 256;
  const std::size_t blocks = (count + kNarrowThreads - 1) / kNarrowThreads;
  ::flashlab::cuda::detail::announce("narrow_edges_kernel");
  narrow_edges_kernel<<<unsigned(blocks), kNarrowThreads, 0, stream>>>(edges, out, count);
  FLASHLAB_CUDA_CHECK_LAUNCH("narrow_edges_kernel");
}

}  // namespace flashlab::cuda::stream::detail
