"""timing_common.py — what the PyTorch comparison scripts share: the output CSV and the L2 flush
size (sdpa_bench.py, stream_sdpa.py, mta_torch.py), and the one timing loop (the first two;
mta_torch.py writes it out to read each call's peak memory), the method of flashlab's own benchmarks
(cuda/src/core/bench_timing.cpp): `warmup` untimed calls, then `reps` timed ones; before each,
`prepare(r)` (untimed) and an L2 flush outside the timed range (flush_l2: a 256 MiB zero_(), then a
read of the same buffer, so L2 holds no dirty line for the call to write back); each call alone
between two CUDA events, synchronised before the next; the median in milliseconds.
"""
import csv
import statistics

import torch

FLUSH_BYTES = 256 << 20  # H100 L2 is 50 MiB


def flush_l2(flush):
    """Empties L2 as flashlab's launch timer does: zero `flush` (a uint8 CUDA tensor ≫ L2), then read it
    back, so the zero_()'s dirty lines are written back here, not inside the timed call that evicts
    them (~50 MB on an H100: ~10 µs of a call that reads 128 MiB and writes little)."""
    flush.zero_()
    flush.sum(dtype=torch.int64)  # reads every byte; the result is not needed


def median_ms(call, warmup, reps, prepare=None):
    """Median ms of call(r) over the timed calls r = warmup … warmup + reps − 1."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(warmup + reps):
        if prepare is not None:
            prepare(r)
        flush_l2(flush)
        e0.record()
        call(r)
        e1.record()
        e1.synchronize()
        if r >= warmup:
            times.append(e0.elapsed_time(e1))
    del flush
    return statistics.median(times)


def median_backward_ms(graphs, warmup, reps):
    """Median ms of out.backward(dO, retain_graph=True) over `graphs`, a list of (out, dO, leaves)
    made once per input set and rotated; the leaves' gradients are set to None before each call,
    outside the timed range (so autograd hands them over without adding into them)."""
    def clear(r):
        for leaf in graphs[r % len(graphs)][2]:
            leaf.grad = None

    def call(r):
        out, dO, _ = graphs[r % len(graphs)]
        out.backward(dO, retain_graph=True)

    return median_ms(call, warmup, reps, prepare=clear)


def write_csv(path, header, rows):
    """The script's rows under its header, as one CSV file."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
