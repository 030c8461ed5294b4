// attention_fa1_fwd.cu — FlashAttention forward in the FA1 loop order (the toy-machine lesson, "outer product"
// style; FlashAttention-1, Algorithm 1): the key tile is outer, the query tile inner.
//
//   for each key tile j:                          (K_j, V_j resident in SRAM: read once)
//     for each query tile i that sees tile j:
//       load Q_i; unless first visit, load O_i, m_i, l_i (HBM → SRAM)
//       S_ij = Q_i K_jᵀ·scale·log2 e, masked; m_new = max(m_i, rowmax S_ij); P_ij = 2^(S_ij − m_new)
//       α = 2^(m_i − m_new); l_new = α l_i + rowsum P_ij; O_i = (α l_i O_i + P_ij V_j) / l_new
//       store O_i; store m_i, l_i — or, on the last visit, LSE_i = m_new + log2 l_new instead
//
// This is reference/src/attention/forward.cpp (flash_forward_fa1) line for line. The running
// state O_i, m_i, l_i goes to HBM and back once per visited (i, j) pair — the traffic FA2 removes
// by swapping the loops. As in FA1, parallelism is over batch and heads: one block per (b, h)
// runs the whole double loop (fa1_query_split = 1 in attention_forward). That leaves most of an H100 idle at
// small B·H, so by default the query tiles of one head are split over `s` blocks
// (blockIdx.x = 0..s−1), each running the same loop over its own contiguous range of query
// tiles; each block then reads the K_j, V_j its tiles need, so K/V traffic is s times FA1's
// (the host API and the traffic command add exactly that term to the model).
//
// Honest performance note: slow on purpose — FA1's HBM round trips of O_i, m_i, l_i, and fp32
// CUDA-core arithmetic. How to run: attention_forward(ref::Algorithm::fa1_fwd, problem, ...) or
// `flashlab traffic attention --device cuda --variant fa1 --seq 2048`.
#include "attention/launchers.hpp"
#include "attention/tile.cuh"

#include <algorithm>

