// attention_bwd_atomic.cu — FlashAttention backward as ONE kernel with atomic dQ (the Triton walkthrough,
// "Architecture Design: Triton vs. CUDA"; the FA2 CUDA release's choice).
//
// Same as bwd_dkdv_kernel in attention_bwd.cu — one block per K_j, V_j, inner loop over Q_i,
// dO_i, dK_j and dV_j accumulated in SRAM — plus, in the same iteration, dQ_i += dS_ij K_j added
// straight into HBM with atomicAdd, because every key-tile block contributes to every dQ_i.
// Q_i K_jᵀ and P_ij are computed once: 10N²d FLOPs instead of 12N²d.
// Before it: bwd_preprocess_kernel (D_i, shared with attention_bwd.cu) and zero_fill_kernel
// (dQ = 0 in HBM, since the kernel only ever adds into it).
//
// HBM traffic (model of reference/): as the dK/dV kernel, plus a read-modify-write of dQ_i per
// (i, j) tile pair: the atomics are performed in L2 (RED instructions), so they appear as L2
// "red" sectors, and reach DRAM only when a dQ line is evicted.
//
// Honest performance note: Tc blocks hammer the same dQ_i rows; in fp32 that is fine at these
// sizes, and the result is not bit-for-bit reproducible run to run (float addition order varies).
// How to run: attention_backward(ref::Algorithm::bwd_atomic, problem, ...) or
// `flashlab traffic attention --device cuda --variant atomic --seq 4096`.
#include "attention/launchers.hpp"
#include "attention/tile.cuh"

namespace flashlab::cuda::detail {

/// dQ = 0: grid-stride fill over the B·N·H·d elements (HBM write of dQ, once).
__global__ void zero_fill_kernel(float* __restrict__ x, std::size_t n) {
  for (std::size_t idx = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; idx < n;
       idx += std::size_t(gridDim.x) * blockDim.x)
    x[idx] = 0.f;
}

/// Grid (Tc, H, B). Shared memory as bwd_dkdv_kernel.
__global__ void bwd_atomic_kernel(Problem p, const float* __restrict__ Q, const float* __restrict__ K,
                                  const float* __restrict__ V, const float* __restrict__ dO,
                                  const float* __restrict__ LSE, const float* __restrict__ D, float* __restrict__ dQ,
                                  float* __restrict__ dK, float* __restrict__ dV) {
  const int Br = p.Br, Bc = p.Bc, d = p.head_dim, N = p.seq;
  const int ld = smem_pitch(d), sp = Bc + 1;
  const int j = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int start_n = j * Bc;
  const std::size_t stride = p.row_stride(), base = p.head_offset(b, h), sbase = p.stat_offset(b, h);

  extern __shared__ float smem[];
  float* K_j = smem;               // [Bc][ld]
  float* V_j = K_j + Bc * ld;      // [Bc][ld]
  float* dK_j = V_j + Bc * ld;     // [Bc][ld]  accumulator
  float* dV_j = dK_j + Bc * ld;    // [Bc][ld]  accumulator
  float* Q_i = dV_j + Bc * ld;     // [Br][ld]
  float* dO_i = Q_i + Br * ld;     // [Br][ld]
  float* P_ij = dO_i + Br * ld;    // [Br][sp]
  float* dS_ij = P_ij + Br * sp;   // [Br][sp]
  float* LSE_i = dS_ij + Br * sp;  // [Br]
  float* D_i = LSE_i + Br;         // [Br]

  // Load K_j, V_j: HBM → SRAM, once. dK_j = dV_j = 0 in SRAM.
  load_rows(K_j, ld, K + base, stride, start_n, Bc, N, d);
  load_rows(V_j, ld, V + base, stride, start_n, Bc, N, d);
  fill_tile(dK_j, Bc * ld, 0.f);
  fill_tile(dV_j, Bc * ld, 0.f);

  const int i_begin = p.causal ? start_n / Br : 0;  // causal: earlier query tiles see nothing
  for (int i = i_begin; i < p.Tr(); ++i) {
    const int row0 = i * Br;  // first query row of Q_i
    // Load Q_i, dO_i, LSE_i, D_i: HBM → SRAM.
    load_rows(Q_i, ld, Q + base, stride, row0, Br, N, d);
    load_rows(dO_i, ld, dO + base, stride, row0, Br, N, d);
    load_lse(LSE_i, LSE + sbase, row0, Br, N);
    load_stats(D_i, D + sbase, row0, Br, N);
    __syncthreads();  // Q_i, dO_i, LSE_i, D_i (and, first time, K_j, V_j, dK_j, dV_j) are complete

    // P_ij (masked → 0), dS_ij = P_ij ∘ (dO_i V_jᵀ − D_i) · scale. SRAM only.
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
    __syncthreads();  // P_ij, dS_ij complete before the products below read whole rows/columns

    // dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i. SRAM only.
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
    // dQ_i += dS_ij K_j: SRAM → HBM by atomicAdd (a read-modify-write performed in L2), one per
    // element of dQ_i and key tile. Consecutive threads add to consecutive floats of one row.
    for (int idx = threadIdx.x; idx < Br * d; idx += blockDim.x) {
      const int r = idx / d, k = idx % d;
      if (row0 + r >= N) continue;
      float acc = 0.f;
      for (int c = 0; c < Bc; ++c) acc = fmaf(dS_ij[r * sp + c], K_j[c * ld + k], acc);
      atomicAdd(dQ + base + std::size_t(row0 + r) * stride + k, acc);
    }
    __syncthreads();  // reads of Q_i, dO_i, P_ij, dS_ij done before the next iteration overwrites them
  }
  __syncthreads();  // dK_j, dV_j final (also orders the zero fills when no query tile was visited)
  // dK_j, dV_j: SRAM → HBM, once.
  store_rows(dK + base, stride, dK_j, ld, nullptr, start_n, Bc, N, d);
  store_rows(dV + base, stride, dV_j, ld, nullptr, start_n, Bc, N, d);
}

void launch_zero_fill(const Problem& p, float* dQ) {
  const std::size_t n = std::size_t(p.batch) * p.seq * p.row_stride();
  const unsigned blocks = unsigned(std::min<std::size_t>((n + kThreads - 1) / kThreads, 65535));
  announce("zero_fill_kernel");
  zero_fill_kernel<<<blocks, kThreads>>>(dQ, n);
  FLASHLAB_CUDA_CHECK_LAUNCH("zero_fill_kernel");
}

void launch_bwd_atomic(const Problem& p, const float* Q, const float* K, const float* V, const float* dO,
                       const float* LSE, const float* D, float* dQ, float* dK, float* dV) {
  const std::size_t smem = bwd_dkdv_smem_floats(p) * sizeof(float);
  set_smem(reinterpret_cast<const void*>(&bwd_atomic_kernel), smem, "bwd_atomic_kernel", p);
  const dim3 grid(p.Tc(), p.heads, p.batch);
  announce("bwd_atomic_kernel");
  bwd_atomic_kernel<<<grid, kThreads, smem>>>(p, Q, K, V, dO, LSE, D, dQ, dK, dV);
  FLASHLAB_CUDA_CHECK_LAUNCH("bwd_atomic_kernel");
}

}  // namespace flashlab::cuda::detail
