// attention_fwd_ws.cu — FlashAttention forward on Hopper with TMA loads and warp specialisation
// (FlashAttention-3's structure). Selected with FastForwardConfig::kernel = FastForwardKernel::tma_ws
// (fast_attention.hpp) or `flashlab bench attention --fwd-kernel tma-ws`; built for sm_90a alone
// (cuda/CMakeLists.txt, object library flashlab_cuda_wgmma) when the architectures include 90.
//
// The algorithm, names and numerics are those of attention_fwd_wgmma.cu (FA2 loop order, query
// tiles Q_i of Br = BLOCK_M rows, key tiles K_j, V_j of Bc = BLOCK_N (128, or 192), online softmax in base
// 2, deferred 1/l_i, LSE_i = m_i + log2(l_i); one step's pieces are shared: wgmma_fwd_step.cuh);
// what changes is who moves the data, how the warpgroups of a block share the tensor cores, and
// how blocks find their work:
//   - One block per SM, each walking a list of (query tile, head) units (WsSchedule): while the
//     consumers finish one unit's last P·V and store its O_i, the producer already loads the next
//     Q_i and K_j, V_j (the stage ring and the mbarrier phases run on across units). Causal: the
//     units with the most key tiles come first, dealt out in a snake so the blocks even out.
//   - A block has 1 + kConsumers warpgroups. Warpgroup 0 is the PRODUCER: it gives back most of its
//     registers (setmaxnreg.dec to 24) and one thread issues every load as a TMA box
//     (cp.async.bulk.tensor, hopper.cuh): Q_i once per unit, then K_j and V_j into a ring of
//     kStages = 3 stages. The other warpgroups are the CONSUMERS, 64 query rows each (two: Br = 128,
//     setmaxnreg.inc to 240; three: Br = 192, 160), and never touch global memory until they
//     store O_i.
//   - Hand-off by mbarriers, one per event: q_full, q_empty (every S_ij of the unit finished, so
//     the next Q_i may land; kQParts, d = 64 without a mask: one pair per consumer warpgroup's 64
//     rows, each part freed after that warpgroup's last S_ij); k_full[s] and v_full[s] (the TMA
//     credits the bytes, so S_ij can start as soon as K_j landed while V_j is still in flight); empty[s]
//     (one arrival per consumer warp once its P_ij·V_j finished reading the stage; the producer
//     waits on it before it overwrites). Without a causal mask, and at d = 256 with every mask
//     (kSplitEmpty), K_j and V_j are released apart: empty[s] once S_ij is done, v_empty[s] once
//     P_ij·V_j is, and the producer loads K_j before V_(j−1), so the keys of a stage are refilled a
//     turn earlier. Waiters name the phase by its parity: (it / kStages) & 1 for the it-th key
//     tile of the block's whole list.
//   - TMA writes the 128-byte-swizzled layout the wgmma descriptors read (one box = 64 columns ×
//     rows; a [rows][d] tile is d/64 boxes, each a 1024-byte-aligned block of rows·128 bytes).
//     Rows past N arrive as zeros (no stale SRAM reaches P·V: the NaN hazard).
//   - Ping-pong: the consumer warpgroups take turns at ISSUING their GEMMs, in a ring enforced by
//     named barriers (bar.sync on one's own, bar.arrive on the next one's). A turn issues S_ij =
//     Q_i K_jᵀ and O_i += P_i(j−1) V_(j−1) back to back; while the tensor cores run them the other
//     warpgroups do their softmax. So the softmax (exp2 on the SFU) of one warpgroup hides behind
//     the GEMMs of the others, rather than all warpgroups doing softmax at the same time.
//   - Intra-warpgroup overlap (kOverlap; d = 64 and 256, and d = 128 without a causal mask): the softmax
//     of S_ij starts once S_ij is done, while the P_i(j−1)·V_(j−1) of the same turn still runs.
//   - Which configuration runs (a WsConfig, chosen by choose_ws_config in fwd_ws_config.hpp, where
//     each rule's measurement is stated): d = 128, Br = 128 and, without a causal mask,
//     Bc = 192 in two stages where the last key tile pads N by ≤ 1 % (else Bc = 128, three
//     stages); d = 64, Br = 192 (three consumers) when the work list gives every SM ≥ 2.5 rounds
//     of units (causal: 5), else 128; d = 256, Br = 128 and Bc = 80 in two stages (O_i alone is
//     128 of a consumer's 240 registers; two stages of 80 keys are what fits beside Q_i), K_j and
//     V_j released apart with every mask.
//     At d = 64 a tile's GEMMs take as long as its exponentials, so one other warpgroup's GEMMs
//     cannot hide a softmax; two can.
//   - Two sets of P registers (kTwoP; d = 64, and d = 128 with Bc = 192): the loop runs two key
//     tiles per pass, the softmax of one packing P into the set the P·V of the other does not read.
//     With one set ptxas put the wait for that P·V before the exponentials (they reuse its
//     registers), which took most of kOverlap's gain away.
//   - The split tail (kSplitTail; d = 64 with three consumers, non-causal): equal units leave the
//     last round of the list part-empty (N = 8192, H = 16: 688 units on 132 SMs, 5.21 rounds run
//     as 6). Where ws_split_tail says, the units past the last whole round are cut along the keys
//     so that every block gets an equal share of their key tiles; each piece stores its
//     unnormalised O, m_i and l_i in a partial slot, and ws_combine_kernel merges them.
//   - Short reduction chains (kShortChains; non-causal): the row maximum of S_ij as a tree, the row
//     sum of P_ij in two chains, so the exponentials wait fewer dependent steps.
//   - The row maximum's vote (kVoteMax; d = 128, non-causal): the warp first votes whether any row
//     maximum moves; when none does (the common case once a row has met its largest scores) the
//     exponentials wait for no shuffle, no new maximum and no alpha. Same results as without.
//   - O_i stored by TMA (kTmaStoreO; dense, non-causal, 16-bit O, d = 64 and 128): each consumer
//     warpgroup writes its O_i into SRAM (128-byte swizzle) and one thread stores the boxes with
//     cp.async.bulk.tensor; stored from registers it took as long as a key tile, every block at
//     once. At d = 128 the SRAM is full: O_i goes into the stage of the unit's last key tile, with
//     three stages into its K_j once every consumer's last S_ij has read it (so no warpgroup waits
//     for another's last P·V), with two into its V_j once every last P·V has; the stage returns to
//     the producer when the store has read it, checked after the next unit's first S_ij is issued.
//   - Lazy rescale (as the mma.sync forward): O_i = diag(alpha) O_i only when some row of the warp
//     saw its maximum move (a warp vote; alpha = 1 exactly otherwise).
//   - Masks only on tiles that need them (the last, ragged key tile; causal: the tile on a
//     warpgroup's diagonal and, with Br = 192, the one after it); causal units stop at the
//     diagonal of their last row. A fully masked row gives O = 0 and LSE = −inf, never NaN.
//   - Grouped K/V and N_k ≠ N: K and V are [B, N_k, H_kv, d], read through their own tensor maps
//     (make_kv_tile_map), query head h loading K/V head h / (H / H_kv); the units of one K/V head's
//     query heads sit close together in the work list (ws_unit: they share its tiles in L2). A unit has
//     ⌈N_k / Bc⌉ key tiles; causal, the diagonal is bottom-right aligned (query i sees keys
//     ≤ i + N_k − N), units stop at their last row's diagonal, and a unit above the diagonal's start
//     (N > N_k) loads nothing: its rows store O = 0, LSE = −inf.
//   - Sliding windows (WsConfig::window, the causal instantiation's structure): query i sees keys
//     i + lo ≤ j ≤ i + hi (Problem::window_lo, window_hi: the reference's band with N_k − N folded
//     in). A unit's key tiles run from the tile of its first row's left edge to the tile of its
//     last row's right edge (WsSchedule: j0, n_tiles), so the tiles outside the band on either
//     side are never loaded; tiles the band crosses are masked on both edges. Units without keys
//     (every row's right edge before key 0) are the top query tiles: last in the list, as causal.
//   - Packed sequences (WsConfig::packed; FlashAttention's varlen layout: Q and O [1, total_q, H,
//     d], K and V [1, total_k, H_kv, d], LSE [1, H, total_q], the prefix sums in device memory):
//     the work list is the packed numbering's (sequence, head, query tile) units (packed.cuh), each
//     with its sequence's lengths, offset len_k − len_q, window band and first rows; no unit of
//     padding (at most one empty unit per sequence), no host copy of the lengths. The TMA maps
//     span the packed tensors: a box running past a sequence's end brings in the next sequence's
//     first rows, whose keys the masks drop (keys ≥ len_k: S_ij = −inf, P_ij = 0) and whose
//     queries are never stored. Units without keys may sit anywhere in the list, so the consumers
//     look ahead for the next unit with keys before they owe a turn. The compacted list
//     (WsConfig::compact; d = 64 without a mask, three consumers, B ≤ 16: ws_compact_packed)
//     numbers only the tiles each sequence needs, the sequences with the most keys first, and puts
//     the spare places of the numbering at the list's end, where they cost no block a round
//     (WsSchedule::compact_unit).
// Resources (ptxas, sm_90a): two consumers, 168 registers at launch (384 threads, 1 block/SM),
// then 24 for the producer and 240 for the consumers; three consumers, 128 at launch (512
// threads), then 24 and 160; no spills but 16 bytes in the Bc = 192 kernel and 24 in the split
// tail's; d = 128: 230,520 B of dynamic SRAM (Q_i 32 KiB + 3 stages × (K_j + V_j) 192 KiB +
// barriers + the split tail's 32 B + alignment slack; the limit is 232,448; 230,552 with K and V
// released apart and O_i in K_last's stage; Bc = 192: 2 stages × 96 KiB, 230,512), d = 64:
// 115,832 B (Br = 128) or 124,048 B (Br = 192, released apart), each + 8 KiB per consumer for
// O_i without a mask (and 16 B per consumer after the first for Q_i's parts);
// d = 256: 230,512 B (Q_i 64 KiB + 2 stages × (K_j + V_j) 160 KiB + barriers), no spills.
// Why each of these is here, what it was measured against and the profiles that decided it:
// docs/optimisation.md, the TMA forward; its runs: cuda/RESULTS.md and cuda/results/fwd_tma_ws.csv.
#include "core/common.hpp"
#include "core/hopper.cuh"
#include "attention/launchers.hpp"
#include "attention/partial_pool.hpp"
#include "core/tensor_core.cuh"
#include "attention/fwd_ws_config.hpp"
#include "attention/wgmma_fwd_step.cuh"
#include "attention/packed.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace flashlab::cuda::detail {

