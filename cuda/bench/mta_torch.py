#!/usr/bin/env python3
"""mta_torch.py — the unfused PyTorch Multi-Token Attention on the shapes of `flashlab bench mta
--csv`, in the same run, and the ratios to flashlab's rows.

Usage (on the GPU machine, after `flashlab bench mta --csv > ours.csv`, one or more sweeps
concatenated; repeated header lines are skipped):
    python3 cuda/bench/mta_torch.py ours.csv [more.csv ...] [--reps 10] [--out torch.csv]

The implementation (the definition, written the obvious way; causal, as MTA is):
    S = scale · Q Kᵀ                       materialised, [B, H, N, N]
    S[j > i] = 0                           causal zeros before the convolution
    Ŝ = conv2d(pad(S), W, groups = H)      cq × ck per head: Pq = cq − 1 zero rows above,
                                           Pk = (ck − 1)/2 zero columns each side (cross-correlation)
    Ŝ[j > i] = −∞; P = softmax(Ŝ); O = P V
Q, K, V are [B, N, H, d] as flashlab's and used through transposed views; W is [H, cq, ck].
Passes: fwd (under no_grad) and fwd+bwd (Q, K, V, W require grad; O.backward(dO), grads set to
None outside the timed range). Dtypes: fp32 (the anchor) and bf16. Method as flashlab's bench:
3 warm-up calls, then --reps timed calls each alone between CUDA events, L2 flushed (256 MiB
zero_() and a read of it, timing_common.flush_l2) before each, inputs rotated over 3 sets; median reported. Peak memory: the peak of
torch.cuda.max_memory_allocated() over one call, minus what was allocated before it (inputs
and, for fwd+bwd, nothing else), in GiB.
Output: one line per (shape, dtype, pass) with torch's median, peak memory and torch/flashlab
(how many times faster flashlab's row of the same shape and pass is); --out writes them as CSV.
"""
import statistics
import sys

import torch
import torch.nn.functional as F

from timing_common import FLUSH_BYTES, flush_l2, write_csv


def mta_forward(q, k, v, w, scale):
    """q, k, v: [B, H, N, d]; w: [H, cq, ck]. The unfused MTA forward."""
    n = q.shape[2]
    cq, ck = w.shape[1], w.shape[2]
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = s.masked_fill(future, 0.0)
    s = F.pad(s, ((ck - 1) // 2, (ck - 1) // 2, cq - 1, 0))
    s_hat = F.conv2d(s, w.unsqueeze(1), groups=w.shape[0])
    s_hat = s_hat.masked_fill(future, float("-inf"))
    return torch.matmul(torch.softmax(s_hat, dim=-1), v)


def make_set(B, N, H, d, cq, ck, dtype, grad):
    def leaf(*shape, std=1.0):
        return (torch.randn(*shape, device="cuda", dtype=torch.float32) * std).to(dtype).requires_grad_(grad)

    q, k, v = leaf(B, N, H, d), leaf(B, N, H, d), leaf(B, N, H, d)
    w = leaf(H, cq, ck, std=0.5)
    return q, k, v, w


def time_mta(B, N, H, d, cq, ck, dtype, backward, reps):
    # timing_common.median_ms's method, written out: each call's peak memory is read between
    # the flush and the call, which that shared loop has no place for.
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    scale = d ** -0.5
    sets = [make_set(B, N, H, d, cq, ck, dtype, backward) for _ in range(3)]
    d_o = torch.randn(B, H, N, d, device="cuda", dtype=dtype)
    times, peak = [], 0.0
    for r in range(3 + reps):
        q, k, v, w = sets[r % 3]
        for t in (q, k, v, w):
            t.grad = None
        flush_l2(flush)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        e0.record()
        if backward:
            o = mta_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), w, scale)
            o.backward(d_o)
        else:
            with torch.no_grad():
                o = mta_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), w, scale)
        e1.record()
        e1.synchronize()
        peak = max(peak, (torch.cuda.max_memory_allocated() - before) / 2**30)
        del o
        if r >= 3:
            times.append(e0.elapsed_time(e1))
    return statistics.median(times), peak


def read_ours(path):
    rows, header = [], None
    for line in open(path):
        if line.startswith("kernel,"):
            header = line.strip().split(",")
            continue
        if header and line.strip():
            rows.append(dict(zip(header, line.strip().split(","))))
    return rows


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    args, paths = sys.argv[1:], []
    while args:
        a = args.pop(0)
        if a in ("--reps", "--out"):
            args.pop(0)  # the flag's value
        else:
            paths.append(a)
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 10
    out_path = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    ours = [row for p in paths for row in read_ours(p)]
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    fast = {}
    for r in ours:
        if r["kernel"] == "fast":
            fast[(r["pass"], int(r["cq"]), int(r["ck"]), int(r["d"]), int(r["N"]), int(r["H"]), int(r["B"]))] = float(r["ms"])
    shapes = sorted({key[1:] for key in fast})
    header = ["dtype", "pass", "cq", "ck", "d", "N", "H", "B", "torch_ms", "torch_peak_gib", "flashlab_ms", "torch/flashlab"]
    print(" ".join(f"{h:>14}" for h in header))
    out_rows = []
    for cq, ck, d, N, H, B in shapes:
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            for pas in ("fwd", "fwd+bwd"):
                try:
                    ms, peak = time_mta(B, N, H, d, cq, ck, dtype, pas == "fwd+bwd", reps)
                except RuntimeError as e:  # out of memory at large N: say so
                    print(f"  {name} {pas} {cq}x{ck} d={d} N={N}: not run ({str(e).splitlines()[0]})")
                    torch.cuda.empty_cache()
                    continue
                mine = fast.get((pas, cq, ck, d, N, H, B))
                ratio = round(ms / mine, 1) if mine else "n/a"
                vals = [name, pas, cq, ck, d, N, H, B, round(ms, 3), round(peak, 3), mine if mine else "n/a", ratio]
                print(" ".join(f"{v:>14}" for v in vals), flush=True)
                out_rows.append(vals)
                torch.cuda.empty_cache()
    if out_path:
        write_csv(out_path, header, out_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
