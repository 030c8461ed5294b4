// attention_bwd.cu — FlashAttention backward as three kernels (the Triton walkthrough, "Backward Pass"):
//
//   1. bwd_preprocess_kernel  D_i = rowsum(dO_i ∘ O_i)                 (the O(N·d) D trick)
//   2. bwd_dq_kernel          one block per Q_i, loop over K_j, V_j:  dQ_i = Σ_j dS_ij K_j
//   3. bwd_dkdv_kernel        one block per K_j, V_j, loop over Q_i: dV_j = Σ_i P_ijᵀ dO_i,
//                                                                    dK_j = Σ_i dS_ijᵀ Q_i
// with, recomputed in SRAM from the forward's base-2 LSE:
//   P_ij  = 2^(Q_i K_jᵀ · scale·log2 e − LSE_i)   (masked scores → P = 0: the NaN hazard)
//   dP_ij = dO_i V_jᵀ,   dS_ij = P_ij ∘ (dP_ij − D_i) · scale.
// S, P, dP and dS never leave shared memory. Every gradient accumulates in SRAM and is written
// once, so no atomics are needed; the price is computing Q_i K_jᵀ and P_ij twice (12N²d FLOPs
// instead of 10N²d, see attention_bwd_atomic.cu). Reference: reference/src/attention (two-kernel
// backward), same loops and names.
//
// HBM traffic (model of reference/): preprocess reads O, dO and writes D; the dQ kernel reads
// Q_i, dO_i, LSE_i, D_i once per block and every K_j, V_j once per block, writes dQ_i once; the
// dK/dV kernel reads K_j, V_j once per block and every Q_i, dO_i, LSE_i, D_i once per block,
// writes dK_j, dV_j once. Causal: tiles entirely above the diagonal are skipped.
//
// Masking: we mask query rows past N explicitly as well (the Triton walkthrough relies on zero padding of Q and
// dO there); it costs no traffic and keeps the kernels correct for any padding contents.
//
// Honest performance note: fp32 CUDA-core code written for reading, several times slower than a
// tuned kernel. How to run: flashlab::cuda::attention_backward(ref::Algorithm::bwd_two_kernel, problem, ...)
// or `flashlab traffic attention --device cuda --variant bwd --seq 4096`.
#include "attention/launchers.hpp"
#include "attention/tile.cuh"

namespace flashlab::cuda::detail {

// ---------------------------------------------------------------------------------------------
// 1. D preprocessing: grid (Tr, H, B); one warp per row, lanes stride over d; the Br values of
//    D_i are gathered in SRAM and written with one coalesced store (one 4-byte store per row
//    would touch a whole 32-byte sector each: 8× the bytes at L2).
//    HBM traffic: O_i and dO_i read once, D_i written once.
__global__ void bwd_preprocess_kernel(Problem p, const float* __restrict__ O, const float* __restrict__ dO,
                                      float* __restrict__ D) {
  __shared__ float D_i[128];  // BLOCK_M <= 128 (make_problem checks)
  const int h = blockIdx.y, b = blockIdx.z;
  const int row0 = blockIdx.x * p.Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const std::size_t stride = p.row_stride(), base = p.head_offset(b, h);
  for (int r = warp; r < p.Br; r += warps) {
    const int row = row0 + r;
    if (row >= p.seq) break;
    float sum = 0.f;
    // O[row, :], dO[row, :]: HBM → registers, consecutive lanes read consecutive floats.
    for (int k = lane; k < p.head_dim; k += 32)
      sum = fmaf(__ldcg(O + base + std::size_t(row) * stride + k), __ldcg(dO + base + std::size_t(row) * stride + k),
                 sum);
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);  // warp sum
    if (lane == 0) D_i[r] = sum;
  }
  __syncthreads();  // every row's D_i is in SRAM before the block stores them together
  for (int r = threadIdx.x; r < p.Br; r += blockDim.x)
    if (row0 + r < p.seq) D[p.stat_offset(b, h) + row0 + r] = D_i[r];  // D_i: SRAM → HBM
}