namespace {

/// The tile and pipeline of one instantiation, from its named configuration C (fwd_ws_config.hpp):
/// C.consumers consumer warpgroups of 64 query rows (Br = 64·C.consumers), Bc = C.block_n,
/// C.stages K/V stages; kOverlap: the softmax of S_ij starts as soon as S_ij is done, while the P·V
/// issued with it is still running (FlashAttention-3's intra-warpgroup overlap); kShortChains: the
/// softmax's row maximum as a tree and its row sum in two chains (wgmma_fwd_step.cuh,
/// online_softmax); kSplitEmpty: K_j and V_j of a stage released apart (below); kTwoP: two sets of
/// P registers; kSplitTail: the list's tail cut along the keys. Which one runs: choose_ws_config().
template <WsConfig C>
struct WsTraits {
  static constexpr int kHeadDim = C.head_dim;
  static constexpr bool kBf16 = C.bf16;
  static constexpr bool kCausal = C.causal;
  // A window: the causal instantiation whose units start at the band's left edge and whose masks
  // also cut keys left of it (Problem::window_lo; window_hi replaces the diagonal).
  static constexpr bool kWindow = C.window;
  static_assert(!kWindow || kCausal, "the window runs on the causal structure (units of unequal length)");
  // Packed sequences: the work list of the packed numbering, each unit its sequence's lengths
  // (WsSchedule::packed_unit); instantiations of their own, so the dense ones compile as they did.
  static constexpr bool kPacked = C.packed;
  // Packed, non-causal: the compacted list (WsSchedule::compact_unit), the spare places at its end.
  static constexpr bool kCompact = C.compact;
  static_assert(!kCompact || (kPacked && !kCausal), "the compacted list: packed sequences without a mask");
  static constexpr int kConsumers = C.consumers;            // consumer warpgroups, 64 query rows each
  static constexpr int kThreads = 128 * (1 + kConsumers);   // + the producer warpgroup
  static constexpr int kConsumerWarps = 4 * kConsumers;     // arrivals on empty[s]
  static constexpr int BLOCK_M = 64 * kConsumers;           // Br
  static constexpr int BLOCK_N = C.block_n;                 // Bc (n of the S wgmma)
  static_assert(BLOCK_M == C.block_m(), "the configuration reports the tiles that run");
  // K_j/V_j ring: with two stages a stage frees only after both consumers' P·V on it, so the next
  // load starts late; three hide it. At d = 128 they fill the SRAM (Q_i 32 KiB + 3 × 64 KiB).
  static constexpr int kStages = C.stages;
  static constexpr bool kOverlap = C.overlap;
  static constexpr bool kShortChains = C.short_chains;
  // K_j and V_j released apart: k_empty[s] once S_ij is done, v_empty[s] once P_ij·V_j is; the
  // producer loads K_j ahead of V_(j−1), so a stage of keys is refilled a turn earlier.
  static constexpr bool kSplitEmpty = C.split_empty;
  // The warp votes before it reduces the row maxima (wgmma_fwd_step.cuh, online_softmax_vote).
  static constexpr bool kVoteMax = C.vote_max;
  // P_ij's A fragments in two register sets, alternating by key tile (the loop unrolled by two):
  // the softmax of tile j packs into one while the P·V of tile j − 1 may still read the other, so
  // ptxas need not wait for that P·V before the exponentials (with one set it did: the packing of P
  // writes the registers that P·V still reads).
  static constexpr bool kTwoP = C.two_p;
  // Non-causal: the units past the last whole round cut along the keys (WsSchedule), partial
  // results combined by a second kernel (ws_combine_kernel).
  static constexpr bool kSplitTail = C.split_tail;
  static_assert(!(kSplitTail && kCausal), "the split tail is for equal (non-causal) units");
  static_assert(!(kSplitTail && kPacked), "the split tail is for equal units: packed units differ");
  // O stored in fp32, unrounded (wgmma_fwd_step.cuh, store_o_lse_at): the ring's partials. Not
  // with the split tail, whose combine kernel stores 16 bits.
  static constexpr bool kOutF32 = C.out_f32;
  static_assert(!(kOutF32 && (kSplitTail || kPacked || kWindow)), "fp32 O: dense problems without a window");
  static constexpr int kColBlocks = kHeadDim / 64;         // TMA boxes (64 columns) per tile
  // setmaxnreg: the producer keeps 24, the consumers share the rest of the 64 Ki registers.
  static constexpr int kProducerRegs = 24, kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536, "register file");
  static constexpr int kTileQBytes = BLOCK_M * kHeadDim * 2;
  static constexpr int kTileKVBytes = BLOCK_N * kHeadDim * 2;
  // O_i leaves through SRAM by TMA stores (store_unit_tma): dense units without a mask, 16-bit O,
  // d = 64, and d = 128 with K/V released apart. Stored from registers, a warpgroup's O_i took as
  // long as a key tile, every block at once, while the tensor cores idled. At d = 128 the SRAM is
  // full, so O_i goes into the V_j stage of the unit's last key tile, held from the producer until
  // the store has read it (release_o_stage); at d = 64, a buffer of its own.
  static constexpr bool kTmaStoreO =
      !kCausal && !kPacked && !kOutF32 && (kHeadDim == 64 || (kHeadDim == 128 && kSplitEmpty));
  static constexpr bool kOInStage = kTmaStoreO && kHeadDim == 128;
  // kOInStage with three stages: O_i goes into K_last's stage, not V_last's, so a warpgroup that
  // finished its last P·V waits only for the other warpgroups' last S_ij (issued a turn earlier),
  // not for their last P·V: the first warpgroup's O_i leaves (and its next S_0 is issued) while the
  // other's last P·V still runs. The stage held is then the next unit's third K_j rather than its
  // third V_j (a turn earlier); with two stages it would be its second K_j, needed at once.
  static constexpr bool kOInK = kOInStage && kStages == 3;
  // Q_i in parts of one consumer warpgroup's 64 rows, each with its own q_full and q_empty: a
  // warpgroup gives its part back once its last S_ij is done, so the next unit's part loads while
  // the unit's last softmax and P·V run, and the next unit's K_0 goes out before it. Where O_i
  // leaves by TMA at d = 64: +1.5–2 % at N ≤ 2048. At d = 128 the boundary waits on storing O_i,
  // not on Q_i: +0.1–0.9 % there, −0.6 % at N = 8192, so not there.
  static constexpr bool kQParts = kTmaStoreO && kHeadDim == 64;
  static constexpr int kTileOBytes = 64 * kHeadDim * 2;  // one consumer warpgroup's rows of O_i
  static_assert(!kOInStage || kTileKVBytes >= kConsumers * kTileOBytes, "every consumer's O_i fits one V_j stage");
  static_assert(!(kOInStage && kSplitTail), "a split tail's piece stores no O_i: V_last's stage would not return");
  static constexpr int kOBufOffset = kTileQBytes + 2 * kStages * kTileKVBytes;  // after the tiles
  static constexpr int kBarrierOffset = kOBufOffset + (kTmaStoreO && !kOInStage ? kConsumers * kTileOBytes : 0);
  // q_full, q_empty, k_full[], v_full[], empty[] (k_empty[] when split), v_empty[] when split,
  // then (kQParts) q_full and q_empty of consumer warpgroups 1 … kConsumers − 1
  static constexpr int kQPartBarrier = 2 + (kSplitEmpty ? 4 : 3) * kStages;
  static constexpr int kKLastBarrier = kQPartBarrier + (kQParts ? 2 * (kConsumers - 1) : 0);
  static constexpr int kBarriers = kKLastBarrier + (kOInK ? 1 : 0);  // + kOInK's k_last_read
  // +1024: the dynamic SRAM base is rounded up to the 1024-byte swizzle period.
  static constexpr int kPieceOffset = kBarrierOffset + 8 * kBarriers;  // the split tail's two pieces (int4 each)
  static constexpr int kOrderOffset = kPieceOffset + 32;  // kCompact: the sequences' order, a byte each (≤ 16)
  static constexpr int kSmemBytes = kOrderOffset + (kCompact ? 16 : 0) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "dynamic SRAM of one block on sm_90");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "d ∈ {64, 128, 256}");
  static_assert(kConsumers == 2 || kConsumers == 3, "2 or 3 consumer warpgroups");
  // Causal with Br > Bc: a warpgroup may meet key tiles masked for all its rows (the block runs
  // to its last row's tile); P = 0 there. With N_k = N key 0 gave every row a finite m_i in tile
  // 0; with N > N_k a row may have seen no key yet, and the softmax's m_i = −inf guard keeps its
  // P = 0 (online_softmax: it subtracts 0 rather than −inf).
  static_assert(!kCausal || BLOCK_M >= BLOCK_N, "causal: every row of a unit sees its first key tile");
  static_assert(BLOCK_N % 16 == 0 && BLOCK_N <= 256, "Bc: whole k16 steps of P·V, one TMA box of rows");
};

// Named barriers 1 .. kConsumers (0 is __syncthreads): consumer warpgroup c waits on kTurnBarrier + c.
constexpr int kTurnBarrier = 1;

/// SRAM addresses of the tiles and barriers of one block.
template <class T>
struct WsSmem {
  uint32_t base;
  __device__ uint32_t q() const { return base; }
  __device__ uint32_t k(int s) const { return base + T::kTileQBytes + uint32_t(s) * 2 * T::kTileKVBytes; }
  __device__ uint32_t v(int s) const { return k(s) + T::kTileKVBytes; }
  __device__ uint32_t bar(int i) const { return base + T::kBarrierOffset + 8u * uint32_t(i); }
  __device__ uint32_t q_full() const { return bar(0); }
  __device__ uint32_t k_full(int s) const { return bar(1 + s); }
  __device__ uint32_t v_full(int s) const { return bar(1 + T::kStages + s); }
  __device__ uint32_t empty(int s) const { return bar(1 + 2 * T::kStages + s); }  // K_j's alone when split
  __device__ uint32_t q_empty() const { return bar(1 + 3 * T::kStages); }
  __device__ uint32_t v_empty(int s) const { return bar(2 + 3 * T::kStages + s); }  // kSplitEmpty only
  /// kQParts: the q_full and q_empty of consumer warpgroup cw's part of Q_i (cw = 0: q_full(), q_empty()).
  __device__ uint32_t q_full_part(int cw) const { return cw == 0 ? bar(0) : bar(T::kQPartBarrier + 2 * (cw - 1)); }
  __device__ uint32_t q_empty_part(int cw) const {
    return cw == 0 ? bar(1 + 3 * T::kStages) : bar(T::kQPartBarrier + 2 * (cw - 1) + 1);
  }
  /// kOInK: every consumer warp's last S_ij of the unit has read K_last (one arrival per warp).
  __device__ uint32_t k_last_read() const { return bar(T::kKLastBarrier); }
  /// kTmaStoreO: where consumer warpgroup cw stages its O_i (its 64 rows, d/64 boxes of 8 KiB),
  /// in K_j's (kOInK) or V_j's stage s (kOInStage), or the buffer after the tiles.
  __device__ uint32_t o_tile(int cw, int s) const {
    return (T::kOInStage ? (T::kOInK ? k(s) : v(s)) : base + T::kOBufOffset) + uint32_t(cw) * T::kTileOBytes;
  }
};

