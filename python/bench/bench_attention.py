#!/usr/bin/env python3
"""bench_attention.py — flashlab from Python beside PyTorch SDPA on the same tensors, in one process.

Usage (on the GPU machine, from the repository root):
    PYTHONPATH=python python3 python/bench/bench_attention.py [--cli ours.csv] [--c-loop c_loop.txt]
        [--seq 8192] [--dim 128] [--heads 16] [--batch 1] [--reps 30] [--csv out.csv]

Three parts.

1. The cost of a call from Python (host time, no GPU work to speak of): an empty-work shape
   (B = H = N = 1, d = 64, bf16), each call timed alone with time.perf_counter_ns, the median of
   1000 calls (the stream synchronised every 100 calls, outside the timed calls):
     C ABI via ctypes   flashlab_attention_forward called directly with prebuilt arguments;
     C ABI call struct  flashlab_attention_forward_call with a prebuilt flashlab_attention_call;
     impl               the operator's Python body called directly (allocation, arguments, the call);
     op                 torch.ops.flashlab.attention_forward (the custom operator);
     attention          flashlab.attention, inputs without grad (O only: LSE goes to a sink);
     attention, LSE too flashlab.attention_forward (O and LSE, two allocations);
     attention + grad   flashlab.attention, inputs requiring grad (records the autograd node);
     attention_backward flashlab.attention_backward (the ABI's backward call, no autograd);
     backward op        torch.ops.flashlab.attention_backward.
   flashlab.attention and flashlab.attention_backward skip the dispatcher in eager mode (see
   flashlab/torch.py); "op" is the registered operator that torch.compile and CUDA graphs see.
   --c-loop FILE reads the median of the same call timed in a C loop (python/bench/c_call_loop.c).
   Then where the time goes: each piece of the eager path timed alone.
   The overhead of Python is "op" (and "attention") minus the ctypes call, and minus the C loop.

2. Throughput at B, H, N, d (default 1, 16, 8192, 128), bf16, non-causal and causal: the forward
   and the backward of flashlab.attention (the backward also as one flashlab.attention_backward
   call, without the autograd engine) and of SDPA's flash and cuDNN backends, SDPA called on
   the transposed views of the same [B, N, H, d] memory. Method of `flashlab bench attention`
   (cuda/bench/timing_common.py): 3 warm-up + --reps timed calls, each alone between CUDA events,
   L2 flushed before each, 3 input sets rotated, the median. Backward: out.backward(dO,
   retain_graph=True) on a graph made once per input set, gradients set to None outside the timed
   range (so the time is the backward kernels plus what autograd adds). The same calls through the
   C ABI with prebuilt arguments (ctypes) are timed in this process on the same kind of inputs, so
   py/ABI is the package's own cost. With --cli, the rows of `flashlab bench attention --csv` for
   the same shapes are read and the Python/CLI ratio printed.

3. The backward with its host time shown and hidden (host_latency), flashlab and SDPA alike: each
   backward's host time (what its launches wait behind) beside the flush's GPU time, and its GPU
   time after the usual 256 MiB flush and after a 1 GiB one that hides the host time; the ratio
   flashlab / SDPA cuDNN through autograd both ways (rows in <csv>_backward.csv).
"""
import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "cuda" / "bench"))

import flashlab  # noqa: E402
import flashlab.torch as ft  # noqa: E402
from flashlab import _capi, _checks  # noqa: E402
from timing_common import FLUSH_BYTES, median_backward_ms, median_ms  # noqa: E402


def host_median_us(call, n=1000, sync_every=100):
    times = []
    for i in range(n):
        if i % sync_every == 0:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) / 1000.0


def warm_inputs(q, k, v):
    """Copies of q, k, v that require grad, O and LSE of one forward, a dO; then 100 calls of each
    entry the overhead rows time, to warm the caches (problem structs, workspace sizes, the
    allocator)."""
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    o2, lse2 = ft.attention_forward(q, k, v, False, 0.0, False)
    do = torch.randn_like(o2)
    for _ in range(100):
        ft.attention_forward(q, k, v, False, 0.0, False)
        flashlab.attention(qg, kg, vg)
        flashlab.attention(q, k, v)
        ft.attention_backward(do, q, k, v, o2, lse2, False, 0.0, False)
        flashlab.attention_backward(do, q, k, v, o2, lse2)
    return qg, kg, vg, o2, lse2, do


