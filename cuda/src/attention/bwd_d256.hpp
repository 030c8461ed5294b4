// cuda/src/attention/bwd_d256.hpp — the launchers of the atomic backward at head dim d = 256
// (attention_bwd_d256.cu, attention_bwd_d256_ws.cu). Internal to cuda/src: the front door calls it.
#pragma once

#include "attention/launchers.hpp"

namespace flashlab::cuda::detail {

/// The atomic design at d = 256 (attention_bwd_d256.cu): zero dQaccum, D preprocessing, the main
/// kernel (its own tiles, Br = 32 and Bc = 64, and warp layouts), dQ = scale · dQaccum → 16 bits.
/// The workspace of launch_fast_bwd_atomic; causal, windows, grouped K/V and N_k ≠ N; no fp32 sums
/// (BwdPointers::add_f32: refused).
void launch_fast_bwd_d256(const Problem& p, bool bf16, const BwdPointers& a, cudaStream_t stream);

/// The same backward on Hopper (attention_bwd_d256_ws.cu, sm_90a: built where the architectures
/// include 90): TMA producer, two wgmma consumers splitting d, Br = Bc = 64; the same workspace,
/// shapes and masks; no fp32 sums. `dq_order`: nullptr (dQ's sums in the order the blocks reach
/// them), or the workspace's B·H·⌈N / kDqOrderTileRows⌉ counters for a fixed order
/// (FastBackwardKernel::wgmma_ws_deterministic: bit-reproducible dQ, dK, dV).
void launch_fast_bwd_d256_ws(const Problem& p, bool bf16, const BwdPointers& a, int* dq_order, cudaStream_t stream);

}  // namespace flashlab::cuda::detail
