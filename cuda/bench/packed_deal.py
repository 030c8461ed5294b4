#!/usr/bin/env python3
"""The tma-ws forward's static deal of units over the SMs, counted in key tiles: dense, packed and
the compacted packed list (attention_fwd_ws.cu, WsSchedule; fwd_ws_config.hpp, ws_compact_packed).

Usage: packed_deal.py [--causal] [--sms 132] [--heads 16] [--br 192] [--bc 128] LEN [LEN ...]

Prints, for the packed sequences of the given lengths and for the dense shape of B = 8, N = 8192
(the rows of cuda/bench/varlen.sh): the list's places and units, the key tiles of the longest
block (the deal's makespan: every block works its own list, so the launch takes as long as that
block) and the model's TFLOP/s over the dense shape's (visible pairs per makespan tile). A model of
the deal alone: every key tile costs the same, a unit costs nothing else, the clocks do not move.
"""
import argparse
import itertools


def dense_units(n, batch, heads, br, bc, causal):
    tr, nk = (n + br - 1) // br, (n + bc - 1) // bc
    for t in range(tr * heads * batch):
        m = tr - 1 - t // (heads * batch) if causal else t % tr
        yield min(nk, (m * br + br - 1) // bc + 1) if causal else nk


def packed_units(lengths, heads, br, bc, causal):
    """The packed numbering (packed.cuh): sequence b owns tiles floor(cu[b] / Br) + b ..."""
    cu = list(itertools.accumulate([0] + lengths))
    first = [cu[b] // br + b for b in range(len(lengths))] + [cu[-1] // br + len(lengths)]
    tiles = []
    for b, length in enumerate(lengths):
        tiles += [(b, (u - first[b]) * br) for u in range(first[b], first[b + 1])]
    tr = len(tiles)
    for t in range(tr * heads):
        b, q0 = tiles[tr - 1 - t // heads] if causal else tiles[t % tr]
        yield key_tiles(lengths[b], q0, br, bc, causal)


def compact_units(lengths, heads, br, bc, causal):
    """WsSchedule::compact_unit: the tiles each sequence needs, last first, heads innermost."""
    places = sum(lengths) // br + len(lengths)
    tiles = [(b, q0) for b, length in enumerate(lengths) for q0 in range(0, length, br)]
    for t in range(places * heads):
        mc = t // heads
        yield key_tiles(lengths[tiles[len(tiles) - 1 - mc][0]], tiles[len(tiles) - 1 - mc][1], br, bc,
                        causal) if mc < len(tiles) else 0


def key_tiles(length, q0, br, bc, causal):
    if q0 >= length:
        return 0
    n = (length + bc - 1) // bc
    return min(n, (q0 + br - 1) // bc + 1) if causal else n


def deal(units, sms):
    units = list(units)
    g = min(sms, len(units))
    load = [0] * g
    for t, n in enumerate(units):
        k, i = divmod(t, g)
        load[g - 1 - i if k % 2 else i] += n
    return len(units), sum(1 for n in units if n), max(load)


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
    a = ap.parse_args()
    args = (a.heads, a.br, a.bc, a.causal)
    _, _, dense_span = deal(dense_units(8192, 8, *args), a.sms)
    dense_rate = visible([8192] * 8, a.causal) / dense_span
    rows = [("dense 8 x 8192", deal(dense_units(8192, 8, *args), a.sms), [8192] * 8),
            ("packed", deal(packed_units(a.lengths, *args), a.sms), a.lengths),
            ("packed, compacted", deal(compact_units(a.lengths, *args), a.sms), a.lengths)]
    print("list,places,units,longest_block_key_tiles,model_of_dense")
    for name, (places, units, span), lengths in rows:
        print(f"{name},{places},{units},{span},{visible(lengths, a.causal) / span / dense_rate:.4f}")


if __name__ == "__main__":
    main()
