// The Hopper forward's configuration (attention_fwd_ws.cu) as one named type, and the one function
// that chooses it from the problem and the device (internal; host code, C++20: a WsConfig is the
// kernel's template parameter, a class-type non-type template parameter).
//
// Every rule below was chosen by measurement on the H100 (H = 16, bf16); the measurements are in
// docs/optimisation.md and cuda/results/fwd_tma_ws.csv, the reasons beside each rule here.
#pragma once

#include "core/common.hpp"

#include <algorithm>

namespace flashlab::cuda::detail {

/// One instantiation of the TMA / warp-specialised forward: its tiles, pipeline and softmax
/// variants, by name. Used as the template argument of WsTraits (attention_fwd_ws.cu) and returned
/// by choose_ws_config(); the tiles it reports (block_m(), block_n) are the tiles that run.
struct WsConfig {
  int head_dim = 128;        ///< d (64, 128 or 256)
  bool bf16 = true;          ///< storage type: bf16, else fp16
  bool causal = false;       ///< the causal instantiation (units stop at their diagonal)
  int consumers = 2;         ///< consumer warpgroups of 64 query rows each: Br = 64 · consumers (2 or 3)
  int stages = 3;            ///< K_j/V_j stages in the TMA ring
  int block_n = 128;         ///< Bc, keys per stage (128 or 192; 80 at d = 256)
  bool overlap = false;      ///< the softmax of S_ij starts while the P·V issued with it still runs
  bool short_chains = false; ///< the row maximum as a tree and the row sum in two chains
  bool split_empty = false;  ///< K_j and V_j of a stage released apart (K a turn earlier)
  bool vote_max = false;     ///< the warp votes whether any row maximum moves before reducing them
  bool two_p = false;        ///< two sets of P registers (the key loop unrolled by two)
  bool split_tail = false;   ///< the work list's last, part-empty round cut along the keys (non-causal)
  bool window = false;       ///< a sliding window: the band instantiation (with `causal`), units start at its left edge
  bool packed = false;       ///< packed sequences: the work list of the packed numbering (packed.cuh)
  bool out_f32 = false;      ///< O stored in fp32, unrounded (the ring's partials: ws_fp32_config)
  bool compact = false;      ///< packed, non-causal: the compacted work list (ws_compact_packed)