/// One unit of work: query tile Q_i (rows q0 .. of its sequence) of head h, batch b, the K/V head
/// hk it reads, and its number of key tiles; its sequence's first query and key rows in the
/// tensors (qs, ks: 0 when dense) and its queries and keys (nq, nk: N and N_k when dense).
struct WsTile {
  int q0, h, hk, b, j0, n_tiles, piece;
  int qs, ks, nq, nk;
};

/// Query tile m, head h and batch b of unit t of a work list (WsSchedule; ws_combine_kernel
/// finds the split tail's units by it too). Causal: stripes of W query tiles from the bottom (the
/// last stripe may be narrower), in each stripe head by head, each head's W tiles from the bottom:
/// the longest units first to within W tiles, and W units of one head side by side
/// (ws_causal_stripe()); W = 1: all heads of one query tile innermost. Non-causal: the query tiles
/// of one head side by side, then the next head (W unused).
/// Grouped K/V: the G = H / H_kv query heads that read one K/V head are
/// consecutive heads (h / G), so in either order their units sit close together in the list and run
/// at the same time on neighbouring SMs (causal: the G·W units of one stripe are adjacent;
/// non-causal: the group's G·Tr units are contiguous), reading the same K_j, V_j from L2 (one HBM
/// read serves the group) rather than fetching a K/V head again once it has left L2. The order needs
/// no G, so the consumers keep no register for it (with H_kv = H the list is the one tuned for
/// multi-head attention).
template <bool kCausal>
__device__ __forceinline__ void ws_unit(int t, int Tr, int H, int HB, int W, int& m, int& h, int& b) {
  int hb;
  if (kCausal) {
    const int stripe = t / (W * HB), r = t - stripe * W * HB, w = min(W, Tr - stripe * W);
    hb = r / w;
    m = Tr - 1 - stripe * W - (r - hb * w);
  } else {
    m = t % Tr;
    hb = t / Tr;
  }
  h = hb % H;
  b = hb / H;
}

/// The work list of a launch, the same in the producer and the consumers. Tile t of the list is
/// ws_unit's: causal, the longest first; the units reading one K/V head close together.
/// Block `blk` of G takes tiles k·G + blk for even rounds k and k·G + G − 1 − blk for odd ones (a
/// snake: the blocks that got the longest tile of one round get the shortest of the next).
/// A causal unit stops at the key tile of its last row's diagonal (key q0 + Br − 1 + N_k − N);
/// above the diagonal's start (N > N_k) a unit may see no key at all: n_tiles = 0, and such units
/// come last in every block's list (n_tiles never grows along it: such lists have stripes of one
/// tile). A window's unit runs from the key tile of its first row's left edge (j0) to that of its
/// last row's right edge; its units without keys are the top query tiles, last in the list too.
///
/// Packed sequences (kPacked): the query tiles are those of the packed numbering (packed.cuh:
/// Tr = packed_tiles(Br) per head, each sequence's tiles consecutive, at most one past each
/// sequence's end), in ws_unit's orders with B = 1: causal, the tiles from the last backwards
/// (each sequence's bottom tiles first), all heads of one tile innermost, or where W > 1 the striped
/// list over all sequences (striped_unit); non-causal, the tiles of one head side by side. Every
/// unit has its sequence's own lengths and diagonal; a unit without keys (a tile past its sequence's
/// end, a sequence without keys, rows above the diagonal's start) may then sit anywhere in the list
/// (consume() looks ahead for the turns).
template <class T>
struct WsSchedule {
  int Tr, H, HB, total, Nk;  // query tiles, heads, heads × batch, Tr · HB, keys N_k
  int Hkv, offset;           // K/V heads H_kv; the causal offset N_k − N
  int full;                  // units dealt whole (= total unless the tail is split)
  const int4* pieces;        // kSplitTail: this block's pieces of the tail (tail_pieces), in SRAM
  int N, lo, hi;             // kWindow: queries N, the band's edges (Problem::window_lo, window_hi)
  const int *cu_q, *cu_k;    // kPacked: the prefix sums
  int B, wl, wr;             // kPacked: the sequences; the window's sides (each sequence its own band)
  int W;                     // causal: query tiles per stripe of the list (ws_unit; 1: heads innermost)
  int M, A;                  // kPacked, causal, W > 1: the rows of the striped list, its shift (striped_unit)
  bool keyed;                // ... and some sequence's keys are not its queries (rows aligned to the keys)
  const uint8_t* order;      // kCompact: the sequences by their keys, the most first (SRAM; compact_order)
  mutable int cur_g, cur_b, cur_base;  // striped_unit's cursor: entry (stripe g, sequence b), its first unit
  __device__ bool at(int k, WsTile& w) const {
    const int G = int(gridDim.x), blk = int(blockIdx.x);
    const int n = (Nk + T::BLOCK_N - 1) / T::BLOCK_N;
    int t = k * G + ((k & 1) ? G - 1 - blk : blk);
    w.j0 = 0;
    w.piece = -1;
    w.n_tiles = n;
    if (t >= full) {
      if constexpr (!T::kSplitTail) {
        return false;
      } else {
        const int piece = k - full / G;  // the rounds before the tail are whole
        if (full == total || piece > 1) return false;
        const int4 d = pieces[piece];  // {unit, j0, n_tiles, 1}; .w = 0: none
        if (d.w == 0) return false;
        t = d.x;
        w.j0 = d.y;
        w.n_tiles = d.z;
        w.piece = 2 * blk + piece;
      }
    }
    int m;
    if constexpr (T::kPacked) return packed_unit(t, w);
    ws_unit<T::kCausal>(t, Tr, H, HB, W, m, w.h, w.b);
    w.q0 = m * T::BLOCK_M;
    w.hk = w.h / (H / Hkv);  // read by the producer alone (dead code in the consumers)
    if constexpr (T::kWindow) {
      // Rows q0 .. min(q0 + Br, N) − 1 see keys lo(q0) .. hi(last row), clamped to the keys (the
      // rows' bands shift by one key per row: their union is one interval). None when the last
      // row's right edge is left of key 0 (q0 + lo ≤ N_k − 1 always: lo ≤ N_k − N).
      const int first = max(0, w.q0 + lo), last = min(Nk - 1, min(w.q0 + T::BLOCK_M, N) - 1 + hi);
      w.j0 = last < first ? 0 : first / T::BLOCK_N;
      w.n_tiles = last < first ? 0 : last / T::BLOCK_N - w.j0 + 1;
    } else if (T::kCausal) {
      // Keys 0 .. q0 + Br − 1 + offset: none when that is negative (floor division).
      const int last_key = w.q0 + T::BLOCK_M - 1 + offset;
      w.n_tiles = last_key < 0 ? 0 : min(w.n_tiles, last_key / T::BLOCK_N + 1);
    }
    return true;
  }
  /// kPacked: unit t (at()) of the packed list, with its sequence's rows, lengths and key tiles (the
  /// rules of at(), each sequence with its own N, N_k and offset len_k − len_q).
  __device__ bool packed_unit(int t, WsTile& w) const {
    if constexpr (T::kCompact) return compact_unit(t, w);
    if (T::kCausal && !T::kWindow && W > 1) {
      striped_unit(t, w);
    } else {
      int m;
      ws_unit<T::kCausal>(t, Tr, H, H, 1, m, w.h, w.b);
      const PackedTile pt = packed_tile(cu_q, cu_k, B, m, T::BLOCK_M);
      w.q0 = pt.row0;
      w.qs = pt.q_start;
      w.ks = pt.k_start;
      w.nq = pt.len_q;
      w.nk = pt.len_k;
    }
    w.hk = w.h / (H / Hkv);
    const int off = w.nk - w.nq;
    w.n_tiles = w.q0 < w.nq ? (w.nk + T::BLOCK_N - 1) / T::BLOCK_N : 0;  // none past the sequence's end
    if constexpr (T::kWindow) {
      const int lo_s = wl >= 0 ? off - wl : -(1 << 30), hi_s = wr >= 0 ? off + wr : (1 << 30);
      const int first = max(0, w.q0 + lo_s), last = min(w.nk - 1, min(w.q0 + T::BLOCK_M, w.nq) - 1 + hi_s);
      const bool none = last < first || w.q0 >= w.nq;
      w.j0 = none ? 0 : first / T::BLOCK_N;
      w.n_tiles = none ? 0 : last / T::BLOCK_N - w.j0 + 1;
    } else if (T::kCausal) {
      const int last_key = w.q0 + T::BLOCK_M - 1 + off;
      w.n_tiles = last_key < 0 ? 0 : min(w.n_tiles, last_key / T::BLOCK_N + 1);
    }
    return true;
  }
  /// kPacked, causal, W > 1: unit t of the striped list (ws_causal_stripe: too few units in flight
  /// read each K/V head with all heads of one tile innermost). A sequence's query tile m (rows
  /// m·Br ..) sees about r + 1 key tiles, r = m + ⌊(len_k − len_q)/Br⌋ its row aligned to the keys
  /// (bottom-right causal; r = m where the keys are the queries), so the list runs every sequence's
  /// tiles together from the highest r down, in stripes of W rows: stripe g holds aligned rows
  /// [M − (g + 1)·W, M − g·W) (rows shifted by A ≥ 0 so that none is negative; M: the highest
  /// shifted row + 1), sequence by sequence, in each its heads one by one, each head's tiles in the
  /// stripe from the bottom. So the units run longest
  /// first over all sequences (the packed numbering's order runs each sequence's from its longest to
  /// its shortest before the next sequence's: a saw the static deal cannot even out) and W units of
  /// one head side by side share its K_j, V_j in L2. Places past the last unit are units without
  /// rows or keys. The list is walked entry by entry (stripe g, sequence b: H · rows units) from
  /// where this thread's last lookup ended (cur_*): a block's units are G apart and rise with k, so
  /// each lookup crosses a few entries; from the list's start it would cross all of them, a cost
  /// that grows with the place in the list.
  /// Sequence b's aligned-and-shifted rows: its tile m is row m + first; `tiles` of them (first = 0
  /// where every sequence's keys are its queries: the key lengths are not read).
  __device__ void aligned_rows(int b, int& first, int& tiles) const {
    const int len_q = __ldg(cu_q + b + 1) - __ldg(cu_q + b);
    tiles = (len_q + T::BLOCK_M - 1) / T::BLOCK_M;
    first = keyed ? packed_row_shift(len_q, __ldg(cu_k + b + 1) - __ldg(cu_k + b), T::BLOCK_M) + A : 0;
  }
  __device__ int stripe_rows(int g, int b) const {
    int first, tiles;
    aligned_rows(b, first, tiles);
    const int hi = M - g * W;
    return max(0, min(hi, first + tiles) - max(first, hi - W));
  }
  __device__ void striped_unit(int t, WsTile& w) const {
    const int stripes = (M + W - 1) / W;
    while (t < cur_base) {  // back (a look-ahead past a unit without keys): the entries before
      if (cur_b == 0) --cur_g, cur_b = B;
      cur_base -= H * stripe_rows(cur_g, --cur_b);
    }
    for (; cur_g < stripes; cur_b == B - 1 ? (++cur_g, cur_b = 0) : ++cur_b) {
      const int units = H * stripe_rows(cur_g, cur_b);
      if (t < cur_base + units) {
        w.b = 0;  // the packed tensors are one batch entry
        int first, tiles;
        aligned_rows(cur_b, first, tiles);
        const int rows = units / H, top = rows + max(first, M - cur_g * W - W) - first;  // the stripe's top tile of b
        w.h = (t - cur_base) / rows;
        w.q0 = (top - 1 - (t - cur_base - w.h * rows)) * T::BLOCK_M;
        w.qs = __ldg(cu_q + cur_b);
        w.nq = __ldg(cu_q + cur_b + 1) - w.qs;
        w.ks = __ldg(cu_k + cur_b);
        w.nk = __ldg(cu_k + cur_b + 1) - w.ks;
        return;
      }
      cur_base += units;
    }
    w.h = w.b = w.q0 = w.nq = w.nk = w.ks = 0;
    w.qs = __ldg(cu_q + B);
  }
  /// kCompact: unit t of the compacted list (ws_compact_packed): the sequences in `order` (the
  /// most keys first: a unit's cost, so the longest units lead and the short ones even out the
  /// deal at the end, whatever order the caller packed them in), each the H·⌈len_q / Br⌉ units it
  /// needs, one head's tiles side by side (from its last) before the next head's; places past them
  /// (at most B per head, at the list's end) are spare units without rows or keys. One head's tiles
  /// together keep the units in flight on a few K/V heads, whose tiles stay in L2 for the whole run
  /// of that head (all heads of one tile together put all H of a sequence's K/V heads in flight,
  /// 32 MiB at d = 64, N = 8192, and read them from HBM again as each round returns to them).
  /// Non-causal: every unit of a sequence has all its key tiles.
  __device__ bool compact_unit(int t, WsTile& w) const {
    w.h = 0;
    w.b = 0;
    w.hk = 0;
    w.q0 = 0;
    w.qs = __ldg(cu_q + B);
    w.ks = 0;
    w.nq = 0;
    w.nk = 0;
    w.n_tiles = 0;
    for (int i = 0; i < B; ++i) {
      const int b = order[i], start = __ldg(cu_q + b), end = __ldg(cu_q + b + 1);
      const int tiles = (end - start + T::BLOCK_M - 1) / T::BLOCK_M;
      if (t < tiles * H) {
        w.h = t / tiles;
        w.hk = w.h / (H / Hkv);
        w.qs = start;
        w.nq = end - start;
        w.q0 = (tiles - 1 - (t - w.h * tiles)) * T::BLOCK_M;
        w.ks = __ldg(cu_k + b);
        w.nk = __ldg(cu_k + b + 1) - w.ks;
        w.n_tiles = (w.nk + T::BLOCK_N - 1) / T::BLOCK_N;
        return true;
      }
      t -= tiles * H;
    }
    return true;
  }
};