namespace flashlab::cuda::detail {

/// Grid (s, H, B). m and l are [B, H, N] scratch vectors in HBM.
__global__ void fa1_fwd_kernel(Problem p, int tiles_per_block, const float* __restrict__ Q,
                               const float* __restrict__ K, const float* __restrict__ V, float* __restrict__ O,
                               float* __restrict__ m, float* __restrict__ l, float* __restrict__ LSE) {
  const int Br = p.Br, Bc = p.Bc, d = p.head_dim, N = p.seq;
  const int ld = smem_pitch(d), sp = Bc + 1;
  const int h = blockIdx.y, b = blockIdx.z;
  const int Tr = p.Tr(), Tc = p.Tc();
  const int i_begin = blockIdx.x * tiles_per_block, i_end = min(Tr, i_begin + tiles_per_block);
  if (i_begin >= i_end) return;  // whole block leaves together: no barrier is skipped by some threads only
  const std::size_t stride = p.row_stride(), base = p.head_offset(b, h), sbase = p.stat_offset(b, h);
  const int last_row_of_block = min(N, i_end * Br) - 1;

  extern __shared__ float smem[];
  float* K_j = smem;              // [Bc][ld]
  float* V_j = K_j + Bc * ld;     // [Bc][ld]
  float* Q_i = V_j + Bc * ld;     // [Br][ld]
  float* O_i = Q_i + Br * ld;     // [Br][ld]
  float* S_ij = O_i + Br * ld;    // [Br][sp]  scores, then P_ij
  float* m_i = S_ij + Br * sp;    // [Br]
  float* l_i = m_i + Br;          // [Br]
  float* m_new = l_i + Br;        // [Br]
  float* l_new = m_new + Br;      // [Br]
  float* alpha = l_new + Br;      // [Br]

  for (int j = 0; j < Tc; ++j) {
    const int start_n = j * Bc;
    if (p.causal && start_n > last_row_of_block) break;  // no query row of this block sees tile j or later
    // Load K_j, V_j: HBM → SRAM, once per key tile.
    load_rows(K_j, ld, K + base, stride, start_n, Bc, N, d);
    load_rows(V_j, ld, V + base, stride, start_n, Bc, N, d);

    for (int i = i_begin; i < i_end; ++i) {
      const int row0 = i * Br;
      const int last_row = min(N, row0 + Br) - 1;
      if (p.causal && start_n > last_row) continue;  // tile (i, j) fully masked: skipped, not loaded
      const bool first = j == 0;  // key tile 0 is visible to every query row (self-attention)
      const bool last = j + 1 == Tc || (p.causal && start_n + Bc > last_row);
      // Load Q_i: HBM → SRAM (once per visited pair). Unless first visit: load O_i, m_i, l_i
      // (the running state, read-modify-written in HBM); else start from O = 0, m = -inf, l = 0.
      load_rows(Q_i, ld, Q + base, stride, row0, Br, N, d);
      if (first) {
        fill_tile(O_i, Br * ld, 0.f);
        for (int r = threadIdx.x; r < Br; r += blockDim.x) {
          m_i[r] = neg_inf();
          l_i[r] = 0.f;
        }
      } else {
        load_rows(O_i, ld, O + base, stride, row0, Br, N, d);
        for (int r = threadIdx.x; r < Br; r += blockDim.x) {
          const bool valid = row0 + r < N;
          m_i[r] = valid ? __ldcg(m + sbase + row0 + r) : neg_inf();
          l_i[r] = valid ? __ldcg(l + sbase + row0 + r) : 0.f;
        }
      }
      __syncthreads();  // Q_i, O_i, m_i, l_i (and K_j, V_j on the first i) complete before use

      // S_ij = Q_i K_jᵀ · scale·log2 e, masked to -inf. SRAM only.
      for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x) {
        const int r = idx / Bc, c = idx % Bc;
        S_ij[r * sp + c] = visible(p, row0 + r, start_n + c) ? dot_row(Q_i + r * ld, K_j + c * ld, d) * p.scale_log2
                                                              : neg_inf();
      }
      __syncthreads();  // whole rows of S_ij written before each row's owner reduces them

      // m_new, P_ij = 2^(S_ij − m_new), α = 2^(m_i − m_new), l_new = α l_i + rowsum P_ij; one thread per row.
      for (int r = threadIdx.x; r < Br; r += blockDim.x) {
        float mx = m_i[r];
        for (int c = 0; c < Bc; ++c) mx = fmaxf(mx, S_ij[r * sp + c]);
        const float m_ref = mx == neg_inf() ? 0.f : mx;  // row masked so far (padding only): avoid -inf + inf
        float row_sum = 0.f;
        for (int c = 0; c < Bc; ++c) {
          const float p_rc = exp2f(S_ij[r * sp + c] - m_ref);
          S_ij[r * sp + c] = p_rc;
          row_sum += p_rc;
        }
        alpha[r] = exp2f(m_i[r] - m_ref);
        m_new[r] = mx;
        l_new[r] = l_i[r] * alpha[r] + row_sum;
      }
      __syncthreads();  // P_ij, α, l_new final before the O_i update reads them

      // O_i = (α l_i O_i + P_ij V_j) / l_new (0 for a row still fully masked). SRAM only.
      for (int idx = threadIdx.x; idx < Br * d; idx += blockDim.x) {
        const int r = idx / d, k = idx % d;
        float o = O_i[r * ld + k] * alpha[r] * l_i[r];
        for (int c = 0; c < Bc; ++c) o = fmaf(S_ij[r * sp + c], V_j[c * ld + k], o);
        O_i[r * ld + k] = l_new[r] > 0.f ? o / l_new[r] : 0.f;
      }
      __syncthreads();  // O_i final before it is stored

      // Store O_i: SRAM → HBM (every visit). Then m_i, l_i for the next visit — or LSE_i on the last.
      store_rows(O + base, stride, O_i, ld, nullptr, row0, Br, N, d);
      for (int r = threadIdx.x; r < Br; r += blockDim.x) {
        if (row0 + r >= N) continue;
        if (last) {
          LSE[sbase + row0 + r] = l_new[r] > 0.f ? m_new[r] + log2f(l_new[r]) : neg_inf();
        } else {
          m[sbase + row0 + r] = m_new[r];
          l[sbase + row0 + r] = l_new[r];
        }
      }
      __syncthreads();  // Q_i, O_i, S_ij, stats free again, and this tile's HBM stores are visible to
                        // the block before a later visit of tile i reads them back
    }
    // (the barrier ending the last visited i above also orders all reads of K_j, V_j before the
    // next key tile overwrites them; a j with no visited i has no reads to order)
    __syncthreads();  // K_j, V_j no longer read (covers a j whose every query tile was skipped)
  }
}

int fa1_auto_split(const Problem& p) {
  int dev = 0, sms = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const long long heads_total = (long long)p.batch * p.heads;
  const long long want = (2LL * sms + heads_total - 1) / heads_total;  // about two blocks per SM
  return int(std::clamp<long long>(want, 1, p.Tr()));
}

void launch_fa1_forward(const Problem& p, int query_split, const float* Q, const float* K, const float* V, float* O,
                        float* m, float* l, float* LSE) {
  const int Tr = p.Tr();
  const int split = std::clamp(query_split, 1, Tr);
  const int tiles_per_block = (Tr + split - 1) / split;
  const int blocks = (Tr + tiles_per_block - 1) / tiles_per_block;
  const std::size_t ld = smem_pitch(p.head_dim);
  const std::size_t smem =
      ((2 * std::size_t(p.Bc) + 2 * std::size_t(p.Br)) * ld + std::size_t(p.Br) * (p.Bc + 1) +
       5 * std::size_t(p.Br)) *
      sizeof(float);
  set_smem(reinterpret_cast<const void*>(&fa1_fwd_kernel), smem, "fa1_fwd_kernel", p);
  const dim3 grid(blocks, p.heads, p.batch);
  announce("fa1_fwd_kernel");
  fa1_fwd_kernel<<<grid, kThreads, smem>>>(p, tiles_per_block, Q, K, V, O, m, l, LSE);
  FLASHLAB_CUDA_CHECK_LAUNCH("fa1_fwd_kernel");
}

}  // namespace flashlab::cuda::detail