def overhead(c_loop_file):
    q, k, v = (torch.randn(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    lse = torch.empty(1, 1, 1, device="cuda")
    L = _capi.lib()
    p = _checks.attention_problem(1, 1, 1, 1, 1, 64, 0.0, False, _capi.DTYPE_BF16, False)
    args = (p.address, _capi.DEVICE_CUDA, _capi.Tensor(q.data_ptr()), _capi.Tensor(k.data_ptr()),
            _capi.Tensor(v.data_ptr()), _capi.Tensor(o.data_ptr()), lse.data_ptr(), None, 0,
            torch.cuda.current_stream().cuda_stream)
    fwd = L.attention_forward
    assert fwd(*args) == 0, L.last_error()
    call = _capi.AttentionCall(_capi.DEVICE_CUDA)
    call.problem, call.q, call.k, call.v, call.o, call.lse, call.stream = (
        p.address, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), args[-1])
    fwd_call = L.attention_forward_call
    assert fwd_call(call) == 0, L.last_error()
    qg, kg, vg, o2, lse2, do = warm_inputs(q, k, v)
    rows = [
        ("C ABI via ctypes", host_median_us(lambda: fwd(*args))),
        ("C ABI call struct", host_median_us(lambda: fwd_call(call))),
        ("impl, no dispatcher", host_median_us(lambda: ft._attention_forward_impl(q, k, v, False, 0.0, False))),
        ("op", host_median_us(lambda: ft.attention_forward(q, k, v, False, 0.0, False))),
        ("attention", host_median_us(lambda: flashlab.attention(q, k, v))),
        ("attention, LSE too", host_median_us(lambda: flashlab.attention_forward(q, k, v))),
        ("attention + grad", host_median_us(lambda: flashlab.attention(qg, kg, vg))),
        ("attention_backward", host_median_us(lambda: flashlab.attention_backward(do, q, k, v, o2, lse2))),
        ("backward op", host_median_us(lambda: ft.attention_backward(do, q, k, v, o2, lse2, False, 0.0, False))),
    ]
    c_loop = read_c_loop(c_loop_file) if c_loop_file else None
    print("per-call host time, empty-work shape B=H=N=1 d=64 bf16, median of 1000 calls (µs):")
    base = rows[0][1]
    for name, us in rows:
        extra = f"   +{us - base:.2f} vs ctypes" if name != rows[0][0] else ""
        if c_loop is not None and name != rows[0][0]:
            extra += f", +{us - c_loop:.2f} vs the C loop"
        print(f"  {name:20s} {us:8.2f}{extra}")
    if c_loop is not None:
        print(f"  {'C loop':20s} {c_loop:8.2f}")
    slot = _capi.Tensor()
    ptr = q.data_ptr()
    key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, 0, 0, 0, False, None, False)
    plans = {key: None}
    pieces = [
        ("(the timer alone)", lambda: None),
        ("torch.empty_like(q)", lambda: torch.empty_like(q)),
        ("q.new_empty fp32 LSE", lambda: q.new_empty((1, 1, 1), dtype=torch.float32)),
        ("torch.empty(shape, dtype, device)", lambda: torch.empty((1, 1, 1, 64), dtype=torch.bfloat16, device=q.device)),
        ("signature key + lookup", lambda: plans.get((q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
                                                      q.get_device(), k.get_device(), v.get_device(), False, None,
                                                      False))),
        ("eager-mode test", lambda: ft._eager(q, k, v)),
        ("q.requires_grad", lambda: q.requires_grad),
        ("q.is_contiguous()", q.is_contiguous),
        ("q.data_ptr()", q.data_ptr),
        ("struct pointer set", lambda: setattr(slot, "data", ptr)),
        ("current raw stream", lambda: torch._C._cuda_getCurrentRawStream(0)),
    ]
    print("where the time goes (µs, median of 1000, each piece alone):")
    for name, fn in pieces:
        print(f"  {name:34s} {host_median_us(fn):8.2f}")
    return rows, c_loop


def make_sets(B, N, H, d, grad):
    sets = []
    for _ in range(3):
        leaves = [torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16, requires_grad=grad) for _ in range(3)]
        sets.append(leaves)
    return sets


