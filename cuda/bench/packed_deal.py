#!/usr/bin/env python3
"""The tma-ws forward's static deal of units over the SMs, counted in key tiles: dense, packed, the
compacted packed list and the striped causal one (attention_fwd_ws.cu, WsSchedule; fwd_ws_config.hpp,
ws_compact_packed).

Usage: packed_deal.py [--causal] [--sms 132] [--heads 16] [--br 192] [--bc 128] [--stripe W] [--l2 MIB]
                      [--unit-cost C] [--keys KLEN [KLEN ...]] LEN [LEN ...]

Prints, for the packed sequences of the given lengths and for the dense shape of B = 8, N = 8192
(the rows of cuda/bench/varlen.sh): the list's places and units, the key tiles of the longest
block (the deal's makespan: every block works its own list, so the launch takes as long as that
block) and the model's TFLOP/s over the dense shape's (visible pairs per makespan tile). A model of
the deal alone: every key tile costs the same, a unit costs nothing else (--unit-cost: C key tiles
more a unit with keys, its O_i store and first S_ij; docs/optimisation.md, "The next Q_i earlier": 1.6-2.0
us a unit at 1.5 us a key tile, d = 128), the clocks do not move.
With --l2, also the K/V tiles read from HBM (d = 64, bf16: 32 KiB a key tile of one head, K and V)
if L2 kept the last MIB MiB of them (least recently used out), every block taking one key tile a
step; the row "heads together" is the compacted list with all heads of one tile side by side.
Causal, the row "packed, striped" is WsSchedule::striped_unit's list with stripes of --stripe rows
(default 8, ws_causal_stripe's W at Br = 128).

With --keys (causal, one key length per sequence: chunks of queries after prefixes of keys, causal
aligned bottom-right), the rows are the packed numbering's order, stripes by query row (the rank
launch_ws_one keeps for square packs only) and stripes by key-aligned row (m + floor((len_k - len_q)
/ Br)), each with the longest block's key tiles over an even deal's (of_even_deal) instead of the
dense comparison.
"""
from collections import OrderedDict
import argparse
import csv
import itertools
import sys


