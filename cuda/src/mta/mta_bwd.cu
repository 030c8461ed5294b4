// mta_bwd.cu — the clear MTA backward, tile for tile with reference/src/mta/flash_backward.cpp
// (Multi token attention in CUDA and Triton, the dQ + dW algorithm and the dK/dV algorithm,
// preceded by the D preprocessing D_i = rowsum(dO_i ⊙ O_i)).
//
// Both kernels use the doubled halos Br = B − 2Pq, Bc = B − 4Pk: dS needs dŜ one halo further
// out and dŜ needs S one halo further still. The row halo is centred (I_s = i·Br − Pq), the
// reference's documented deviation from the source (docs/mta.md, "The backward halo"); the key
// halo is symmetric (J_s = j·Bc − 2Pk). A tile's exact dS lies on rows [Pq, Pq + Br) and columns
// [2Pk, 2Pk + Bc): the tile owns that block and writes back only its rows of dQ (dQ + dW kernel)
// or its columns as rows of dK and dV (dK/dV kernel). The accumulators are read-modify-written
// in HBM per tile pair as the source writes them; halo rows read from HBM belong to a
// neighbouring tile (another block may be writing them): they are read, never written, and
// nothing computed from them reaches an owned row.
//
// Shared per pair in both kernels ("forward computation reprise"): S_ij = scale·Q_i K_jᵀ with
// causal zeros, Ŝ_ij = Conv2D(S_ij, W), P_ij = exp(Ŝ_ij − LSE_i) on the exact visible region
// (LSE_i = M_i + log L_i formed on chip), dP_ij = dO_i V_jᵀ, dŜ = P ⊙ (dP − D_i),
// dS = TransposedConv2D(dŜ, W) with causal zeros, kept on the owned block.
#include "mta/mta_tile.cuh"

