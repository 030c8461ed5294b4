// attention_naive.cu — standard attention that materialises S and P in HBM: the traffic baseline
// (the Triton walkthrough, "Formulation": S = QKᵀ/√d, P = softmax(S), O = PV).
//
// Three kernels, one per line of the formula, mirroring naive_forward in
// reference/src/attention/forward.cpp (scores kept in base 2, S·log2 e, so LSE means the same as
// in the flash kernels):
//   naive_scores_kernel   S = Q Kᵀ · scale·log2 e (causal entries −inf)   Q, K → S (N × N per head)
//   naive_softmax_kernel  P = softmax₂(S), LSE = m + log2 l, row by row    S → P, LSE
//   naive_pv_kernel       O = P V                                          P, V → O
// S and P are [B, H, N, N] fp32 buffers: 4·N² bytes per head each (1 GiB per head at N = 16384).
//
// Traffic versus the model: the reference counts each operand once per step (an ideal machine
// that holds all of K while it writes S). These kernels are tiled like the flash kernels, so
// K is read once per query tile in step 1 and V once per query tile in step 3: + (Tr − 1)·N·d
// elements each, which the traffic command reports as the "tile re-read" gap. The N² terms —
// S written and read, P written and read — are exact.
//
// Honest performance note: memory-bound by design (4·N² floats per head through HBM); the
// softmax holds one row of S in shared memory, so N is limited to naive_max_seq() (≈ 56k).
// How to run: attention_forward(ref::Algorithm::naive_fwd, problem, ...) or
// `flashlab traffic attention --device cuda --variant naive --seq 4096`.
#include "attention/launchers.hpp"
#include "attention/tile.cuh"

namespace flashlab::cuda::detail {

/// Row offset of head (b, h) in a [B, H, N, N] score buffer.
__host__ __device__ inline std::size_t score_offset(const Problem& p, int b, int h) {
  return (std::size_t(b) * p.heads + h) * std::size_t(p.seq) * p.seq;
}

/// Step 1, grid (Tr, H, B): Q_i resident, loop over K_j, write S_ij rows to HBM.
__global__ void naive_scores_kernel(Problem p, const float* __restrict__ Q, const float* __restrict__ K,
                                    float* __restrict__ S) {
  const int Br = p.Br, Bc = p.Bc, d = p.head_dim, N = p.seq;
  const int ld = smem_pitch(d);
  const int row0 = blockIdx.x * Br, h = blockIdx.y, b = blockIdx.z;
  const std::size_t stride = p.row_stride(), base = p.head_offset(b, h);
  float* S_head = S + score_offset(p, b, h);

  extern __shared__ float smem[];
  float* Q_i = smem;           // [Br][ld]
  float* K_j = Q_i + Br * ld;  // [Bc][ld]

  load_rows(Q_i, ld, Q + base, stride, row0, Br, N, d);  // Q_i: HBM → SRAM, once
  for (int j = 0; j < p.Tc(); ++j) {
    const int start_n = j * Bc;  // first key of K_j
    load_rows(K_j, ld, K + base, stride, start_n, Bc, N, d);  // K_j: HBM → SRAM
    __syncthreads();  // Q_i and K_j complete before the dot products read them
    // S_ij → HBM, every entry of the N × N matrix (masked ones as −inf, as the reference does).
    // Consecutive threads write consecutive columns of one row: coalesced.
    for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x) {
      const int r = idx / Bc, c = idx % Bc;
      const int row = row0 + r, col = start_n + c;
      if (row >= N || col >= N) continue;
      S_head[std::size_t(row) * N + col] =
          (!p.causal || col <= row) ? dot_row(Q_i + r * ld, K_j + c * ld, d) * p.scale_log2 : neg_inf();
    }
    __syncthreads();  // reads of K_j done before the next iteration overwrites it
  }
}

/// Step 2, grid (N, H, B): one block per row. S row: HBM → SRAM once; P row and LSE: SRAM → HBM.
__global__ void naive_softmax_kernel(Problem p, const float* S, float* P,  // S may equal P (in place)
                                     float* __restrict__ LSE) {
  const int N = p.seq;
  const int row = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::size_t off = score_offset(p, b, h) + std::size_t(row) * N;
  extern __shared__ float s_row[];  // [N]
  __shared__ float red[kThreads / 32];
  __shared__ float m_row, l_row;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  float mx = neg_inf();
  for (int c = threadIdx.x; c < N; c += blockDim.x) {
    s_row[c] = __ldcg(S + off + c);  // S row: HBM → SRAM
    mx = fmaxf(mx, s_row[c]);
  }
  // Block-wide max: warp shuffle, then one value per warp through shared memory.
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();  // every warp's max (and the whole S row) is in SRAM
  if (threadIdx.x == 0) {
    float v = red[0];
    for (int w = 1; w < kThreads / 32; ++w) v = fmaxf(v, red[w]);
    m_row = v;
  }
  __syncthreads();  // m_row published before anyone subtracts it
  const float m_ref = m_row == neg_inf() ? 0.f : m_row;  // fully masked row (cannot happen for N_q = N_k)
  float sum = 0.f;
  for (int c = threadIdx.x; c < N; c += blockDim.x) {
    const float e = exp2f(s_row[c] - m_ref);
    s_row[c] = e;
    sum += e;
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __syncthreads();  // everyone has read red[] (the max) before it is reused for the sums
  if (lane == 0) red[warp] = sum;
  __syncthreads();  // every warp's partial sum is in red[]
  if (threadIdx.x == 0) {
    float v = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) v += red[w];
    l_row = v;
    LSE[p.stat_offset(b, h) + row] = v > 0.f ? m_row + log2f(v) : neg_inf();  // LSE: SRAM → HBM
  }
  __syncthreads();  // l_row published before the normalisation reads it
  const float inv = l_row > 0.f ? 1.f / l_row : 0.f;
  for (int c = threadIdx.x; c < N; c += blockDim.x) P[off + c] = s_row[c] * inv;  // P row: SRAM → HBM
}

