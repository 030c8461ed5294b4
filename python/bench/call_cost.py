#!/usr/bin/env python3
"""call_cost.py — the host time of one flashlab call from Python, piece by piece, and its floor.

Usage (on the GPU machine, from the repository root, pinned to one core as measure.sh does):
    PYTHONPATH=python python3 python/bench/call_cost.py [--c-loop c_loop.txt] [--calls 2000] [--csv out.csv]

Every row is the median of --calls calls, each timed alone with time.perf_counter_ns (the stream
synchronised every 100 calls, outside the timed calls), on the empty-work shape of
bench_attention.py and c_call_loop.c: B = H = N = 1, d = 64, bf16, so the GPU's work is nil and
the time is the host's.

1. The floor: what no Python caller of the C ABI can go below on this machine.
   - a ctypes call that only crosses the boundary: flashlab_abi_version(), which reads no
     argument, declared with the argument types of the forward (ten arguments, four of them
     flashlab_tensor structs by value) and of flashlab_attention_forward_call (one pointer), its
     arguments prebuilt: ctypes' conversion, the libffi call, the GIL's release and return;
   - torch.empty_like / torch.empty / Tensor.new_empty of O's shape on CUDA (every call must
     return a new O);
   - the two together;
   - the real forward through ctypes, both entries, arguments prebuilt or set per call.
   With --c-loop, the median of the same forward called from C (c_call_loop.c) is the baseline.
2. The package's calls: flashlab.attention (no grad; with grad), flashlab.attention_forward,
   flashlab.attention_backward, and the registered operator.
3. The pieces of the eager path, each alone (tensor attribute reads, the signature lookup, the
   struct's fields, the stream).
4. The autograd engine's own cost beside the package's, at B = 1, H = 16, N = 8192, d = 128
   (--big-seq): the host time of out.backward() for flashlab's node and for nodes that do
   (almost) nothing — a C++ node (x * 1), a Python autograd.Function that returns its gradient,
   and one shaped like flashlab's (three inputs, two outputs, five saved tensors, three gradients
   allocated) without the library call — and where flashlab's time goes inside the backward
   (from out.backward() to the node's Python code, the package's backward, back to the caller).
"""
import argparse
import csv
import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import flashlab  # noqa: E402
import flashlab.torch as ft  # noqa: E402
from flashlab import _capi, _checks  # noqa: E402
from bench_attention import host_median_us, read_c_loop, warm_inputs  # noqa: E402  (this script's folder)


def section(title, rows, n, out, base=None):
    print(f"\n{title} (µs, median of {n} calls):")
    for name, fn in rows:
        try:
            us = host_median_us(fn, n)
        except Exception as e:  # a row that cannot run says why; the others still run
            print(f"  {name:58s}   failed: {type(e).__name__}: {e}")
            continue
        extra = f"   +{us - base:.2f} over the C loop" if base is not None else ""
        print(f"  {name:58s} {us:8.2f}{extra}")
        out.append((title.split(":")[0], name, us))