def dense_units(n, batch, heads, br, bc, causal):
    """ws_unit's orders: (sequence, head, key tiles) of each unit of the list."""
    tr, nk = (n + br - 1) // br, (n + bc - 1) // bc
    for t in range(tr * heads * batch):
        m, hb = (tr - 1 - t // (heads * batch), t % (heads * batch)) if causal else (t % tr, t // tr)
        yield hb // heads, hb % heads, min(nk, (m * br + br - 1) // bc + 1) if causal else nk


def packed_units(lengths, heads, br, bc, causal):
    """The packed numbering (packed.cuh): sequence b owns tiles floor(cu[b] / Br) + b ..."""
    cu = list(itertools.accumulate([0] + lengths))
    first = [cu[b] // br + b for b in range(len(lengths))] + [cu[-1] // br + len(lengths)]
    tiles = []
    for b, length in enumerate(lengths):
        tiles += [(b, (u - first[b]) * br) for u in range(first[b], first[b + 1])]
    tr = len(tiles)
    for t in range(tr * heads):
        (b, q0), h = (tiles[tr - 1 - t // heads], t % heads) if causal else (tiles[t % tr], t // tr)
        yield b, h, key_tiles(lengths[b], q0, br, bc, causal)


def compact_units(lengths, heads, br, bc, causal, heads_inner=False):
    """WsSchedule::compact_unit: the tiles each sequence needs, the sequences with the most keys first
    (compact_order; ties in packed order), one head's tiles (from its last) before the next head's;
    heads_inner: all heads of one tile together."""
    places = sum(lengths) // br + len(lengths)
    units = []
    for b in sorted(range(len(lengths)), key=lambda b: -lengths[b]):
        q0s = list(reversed(range(0, lengths[b], br)))
        order = [(h, q0) for q0 in q0s for h in range(heads)] if heads_inner else \
            [(h, q0) for h in range(heads) for q0 in q0s]
        units += [(b, h, key_tiles(lengths[b], q0, br, bc, causal)) for h, q0 in order]
    return units + [(0, 0, 0)] * (places * heads - len(units))


def striped_units(lengths, heads, br, bc, causal, w):
    """WsSchedule::striped_unit: stripes of w tile rows from the highest down over every sequence,
    in each sequence by sequence, head by head, each head's rows of the stripe from the bottom."""
    places = sum(lengths) // br + len(lengths)
    tiles = [(n + br - 1) // br for n in lengths]
    units, hi = [], max(tiles)
    while hi > 0:
        lo = max(0, hi - w)
        for b, n in enumerate(lengths):
            rows = list(reversed(range(lo, min(hi, tiles[b]))))
            units += [(b, h, key_tiles(n, m * br, br, bc, causal)) for h in range(heads) for m in rows]
        hi -= w
    return units + [(0, 0, 0)] * (places * heads - len(units))


def chunk_tiles(len_q, len_k, q0, br, bc):
    """Causal key tiles of the query tile at row q0 of a sequence of len_q queries and len_k keys."""
    last = q0 + br - 1 + len_k - len_q
    return 0 if q0 >= len_q or last < 0 else min((len_k + bc - 1) // bc, last // bc + 1)


def chunk_units(len_q, len_k, heads, br, bc, order, w):
    """Causal packs with their own key lengths: order "numbering" (packed_units' causal order),
    "rows" (stripes of w query rows) or "aligned" (stripes of w key-aligned rows)."""
    if order == "numbering":
        cu = list(itertools.accumulate([0] + len_q))
        first = [cu[b] // br + b for b in range(len(len_q))] + [cu[-1] // br + len(len_q)]
        tiles = [(b, (u - first[b]) * br) for b in range(len(len_q)) for u in range(first[b], first[b + 1])]
        return [(b, t % heads, chunk_tiles(len_q[b], len_k[b], q0, br, bc))
                for t in range(len(tiles) * heads) for b, q0 in [tiles[len(tiles) - 1 - t // heads]]]
    shift = [(k - q) // br if order == "aligned" else 0 for q, k in zip(len_q, len_k)]
    base = min(shift)
    start = [o - base for o in shift]
    count = [(q + br - 1) // br for q in len_q]
    units, hi = [], max(a + n for a, n in zip(start, count))
    while hi > 0:
        lo = max(0, hi - w)
        for b in range(len(len_q)):
            rows = [r - start[b] for r in reversed(range(max(lo, start[b]), min(hi, start[b] + count[b])))]
            units += [(b, h, chunk_tiles(len_q[b], len_k[b], m * br, br, bc)) for h in range(heads) for m in rows]
        hi -= w
    return units


def chunk_rows(a):
    """--keys: the three causal orders' deals, each against an even one."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["list", "places", "units", "longest_block_key_tiles", "of_even_deal"])
    for name, order in (("packed", "numbering"), (f"packed, striped by query row (W = {a.stripe})", "rows"),
                        (f"packed, striped by key-aligned row (W = {a.stripe})", "aligned")):
        units = chunk_units(a.lengths, a.keys, a.heads, a.br, a.bc, order, a.stripe)
        places, n, span, _ = deal(units, a.sms, a.unit_cost)
        even = sum(u[2] + (a.unit_cost if u[2] else 0) for u in units) / min(a.sms, len(units))
        out.writerow([name, places, n, f"{span:g}", f"{even / span:.4f}"])


def key_tiles(length, q0, br, bc, causal):
    if q0 >= length:
        return 0
    n = (length + bc - 1) // bc
    return min(n, (q0 + br - 1) // bc + 1) if causal else n


def deal(units, sms, unit_cost=0.0):
    """Each block's units (block blk takes places k·G + blk, a snake) and its key tiles (a unit with
    keys unit_cost more)."""
    units = list(units)
    g = min(sms, len(units))
    blocks = [[] for _ in range(g)]
    for t, u in enumerate(units):
        k, i = divmod(t, g)
        blocks[g - 1 - i if k % 2 else i].append(u)
    span = max(sum(u[2] + (unit_cost if u[2] else 0) for u in blk) for blk in blocks)
    return len(units), sum(1 for u in units if u[2]), span, blocks


def hbm_reads(blocks, l2_mib):
    """K/V tiles read from HBM if L2 kept the last l2_mib MiB of them (LRU), one key tile a step."""
    cap, lru, misses = l2_mib * 32, OrderedDict(), 0  # 32 KiB a tile: K and V, 128 keys, d = 64
    steps = [iter([(b, h, j) for b, h, n in blk for j in range(n)]) for blk in blocks]
    while steps:
        left = []
        for it in steps:
            tile = next(it, None)
            if tile is None:
                continue
            left.append(it)
            if tile in lru:
                lru.move_to_end(tile)
            else:
                misses += 1
                lru[tile] = True
                if len(lru) > cap:
                    lru.popitem(last=False)
        steps = left
    return misses


def visible(lengths, causal):
    return sum(n * (n + 1) // 2 if causal else n * n for n in lengths)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lengths", type=int, nargs="+")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--br", type=int, default=192)
    ap.add_argument("--bc", type=int, default=128)
    ap.add_argument("--stripe", type=int, default=8, help="rows per stripe of the striped causal list")
    ap.add_argument("--unit-cost", type=float, default=0.0, help="key tiles a unit with keys costs beyond its own")
    ap.add_argument("--l2", type=int, default=0, help="also the K/V tiles read from HBM with this L2 (MiB)")
    ap.add_argument("--keys", type=int, nargs="+",
                    help="causal: each sequence's key length (chunks after key prefixes)")
    a = ap.parse_args()
    if a.stripe < 1:
        ap.error(f"--stripe {a.stripe}: tile rows per stripe, at least 1")
    if min(a.lengths) < 0 or sum(a.lengths) == 0 or a.sms < 1 or a.heads < 1 or a.br < 1 or a.bc < 1:
        ap.error("lengths are at least 0, one at least 1; --sms, --heads, --br and --bc at least 1")
    if a.unit_cost < 0:
        ap.error(f"--unit-cost {a.unit_cost}: a unit's own cost in key tiles, at least 0")
    if a.keys is not None:
        if not a.causal or len(a.keys) != len(a.lengths) or min(a.keys) < 0:
            ap.error(f"--keys: one key length (at least 0) per sequence ({len(a.lengths)}), with --causal")
        chunk_rows(a)
        return
    args = (a.heads, a.br, a.bc, a.causal)
    dense = deal(dense_units(8192, 8, *args), a.sms, a.unit_cost)
    dense_rate = visible([8192] * 8, a.causal) / dense[2]
    rows = [("dense 8 x 8192", dense, [8192] * 8),
            ("packed", deal(packed_units(a.lengths, *args), a.sms, a.unit_cost), a.lengths),
            ("packed, compacted", deal(compact_units(a.lengths, *args), a.sms, a.unit_cost), a.lengths),
            ("packed, compacted, heads together",
             deal(compact_units(a.lengths, *args, heads_inner=True), a.sms, a.unit_cost), a.lengths)]
    if a.causal:
        striped = deal(striped_units(a.lengths, *args, a.stripe), a.sms, a.unit_cost)
        rows.append((f"packed, striped (W = {a.stripe})", striped, a.lengths))
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["list", "places", "units", "longest_block_key_tiles", "model_of_dense"] +
                 (["kv_tiles_from_hbm"] if a.l2 else []))
    for name, (places, units, span, blocks), lengths in rows:
        extra = [hbm_reads(blocks, a.l2)] if a.l2 else []
        of_dense = visible(lengths, a.causal) / span / dense_rate
        out.writerow([name, places, units, f"{span:g}", f"{of_dense:.4f}"] + extra)


if __name__ == "__main__":
    main()
