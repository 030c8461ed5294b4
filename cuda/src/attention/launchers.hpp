// Launchers of every attention kernel (internal). Pointers are device pointers, layouts as in
// common.hpp. Each launcher validates its shared-memory need, announces the kernel to the launch
// hook (the traffic probe), launches on the default stream and checks the launch.
#pragma once

#include "core/common.hpp"

namespace flashlab::cuda::detail {

// attention_naive.cu — S and P in HBM (the traffic baseline). S/P buffer: [B, H, N, N].
void launch_naive_scores(const Problem& p, const float* Q, const float* K, float* S);
void launch_naive_softmax(const Problem& p, const float* S, float* P, float* LSE);
void launch_naive_pv(const Problem& p, const float* P, const float* V, float* O);
/// Largest N the row softmax of the naive kernel holds in shared memory.
int naive_max_seq();

// attention_fa1_fwd.cu — FA1 loop order; O, m, l live in HBM between outer iterations.
void launch_fa1_forward(const Problem& p, int query_split, const float* Q, const float* K, const float* V,
                        float* O, float* m, float* l, float* LSE);
/// The split used when attention_forward's fa1_query_split is 0: enough blocks to fill the GPU.
int fa1_auto_split(const Problem& p);

// attention_fa2_fwd.cu — FA2 loop order, LSE in base 2.
void launch_flash_forward(const Problem& p, const float* Q, const float* K, const float* V, float* O, float* LSE);

// attention_bwd.cu — D preprocessing, dQ kernel, dK/dV kernel.
void launch_bwd_preprocess(const Problem& p, const float* O, const float* dO, float* D);
void launch_bwd_dq(const Problem& p, const float* Q, const float* K, const float* V, const float* dO,
                   const float* LSE, const float* D, float* dQ);
void launch_bwd_dkdv(const Problem& p, const float* Q, const float* K, const float* V, const float* dO,
                     const float* LSE, const float* D, float* dK, float* dV);

// attention_fwd_tc.cu — the mma.sync forward (any device from sm_80 on); 16-bit Q, K, V, O
// [B, N, H, d], LSE [B, H, N] base 2; d ∈ {64, 128, 256}. Tiles: Br = 128, Bc = 64 at every head dim.
constexpr int kMmaBlockM = 128, kMmaBlockN = 64;
/// `lists`: the prefix sums of packed sequences (Problem::packed()); unread when dense.
void launch_fast_mma(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, void* O, float* LSE,
                     cudaStream_t stream, const PackedLists& lists = {});
/// launch_fast_mma with O stored in fp32, unrounded (the context-parallel ring's partials, merged
/// by LSE before one rounding): dense problems without a window, d ∈ {64, 128}; O is fp32
/// [B, N, H, d]. Runs the instantiation that reads K/V with their own layout (any H_kv, N_k).
void launch_fast_mma_f32(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, float* O,
                         float* LSE, cudaStream_t stream);

// attention_fwd_wgmma.cu (sm_90a, built only when CMAKE_CUDA_ARCHITECTURES include 90:
// FLASHLAB_HAVE_WGMMA) — the wgmma forward; 16-bit Q, K, V, O [B, N, H, d], LSE [B, H, N] base 2.
// Tiles: BLOCK_M = Br = 128 (two warpgroups), BLOCK_N = Bc = 128.
constexpr int kWgmmaBlockM = 128, kWgmmaBlockN = 128;
void launch_fast_wgmma(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, void* O, float* LSE,
                       cudaStream_t stream);

// attention_fwd_ws.cu (sm_90a, same condition) — TMA loads, a producer warpgroup, ping-pong
// consumer warpgroups on wgmma. Its configuration per launch is a WsConfig chosen by
// choose_ws_config() (fwd_ws_config.hpp): Br = 128 or 192, Bc = 128 or 192 (d = 256: 80).
void launch_fast_tma_ws(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, void* O, float* LSE,
                        cudaStream_t stream, const PackedLists& lists = {});
/// launch_fast_tma_ws with O stored in fp32, unrounded (the ring's partials): dense problems
/// without a window, d ∈ {64, 128}, in the configuration ws_fp32_config() derives from the chosen one.
void launch_fast_tma_ws_f32(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, float* O,
                            float* LSE, cudaStream_t stream);

// attention_bwd_atomic.cu — one kernel, dQ accumulated with atomicAdd.
void launch_zero_fill(const Problem& p, float* dQ);
void launch_bwd_atomic(const Problem& p, const float* Q, const float* K, const float* V, const float* dO,
                       const float* LSE, const float* D, float* dQ, float* dK, float* dV);

}  // namespace flashlab::cuda::detail

