// attention_bwd_ws.cu — FlashAttention backward on Hopper: wgmma for all five products, TMA loads
// from a producer warpgroup, two consumer warpgroups (FlashAttention-3's backward structure).
// Selected with FastBackwardKernel::wgmma_ws (fast_attention.hpp) or `flashlab bench attention
// --bwd-kernel wgmma-ws`; built for sm_90a alone (cuda/CMakeLists.txt, object library
// flashlab_cuda_wgmma) when the architectures include 90.
//
// The algorithm and names are those of the atomic design (attention_bwd_tc_atomic.cu): D
// preprocessing, one block per key tile K_j, V_j (Bc = BLOCK_N = 128 keys, resident in SRAM) looping
// over the query tiles Q_i, dO_i (Br = BLOCK_M rows: 64 at d = 128, 128 at d = 64,
// bwd_ws_block_m()), dQ summed in an fp32 accumulator, then
// dQ = scale · accumulator → 16 bits. What changes is who moves the data and which instruction
// multiplies:
//   - Warpgroup 0 is the PRODUCER (setmaxnreg.dec to 24). Thread 0 loads K_j, V_j once and Q_i, dO_i
//     per step as TMA boxes (hopper.cuh) into a ring of kStages = 2 stages; warp 1 copies LSE_i and
//     D_i (64 floats each, rows of one head are not 16-byte aligned in general, so no TMA) into the
//     same stage. full[s] completes when the TMA bytes landed and warp 1's 32 lanes arrived;
//     empty[s] when the 256 consumer threads are done with the stage.
//   - Warpgroups 1 and 2 are the CONSUMERS (setmaxnreg.inc to 240); consumer c owns keys
//     [64c, 64c + 64) of K_j: it computes the TRANSPOSED tiles, keys along the wgmma's M,
//         Sᵀ_ij  = K_c Q_iᵀ            (SRAM × SRAM, both K-major)
//         dPᵀ_ij = V_c dO_iᵀ
//         Pᵀ = 2^(Sᵀ·scale·log2 e − LSE_i),  dSᵀ = Pᵀ ∘ (dPᵀ − D_i)   (LSE, D per column;
//                                             Pᵀ while the dPᵀ product still runs)
//         dV_c += Pᵀ dO_i,  dK_c += dSᵀ Q_i   (Pᵀ, dSᵀ as register A fragments: the accumulator
//                                             layout of m64nN is the A layout of m64nNk16)
//     so dK_c and dV_c (64 keys × d each) stay in registers for the whole loop, and no transpose
//     through SRAM is needed for them. dSᵀ is also written to SRAM ([key][query], 128-byte swizzle:
//     an MN-major A operand of wgmma) for
//         dQ_i partial = dS_ij K_j       (SRAM × SRAM, both MN-major)
//     d = 128, dQ by turns: step n's whole partial (64 queries × d over all 128 keys, one m64n128
//     product) is consumer (n mod 2)'s, computed one step late, after its products of step n + 1.
//     The other consumer stores its dSᵀ rows, hands them over (mbarrier ds_full) and computes its
//     own partial of step n − 1, so the consumers never meet and never wait for each other's rows:
//     each step one of them adds a whole tile, as the column split's two halves. The deterministic kernel
//     keeps the column split (consumer c: columns [64c, 64c + 64) over all 128 keys; the two
//     meet once per step, each needs the other's dSᵀ rows), one ordered add per consumer.
//     d = 64 (Br = 128): consumer c computes query rows [64c, 64c + 64) over all 128 keys (the
//     same meeting). DqSplit::keys, each consumer all rows over its own 64 keys with no meeting
//     (both add a whole tile: twice the L2 reductions), stays selectable, as do the column split
//     and ping-pong (the consumers take turns at issuing Sᵀ, dPᵀ at two named barriers).
//   - The dQ partial goes registers → SRAM (fragment order, 16-byte stores, no bank conflicts)
//     and one thread of the consumer issues ONE bulk reduction (cp.reduce.async.bulk .add.f32,
//     tensor_core.cuh) into the fp32 accumulator: the adds happen in L2, the warps never wait on
//     them; the thread only waits (bulk wait_group.read) before the consumer's next dQ barrier,
//     which then also frees the staging SRAM for that partial, a step or two later.
// The accumulator is TILED as the atomic design's: per (b, h, query tile i) BLOCK_M·d contiguous
// floats; inside a tile, consumer slice c (its columns or rows; one slice with the key split) in
// wgmma fragment order: float4 number t·128 + thread = the thread's accumulator registers
// 4t .. 4t+3 (rows r, r + 8 of n-tile t). dq_convert_kernel maps it back to [B, N, H, d].
// Grouped K/V (H_kv < H) or N_k ≠ N: BwdWsGroup (on the plain or causal traits, the causal diagonal
// moved by the offset N_k − N; with a window on the window traits, whose band folds the offset in),
// one block per (key tile of the N_k keys, K/V head, b) that loops over the H/H_kv query heads
// of its group, heads outer: the producer and the stats warp walk the same (head, tile) steps through
// the stage ring, the consumers add each step's dQ partial into that head's accumulator tile, and
// dK_c, dV_c sum over the group in registers, written once into [B, N_k, H_kv, d] (K, V through TMA
// maps of their own shape; never expanded). A block whose keys no query sees runs no step (the
// ping-pong hand-over then starts none) and writes dK = dV = 0; rows that see no key get dQ = 0.
// Packed sequences (Problem::packed(), FlashAttention's varlen layout; BwdWsPacked,
// bwd_ws_packed_kernel): the grouped kernel, on the plain or causal traits without a window (each
// sequence's diagonal at its own offset len_k − len_q) and on the band with one, as the grouped
// kernel is chosen and for the same reason (the band's code is slower on unmasked tiles): one
// block per (key tile of one sequence, K/V head), the key tiles numbered over the keys as attention_bwd_tc_atomic.cu's packed kernel
// numbers them (packed.cuh: sequence b owns tiles ⌊cu_seqlens_k[b] / Bc⌋ + b …; a tile past its
// sequence's end exits), the sequence found by a binary search over the device lists. The block
// runs on a Problem of its own sequence (N = len_q, N_k = len_k: its diagonal's or band's offset,
// masks, query tiles, stored rows), its boxes from the sequence's first rows of tensor maps spanning the packed
// tensors (a box past the sequence's end brings in the next sequence's rows: the masks give them
// P = dS = 0, and they are never stored, as in the tma-ws forward); dQ's partials go into the tiles
// of the packed query numbering, which dq_convert_packed_kernel (attention_bwd_tc.cuh) maps back. The
// dense kernel is a second __global__ over the same body (bwd_ws_body), so its code is as it was. At d = 64 and
// causal d = 128 the packed blocks are persistent (kPersistent, bwd_ws_packed_body): one per SM,
// running those (key tile, K/V head) items in turn, the next one's loads beside the current one's
// last steps; measured faster there, slower at d = 128 without a mask (docs/optimisation.md).
// Masks: only the tiles that need them (the last, ragged query or key tile; causal, the tiles
// crossing the diagonal); masked entries get P = 0 by a select after 2^x (a masked 2^x may be
// +inf and is discarded, never multiplied). Causal blocks start at the first query tile that sees
// their keys. TMA fills rows ≥ N with zeros; the stats warp writes LSE = D = 0 there.
// Numerics: P and dS are rounded to 16 bits once (the A fragments and the SRAM copy are the same
// rounded values), every sum in fp32; dQ's sum over key blocks runs in an order that varies run
// to run, unless DETERMINISTIC (FastBackwardKernel::wgmma_ws_deterministic): then a counter per
// accumulator tile fixes the order. Consumer c of key block j waits until the counter reads
// 2j + c (every earlier block, and consumer 0 before 1, has added its partial of that tile), adds,
// waits until its add is performed in global memory, and increments the counter (release). The
// waits never close a cycle: block j only waits on blocks j' < j, which the grid's order
// launches no later (the causal grid's chunks keep a head's key blocks together, in ascending j),
// and which never wait on j. The deterministic kernel computes dQ one step late (consume_lagged:
// mbarriers instead of the consumers' meeting), so each ordered add has a step of slack before the
// next one waits on it.
// Resources (ptxas -v, sm_90a): 168 registers at launch (384 threads, 1 block per SM), then 24 for
// the producer and 240 for the consumers, no wgmma serialisation. Spills (bytes stored / loaded): none
// at d = 128 but the packed kernels (4 / 8 without a mask, 164 / 172 persistent causal: the loop
// over items); at d = 64 4–8 / 4–36 (causal, deterministic, window), 24 / 24 grouped, 12–172 /
// 16–180 packed. Dynamic SRAM 231,552 bytes at d = 128 (K_j, V_j 64 KiB, 2 stages of Q_i, dO_i
// 64 KiB, 2 dSᵀ buffers 32 KiB, 2 whole-tile dQ slices 64 KiB, stats, barriers, alignment slack;
// the column split's slices are half), 199,808 at d = 64 (Br = 128: K_j, V_j 32 KiB, stages 64 KiB,
// 2 dSᵀ buffers 64 KiB, 2 dQ slices 32 KiB). What was measured and tried:
// docs/optimisation.md, the wgmma-ws backward.
#include "attention/attention_bwd_tc.cuh"
#include "attention/packed.cuh"
#include "core/common.hpp"
#include "core/hopper.cuh"
#include "core/tensor_core.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace flashlab::cuda::detail {
namespace {

/// Br of the kernel at head dim d: 128 query rows per step at d = 64 (the Sᵀ, dPᵀ products twice
/// as wide, dV, dK twice as deep, half the steps), 64 at d = 128 (128 would need 64 more
/// accumulator registers per consumer than the 240 it has).
constexpr int bwd_ws_block_m(int head_dim) { return head_dim == 64 ? 128 : 64; }

/// How the two consumers share the dQ_i partial = dS_ij K_j of a step.
enum class DqSplit {
  columns,  ///< consumer c: columns [64c, 64c + 64) over all 128 keys (d = 128)
  keys,     ///< consumer c: every column over its own 64 keys; both add a whole tile
  rows,     ///< consumer c: query rows [64c, 64c + 64) over all 128 keys (Br = 128)
  turns,    ///< consumer n mod 2: step n's whole tile (every column over all 128 keys); the other none
};
/// The split of the kernel: turns at d = 128 (columns in the deterministic kernel, whose counter
/// orders one add per consumer); at d = 64 and Br = 128 rows (each accumulator element receives
/// one partial per key block, not two as with keys: half the L2 reductions), keys at d = 64 and
/// Br = 64 (the two rows of a 64-row tile would be one consumer's).
constexpr DqSplit bwd_ws_dq_split(int head_dim, int block_m, bool deterministic) {
  return head_dim == 128 ? (deterministic ? DqSplit::columns : DqSplit::turns)
         : block_m == 128 ? DqSplit::rows
                          : DqSplit::keys;
}

template <int HEAD_DIM, bool kBf16_, bool kCausal_, bool kDeterministic_, int BLOCK_M_ = bwd_ws_block_m(HEAD_DIM),
          DqSplit kDqSplit_ = bwd_ws_dq_split(HEAD_DIM, BLOCK_M_, kDeterministic_), bool kLagDq_ = kDeterministic_,
          bool kPingPong_ = false, int kStages_ = 2>
struct BwdWsTraits {
  static constexpr bool kDeterministic = kDeterministic_;
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr bool kBf16 = kBf16_;
  static constexpr bool kCausal = kCausal_;
  static constexpr int BLOCK_M = BLOCK_M_;  // Br: query rows per step (n of the Sᵀ wgmma)
  // Issue dV_c += Pᵀ dO_i before dSᵀ is computed: Pᵀ's A fragments live beside Sᵀ and dPᵀ. At
  // Br = 128 those are 64 + 64 + 32 registers more than the 240 hold with dK, dV (ptxas
  // serialises the wgmmas), so dV waits for dSᵀ there.
  static constexpr bool kDvBeforeGrads = BLOCK_M == 64;
  // dQ of step n computed during step n + 1 (column and row split; mbarriers ds_full, ds_free
  // instead of the meeting at kDsReadyBarrier), the consumers half a step apart. On by default in
  // the deterministic kernel only: there it gives each ordered add a step of slack; in the plain
  // kernel the two consumers' products then collide on the tensor cores instead of interleaving,
  // and it measured slower at d = 128.
  static constexpr bool kLagDq = kLagDq_ && kDqSplit_ != DqSplit::keys;
  static constexpr int BLOCK_N = 128;  // Bc: keys per block, 64 per consumer (m of every wgmma)
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kConsumerThreads = 128 * kConsumers;  // arrivals on empty[s]
  // Q_i, dO_i stages: a third fits at d = 128 (232,024 bytes) but measured level with two: a step
  // already gives each load time to arrive.
  static constexpr int kStages = kStages_;
  // Ping-pong: the consumers take turns at issuing Sᵀ, dPᵀ (named barriers kTurnBarrier + c), so
  // consumer 0's products run first and its Pᵀ overlaps consumer 1's (the forward's turns). Off:
  // with the column split's meeting it was 2–4 % faster at d = 128, but with dQ by turns it holds
  // the consumer without the step's dQ until the other has computed it (measured 2–6 % slower
  // there); not measured at d = 64.
  static constexpr bool kPingPong = kPingPong_ && !kLagDq;
  static constexpr int kColBlocks = HEAD_DIM / 64;  // TMA boxes (64 columns) per tile
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536, "register file");
  // dQ partial per consumer (DqSplit; file-top comment): kDqRows × kDqCols over kDqKeys keys.
  static constexpr DqSplit kDqSplit = kDqSplit_;
  static constexpr bool kDqSplitKeys = kDqSplit == DqSplit::keys;
  static constexpr bool kDqTurns = kDqSplit == DqSplit::turns;  // consume_tile(): who computes dQ
  static constexpr int kDqCols = kDqSplit == DqSplit::columns ? HEAD_DIM / 2 : HEAD_DIM;
  static constexpr int kDqKeys = kDqSplitKeys ? BLOCK_N / 2 : BLOCK_N;
  static constexpr int kDqRows = kDqSplit == DqSplit::rows ? 64 : BLOCK_M;
  static constexpr int kRowBlocks = kDqRows / 64;  // m64 row blocks of one consumer's partial
  static constexpr int kTileQ = BLOCK_M * HEAD_DIM * 2;    // Q_i or dO_i, one stage
  static constexpr int kTileKV = BLOCK_N * HEAD_DIM * 2;   // K_j or V_j
  static constexpr int kTileDs = BLOCK_N * BLOCK_M * 2;    // dSᵀ [key][query], 16-bit
  // Column and row split: each consumer reads the other's dSᵀ rows, so two buffers (file-top
  // comment); key split: each reads only its own rows, after its own dQ product of the step before.
  static constexpr int kDsBuffers = kDqSplitKeys ? 1 : 2;
  static constexpr int kSliceDq = kDqRows * kDqCols * 4;   // one consumer's fp32 dQ partial
  static constexpr int kStats = 2 * BLOCK_M * 4;           // LSE_i then D_i, one stage
  // Layout: K_j, V_j, Q stages, dO stages, 2 dSᵀ buffers, 2 dQ slices, stats stages, barriers.
  static constexpr int kOffV = kTileKV;
  static constexpr int kOffQ = 2 * kTileKV;
  static constexpr int kOffDo = kOffQ + kStages * kTileQ;
  static constexpr int kOffDs = kOffDo + kStages * kTileQ;
  static constexpr int kOffDq = kOffDs + kDsBuffers * kTileDs;
  static constexpr int kOffStats = kOffDq + kConsumers * kSliceDq;
  static constexpr int kOffBar = kOffStats + kStages * kStats;
  // kv_full, full[], empty[], ds_full[2], ds_free[2]; packed: kv_empty, item_full[2], item_empty[2] and
  // the two work item slots (BwdWsSmem).
  static constexpr int kBarriers = 1 + 2 * kStages + 4 + 7;
  static constexpr int kSmemBytes = kOffBar + 8 * kBarriers + 1024;  // + alignment to 1024
  static_assert(kSmemBytes <= 227 * 1024, "dynamic SRAM of one block on sm_90");
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "d ∈ {64, 128}");
  static_assert(kDqSplit != DqSplit::columns || HEAD_DIM == 128, "the column split: 64 columns per consumer");
  static_assert(kDqSplit != DqSplit::rows || BLOCK_M == 128, "the row split: 64 query rows per consumer");
  static_assert(BLOCK_M == 64 || kDqSplit != DqSplit::columns, "Br = 128 at d = 64 only (registers)");
  static_assert(!kDqTurns || (HEAD_DIM == 128 && BLOCK_M == 64 && !kLagDq), "turns: m64n128, 64 registers, in step");
  static_assert(BLOCK_N % BLOCK_M == 0, "causal: a key block's first visible query tile starts at its first key");
  static_assert(kAtomicDqTileRows % BLOCK_M == 0, "the workspace holds whole dQ tiles of this BLOCK_M");
  static_assert(BLOCK_M % kDqOrderTileRows == 0, "the workspace has an order counter for every accumulator tile");
  // A sliding window: BwdWsWindow below (these traits' kernels keep their code and names).
  static constexpr bool kWindow = false;
  // Grouped K/V or N_k ≠ N: BwdWsGroup below.
  static constexpr bool kGroup = false;
  // dQ, dK, dV added into fp32 sums: BwdWsAddF32 below.
  static constexpr bool kAddF32 = false;
  // Packed sequences: BwdWsPacked below; persistent blocks that run key tiles in a row there.
  static constexpr bool kPacked = false;
  static constexpr bool kPersistent = false;
};

