#!/usr/bin/env python3
"""sdpa_bench.py — PyTorch SDPA (flash and cuDNN backends) on the shapes and passes of `flashlab
bench attention --csv`, in the same session, and our/their ratios per pass.

Usage (on the GPU machine, after `flashlab bench attention --csv > ours.csv`):
    python3 cuda/bench/sdpa_bench.py ours.csv [--reps 30] [--out ratios.csv]

Method, the same as `flashlab bench attention` (timing_common.py): per shape and pass 3 warm-up
calls, then --reps timed calls, each timed alone with CUDA events, L2 flushed before each (256 MiB
zero_() and a read of it, outside the timed range), inputs rotated over 3 sets; the median is reported.
  fwd: F.scaled_dot_product_attention(q, k, v) under torch.no_grad(). FLOPs = 4·N²·d·H·B.
  bwd: q, k, v require grad; out = SDPA(q, k, v) once per input set (untimed, graph kept); each
       timed call is out.backward(dO, retain_graph=True) with the grads set to None beforehand
       (outside the timed range), so the time is SDPA's backward kernel(s) plus what autograd adds
       to hand the gradients to the leaves (no accumulation). FLOPs = 2.5 × 4·N²·d·H·B.
  Causal: half the FLOPs. A CSV without a `pass` column (older runs, bench_cuda_attention) is fwd.
  The `bwd_design` column (atomic or two-kernel, `flashlab bench attention --bwd-design`; empty for
  fwd rows, absent in older CSVs) is carried into the output as `ours_design`.

Layouts: ours is [B, N, H, d]; SDPA is called on the transposed view of the same memory ("bnhd",
the layout a fused QKV projection produces, what our kernel reads) and, for reference, on
contiguous [B, H, N, d] tensors ("bhnd"), each backend's preferred layout.

Grouped K/V and N_k != N (the `H_kv` and `N_k` columns of `flashlab bench attention --csv
--heads-kv HKV --seq-k NK`; absent in older CSVs: H_kv = H, N_k = N): K and V are
[B, N_k, H_kv, d] and SDPA is called with enable_gqa=True (it then reads each K/V head for its
H / H_kv query heads, as ours does); causal with N_k != N uses the bottom-right aligned mask
(torch.nn.attention.bias.causal_lower_right), ours's convention. FLOPs count the visible
(query, key) pairs: N·N_k, causal N·N_k − N²/2 (N ≤ N_k) or N_k²/2 (N > N_k).
"""
import csv
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from timing_common import median_backward_ms, median_ms, write_csv


def make(B, H, N, d, dtype, layout, grad):
    """One [B, N, H, d] tensor in `layout`; returns (the tensor SDPA sees, the leaf that holds the gradient)."""
    if layout == "bnhd":
        leaf = torch.randn(B, N, H, d, device="cuda", dtype=dtype, requires_grad=grad)
        return leaf.transpose(1, 2), leaf
    leaf = torch.randn(B, H, N, d, device="cuda", dtype=dtype, requires_grad=grad)
    return leaf, leaf


def time_sdpa(backend, B, H, N, d, causal, dtype, layout, reps, backward=False, H_kv=None, N_k=None):
    H_kv = H_kv or H
    N_k = N_k or N
    # Grouped K/V: enable_gqa; causal with N_k != N: the bottom-right aligned mask (ours).
    extra = {"enable_gqa": True} if H_kv != H else {}
    if causal and N_k != N:
        extra["attn_mask"] = causal_lower_right(N, N_k)
    else:
        extra["is_causal"] = causal

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **extra)

    with sdpa_kernel([backend]):
        sets = []
        for _ in range(3):
            made = [make(B, H, N, d, dtype, layout, backward)] + [
                make(B, H_kv, N_k, d, dtype, layout, backward) for _ in range(2)]
            q, k, v = (t for t, _ in made)
            leaves = [leaf for _, leaf in made]
            if backward:
                out = sdpa(q, k, v)
                dO = torch.randn_like(out)
                sets.append((out, dO, leaves))
            else:
                sets.append((q, k, v))
        torch.cuda.synchronize()
        if backward:
            return median_backward_ms(sets, 3, reps)
        with torch.no_grad():
            return median_ms(lambda r: sdpa(*sets[r % 3]), 3, reps)


def visible_pairs(N, N_k, causal):
    """(query, key) pairs a forward computes (bottom-right aligned causal), as `flashlab bench attention`."""
    if not causal:
        return N * N_k
    return N * N_k - 0.5 * N * N if N <= N_k else 0.5 * N_k * N_k


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    ours_path = sys.argv[1]
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 30
    out_path = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    rows = list(csv.DictReader(open(ours_path)))
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]
    header = ["pass", "d", "causal", "N", "H", "H_kv", "N_k", "ours_design", "ours_tflops"]
    for name, _ in backends:
        for layout in ("bnhd", "bhnd"):
            header += [f"{name}_{layout}_tflops", f"ours/{name}_{layout}"]
    print(" ".join(f"{h:>17}" for h in header))
    out_rows = []
    for row in rows:
        if int(row.get("window_left") or -1) >= 0 or int(row.get("window_right") or -1) >= 0:
            print(f"  window {row['window_left']},{row['window_right']} N={row['N']}: not compared (SDPA has no window)")
            continue
        if int(row.get("total_q") or 0) > 0:
            print(f"  packed sequences, total_q {row['total_q']}: not compared (SDPA takes dense batches)")
            continue
        d, causal, N, H, B = int(row["d"]), int(row["causal"]) != 0, int(row["N"]), int(row["H"]), int(row["B"])
        H_kv, N_k = int(row.get("H_kv") or H), int(row.get("N_k") or N)
        pas = row.get("pass") or "fwd"
        backward = pas == "bwd"
        dtype = torch.bfloat16 if row["dtype"] == "bf16" else torch.float16
        ours = float(row["tflops"])
        flops = (2.5 if backward else 1.0) * 4.0 * visible_pairs(N, N_k, causal) * d * H * B
        design = (row.get("bwd_design") or "-") if backward else "-"
        vals = [pas, d, int(causal), N, H, H_kv, N_k, design, ours]
        for name, be in backends:
            for layout in ("bnhd", "bhnd"):
                try:
                    ms = time_sdpa(be, B, H, N, d, causal, dtype, layout, reps, backward, H_kv, N_k)
                    tf = flops / (ms * 1e-3) / 1e12
                    vals += [round(tf, 1), round(ours / tf, 3)]
                except RuntimeError as e:  # a backend may refuse a shape or layout: say so
                    print(f"  {name} {layout} {pas} d={d} N={N} causal={causal}: not run ({str(e).splitlines()[0]})")
                    vals += ["n/a", "n/a"]
        print(" ".join(f"{v:>17}" for v in vals), flush=True)
        out_rows.append(vals)
    if out_path:
        write_csv(out_path, header, out_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
