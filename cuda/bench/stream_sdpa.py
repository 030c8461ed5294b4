#!/usr/bin/env python3
"""stream_sdpa.py — dense causal attention (PyTorch SDPA, cuDNN and flash backends) at the sequence
lengths of `flashlab bench stream --csv`, in the same session, and how many times faster STREAM
(estimate + apply) is than dense attention.

Usage (on the GPU machine, after `flashlab bench stream --csv ... > stream.csv`):
    python3 cuda/bench/stream_sdpa.py stream.csv [more.csv ...] [--reps 10] [--out ratios.csv]

Every CSV has the columns of `flashlab bench stream --csv` (kernel, dtype, pass, T, d, k, H, ...,
ms). Rows are paired by (kernel, dtype, T, d, k, H): STREAM's time is the estimate's median plus the
apply's median (each timed alone, L2 flushed, by flashlab); a shape with only one of the two
passes is reported with that pass alone and marked so (`passes` column), never as a total.

Dense attention, per distinct (T, d, H, dtype): F.scaled_dot_product_attention(q, k, v,
is_causal=True) on [1, H, T, d] tensors made from [1, T, H, d] memory (STREAM's [T, H, d] layout)
under torch.no_grad(), with the unscaled logits STREAM uses (scale=1.0; the time does not depend
on it). Method as flashlab's (timing_common.py): warm-up calls, then --reps calls each timed alone
with CUDA events, L2 flushed before each (a 256 MiB zero_() and a read of it, outside the timed range); the median is
reported. From
T = 524288 on, one warm-up and at most 3 timed calls (a dense call there takes 0.1 to 1 s).
Ratio = dense median / STREAM total (> 1: STREAM faster).
"""
import csv
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from timing_common import median_ms, write_csv

BACKENDS = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]


def time_dense(backend, T, H, d, dtype, reps):
    """Median ms of one dense causal SDPA call at [1, T, H, d]."""
    warmup = 3
    if T >= 524288:
        warmup, reps = 1, min(reps, 3)
    q, k, v = (torch.randn(1, T, H, d, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(3))
    with sdpa_kernel([backend]), torch.no_grad():
        ms = median_ms(lambda r: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0), warmup, reps)
    del q, k, v
    torch.cuda.empty_cache()
    return ms


def read_stream_rows(paths):
    """{(kernel, dtype, T, d, k, H): {"estimate": ms, "apply": ms}} from flashlab's CSVs."""
    shapes = {}
    for path in paths:
        with open(path) as f:
            for row in csv.DictReader(f):
                key = (row["kernel"], row["dtype"], int(row["T"]), int(row["d"]), int(row["k"]), int(row["H"]))
                shapes.setdefault(key, {})[row["pass"]] = float(row["ms"])
    return shapes


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        print(__doc__)
        return 2
    reps = int(args[args.index("--reps") + 1]) if "--reps" in args else 10
    out_path = args[args.index("--out") + 1] if "--out" in args else None
    paths = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or args[i - 1] not in ("--reps", "--out"))]
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    shapes = read_stream_rows(paths)
    dense = {}
    header = ["kernel", "dtype", "T", "d", "k", "H", "passes", "estimate_ms", "apply_ms", "stream_ms"]
    for name, _ in BACKENDS:
        header += [f"{name}_ms", f"{name}/stream"]
    print(",".join(header))
    out_rows = []
    for (kernel, dt, T, d, k, H), passes in sorted(shapes.items(), key=lambda kv: (kv[0][3], kv[0][2], kv[0][4])):
        dtype = torch.bfloat16 if dt in ("bf16", "fp32") else torch.float16  # dense runs in 16 bits
        est, app = passes.get("estimate"), passes.get("apply")
        which = "+".join(p for p in ("estimate", "apply") if p in passes)
        total = (est or 0.0) + (app or 0.0)
        vals = [kernel, dt, T, d, k, H, which, est if est is not None else "", app if app is not None else "",
                round(total, 4)]
        for name, backend in BACKENDS:
            key = (name, T, d, H, dtype)
            if key not in dense:
                try:
                    dense[key] = round(time_dense(backend, T, H, d, dtype, reps), 4)
                except RuntimeError as e:  # a backend may refuse a shape or run out of memory: say so
                    print(f"  {name} T={T} d={d}: not run ({str(e).splitlines()[0]})", file=sys.stderr)
                    dense[key] = None
            ms = dense[key]
            vals += [ms if ms is not None else "n/a", round(ms / total, 2) if ms is not None and total > 0 else "n/a"]
        print(",".join(str(v) for v in vals), flush=True)
        out_rows.append(vals)
    if out_path:
        write_csv(out_path, header, out_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