/// The window instantiation of traits B (non-causal, not deterministic): a block loops over the
/// query tiles whose band meets its keys only (BwdWsBlock::i_end), and masks both edges of the band
/// (Problem::window_lo, window_hi) in the tiles it crosses. A trait of its own, so the non-window
/// kernels compile to the code (and names) they had.
template <class B>
struct BwdWsWindow : B {
  static_assert(!B::kCausal && !B::kDeterministic && !B::kLagDq, "the band replaces the diagonal; no fixed order");
  static constexpr bool kWindow = true;
};

/// The grouped instantiation of traits B (not deterministic): grouped K/V (H_kv < H) or N_k ≠ N.
/// The block owns K/V head hk (BwdWsBlock::h) and loops over the H/H_kv query heads of its group
/// (h0 … h0 + G − 1), each over its query tiles; dK_c, dV_c sum over the whole group in registers
/// and are written once. Without a window, B's own masks with keys ≥ N_k and, causal, the diagonal
/// moved by the offset N_k − N (key ≤ query + N_k − N; the first query tile is the first that
/// sees the block's first key); with one (kBand), the window traits' band (window_lo …
/// window_hi, the offset folded in), which masks causal too. Measured: the band instantiation runs
/// the unmasked tiles slower than B's (docs/cuda.md), hence the two.
template <class B, bool kBand>
struct BwdWsGroup : std::conditional_t<kBand, BwdWsWindow<B>, B> {
  static_assert(!B::kDeterministic && !B::kLagDq, "no fixed order");
  static constexpr bool kGroup = true;
};

/// Traits B (grouped, or the deterministic kernel's) adding dK_c, dV_c and dQ into fp32 sums
/// instead of storing 16 bits (BwdPointers::add_f32: the context-parallel ring's blocks, rounded
/// once after the ring); a trait of its own, so the other kernels keep their code and names.
template <class B>
struct BwdWsAddF32 : B {
  static_assert(B::kGroup || B::kDeterministic, "the ring runs the grouped kernels (any H_kv), or the fixed order");
  static constexpr bool kAddF32 = true;
};

/// The packed-sequence instantiation of traits B (Problem::packed(); not deterministic): the
/// grouped kernel, one block per key tile of one sequence in the packed numbering over the keys
/// (packed.cuh), its sequence's rows and lengths in BwdWsBlock, its dQ tiles those of the packed
/// query numbering. Like the grouped kernel, on B's own masks without a window (B causal: the
/// diagonal moved by each sequence's offset len_k − len_q) and on the band with one (kBand): the
/// band's code runs the unmasked tiles slower (docs/cuda.md). A trait of its own, so the other
/// kernels keep their code and names. kPersistent_: one block per SM running work items in a row
/// (bwd_ws_packed_body), else one block per work item.
template <class B, bool kBand, bool kPersistent_ = false>
struct BwdWsPacked : BwdWsGroup<B, kBand> {
  static constexpr bool kPacked = true;
  static constexpr bool kPersistent = kPersistent_;
};

// Named barriers (0 is __syncthreads): both consumers (dSᵀ complete), and one per consumer.
constexpr int kDsReadyBarrier = 1, kConsumerBarrier = 2;  // 2 and 3
/// Lagged dQ: consumer 1's first products wait for consumer 0's first softmax.
constexpr int kStaggerBarrier = 4;
/// Ping-pong: consumer c waits for its turn at kTurnBarrier + c (5 and 6).
constexpr int kTurnBarrier = 5;

template <class T>
struct BwdWsSmem {
  uint32_t base;
  __device__ uint32_t k() const { return base; }
  __device__ uint32_t v() const { return base + T::kOffV; }
  __device__ uint32_t q(int s) const { return base + T::kOffQ + uint32_t(s) * T::kTileQ; }
  __device__ uint32_t dO(int s) const { return base + T::kOffDo + uint32_t(s) * T::kTileQ; }
  __device__ uint32_t ds(int buf) const { return base + T::kOffDs + uint32_t(buf % T::kDsBuffers) * T::kTileDs; }
  __device__ uint32_t dq(int c) const { return base + T::kOffDq + uint32_t(c) * T::kSliceDq; }
  __device__ uint32_t stats(int s) const { return base + T::kOffStats + uint32_t(s) * T::kStats; }
  __device__ uint32_t kv_full() const { return base + T::kOffBar; }
  __device__ uint32_t full(int s) const { return kv_full() + 8u * uint32_t(1 + s); }
  __device__ uint32_t empty(int s) const { return kv_full() + 8u * uint32_t(1 + T::kStages + s); }
  __device__ uint32_t ds_full(int buf) const { return kv_full() + 8u * uint32_t(1 + 2 * T::kStages + buf); }
  __device__ uint32_t ds_free(int buf) const { return kv_full() + 8u * uint32_t(3 + 2 * T::kStages + buf); }
  // Packed (bwd_ws_packed_body): K_j, V_j read for the last time; the work item ring of two slots.
  __device__ uint32_t kv_empty() const { return kv_full() + 8u * uint32_t(5 + 2 * T::kStages); }
  __device__ uint32_t item_full(int k) const { return kv_full() + 8u * uint32_t(6 + 2 * T::kStages + k); }
  __device__ uint32_t item_empty(int k) const { return kv_full() + 8u * uint32_t(8 + 2 * T::kStages + k); }
  __device__ uint32_t item(int k) const { return kv_full() + 8u * uint32_t(10 + 2 * T::kStages + k); }
};