/// Step 3, grid (Tr, H, B): O_i = Σ_j P_ij V_j; P_ij and V_j tiles HBM → SRAM, O_i → HBM once.
__global__ void naive_pv_kernel(Problem p, const float* __restrict__ P, const float* __restrict__ V,
                                float* __restrict__ O) {
  const int Br = p.Br, Bc = p.Bc, d = p.head_dim, N = p.seq;
  const int ld = smem_pitch(d), sp = Bc + 1;
  const int row0 = blockIdx.x * Br, h = blockIdx.y, b = blockIdx.z;
  const std::size_t stride = p.row_stride(), base = p.head_offset(b, h);
  const float* P_head = P + score_offset(p, b, h);

  extern __shared__ float smem[];
  float* acc = smem;             // [Br][ld]
  float* V_j = acc + Br * ld;    // [Bc][ld]
  float* P_ij = V_j + Bc * ld;   // [Br][sp]

  fill_tile(acc, Br * ld, 0.f);
  for (int j = 0; j < p.Tc(); ++j) {
    const int start_n = j * Bc;  // first key of V_j
    load_rows(V_j, ld, V + base, stride, start_n, Bc, N, d);  // V_j: HBM → SRAM
    for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x) {  // P_ij: HBM → SRAM
      const int r = idx / Bc, c = idx % Bc;
      const int row = row0 + r, col = start_n + c;
      P_ij[r * sp + c] = (row < N && col < N) ? __ldcg(P_head + std::size_t(row) * N + col) : 0.f;
    }
    __syncthreads();  // V_j and P_ij complete (and acc zeroed) before the product reads them
    for (int idx = threadIdx.x; idx < Br * d; idx += blockDim.x) {
      const int r = idx / d, k = idx % d;
      float o = acc[r * ld + k];
      for (int c = 0; c < Bc; ++c) o = fmaf(P_ij[r * sp + c], V_j[c * ld + k], o);
      acc[r * ld + k] = o;
    }
    __syncthreads();  // reads of V_j, P_ij done before the next iteration overwrites them
  }
  store_rows(O + base, stride, acc, ld, nullptr, row0, Br, N, d);  // O_i: SRAM → HBM, once
}

int naive_max_seq() {
  int dev = 0, optin = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return int((optin - 64) / sizeof(float));  // leave room for the static reduction scratch
}

void launch_naive_scores(const Problem& p, const float* Q, const float* K, float* S) {
  const std::size_t smem = (std::size_t(p.Br) + p.Bc) * smem_pitch(p.head_dim) * sizeof(float);
  set_smem(reinterpret_cast<const void*>(&naive_scores_kernel), smem, "naive_scores_kernel", p);
  announce("naive_scores_kernel");
  naive_scores_kernel<<<dim3(p.Tr(), p.heads, p.batch), kThreads, smem>>>(p, Q, K, S);
  FLASHLAB_CUDA_CHECK_LAUNCH("naive_scores_kernel");
}

void launch_naive_softmax(const Problem& p, const float* S, float* P, float* LSE) {
  const std::size_t smem = std::size_t(p.seq) * sizeof(float);
  set_smem(reinterpret_cast<const void*>(&naive_softmax_kernel), smem, "naive_softmax_kernel", p);
  announce("naive_softmax_kernel");
  naive_softmax_kernel<<<dim3(p.seq, p.heads, p.batch), kThreads, smem>>>(p, S, P, LSE);
  FLASHLAB_CUDA_CHECK_LAUNCH("naive_softmax_kernel");
}

void launch_naive_pv(const Problem& p, const float* P, const float* V, float* O) {
  const std::size_t smem =
      ((std::size_t(p.Br) + p.Bc) * smem_pitch(p.head_dim) + std::size_t(p.Br) * (p.Bc + 1)) *
      sizeof(float);
  set_smem(reinterpret_cast<const void*>(&naive_pv_kernel), smem, "naive_pv_kernel", p);
  announce("naive_pv_kernel");
  naive_pv_kernel<<<dim3(p.Tr(), p.heads, p.batch), kThreads, smem>>>(p, P, V, O);
  FLASHLAB_CUDA_CHECK_LAUNCH("naive_pv_kernel");
}

}  // namespace flashlab::cuda::detail
