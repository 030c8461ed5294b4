#!/usr/bin/env python3
"""sustained.py — our attention and SDPA's cuDNN backend under sustained load, with the GPU's clock
and power beside: the rows of cuda/results/sustained.csv.

The benchmarks (`flashlab bench attention`, sdpa_bench.py) time each launch alone after an L2 flush,
so the GPU idles between launches and runs near its top clock. Training keeps it busy: there an
H100 or H200 runs into its power cap and lowers its clock, by how much depends on the kernel's power
per clock. This script runs each kernel back to back (no flush) for SECS seconds while nvidia-smi
samples the SM clock, power and throttle reasons every 50 ms, and reports per phase the time per
call, TFLOP/s, the median and lowest SM clock, the median power and TFLOP/s per GHz.

Usage (on the GPU machine, from the repository root; the library of the build under test):
    FLASHLAB_LIBRARY=.../libflashlab.so python3 cuda/bench/sustained.py OUT_DIR [COMMIT]
    python3 cuda/bench/sustained.py --tabulate OUT_DIR [COMMIT] > sustained.csv

The first form measures (OUT_DIR gets phases.json, smi.csv) and prints the table; the second writes
the CSV from a saved OUT_DIR. Shapes: bf16, B = 1, H = 16, N = 8192, d = 128; forward and backward,
causal and not; ours through the Python package (attention_forward, attention_backward on [B, N, H, d]
tensors), cuDNN through F.scaled_dot_product_attention on the transposed views (its backward by
torch.autograd.grad, no accumulation); ours's backward timed twice, before and after cuDNN's, to
see drift. FLOPs: 4·N²·d·H·B forward, 2.5× that backward, half of either causal.
"""
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

B, H, N, D = 1, 16, 8192, 128
SECS = float(os.environ.get("SECS", "4"))


def measure(out_dir):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import flashlab

    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,"
         "clocks_throttle_reasons.active", "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=open(os.path.join(out_dir, "smi.csv"), "w"))
    dt = torch.bfloat16
    q = torch.randn(B, N, H, D, device="cuda", dtype=dt)
    k, v, do = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
    phases = []

    def run(name, fn, flops):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t0, n = time.time(), 0
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        while time.time() - t0 < SECS:
            for _ in range(10):
                fn()
            n += 10
            torch.cuda.synchronize()
        e1.record()
        torch.cuda.synchronize()
        ms = e0.elapsed_time(e1) / n
        phases.append(dict(name=name, t0=t0, t1=time.time(), ms=ms, tflops=flops / ms / 1e9))
        print(f"{name}: {ms:.4f} ms a call, {flops / ms / 1e9:.1f} TFLOP/s over {n} calls", flush=True)
        time.sleep(1.0)

    fwd_flops = 4 * N * N * D * H * B
    for causal in (False, True):
        c = 0.5 if causal else 1.0
        o, lse = flashlab.attention_forward(q, k, v, causal=causal)
        run(f"ours_fwd_c{int(causal)}", lambda: flashlab.attention_forward(q, k, v, causal=causal), fwd_flops * c)
        run(f"ours_bwd_c{int(causal)}", lambda: flashlab.attention_backward(do, q, k, v, o, lse, causal=causal),
            2.5 * fwd_flops * c)
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            with torch.no_grad():
                run(f"cudnn_fwd_c{int(causal)}",
                    lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           is_causal=causal), fwd_flops * c)
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            run(f"cudnn_bwd_c{int(causal)}",
                lambda: torch.autograd.grad(out, (qt, kt, vt), do.transpose(1, 2), retain_graph=True),
                2.5 * fwd_flops * c)
        run(f"ours_bwd_c{int(causal)}_again", lambda: flashlab.attention_backward(do, q, k, v, o, lse, causal=causal),
            2.5 * fwd_flops * c)
    smi.terminate()
    json.dump(phases, open(os.path.join(out_dir, "phases.json"), "w"))


def tabulate(out_dir, commit):
    """One row per phase: the samples taken from half a second after its start to its end."""
    phases = json.load(open(os.path.join(out_dir, "phases.json")))
    samples = []
    for r in csv.reader(open(os.path.join(out_dir, "smi.csv"))):
        try:
            t = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
            samples.append((t.timestamp(), float(r[1]), float(r[3]), r[5].strip()))
        except (ValueError, IndexError):
            continue  # a line nvidia-smi could not fill
    device = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                            text=True).stdout.strip().splitlines() if not os.environ.get("DEVICE") else [os.environ["DEVICE"]]
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["date", "device", "commit", "kernel", "pass", "causal", "d", "N", "H", "B", "ms", "tflops",
                "sm_mhz_median", "sm_mhz_min", "power_w_median", "throttle_reasons", "tflops_per_ghz"])
    for p in phases:
        s = [x for x in samples if p["t0"] + 0.5 < x[0] < p["t1"]]
        if not s:
            continue
        kernel, pas, causal = p["name"].split("_")[0], p["name"].split("_")[1], p["name"].split("_")[2][1]
        mhz = statistics.median(x[1] for x in s)
        when = datetime.datetime.fromtimestamp(p["t0"], datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
        w.writerow([when, (device or ["unknown"])[0], commit, kernel + ("_again" if p["name"].endswith("again") else ""),
                    pas, causal, D, N, H, B, f"{p['ms']:.4f}", f"{p['tflops']:.1f}", f"{mhz:.0f}",
                    f"{min(x[1] for x in s):.0f}", f"{statistics.median(x[2] for x in s):.1f}",
                    " ".join(sorted(set(x[3] for x in s))), f"{p['tflops'] / mhz * 1000:.1f}"])


def main(argv):
    if len(argv) >= 3 and argv[1] == "--tabulate":
        tabulate(argv[2], argv[3] if len(argv) > 3 else "unknown")
        return 0
    if len(argv) < 2 or argv[1].startswith("-"):
        print(__doc__)
        return 2
    os.makedirs(argv[1], exist_ok=True)
    measure(argv[1])
    tabulate(argv[1], argv[2] if len(argv) > 2 else "unknown")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