/// Where a block works: key tile j (keys start_n ..) of head h, batch b; query tiles i_begin .. Tr−1
/// (a window: i_begin .. i_end − 1; Tr still counts the head's tiles, for the accumulator's layout).
/// Grouped (kGroup): h is the K/V head, and the query heads h0 .. h0 + G − 1 each run those tiles.
/// Packed (kPacked): b is 0 and start_n counts from the sequence's first key; q_row0, k_row0 are the
/// sequence's first rows of Q, dO and of K, V in the packed tensors, q_tile0 its first query tile in
/// the packed numbering (the accumulator), Tq that numbering's tiles per head.
struct BwdWsBlock {
  int start_n, h, b, i_begin, Tr, i_end;
  int h0 = 0, G = 1;
  int q_row0 = 0, k_row0 = 0, q_tile0 = 0, Tq = 0;
};

/// The end of a block's query tile loop: Tr, or with a window the tile after the band's last.
template <class T>
__device__ __forceinline__ int query_tiles_end(const BwdWsBlock& w) {
  return T::kWindow ? w.i_end : w.Tr;
}

/// The number of query heads a block runs (1 unless grouped) and the query head of its g-th.
template <class T>
__device__ __forceinline__ int group_heads(const BwdWsBlock& w) {
  return T::kGroup ? w.G : 1;
}
template <class T>
__device__ __forceinline__ int query_head(const BwdWsBlock& w, int g) {
  return T::kGroup ? w.h0 + g : w.h;
}
/// Grouped: after the last query tile of query head h0 + g, the first tile of the next head (the
/// loop's ++i then starts it); otherwise nothing. Every loop over a block's steps ends with this,
/// so the producer, the stats warp and the consumers walk the same (head, tile) steps.
template <class T>
__device__ __forceinline__ void next_group_head(const BwdWsBlock& w, int& i, int& g) {
  if (T::kGroup && i + 1 == query_tiles_end<T>(w) && g + 1 < w.G) {
    i = w.i_begin - 1;
    ++g;
  }
}

/// Issue the d/64 TMA boxes of one [kRows][d] tile (rows from token `row0` of head h, batch b).
template <class T, int kRows>
__device__ __forceinline__ void tma_rows(uint32_t dst, const CUtensorMap* map, int row0, int h, int b, uint32_t bar) {
#pragma unroll
  for (int c = 0; c < T::kColBlocks; ++c) tma_load_4d(dst + uint32_t(c) * kRows * 128, map, 64 * c, h, row0, b, bar);
}

/// The steps of block w: its query tiles, times its query heads (grouped).
template <class T>
__device__ __forceinline__ int block_steps(const BwdWsBlock& w) {
  return (query_tiles_end<T>(w) - w.i_begin) * group_heads<T>(w);
}

/// Producer thread: block w's K_j, V_j into their tiles (kv_full).
template <class T>
__device__ __forceinline__ void load_kv(const BwdWsSmem<T>& sm, const BwdWsBlock& w, const CUtensorMap* map_k,
                                        const CUtensorMap* map_v) {
  mbar_arrive_expect_tx(sm.kv_full(), 2 * T::kTileKV);
  // Packed: the boxes may run past the sequence's last row into the next sequence's (masked).
  const int k_row = T::kPacked ? w.k_row0 + w.start_n : w.start_n;
  tma_rows<T, T::BLOCK_N>(sm.k(), map_k, k_row, w.h, w.b, sm.kv_full());
  tma_rows<T, T::BLOCK_N>(sm.v(), map_v, k_row, w.h, w.b, sm.kv_full());
}

/// Producer thread: Q_i, dO_i of block w's steps through the stage ring, from the ring's step n on;
/// before(k) runs before the block's k-th step is loaded. Returns the ring's next step.
template <class T, class BeforeStep>
__device__ __forceinline__ int produce_steps(const BwdWsSmem<T>& sm, const BwdWsBlock& w, const CUtensorMap* map_q,
                                             const CUtensorMap* map_do, int n, BeforeStep before) {
  const int q_row0 = T::kPacked ? w.q_row0 : 0;
  int g = 0;  // grouped: the query head h0 + g
  for (int i = w.i_begin, k = 0; i < query_tiles_end<T>(w); ++i, ++k, ++n) {
    before(k);
    const int s = n % T::kStages;
    // Stage s was last filled for step n − kStages: wait for that phase of empty[s].
    if (n >= T::kStages) mbar_wait(sm.empty(s), uint32_t(n / T::kStages - 1) & 1u);
    mbar_arrive_expect_tx(sm.full(s), 2 * T::kTileQ);
    tma_rows<T, T::BLOCK_M>(sm.q(s), map_q, q_row0 + i * T::BLOCK_M, query_head<T>(w, g), w.b, sm.full(s));
    tma_rows<T, T::BLOCK_M>(sm.dO(s), map_do, q_row0 + i * T::BLOCK_M, query_head<T>(w, g), w.b, sm.full(s));
    if constexpr (T::kGroup) next_group_head<T>(w, i, g);
  }
  return n;
}

/// Producer thread: K_j, V_j once, then Q_i, dO_i per step through the stage ring.
template <class T>
__device__ void produce_tiles(const BwdWsSmem<T>& sm, const BwdWsBlock& w, const CUtensorMap* map_q,
                              const CUtensorMap* map_k, const CUtensorMap* map_v, const CUtensorMap* map_do) {
  load_kv<T>(sm, w, map_k, map_v);
  produce_steps<T>(sm, w, map_q, map_do, 0, [](int) {});
}

/// Stats warp: LSE_i, D_i of each step into the stage (0 for rows ≥ N), one arrival per lane; the
/// ring's steps from n on. Returns the ring's next step.
template <class T>
__device__ int produce_stats(const BwdWsSmem<T>& sm, const BwdWsBlock& w, const Problem& p,
                             const float* __restrict__ LSE, const float* __restrict__ D, int lane, int n = 0) {
  const std::size_t stat0 = p.stat_offset(w.b, w.h);
  int g = 0;  // grouped: the query head h0 + g
  for (int i = w.i_begin; i < query_tiles_end<T>(w); ++i, ++n) {
    // Packed: LSE, D are [1, H, total_q], the sequence's rows from q_row0.
    const std::size_t stat = T::kPacked ? std::size_t(query_head<T>(w, g)) * std::size_t(p.total_q) + w.q_row0
                             : T::kGroup ? p.stat_offset(w.b, query_head<T>(w, g))
                                         : stat0;
    const int s = n % T::kStages;
    if (n >= T::kStages) mbar_wait(sm.empty(s), uint32_t(n / T::kStages - 1) & 1u);
#pragma unroll
    for (int r = lane; r < T::BLOCK_M; r += 32) {
      const int row = i * T::BLOCK_M + r;
      const float lse = row < p.seq ? LSE[stat + row] : 0.f, d = row < p.seq ? D[stat + row] : 0.f;
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sm.stats(s) + 4u * uint32_t(r)), "f"(lse) : "memory");
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sm.stats(s) + 4u * uint32_t(T::BLOCK_M + r)), "f"(d) : "memory");
    }
    mbar_arrive(sm.full(s));  // release: the stores above before the phase completes
    if constexpr (T::kGroup) next_group_head<T>(w, i, g);
  }
  return n;
}

/// Issue C (64 keys × BLOCK_M queries) = A_c Bᵀ over k = d: A = 64 rows of a resident [128][d]
/// tile (K_j or V_j) from row 64c, B = a [BLOCK_M][d] stage tile (Q_i or dO_i). Sᵀ and dPᵀ.
/// Br = 128 as two n64 halves (queries 64h ..; the accumulator layout of m64n128 is that of two
/// m64n64 side by side): ptxas serialises the m64n128 form in this kernel.
template <class T>
__device__ __forceinline__ void issue_transposed_scores(float (&c)[T::BLOCK_M / 2], uint32_t sA_c, uint32_t sB) {
  constexpr int kHalves = T::BLOCK_M / 64;
  // Each k-step's descriptors as one add to the first (desc_plus), not rebuilt: 19 % fewer
  // instructions a step at d = 128 (ncu), uniform-datapath work the compiler does not hoist.
  const uint64_t da0 = smem_desc(sA_c, 16, 1024), db0 = smem_desc(sB, 16, 1024);
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    float(&ch)[32] = *reinterpret_cast<float(*)[32]>(&c[32 * h]);
#pragma unroll
    for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
      const uint32_t col = uint32_t(kk / 4), k32 = uint32_t(kk % 4) * 32;  // 64-column box, k16 inside it
      const uint64_t da = desc_plus(da0, col * T::BLOCK_N * 128 + k32);
      const uint64_t db = desc_plus(db0, col * T::BLOCK_M * 128 + uint32_t(h) * 64 * 128 + k32);
      wgmma_ss_t<T::kBf16, 64, false, false>(ch, da, db, kk > 0);
    }
  }
}

/// Issue acc (64 keys × d) += Xᵀ B over k = BLOCK_M queries: Xᵀ as register A fragments, B = a
/// [BLOCK_M][d] stage tile read MN-major (LBO = bytes between 64-column boxes, SBO = 8 rows).
/// dV_c += Pᵀ dO_i and dK_c += dSᵀ Q_i.
template <class T>
__device__ __forceinline__ void issue_key_grad(float (&acc)[T::kHeadDim / 2], const uint32_t (&xa)[T::BLOCK_M / 16][4],
                                               uint32_t sB) {
  const uint64_t db0 = smem_desc(sB, T::BLOCK_M * 128, 1024);  // advanced by desc_plus
#pragma unroll
  for (int kk = 0; kk < T::BLOCK_M / 16; ++kk)
    wgmma_rs<T::kBf16, T::kHeadDim>(acc, xa[kk], desc_plus(db0, uint32_t(kk) * 16 * 128), 1);
}

/// Issue this consumer's dQ_i partial = dS_ij K_j, its query row block m × kDqCols columns, over
/// kDqKeys keys; dSᵀ [key][query] (box b: queries 64b ..) and K_j [key][d] are both MN-major
/// operands (16 keys = 2048 bytes).
template <class T>
__device__ __forceinline__ void issue_dq(float (&dq)[T::kDqCols / 2], uint32_t sDs, uint32_t sK, int c, int m) {
  // Columns: all keys, K_j's 64-column box c. Keys: this consumer's 64 key rows. Rows: all keys,
  // dSᵀ's query box c.
  const int box = T::kDqSplit == DqSplit::rows ? c : m;
  const uint32_t a0 = sDs + uint32_t(box) * T::BLOCK_N * 128 + (T::kDqSplitKeys ? uint32_t(c) * 64 * 128 : 0u);
  const uint32_t b0 = sK + (T::kDqSplitKeys                        ? uint32_t(c) * 64 * 128
                            : T::kDqSplit == DqSplit::columns ? uint32_t(c) * T::BLOCK_N * 128
                                                              : 0u);
  const uint64_t da0 = smem_desc(a0, T::BLOCK_N * 128, 1024), db0 = smem_desc(b0, T::BLOCK_N * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < T::kDqKeys / 16; ++kk)
    wgmma_ss_t<T::kBf16, T::kDqCols, true, true>(dq, desc_plus(da0, uint32_t(kk) * 2048),
                                                 desc_plus(db0, uint32_t(kk) * 2048), kk > 0);
}