// ---------------------------------------------------------------------------------------------
// 2. dQ kernel: grid (Tr, H, B). Q_i, dO_i, LSE_i, D_i and dQ_i stay in SRAM; K_j, V_j stream.
__global__ void bwd_dq_kernel(Problem p, const float* __restrict__ Q, const float* __restrict__ K,
                              const float* __restrict__ V, const float* __restrict__ dO, const float* __restrict__ LSE,
                              const float* __restrict__ D, float* __restrict__ dQ) {
  const int Br = p.Br, Bc = p.Bc, d = p.head_dim, N = p.seq;
  const int ld = smem_pitch(d), sp = Bc + 1;
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int row0 = i * Br;
  const std::size_t stride = p.row_stride(), base = p.head_offset(b, h), sbase = p.stat_offset(b, h);

  extern __shared__ float smem[];
  float* Q_i = smem;             // [Br][ld]
  float* dO_i = Q_i + Br * ld;   // [Br][ld]
  float* dQ_i = dO_i + Br * ld;  // [Br][ld]  accumulator
  float* K_j = dQ_i + Br * ld;   // [Bc][ld]
  float* V_j = K_j + Bc * ld;    // [Bc][ld]
  float* dS_ij = V_j + Bc * ld;  // [Br][sp]
  float* LSE_i = dS_ij + Br * sp;  // [Br]
  float* D_i = LSE_i + Br;         // [Br]

  // Load Q_i, dO_i, LSE_i, D_i: HBM → SRAM, once. dQ_i = 0 in SRAM.
  load_rows(Q_i, ld, Q + base, stride, row0, Br, N, d);
  load_rows(dO_i, ld, dO + base, stride, row0, Br, N, d);
  load_lse(LSE_i, LSE + sbase, row0, Br, N);
  load_stats(D_i, D + sbase, row0, Br, N);
  fill_tile(dQ_i, Br * ld, 0.f);
  __syncthreads();  // the resident tiles are complete before the loop reads them

  const int n_end = p.causal ? min(N, row0 + Br) : N;  // causal: skip fully masked key tiles
  const int Tc = (n_end + Bc - 1) / Bc;  // key tiles this block visits
  for (int j = 0; j < Tc; ++j) {
    const int start_n = j * Bc;  // first key of K_j
    // Load K_j, V_j: HBM → SRAM.
    load_rows(K_j, ld, K + base, stride, start_n, Bc, N, d);
    load_rows(V_j, ld, V + base, stride, start_n, Bc, N, d);
    __syncthreads();  // K_j, V_j complete before the recomputation reads them

    // Recompute P_ij = 2^(Q_i K_jᵀ·scale·log2e − LSE_i) (masked → 0), dP_ij = dO_i V_jᵀ,
    // dS_ij = P_ij ∘ (dP_ij − D_i) · scale. One element per thread; SRAM only.
    for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x) {
      const int r = idx / Bc, c = idx % Bc;
      float ds = 0.f;
      if (visible(p, row0 + r, start_n + c)) {
        const float p_rc = exp2f(dot_row(Q_i + r * ld, K_j + c * ld, d) * p.scale_log2 - LSE_i[r]);
        const float dp_rc = dot_row(dO_i + r * ld, V_j + c * ld, d);
        ds = p_rc * (dp_rc - D_i[r]) * p.scale;
      }
      dS_ij[r * sp + c] = ds;
    }
    __syncthreads();  // dS_ij complete before dQ_i += dS_ij K_j reads whole rows of it

    // dQ_i += dS_ij K_j. SRAM only.
    for (int idx = threadIdx.x; idx < Br * d; idx += blockDim.x) {
      const int r = idx / d, k = idx % d;
      float acc = dQ_i[r * ld + k];
      for (int c = 0; c < Bc; ++c) acc = fmaf(dS_ij[r * sp + c], K_j[c * ld + k], acc);
      dQ_i[r * ld + k] = acc;
    }
    __syncthreads();  // reads of K_j, V_j, dS_ij done before the next iteration overwrites them
  }
  // dQ_i: SRAM → HBM, once.
  store_rows(dQ + base, stride, dQ_i, ld, nullptr, row0, Br, N, d);
}

