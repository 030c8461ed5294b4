#!/usr/bin/env python3
"""ncu_sass_mix.py — two kernels' per-instruction profiles side by side: the instruction mix, where
the warps stalled, and each kernel's hottest instructions.

Input: the source page of an ncu report as CSV, per kernel (on the GPU machine):
    ncu --section SourceCounters --section WarpStateStats -k regex:NAME --launch-skip 3 --launch-count 1 \\
        -o report PROGRAM ...
    ncu --import report.ncu-rep --page source --csv --print-source sass > NAME_sass.csv

Usage: ncu_sass_mix.py A_sass.csv B_sass.csv [--top N]   (A, B: the two columns of the mix)

Prints, per file: instructions executed and warp-stall samples in all; each stall reason's share
of the samples; the opcodes (without modifiers) by instructions executed, side by side; the
opcodes the MIO-throttle samples fell on; the N instructions with the most samples (address, SASS,
executions, samples by reason). A spinning wait shows as a SYNCS.PHASECHK...TRYWAIT and its BRA
executed far more often than the loop around them; issue pressure on the MIO queue (shared memory,
shuffles, MUFU) as stall_mio on those opcodes.
"""
import argparse
import collections
import csv
import sys

REASONS = ("wait", "barrier", "long_sb", "short_sb", "mio", "math", "dispatch", "selected", "not_selected",
           "no_inst", "branch_resolving", "imc", "lg", "drain", "membar", "misc", "sleep", "tex")


def num(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def load(path):
    """The rows of the source page: one dict per SASS instruction (the first line names the kernel)."""
    try:
        lines = list(csv.reader(open(path)))
    except OSError as e:
        sys.exit(f"ncu_sass_mix.py: {path}: {e.strerror}")
    start = next((i for i, row in enumerate(lines) if row and row[0] == "Address"), None)
    if start is None:
        sys.exit(f"ncu_sass_mix.py: {path}: no 'Address' header line (hint: export it with "
                 "ncu --import REPORT --page source --csv --print-source sass)")
    header = lines[start]
    return [dict(zip(header, row)) for row in lines[start + 1:] if len(row) == len(header)]


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def summary(rows):
    mix, mio, stalls = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r["Source"])
        mix[op] += num(r["Instructions Executed"])
        mio[op] += num(r.get("stall_mio", "0"))
        for reason in REASONS:
            stalls[reason] += num(r.get("stall_" + reason, "0"))
    samples = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in rows)
    return mix, mio, stalls, samples


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="the first kernel's source page (CSV)")
    ap.add_argument("b", help="the second kernel's source page (CSV)")
    ap.add_argument("--top", type=int, default=12, help="hottest instructions listed per kernel")
    args = ap.parse_args(argv[1:])
    data = [(p, load(p)) for p in (args.a, args.b)]
    sums = [summary(rows) for _, rows in data]
    for (path, _), (mix, _, stalls, samples) in zip(data, sums):
        shares = ", ".join(f"{r} {stalls[r] / samples:.3f}" for r in REASONS
                           if samples and stalls[r] / samples >= 0.005)
        print(f"== {path}: {sum(mix.values()):,.0f} instructions executed, {samples:,.0f} samples; stalls: {shares}")
    ops = sorted(set(sums[0][0]) | set(sums[1][0]), key=lambda o: -max(sums[0][0][o], sums[1][0][o]))
    print(f"{'opcode':<12}{'A':>14}{'B':>14}   (instructions executed)")
    for op in ops[:24]:
        print(f"{op:<12}{sums[0][0][op]:>14,.0f}{sums[1][0][op]:>14,.0f}")
    for (path, rows), (_, mio, _, _) in zip(data, sums):
        print(f"== {path}: MIO-throttle samples by opcode: " +
              ", ".join(f"{op} {n:.0f}" for op, n in mio.most_common(5) if n))
        print(f"   the {args.top} instructions with the most samples:")
        for r in sorted(rows, key=lambda r: -num(r["Warp Stall Sampling (All Samples)"]))[:args.top]:
            why = {reason: int(num(r.get("stall_" + reason, "0"))) for reason in REASONS
                   if num(r.get("stall_" + reason, "0")) > 0}
            print(f"   {r['Address']} {num(r['Warp Stall Sampling (All Samples)']):6.0f} samples, executed "
                  f"{num(r['Instructions Executed']):9,.0f}  {r['Source'].strip()[:60]:<60} {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