/// kCompact: the B ≤ 16 packed sequences by their keys, the most first (ties: the first packed
/// first), into `order` (WsSchedule::compact_unit); one thread, before the block's first barrier.
__device__ __forceinline__ void compact_order(uint8_t* order, const int* __restrict__ cu_k, int B) {
  for (int i = 0; i < B; ++i) {
    const int keys = __ldg(cu_k + i + 1) - __ldg(cu_k + i);
    int j = i;
    for (; j > 0 && __ldg(cu_k + order[j - 1] + 1) - __ldg(cu_k + order[j - 1]) < keys; --j) order[j] = order[j - 1];
    order[j] = uint8_t(i);
  }
}

/// Where block `blk` of G starts its share of the tail's F key tiles (block blk takes
/// [tail_share_begin(blk), tail_share_begin(blk + 1))): the one rule tail_pieces and
/// ws_combine_kernel both follow.
__device__ __forceinline__ unsigned tail_share_begin(int blk, unsigned F, int G) {
  return unsigned(blk) * F / unsigned(G);
}

/// The split tail's share of block `blk` of G (WsSchedule): the tail's F = (total − full) · n key
/// tiles in list order, [blk·F/G, (blk + 1)·F/G) to this block; fewer than G units make a share
/// shorter than a unit, so it meets at most two: pieces 0 and 1 = {unit, j0, n_tiles, 1}, or .w = 0.
__device__ __forceinline__ void tail_pieces(int4 (&pieces)[2], int full, int total, int n, int blk, int G) {
  const unsigned F = unsigned(total - full) * unsigned(n);
  const unsigned s = tail_share_begin(blk, F, G), e = tail_share_begin(blk + 1, F, G);
  const int u0 = int(s / unsigned(n)), j0 = int(s) - u0 * n;
  pieces[0] = make_int4(full + u0, j0, min(int(e) - u0 * n, n) - j0, s < e ? 1 : 0);
  pieces[1] = make_int4(full + u0 + 1, 0, int(e) - (u0 + 1) * n, e > unsigned((u0 + 1) * n) ? 1 : 0);
}

/// Issue the d/64 TMA boxes of one [rows][d] tile (rows from token `row0` of head h, batch b).
template <class T, int kRows>
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap* map, int row0, int h, int b, uint32_t bar) {
#pragma unroll
  for (int c = 0; c < T::kColBlocks; ++c) tma_load_4d(dst + uint32_t(c) * kRows * 128, map, 64 * c, h, row0, b, bar);
}

/// The first row of unit w's key tile j in K and V (kPacked: counted from the tensor's first row).
template <class T>
__device__ __forceinline__ int key_row(const WsTile& w, int j) {
  return (T::kPacked ? w.ks : 0) + (w.j0 + j) * T::BLOCK_N;
}

/// kSplitEmpty: load V_j (key tile `it_j` of the list) into its stage once v_empty says the
/// P·V of key tile it_j − kStages finished.
template <class T>
__device__ __forceinline__ void produce_v(const WsSmem<T>& sm, const CUtensorMap* map_v, const WsTile& w, int j,
                                          int it_j) {
  const int s = it_j % T::kStages;
  if (it_j >= T::kStages) mbar_wait(sm.v_empty(s), uint32_t(it_j / T::kStages - 1) & 1u);
  mbar_arrive_expect_tx(sm.v_full(s), T::kTileKVBytes);
  tma_tile<T, T::BLOCK_N>(sm.v(s), map_v, key_row<T>(w, j), w.hk, w.b, sm.v_full(s));
}

/// The producer (one thread): per tile of its work list Q_i (once the consumers are done with the
/// previous Q_i), then K_j, V_j (of K/V head hk) for j < n_tiles through the stage ring. `it`
/// counts the key tiles of the whole list: stage it % kStages, phase (it / kStages) & 1, the same
/// count as the consumers'; `kq` the units with keys (the phase of q_full and q_empty). A unit
/// without keys (causal, N > N_k) loads nothing: its consumers store O = 0 and LSE = −inf.
template <class T>
__device__ void produce(const WsSmem<T>& sm, const WsSchedule<T>& sched, const CUtensorMap* map_q,
                        const CUtensorMap* map_k, const CUtensorMap* map_v) {
  WsTile w;
  int it = 0, kq = 0;
  for (int k = 0; sched.at(k, w); ++k) {
    if ((T::kCausal || T::kPacked) && w.n_tiles == 0) continue;
    if constexpr (T::kQParts) {
      // Key tile j of this unit (the it-th of the list) into stage it % kStages; split: K_j with
      // V_(j−1), the order the consumers take them in.
      auto load_tile = [&](int j) {
        const int s = it % T::kStages;
        if (it >= T::kStages) mbar_wait(sm.empty(s), uint32_t(it / T::kStages - 1) & 1u);  // k_empty when split
        mbar_arrive_expect_tx(sm.k_full(s), T::kTileKVBytes);
        tma_tile<T, T::BLOCK_N>(sm.k(s), map_k, key_row<T>(w, j), w.hk, w.b, sm.k_full(s));
        if constexpr (T::kSplitEmpty) {
          if (j > 0) produce_v<T>(sm, map_v, w, j - 1, it - 1);
        } else {
          mbar_arrive_expect_tx(sm.v_full(s), T::kTileKVBytes);
          tma_tile<T, T::BLOCK_N>(sm.v(s), map_v, key_row<T>(w, j), w.hk, w.b, sm.v_full(s));
        }
        ++it;
      };
      // K_0 first (its stage held a key tile two before the last unit's end), then each
      // warpgroup's part of Q_i as soon as that warpgroup's last S_ij has read its part.
      int j = 0;
      load_tile(j++);
#pragma unroll
      for (int cw = 0; cw < T::kConsumers; ++cw) {
        if (kq > 0) mbar_wait(sm.q_empty_part(cw), uint32_t(kq - 1) & 1u);
        mbar_arrive_expect_tx(sm.q_full_part(cw), T::kTileQBytes / T::kConsumers);
#pragma unroll
        for (int c = 0; c < T::kColBlocks; ++c)
          tma_load_4d(sm.q() + uint32_t(c * T::BLOCK_M + 64 * cw) * 128, map_q, 64 * c, w.h, w.q0 + 64 * cw, w.b,
                      sm.q_full_part(cw));
      }
      ++kq;
      for (; j < w.n_tiles; ++j) load_tile(j);
      if constexpr (T::kSplitEmpty) produce_v<T>(sm, map_v, w, w.n_tiles - 1, it - 1);
      continue;
    }
    if (kq > 0) mbar_wait(sm.q_empty(), uint32_t(kq - 1) & 1u);
    ++kq;
    mbar_arrive_expect_tx(sm.q_full(), T::kTileQBytes);
    // Packed: the box may run past the sequence's last query into the next sequence's rows; those
    // rows' results are computed and never stored (each row is on its own up to the store).
    tma_tile<T, T::BLOCK_M>(sm.q(), map_q, (T::kPacked ? w.qs : 0) + w.q0, w.h, w.b, sm.q_full());
    if constexpr (T::kSplitEmpty) {
      // The order the consumers take them in: K_0, then K_j with V_(j−1), then V_last.
      for (int j = 0; j < w.n_tiles; ++j, ++it) {
        const int s = it % T::kStages;
        if (it >= T::kStages) mbar_wait(sm.empty(s), uint32_t(it / T::kStages - 1) & 1u);  // k_empty
        mbar_arrive_expect_tx(sm.k_full(s), T::kTileKVBytes);
        tma_tile<T, T::BLOCK_N>(sm.k(s), map_k, key_row<T>(w, j), w.hk, w.b, sm.k_full(s));
        if (j > 0) produce_v<T>(sm, map_v, w, j - 1, it - 1);
      }
      produce_v<T>(sm, map_v, w, w.n_tiles - 1, it - 1);
    } else {
      for (int j = 0; j < w.n_tiles; ++j, ++it) {
        const int s = it % T::kStages;
        // Stage s was last filled for key tile it − kStages: wait for that phase of empty[s].
        if (it >= T::kStages) mbar_wait(sm.empty(s), uint32_t(it / T::kStages - 1) & 1u);
        mbar_arrive_expect_tx(sm.k_full(s), T::kTileKVBytes);
        tma_tile<T, T::BLOCK_N>(sm.k(s), map_k, key_row<T>(w, j), w.hk, w.b, sm.k_full(s));
        mbar_arrive_expect_tx(sm.v_full(s), T::kTileKVBytes);
        tma_tile<T, T::BLOCK_N>(sm.v(s), map_v, key_row<T>(w, j), w.hk, w.b, sm.v_full(s));
      }
    }
  }
}