namespace flashlab::cuda::detail::mta {

namespace {

/// Views of the three B × B score buffers of a backward block and the row statistics.
struct PairTiles {
  float* s;       // S_ij (kept for GradW)
  float* p;       // Ŝ_ij → P_ij, later reused for dS (P is dead once dŜ exists)
  float* ds_hat;  // dP_ij → dŜ_ij in place
  float* lse;     // [B] LSE_i = M_i + log L_i (0 on rows outside [0, N): never used there)
  float* d_i;     // [B] D_i
};

/// The forward reprise and dŜ of one tile pair; q_i, k_j, v_j, do_i and W are in shared memory.
/// Ends with dŜ in t.ds_hat, S in t.s, after a barrier.
__device__ void reprise_and_ds_hat(const Launch& L, const PairTiles& t, const float* q_i, const float* k_j,
                                   const float* v_j, const float* do_i, const float* w, int is, int js) {
  const int B = L.block, n = L.seq, d = L.head_dim, ld = L.ld(), sp = L.sp(), pq = L.pq, pk = L.pk;
  scores(t.s, sp, q_i, k_j, ld, B, B, d, L.scale, is, js);
  // dP_ij = dO_i V_jᵀ (independent of S: same phase).
  for (int idx = threadIdx.x; idx < B * B; idx += blockDim.x) {
    const int r = idx / B, c = idx % B;
    t.ds_hat[r * sp + c] = dot_row(do_i + r * ld, v_j + c * ld, d);
  }
  __syncthreads();  // S_ij complete before the convolution reads neighbouring entries
  // P_ij = exp(Conv2D(S_ij, W) − LSE_i) where Ŝ is exact (rows ≥ Pq, columns [Pk, B − Pk)),
  // inside [0, N)² and visible; 0 elsewhere. dŜ = P ⊙ (dP − D_i).
  for (int idx = threadIdx.x; idx < B * B; idx += blockDim.x) {
    const int r = idx / B, c = idx % B, gr = is + r, gc = js + c;
    const bool exact = r >= pq && gr >= 0 && gr < n && c >= pk && c < B - pk && gc >= 0 && gc < n && gc <= gr;
    const float p = exact ? expf(conv_at(t.s, sp, B, B, w, L.cq, L.ck, r, c) - t.lse[r]) : 0.f;
    t.p[r * sp + c] = p;
    t.ds_hat[r * sp + c] = p * (t.ds_hat[r * sp + c] - t.d_i[r]);
  }
  __syncthreads();  // P and dŜ complete before GradW, dV and the transposed convolution read them
}

/// dS = TransposedConv2D(dŜ, W) into t.p, zeroed where the key is in the future (no gradient
/// into the causal zeros) and outside the owned block [Pq, Pq + Br) × [2Pk, 2Pk + Bc).
__device__ void ds_owned(const Launch& L, const PairTiles& t, const float* w, int is, int js) {
  const int B = L.block, sp = L.sp();
  for (int idx = threadIdx.x; idx < B * B; idx += blockDim.x) {
    const int r = idx / B, c = idx % B;
    const bool owned = r >= L.pq && r < L.pq + L.br && c >= 2 * L.pk && c < 2 * L.pk + L.bc && js + c <= is + r;
    t.p[r * sp + c] = owned ? conv_transpose_at(t.ds_hat, sp, B, B, w, L.cq, L.ck, r, c) : 0.f;
  }
  __syncthreads();  // dS complete before the accumulator update reads whole rows or columns
}

/// LSE_i = M_i + log L_i and D_i for the B rows from I_s (rows outside [0, N) read as 0 and are
/// never used: their P is 0).
__device__ void load_row_stats(const Launch& L, const PairTiles& t, const float* M, const float* Lsum,
                               const float* D, int is) {
  load_stat(t.lse, M, is, L.block, L.seq);
  load_stat(t.d_i, D, is, L.block, L.seq);
  for (int r = threadIdx.x; r < L.block; r += blockDim.x) {  // the thread that loaded M_r adds log L_r
    const int row = is + r;
    if (row >= 0 && row < L.seq) t.lse[r] += logf(__ldcg(Lsum + row));
  }
}

}  // namespace

// ---- preprocessing ----

/// Grid (⌈N / 4⌉, H, B): one warp per row, D_i = Σ_k dO[i, k] · O[i, k]. The lanes read
/// consecutive elements of the row (whole 32-byte sectors, so L2 delivers each byte once; one
/// thread per row would fetch every sector 8 times) and add their parts with shuffles.
__global__ void mta_bwd_preprocess_kernel(Launch L, const float* __restrict__ O, const float* __restrict__ dO,
                                          float* __restrict__ D) {
  constexpr int kWarp = 32;
  const int lane = threadIdx.x % kWarp, row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int h = blockIdx.y, b = blockIdx.z;
  if (row >= L.seq) return;  // a whole warp leaves together: the shuffles below stay full-warp
  const std::size_t at = L.head_offset(b, h) + std::size_t(row) * L.row_stride();
  float acc = 0.f;
  for (int k = lane; k < L.head_dim; k += kWarp) acc = fmaf(__ldcg(dO + at + k), __ldcg(O + at + k), acc);
  for (int offset = kWarp / 2; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (lane == 0) D[L.stat_offset(b, h) + row] = acc;
}

void launch_bwd_preprocess(const Launch& L, const float* O, const float* dO, float* D) {
  constexpr int kRowsPerBlock = kThreads / 32;
  const dim3 grid((L.seq + kRowsPerBlock - 1) / kRowsPerBlock, L.heads, L.batch);
  announce("mta_bwd_preprocess");
  mta_bwd_preprocess_kernel<<<grid, kThreads>>>(L, O, dO, D);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_bwd_preprocess");
}

// ---- dQ + dW ----

/// Shared floats of the dQ + dW kernel: Q_i, K_j, V_j, dO_i, dQ tile (B × ld), S, P/dS, dŜ
/// (B × sp), W and dW_i (cq·ck each), LSE_i and D_i (B each).
static std::size_t dq_dw_smem_floats(const Launch& L) {
  return 5 * std::size_t(L.block) * L.ld() + 3 * std::size_t(L.block) * L.sp() + 2 * std::size_t(L.taps()) +
         2 * std::size_t(L.block);
}

/// Grid (Tr, H, B). Row tiles outer (one per block), key tiles inner.
__global__ void mta_bwd_dq_dw_kernel(Launch L, const float* __restrict__ Q, const float* __restrict__ K,
                                     const float* __restrict__ V, const float* __restrict__ W,
                                     const float* __restrict__ dO, const float* __restrict__ M,
                                     const float* __restrict__ Lsum, const float* __restrict__ D,
                                     float* __restrict__ dQ, float* __restrict__ dW) {
  const int B = L.block, n = L.seq, d = L.head_dim, ld = L.ld(), sp = L.sp(), pq = L.pq, pk = L.pk;
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, taps = L.taps();
  const std::size_t stride = L.row_stride(), base = L.head_offset(b, h), so = L.stat_offset(b, h);
  const int is = i * L.br - pq;  // centred row halo: Pq rows above, Pq below

  extern __shared__ float smem[];
  float* q_i = smem;
  float* k_j = q_i + B * ld;
  float* v_j = k_j + B * ld;
  float* do_i = v_j + B * ld;
  float* dq_acc = do_i + B * ld;
  PairTiles t;
  t.s = dq_acc + B * ld;
  t.p = t.s + B * sp;
  t.ds_hat = t.p + B * sp;
  float* w = t.ds_hat + B * sp;
  float* dw_i = w + taps;  // local dW_i accumulator in SRAM; tap `tap` belongs to thread tap % kThreads
  t.lse = dw_i + taps;
  t.d_i = t.lse + B;

  // Once per row tile: W, dO[I_s:I_e], M, L, D (→ LSE_i, D_i); dW_i = 0.
  load_w(w, W + std::size_t(h) * taps, taps);
  for (int tap = threadIdx.x; tap < taps; tap += blockDim.x) dw_i[tap] = 0.f;
  load_tile(do_i, ld, dO + base, stride, is, B, n, d);
  load_row_stats(L, t, M + so, Lsum + so, D + so, is);

  for (int j = 0; j < L.tc; ++j) {
    const int js = j * L.bc - 2 * pk;
    // Forward reprise: load Q_i, K_j (and V_j for dP); dQ[I_s:I_e] from the second key tile on.
    load_tile(q_i, ld, Q + base, stride, is, B, n, d);
    load_tile(k_j, ld, K + base, stride, js, B, n, d);
    load_tile(v_j, ld, V + base, stride, js, B, n, d);
    if (j > 0) load_tile(dq_acc, ld, dQ + base, stride, is, B, n, d);
    else
      for (int idx = threadIdx.x; idx < B * ld; idx += blockDim.x) dq_acc[idx] = 0.f;
    __syncthreads();  // tiles (and on j = 0 the per-row-tile loads) complete before use

    reprise_and_ds_hat(L, t, q_i, k_j, v_j, do_i, w, is, js);

    // dW_i += GradW(S_ij, dŜ) over the dŜ entries this tile owns (rows [Pq, Pq + Br), columns
    // [2Pk, 2Pk + Bc)), so every dŜ entry of the head counts once: one thread per tap.
    for (int tap = threadIdx.x; tap < taps; tap += blockDim.x) {
      const int a = tap / L.ck, bb = tap % L.ck;
      float acc = 0.f;
      for (int r = pq; r < pq + L.br; ++r)
        for (int c = 2 * pk; c < 2 * pk + L.bc; ++c)
          acc = fmaf(t.ds_hat[r * sp + c], t.s[(r + a - pq) * sp + (c + bb - pk)], acc);
      dw_i[tap] += acc;
    }
    ds_owned(L, t, w, is, js);  // dS (owned block) into t.p; ends with a barrier

    // dQ tile += dS K_j (unscaled); only the owned rows [Pq, Pq + Br) go back to HBM.
    for (int idx = threadIdx.x; idx < B * d; idx += blockDim.x) {
      const int r = idx / d, k = idx % d;
      float acc = dq_acc[r * ld + k];
      for (int c = 0; c < B; ++c) acc = fmaf(t.p[r * sp + c], k_j[c * ld + k], acc);
      dq_acc[r * ld + k] = acc;
    }
    __syncthreads();  // the tile is updated before the store reads other threads' elements
    store_tile(dQ + base, stride, dq_acc, ld, is, pq, L.br, n, d);
    __syncthreads();  // stores visible, and every read of this pair's tiles done, before reloading
  }

  // Finalisation: dQ[I_s^eff : I_e^eff] ← scale · dQ (read-modify-write); AtomicAdd(dW, dW_i).
  const int ie = i * L.br;
  load_tile(dq_acc, ld, dQ + base, stride, ie, L.br, n, d);
  __syncthreads();  // loaded before the scaled store
  store_tile(dQ + base, stride, dq_acc, ld, ie, 0, L.br, n, d, L.scale);
  for (int tap = threadIdx.x; tap < taps; tap += blockDim.x) atomicAdd(dW + std::size_t(h) * taps + tap, dw_i[tap]);
}

void launch_bwd_dq_dw(const Launch& L, const float* Q, const float* K, const float* V, const float* W,
                      const float* dO, const float* M, const float* Lsum, const float* D, float* dQ, float* dW) {
  const std::size_t smem = dq_dw_smem_floats(L) * sizeof(float);
  set_smem(reinterpret_cast<const void*>(&mta_bwd_dq_dw_kernel), smem, "mta_bwd_dq_dw_kernel", L);
  const dim3 grid(L.tr, L.heads, L.batch);
  announce("mta_bwd_dq_dw_kernel");
  mta_bwd_dq_dw_kernel<<<grid, kThreads, smem>>>(L, Q, K, V, W, dO, M, Lsum, D, dQ, dW);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_bwd_dq_dw_kernel");
}

// ---- dK/dV ----

/// Shared floats of the dK/dV kernel: Q_i, K_j, V_j, dO_i, dK and dV tiles (B × ld), S, P/dS,
/// dŜ (B × sp), W (cq·ck), LSE_i and D_i (B each).
static std::size_t dk_dv_smem_floats(const Launch& L) {
  return 6 * std::size_t(L.block) * L.ld() + 3 * std::size_t(L.block) * L.sp() + std::size_t(L.taps()) +
         2 * std::size_t(L.block);
}

/// Grid (Tc, H, B). Key tiles outer (one per block), row tiles inner.
__global__ void mta_bwd_dk_dv_kernel(Launch L, const float* __restrict__ Q, const float* __restrict__ K,
                                     const float* __restrict__ V, const float* __restrict__ W,
                                     const float* __restrict__ dO, const float* __restrict__ M,
                                     const float* __restrict__ Lsum, const float* __restrict__ D,
                                     float* __restrict__ dK, float* __restrict__ dV) {
  const int B = L.block, n = L.seq, d = L.head_dim, ld = L.ld(), sp = L.sp(), pq = L.pq, pk = L.pk;
  const int j = blockIdx.x, h = blockIdx.y, b = blockIdx.z, taps = L.taps();
  const std::size_t stride = L.row_stride(), base = L.head_offset(b, h), so = L.stat_offset(b, h);
  const int js = j * L.bc - 2 * pk;

  extern __shared__ float smem[];
  float* q_i = smem;
  float* k_j = q_i + B * ld;
  float* v_j = k_j + B * ld;
  float* do_i = v_j + B * ld;
  float* dk_acc = do_i + B * ld;
  float* dv_acc = dk_acc + B * ld;
  PairTiles t;
  t.s = dv_acc + B * ld;
  t.p = t.s + B * sp;
  t.ds_hat = t.p + B * sp;
  float* w = t.ds_hat + B * sp;
  t.lse = w + taps;
  t.d_i = t.lse + B;

  load_w(w, W + std::size_t(h) * taps, taps);  // once per key tile
  for (int i = 0; i < L.tr; ++i) {
    const int is = i * L.br - pq;
    // Per pair: Q_i, K_j, M, L, D (→ LSE_i, D_i), dO_i, V_j; dK, dV tiles from the second row tile on.
    load_tile(q_i, ld, Q + base, stride, is, B, n, d);
    load_tile(k_j, ld, K + base, stride, js, B, n, d);
    load_tile(do_i, ld, dO + base, stride, is, B, n, d);
    load_tile(v_j, ld, V + base, stride, js, B, n, d);
    if (i > 0) {
      load_tile(dv_acc, ld, dV + base, stride, js, B, n, d);
      load_tile(dk_acc, ld, dK + base, stride, js, B, n, d);
    } else {
      for (int idx = threadIdx.x; idx < B * ld; idx += blockDim.x) dv_acc[idx] = dk_acc[idx] = 0.f;
    }
    load_row_stats(L, t, M + so, Lsum + so, D + so, is);
    __syncthreads();  // every tile and statistic complete before use

    reprise_and_ds_hat(L, t, q_i, k_j, v_j, do_i, w, is, js);

    // dV tile += P_ijᵀ dO_i over the query rows this tile owns ([Pq, Pq + Br)).
    for (int idx = threadIdx.x; idx < B * d; idx += blockDim.x) {
      const int c = idx / d, k = idx % d;
      float acc = dv_acc[c * ld + k];
      for (int r = pq; r < pq + L.br; ++r) acc = fmaf(t.p[r * sp + c], do_i[r * ld + k], acc);
      dv_acc[c * ld + k] = acc;
    }
    __syncthreads();  // every read of P is done before ds_owned overwrites it with dS
    ds_owned(L, t, w, is, js);

    // dK tile += dSᵀ Q_i (unscaled).
    for (int idx = threadIdx.x; idx < B * d; idx += blockDim.x) {
      const int c = idx / d, k = idx % d;
      float acc = dk_acc[c * ld + k];
      for (int r = 0; r < B; ++r) acc = fmaf(t.p[r * sp + c], q_i[r * ld + k], acc);
      dk_acc[c * ld + k] = acc;
    }
    __syncthreads();  // both tiles updated before the stores read other threads' elements
    // Only the owned key rows [2Pk, 2Pk + Bc) go back to HBM.
    store_tile(dV + base, stride, dv_acc, ld, js, 2 * pk, L.bc, n, d);
    store_tile(dK + base, stride, dk_acc, ld, js, 2 * pk, L.bc, n, d);
    __syncthreads();  // stores visible, and every read of this pair's tiles done, before reloading
  }

  // Finalisation: dK[J_s^eff : J_e^eff] ← scale · dK; dV is already final.
  const int je = j * L.bc;
  load_tile(dk_acc, ld, dK + base, stride, je, L.bc, n, d);
  __syncthreads();  // loaded before the scaled store
  store_tile(dK + base, stride, dk_acc, ld, je, 0, L.bc, n, d, L.scale);
}

void launch_bwd_dk_dv(const Launch& L, const float* Q, const float* K, const float* V, const float* W,
                      const float* dO, const float* M, const float* Lsum, const float* D, float* dK, float* dV) {
  const std::size_t smem = dk_dv_smem_floats(L) * sizeof(float);
  set_smem(reinterpret_cast<const void*>(&mta_bwd_dk_dv_kernel), smem, "mta_bwd_dk_dv_kernel", L);
  const dim3 grid(L.tc, L.heads, L.batch);
  announce("mta_bwd_dk_dv_kernel");
  mta_bwd_dk_dv_kernel<<<grid, kThreads, smem>>>(L, Q, K, V, W, dO, M, Lsum, D, dK, dV);
  FLASHLAB_CUDA_CHECK_LAUNCH("mta_bwd_dk_dv_kernel");
}

}  // namespace flashlab::cuda::detail::mta