// ---------------------------------------------------------------------------------------------
// 3. dK/dV kernel: grid (Tc, H, B). K_j, V_j, dK_j, dV_j stay in SRAM; Q_i, dO_i, LSE_i, D_i stream.
__global__ void bwd_dkdv_kernel(Problem p, const float* __restrict__ Q, const float* __restrict__ K,
                                const float* __restrict__ V, const float* __restrict__ dO,
                                const float* __restrict__ LSE, const float* __restrict__ D, float* __restrict__ dK,
                                float* __restrict__ dV) {
  const int Br = p.Br, Bc = p.Bc, d = p.head_dim, N = p.seq;
  const int ld = smem_pitch(d), sp = Bc + 1;
  const int j = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int start_n = j * Bc;  // first key row of K_j
  const std::size_t stride = p.row_stride(), base = p.head_offset(b, h), sbase = p.stat_offset(b, h);

  extern __shared__ float smem[];
  float* K_j = smem;             // [Bc][ld]
  float* V_j = K_j + Bc * ld;    // [Bc][ld]
  float* dK_j = V_j + Bc * ld;   // [Bc][ld]  accumulator
  float* dV_j = dK_j + Bc * ld;  // [Bc][ld]  accumulator
  float* Q_i = dV_j + Bc * ld;   // [Br][ld]
  float* dO_i = Q_i + Br * ld;   // [Br][ld]
  float* P_ij = dO_i + Br * ld;  // [Br][sp]
  float* dS_ij = P_ij + Br * sp; // [Br][sp]
  float* LSE_i = dS_ij + Br * sp;  // [Br]
  float* D_i = LSE_i + Br;         // [Br]

  // Load K_j, V_j: HBM → SRAM, once. dK_j = dV_j = 0 in SRAM.
  load_rows(K_j, ld, K + base, stride, start_n, Bc, N, d);
  load_rows(V_j, ld, V + base, stride, start_n, Bc, N, d);
  fill_tile(dK_j, Bc * ld, 0.f);
  fill_tile(dV_j, Bc * ld, 0.f);
  // (no barrier needed here: the barrier after the first Q_i load below orders these too)

  // Causal: query tiles that end before this key tile starts see none of it — start at the
  // tile holding row start_n.
  const int i_begin = p.causal ? start_n / Br : 0;
  for (int i = i_begin; i < p.Tr(); ++i) {
    const int row0 = i * Br;  // first query row of Q_i
    // Load Q_i, dO_i, LSE_i, D_i: HBM → SRAM.
    load_rows(Q_i, ld, Q + base, stride, row0, Br, N, d);
    load_rows(dO_i, ld, dO + base, stride, row0, Br, N, d);
    load_lse(LSE_i, LSE + sbase, row0, Br, N);
    load_stats(D_i, D + sbase, row0, Br, N);
    __syncthreads();  // Q_i, dO_i, LSE_i, D_i (and, first time, K_j, V_j, dK_j, dV_j) are complete

    // Recompute P_ij (masked → 0) and dS_ij = P_ij ∘ (dO_i V_jᵀ − D_i) · scale. SRAM only.
    for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x) {
      const int r = idx / Bc, c = idx % Bc;
      float p_rc = 0.f, ds = 0.f;
      if (visible(p, row0 + r, start_n + c)) {
        p_rc = exp2f(dot_row(Q_i + r * ld, K_j + c * ld, d) * p.scale_log2 - LSE_i[r]);
        ds = p_rc * (dot_row(dO_i + r * ld, V_j + c * ld, d) - D_i[r]) * p.scale;
      }
      P_ij[r * sp + c] = p_rc;
      dS_ij[r * sp + c] = ds;
    }
    __syncthreads();  // P_ij, dS_ij complete before the column sums below read whole columns

    // dV_j += P_ijᵀ dO_i and dK_j += dS_ijᵀ Q_i. SRAM only.
    for (int idx = threadIdx.x; idx < Bc * d; idx += blockDim.x) {
      const int c = idx / d, k = idx % d;
      float dv = dV_j[c * ld + k], dk = dK_j[c * ld + k];
      for (int r = 0; r < Br; ++r) {
        dv = fmaf(P_ij[r * sp + c], dO_i[r * ld + k], dv);
        dk = fmaf(dS_ij[r * sp + c], Q_i[r * ld + k], dk);
      }
      dV_j[c * ld + k] = dv;
      dK_j[c * ld + k] = dk;
    }
    __syncthreads();  // reads of Q_i, dO_i, P_ij, dS_ij done before the next iteration overwrites them
  }
  // dK_j, dV_j: SRAM → HBM, once. (If the loop ran zero times — impossible for N ≥ 1 — the fills
  // above would be unordered with these stores, so keep a barrier.)
  __syncthreads();  // dK_j, dV_j final (also orders the zero fills when no query tile was visited)
  store_rows(dK + base, stride, dK_j, ld, nullptr, start_n, Bc, N, d);
  store_rows(dV + base, stride, dV_j, ld, nullptr, start_n, Bc, N, d);
}