  /// Br, the query rows of one unit of work.
  constexpr int block_m() const { return 64 * consumers; }
  /// Field by field (the launcher maps a chosen value to its instantiation by this).
  constexpr bool operator==(const WsConfig&) const = default;
};

/// Units of the work list with query tiles of `rows` rows: (query tile, head, batch) triples;
/// packed, (query tile, head) pairs of the packed numbering (Problem::packed_tiles).
inline long long ws_units(const Problem& p, int rows) {
  if (p.packed()) return (long long)p.packed_tiles(rows) * p.heads;
  return (long long)((p.seq + rows - 1) / rows) * p.heads * p.batch;
}

/// Whether a non-causal list of `units` on `grid` blocks (n key tiles per unit) has its tail cut
/// along the keys (WsSchedule, ws_combine_kernel): at least 4 whole rounds before it and at least
/// half of the blocks idle in its last round. The cut costs a second launch, a Q_i load and a
/// partial store per piece, which a long list ending in a part-empty round repays and a short
/// list does not. 32-bit share arithmetic: grid · grid · n < 2^32.
inline bool ws_split_tail(long long units, long long grid, long long n) {
  const long long tail = units % grid;
  return tail != 0 && units / grid >= 4 && 2 * tail <= grid && n > 1 && grid * grid * n < (1LL << 32);
}

/// d = 64: three consumer warpgroups (Br = 192) once the work list gives every SM at least 2.5
/// rounds of units (causal units count half: on average they have half the key tiles); shorter
/// lists keep Br = 128, whose finer units spread better over the SMs.
inline bool ws_three_consumers(const Problem& p, int sms) {
  return double(ws_units(p, 192)) >= (p.causal ? 5.0 : 2.5) * sms;
}

/// d = 128 without a causal mask: key tiles of Bc = 192 (two stages: three do not fit the SRAM)
/// once the last, ragged tile pads the N_k keys by at most 1 %, else Bc = 128 with three stages: the
/// wider tile halves the barriers per key, but every padded key is wasted work.
inline bool ws_wide_keys(const Problem& p) {
  const long long padded = (p.seq_k + 191) / 192 * 192LL;
  return padded * 100 <= p.seq_k * 101LL;
}

/// Packed sequences, d = 128 without a causal mask: key tiles of Bc = 192 once the mean key length
/// total_k / B is at least 3072. Each sequence pads its own last key tile, on average Bc/2 keys: 96
/// at Bc = 192 against 64 at Bc = 128, so the wider tile wastes about 32·B keys more, at most ~1 % of
/// the keys at that mean (the dense rule's bound); the host knows no length but the totals.
inline bool ws_wide_packed_keys(const Problem& p) { return p.total_k >= 3072LL * p.batch; }

/// Packed sequences, d = 64 without a mask, three consumers: the compacted work list
/// (WsSchedule::compact_unit) for at most 16 sequences. The packed numbering gives each sequence
/// one spare tile more than it may need (B spare units per head, spread through the list, each a
/// place of the static deal that does nothing): at 8 × 8192 tokens, H = 16, 5584 places for 5504
/// units, so 40 blocks deal a 43rd round where the dense list's longest block has 42. The compacted
/// list numbers only the ⌈len_q / Br⌉ tiles each sequence needs, the sequences with the most keys
/// first (sorted in the kernel, so the caller's order does not matter), each one head's tiles (from
/// its last) before the next head's, and leaves the spare places at the list's end: every SM ends
/// within one unit of the others again, the long units lead and the short ones even out the deal at
/// the end (`packed_deal.py`: 0.966 → 0.983 of dense on 16 mixed lengths packed longest last). One head's
/// tiles together keep a few K/V heads in flight, as the dense list does, where all heads of one
/// tile together would hold all H of a sequence's (32 MiB at N = 8192) and bring them back from HBM
/// each round. Finding a unit's tile scans the B sequences in that order (two cached loads each, in
/// the producer and in each consumer, once per unit), so only for few sequences: 16 of them are a few
/// hundred clocks beside the ~2,500 of one 192 × 128 key tile at d = 64 (a bound chosen by that
/// estimate, not by a measurement).
inline bool ws_compact_packed(const Problem& p) { return p.packed() && p.batch <= 16; }

/// The configuration of problem `p` (d ∈ {64, 128, 256}) on a device of `sms` SMs, the one place the
/// choice is made (the launcher runs it, fast_forward_tiles() reports its tiles):
/// - d = 64: two or three consumer warpgroups (ws_three_consumers), both with the
///   intra-warpgroup overlap. Causal: two P register sets. Non-causal: the short reduction chains
///   (not causal, where they measured slower), and with three consumers K/V released apart, two P
///   sets and, where ws_split_tail says, the split tail (a separate instantiation, since its
///   bookkeeping costs time where the tail stays whole); with two consumers neither (the second P
///   set measured slower there).
/// - d = 128: two consumer warpgroups. Causal: no overlap, nothing else (each measured mixed or
///   slower). Non-causal: the overlap, short chains, K/V released apart and the warp's vote
///   before the row maxima (slower at d = 64, so only here), with Bc = 192 in two stages and two
///   P sets where ws_wide_keys says, else Bc = 128 in three stages with one P set. Not the split
///   tail: with Bc = 192 its kernel spills.
/// - d = 256: two consumer warpgroups, Bc = 80 in two stages, the overlap and K/V released apart
///   with every mask (causal and window too); without a mask also the short chains and the vote.
///   O_i is 64 × 256 fp32 per consumer warpgroup, 128 of its 240 registers per thread, so S_ij
///   (Bc/2) and P_ij (Bc/4) must fit in the rest; and the SRAM holds Q_i (64 KiB) and two stages
///   of K_j, V_j (2 × 2 × Bc · 512 B): Bc = 80 is the widest key tile, in whole k16 steps, that
///   fits two stages (96 would need 256 KiB). With only two stages, releasing K_j a turn before
///   V_j is what lets the next key tile load in time: +37 % without a mask, +26 % causal.
/// - Packed sequences (Problem::packed(), d = 64 and 128): as dense, with units of unequal lengths
///   and each sequence's own ragged last key tile, so never the split tail (it cuts equal units).
///   d = 128 without a mask takes Bc = 192 by ws_wide_packed_keys (the host knows the totals only);
///   d = 64 without a mask, with three consumers, the compacted list by ws_compact_packed.
/// - A window (Problem::windowed()): the causal configuration of its head dim with `window` set,
///   the band's two edges in place of the diagonal; at d = 64 always two consumers (Br = 128: a
///   narrow band wastes less of a shorter query tile, and one instantiation fewer to build).
inline WsConfig choose_ws_config(const Problem& p, bool bf16, int sms) {
  WsConfig c;
  c.head_dim = p.head_dim;
  c.bf16 = bf16;
  c.causal = p.causal || p.windowed();
  c.window = p.windowed();
  c.packed = p.packed();
  c.overlap = true;
  if (p.head_dim == 256) {
    c.stages = 2;
    c.block_n = 80;
    c.split_empty = true;
    c.short_chains = c.vote_max = !c.causal;
    return c;
  }
  if (c.window) {
    c.overlap = p.head_dim == 64;
    c.two_p = p.head_dim == 64;
    return c;
  }
  if (p.head_dim == 64) {
    c.consumers = ws_three_consumers(p, sms) ? 3 : 2;
    if (p.causal) {
      c.two_p = true;
    } else {
      c.short_chains = true;
      if (c.consumers == 3) {
        c.split_empty = true;
        c.two_p = true;
        const long long units = ws_units(p, c.block_m()), n = (p.seq_k + c.block_n - 1) / c.block_n;
        c.split_tail = !p.packed() && ws_split_tail(units, std::min<long long>(units, sms), n);
        c.compact = ws_compact_packed(p);
      }
    }
    return c;
  }
  if (p.causal) {
    c.overlap = false;
    return c;
  }
  c.short_chains = true;
  c.split_empty = true;
  c.vote_max = true;
  if (p.packed() ? ws_wide_packed_keys(p) : ws_wide_keys(p)) {
    c.block_n = 192;
    c.stages = 2;
    c.two_p = true;
  }
  return c;
}

/// The configuration whose instantiation stores O in fp32 (WsConfig::out_f32) for a dense problem
/// without a window whose 16-bit configuration is `c` (d = 64 or 128): the context-parallel ring
/// merges its blocks' partials by LSE before it rounds once, so a partial must leave the kernel
/// unrounded. Only four fp32 instantiations per dtype are built (each costs minutes of nvcc):
/// d = 64 keeps two consumer warpgroups (no split tail, whose combine kernel stores 16 bits) and
/// d = 128 keys of Bc = 128; the softmax variants are those of c. The ring's blocks are long
/// (c = N / (2G) rows), where three consumers and Bc = 192 measured a few per cent faster.
inline WsConfig ws_fp32_config(WsConfig c) {
  c.out_f32 = true;
  c.split_tail = false;
  if (c.head_dim == 64 && c.consumers == 3) {
    c.consumers = 2;
    if (!c.causal) c.split_empty = c.two_p = false;  // the two-consumer non-causal configuration
  }
  if (c.head_dim == 128 && c.block_n == 192) {
    c.block_n = 128;
    c.stages = 3;
    c.two_p = false;
  }
  return c;
}

}  // namespace flashlab::cuda::detail