namespace flashlab::cuda::detail {

// ----------------------------------------------------------------- the fast backward's launchers

/// Device pointers of one fast backward call (every design). `D` is fp32 [B, H, N]; `dQaccum` is
/// the atomic design's fp32 accumulator in its own tiled layout (attention_bwd_tc_atomic.cu;
/// nullptr for the two-kernel design). `add_f32` (the atomic design only): dQ, dK, dV point to fp32
/// sums in their usual layouts, and the call ADDS its unrounded gradients into them (dQ = scale ·
/// dQaccum, dK, dV from the registers) instead of storing 16 bits: the context-parallel ring sums
/// its blocks' gradients so and rounds once. It runs the grouped instantiations (any H_kv, N_k; no
/// window, no fixed dQ order).
struct BwdPointers {
  const void *Q, *K, *V, *O, *dO;
  const float* LSE;
  void *dQ, *dK, *dV;
  float* D;
  float* dQaccum;
  bool add_f32 = false;
};

/// Rows per (b, h) of the atomic design's tiled dQ accumulator come in whole query tiles of this
/// many rows (a multiple of every head dim's BLOCK_M, checked there), so one workspace size
/// (fast_attention_backward_workspace_bytes) serves both head dims.
constexpr int kAtomicDqTileRows = 128;
/// Query rows per dQ order counter of the deterministic wgmma-ws kernel (its Br): one int32 per
/// (b, h, query tile) after the accumulator (fast_attention_backward_workspace_bytes).
constexpr int kDqOrderTileRows = 64;

/// The two-kernel design (attention_bwd_tc.cu): D preprocessing, the dQ kernel, the dK/dV
/// kernel. d ∈ {64, 128}. Packed sequences (Problem::packed()): `lists` their prefix sums (the
/// workspace D alone, [1, H, total_q]).
void launch_fast_bwd_two_kernel(const Problem& p, bool bf16, const BwdPointers& a, cudaStream_t stream,
                                const PackedLists& lists = {});

/// The atomic design (attention_bwd_tc_atomic.cu): zero dQaccum, D preprocessing, the main
/// kernel, dQ = scale · dQaccum → 16 bits. d ∈ {64, 128}. Packed sequences (Problem::packed()):
/// `lists` their prefix sums, the accumulator H·(⌊total_q / Br⌋ + B) tiles of the packed numbering.
void launch_fast_bwd_atomic(const Problem& p, bool bf16, const BwdPointers& a, cudaStream_t stream,
                            const PackedLists& lists = {});

/// The atomic design on Hopper (attention_bwd_ws.cu, sm_90a, built when the architectures include
/// 90: FLASHLAB_HAVE_WGMMA): TMA loads, warp specialisation, wgmma; same workspace. d ∈ {64, 128}.
/// `dq_order`: nullptr, or B·H·⌈N/kDqOrderTileRows⌉ counters for a fixed dQ summation order.
void launch_fast_bwd_ws(const Problem& p, bool bf16, const BwdPointers& a, int* dq_order, cudaStream_t stream);

/// launch_fast_bwd_ws() over packed sequences (Problem::packed(); the atomic order only): `lists`
/// their prefix sums, the accumulator H·(⌊total_q / Br⌋ + B) tiles of the packed numbering,
/// `next_item` one int of the workspace (the persistent blocks' work counter, zeroed here).
void launch_fast_bwd_ws_packed(const Problem& p, bool bf16, const BwdPointers& a, const PackedLists& lists,
                               int* next_item, cudaStream_t stream);

/// Shared floats of bwd_dkdv_kernel and bwd_atomic_kernel (the same tiles).
std::size_t bwd_dkdv_smem_floats(const Problem& p);
}  // namespace flashlab::cuda::detail