/// Pᵀ in place of Sᵀ (fp32), this thread's accumulator entries: key row `key_row` (+ 8 for
/// r = 1), query column 8t + 2·t4 + e. Masked entries (need_mask only) → 0: keys or queries ≥ N,
/// (causal) keys past the query, (window) keys outside query + lo .. query + hi. The mask is a
/// second pass behind one branch: inside the exponentials' loop the compiler turns the test into
/// a compare, a predicate merge and a select per entry that every step executes.
template <class T>
__device__ __forceinline__ void probs(float (&st)[T::BLOCK_M / 2], uint32_t sStats, int q0, int key_row, int N,
                                      bool need_mask, int t4, float scale_log2, int lo = 0, int hi = 0, int Nk = 0,
                                      int coff = 0) {
#pragma unroll
  for (int t = 0; t < T::BLOCK_M / 8; ++t) {
    float2 lse;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                 : "=f"(lse.x), "=f"(lse.y)
                 : "r"(sStats + 4u * uint32_t(8 * t + 2 * t4)));
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int idx = 4 * t + 2 * r + e;
        st[idx] = ex2(fmaf(st[idx], scale_log2, -(e ? lse.y : lse.x)));
      }
  }
  if (!need_mask) return;
#pragma unroll
  for (int t = 0; t < T::BLOCK_M / 8; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int query = q0 + 8 * t + 2 * t4 + e, key = key_row + 8 * r;
        const bool seen = query < N && key < (T::kGroup ? Nk : N) && (!T::kCausal || key <= query + coff) &&
                          (!T::kWindow || (key - query >= lo && key - query <= hi));
        st[4 * t + 2 * r + e] = seen ? st[4 * t + 2 * r + e] : 0.f;
      }
}

/// dSᵀ = Pᵀ ∘ (dPᵀ − D_i) in place of dPᵀ (D per query column, as LSE in probs()).
template <class T>
__device__ __forceinline__ void grads(const float (&pt)[T::BLOCK_M / 2], float (&dpt)[T::BLOCK_M / 2],
                                      uint32_t sStats, int t4) {
#pragma unroll
  for (int t = 0; t < T::BLOCK_M / 8; ++t) {
    float2 dd;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                 : "=f"(dd.x), "=f"(dd.y)
                 : "r"(sStats + 4u * uint32_t(T::BLOCK_M + 8 * t + 2 * t4)));
#pragma unroll
    for (int idx = 4 * t; idx < 4 * t + 4; ++idx) dpt[idx] = pt[idx] * (dpt[idx] - (idx % 2 ? dd.y : dd.x));
  }
}

/// Accumulator (m64 × 8·kT) → 16-bit register A fragments of the next product (k16 step kk =
/// accumulator n-tiles 2kk, 2kk + 1: no shuffles).
template <bool kBf16, int kT>
__device__ __forceinline__ void pack_a(const float (&acc)[4 * kT], uint32_t (&a)[kT / 2][4]) {
#pragma unroll
  for (int kk = 0; kk < kT / 2; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) a[kk][q] = pack2<kBf16>(acc[8 * kk + 2 * q], acc[8 * kk + 2 * q + 1]);
}

/// dSᵀ fragments → SRAM buffer [128 keys][BLOCK_M queries] as BLOCK_M / 64 boxes of
/// [128 keys][64 queries] in the 128-byte swizzle (16-byte chunk q/8 of row k stored at chunk
/// (q/8) ^ (k % 8)), then the proxy fence for wgmma's reads.
template <class T>
__device__ __forceinline__ void store_ds(uint32_t sDs, const uint32_t (&dsa)[T::BLOCK_M / 16][4], int key_local,
                                         int t4) {
#pragma unroll
  for (int t = 0; t < T::BLOCK_M / 8; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = key_local + 8 * r, box = t / 8;
      const uint32_t addr = sDs + uint32_t(box) * T::BLOCK_N * 128 + uint32_t(row) * 128 +
                            (uint32_t((t % 8) ^ (row & 7)) << 4) + 4u * uint32_t(t4);
      // fragment a[t/2][2·(t%2) + r] holds accumulator entries 4t + 2r, 4t + 2r + 1.
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(dsa[t / 2][2 * (t % 2) + r]) : "memory");
    }
  fence_proxy_async_shared();
}

/// Deterministic order: spin until the tile's counter reads `turn` (acquire), then order the
/// generic-proxy acquire before the async-proxy reduction.
__device__ __forceinline__ void wait_dq_turn(const int* counter, int turn) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen != turn);
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
/// Deterministic order: this thread's bulk reductions performed, then the counter + 1 (release).
__device__ __forceinline__ void pass_dq_turn(int* counter) {
  bulk_wait_group<0>();
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

/// dQ partial, row block m → this consumer's SRAM slice (fragment order: float4 number
/// (m·kDqCols/8 + t)·128 + tid). The slice is free: its previous bulk read was waited for before
/// the dSᵀ barrier of this step.
template <class T>
__device__ __forceinline__ void stage_dq(const float (&dq)[T::kDqCols / 2], uint32_t sSlice, int m, int tid) {
#pragma unroll
  for (int t = 0; t < T::kDqCols / 8; ++t) {
    const int f4 = (m * (T::kDqCols / 8) + t) * 128 + tid;
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(sSlice + uint32_t(f4) * 16), "f"(dq[4 * t]),
                 "f"(dq[4 * t + 1]), "f"(dq[4 * t + 2]), "f"(dq[4 * t + 3])
                 : "memory");
  }
}

/// The staged slice → one bulk fp32 add into the accumulator tile. `tid` 0 owns the bulk group;
/// deterministic, it adds at turn `turn` of the tile's counter `order`.
template <class T>
__device__ __forceinline__ void reduce_dq(uint32_t sSlice, float* dst, int c, int tid, int* order, int turn) {
  fence_proxy_async_shared();
  named_bar_sync(kConsumerBarrier + c, 128);
  if (tid == 0) {
    if constexpr (T::kDeterministic) wait_dq_turn(order, turn);
    bulk_reduce_add_f32(dst, sSlice, uint32_t(T::kSliceDq));
    bulk_commit_group();
    if constexpr (T::kDeterministic) pass_dq_turn(order);
  }
}

/// dK_c = scale · acc_dk and dV_c = acc_dv: registers → HBM (rows ≥ N skipped).
template <class T>
__device__ __forceinline__ void store_key_grads(const Problem& p, uint16_t* __restrict__ out,
                                                const float (&acc)[T::kHeadDim / 2],
                                                float scale, std::size_t base, int key, int t4) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = key + 8 * r;
    if (row >= (T::kGroup ? p.seq_k : p.seq)) continue;  // grouped: [B, N_k, H_kv, d]
    if constexpr (T::kAddF32) {
      // Each key row belongs to one block, the ring's calls run in turn: nothing races.
      float* dst = reinterpret_cast<float*>(out) + base +
                   std::size_t(row) * (T::kGroup ? p.kv_row_stride() : p.row_stride()) + 2 * t4;
#pragma unroll
      for (int t = 0; t < T::kHeadDim / 8; ++t) {
        float2 v = *reinterpret_cast<const float2*>(dst + 8 * t);
        v.x += acc[4 * t + 2 * r] * scale;
        v.y += acc[4 * t + 2 * r + 1] * scale;
        *reinterpret_cast<float2*>(dst + 8 * t) = v;
      }
    } else {
      uint16_t* dst = out + base + std::size_t(row) * (T::kGroup ? p.kv_row_stride() : p.row_stride()) + 2 * t4;
#pragma unroll
      for (int t = 0; t < T::kHeadDim / 8; ++t)
        *reinterpret_cast<uint32_t*>(dst + 8 * t) =
            pack2<T::kBf16>(acc[4 * t + 2 * r] * scale, acc[4 * t + 2 * r + 1] * scale);
    }
  }
}

/// Step n's products up to dK (issued, not waited for): Sᵀ, dPᵀ on the tensor cores, Pᵀ while
/// dPᵀ still runs, then dV_c += Pᵀ dO_i (before dSᵀ where kDvBeforeGrads), dSᵀ, dK_c += dSᵀ Q_i.
/// Pᵀ and dSᵀ come back as the 16-bit A fragments `pa`, `dsa` (dSᵀ also goes to SRAM, by the caller).
/// `softmax_started`: called once Sᵀ is in registers (the stagger of the lagged dQ).
template <class T, class OnSoftmax>
__device__ __forceinline__ void key_grads_step(const Problem& p, const BwdWsSmem<T>& sm, const BwdWsBlock& w, int s,
                                               int q0, int c, int key_row, int t4, float (&acc_dv)[T::kHeadDim / 2],
                                               float (&acc_dk)[T::kHeadDim / 2], uint32_t (&pa)[T::BLOCK_M / 16][4],
                                               uint32_t (&dsa)[T::BLOCK_M / 16][4], OnSoftmax softmax_started) {
  constexpr int BM = T::BLOCK_M;
  const uint32_t sK_c = sm.k() + uint32_t(c) * 64 * 128, sV_c = sm.v() + uint32_t(c) * 64 * 128;
  float st[BM / 2], dpt[BM / 2];
  wg_fence();
  issue_transposed_scores<T>(st, sK_c, sm.q(s));
  wg_commit();
  issue_transposed_scores<T>(dpt, sV_c, sm.dO(s));
  wg_commit();
  wg_wait<1>();
  reg_fence(st);
  softmax_started();
  const int N = p.seq;
  const bool need_mask = q0 + BM > N || w.start_n + T::BLOCK_N > N || (T::kCausal && w.start_n + 64 * c + 63 > q0);
  probs<T>(st, sm.stats(s), q0, key_row, N, need_mask, t4, p.scale_log2);
  if constexpr (T::kDvBeforeGrads) {
    pack_a<T::kBf16, BM / 8>(st, pa);
    wg_fence();
    reg_fence(acc_dv);
    reg_fence_u(pa);
    issue_key_grad<T>(acc_dv, pa, sm.dO(s));
    wg_commit();
    wg_wait<1>();  // dPᵀ done; dV's product may still run
    reg_fence(dpt);
    grads<T>(st, dpt, sm.stats(s), t4);
  } else {
    wg_wait<0>();
    reg_fence(dpt);
    grads<T>(st, dpt, sm.stats(s), t4);
    pack_a<T::kBf16, BM / 8>(st, pa);
  }
  pack_a<T::kBf16, BM / 8>(dpt, dsa);
  wg_fence();
  reg_fence(acc_dk);
  reg_fence_u(dsa);
  issue_key_grad<T>(acc_dk, dsa, sm.q(s));
  if constexpr (!T::kDvBeforeGrads) {
    reg_fence(acc_dv);
    reg_fence_u(pa);
    issue_key_grad<T>(acc_dv, pa, sm.dO(s));
  }
  wg_commit();
}

/// This consumer's dQ partial from the dSᵀ buffer sDs → its staging slice (every product of the
/// warpgroup waited for, so key_grads_step's too). One m64 row block at a time: 32 accumulator
/// registers, not 64, at Br = 128 with the key split.
template <class T>
__device__ __forceinline__ void compute_dq(const BwdWsSmem<T>& sm, uint32_t sDs, int c, int tid) {
#pragma unroll
  for (int m = 0; m < T::kRowBlocks; ++m) {
    float dq[T::kDqCols / 2];
    wg_fence();
    issue_dq<T>(dq, sDs, sm.k(), c, m);
    wg_commit();
    wg_wait<0>();
    reg_fence(dq);
    stage_dq<T>(dq, sm.dq(c), m, tid);
  }
}

