// attention_fa2_fwd.cu — FlashAttention forward, FA2 loop order, LSE in base 2 (the Triton walkthrough).
//
// What it does: O = softmax(Q Kᵀ · scale) V one head at a time, without ever writing the N × N
// scores. One thread block owns one query tile Q_i (BLOCK_M = Br rows) and walks every key tile
// K_j, V_j (BLOCK_N = Bc rows) with the online softmax in base 2; at the end it writes
// O_i = acc / l_i and LSE_i = m_i + log2(l_i) (the only statistic the backward pass needs).
// Reference: reference/src/attention (fa2 forward), same names and loop; it exposes the same
// intermediates (m_i, l_i, acc). This kernel never produces S or P outside shared memory.
//
// HBM traffic of one block (the model of reference/): Q_i once, every K_j and V_j once
// (causal: only the tiles at or left of the diagonal), O_i and LSE_i once.
//
// How to run: flashlab::cuda::attention_forward(ref::Algorithm::fa2_fwd, problem, Q, K, V), or
// `flashlab traffic attention --device cuda --variant fa2 --seq 4096`.
//
// Honest performance note: fp32 on CUDA cores, every operand read from shared memory, one
// score or one output element per thread and iteration. It is written to be read beside the
// reference, not to be fast: expect a few TFLOP/s where cuDNN reaches hundreds in bf16.
#include "attention/launchers.hpp"
#include "attention/tile.cuh"

namespace flashlab::cuda::detail {

/// Grid (Tr, H, B), kThreads threads; dynamic shared memory laid out in flash_fwd_smem_floats().
__global__ void flash_fwd_kernel(Problem p, const float* __restrict__ Q, const float* __restrict__ K,
                                 const float* __restrict__ V, float* __restrict__ O, float* __restrict__ LSE) {
  const int Br = p.Br, Bc = p.Bc, d = p.head_dim, N = p.seq;
  const int ld = smem_pitch(d);  // row pitch of the d-wide tiles
  const int sp = Bc + 1;         // row pitch of S_ij (padded against bank conflicts)
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int row0 = i * Br;  // first query row of Q_i
  const std::size_t stride = p.row_stride();
  const std::size_t base = p.head_offset(b, h);

  extern __shared__ float smem[];
  float* Q_i = smem;                // [Br][ld]
  float* K_j = Q_i + Br * ld;       // [Bc][ld]
  float* V_j = K_j + Bc * ld;       // [Bc][ld]
  float* acc = V_j + Bc * ld;       // [Br][ld]  unnormalised O_i
  float* S_ij = acc + Br * ld;      // [Br][sp]  scores, then P_ij
  float* m_i = S_ij + Br * sp;      // [Br]      running max (base-2 units)
  float* l_i = m_i + Br;            // [Br]      running sum of 2^(S - m_i)
  float* alpha = l_i + Br;          // [Br]      α = 2^(m_i - m_new) of this step

  // Load Q_i: HBM → SRAM, once for the whole loop. acc = 0, m_i = -inf, l_i = 0 (SRAM only).
  load_rows(Q_i, ld, Q + base, stride, row0, Br, N, d);
  fill_tile(acc, Br * ld, 0.f);
  for (int r = threadIdx.x; r < Br; r += blockDim.x) {
    m_i[r] = neg_inf();
    l_i[r] = 0.f;
  }
  __syncthreads();  // Q_i, acc, m_i, l_i are complete before any thread reads them

  // Causal: key tiles starting past this tile's last query row are entirely masked — skip them.
  const int n_end = p.causal ? min(N, row0 + Br) : N;
  const int Tc = (n_end + Bc - 1) / Bc;  // key tiles this block visits
  for (int j = 0; j < Tc; ++j) {
    const int start_n = j * Bc;  // first key of K_j
    // Load K_j, V_j: HBM → SRAM (rows past N are zero and masked below).
    load_rows(K_j, ld, K + base, stride, start_n, Bc, N, d);
    load_rows(V_j, ld, V + base, stride, start_n, Bc, N, d);
    __syncthreads();  // K_j complete before S_ij = Q_i K_jᵀ reads it (V_j before P_ij V_j)

    // S_ij = Q_i K_jᵀ · scale·log2(e); out-of-sequence and (causal) future keys = -inf, so that
    // 2^(-inf) = 0 adds nothing to l_i or acc (the Triton walkthrough, "Out-of-Sequence Masking"). SRAM only.
    for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x) {
      const int r = idx / Bc, c = idx % Bc;
      S_ij[r * sp + c] = visible(p, row0 + r, start_n + c) ? dot_row(Q_i + r * ld, K_j + c * ld, d) * p.scale_log2
                                                            : neg_inf();
    }
    __syncthreads();  // the whole row of S_ij is written before its owner thread takes max and sum

    // Online softmax, one thread per row (base 2, as in the Triton walkthrough):
    //   m_new = max(m_i, rowmax(S_ij)); P_ij = 2^(S_ij - m_new); alpha = 2^(m_i - m_new);
    //   l_i = l_i·alpha + rowsum(P_ij). P_ij overwrites S_ij in place.
    for (int r = threadIdx.x; r < Br; r += blockDim.x) {
      float m_new = m_i[r];
      for (int c = 0; c < Bc; ++c) m_new = fmaxf(m_new, S_ij[r * sp + c]);
      // A row that has seen only masked scores (only padding rows past N can) keeps m = -inf;
      // subtracting 0 instead keeps 2^(-inf - m) = 0 rather than 2^(-inf + inf) = NaN.
      const float m_ref = m_new == neg_inf() ? 0.f : m_new;
      float row_sum = 0.f;
      for (int c = 0; c < Bc; ++c) {
        const float p_rc = exp2f(S_ij[r * sp + c] - m_ref);
        S_ij[r * sp + c] = p_rc;
        row_sum += p_rc;
      }
      alpha[r] = exp2f(m_i[r] - m_ref);
      l_i[r] = l_i[r] * alpha[r] + row_sum;
      m_i[r] = m_new;
    }
    __syncthreads();  // P_ij and alpha are final before acc = diag(alpha)·acc + P_ij V_j reads them

    // acc = diag(alpha)·acc + P_ij V_j. SRAM only.
    for (int idx = threadIdx.x; idx < Br * d; idx += blockDim.x) {
      const int r = idx / d, k = idx % d;
      float o = acc[r * ld + k] * alpha[r];
      for (int c = 0; c < Bc; ++c) o = fmaf(S_ij[r * sp + c], V_j[c * ld + k], o);
      acc[r * ld + k] = o;
    }
    __syncthreads();  // all reads of K_j, V_j, P_ij are done before the next iteration overwrites them
  }

