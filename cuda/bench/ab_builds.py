#!/usr/bin/env python3
"""ab_builds.py — the table of an ab_builds.sh run: per shape, each build's median TFLOP/s over the
rounds, its ratio to the first build's, SDPA's cuDNN backend beside the first build (where sdpa.csv
is there), and every round's TFLOP/s.

Usage:
    ab_builds.py OUT_DIR                                  the table (what ab_builds.sh prints)
    ab_builds.py OUT_DIR --archive DATE NAME=COMMIT:KERNEL...
        the median round of each named build and plain shape (H_kv = H) as rows of the layout of
        cuda/results/bwd_ws.csv and fwd_tma_ws.csv (date, device, commit, dtype, pass, kernel, d,
        causal, N, H, B, median_ms, min_ms, max_ms, tflops, then the four SDPA columns, empty): the
        round whose TFLOP/s is the median of the rounds, as `bench attention` reports it (its
        median launch, min, max). KERNEL labels the build (e.g. wgmma-ws-before); DATE is the run's
        (YYYY-MM-DD HH:MM); the device is gpu.txt's.

OUT_DIR holds r<round>_<name>.<part>.csv, the CSVs of `flashlab bench attention --csv`.
"""
import csv
import glob
import os
import re
import statistics
import sys


def shape(row):
    """A shape's key: pass, d, causal, N, B, and the heads unless H = 16 without grouping."""
    heads = "" if row["H"] == "16" and row.get("H_kv", "16") == "16" else f" h{row['H']}:{row.get('H_kv', row['H'])}"
    return (row["pass"], int(row["d"]), row["causal"], int(row["N"]), int(row["B"]), heads)


def read_rounds(out):
    """{(shape, name): [row of each round, in round order]} and the build names in their first order."""
    runs, names = {}, []
    paths = [p for p in glob.glob(os.path.join(out, "r*_*.csv")) if re.match(r"r\d+_", os.path.basename(p))]
    # Round by round, each in the order its processes ran: the first build is the first one named.
    for path in sorted(paths, key=lambda p: (int(re.match(r"r(\d+)_", os.path.basename(p)).group(1)),
                                             os.path.getmtime(p))):
        m = re.match(r"r(\d+)_([A-Za-z0-9-]+)\.[^.]+\.csv$", os.path.basename(path))
        if not m:
            continue
        name = m.group(2)
        if name not in names:
            names.append(name)
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("dtype") in (None, "dtype") or not row.get("tflops"):
                    continue
                runs.setdefault((shape(row), name), []).append(row)
    return runs, names


def median_row(rows):
    """The round whose TFLOP/s is the median (the lower middle one of an even count)."""
    ordered = sorted(rows, key=lambda r: float(r["tflops"]))
    return ordered[(len(ordered) - 1) // 2]


def cudnn(out):
    """SDPA's cuDNN TFLOP/s (the [B, N, H, d] view) per shape: sdpa.csv's rows follow all_first.csv's
    (the first build's rows of round 0, which sdpa_bench.py read), matched in order."""
    ours_path, sdpa_path = os.path.join(out, "all_first.csv"), os.path.join(out, "sdpa.csv")
    if not (os.path.exists(ours_path) and os.path.exists(sdpa_path)):
        return {}
    with open(ours_path, newline="") as f:
        ours = iter([r for r in csv.DictReader(f) if r.get("dtype") != "dtype"])
    found = {}
    with open(sdpa_path, newline="") as f:
        for row in csv.DictReader(f):
            for o in ours:
                if (o["pass"], o["d"], o["causal"], o["N"]) == (row["pass"], row["d"], row["causal"], row["N"]):
                    try:
                        found[shape(o)] = float(row["cudnn_bnhd_tflops"])
                    except (KeyError, ValueError):
                        pass
                    break
    return found


def table(out):
    runs, names = read_rounds(out)
    if not names:
        sys.exit(f"ab_builds.py: no r<round>_<name>.<part>.csv in {out} (hint: the OUT_DIR of ab_builds.sh)")
    anchors = cudnn(out)
    print("pass d causal N B | " + " ".join(names) + " | ratio to " + names[0] + " | cuDNN, "
          + names[0] + "/cuDNN | rounds")
    for key in sorted({k for k, _ in runs}):
        med = [float(median_row(runs[(key, n)])["tflops"]) if (key, n) in runs else float("nan") for n in names]
        rounds = " ".join("/".join(f"{float(r['tflops']):.0f}" for r in runs.get((key, n), [])) for n in names)
        c = anchors.get(key)
        anchor = f"{c:.1f} {med[0] / c:.3f}" if c else "-"
        label = " ".join(str(x) for x in key[:5]) + key[5]
        print(f"{label} | " + " ".join(f"{v:.1f}" for v in med) + " | "
              + " ".join(f"{v / med[0]:.3f}" for v in med[1:]) + f" | {anchor} | {rounds}")


def archive(out, date, specs):
    runs, _ = read_rounds(out)
    device = "unknown"
    gpu = os.path.join(out, "gpu.txt")
    if os.path.exists(gpu):
        lines = open(gpu).read().splitlines()
        if len(lines) > 1:
            device = lines[1].split(",")[0].strip()
    writer = csv.writer(sys.stdout, lineterminator="\n")
    for spec in specs:
        m = re.match(r"([A-Za-z0-9-]+)=([0-9a-f]+):(\S+)$", spec)
        if not m:
            sys.exit(f"ab_builds.py: '{spec}' is not NAME=COMMIT:KERNEL (hint: before=dc2b862:wgmma-ws-before)")
        name, commit, kernel = m.groups()
        keys = sorted(k for k, n in runs if n == name and not k[5])
        if not keys:
            sys.exit(f"ab_builds.py: no rows of build '{name}' in {out}")
        for key in keys:
            r = median_row(runs[(key, name)])
            writer.writerow([date, device, commit, r["dtype"], r["pass"], kernel, r["d"], r["causal"], r["N"], r["H"],
                             r["B"], r["ms"], r["min_ms"], r["max_ms"], r["tflops"], "", "", "", ""])


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    if len(argv) > 2:
        if argv[2] != "--archive" or len(argv) < 5:
            print(__doc__, file=sys.stderr)
            return 2
        archive(argv[1], argv[3], argv[4:])
    else:
        table(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
