#!/usr/bin/env python3
"""bwd_large_logits.py — the fast backward's P at large logits: a float32 simulation of its
exponent, the inputs the CLI reads, and PyTorch SDPA's backward on them for comparison.

    python3 cuda/bench/bwd_large_logits.py simulate
        the backward's top P of one-hot rows (±800 inputs, d = 128) as the kernels form it,
        2^(fma(S, scale·log2 e, −LSE)), and with the product rounded first, 2^(fl(S·scale·log2 e) − LSE),
        against the exact softmax of the same fp32 scores (CPU, NumPy only)
    python3 cuda/bench/bwd_large_logits.py inputs DIR D {signs|uniform}
        q, k of magnitude 800 (the signs ±800, or uniform in ±800), v and dO standard normal,
        [1, 512, 2, D] float32 .npy in DIR, for `flashlab attention bwd --device cuda --kernel fast
        --inputs DIR [--bwd-kernel K]`
    python3 cuda/bench/bwd_large_logits.py sdpa DIR [--causal]
        SDPA's backward (cuDNN and flash, bf16) on DIR's inputs rounded to bf16 against float64 SDPA
        on the same values: max |got − ref| / max |ref| per gradient, and that over the rounding
        floor (the float64 gradient merely rounded to bf16), as the CLI prints them (GPU, torch)

Results: docs/cuda.md, "The backward at large logits".
"""
import sys

import numpy as np


def simulate(rows=2000, d=128, seed=1):
    f32 = np.float32
    rng = np.random.default_rng(seed)
    sl = f32(1 / np.sqrt(d) * 1.4426950408889634)  # scale·log2 e as the kernels hold it
    worst = {"fma": 1.0, "rounded": 1.0}
    zmax = 0.0
    for _ in range(rows):
        q = rng.uniform(-800, 800, d).astype(f32)
        K = rng.uniform(-800, 800, (64, d)).astype(f32)
        S = (K.astype(np.float64) @ q.astype(np.float64)).astype(f32)  # fp32 scores
        exact = S.astype(np.float64) * np.float64(sl)  # the product of two floats is exact in float64
        # The forward: m = fl(rowmax(S)·sl), P = 2^(fma(S, sl, −m)) (one rounding), LSE = fl(m + log2 l).
        m = f32(S.max() * sl)
        l = np.exp2((exact - np.float64(m)).astype(f32).astype(np.float64)).astype(f32).sum(dtype=f32)
        lse = f32(m + f32(np.log2(l)))
        z = exact - exact.max()
        p_true = np.exp2(z) / np.exp2(z).sum()
        top = int(S.argmax())
        got = {"fma": np.exp2(np.float64(f32(exact[top] - np.float64(lse)))),
               "rounded": np.exp2(np.float64(f32(f32(S[top] * sl) - lse)))}
        for k, v in got.items():
            r = v / p_true[top]
            worst[k] = max(worst[k], r, 1 / r)
        zmax = max(zmax, float(np.abs(exact).max()))
    print(f"{rows} rows of ±800 inputs, d = {d}: |S·scale·log2 e| up to {zmax:.3g}")
    print(f"  top P / exact, worst factor: fma(S, sl, -LSE) {worst['fma']:.4f}; fl(S·sl) - LSE {worst['rounded']:.4f}")


def inputs(out, d, kind, seed=800):
    import os
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed + d)
    for name in ("q", "k"):
        x = rng.uniform(-800, 800, (1, 512, 2, d))
        np.save(f"{out}/{name}.npy", (np.sign(x) * 800 if kind == "signs" else x).astype(np.float32))
    for name in ("v", "do"):
        np.save(f"{out}/{name}.npy", rng.standard_normal((1, 512, 2, d)).astype(np.float32))


def sdpa(src, causal):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional

    def rel(a, b):
        return ((a.double() - b).abs().max() / b.abs().max()).item()

    t = {n: torch.from_numpy(np.load(f"{src}/{n}.npy")).cuda().transpose(1, 2) for n in ("q", "k", "v", "do")}
    b = {n: x.to(torch.bfloat16) for n, x in t.items()}
    x64 = [b[n].double().requires_grad_() for n in ("q", "k", "v")]
    F.scaled_dot_product_attention(*x64, is_causal=causal).backward(b["do"].double())
    ref = [x.grad for x in x64]
    floor = [rel(r.to(torch.bfloat16), r) for r in ref]
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        xs = [b[n].clone().requires_grad_() for n in ("q", "k", "v")]
        with sdpa_kernel([backend]):
            F.scaled_dot_product_attention(*xs, is_causal=causal).backward(b["do"])
        errs = [rel(x.grad, r) for x, r in zip(xs, ref)]
        print(f"sdpa {name} causal={int(causal)}: " + ", ".join(
            f"{g} {e:.2e} ({e / f:.1f} x the floor)" for g, e, f in zip(("dQ", "dK", "dV"), errs, floor)))


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "simulate":
        simulate()
    elif mode == "inputs" and len(sys.argv) == 5 and sys.argv[4] in ("signs", "uniform"):
        inputs(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif mode == "sdpa" and len(sys.argv) in (3, 4):
        sdpa(sys.argv[2], "--causal" in sys.argv[3:])
    else:
        sys.exit(__doc__)
