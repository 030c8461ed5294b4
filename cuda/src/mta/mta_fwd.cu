// mta_fwd.cu — the clear MTA forward, tile for tile with reference/src/mta/flash_forward.cpp
// (Multi token attention in CUDA and Triton, "forward").
//
// One thread block per row tile i of one (batch, head): the reference's "Parallelize for i".
// The block loads the overlapping Q tile Q[I_s : I_s + B] (I_s = i·Br − Pq, Br = B − Pq) and walks
// the key tiles K, V[J_s : J_s + B] (J_s = j·Bc − Pk, Bc = B − 2Pk). Per (i, j): S_ij with the
// causal zeros, Conv2D on chip, the owned region [Pq, B) × [Pk, B − Pk) kept (the halo belongs to
// the neighbouring tiles), online softmax with α and β, and O read-modify-written in HBM: the
// whole tile O[I_s : I_s + B] is read and only its effective rows [Pq, B) are written back — the
// source's order, which the fast kernels replace by keeping O on chip (the FA2 order).
//
// The Pq halo rows of the loaded O tile belong to row tile i − 1, which another block is
// updating at the same time: they are read (the source reads the whole tile, and the traffic
// model counts it) but never written, and nothing computed from them reaches an effective row.
//
// fp32 on CUDA cores, one score or output element per thread and step: written to be read
// beside the reference, not to be fast.
#include "mta/mta_tile.cuh"

