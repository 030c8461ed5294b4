#!/usr/bin/env python3
"""fwd_timeline.py — the kernels of one forward call, ours beside SDPA's cuDNN backend, on the short
non-causal shapes where cuDNN leads: each kernel's duration (CUPTI, through torch.profiler) and its
launch (grid, block, registers per thread, shared memory), the layout of the work. The rows of
cuda/results/fwd_timeline.csv.

The forward is one kernel; at N ≤ 4096 ours trails cuDNN by 1–5 % (fwd_short.csv) while each of
our units costs 1.6–2.0 µs beyond its key tiles (docs/optimisation.md, "The next Q_i earlier"). Whether cuDNN's
kernel does the same work in fewer, longer blocks or in more, smaller ones that overlap each
other's start and end on one SM is what its launch says.

Usage (on the GPU machine, from the repository root; the library of the build under test):
    FLASHLAB_LIBRARY=.../libflashlab.so python3 cuda/bench/fwd_timeline.py > timeline.log
    python3 cuda/bench/fwd_timeline.py --from-log timeline.log DATE DEVICE COMMIT > fwd_timeline.csv

Method: bwd_timeline.py's (3 untimed calls, 4 under the profiler, each after a 256 MiB write),
bf16, H = 16, without a mask: d = 64 and 128; B·N = 16k (1024 × 16, 2048 × 8, 4096 × 4) and B = 1
(N = 1024, 2048, 4096, 8192). Ours: flashlab.attention_forward; cuDNN: SDPA under torch.no_grad().
"""
import csv
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bwd_timeline import cli, log_rows, timeline  # noqa: E402  (the same method, one place)

SHAPES = ((16, 1024), (8, 2048), (4, 4096), (1, 1024), (1, 2048), (1, 4096), (1, 8192))


def measure():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import flashlab

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    tmp = tempfile.mkdtemp()
    H = 16
    for d in (64, 128):
        for B, N in SHAPES:
            q = torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16)
            k, v = torch.randn_like(q), torch.randn_like(q)
            timeline(f"ours_fwd_d{d}_{B}x{N}", lambda: flashlab.attention_forward(q, k, v), flush, tmp, details=True)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
                timeline(f"cudnn_fwd_d{d}_{B}x{N}", lambda: F.scaled_dot_product_attention(qt, kt, vt), flush, tmp,
                         details=True)


def from_log(path, date, device, commit):
    """The printed timelines → CSV rows: one per kernel of each case's last call, with its launch."""
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["date", "device", "commit", "case", "spans_us", "index", "kernel", "start_us", "gap_us", "dur_us",
                "grid", "block", "registers", "smem_bytes"])
    for row in log_rows(path):
        w.writerow([date, device, commit, *row])


if __name__ == "__main__":
    sys.exit(cli(sys.argv, __doc__, measure, from_log))