/// One consumer warpgroup c: keys [64c, 64c + 64) of block w's K_j, V_j (phase kv_phase of kv_full),
/// every query tile, from the ring's step n on; dK_c, dV_c stored. Returns the ring's next step.
/// Persistent (packed): every thread arrives on kv_empty after its last read of K_j, V_j (the last
/// step's dQ product), before the stores, so the producer loads the next item's K_j, V_j meanwhile.
template <class T>
__device__ __forceinline__ int consume_tile(const Problem& p, const BwdWsSmem<T>& sm, const BwdWsBlock& w,
                                            float* __restrict__ dQaccum, int* __restrict__ dq_order,
                                            uint16_t* __restrict__ dK, uint16_t* __restrict__ dV, int c, int n,
                                            uint32_t kv_phase) {
  constexpr int BM = T::BLOCK_M, D = T::kHeadDim;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, t4 = lane % 4;
  const int key_local = 64 * c + 16 * warp + lane / 4;  // this thread's key rows: key_local, + 8
  const int key_row = w.start_n + key_local, N = p.seq;
  const uint32_t sK_c = sm.k() + uint32_t(c) * 64 * 128, sV_c = sm.v() + uint32_t(c) * 64 * 128;
  const std::size_t tiles_base = (std::size_t(w.b) * p.heads + w.h) * std::size_t(w.Tr);
  float acc_dv[D / 2], acc_dk[D / 2];
#pragma unroll
  for (int k = 0; k < D / 2; ++k) acc_dv[k] = acc_dk[k] = 0.f;
  mbar_wait(sm.kv_full(), kv_phase);
  if (T::kPersistent && w.i_begin >= query_tiles_end<T>(w)) mbar_arrive(sm.kv_empty());  // no step reads them
  // Consumer 0 takes the first turn (grouped, a block may run no step: then it hands none over).
  if (T::kPingPong && c == 1 && (!T::kGroup || w.i_begin < query_tiles_end<T>(w))) named_bar_arrive(kTurnBarrier, 256);
  // A window: the band's edges, and the end of this block's query tiles (every block has one at
  // least: with N_k = N each key sees its own query, lo ≤ 0 ≤ hi, so the hand-over above balances).
  const int lo = T::kWindow ? p.window_lo() : 0, hi = T::kWindow ? p.window_hi() : 0;
  const int i_end = query_tiles_end<T>(w);
  const int Nk = T::kGroup ? p.seq_k : N, G = group_heads<T>(w);
  const int coff = T::kGroup && T::kCausal ? p.causal_offset() : 0;  // the causal diagonal's offset

  // dQ by turns: the partial of step m (buffer m & 1, this consumer's: m & 1 == c) into the
  // accumulator tile dst, computed during step m + 1, after that step's products (or after the
  // last step). In step m itself the consumer would wait for the other's dSᵀ rows, which that one
  // stores late: it has just computed the dQ of step m − 1.
  const int n_first = n;
  float* prev_dst = nullptr;
  const auto turn_dq = [&](int m, float* dst) {
    static_assert(T::kRowBlocks == 1, "the whole partial in one product: 64 registers");
    if (tid == 0) bulk_wait_group_read<0>();  // the slice's bulk read of two steps ago
    named_bar_sync(kConsumerBarrier + c, 128);   // this consumer's dSᵀ rows stored; the slice free
    mbar_wait(sm.ds_full(m & 1), uint32_t(m / 2) & 1u);
    float dq[T::kDqCols / 2];
    wg_fence();
    issue_dq<T>(dq, sm.ds(m & 1), sm.k(), c, 0);
    wg_commit();
    wg_wait<0>();
    reg_fence(dq);
    mbar_arrive(sm.ds_free(m & 1));
    stage_dq<T>(dq, sm.dq(c), 0, tid);
    reduce_dq<T>(sm.dq(c), dst, c, tid, dq_order, 0);
  };
  int g = 0;  // grouped: the query head h0 + g
  for (int i = w.i_begin; i < i_end; ++i, ++n) {
    const int s = n % T::kStages, q0 = i * BM;
    // Grouped: the accumulator tiles of query head h0 + g.
    // Packed: the sequence's tiles of that head in the packed query numbering.
    const std::size_t head_tiles =
        T::kPacked  ? std::size_t(query_head<T>(w, g)) * std::size_t(w.Tq) + std::size_t(w.q_tile0)
        : T::kGroup ? (std::size_t(w.b) * p.heads + query_head<T>(w, g)) * std::size_t(w.Tr)
                    : tiles_base;
    mbar_wait(sm.full(s), uint32_t(n / T::kStages) & 1u);
    float st[BM / 2], dpt[BM / 2];
    if (T::kPingPong) named_bar_sync(kTurnBarrier + c, 256);
    wg_fence();
    issue_transposed_scores<T>(st, sK_c, sm.q(s));
    wg_commit();
    issue_transposed_scores<T>(dpt, sV_c, sm.dO(s));
    wg_commit();
    // The other consumer's turn; consumer 1's last hands none on (no arrival left at exit).
    if (T::kPingPong && (c == 0 || i + 1 < i_end || g + 1 < G)) named_bar_arrive(kTurnBarrier + (c ^ 1), 256);
    // Pᵀ while dPᵀ is still on the tensor cores, then (kDvBeforeGrads) dV_c += Pᵀ dO_i while dSᵀ
    // is computed.
    wg_wait<1>();
    reg_fence(st);
    // A window: the consumer's 64 keys not all inside every row's band (the last row's left edge
    // past the first key, or the first row's right edge before the last key).
    const int key_c = w.start_n + 64 * c;
    const bool need_mask = q0 + BM > N || w.start_n + T::BLOCK_N > Nk ||
                           (T::kCausal && w.start_n + 64 * c + 63 > q0 + coff) ||
                           (T::kWindow && (q0 + BM - 1 + lo > key_c || key_c + 63 > q0 + hi));
    probs<T>(st, sm.stats(s), q0, key_row, N, need_mask, t4, p.scale_log2, lo, hi, Nk, coff);
    uint32_t pa[BM / 16][4], dsa[BM / 16][4];
    if constexpr (T::kDvBeforeGrads) {
      pack_a<T::kBf16, BM / 8>(st, pa);
      wg_fence();
      reg_fence(acc_dv);
      reg_fence_u(pa);
      issue_key_grad<T>(acc_dv, pa, sm.dO(s));
      wg_commit();
      wg_wait<1>();  // dPᵀ done; dV's product may still run
      reg_fence(dpt);
      grads<T>(st, dpt, sm.stats(s), t4);
    } else {
      wg_wait<0>();
      reg_fence(dpt);
      grads<T>(st, dpt, sm.stats(s), t4);
      pack_a<T::kBf16, BM / 8>(st, pa);
    }
    pack_a<T::kBf16, BM / 8>(dpt, dsa);
    // dK_c += dSᵀ Q_i: issued now, it runs while dSᵀ goes to SRAM.
    wg_fence();
    reg_fence(acc_dk);
    reg_fence_u(dsa);
    issue_key_grad<T>(acc_dk, dsa, sm.q(s));
    if constexpr (!T::kDvBeforeGrads) {
      reg_fence(acc_dv);
      reg_fence_u(pa);
      issue_key_grad<T>(acc_dv, pa, sm.dO(s));
    }
    wg_commit();
    const bool last_step = i + 1 == i_end && g + 1 == G;  // persistent: K_j read for the last time after it
    if constexpr (T::kDqTurns) {
      // Step n's dQ is consumer (n & 1)'s, from buffer n & 1, which only that consumer reads, one
      // step late (turn_dq above): the other stores its dSᵀ rows there once that read of two steps
      // ago is done (ds_free), hands them over (ds_full), and computes its own dQ of step n − 1.
      const int b = n & 1;
      if (b != c && n >= 2) mbar_wait(sm.ds_free(b), uint32_t((n - 2) / 2) & 1u);
      store_ds<T>(sm.ds(b), dsa, key_local, t4);
      if (b != c) mbar_arrive(sm.ds_full(b));
      wg_wait<0>();
      reg_fence(acc_dv);
      reg_fence(acc_dk);
      reg_fence_u(pa);
      reg_fence_u(dsa);
      mbar_arrive(sm.empty(s));  // Q_i, dO_i and the stats read for the last time (every thread)
      if (b != c && n > n_first) turn_dq(n - 1, prev_dst);
      prev_dst = dQaccum + (head_tiles + std::size_t(i)) * (BM * D);
      if (T::kPersistent && last_step && b != c) mbar_arrive(sm.kv_empty());  // K_j read for the last time
    } else {
      // dSᵀ of step n → buffer n & 1: the other consumer read buffer n & 1 last at step n − 2,
      // before it arrived at step n − 1's barrier, which this consumer has passed. Key split: one
      // buffer, this consumer's rows only, read by its own dQ product of step n − 1 (waited below).
      const uint32_t sDs = sm.ds(n & 1);
      store_ds<T>(sDs, dsa, key_local, t4);
      // The dQ slice's previous bulk read (a step ago) done before the barrier, so the barrier
      // also frees the slice for this step's partial.
      if (tid == 0) bulk_wait_group_read<0>();
      if (T::kDqSplitKeys) named_bar_sync(kConsumerBarrier + c, 128);  // this consumer's key rows only
      else named_bar_sync(kDsReadyBarrier, 256);                       // every key row of dSᵀ
      compute_dq<T>(sm, sDs, c, tid);
      if (T::kPersistent && last_step) mbar_arrive(sm.kv_empty());  // K_j read for the last time
      reg_fence(acc_dv);
      reg_fence(acc_dk);
      reg_fence_u(pa);
      reg_fence_u(dsa);
      // Done with Q_i, dO_i, LSE_i, D_i. Every thread arrives (each releases its own reads of the
      // stats, which the stats warp overwrites next; one arrival per warp left racecheck a WAR).
      mbar_arrive(sm.empty(s));
      float* dst = dQaccum + (head_tiles + std::size_t(i)) * (BM * D) +
                   (T::kDqSplitKeys ? 0 : std::size_t(c) * (T::kSliceDq / 4));  // slice c of the tile
      // Deterministic: every key block before this one adds into tile i first (causal ones too:
      // they start at lower tiles).
      const int turn = 2 * (w.start_n / T::BLOCK_N) + c;
      reduce_dq<T>(sm.dq(c), dst, c, tid, dq_order + head_tiles + i, turn);
    }
    if constexpr (T::kGroup) next_group_head<T>(w, i, g);
  }
  if constexpr (T::kDqTurns) {
    if (n > n_first && ((n - 1) & 1) == c) {  // this consumer's last partial
      turn_dq(n - 1, prev_dst);
      if (T::kPersistent) mbar_arrive(sm.kv_empty());
    }
  }
  // Grouped: dK, dV are [B, N_k, H_kv, d], written once for the whole group.
  // Packed: [1, total_k, H_kv, d] from the sequence's first key (p.seq_k its length: the rows stop there).
  const std::size_t base = T::kPacked  ? std::size_t(w.k_row0) * p.kv_row_stride() + std::size_t(w.h) * D
                           : T::kGroup ? p.kv_head_offset(w.b, w.h)
                                       : p.head_offset(w.b, w.h);
  store_key_grads<T>(p, dK, acc_dk, p.scale, base, key_row, t4);
  store_key_grads<T>(p, dV, acc_dv, 1.f, base, key_row, t4);
  return n;
}