// ---------------------------------------------------------------------------------------------
// Launchers.

void launch_bwd_preprocess(const Problem& p, const float* O, const float* dO, float* D) {
  const dim3 grid(p.Tr(), p.heads, p.batch);
  announce("bwd_preprocess_kernel");
  bwd_preprocess_kernel<<<grid, kThreads>>>(p, O, dO, D);
  FLASHLAB_CUDA_CHECK_LAUNCH("bwd_preprocess_kernel");
}

void launch_bwd_dq(const Problem& p, const float* Q, const float* K, const float* V, const float* dO,
                   const float* LSE, const float* D, float* dQ) {
  const std::size_t ld = smem_pitch(p.head_dim);
  const std::size_t smem =
      ((3 * std::size_t(p.Br) + 2 * std::size_t(p.Bc)) * ld + std::size_t(p.Br) * (p.Bc + 1) +
       2 * std::size_t(p.Br)) *
      sizeof(float);
  set_smem(reinterpret_cast<const void*>(&bwd_dq_kernel), smem, "bwd_dq_kernel", p);
  const dim3 grid(p.Tr(), p.heads, p.batch);
  announce("bwd_dq_kernel");
  bwd_dq_kernel<<<grid, kThreads, smem>>>(p, Q, K, V, dO, LSE, D, dQ);
  FLASHLAB_CUDA_CHECK_LAUNCH("bwd_dq_kernel");
}

/// Shared floats of bwd_dkdv_kernel and bwd_atomic_kernel (the same tiles).
std::size_t bwd_dkdv_smem_floats(const Problem& p) {
  const std::size_t ld = smem_pitch(p.head_dim);
  return (4 * std::size_t(p.Bc) + 2 * std::size_t(p.Br)) * ld +
         2 * std::size_t(p.Br) * (p.Bc + 1) + 2 * std::size_t(p.Br);
}

void launch_bwd_dkdv(const Problem& p, const float* Q, const float* K, const float* V, const float* dO,
                     const float* LSE, const float* D, float* dK, float* dV) {
  const std::size_t smem = bwd_dkdv_smem_floats(p) * sizeof(float);
  set_smem(reinterpret_cast<const void*>(&bwd_dkdv_kernel), smem, "bwd_dkdv_kernel", p);
  const dim3 grid(p.Tc(), p.heads, p.batch);
  announce("bwd_dkdv_kernel");
  bwd_dkdv_kernel<<<grid, kThreads, smem>>>(p, Q, K, V, dO, LSE, D, dK, dV);
  FLASHLAB_CUDA_CHECK_LAUNCH("bwd_dkdv_kernel");
}

}  // namespace flashlab::cuda::detail
