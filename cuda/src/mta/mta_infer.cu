// mta_infer.cu — split-K inference, tile for tile with reference/src/mta/infer.cpp (Multi token
// attention in CUDA and Triton, "fwd_inference_kernel" + "combine_splits_kernel").
//
// Decoding needs the output of the last token only, but its convolved scores read the Pq query
// rows above it, so every split loads the 16-row query tile Q[N − 16 : N] (zero padding above
// token 0; cq ≤ 16). Keys are split into N_splits ranges of T_k = ⌈N / (N_splits · Bc)⌉ key
// tiles (overlapping like the forward's: B keys loaded, Bc = B − 2Pk effective); each split runs
// its own online softmax for the one row and writes a partial (O_s, M_s, L_s), or, with one
// split, the normalised output itself. The combine kernel merges the partials with α and β.
#include "mta/mta_tile.cuh"

namespace flashlab::cuda::detail::mta {

namespace {
constexpr int kRows = kInferQueryRows;  // the query tile: the last 16 tokens
}  // namespace

/// Shared floats of the split kernel: Q (16 × ld), K and V tiles (B × ld), S (16 × sp), the last
/// row of Ŝ then P (B), W (cq·ck), O_s (d), and m_s, ℓ_s, α.
static std::size_t split_smem_floats(const Launch& L) {
  return (kRows + 2 * std::size_t(L.block)) * L.ld() + kRows * std::size_t(L.sp()) + L.block + L.taps() +
         L.head_dim + 3;
}

/// Grid (splits, H, B), kThreads threads.
__global__ void mta_infer_split_kernel(Launch L, const float* __restrict__ Q, const float* __restrict__ K,
                                       const float* __restrict__ V, const float* __restrict__ W,
                                       float* __restrict__ O, float* __restrict__ O_s, float* __restrict__ M_s,
                                       float* __restrict__ L_s) {
  const int B = L.block, n = L.seq, d = L.head_dim, ld = L.ld(), sp = L.sp(), pk = L.pk;
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::size_t stride = L.row_stride(), base = L.head_offset(b, h);
  const int q0 = n - kRows;  // first row of the query tile; its last row is token N − 1

  extern __shared__ float smem[];
  float* q_t = smem;                // [16][ld]
  float* k_t = q_t + kRows * ld;    // [B][ld]
  float* v_t = k_t + B * ld;        // [B][ld]
  float* s_j = v_t + B * ld;        // [16][sp]
  float* p_j = s_j + kRows * sp;    // [B]  last row of Ŝ, then P_j
  float* w = p_j + B;               // [cq·ck]
  float* o_s = w + L.taps();        // [d]
  float* stat = o_s + d;            // m_s, ℓ_s, α

  // Load the entire query tile Q (16 × d) and W; O_s = 0, m_s = −∞, ℓ_s = 0.
  load_tile(q_t, ld, Q + base, stride, q0, kRows, n, d);
  load_w(w, W + std::size_t(h) * L.taps(), L.taps());
  for (int k = threadIdx.x; k < d; k += blockDim.x) o_s[k] = 0.f;
  if (threadIdx.x == 0) stat[0] = neg_inf(), stat[1] = 0.f;

  for (int jj = 0; jj < L.tk; ++jj) {
    const int tile = split * L.tk + jj;
    if (tile * L.bc >= n) break;  // past the last key: nothing to load (the same for every thread)
    const int js = tile * L.bc - pk;
    load_tile(k_t, ld, K + base, stride, js, B, n, d);
    load_tile(v_t, ld, V + base, stride, js, B, n, d);
    __syncthreads();  // tiles (and on the first tile Q, W, O_s) complete before use

    // S_j = scale · Q Kᵀ (16 × B) with causal zeros; only the last query's row of Conv2D is
    // needed (the reference computes the whole tile and keeps that row).
    scores(s_j, sp, q_t, k_t, ld, kRows, B, d, L.scale, q0, js);
    __syncthreads();  // S_j complete before the convolution reads rows above the last one
    for (int c = threadIdx.x; c < B; c += blockDim.x) {
      const bool owned = c >= pk && c < B - pk && js + c < n;  // halo columns and keys past N → −∞
      p_j[c] = owned ? conv_at(s_j, sp, kRows, B, w, L.cq, L.ck, kRows - 1, c) : neg_inf();
    }
    __syncthreads();  // the row is complete before its max and sum

    // Online softmax for the one row (one thread: B values): m_s = max(m_s, m_j), α = e^{m_old − m_s}.
    if (threadIdx.x == 0) {
      float m_j = neg_inf();
      for (int c = 0; c < B; ++c) m_j = fmaxf(m_j, p_j[c]);
      const float m_old = stat[0], m_new = fmaxf(m_old, m_j);
      const float alpha = m_new == neg_inf() ? 1.f : expf(m_old - m_new);
      float sum = 0.f;
      for (int c = 0; c < B; ++c) {
        const float p = m_new == neg_inf() ? 0.f : expf(p_j[c] - m_new);
        p_j[c] = p;
        sum += p;
      }
      stat[0] = m_new;
      stat[1] = alpha * stat[1] + sum;
      stat[2] = alpha;
    }
    __syncthreads();  // P_j and α ready before O_s = α·O_s + P_j V reads them
    for (int k = threadIdx.x; k < d; k += blockDim.x) {
      float acc = stat[2] * o_s[k];
      for (int c = 0; c < B; ++c) acc = fmaf(p_j[c], v_t[c * ld + k], acc);
      o_s[k] = acc;
    }
    __syncthreads();  // every read of K, V, P_j done before the next tile overwrites them
  }
  __syncthreads();  // O_s and the statistics final (also when the split had no tile)

  const std::size_t part = (std::size_t(b) * L.heads + h) * L.splits + split;
  if (L.splits == 1) {
    // No combine kernel: normalise here and write the final output row.
    for (int k = threadIdx.x; k < d; k += blockDim.x) O[(std::size_t(b) * L.heads + h) * d + k] = o_s[k] / stat[1];
  } else {
    for (int k = threadIdx.x; k < d; k += blockDim.x) O_s[part * d + k] = o_s[k];
    if (threadIdx.x == 0) M_s[part] = stat[0], L_s[part] = stat[1];
  }
}

void launch_infer_split(const Launch& L, const float* Q, const float* K, const float* V, const float* W, float* O,
                        float* O_s, float* M_s, float* L_s) {
  const std::size_t smem = split_smem_floats(L) * sizeof(float);
  set_smem(reinterpret_cast<const void*>(&mta_infer_split_kernel), smem, "mta_infer_split_kernel", L);
  const dim3 grid(L.splits, L.heads, L.batch);
  announce("mta_infer_split_kernel");
  mta_infer_split_kernel<<<grid, kThreads, smem>>>(L, Q, K, V, W, O, O_s, M_s, L_s);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_infer_split_kernel");
}

/// Grid (H, B), kThreads threads; one thread per output column k. Split 0 always holds key 0, so
/// m_fin is finite from the start; an empty split (M_s = −∞) has β = 0.
__global__ void mta_infer_combine_kernel(Launch L, const float* __restrict__ O_s, const float* __restrict__ M_s,
                                         const float* __restrict__ L_s, float* __restrict__ O) {
  const int h = blockIdx.x, b = blockIdx.y, d = L.head_dim, splits = L.splits;
  const std::size_t first = (std::size_t(b) * L.heads + h) * splits;
  extern __shared__ float smem[];
  float* m_part = smem;            // [splits]
  float* l_part = smem + splits;   // [splits]
  load_stat(m_part, M_s + first, 0, splits, splits);
  load_stat(l_part, L_s + first, 0, splits, splits);
  __syncthreads();  // all partial statistics loaded before any column combines them
  for (int k = threadIdx.x; k < d; k += blockDim.x) {
    float o_fin = __ldcg(O_s + first * d + k), m_fin = m_part[0], l_fin = l_part[0];
    for (int s = 1; s < splits; ++s) {
      const float m_old = m_fin;
      m_fin = fmaxf(m_fin, m_part[s]);
      const float alpha = expf(m_old - m_fin), beta = expf(m_part[s] - m_fin);
      o_fin = alpha * o_fin + beta * __ldcg(O_s + (first + s) * d + k);
      l_fin = alpha * l_fin + beta * l_part[s];
    }
    O[(std::size_t(b) * L.heads + h) * d + k] = o_fin / l_fin;
  }
}

void launch_infer_combine(const Launch& L, const float* O_s, const float* M_s, const float* L_s, float* O) {
  const std::size_t smem = 2 * std::size_t(L.splits) * sizeof(float);
  set_smem(reinterpret_cast<const void*>(&mta_infer_combine_kernel), smem, "mta_infer_combine_kernel", L);
  const dim3 grid(L.heads, L.batch);
  announce("mta_infer_combine_kernel");
  mta_infer_combine_kernel<<<grid, kThreads, smem>>>(L, O_s, M_s, L_s, O);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_infer_combine_kernel");
}

}  // namespace flashlab::cuda::detail::mta