/// One consumer warpgroup c: keys [64c, 64c + 64) of the block's K_j, V_j, every query tile.
template <class T>
__device__ void consume(const Problem& p, const BwdWsSmem<T>& sm, const BwdWsBlock& w, float* __restrict__ dQaccum,
                        int* __restrict__ dq_order, uint16_t* __restrict__ dK, uint16_t* __restrict__ dV, int c) {
  consume_tile<T>(p, sm, w, dQaccum, dq_order, dK, dV, c, 0, 0);
  if (threadIdx.x % 128 == 0) bulk_wait_group<0>();  // no bulk reduction may still read SRAM when the block exits
}

/// consume() with dQ one step late (kLagDq): dSᵀ of step n goes to buffer n & 1 once both
/// consumers' dQ of step n − 2 has read it (ds_free), dQ of step n − 1 is computed once both
/// consumers' dSᵀ of step n − 1 is there (ds_full). Nothing makes the consumers meet, and consumer 1
/// starts half a step after consumer 0 (its first products wait for consumer 0's first softmax).
template <class T>
__device__ void consume_lagged(const Problem& p, const BwdWsSmem<T>& sm, const BwdWsBlock& w,
                               float* __restrict__ dQaccum, int* __restrict__ dq_order, uint16_t* __restrict__ dK,
                               uint16_t* __restrict__ dV, int c) {
  static_assert(T::kLagDq && !T::kPingPong, "the lagged schedule (its consumers are out of step already)");
  static_assert(!T::kWindow && !T::kGroup, "key_grads_step masks no window; one head, N_k = N");
  constexpr int BM = T::BLOCK_M, D = T::kHeadDim;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, t4 = lane % 4;
  const int key_local = 64 * c + 16 * warp + lane / 4;  // this thread's key rows: key_local, + 8
  const int key_row = w.start_n + key_local;
  const std::size_t tiles_base = (std::size_t(w.b) * p.heads + w.h) * std::size_t(w.Tr);
  const auto dq_of_step = [&](int n) {  // dSᵀ of step n → dQ → the accumulator tile of step n
    mbar_wait(sm.ds_full(n & 1), uint32_t(n / 2) & 1u);
    if (tid == 0) bulk_wait_group_read<0>();
    named_bar_sync(kConsumerBarrier + c, 128);  // the staging slice is free
    compute_dq<T>(sm, sm.ds(n & 1), c, tid);
    mbar_arrive(sm.ds_free(n & 1));
    const int i = w.i_begin + n;
    float* dst = dQaccum + (tiles_base + std::size_t(i)) * (BM * D) + std::size_t(c) * (T::kSliceDq / 4);
    // Every key block before this one adds into tile i first (causal ones too: they start lower).
    return [=] { reduce_dq<T>(sm.dq(c), dst, c, tid, dq_order + tiles_base + i, 2 * (w.start_n / T::BLOCK_N) + c); };
  };
  float acc_dv[D / 2], acc_dk[D / 2];
#pragma unroll
  for (int k = 0; k < D / 2; ++k) acc_dv[k] = acc_dk[k] = 0.f;
  mbar_wait(sm.kv_full(), 0);

  for (int i = w.i_begin, n = 0; i < w.Tr; ++i, ++n) {
    const int s = n % T::kStages;
    mbar_wait(sm.full(s), uint32_t(n / T::kStages) & 1u);
    if (c == 1 && n == 0) named_bar_sync(kStaggerBarrier, 256);
    uint32_t pa[BM / 16][4], dsa[BM / 16][4];
    key_grads_step<T>(p, sm, w, s, i * BM, c, key_row, t4, acc_dv, acc_dk, pa, dsa, [&] {
      if (c == 0 && n == 0) named_bar_arrive(kStaggerBarrier, 256);
    });
    if (n >= 2) mbar_wait(sm.ds_free(n & 1), uint32_t((n - 2) / 2) & 1u);
    store_ds<T>(sm.ds(n & 1), dsa, key_local, t4);
    mbar_arrive(sm.ds_full(n & 1));
    if (n >= 1) {
      const auto reduce = dq_of_step(n - 1);
      wg_wait<0>();
      reg_fence(acc_dv);
      reg_fence(acc_dk);
      reg_fence_u(pa);
      reg_fence_u(dsa);
      mbar_arrive(sm.empty(s));  // every thread: its reads of the stage's stats are done
      reduce();
    } else {
      wg_wait<0>();
      reg_fence(acc_dv);
      reg_fence(acc_dk);
      reg_fence_u(pa);
      reg_fence_u(dsa);
      mbar_arrive(sm.empty(s));
    }
  }
  dq_of_step(w.Tr - 1 - w.i_begin)();  // the last step's dQ
  const std::size_t base = p.head_offset(w.b, w.h);
  store_key_grads<T>(p, dK, acc_dk, p.scale, base, key_row, t4);
  store_key_grads<T>(p, dV, acc_dv, 1.f, base, key_row, t4);
  if (tid == 0) bulk_wait_group<0>();  // no bulk reduction may still read SRAM when the block exits
}

/// The block's work once BwdWsBlock `w` is known (the kernels below): barriers, then the producer
/// warpgroup's loads and the two consumers.
template <class T>
__device__ __forceinline__ void bwd_ws_body(const BwdWsSmem<T>& sm, const BwdWsBlock& w, const Problem& p,
                                            const CUtensorMap* map_q, const CUtensorMap* map_k,
                                            const CUtensorMap* map_v, const CUtensorMap* map_do,
                                            const float* __restrict__ LSE, const float* __restrict__ D,
                                            float* __restrict__ dQaccum, int* __restrict__ dq_order,
                                            uint16_t* __restrict__ dK, uint16_t* __restrict__ dV) {
  static_assert(!T::kPersistent, "one block per key tile; the persistent one: bwd_ws_packed_body");
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    tma_prefetch_map(map_q);
    tma_prefetch_map(map_k);
    tma_prefetch_map(map_v);
    tma_prefetch_map(map_do);
    mbar_init(sm.kv_full(), 1);
    for (int s = 0; s < T::kStages; ++s) {
      mbar_init(sm.full(s), 1 + 32);  // the TMA thread's expect_tx + the stats warp's lanes
      mbar_init(sm.empty(s), T::kConsumerThreads);
    }
    if constexpr (T::kLagDq || T::kDqTurns)  // turns: one consumer arrives on each
      for (int b = 0; b < 2; ++b) {
        mbar_init(sm.ds_full(b), T::kDqTurns ? 128 : T::kConsumerThreads);
        mbar_init(sm.ds_free(b), T::kDqTurns ? 128 : T::kConsumerThreads);
      }
    mbar_fence_init();
  }
  __syncthreads();
  if (wg == 0) {
    regs_release<T::kProducerRegs>();
    if (threadIdx.x == 0) produce_tiles<T>(sm, w, map_q, map_k, map_v, map_do);
    else if (threadIdx.x / 32 == 1) produce_stats<T>(sm, w, p, LSE, D, threadIdx.x % 32);
    return;  // every load is consumed before the consumers exit
  }
  regs_claim<T::kConsumerRegs>();
  if constexpr (T::kLagDq) consume_lagged<T>(p, sm, w, dQaccum, dq_order, dK, dV, wg - 1);
  else consume<T>(p, sm, w, dQaccum, dq_order, dK, dV, wg - 1);
}