def small_shape():
    q, k, v = (torch.randn(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    return q, k, v


def floor_rows(q, k, v):
    L = _capi.lib()
    o = torch.empty_like(q)
    lse = torch.empty(1, 1, 1, device="cuda")
    p = _checks.attention_problem(1, 1, 1, 1, 1, 64, 0.0, False, _capi.DTYPE_BF16, False)
    stream = torch.cuda.current_stream().cuda_stream
    T = _capi.Tensor
    args = (p.address, _capi.DEVICE_CUDA, T(q.data_ptr()), T(k.data_ptr()), T(v.data_ptr()), T(o.data_ptr()),
            lse.data_ptr(), None, 0, stream)
    fwd = L.attention_forward
    assert fwd(*args) == 0, L.last_error()
    call = _capi.AttentionCall(_capi.DEVICE_CUDA)
    call.problem, call.q, call.k, call.v, call.o, call.lse, call.stream = (
        p.address, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), stream)
    fwd_call = L.attention_forward_call
    assert fwd_call(call) == 0, L.last_error()
    # flashlab_abi_version() reads no argument: declared with the forward's argument types, a call
    # of it is the boundary crossing alone (x86-64: extra arguments are the caller's to pass).
    noop_args = L._dll["flashlab_abi_version"]
    noop_args.restype, noop_args.argtypes = ctypes.c_int, fwd.argtypes
    noop_call = L._dll["flashlab_abi_version"]
    noop_call.restype, noop_call.argtypes = ctypes.c_int, fwd_call.argtypes
    noop_none = L._dll["flashlab_abi_version"]
    noop_none.restype, noop_none.argtypes = ctypes.c_int, []
    qp, kp, vp, op, lp, pa = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), p.address
    slots = [T() for _ in range(4)]
    raw = ft._raw_stream
    shape = tuple(q.shape)

    def set_fields():
        call.problem = pa
        call.q = qp
        call.k = kp
        call.v = vp
        call.o = op
        call.lse = lp
        call.stream = raw(0)

    def noop_call_set():
        set_fields()
        return noop_call(call)

    def fwd_call_set():
        set_fields()
        return fwd_call(call)

    def fwd_args_set():
        s0, s1, s2, s3 = slots
        s0.data, s1.data, s2.data, s3.data = qp, kp, vp, op
        return fwd(pa, 1, s0, s1, s2, s3, lp, None, 0, raw(0))

    def fwd_args_build():
        return fwd(pa, 1, T(qp), T(kp), T(vp), T(op), lp, None, 0, raw(0))

    def with_o(fn):  # O allocated, the struct's fields set, then fn(struct): what every call does
        def run():
            x = torch.empty_like(q)
            set_fields()
            call.o = x.data_ptr()
            fn(call)
            return x
        return run

    return [
        ("(the timer alone)", lambda: None),
        ("ctypes, no argument (flashlab_abi_version)", noop_none),
        ("ctypes no-op, the forward's 10 arguments prebuilt", lambda: noop_args(*args)),
        ("ctypes no-op, 1 call struct", lambda: noop_call(call)),
        ("ctypes no-op, 1 call struct, its 7 fields set", noop_call_set),
        ("torch.empty_like(q) (O)", lambda: torch.empty_like(q)),
        ("q.new_empty(O's shape)", lambda: q.new_empty(shape)),
        ("torch.empty(shape, dtype=, device=)", lambda: torch.empty(shape, dtype=q.dtype, device=q.device)),
        ("torch.empty_strided(shape, stride, dtype=, device=)",
         lambda: torch.empty_strided(shape, (64, 64, 64, 1), dtype=q.dtype, device=q.device)),
        ("floor: empty_like + no-op call struct (fields set)", with_o(noop_call)),
        ("forward, argument list prebuilt", lambda: fwd(*args)),
        ("forward, argument list, structs' pointers set", fwd_args_set),
        ("forward, argument list, structs built", fwd_args_build),
        ("forward_call, struct prebuilt", lambda: fwd_call(call)),
        ("forward_call, its 7 fields set", fwd_call_set),
        ("forward_call + empty_like (what any Python call must do)", with_o(fwd_call)),
    ], (o, lse, p, call, args)


def package_rows(q, k, v):
    qg, kg, vg, o2, lse2, do = warm_inputs(q, k, v)
    return [
        ("flashlab.attention(q, k, v)", lambda: flashlab.attention(q, k, v)),
        ("flashlab.torch.attention(q, k, v)", lambda: ft.attention(q, k, v)),
        ("flashlab.attention_forward (O and LSE)", lambda: flashlab.attention_forward(q, k, v)),
        ("flashlab.attention, inputs requiring grad", lambda: flashlab.attention(qg, kg, vg)),
        ("flashlab.attention_backward", lambda: flashlab.attention_backward(do, q, k, v, o2, lse2)),
        ("torch.ops.flashlab.attention_forward", lambda: ft.attention_forward(q, k, v, False, 0.0, False)),
    ], (qg, kg, vg, o2, lse2, do)


def piece_rows(q, k, v, call):
    plans = {(q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, 0, 0, 0, False, None, False, (-1, -1)): None}
    ptr = q.data_ptr()
    slot = _capi.Tensor()
    tls = ft._tls
    ft._cuda_calls()
    return [
        ("signature key + lookup (13 fields)",
         lambda: plans.get((q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(),
                            v.get_device(), False, None, False, (-1, -1)))),
        ("q.shape", lambda: q.shape),
        ("q.dtype", lambda: q.dtype),
        ("q.get_device()", q.get_device),
        ("q.device", lambda: q.device),
        ("q.is_cuda", lambda: q.is_cuda),
        ("eager-mode test", lambda: ft._eager(q, k, v)),
        ("torch.compiler.is_compiling()", ft._is_compiling),
        ("torch.is_grad_enabled()", torch.is_grad_enabled),
        ("q.requires_grad", lambda: q.requires_grad),
        ("q.is_contiguous()", q.is_contiguous),
        ("q.data_ptr()", q.data_ptr),
        ("flashlab_tensor pointer set", lambda: setattr(slot, "data", ptr)),
        ("call struct field set", lambda: setattr(call, "q", ptr)),
        ("thread-local call struct fetch", lambda: tls.fwd),
        ("torch._C._cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0)),
        ("torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream().cuda_stream),
    ]


class _Identity(torch.autograd.Function):
    """A Python node that does nothing: the engine's cost for any Python node."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


class _Shaped(torch.autograd.Function):
    """A node shaped like flashlab's (three inputs and a constant, two outputs, five saved tensors,
    three gradients allocated), without the library's call: the engine's and Python's part of
    flashlab's backward."""

    @staticmethod
    def forward(ctx, q, k, v, plan):
        o, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, g, g_lse):
        q, k, v, o, lse = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