// One step's pieces (issue_qk, issue_pv, online_softmax, rescale_o, pack_p, quad_row_sum, store_o_lse_at) are
// shared with attention_fwd_wgmma.cu: wgmma_fwd_step.cuh.
using wgmma_step::issue_pv;
using wgmma_step::issue_qk;
using wgmma_step::online_softmax;
using wgmma_step::online_softmax_vote;
using wgmma_step::pack_p;
using wgmma_step::quad_row_sum;
using wgmma_step::rescale_o;
using wgmma_step::store_o_lse;
using wgmma_step::store_o_lse_at;

/// Issue O_i += P_ij V_j with this kernel's V_j layout (LBO = Bc·128 bytes between the 64-column
/// boxes of d, SBO = 1024).
template <class T>
__device__ __forceinline__ void issue_pv_ws(float (&o)[T::kHeadDim / 2], const uint32_t (&pa)[T::BLOCK_N / 16][4],
                                            uint32_t sV) {
  issue_pv<T>(o, pa, sV, T::BLOCK_N * 128, 1024);
}

/// The softmax of this traits' choice on S_ij (key tile from key0; the mask's right edge
/// row_base, with kWindow its left edge lo_base): online_softmax, or with kVoteMax the same after
/// the warp's vote.
template <class T>
__device__ __forceinline__ bool softmax_step(float (&s_acc)[T::BLOCK_N / 2], float (&m_i)[2], float (&l_i)[2],
                                             float (&alpha)[2], int key0, int N, int row_base, bool need_mask, int t4,
                                             float scale_log2, int lo_base) {
  if constexpr (T::kVoteMax)
    return online_softmax_vote<T>(s_acc, m_i, l_i, alpha, key0, N, row_base, need_mask, t4, scale_log2, lo_base);
  else
    return online_softmax<T, T::kShortChains>(s_acc, m_i, l_i, alpha, key0, N, row_base, need_mask, t4, scale_log2,
                                              lo_base);
}

/// P_ij → 16-bit A fragments `pa`, then O_i = diag(alpha) O_i if any row of the warp moved its
/// maximum (lazy rescale: otherwise alpha = 1 exactly).
template <class T>
__device__ __forceinline__ void pack_rescale(const float (&s_acc)[T::BLOCK_N / 2], uint32_t (&pa)[T::BLOCK_N / 16][4],
                                             float (&o)[T::kHeadDim / 2], const float (&alpha)[2], bool max_moved) {
  pack_p<T>(s_acc, pa);
  if (__any_sync(0xffffffffu, max_moved)) rescale_o<T::kHeadDim>(o, alpha);
}

/// Floats of one partial slot: O [Br][d] unnormalised, then (m_i, l_i) per row.
template <class T>
constexpr int kPartialFloats = T::BLOCK_M * (T::kHeadDim + 2);

/// A piece of a split unit: this thread's two rows (unit rows `row0`, row0 + 8) of O (not yet
/// divided by l_i), m_i and l_i (summed over the row's 4 threads) into partial slot `slot`.
template <class T>
__device__ __forceinline__ void store_partial(float* __restrict__ partials, int slot, const float (&o)[T::kHeadDim / 2],
                                              const float (&m_i)[2], const float (&l_i)[2], int row0, int t4) {
  constexpr int D = T::kHeadDim;
  float* part = partials + std::size_t(slot) * kPartialFloats<T>;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_row_sum(l_i[r]);
    const int row = row0 + 8 * r;
#pragma unroll
    for (int t = 0; t < D / 8; ++t)
      *reinterpret_cast<float2*>(part + row * D + 8 * t + 2 * t4) = make_float2(o[4 * t + 2 * r], o[4 * t + 2 * r + 1]);
    if (t4 == 0) *reinterpret_cast<float2*>(part + T::BLOCK_M * D + 2 * row) = make_float2(m_i[r], l);
  }
}

/// O_i and LSE_i of unit `w` (store_o_lse_at): head h of batch b, or packed, head h of the
/// sequence whose rows start at w.qs ([1, total_q, H, d]; LSE [1, H, total_q]), rows below its nq.
template <class T>
__device__ __forceinline__ void store_unit(const Problem& p, uint16_t* __restrict__ O, float* __restrict__ LSE,
                                           const float (&o)[T::kHeadDim / 2], const float (&m_i)[2],
                                           const float (&l_i)[2], const WsTile& w, int row_base, int t4) {
  if constexpr (T::kPacked)
    store_o_lse_at<T>(p, O, LSE, o, m_i, l_i, std::size_t(w.qs) * p.row_stride() + std::size_t(w.h) * T::kHeadDim,
                      std::size_t(w.h) * std::size_t(p.total_q) + std::size_t(w.qs), w.nq, row_base, t4);
  else
    store_o_lse<T>(p, O, LSE, o, m_i, l_i, w.b, w.h, row_base, t4);
}

/// This warp's P·V on stage s finished: the stage's V_j (kSplitEmpty), else its K_j and V_j, may
/// be overwritten.
template <class T>
__device__ __forceinline__ void release_after_pv(const WsSmem<T>& sm, int s) {
  mbar_arrive(T::kSplitEmpty ? sm.v_empty(s) : sm.empty(s));
}

/// kTmaStoreO: O_i of consumer warpgroup cw (divided by l_i, rounded to 16 bits) through SRAM by
/// TMA stores of its d/64 boxes of 64 rows (rows past N are not written), LSE_i from registers.
/// The boxes are written in the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r mod 8)),
/// so the eight rows of one warp store hit distinct banks. Before writing: at d = 128 (kOInStage,
/// the last key tile's stage `s_last`) every consumer's last S_ij has read K_last (kOInK: phase
/// `k_parity` of k_last_read), or else every consumer's last P·V has read V_last; at d = 64 this
/// warpgroup's previous store has read its buffer. Thread 0 of the warpgroup issues and commits the stores.
template <class T>
__device__ __forceinline__ void store_unit_tma(const Problem& p, const WsSmem<T>& sm, const CUtensorMap* map_o,
                                               float* __restrict__ LSE, const float (&o)[T::kHeadDim / 2],
                                               const float (&m_i)[2], const float (&l_i)[2], const WsTile& w, int cw,
                                               int tid, int row_base, int t4, int s_last, uint32_t k_parity) {
  constexpr int D = T::kHeadDim;
  const int wg_bar = kTurnBarrier + T::kConsumers + cw;  // named barriers after the turns'
  if constexpr (T::kOInK) {
    mbar_wait(sm.k_last_read(), k_parity);
  } else if constexpr (T::kOInStage) {
    named_bar_sync(kTurnBarrier + 2 * T::kConsumers, 128 * T::kConsumers);
  } else {
    if (tid == 0) bulk_wait_read<0>();
    named_bar_sync(wg_bar, 128);
  }
  const uint32_t buf = sm.o_tile(cw, s_last);
  const std::size_t stat = p.stat_offset(w.b, w.h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_row_sum(l_i[r]);
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    const uint32_t row = uint32_t(tid / 32 * 16 + tid % 32 / 4 + 8 * r);  // within the warpgroup's 64
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
      const uint32_t addr =
          buf + uint32_t(t / 8) * 64 * 128 + row * 128 + ((uint32_t(t % 8) ^ (row % 8)) << 4) + 4 * t4;
      const uint32_t v = pack2<T::kBf16>(o[4 * t + 2 * r] * inv_l, o[4 * t + 2 * r + 1] * inv_l);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
    }
    if (t4 == 0 && row_base + 8 * r < p.seq) LSE[stat + row_base + 8 * r] = l > 0.f ? m_i[r] + log2f(l) : -INFINITY;
  }
  fence_proxy_async_smem();
  named_bar_sync(wg_bar, 128);
  if (tid == 0) {
#pragma unroll
    for (int c = 0; c < T::kColBlocks; ++c)
      tma_store_4d(map_o, buf + uint32_t(c) * 64 * 128, 64 * c, w.h, w.q0 + 64 * cw, w.b);
    bulk_commit();
  }
}

/// kOInStage: stage `pending` (if ≥ 0) held the last unit's O_i in its K_j (kOInK) or V_j; once this
/// warpgroup's store has read it, thread 0 gives it back to the producer for its warpgroup's four warps.
template <class T>
__device__ __forceinline__ void release_o_stage(const WsSmem<T>& sm, int& pending, int tid) {
  if (pending < 0) return;
  if (tid == 0) {
    bulk_wait_read<0>();
    mbar_arrive_count(T::kOInK ? sm.empty(pending) : sm.v_empty(pending), 4);
  }
  pending = -1;
}

/// kSplitEmpty: this warp's S_ij (key tile j of the unit's n_tiles, stage s) has read K_j, which the
/// producer may overwrite; kOInK holds the last one for O_i and tells the other warpgroups instead.
template <class T>
__device__ __forceinline__ void release_k(const WsSmem<T>& sm, int s, int j, int n_tiles, int lane) {
  if (T::kSplitEmpty && lane == 0) mbar_arrive(T::kOInK && j == n_tiles - 1 ? sm.k_last_read() : sm.empty(s));
}

/// kQParts: consumer warpgroup cw's part of Q_i is free once its last S_ij (key tile n_tiles − 1) is
/// done; one arrival per warp.
template <class T>
__device__ __forceinline__ void free_q_part(const WsSmem<T>& sm, int cw, int j, int n_tiles, int lane) {
  if (j == n_tiles - 1 && lane == 0) mbar_arrive(sm.q_empty_part(cw));
}