/// Grid (Tc, H, B) non-causal; causal (C, Tc, H/C · B): chunks of C heads, each with the heaviest key
/// tiles (small j) first (bwd_ws_causal_chunk()).
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    bwd_ws_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                  const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do, Problem p,
                  const float* __restrict__ LSE, const float* __restrict__ D, float* __restrict__ dQaccum,
                  int* __restrict__ dq_order, uint16_t* __restrict__ dK, uint16_t* __restrict__ dV) {
#if FLASHLAB_WGMMA_OK
  extern __shared__ uint8_t smem_raw[];
  const BwdWsSmem<T> sm{(uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u};
  int j = T::kGroup ? (p.causal ? blockIdx.y : blockIdx.x) : T::kCausal ? blockIdx.y : blockIdx.x;
  int h = T::kGroup ? (p.causal ? blockIdx.x : blockIdx.y) : T::kCausal ? blockIdx.x : blockIdx.y;
  int b = blockIdx.z;
  // Causal (grouped: causal in the band) grids run chunk by chunk of gridDim.x heads, in each the
  // heaviest key tiles first (the launcher): blockIdx.z = chunk + chunks · b.
  if (T::kCausal || (T::kGroup && T::kWindow && p.causal)) {
    const int chunks = int(gridDim.z) / p.batch;
    j = blockIdx.y;
    h = int(blockIdx.z) % chunks * int(gridDim.x) + int(blockIdx.x);
    b = int(blockIdx.z) / chunks;
  }
  BwdWsBlock w;
  w.start_n = j * T::BLOCK_N;
  w.h = h;
  w.b = b;
  // Earlier query tiles see none of these keys (grouped: key j is first seen by query j − (N_k − N)).
  w.i_begin = T::kCausal ? (T::kGroup ? max(0, w.start_n - p.causal_offset()) : w.start_n) / T::BLOCK_M : 0;
  w.Tr = (p.seq + T::BLOCK_M - 1) / T::BLOCK_M;
  if constexpr (T::kGroup) {  // h: the K/V head; its query heads h0 .. h0 + G − 1
    w.G = p.heads / p.heads_kv;
    w.h0 = h * w.G;
  }
  if constexpr (T::kWindow) {
    // Keys start_n .. key_last are seen by queries key − hi .. key − lo (clamped to the queries).
    const int key_last = min(w.start_n + T::BLOCK_N, T::kGroup ? p.seq_k : p.seq) - 1;
    const int q_first = max(0, w.start_n - p.window_hi()), q_last = min(p.seq - 1, key_last - p.window_lo());
    w.i_begin = q_first / T::BLOCK_M;
    w.i_end = q_last < q_first ? w.i_begin : q_last / T::BLOCK_M + 1;
  }
  bwd_ws_body<T>(sm, w, p, &map_q, &map_k, &map_v, &map_do, LSE, D, dQaccum, dq_order, dK, dV);
#else
  __trap();  // built without sm_90a: never launched
#endif
}

/// Key tile j of K/V head h in a packed launch (T::kPacked), j the packed numbering over the keys
/// (packed.cuh), ⌊total_k / BLOCK_N⌋ + B tiles per head. Fills `w` and `seq`, the Problem of the
/// tile's own sequence (seq = len_q, seq_k = len_k: the diagonal's or the band's offset, the masks,
/// the query tiles and the rows stored are that sequence's), its rows from the sequence's first rows
/// of the packed tensors; false for a tile past its sequence's last key (at most one per sequence),
/// which has no work.
template <class T>
__device__ __forceinline__ bool packed_block(const Problem& p, const PackedLists& lists, int j, int h, BwdWsBlock& w,
                                             Problem& seq) {
  // Keys' tile j: packed_tile() over the keys' prefix sums (its q fields then hold the keys').
  const PackedTile kt = packed_tile(lists.cu_seqlens_k, lists.cu_seqlens_q, p.batch, j, T::BLOCK_N);
  const int len_k = kt.len_q, len_q = kt.len_k;
  if (kt.row0 >= len_k) return false;
  seq = p;  // the sequence's own lengths (the band's offset len_k − len_q follows)
  seq.seq = len_q;
  seq.seq_k = len_k;
  w.start_n = kt.row0;
  w.h = h;
  w.b = 0;
  w.q_row0 = kt.k_start;  // the query sums' entry (the search ran over the keys')
  w.k_row0 = kt.q_start;
  w.q_tile0 = kt.k_start / T::BLOCK_M + kt.b;
  w.Tq = p.packed_tiles(T::BLOCK_M);
  w.Tr = (len_q + T::BLOCK_M - 1) / T::BLOCK_M;
  w.G = p.heads / p.heads_kv;
  w.h0 = h * w.G;
  if constexpr (T::kWindow) {
    // Keys start_n .. key_last are seen by queries key − hi .. key − lo (clamped to the sequence's).
    const int key_last = min(w.start_n + T::BLOCK_N, len_k) - 1;
    const int q_first = max(0, w.start_n - seq.window_hi()), q_last = min(len_q - 1, key_last - seq.window_lo());
    w.i_begin = q_first / T::BLOCK_M;
    w.i_end = q_last < q_first ? w.i_begin : q_last / T::BLOCK_M + 1;
  } else {
    // Causal: key start_n is first seen by query start_n − (len_k − len_q); a tile past the last
    // query (i_begin ≥ Tr) runs no step and writes dK = dV = 0.
    w.i_begin = T::kCausal ? max(0, w.start_n - seq.causal_offset()) / T::BLOCK_M : 0;
    w.i_end = w.Tr;
  }
  return true;
}

/// packed_block() of work item `item` of the persistent kernel: non-causal j fastest, causal h
/// fastest (the heaviest key tiles of each sequence first), the orders of the per-tile grids.
template <class T>
__device__ __forceinline__ bool packed_item(const Problem& p, const PackedLists& lists, int item, BwdWsBlock& w,
                                            Problem& seq) {
  const int tiles = p.total_k / T::BLOCK_N + p.batch;
  return packed_block<T>(p, lists, p.causal ? item / p.heads_kv : item % tiles,
                         p.causal ? item % p.heads_kv : item / tiles, w, seq);
}

/// The persistent packed kernel's block (T::kPersistent): one per SM, it runs work item after work
/// item (packed_block()): blockIdx.x first, then the next of the counter `next_item` (zeroed before
/// the launch) + gridDim.x, the items with work only. Why: a short sequence's key tile has few
/// steps, and a block's fixed cost (its start, the first K_j, V_j, Q_i, dO_i in flight, dK, dV
/// stored at its end) weighed on each; here the producer loads the next item's first Q_i, dO_i
/// into the ring while the consumers run the last steps, and its K_j, V_j once they have read
/// K_j for the last time (kv_empty), during their dK, dV stores. The producer thread publishes each
/// item in a ring of two slots (item_full, item_empty: the stats warp and the consumers read it),
/// then one past the last as the end; the stage ring's steps run on across the items.
template <class T>
__device__ void bwd_ws_packed_body(const BwdWsSmem<T>& sm, const Problem& p, const PackedLists& lists,
                                   const CUtensorMap* map_q, const CUtensorMap* map_k, const CUtensorMap* map_v,
                                   const CUtensorMap* map_do, const float* __restrict__ LSE,
                                   const float* __restrict__ D, float* __restrict__ dQaccum,
                                   uint16_t* __restrict__ dK, uint16_t* __restrict__ dV, int* __restrict__ next_item) {
  const int wg = threadIdx.x / 128;
  const int items = (p.total_k / T::BLOCK_N + p.batch) * p.heads_kv;
  if (threadIdx.x == 0) {
    tma_prefetch_map(map_q);
    tma_prefetch_map(map_k);
    tma_prefetch_map(map_v);
    tma_prefetch_map(map_do);
    mbar_init(sm.kv_full(), 1);
    mbar_init(sm.kv_empty(), T::kConsumerThreads);
    for (int s = 0; s < T::kStages; ++s) {
      mbar_init(sm.full(s), 1 + 32);  // the TMA thread's expect_tx + the stats warp's lanes
      mbar_init(sm.empty(s), T::kConsumerThreads);
    }
    for (int k = 0; k < 2; ++k) {
      mbar_init(sm.item_full(k), 1);
      mbar_init(sm.item_empty(k), 32 + T::kConsumerThreads);  // every reader: the stats warp, the consumers
      if constexpr (T::kDqTurns) {
        mbar_init(sm.ds_full(k), 128);
        mbar_init(sm.ds_free(k), 128);
      }
    }
    mbar_fence_init();
  }
  __syncthreads();
  // Item t of this block: published in slot t & 1 (phase t / 2), once slot t & 1's item t − 2 was read.
  const auto read_item = [&](int t) {
    mbar_wait(sm.item_full(t & 1), uint32_t(t / 2) & 1u);
    int item;
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(item) : "r"(sm.item(t & 1)) : "memory");
    return item;
  };
  BwdWsBlock w;
  Problem seq;
  if (wg == 0) {
    regs_release<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      const auto next = [&](int item) {  // this item if it has work, else the next that has
        while (item < items && !packed_item<T>(p, lists, item, w, seq)) item = int(gridDim.x) + atomicAdd(next_item, 1);
        return item;
      };
      int item = next(int(blockIdx.x)), n = 0;
      for (int t = 0;; ++t) {
        if (t >= 2) mbar_wait(sm.item_empty(t & 1), uint32_t(t / 2 - 1) & 1u);
        asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(sm.item(t & 1)), "r"(item) : "memory");
        mbar_arrive(sm.item_full(t & 1));  // release: the store above
        if (item >= items) break;
        const BwdWsBlock cur = w;
        // The next item now: the atomic's latency behind this item's loads.
        item = next(int(gridDim.x) + atomicAdd(next_item, 1));
        // K_j, V_j of item t once the consumers have read item t − 1's for the last time: after its
        // first kStages steps' Q_i, dO_i (their stages free before kv_empty); the first item's first.
        const int steps = block_steps<T>(cur), kv_at = t == 0 ? 0 : min(T::kStages, steps);
        const auto kv = [&] {
          if (t > 0) mbar_wait(sm.kv_empty(), uint32_t(t - 1) & 1u);
          load_kv<T>(sm, cur, map_k, map_v);
        };
        n = produce_steps<T>(sm, cur, map_q, map_do, n, [&](int k) {
          if (k == kv_at) kv();
        });
        if (kv_at == steps) kv();
      }
    } else if (threadIdx.x / 32 == 1) {
      const int lane = threadIdx.x % 32;
      for (int t = 0, n = 0;; ++t) {
        const int item = read_item(t);
        mbar_arrive(sm.item_empty(t & 1));  // each reader releases its own read of the slot
        if (item >= items) break;
        packed_item<T>(p, lists, item, w, seq);
        n = produce_stats<T>(sm, w, seq, LSE, D, lane, n);
      }
    }
    return;  // every load is consumed before the consumers exit
  }
  regs_claim<T::kConsumerRegs>();
  for (int t = 0, n = 0;; ++t) {
    const int item = read_item(t);
    mbar_arrive(sm.item_empty(t & 1));
    if (item >= items) break;
    packed_item<T>(p, lists, item, w, seq);
    n = consume_tile<T>(seq, sm, w, dQaccum, nullptr, dK, dV, wg - 1, n, uint32_t(t) & 1u);
  }
  if (threadIdx.x % 128 == 0) bulk_wait_group<0>();  // no bulk reduction may still read SRAM when the block exits
}

/// Packed sequences (T::kPacked). Persistent: a grid of min(items, SMs) blocks, bwd_ws_packed_body.
/// Otherwise one block per key tile: grid (⌊total_k / BLOCK_N⌋ + B, H_kv, 1) non-causal, (H_kv,
/// ⌊total_k / BLOCK_N⌋ + B, 1) causal; a tile past its sequence's last key exits at once.
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    bwd_ws_packed_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                         const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
                         Problem p, const float* __restrict__ LSE, const float* __restrict__ D,
                         float* __restrict__ dQaccum, uint16_t* __restrict__ dK, uint16_t* __restrict__ dV,
                         PackedLists lists, int* __restrict__ next_item) {
#if FLASHLAB_WGMMA_OK
  static_assert(T::kPacked && T::kGroup && !T::kDeterministic, "the grouped kernel, no fixed order");
  extern __shared__ uint8_t smem_raw[];
  const BwdWsSmem<T> sm{(uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u};
  if constexpr (T::kPersistent) {
    bwd_ws_packed_body<T>(sm, p, lists, &map_q, &map_k, &map_v, &map_do, LSE, D, dQaccum, dK, dV, next_item);
  } else {
    BwdWsBlock w;
    Problem seq;
    const int j = p.causal ? blockIdx.y : blockIdx.x, h = p.causal ? blockIdx.x : blockIdx.y;
    if (!packed_block<T>(p, lists, j, h, w, seq)) return;
    bwd_ws_body<T>(sm, w, seq, &map_q, &map_k, &map_v, &map_do, LSE, D, dQaccum, nullptr, dK, dV);
  }
#else
  __trap();  // built without sm_90a: never launched
#endif
}

/// Where float4 number `k` of an accumulator tile lies in the tile's BLOCK_M × d rows: slice c of
/// kDqRows·kDqCols (columns 64c .. or rows 64c .. by the split), float4 number (m·kDqCols/8 + t)·128
/// + thread = rows r, r + 8, columns col, col + 1 of n-tile t of row block m (the order reduce_dq adds in).
template <class T>
__device__ __forceinline__ void dq_fragment_position(int k, int& row, int& col) {
  constexpr int kSlice4 = T::kSliceDq / 16, kNTiles = T::kDqCols / 8;  // n-tiles of one row block of the slice
  const int c = k / kSlice4, thr = k % 128, m = k % kSlice4 / 128 / kNTiles, t = k % kSlice4 / 128 % kNTiles;
  const int block = T::kDqSplit == DqSplit::rows ? c : m, col0 = T::kDqSplit == DqSplit::columns ? c * T::kDqCols : 0;
  row = 64 * block + 16 * (thr / 32) + (thr % 32) / 4;
  col = col0 + 8 * t + 2 * (thr % 4);
}

/// The accumulator's order for the shared convert (attention_bwd_tc.cuh, launch_dq_convert).
template <class T>
struct WsDqLayout {
  static constexpr int BLOCK_M = T::BLOCK_M;
  static constexpr int kHeadDim = T::kHeadDim;
  __device__ static void place(int k, int& row, int& col) { dq_fragment_position<T>(k, row, col); }
};

/// The K/V heads per chunk C of the causal grid (a divisor of H_kv). Why chunks: the blocks resident
/// at once then belong to the chunk's heads, not to every head, so more of them walk the same query
/// head's Q_i, dO_i and dQ accumulator tiles and find them in L2 (all H heads at once: SMs/H blocks
/// per head, each tile fetched from HBM again by the next wave). C is the larger of
///   - the most K/V heads whose G = H/H_kv query heads each hold Q, dO (16-bit) and the fp32 dQ
///     accumulator (N·d·8 bytes a head) in two thirds of L2: a grouped block walks its G heads one
///     after the other, so its chunk's blocks spread over all G·C of them;
///   - the fewest whose key blocks make nearly a wave (C·Tc ≥ 7/8 of the SMs): each chunk runs its
///     heaviest key tiles first, and its work per SM is then about half its heaviest block's or more,
///     so the next chunk's heavy blocks start beside its light ones and the grid ends on light ones.
/// Then larger still while the grid's z, H_kv/C · B, would pass its limit of 65,535.
int bwd_ws_causal_chunk(const Problem& p, int tc) {
  int dev = 0, sms = 0, l2 = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const int hkv = p.heads_kv;
  const double head_bytes = double(p.heads / hkv) * p.seq * p.head_dim * 8.0;  // a K/V head's query heads
  int fit = 1, wave = hkv;
  for (int c = 1; c <= hkv; ++c) {
    if (hkv % c != 0) continue;
    if (c * head_bytes <= 2.0 / 3.0 * l2) fit = c;
    if (8 * c * tc >= 7 * sms && c < wave) wave = c;
  }
  int c = std::max(fit, wave);
  while (c < hkv && (hkv % c != 0 || std::int64_t(hkv / c) * p.batch > 65535)) ++c;
  return c;
}

template <int D, bool kBf16, bool kCausal, bool kDeterministic, bool kWindow = false, bool kGroup = false,
          bool kAddF32 = false>
void launch_bwd_ws_one(const Problem& p, const BwdPointers& a, int* dq_order, cudaStream_t stream) {
  using Base = BwdWsTraits<D, kBf16, kCausal, kDeterministic>;
  using T0 = std::conditional_t<kGroup, BwdWsGroup<Base, kWindow>, std::conditional_t<kWindow, BwdWsWindow<Base>, Base>>;
  using T = std::conditional_t<kAddF32, BwdWsAddF32<T0>, T0>;
  auto kernel = &bwd_ws_kernel<T>;
  // > 48 KiB of dynamic SRAM: opted in per device (the record is kept, thread-safe: common.hpp).
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmemBytes, "bwd_ws_kernel", p);
  const int Tr = (p.seq + T::BLOCK_M - 1) / T::BLOCK_M;
  const std::size_t acc_numel = std::size_t(p.batch) * p.heads * std::size_t(Tr) * T::BLOCK_M * D;
  if (kDeterministic)  // every tile's order starts at turn 0
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(dq_order, 0, acc_numel / (T::BLOCK_M * D) * sizeof(int), stream));
  launch_fast_bwd_preprocess<D, kBf16>(p, a, stream, a.dQaccum, acc_numel);  // and the accumulator's zeros

  const CUtensorMap map_q = make_head_tile_map(a.Q, p, T::BLOCK_M);
  const CUtensorMap map_do = make_head_tile_map(a.dO, p, T::BLOCK_M);
  // K, V (and dK, dV) are [B, N_k, H_kv, d]; one block per key tile of each K/V head.
  const CUtensorMap map_k = make_kv_tile_map(a.K, p, T::BLOCK_N);
  const CUtensorMap map_v = make_kv_tile_map(a.V, p, T::BLOCK_N);
  const unsigned tc = unsigned((p.seq_k + T::BLOCK_N - 1) / T::BLOCK_N);
  // Causal: (C, Tc, H_kv/C · B), chunks of C K/V heads, each with the heaviest key tiles (small j)
  // first; grouped, causal is in the band and p.causal picks the same order.
  const bool chunked = kCausal || (kGroup && kWindow && p.causal);  // as bwd_ws_kernel decodes it
  const int chunk = chunked ? bwd_ws_causal_chunk(p, int(tc)) : 1;
  const dim3 grid = chunked ? dim3(chunk, tc, unsigned(p.heads_kv / chunk * p.batch)) : dim3(tc, p.heads_kv, p.batch);
  announce("bwd_ws_kernel");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(map_q, map_k, map_v, map_do, p, a.LSE, a.D, a.dQaccum, dq_order,
                                                      static_cast<uint16_t*>(a.dK), static_cast<uint16_t*>(a.dV));
  FLASHLAB_CUDA_CHECK_LAUNCH("bwd_ws_kernel");

  launch_dq_convert<WsDqLayout<Base>, kBf16>(p, a, stream);
}