def engine_rows(B, N, H, d, reps):
    """{name: host µs of out.backward(dO, retain_graph=True)} with the GPU busy with a 256 MiB
    flush, as in the timing; and flashlab's backward split at the node's Python code."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def leaves():
        return [torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]

    graphs = {}
    q, k, v = leaves()
    out = flashlab.attention(q, k, v)
    graphs["flashlab.attention"] = (out, torch.randn_like(out), (q, k, v))
    graphs["C++ node (x * 1.0), no Python"] = (q * 1.0, torch.randn_like(out), (q,))
    graphs["Python node returning its gradient"] = (_Identity.apply(q), torch.randn_like(out), (q,))
    o, _ = _Shaped.apply(q, k, v, None)
    graphs["Python node shaped like flashlab's, no library call"] = (o, torch.randn_like(out), (q, k, v))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        s = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                             v.transpose(1, 2)).transpose(1, 2)
    graphs["SDPA cuDNN"] = (s, torch.randn_like(out), (q, k, v))
    stamps = []
    inner = ft._backward_run

    def stamped(*a):
        stamps.append(time.perf_counter_ns())
        r = inner(*a)
        stamps.append(time.perf_counter_ns())
        return r

    result = {}
    for name, (y, g, xs) in graphs.items():
        host = []
        split = []
        for r in range(3 + reps):
            for x in (q, k, v):
                x.grad = None
            flush.zero_()
            if name == "flashlab.attention":
                ft._backward_run = stamped
                stamps.clear()
            t0 = time.perf_counter_ns()
            y.backward(g, retain_graph=True)
            t1 = time.perf_counter_ns()
            ft._backward_run = inner
            torch.cuda.synchronize()
            if r >= 3:
                host.append((t1 - t0) / 1000.0)
                if name == "flashlab.attention" and len(stamps) == 2:
                    split.append(((stamps[0] - t0) / 1000.0, (stamps[1] - stamps[0]) / 1000.0,
                                  (t1 - stamps[1]) / 1000.0))
        result[name] = statistics.median(host)
        if split:
            result["  flashlab: out.backward() → the package's backward"] = statistics.median(s[0] for s in split)
            result["  flashlab: the package's backward (_backward_run)"] = statistics.median(s[1] for s in split)
            result["  flashlab: its return → out.backward() returns"] = statistics.median(s[2] for s in split)
    del flush
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--c-loop", help="output of c_call_loop (its median_us line)")
    ap.add_argument("--big-seq", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--csv", help="write every row here (section, name, µs)")
    a = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, Python {sys.version.split()[0]}, "
          f"flashlab library {flashlab.library_version()} ({flashlab.library_path()})")
    c_loop = read_c_loop(a.c_loop) if a.c_loop else None
    if c_loop is not None:
        print(f"the C loop (c_call_loop, flashlab_attention_forward from C): {c_loop:.2f} µs")
    q, k, v = small_shape()
    out = []
    rows, keep = floor_rows(q, k, v)
    section("1. the floor: ctypes and allocation", rows, a.calls, out, c_loop)
    rows, keep2 = package_rows(q, k, v)
    section("2. the package's calls", rows, a.calls, out, c_loop)
    section("3. pieces of the eager path", piece_rows(q, k, v, keep[3]), a.calls, out)
    print(f"\n4. host time of out.backward(dO) at B=1 H=16 N={a.big_seq} d=128 bf16, the GPU busy with a 256 MiB "
          f"flush (µs, median of {a.reps}):")
    try:
        for name, us in engine_rows(1, a.big_seq, 16, 128, a.reps).items():
            print(f"  {name:58s} {us:8.1f}")
            out.append(("4. backward host time", name.strip(), us))
    except Exception as e:
        print(f"  failed: {type(e).__name__}: {e}")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["section", "call", "host_us", "c_loop_us"])
            w.writerows([s, n, f"{us:.2f}", f"{c_loop:.2f}" if c_loop else ""] for s, n, us in out)


if __name__ == "__main__":
    main()
