#!/usr/bin/env python3
"""bwd_timeline.py — the kernels of one backward call, ours beside SDPA's cuDNN backend: what each
launch costs (CUPTI, through torch.profiler), and the gaps between them. The rows of
cuda/results/bwd_timeline.csv.

A backward is more than its main kernel: D_i = rowsum(dO_i ∘ O_i), the zeroed fp32 dQ accumulator
and the conversion of that accumulator to 16 bits come before and after it. At N = 1024 they were
a third of our call; this script shows each piece beside cuDNN's.

Usage (on the GPU machine, from the repository root; the library of the build under test):
    FLASHLAB_LIBRARY=.../libflashlab.so python3 cuda/bench/bwd_timeline.py [COMMIT] > timeline.log
    python3 cuda/bench/bwd_timeline.py --from-log timeline.log DATE DEVICE COMMIT > bwd_timeline.csv

Method: per case 3 untimed calls, then 4 calls under the profiler, each after a 256 MiB write
(the L2 flush; its kernel splits the trace into calls); printed: the span of each call (first
kernel's start to the last one's end) and the last call's kernels with their start, the gap
before each and its duration, in µs. Cases: bf16, B = 1, H = 16, d = 128: N = 1024, 2048, 8192
without a mask, 1024 and 8192 causal (ours: flashlab.attention_backward; cuDNN: torch.autograd.grad
of SDPA's output, so its gaps include autograd's host work), N = 2048 forward, and the packed
backward over 16 sequences of 913 … 8192 tokens (varlen_lengths.py's mixed set), causal and not.
"""
import itertools
import json
import os
import re
import sys
import tempfile

MIXED = [8192, 7168, 6656, 6000, 5500, 5000, 4500, 4096, 3900, 3500, 3000, 2500, 2000, 1500, 1111, 913]


def short_name(name):
    """The kernel's function name without namespaces, template arguments or parameters."""
    if name.startswith("Memset"):
        return "memset"
    base = name.replace("void ", "", 1).replace("(anonymous namespace)::", "")
    base = re.sub(r"\(.*$", "", re.sub(r"<.*", "", base))
    return base.split("::")[-1]


def timeline(case, fn, flush, tmp, reps=4, details=False):
    """Profile `reps` calls of fn (each after the L2 flush, whose kernel splits the trace into
    calls) and print the span of each call and the last call's kernels: start, gap before, duration
    in µs; with details, each kernel's grid, block, registers per thread and shared memory."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            torch.cuda.synchronize()
            fn()
            torch.cuda.synchronize()
    path = os.path.join(tmp, case + ".json")
    prof.export_chrome_trace(path)
    events = [e for e in json.load(open(path))["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    events.sort(key=lambda e: e["ts"])
    calls, cur = [], None
    for e in events:
        if e["cat"] == "kernel" and "FillFunctor" in e["name"] and e["dur"] > 40:  # the flush
            if cur:
                calls.append(cur)
            cur = []
        elif cur is not None:
            cur.append(e)
    if cur:
        calls.append(cur)
    spans = [round(c[-1]["ts"] + c[-1]["dur"] - c[0]["ts"], 1) for c in calls if c]
    print(f"== {case}: span per call (us) {spans}")
    last = calls[-1]
    t0 = prev = last[0]["ts"]
    for e in last:
        extra = ""
        if details:
            a = e.get("args", {})
            grid, block = a.get("grid", [0, 0, 0]), a.get("block", [0, 0, 0])
            extra = (f" | grid {'x'.join(map(str, grid))} block {'x'.join(map(str, block))}"
                     f" regs {a.get('registers per thread', 0)} smem {a.get('shared memory', 0)}")
        print(f"   +{e['ts'] - t0:8.1f} gap {e['ts'] - prev:6.1f} dur {e['dur']:8.1f}  {e['name'][:110]}{extra}")
        prev = e["ts"] + e["dur"]
    sys.stdout.flush()


def measure():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import flashlab

    dt = torch.bfloat16
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    tmp = tempfile.mkdtemp()

    def timeline_of(case, fn):
        timeline(case, fn, flush, tmp)

    B, H, d = 1, 16, 128
    for N, causal in ((1024, False), (2048, False), (8192, False), (1024, True), (8192, True)):
        q = torch.randn(B, N, H, d, device="cuda", dtype=dt)
        k, v, do = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
        o, lse = flashlab.attention_forward(q, k, v, causal=causal)
        timeline_of(f"ours_bwd_{N}_c{int(causal)}",
                    lambda: flashlab.attention_backward(do, q, k, v, o, lse, causal=causal))
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            timeline_of(f"cudnn_bwd_{N}_c{int(causal)}",
                     lambda: torch.autograd.grad(out, (qt, kt, vt), do.transpose(1, 2), retain_graph=True))
        if N == 2048 and not causal:
            timeline_of(f"ours_fwd_{N}", lambda: flashlab.attention_forward(q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
                timeline_of(f"cudnn_fwd_{N}", lambda: F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)))
    cu = torch.tensor([0] + list(itertools.accumulate(MIXED)), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(MIXED), H, d, device="cuda", dtype=dt)
    k, v, do = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
    for causal in (False, True):
        o, lse = flashlab.attention_varlen_forward(q, k, v, cu, cu, max(MIXED), max(MIXED), causal=causal)
        timeline_of(f"ours_packed_bwd_c{int(causal)}", lambda: flashlab.attention_varlen_backward(
            do, q, k, v, o, lse, cu, cu, max(MIXED), max(MIXED), causal=causal))


def log_rows(path):
    """The printed timelines → one tuple per kernel of each case's last call: case, spans, index,
    kernel, start, gap, duration, then (where timeline() printed them) grid, block, registers, SRAM."""
    case, spans, index = None, "", 0
    for line in open(path):
        m = re.match(r"== (\S+): span per call \(us\) \[(.*)\]", line)
        if m:
            case, spans, index = m.group(1), m.group(2).replace(",", ""), 0
            continue
        m = re.match(r"\s+\+\s*([\d.]+) gap\s+([\d.-]+) dur\s+([\d.]+)\s+(.*?)"
                     r"(?: \| grid (\S+) block (\S+) regs (\d+) smem (\d+))?$", line)
        if m and case:
            launch = m.group(5, 6, 7, 8) if m.group(5) else ()
            yield (case, spans, index, short_name(m.group(4)), *m.group(1, 2, 3), *launch)
            index += 1


def from_log(path, date, device, commit):
    """The printed timelines → CSV rows: one per kernel of each case's last call."""
    import csv
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["date", "device", "commit", "case", "spans_us", "index", "kernel", "start_us", "gap_us", "dur_us"])
    for row in log_rows(path):
        w.writerow([date, device, commit, *row[:7]])


def cli(argv, doc, measure_fn, from_log_fn):
    """--from-log LOG DATE DEVICE COMMIT: the CSV of a printed log; another option: the usage (doc)
    and exit status 2; else measure and print (a positional argument, the commit, is only a label)."""
    if len(argv) >= 6 and argv[1] == "--from-log":
        from_log_fn(argv[2], argv[3], argv[4], argv[5])
        return 0
    if len(argv) > 1 and argv[1].startswith("-"):
        print(doc)
        return 2
    measure_fn()
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv, __doc__, measure, from_log))