/// One consumer warpgroup `cw` (0 .. kConsumers − 1) on one tile: its 64 rows of Q_i against every
/// key tile. Turn k of warpgroup c follows turn k of warpgroup c − 1 (and warpgroup 0's follows the
/// last one's turn k − 1): named barriers, across tiles too. `it` (in/out) counts the key tiles of
/// the block's work list, as the producer does; `k` is the tile's place among the units with keys
/// (phase of q_full), `more` whether another unit with keys follows. Masks: keys ≥ N_k, and
/// (causal) keys past row + N_k − N; (window) keys past row + window_hi() or before row + window_lo().
template <class T>
__device__ void consume_tile(const Problem& p, const WsSmem<T>& sm, const CUtensorMap* map_o, uint16_t* __restrict__ O,
                             float* __restrict__ LSE, float* __restrict__ partials, int cw, const WsTile& w, int& it,
                             int k, bool more, int& o_pending) {
  constexpr int D = T::kHeadDim, BLOCK_N = T::BLOCK_N, S = T::kStages, kTurnThreads = 256;
  constexpr float NEG_INF = -INFINITY;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, t4 = lane % 4;
  const int row_base = w.q0 + 64 * cw + 16 * warp + lane / 4;  // this thread's rows: row_base, row_base + 8
  const int wg_row0 = w.q0 + 64 * cw, N = T::kPacked ? w.nk : p.seq_k, n_tiles = w.n_tiles;
  // The causal diagonal of this thread's rows, bottom-right aligned: the masks compare a key with
  // row + N_k − N (the step's softmax reads its row argument for nothing else). A window: its right
  // edge row + window_hi() instead, and its left edge row + window_lo() (lo_base; wg_lo_last: the
  // warpgroup's last row's, right of every other row's). Packed: the sequence's own N_k − N and
  // keys, so the keys of the next sequence that a box brings in past this one's end are masked.
  const int offset = T::kPacked ? w.nk - w.nq : p.causal_offset();
  const int lo = T::kPacked ? p.window_lo(offset) : p.window_lo();
  const int hi_off = T::kWindow ? (T::kPacked ? p.window_hi(offset) : p.window_hi()) : offset;
  const int diag_base = row_base + hi_off, wg_diag0 = wg_row0 + hi_off;
  const int lo_base = T::kWindow ? row_base + lo : 0, wg_lo_last = wg_row0 + 63 + lo;
  const float scale_log2 = p.scale_log2;
  const uint32_t sQ_wg = sm.q() + uint32_t(cw) * 64 * 128;  // this warpgroup's 64 rows (8 swizzle periods)
  const int my_turn = kTurnBarrier + cw;
  const int next_turn = kTurnBarrier + (T::kConsumers == 2 ? cw ^ 1 : (cw + 1) % T::kConsumers);
  // j counts this unit's key tiles from w.j0 (a piece of the split tail starts past 0).
  auto need_mask = [&](int j) {
    const int end = (w.j0 + j + 1) * BLOCK_N;
    return end > N || (T::kCausal && end - 1 > wg_diag0) || (T::kWindow && end - BLOCK_N < wg_lo_last);
  };
  auto phase = [&](int j) { return uint32_t((it + j) / S) & 1u; };  // key tile j of this tile
  auto stage = [&](int j) { return (it + j) % S; };

  float o[D / 2], s_acc[BLOCK_N / 2];
  uint32_t pa[BLOCK_N / 16][4];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m_i[2] = {NEG_INF, NEG_INF}, l_i[2] = {0.f, 0.f};

  if constexpr (T::kQParts)
    mbar_wait(sm.q_full_part(cw), uint32_t(k) & 1u);
  else
    mbar_wait(sm.q_full(), uint32_t(k) & 1u);
  // Tile 0: S only.
  mbar_wait(sm.k_full(stage(0)), phase(0));
  named_bar_sync(my_turn, kTurnThreads);
  wg_fence();
  issue_qk<T>(s_acc, sQ_wg, sm.k(stage(0)));
  wg_commit();
  named_bar_arrive(next_turn, kTurnThreads);
  // The last unit's O_i has long left its stage (it waited for this Q_i): give the stage back.
  if constexpr (T::kOInStage) release_o_stage<T>(sm, o_pending, tid);
  wg_wait<0>();
  reg_fence(s_acc);
  release_k<T>(sm, stage(0), 0, n_tiles, lane);  // done with K_0
  if constexpr (T::kQParts) free_q_part<T>(sm, cw, 0, n_tiles, lane);
  float alpha[2];
  bool moved =
      softmax_step<T>(s_acc, m_i, l_i, alpha, w.j0 * BLOCK_N, N, diag_base, need_mask(0), t4, scale_log2, lo_base);
  pack_rescale<T>(s_acc, pa, o, alpha, moved);
  // Tile j: S_ij with P_i(j−1)·V_(j−1) in one turn; the softmax of tile j overlaps the other
  // warpgroups' turns (and with kOverlap this warpgroup's own P·V too). P·V reads pa_in, the
  // softmax packs into pa_out (the same set unless kTwoP).
  auto key_tile = [&](int j, uint32_t(&pa_in)[BLOCK_N / 16][4], uint32_t(&pa_out)[BLOCK_N / 16][4]) {
    const int s = stage(j), sp = stage(j - 1);
    mbar_wait(sm.k_full(s), phase(j));
    mbar_wait(sm.v_full(sp), phase(j - 1));
    named_bar_sync(my_turn, kTurnThreads);
    wg_fence();  // s_acc, o, pa last written by ordinary instructions
    reg_fence(s_acc);
    reg_fence(o);
    reg_fence_u(pa_in);
    issue_qk<T>(s_acc, sQ_wg, sm.k(s));
    wg_commit();
    issue_pv_ws<T>(o, pa_in, sm.v(sp));
    wg_commit();
    named_bar_arrive(next_turn, kTurnThreads);
    if constexpr (T::kOverlap) {
      wg_wait<1>();  // S_ij done; P_i(j−1)·V_(j−1) may still run: O_i and pa_in stay untouched
      reg_fence(s_acc);
      release_k<T>(sm, s, j, n_tiles, lane);  // done with K_j
      if constexpr (T::kQParts) free_q_part<T>(sm, cw, j, n_tiles, lane);
      moved = softmax_step<T>(s_acc, m_i, l_i, alpha, (w.j0 + j) * BLOCK_N, N, diag_base, need_mask(j), t4,
                              scale_log2, lo_base);
      wg_wait<0>();
      reg_fence(o);
      reg_fence_u(pa_in);
      if (lane == 0) release_after_pv<T>(sm, sp);
    } else {
      wg_wait<0>();
      reg_fence(s_acc);
      reg_fence(o);
      reg_fence_u(pa_in);
      release_k<T>(sm, s, j, n_tiles, lane);  // done with K_j
      if constexpr (T::kQParts) free_q_part<T>(sm, cw, j, n_tiles, lane);
      if (lane == 0) release_after_pv<T>(sm, sp);
      moved = softmax_step<T>(s_acc, m_i, l_i, alpha, (w.j0 + j) * BLOCK_N, N, diag_base, need_mask(j), t4,
                              scale_log2, lo_base);
    }
    pack_rescale<T>(s_acc, pa_out, o, alpha, moved);
  };
  if constexpr (T::kTwoP) {
    uint32_t pb[BLOCK_N / 16][4];
    int j = 1;
    for (; j + 1 < n_tiles; j += 2) {
      key_tile(j, pa, pb);
      key_tile(j + 1, pb, pa);
    }
    if (j < n_tiles) {  // an odd tile left: its P ends in pb, and the last P·V reads pa
      key_tile(j, pa, pb);
#pragma unroll
      for (int kk = 0; kk < BLOCK_N / 16; ++kk)
#pragma unroll
        for (int q = 0; q < 4; ++q) pa[kk][q] = pb[kk][q];
    }
  } else {
    for (int j = 1; j < n_tiles; ++j) key_tile(j, pa, pa);
  }
  // Every S_ij finished: Q_i may be overwritten by the next tile's (kQParts: said already).
  if constexpr (!T::kQParts) {
    if (lane == 0) mbar_arrive(sm.q_empty());
  }
  // Last P·V: one more turn; the last warpgroup owes no arrival when it is the block's last turn.
  const int last = n_tiles - 1;
  mbar_wait(sm.v_full(stage(last)), phase(last));
  named_bar_sync(my_turn, kTurnThreads);
  wg_fence();
  reg_fence(o);
  reg_fence_u(pa);
  issue_pv_ws<T>(o, pa, sm.v(stage(last)));
  wg_commit();
  // (cw < kConsumers − 1, spelled so that two consumers compile to the measured code)
  if (cw == 0 || (T::kConsumers == 3 && cw == 1) || more) named_bar_arrive(next_turn, kTurnThreads);
  wg_wait<0>();
  reg_fence(o);
  const int s_last = stage(last);
  // kOInStage: V_last's stage (kOInK: K_last's) takes O_i and goes back once its store has read it
  // (release_o_stage).
  if ((!T::kOInStage || T::kOInK) && lane == 0) release_after_pv<T>(sm, s_last);
  it += n_tiles;
  if (T::kSplitTail && w.piece >= 0) {
    store_partial<T>(partials, w.piece, o, m_i, l_i, row_base - w.q0, t4);
  } else if constexpr (T::kTmaStoreO) {
    store_unit_tma<T>(p, sm, map_o, LSE, o, m_i, l_i, w, cw, tid, row_base, t4, s_last, uint32_t(k) & 1u);
    if constexpr (T::kOInStage) o_pending = s_last;
  } else {
    store_unit<T>(p, O, LSE, o, m_i, l_i, w, row_base, t4);
  }
}