  // O_i = acc / l_i: SRAM → HBM. LSE_i = m_i + log2(l_i): SRAM → HBM (the only statistic kept).
  // Guard l_i = 0 (a row that saw no key): O_i = 0 and LSE_i = −inf, as at every level.
  for (int r = threadIdx.x; r < Br; r += blockDim.x) alpha[r] = l_i[r] > 0.f ? 1.f / l_i[r] : 0.f;
  __syncthreads();  // 1/l_i is ready before the store reads it
  store_rows(O + base, stride, acc, ld, alpha, row0, Br, N, d);
  for (int r = threadIdx.x; r < Br; r += blockDim.x)
    if (row0 + r < N) LSE[p.stat_offset(b, h) + row0 + r] = l_i[r] > 0.f ? m_i[r] + log2f(l_i[r]) : neg_inf();
}

/// Shared floats of flash_fwd_kernel: Q_i, K_j, V_j, acc (d-wide), S_ij, and three row vectors.
static std::size_t flash_fwd_smem_floats(const Problem& p) {
  const std::size_t ld = smem_pitch(p.head_dim);
  return (2 * std::size_t(p.Br) + 2 * std::size_t(p.Bc)) * ld + std::size_t(p.Br) * (p.Bc + 1) +
         3 * std::size_t(p.Br);
}

void launch_flash_forward(const Problem& p, const float* Q, const float* K, const float* V, float* O, float* LSE) {
  const std::size_t smem = flash_fwd_smem_floats(p) * sizeof(float);
  set_smem(reinterpret_cast<const void*>(&flash_fwd_kernel), smem, "flash_fwd_kernel", p);
  const dim3 grid(p.Tr(), p.heads, p.batch);
  announce("flash_fwd_kernel");
  flash_fwd_kernel<<<grid, kThreads, smem>>>(p, Q, K, V, O, LSE);
  FLASHLAB_CUDA_CHECK_LAUNCH("flash_fwd_kernel");
}

}  // namespace flashlab::cuda::detail