def time_pass(fn, B, N, H, d, backward, reps):
    """Median ms of fn(q, k, v) → O [B, N, H, d] (forward) or of its backward."""
    sets = make_sets(B, N, H, d, backward)
    if not backward:
        with torch.no_grad():
            return median_ms(lambda r: fn(*sets[r % 3]), 3, reps)
    graphs = []
    for leaves in sets:
        out = fn(*leaves)
        graphs.append((out, torch.randn_like(out), leaves))
    return median_backward_ms(graphs, 3, reps)


def sdpa(backend, causal):
    def fn(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal).transpose(1, 2)
    return fn


def read_c_loop(path):
    """The median_us line of c_call_loop's output, or None."""
    for line in Path(path).read_text().splitlines():
        f = line.split()
        if f and f[0] == "median_us":
            return float(f[1])
    return None


def abi_calls(B, N, H, d, causal, backward):
    """One call of flashlab_attention_forward / _backward through ctypes per input set, its
    arguments built beforehand: a list of (function, arguments, the tensors they point to)."""
    L = _capi.lib()
    p = _checks.attention_problem(B, N, N, H, H, d, 0.0, causal, _capi.DTYPE_BF16, False)
    stream = torch.cuda.current_stream().cuda_stream
    T = _capi.Tensor
    nws = p.workspace_bytes("attention_backward_workspace_size", _capi.DEVICE_CUDA, 0)
    calls = []
    for q, k, v in make_sets(B, N, H, d, False):
        o, lse = flashlab.attention_forward(q, k, v, causal=causal)
        do, dq, dk, dv = (torch.randn_like(q) for _ in range(4))
        ws = torch.empty(max(nws, 1), dtype=torch.uint8, device="cuda")
        keep = (q, k, v, o, lse, do, dq, dk, dv, ws)
        if backward:
            args = (p.address, _capi.DEVICE_CUDA, T(q.data_ptr()), T(k.data_ptr()), T(v.data_ptr()), T(o.data_ptr()),
                    lse.data_ptr(), T(do.data_ptr()), T(dq.data_ptr()), T(dk.data_ptr()), T(dv.data_ptr()),
                    ws.data_ptr(), nws, stream)
            calls.append((L.attention_backward, args, keep))
        else:
            args = (p.address, _capi.DEVICE_CUDA, T(q.data_ptr()), T(k.data_ptr()), T(v.data_ptr()), T(o.data_ptr()),
                    lse.data_ptr(), None, 0, stream)
            calls.append((L.attention_forward, args, keep))
    return calls


def abi_call(calls):
    L = _capi.lib()

    def call(r):
        fn, args, _ = calls[r % len(calls)]
        assert fn(*args) == 0, L.last_error()
    return call


def time_abi(B, N, H, d, causal, backward, reps):
    """Median ms of flashlab_attention_forward / _backward called through ctypes with arguments
    built beforehand (the C ABI's own cost; the host time of the call is hidden by the flush)."""
    return median_ms(abi_call(abi_calls(B, N, H, d, causal, backward)), 3, reps)


def time_backward_call(B, N, H, d, causal, reps):
    """Median ms of flashlab.attention_backward (the ABI's call, no autograd engine)."""
    sets = []
    for leaves in make_sets(B, N, H, d, False):
        o, lse = flashlab.attention_forward(*leaves, causal=causal)
        sets.append((torch.randn_like(o), *leaves, o, lse))
    return median_ms(lambda r: flashlab.attention_backward(*sets[r % 3], causal=causal), 3, reps)


def read_cli(path):
    rows = {}
    for r in csv.DictReader(open(path)):
        rows[(r["pass"], int(r["d"]), int(r["causal"]), int(r["N"]), int(r["H"]), int(r["B"]))] = float(r["ms"])
    return rows