namespace flashlab::cuda::detail::mta {

__global__ void mta_zero_fill_kernel(float* __restrict__ x, std::size_t count) {
  for (std::size_t idx = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; idx < count;
       idx += std::size_t(gridDim.x) * blockDim.x)
    x[idx] = 0.f;
}

void launch_zero_fill(float* x, std::size_t count) {
  const unsigned blocks = unsigned(std::min<std::size_t>((count + kThreads - 1) / kThreads, 4096));
  announce("mta_zero_fill");
  mta_zero_fill_kernel<<<blocks > 0 ? blocks : 1, kThreads>>>(x, count);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_zero_fill");
}

/// Shared floats of mta_fwd_kernel: Q_i, K_j, V_j, O tile (B × ld each), S_ij and Ŝ_ij (B × sp),
/// W (cq·ck), and m_i, ℓ_i, α, β (B each).
static std::size_t fwd_smem_floats(const Launch& L) {
  return 4 * std::size_t(L.block) * L.ld() + 2 * std::size_t(L.block) * L.sp() + L.taps() + 4 * std::size_t(L.block);
}

/// Grid (Tr, H, B), kThreads threads.
__global__ void mta_fwd_kernel(Launch L, const float* __restrict__ Q, const float* __restrict__ K,
                               const float* __restrict__ V, const float* __restrict__ W, float* __restrict__ O,
                               float* __restrict__ M, float* __restrict__ Lsum) {
  const int B = L.block, n = L.seq, d = L.head_dim, ld = L.ld(), sp = L.sp(), pq = L.pq, pk = L.pk;
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::size_t stride = L.row_stride(), base = L.head_offset(b, h);
  const int is = i * L.br - pq;  // I_s: the loaded Q tile starts Pq rows above I_s^eff

  extern __shared__ float smem[];
  float* q_i = smem;               // [B][ld]
  float* k_j = q_i + B * ld;       // [B][ld]
  float* v_j = k_j + B * ld;       // [B][ld]
  float* o_acc = v_j + B * ld;     // [B][ld]  the O tile being read-modify-written
  float* s_ij = o_acc + B * ld;    // [B][sp]  S_ij
  float* s_hat = s_ij + B * sp;    // [B][sp]  Ŝ_ij, then P̃_ij in place
  float* w = s_hat + B * sp;       // [cq·ck]
  float* m_i = w + L.taps();       // [B]
  float* l_i = m_i + B;            // [B]
  float* alpha = l_i + B;          // [B]
  float* beta = alpha + B;         // [B]

  // "Load W from HBM to SRAM"; ℓ_i = 1, m_i = −∞ (ℓ's start value never matters: α = 0 first).
  load_w(w, W + std::size_t(h) * L.taps(), L.taps());
  for (int r = threadIdx.x; r < B; r += blockDim.x) {
    m_i[r] = neg_inf();
    l_i[r] = 1.f;
  }

  for (int j = 0; j < L.tc; ++j) {
    const int js = j * L.bc - pk;  // J_s: Pk halo columns on each side
    // Load the overlapping tiles Q[I_s:I_e], K[J_s:J_e], V[J_s:J_e] and O[I_s:I_e]: HBM → SRAM.
    load_tile(q_i, ld, Q + base, stride, is, B, n, d);
    load_tile(k_j, ld, K + base, stride, js, B, n, d);
    load_tile(v_j, ld, V + base, stride, js, B, n, d);
    load_tile(o_acc, ld, O + base, stride, is, B, n, d);
    __syncthreads();  // tiles (and, on j = 0, W and the statistics) complete before use

    scores(s_ij, sp, q_i, k_j, ld, B, B, d, L.scale, is, js);
    __syncthreads();  // S_ij complete before the convolution reads its neighbours

    // Ŝ_ij = Conv2D(S_ij, W) on the owned region; halo columns, keys past N and future keys → −∞.
    for (int idx = threadIdx.x; idx < B * B; idx += blockDim.x) {
      const int r = idx / B, c = idx % B, gc = js + c;
      const bool owned = c >= pk && c < B - pk && gc < n && gc <= is + r;
      s_hat[r * sp + c] = owned ? conv_at(s_ij, sp, B, B, w, L.cq, L.ck, r, c) : neg_inf();
    }
    __syncthreads();  // Ŝ_ij complete before its row owner takes max and sum

    // Online softmax, one thread per row: m̃, P̃ (in place of Ŝ), ℓ̃; m_new, α, β; ℓ_i. A row with
    // nothing visible keeps −∞ / 0 (e^{−∞ − (−∞)} is never formed).
    for (int r = threadIdx.x; r < B; r += blockDim.x) {
      float m_tilde = neg_inf();
      for (int c = 0; c < B; ++c) m_tilde = fmaxf(m_tilde, s_hat[r * sp + c]);
      float l_tilde = 0.f;
      for (int c = 0; c < B; ++c) {
        const float p = m_tilde == neg_inf() ? 0.f : expf(s_hat[r * sp + c] - m_tilde);
        s_hat[r * sp + c] = p;
        l_tilde += p;
      }
      const float m_new = fmaxf(m_i[r], m_tilde);
      const bool empty = m_new == neg_inf();
      alpha[r] = empty ? 1.f : expf(m_i[r] - m_new);
      beta[r] = empty ? 0.f : expf(m_tilde - m_new);
      l_i[r] = alpha[r] * l_i[r] + beta[r] * l_tilde;
      m_i[r] = m_new;
    }
    __syncthreads();  // P̃, α, β complete before the O update reads them

    // O ← diag(α)·O + diag(β)·P̃_ij V_j on the whole tile (SRAM) …
    for (int idx = threadIdx.x; idx < B * d; idx += blockDim.x) {
      const int r = idx / d, k = idx % d;
      float pv = 0.f;
      for (int c = 0; c < B; ++c) pv = fmaf(s_hat[r * sp + c], v_j[c * ld + k], pv);
      o_acc[r * ld + k] = alpha[r] * o_acc[r * ld + k] + beta[r] * pv;
    }
    __syncthreads();  // the whole tile is updated before the store reads other threads' rows
    // … and only the effective rows [Pq, B) go back to HBM.
    store_tile(O + base, stride, o_acc, ld, is, pq, L.br, n, d);
    __syncthreads();  // stores done (visible to the block) before the next tile loads O again
  }

  // Finalisation: load O[I_s^eff : I_e^eff], divide row r by ℓ_i[Pq + r], write it back; then
  // M = m_i[Pq:B], L = ℓ_i[Pq:B].
  const int ie = i * L.br;
  load_tile(o_acc, ld, O + base, stride, ie, L.br, n, d);
  __syncthreads();  // the effective rows are loaded before the scaled store reads them
  for (int idx = threadIdx.x; idx < L.br * d; idx += blockDim.x) {
    const int r = idx / d, k = idx % d;
    if (ie + r < n) O[base + std::size_t(ie + r) * stride + k] = o_acc[r * ld + k] / l_i[pq + r];
  }
  const std::size_t so = L.stat_offset(b, h);
  for (int r = threadIdx.x; r < L.br; r += blockDim.x)
    if (ie + r < n) {
      M[so + ie + r] = m_i[pq + r];
      Lsum[so + ie + r] = l_i[pq + r];
    }
}

void launch_forward(const Launch& L, const float* Q, const float* K, const float* V, const float* W, float* O,
                    float* M, float* Lsum) {
  const std::size_t smem = fwd_smem_floats(L) * sizeof(float);
  set_smem(reinterpret_cast<const void*>(&mta_fwd_kernel), smem, "mta_fwd_kernel", L);
  const dim3 grid(L.tr, L.heads, L.batch);
  announce("mta_fwd_kernel");
  mta_fwd_kernel<<<grid, kThreads, smem>>>(L, Q, K, V, W, O, M, Lsum);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_fwd_kernel");
}

}  // namespace flashlab::cuda::detail::mta