template <int D, bool kBf16>
void launch_bwd_ws_d(const Problem& p, const BwdPointers& a, int* dq_order, cudaStream_t stream) {
  if (a.add_f32) {  // the ring's sums: the grouped kernels (any H_kv), or the fixed order (H_kv = H); no window
    if (p.windowed())
      throw_cuda_error(cudaErrorInvalidValue, "wgmma-ws backward, fp32 sums: no window", __FILE__, __LINE__);
    const bool grouped = p.heads_kv != p.heads || p.seq_k != p.seq;
    if (dq_order != nullptr && !grouped) {
      if (p.causal) launch_bwd_ws_one<D, kBf16, true, true, false, false, true>(p, a, dq_order, stream);
      else launch_bwd_ws_one<D, kBf16, false, true, false, false, true>(p, a, dq_order, stream);
    } else if (p.causal) {
      launch_bwd_ws_one<D, kBf16, true, false, false, true, true>(p, a, nullptr, stream);
    } else {
      launch_bwd_ws_one<D, kBf16, false, false, false, true, true>(p, a, nullptr, stream);
    }
  } else if (p.heads_kv != p.heads || p.seq_k != p.seq) {  // grouped K/V or N_k ≠ N; no fixed order
    if (p.windowed()) launch_bwd_ws_one<D, kBf16, false, false, true, true>(p, a, nullptr, stream);
    else if (p.causal) launch_bwd_ws_one<D, kBf16, true, false, false, true>(p, a, nullptr, stream);
    else launch_bwd_ws_one<D, kBf16, false, false, false, true>(p, a, nullptr, stream);
  } else if (p.windowed()) {  // causal folded into window_right (make_problem); the front door refuses a fixed order
    launch_bwd_ws_one<D, kBf16, false, false, true>(p, a, nullptr, stream);
  } else if (dq_order != nullptr) {
    if (p.causal) launch_bwd_ws_one<D, kBf16, true, true>(p, a, dq_order, stream);
    else launch_bwd_ws_one<D, kBf16, false, true>(p, a, dq_order, stream);
  } else {
    if (p.causal) launch_bwd_ws_one<D, kBf16, true, false>(p, a, nullptr, stream);
    else launch_bwd_ws_one<D, kBf16, false, false>(p, a, nullptr, stream);
  }
}

/// The packed-sequence kernel (BwdWsPacked): D over the total_q rows as one sequence, the packed
/// main kernel, the packed convert. kCausal without kWindow: the causal traits (the diagonal of
/// each sequence); kWindow: the band (causal folded into it).
template <int D, bool kBf16, bool kCausal, bool kWindow>
void launch_bwd_ws_packed_one(const Problem& p, const BwdPointers& a, const PackedLists& lists, int* next_item,
                              cudaStream_t stream) {
  using Base = BwdWsTraits<D, kBf16, false, false>;  // the accumulator's layout (any mask)
  // Persistent blocks where they measured faster (docs/optimisation.md, the backward on TMA): d = 64, and causal
  // at d = 128; at d = 128 without a mask they ran 2.6–2.9 % slower; the band is not measured.
  constexpr bool kPersistent = !kWindow && (D == 64 || kCausal);
  using T = BwdWsPacked<BwdWsTraits<D, kBf16, kCausal && !kWindow, false>, kWindow, kPersistent>;
  auto kernel = &bwd_ws_packed_kernel<T>;
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmemBytes, "bwd_ws_packed_kernel", p);
  // Tq whole tiles per head in the packed query numbering (the workspace holds
  // H·(total_q + B·kAtomicDqTileRows)·d floats, at least this for either BLOCK_M).
  const std::size_t acc_numel = std::size_t(p.heads) * std::size_t(p.packed_tiles(T::BLOCK_M)) * T::BLOCK_M * D;
  // D_i = rowsum(dO_i ∘ O_i) does not depend on the sequences: the packed rows as one sequence of
  // total_q rows (D [1, H, total_q] as LSE). The same launch zeroes the accumulator.
  Problem rows = p;
  rows.batch = 1;
  rows.seq = p.total_q;
  launch_fast_bwd_preprocess<D, kBf16>(rows, a, stream, a.dQaccum, acc_numel);
  // The maps of a packed problem span the packed tensors, [1, total_q, H, d] and [1, total_k, H_kv, d].
  const CUtensorMap map_q = make_head_tile_map(a.Q, p, T::BLOCK_M);
  const CUtensorMap map_do = make_head_tile_map(a.dO, p, T::BLOCK_M);
  const CUtensorMap map_k = make_kv_tile_map(a.K, p, T::BLOCK_N);
  const CUtensorMap map_v = make_kv_tile_map(a.V, p, T::BLOCK_N);
  // Persistent: one block per SM (T::kSmemBytes), each running work items until none is left.
  // Otherwise one per item; causal, the heaviest key tiles of each sequence first, as the dense grids.
  const unsigned tiles = unsigned(p.total_k / T::BLOCK_N + p.batch);
  dim3 grid = p.causal ? dim3(p.heads_kv, tiles, 1) : dim3(tiles, p.heads_kv, 1);
  if (kPersistent) {
    int dev = 0, sms = 0;
    FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
    FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    grid = dim3(unsigned(std::min<std::int64_t>(std::int64_t(tiles) * p.heads_kv, sms)));
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(next_item, 0, sizeof(int), stream));
  }
  announce("bwd_ws_packed_kernel");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(
      map_q, map_k, map_v, map_do, p, a.LSE, a.D, a.dQaccum, static_cast<uint16_t*>(a.dK),
      static_cast<uint16_t*>(a.dV), lists, next_item);
  FLASHLAB_CUDA_CHECK_LAUNCH("bwd_ws_packed_kernel");

  launch_dq_convert<WsDqLayout<Base>, kBf16>(p, a, stream, &lists);
}

template <int D, bool kBf16>
void launch_bwd_ws_packed(const Problem& p, const BwdPointers& a, const PackedLists& lists, int* next_item,
                          cudaStream_t stream) {
  if (a.add_f32)  // the fp32 sums are the context-parallel ring's, which takes dense batches
    throw_cuda_error(cudaErrorInvalidValue, "wgmma-ws backward, fp32 sums: no packed sequences", __FILE__, __LINE__);
  // causal folded into window_right (make_problem): windowed() is a window beyond the diagonal.
  if (p.windowed()) launch_bwd_ws_packed_one<D, kBf16, false, true>(p, a, lists, next_item, stream);
  else if (p.causal) launch_bwd_ws_packed_one<D, kBf16, true, false>(p, a, lists, next_item, stream);
  else launch_bwd_ws_packed_one<D, kBf16, false, false>(p, a, lists, next_item, stream);
}

}  // namespace

void launch_fast_bwd_ws_packed(const Problem& p, bool bf16, const BwdPointers& a, const PackedLists& lists,
                               int* next_item, cudaStream_t stream) {
  if (p.head_dim == 64) {
    if (bf16) launch_bwd_ws_packed<64, true>(p, a, lists, next_item, stream);
    else launch_bwd_ws_packed<64, false>(p, a, lists, next_item, stream);
  } else {
    if (bf16) launch_bwd_ws_packed<128, true>(p, a, lists, next_item, stream);
    else launch_bwd_ws_packed<128, false>(p, a, lists, next_item, stream);
  }
}

void launch_fast_bwd_ws(const Problem& p, bool bf16, const BwdPointers& a, int* dq_order, cudaStream_t stream) {
  if (p.head_dim == 64) {
    if (bf16) launch_bwd_ws_d<64, true>(p, a, dq_order, stream);
    else launch_bwd_ws_d<64, false>(p, a, dq_order, stream);
  } else {
    if (bf16) launch_bwd_ws_d<128, true>(p, a, dq_order, stream);
    else launch_bwd_ws_d<128, false>(p, a, dq_order, stream);
  }
}

}  // namespace flashlab::cuda::detail