def host_latency(B, N, H, d, causal, reps):
    """The backward's host time and its GPU time with the host time shown and hidden, for
    flashlab and SDPA alike. A timed call's range opens when the L2 flush ends; host time beyond
    the flush's GPU time is idle GPU time inside the range. So each backward is timed twice on the
    same graphs: after the usual 256 MiB flush (the method of `flashlab bench attention`), and
    after a 1 GiB one, whose ~4× longer GPU time hides any host time below it, leaving the GPU
    time of the backward's kernels. Backward through autograd: out.backward(dO, retain_graph=True),
    the leaves' gradients set to None outside the timed range (median_backward_ms's method), for
    flashlab.attention and for SDPA's cuDNN and flash backends (called on the transposed views);
    then flashlab's backward as one flashlab.attention_backward call and as the ABI call through
    ctypes with prebuilt arguments. Returns {name: (host µs, ms after 256 MiB, ms after 1 GiB)};
    the rows named "flush …" hold the flush's own GPU time in µs."""
    def graphs(fn):
        out = []
        for leaves in make_sets(B, N, H, d, True):
            o = fn(*leaves)
            out.append((o, torch.randn_like(o), leaves))
        return out

    def autograd(sets):
        def clear(r):
            for x in sets[r % 3][2]:
                x.grad = None

        def call(r):
            o, do, _ = sets[r % 3]
            o.backward(do, retain_graph=True)
        return clear, call

    direct = []
    for leaves in make_sets(B, N, H, d, False):
        o, lse = flashlab.attention_forward(*leaves, causal=causal)
        direct.append((torch.randn_like(o), *leaves, o, lse))
    calls = {
        "flashlab (autograd)": autograd(graphs(lambda q, k, v: flashlab.attention(q, k, v, causal=causal))),
        "SDPA cuDNN (autograd)": autograd(graphs(sdpa(SDPBackend.CUDNN_ATTENTION, causal))),
        "SDPA flash (autograd)": autograd(graphs(sdpa(SDPBackend.FLASH_ATTENTION, causal))),
        "flashlab attention_backward": (None, lambda r: flashlab.attention_backward(*direct[r % 3], causal=causal)),
        "flashlab ABI call": (None, abi_call(abi_calls(B, N, H, d, causal, True))),
    }
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    result = {}
    for flush_bytes in (FLUSH_BYTES, 4 * FLUSH_BYTES):
        flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")
        flush_ms = []
        for _ in range(10):
            e0.record()
            flush.zero_()
            e1.record()
            e1.synchronize()
            flush_ms.append(e0.elapsed_time(e1))
        result[f"flush {flush_bytes >> 20} MiB"] = (statistics.median(flush_ms) * 1e3, None, None)
        for name, (prepare, call) in calls.items():
            ms, host = [], []
            for r in range(3 + reps):
                if prepare is not None:
                    prepare(r)
                flush.zero_()
                e0.record()
                t0 = time.perf_counter_ns()
                call(r)
                t1 = time.perf_counter_ns()
                e1.record()
                e1.synchronize()
                if r >= 3:
                    ms.append(e0.elapsed_time(e1))
                    host.append((t1 - t0) / 1000.0)
            prev = result.get(name, (None, None, None))
            if flush_bytes == FLUSH_BYTES:
                result[name] = (statistics.median(host), statistics.median(ms), None)
            else:
                result[name] = (prev[0], prev[1], statistics.median(ms))
        del flush
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--cli", help="`flashlab bench attention --csv` output for the same shapes")
    ap.add_argument("--c-loop", help="output of c_call_loop (its median_us line)")
    ap.add_argument("--csv", help="write the throughput rows here")
    ap.add_argument("--no-throughput", action="store_true", help="skip part 2 (the call cost and the backward only)")
    a = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"flashlab library {flashlab.library_version()} ({flashlab.library_path()})")
    calls, c_loop = overhead(a.c_loop)
    if a.csv:  # the per-call host times beside the throughput rows: <name>_calls.csv
        with open(Path(a.csv).with_name(Path(a.csv).stem + "_calls.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["call", "host_us", "c_loop_us"])
            w.writerows([name, f"{us:.2f}", f"{c_loop:.2f}" if c_loop else ""] for name, us in calls)

    B, N, H, d = a.batch, a.seq, a.heads, a.dim
    cli = read_cli(a.cli) if a.cli else {}
    out_rows = []
    print(f"\nthroughput, bf16, B={B} H={H} N={N} d={d}; median ms of {a.reps} (L2 flushed); "
          f"SDPA on the transposed views of the same [B, N, H, d] memory")
    print(f"{'pass':4s} {'causal':6s} {'flashlab':>9s} {'direct':>8s} {'SDPA flash':>10s} {'SDPA cuDNN':>10s} "
          f"{'×flash':>7s} {'×cuDNN':>7s} {'TFLOP/s':>8s} {'CLI ms':>8s} {'ABI ms':>8s} {'py/CLI':>7s} {'py/ABI':>7s} "
          f"{'ABI×cuDNN':>9s}")
    for causal in () if a.no_throughput else (False, True):
        for backward in (False, True):
            ours = time_pass(lambda q, k, v: flashlab.attention(q, k, v, causal=causal), B, N, H, d, backward, a.reps)
            direct = time_backward_call(B, N, H, d, causal, a.reps) if backward else ours
            c_abi = time_abi(B, N, H, d, causal, backward, a.reps)
            fl = time_pass(sdpa(SDPBackend.FLASH_ATTENTION, causal), B, N, H, d, backward, a.reps)
            cu = time_pass(sdpa(SDPBackend.CUDNN_ATTENTION, causal), B, N, H, d, backward, a.reps)
            flops = 4 * N * N * d * H * B * (2.5 if backward else 1.0) * (0.5 if causal else 1.0)
            pas = "bwd" if backward else "fwd"
            c = cli.get((pas, d, int(causal), N, H, B))
            ratio = f"{ours / c:7.3f}" if c else f"{'-':>7s}"
            ratio_abi = f"{ours / c_abi:7.3f}" if c_abi else f"{'-':>7s}"
            print(f"{pas:4s} {str(causal):6s} {ours:9.4f} {direct:8.4f} {fl:10.4f} {cu:10.4f} {fl / ours:7.3f} "
                  f"{cu / ours:7.3f} {flops / ours / 1e9:8.1f} {c or float('nan'):8.4f} {c_abi or float('nan'):8.4f} "
                  f"{ratio} {ratio_abi} {cu / c_abi:9.3f}")
            out_rows.append([pas, int(causal), B, H, N, d, ours, direct, fl, cu, c or "", c_abi or ""])
    if a.csv and out_rows:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["pass", "causal", "B", "H", "N", "d", "flashlab_ms", "flashlab_direct_ms", "sdpa_flash_ms",
                        "sdpa_cudnn_ms", "cli_ms", "abi_ms"])
            w.writerows(out_rows)
    print(f"\nthe backward, host time shown and hidden: host µs (median of {a.reps}, the GPU busy with the flush), "
          f"ms after the usual 256 MiB flush and after a 1 GiB one (its longer GPU time hides the host's):")
    lat_rows = []
    for causal in (False, True):
        lat = host_latency(B, N, H, d, causal, a.reps)
        c = cli.get(("bwd", d, int(causal), N, H, B))
        for name, (host, ms, ms_long) in lat.items():
            if ms is None:
                print(f"  causal={str(causal):5s} {name:28s} {host:8.1f} µs of GPU time")
                continue
            vs_cli = f"  /CLI {ms / c:6.3f} {ms_long / c:6.3f}" if c else ""
            print(f"  causal={str(causal):5s} {name:28s} {host:8.1f} µs host {ms:8.4f} ms {ms_long:8.4f} ms{vs_cli}")
            lat_rows.append([int(causal), name, f"{host:.1f}", f"{ms:.4f}", f"{ms_long:.4f}", c or ""])
        fl, cu = lat["flashlab (autograd)"], lat["SDPA cuDNN (autograd)"]
        print(f"  causal={str(causal):5s} flashlab / SDPA cuDNN through autograd: {fl[1] / cu[1]:.3f} (256 MiB), "
              f"{fl[2] / cu[2]:.3f} (1 GiB, host time hidden); host time {fl[0]:.0f} vs {cu[0]:.0f} µs")
    if a.csv:  # <name>_backward.csv: the rows above
        with open(Path(a.csv).with_name(Path(a.csv).stem + "_backward.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["causal", "call", "host_us", "ms_flush_256MiB", "ms_flush_1GiB", "cli_ms"])
            w.writerows(lat_rows)
    print("\nflashlab: flashlab.attention (bwd: out.backward through autograd, as SDPA's); direct: the bwd as one "
          "flashlab.attention_backward call; ×flash, ×cuDNN: SDPA's time / flashlab's (above 1: flashlab faster); "
          "ABI: flashlab_attention_forward/_backward through ctypes with prebuilt arguments, in this process; "
          "py/CLI, py/ABI: flashlab's time here / `flashlab bench attention`'s / the ABI call's; ABI×cuDNN: "
          "SDPA cuDNN's time / the ABI call's (the ratio the Python call keeps, or not, in ×cuDNN)")


if __name__ == "__main__":
    main()