/// One consumer warpgroup over the block's work list.
template <class T>
__device__ void consume(const Problem& p, const WsSmem<T>& sm, const WsSchedule<T>& sched, const CUtensorMap* map_o,
                        uint16_t* __restrict__ O, float* __restrict__ LSE, float* __restrict__ partials, int cw) {
  WsTile w, next;
  int it = 0, kq = 0, o_pending = -1;
  bool have = sched.at(0, w);
  // Packed: whether a unit with keys is at place k (unit x, `found`) or after it in the list;
  // units without keys may sit anywhere there (WsSchedule).
  auto keyed_from = [&](int k, WsTile x, bool found) {
    for (; found; found = sched.at(++k, x))
      if (x.n_tiles > 0) return true;
    return false;
  };
  // Warpgroup 0 takes the first turn (causal: none is taken where the block's first unit, hence
  // every one, has no keys, so no arrival is left unmatched; packed: where no unit has keys). After
  // the first unit is known, also without a mask: there ptxas spills less in the split-tail kernel.
  const bool first_turn = T::kPacked ? keyed_from(0, w, have) : !T::kCausal || (have && w.n_tiles > 0);
  if (cw == T::kConsumers - 1 && first_turn) named_bar_arrive(kTurnBarrier, 256);
  for (int k = 0; have; ++k) {
    const bool more = sched.at(k + 1, next);
    if ((T::kCausal || T::kPacked) && w.n_tiles == 0) {
      // No key for any row of the unit (causal, N > N_k): O = 0, LSE = −inf, as the reference;
      // no load, no turn (the units after it have no keys either: WsSchedule).
      const int tid = threadIdx.x % 128, row_base = w.q0 + 64 * cw + 16 * (tid / 32) + (tid % 32) / 4;
      float o[T::kHeadDim / 2];
#pragma unroll
      for (int i = 0; i < T::kHeadDim / 2; ++i) o[i] = 0.f;
      const float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};
      store_unit<T>(p, O, LSE, o, m_i, l_i, w, row_base, tid % 4);
    } else {
      // The next unit's turn is owed only if it has keys (dense: units without keys come last;
      // packed: a later unit with keys).
      const bool owe = T::kPacked ? keyed_from(k + 1, next, more) : more && (!T::kCausal || next.n_tiles > 0);
      consume_tile<T>(p, sm, map_o, O, LSE, partials, cw, w, it, kq++, owe, o_pending);
    }
    w = next;
    have = more;
  }
  // The last stores read their SRAM before the block ends (and are complete).
  if (T::kTmaStoreO && threadIdx.x % 128 == 0) bulk_wait<0>();
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    ws_fwd_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                  const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_o, Problem p,
                  uint16_t* __restrict__ O, float* __restrict__ LSE, float* __restrict__ partials, int full,
                  int stripe, PackedLists lists) {
#if FLASHLAB_WGMMA_OK
  extern __shared__ uint8_t smem_raw[];
  const WsSmem<T> sm{(uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u};
  // kPacked: the tiles of the packed numbering (packed.cuh), one batch entry.
  const int Tr = T::kPacked ? p.packed_tiles(T::BLOCK_M) : (p.seq + T::BLOCK_M - 1) / T::BLOCK_M;
  const int HB = T::kPacked ? p.heads : p.heads * p.batch;
  int4* pieces = reinterpret_cast<int4*>(smem_raw + (sm.base - uint32_t(__cvta_generic_to_shared(smem_raw))) +
                                         T::kPieceOffset);
  uint8_t* order = smem_raw + (sm.base - uint32_t(__cvta_generic_to_shared(smem_raw))) + T::kOrderOffset;
  int rows = 0, shift = 0;  // the striped packed list's M and A (WsSchedule::striped_unit)
  bool keyed = false;
  if (T::kPacked && T::kCausal && stripe > 1) {
    int lowest = 0, highest = 0;  // the aligned rows' range over the sequences with rows
    for (int b = 0; b < p.batch; ++b) {
      const int len_q = __ldg(lists.cu_seqlens_q + b + 1) - __ldg(lists.cu_seqlens_q + b);
      const int len_k = __ldg(lists.cu_seqlens_k + b + 1) - __ldg(lists.cu_seqlens_k + b);
      keyed = keyed || len_k != len_q;
      if (len_q == 0) continue;
      const int first = packed_row_shift(len_q, len_k, T::BLOCK_M);
      lowest = min(lowest, first);
      highest = max(highest, first + (len_q + T::BLOCK_M - 1) / T::BLOCK_M);
    }
    shift = -lowest;
    rows = highest + shift;
  }
  const WsSchedule<T> sched{Tr,   p.heads, HB,    Tr * HB,       p.seq_k,       p.heads_kv, p.causal_offset(),
                            full, pieces,  p.seq, p.window_lo(), p.window_hi(), lists.cu_seqlens_q, lists.cu_seqlens_k,
                            p.batch, p.window_left, p.window_right, stripe, rows, shift, keyed, order};
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    if constexpr (T::kCompact) compact_order(order, lists.cu_seqlens_k, p.batch);
    if constexpr (T::kSplitTail) {
      int4 share[2];
      tail_pieces(share, full, Tr * HB, (p.seq_k + T::BLOCK_N - 1) / T::BLOCK_N, int(blockIdx.x), int(gridDim.x));
      pieces[0] = share[0];
      pieces[1] = share[1];
    }
    tma_prefetch_map(&map_q);
    tma_prefetch_map(&map_k);
    tma_prefetch_map(&map_v);
    if (T::kTmaStoreO) tma_prefetch_map(&map_o);
    mbar_init(sm.q_full(), 1);
    if constexpr (T::kQParts) {  // a pair per consumer warpgroup's part of Q_i, four warps each
      mbar_init(sm.q_empty(), 4);
      for (int cw = 1; cw < T::kConsumers; ++cw) {
        mbar_init(sm.q_full_part(cw), 1);
        mbar_init(sm.q_empty_part(cw), 4);
      }
    } else {
      mbar_init(sm.q_empty(), T::kConsumerWarps);
    }
    if (T::kOInK) mbar_init(sm.k_last_read(), T::kConsumerWarps);
    for (int s = 0; s < T::kStages; ++s) {
      mbar_init(sm.k_full(s), 1);
      mbar_init(sm.v_full(s), 1);
      mbar_init(sm.empty(s), T::kConsumerWarps);
      if (T::kSplitEmpty) mbar_init(sm.v_empty(s), T::kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (wg == 0) {
    regs_release<T::kProducerRegs>();
    if (threadIdx.x == 0) produce<T>(sm, sched, &map_q, &map_k, &map_v);
    return;  // every load is consumed before the consumers exit: nothing in flight is orphaned
  }
  regs_claim<T::kConsumerRegs>();
  consume<T>(p, sm, sched, &map_o, O, LSE, partials, wg - 1);
#else
  __trap();  // built without sm_90a: never launched
#endif
}

/// The split tail's units (WsSchedule): O_i and LSE_i from the pieces' partial slots,
/// O_i = Σ 2^(m_p − m) O_p / Σ 2^(m_p − m) l_p with m = max m_p. One thread per two adjacent
/// columns of a row, kCombineRows rows per block, BLOCK_M / kCombineRows blocks per unit: every
/// load of every piece is in flight at once (one block per unit, looping over its rows, waited on
/// each load in turn and took longer than the tail it saved).
template <class T>
constexpr int kCombineRows = 256 / (T::kHeadDim / 2);

template <class T>
__global__ void __launch_bounds__(256)
    ws_combine_kernel(Problem p, const float* __restrict__ partials, uint16_t* __restrict__ O, float* __restrict__ LSE,
                      int full, int G) {
  constexpr int D = T::kHeadDim, BLOCK_M = T::BLOCK_M, kBlocksPerUnit = BLOCK_M / kCombineRows<T>;
  const int unit = int(blockIdx.x) / kBlocksPerUnit;
  const int r = (int(blockIdx.x) % kBlocksPerUnit) * kCombineRows<T> + int(threadIdx.x) / (D / 2);
  const int c = 2 * (int(threadIdx.x) % (D / 2));
  const int Tr = (p.seq + BLOCK_M - 1) / BLOCK_M, total = Tr * p.heads * p.batch;
  const int n = (p.seq_k + T::BLOCK_N - 1) / T::BLOCK_N;
  const unsigned F = unsigned(total - full) * unsigned(n), lo = unsigned(unit) * unsigned(n), hi = lo + unsigned(n);
  int tile, h, b;
  ws_unit<T::kCausal>(full + unit, Tr, p.heads, p.heads * p.batch, 1, tile, h, b);
  const int row = tile * BLOCK_M + r;
  if (row >= p.seq) return;
  const int first = int(lo * unsigned(G) / F);  // the first block whose share can meet this unit
  float m = -INFINITY, l = 0.f, o0 = 0.f, o1 = 0.f;
  for (int pass = 0; pass < 2; ++pass)
    for (int blk = first; blk < G; ++blk) {
      const unsigned s = tail_share_begin(blk, F, G), e = tail_share_begin(blk + 1, F, G);
      if (s >= hi) break;
      if (e <= lo || s >= e) continue;
      const float* part = partials + std::size_t(2 * blk + (s >= lo ? 0 : 1)) * kPartialFloats<T>;
      const float m_p = part[BLOCK_M * D + 2 * r];
      if (pass == 0) {
        m = fmaxf(m, m_p);
      } else {
        const float w = ex2(m_p - m);
        const float2 op = *reinterpret_cast<const float2*>(part + r * D + c);
        l += w * part[BLOCK_M * D + 2 * r + 1];
        o0 += w * op.x;
        o1 += w * op.y;
      }
    }
  const float inv_l = 1.f / l;  // every piece has a key < N_k (non-causal): l ≥ 1
  const std::size_t base = p.head_offset(b, h), stat = p.stat_offset(b, h);
  *reinterpret_cast<uint32_t*>(O + base + std::size_t(row) * p.row_stride() + c) =
      pack2<T::kBf16>(o0 * inv_l, o1 * inv_l);
  if (c == 0) LSE[stat + row] = m + log2f(l);
}

/// The query tiles per stripe W of a causal work list (ws_unit). The list runs its longest units
/// first (a balanced deal, a light end); with W = 1 the units in flight at once are SMs/(B·H) query
/// tiles of every head, so about F = SMs·G/(B·H) of them read each K/V head (G = H/H_kv query heads
/// read it). Below S readers the K_j, V_j one unit fetches have mostly left L2 before the next
/// reader comes, and the keys stream from HBM: too few FLOPs per byte for Br = 128 (S = 8), about
/// enough for Br = 192 (S = 2). There W = ⌈S/G⌉ (at most 8) puts W units of one head side by side,
/// for a balance cost of up to W key tiles a block (measured: docs/optimisation.md). W = 1 with a
/// window, where a unit sees no key (N > N_k: WsSchedule keeps those last) and at d = 256 (not
/// measured). Packed sequences (B of them, the longest Tr tiles) take the same rule on their own
/// list order (WsSchedule::striped_unit).
constexpr int kWsStripedSequences = 32;  // the most packed sequences a striped list takes (launch_ws_one)
constexpr int kWsStripedEntries = 4096;  // the most (stripe, sequence) entries it walks (launch_ws_one)
int ws_causal_stripe(const Problem& p, int Tr, int Br, int sms) {
  if (p.windowed() || p.causal_offset() < 0 || p.head_dim == 256) return 1;
  const int G = p.heads / p.heads_kv, S = Br >= 192 ? 2 : 8;
  const double readers = double(sms) * G / (double(p.heads) * p.batch);
  if (readers >= S) return 1;
  return std::max(1, std::min({8, Tr, (S + G - 1) / G}));
}

template <class T>
void launch_ws_one(const Problem& p, const void* Q, const void* K, const void* V, void* O, float* LSE, int sms,
                   cudaStream_t stream, const PackedLists& lists) {
  auto kernel = &ws_fwd_kernel<T>;
  // > 48 KiB of dynamic SRAM: opted in per device (set_smem keeps the record, thread-safe).
  set_smem(reinterpret_cast<const void*>(kernel), T::kSmemBytes, "ws_fwd_kernel", p);
  const CUtensorMap map_q = make_head_tile_map(Q, p, T::kQParts ? 64 : T::BLOCK_M);  // kQParts: a warpgroup's rows
  const CUtensorMap map_k = make_kv_tile_map(K, p, T::BLOCK_N);
  const CUtensorMap map_v = make_kv_tile_map(V, p, T::BLOCK_N);
  // kTmaStoreO: O in boxes of one consumer warpgroup's 64 rows (else unused).
  const CUtensorMap map_o = T::kTmaStoreO ? make_head_tile_map(O, p, 64) : map_q;
  // One block per SM (1 block/SM fits: __launch_bounds__ and the SRAM), each walking its share of
  // the (query tile, head) list (WsSchedule); never more blocks than units.
  const long long units = ws_units(p, T::BLOCK_M);
  const unsigned grid = unsigned(std::min<long long>(units, sms));
  const long long n = (p.seq_k + T::BLOCK_N - 1) / T::BLOCK_N;
  const bool split = T::kSplitTail && ws_split_tail(units, grid, n);
  const int full = split ? int(units / grid * grid) : int(units);
  float* partials = nullptr;
  if (split) {  // two partial slots per block (WsSchedule: a share meets at most two units)
    const std::size_t bytes = sizeof(float) * 2 * grid * std::size_t(kPartialFloats<T>);
    partials = static_cast<float*>(allocate_partials(bytes, stream));  // the forwards' pool (partial_pool.hpp)
  }
  const int HB = p.heads * p.batch;
  // Packed: the longest sequence's tiles (p.seq) cap W, B sequences stand for the batch; each block
  // walks every (stripe, sequence) entry of the list once (striped_unit's cursor), rows or not, so
  // only up to kWsStripedSequences sequences and kWsStripedEntries entries (the list's rows bounded
  // from the longest queries and keys: aligned rows ≤ 2⌈N/Br⌉ + ⌈N_k/Br⌉ + 2); beyond, units are
  // short or few and the numbering's order stays.
  const int longest = T::kPacked ? (p.seq + T::BLOCK_M - 1) / T::BLOCK_M : int(units / HB);
  int stripe = !T::kCausal || (T::kPacked && p.batch > kWsStripedSequences)
                   ? 1
                   : ws_causal_stripe(p, longest, T::BLOCK_M, sms);
  if (T::kPacked && stripe > 1) {
    const long long rows = 2LL * longest + (p.seq_k + T::BLOCK_M - 1) / T::BLOCK_M + 2;
    if ((rows + stripe - 1) / stripe * p.batch > kWsStripedEntries) stripe = 1;
  }
  announce("ws_fwd_kernel");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(map_q, map_k, map_v, map_o, p, static_cast<uint16_t*>(O), LSE,
                                                       partials, full, stripe, lists);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda_error(err, "launch of ws_fwd_kernel", __FILE__, __LINE__);
  if constexpr (T::kSplitTail) {
    if (!split) return;
    announce("ws_combine_kernel");
    ws_combine_kernel<T><<<unsigned(units - full) * (T::BLOCK_M / kCombineRows<T>), 256, 0, stream>>>(
        p, partials, static_cast<uint16_t*>(O), LSE, full, int(grid));
    err = cudaGetLastError();
    if (err != cudaSuccess) throw_cuda_error(err, "launch of ws_combine_kernel", __FILE__, __LINE__);
    free_partials(partials, stream);
  }
}

/// cuTensorMapEncodeTiled, looked up once through the runtime's driver entry point.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess)
      throw_cuda_error(err, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)", __FILE__, __LINE__);
    if (found != cudaDriverEntryPointSuccess || f == nullptr)
      throw_cuda_error(cudaErrorNotSupported, "the driver has no cuTensorMapEncodeTiled (hint: a CUDA 12+ driver)",
                       __FILE__, __LINE__);
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

}  // namespace

namespace {

/// The map of a 16-bit [batches, tokens, heads, d] tensor (make_head_tile_map, make_kv_tile_map).
CUtensorMap make_tile_map(const void* base, const Problem& p, int heads, int tokens, int batches, int box_rows) {
  CUtensorMap map{};
  const cuuint64_t elem = 2;  // 16-bit storage
  const cuuint64_t dims[4] = {cuuint64_t(p.head_dim), cuuint64_t(heads), cuuint64_t(tokens), cuuint64_t(batches)};
  const cuuint64_t row = cuuint64_t(heads) * cuuint64_t(p.head_dim);
  // Byte strides of dims 1..3 (dim 0 is contiguous): head, token, batch.
  const cuuint64_t strides[3] = {elem * p.head_dim, elem * row, elem * row * cuuint64_t(tokens)};
  const cuuint32_t box[4] = {64, 1, cuuint32_t(box_rows), 1};  // 64 columns = one 128-byte swizzle row
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  // The data type only sizes the elements for a tile load (no conversion): bf16 and fp16 alike.
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(base), dims, strides,
                                    box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw_cuda_error(cudaErrorInvalidValue,
                     ("cuTensorMapEncodeTiled (CUresult " + std::to_string(int(r)) +
                      "; hint: the tensor needs 16-byte aligned rows and base)")
                         .c_str(),
                     __FILE__, __LINE__);
  return map;
}

}  // namespace

// Packed sequences: one batch entry of total rows. The map bounds the whole tensor, not a
// sequence: a box that runs past a sequence's end reads the next sequence's rows (zeros only past
// the last), and the kernel masks those keys by the sequence's own length (S_ij = −inf, so P_ij = 0
// exactly) and never stores those queries' rows. One map per sequence would bound each box, but
// a map is 128 bytes built on the host from the lengths, which the host does not know here.
CUtensorMap make_head_tile_map(const void* base, const Problem& p, int box_rows) {
  return p.packed() ? make_tile_map(base, p, p.heads, p.total_q, 1, box_rows)
                    : make_tile_map(base, p, p.heads, p.seq, p.batch, box_rows);
}

CUtensorMap make_kv_tile_map(const void* base, const Problem& p, int box_rows) {
  return p.packed() ? make_tile_map(base, p, p.heads_kv, p.total_k, 1, box_rows)
                    : make_tile_map(base, p, p.heads_kv, p.seq_k, p.batch, box_rows);
}

namespace {

/// Every configuration choose_ws_config() can return, per dtype: one instantiation each.
constexpr WsConfig kWsConfigs[] = {
    // d = 64, causal: two P sets; three or two consumer warpgroups
    {64, true, true, 3, 3, 128, true, false, false, false, true, false},
    {64, true, true, 2, 3, 128, true, false, false, false, true, false},
    // d = 64, non-causal, three consumers: short chains, K/V released apart, two P sets; with
    // and without the split tail
    {64, true, false, 3, 3, 128, true, true, true, false, true, false},
    {64, true, false, 3, 3, 128, true, true, true, false, true, true},
    // d = 64, non-causal, two consumers
    {64, true, false, 2, 3, 128, true, true, false, false, false, false},
    // d = 128, non-causal: Bc = 192 in two stages with two P sets, or Bc = 128 in three
    {128, true, false, 2, 2, 192, true, true, true, true, true, false},
    {128, true, false, 2, 3, 128, true, true, true, true, false, false},
    // d = 128, causal
    {128, true, true, 2, 3, 128, false, false, false, false, false, false},
    // sliding windows: the causal configurations (d = 64 with two consumers), units from the band's left edge
    {64, true, true, 2, 3, 128, true, false, false, false, true, false, true},
    {128, true, true, 2, 3, 128, false, false, false, false, false, false, true},
    // d = 256: Bc = 80 in two stages, the overlap, K/V released apart; non-causal (short chains, the
    // vote), causal, window
    {256, true, false, 2, 2, 80, true, true, true, true, false, false},
    {256, true, true, 2, 2, 80, true, false, true, false, false, false},
    {256, true, true, 2, 2, 80, true, false, true, false, false, false, true},
    // packed sequences (d = 64 and 128): each of the above that choose_ws_config() picks for them
    // (never the split tail), with the packed work list
    {128, true, false, 2, 2, 192, true, true, true, true, true, false, false, true},
    {64, true, true, 3, 3, 128, true, false, false, false, true, false, false, true},
    {64, true, true, 2, 3, 128, true, false, false, false, true, false, false, true},
    {64, true, false, 3, 3, 128, true, true, true, false, true, false, false, true},
    {64, true, false, 2, 3, 128, true, true, false, false, false, false, false, true},
    // d = 64 without a mask, three consumers, few sequences: the compacted work list
    {64, true, false, 3, 3, 128, true, true, true, false, true, false, false, true, false, true},
    {128, true, false, 2, 3, 128, true, true, true, true, false, false, false, true},
    {128, true, true, 2, 3, 128, false, false, false, false, false, false, false, true},
    {64, true, true, 2, 3, 128, true, false, false, false, true, false, true, true},
    {128, true, true, 2, 3, 128, false, false, false, false, false, false, true, true},
    // O in fp32 (the ring's partials; ws_fp32_config): d = 64 causal and not with two consumers,
    // d = 128 non-causal with Bc = 128, d = 128 causal
    {64, true, true, 2, 3, 128, true, false, false, false, true, false, false, false, true},
    {64, true, false, 2, 3, 128, true, true, false, false, false, false, false, false, true},
    {128, true, false, 2, 3, 128, true, true, true, true, false, false, false, false, true},
    {128, true, true, 2, 3, 128, false, false, false, false, false, false, false, false, true},
};
constexpr int kWsConfigCount = int(sizeof(kWsConfigs) / sizeof(kWsConfigs[0]));

/// Configuration i of kWsConfigs in storage type bf16 (else fp16).
constexpr WsConfig ws_config_at(int i, bool bf16) {
  WsConfig c = kWsConfigs[i];
  c.bf16 = bf16;
  return c;
}

/// Launches the instantiation of `c` (one of ws_config_at(I…, …)); false when `c` is none of them.
template <int... I>
bool launch_ws_config(const WsConfig& c, const Problem& p, const void* Q, const void* K, const void* V, void* O,
                      float* LSE, int sms, cudaStream_t stream, const PackedLists& lists,
                      std::integer_sequence<int, I...>) {
  auto one = [&](auto config) {
    constexpr WsConfig k = decltype(config)::value;
    if (!(c == k)) return false;
    launch_ws_one<WsTraits<k>>(p, Q, K, V, O, LSE, sms, stream, lists);
    return true;
  };
  return (one(std::integral_constant<WsConfig, ws_config_at(I, true)>{}) || ...) ||
         (one(std::integral_constant<WsConfig, ws_config_at(I, false)>{}) || ...);
}

}  // namespace

/// The launcher of launchers.hpp (errors thrown as CudaError): the configuration
/// choose_ws_config() picks for this problem on this device, then its instantiation.
void launch_fast_tma_ws(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, void* O, float* LSE,
                        cudaStream_t stream, const PackedLists& lists) {
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
    throw_cuda_error(cudaErrorInvalidValue, "tma-ws forward: HEAD_DIM must be 64, 128 or 256", __FILE__, __LINE__);
  int dev = 0, sms = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const WsConfig c = choose_ws_config(p, bf16, sms);
  if (!launch_ws_config(c, p, Q, K, V, O, LSE, sms, stream, lists,
                        std::make_integer_sequence<int, kWsConfigCount>{}))
    throw_cuda_error(cudaErrorInvalidValue, "tma-ws forward: the chosen configuration has no instantiation", __FILE__,
                     __LINE__);
}

void launch_fast_tma_ws_f32(const Problem& p, bool bf16, const void* Q, const void* K, const void* V, float* O,
                            float* LSE, cudaStream_t stream) {
  if (p.head_dim != 64 && p.head_dim != 128)
    throw_cuda_error(cudaErrorInvalidValue, "tma-ws forward, fp32 O: HEAD_DIM must be 64 or 128", __FILE__, __LINE__);
  if (p.packed() || p.windowed())
    throw_cuda_error(cudaErrorInvalidValue, "tma-ws forward, fp32 O: dense problems without a window only", __FILE__,
                     __LINE__);
  int dev = 0, sms = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const WsConfig c = ws_fp32_config(choose_ws_config(p, bf16, sms));
  if (!launch_ws_config(c, p, Q, K, V, O, LSE, sms, stream, PackedLists{},
                        std::make_integer_sequence<int, kWsConfigCount>{}))
    throw_cuda_error(cudaErrorInvalidValue, "tma-ws forward, fp32 O: the chosen configuration has no instantiation",
                     __FILE__, __LINE__);
}

}  // namespace flashlab::cuda::detail
