"""timing_common.py — the one timing loop of the PyTorch comparison scripts (sdpa_bench.py,
stream_sdpa.py), the method of flashlab's own benchmarks (cuda/src/bench_timing.cpp): `warmup`
untimed calls, then `reps` timed ones; before each, `prepare(r)` (untimed) and an L2 flush (a
256 MiB zero_() outside the timed range); each call alone between two CUDA events, synchronised
before the next. Returns the median in milliseconds.
"""
import statistics

import torch

FLUSH_BYTES = 256 << 20  # H100 L2 is 50 MiB


def median_ms(call, warmup, reps, prepare=None):
    """Median ms of call(r) over the timed calls r = warmup … warmup + reps − 1."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(warmup + reps):
        if prepare is not None:
            prepare(r)
        flush.zero_()
        e0.record()
        call(r)
        e1.record()
        e1.synchronize()
        if r >= warmup:
            times.append(e0.elapsed_time(e1))
    del flush
    return statistics.median(times)
