#!/usr/bin/env python3
"""A trace store read with NumPy alone, by the snippet docs/stream.md shows.

Traces a small store with the flashlab binary, runs the page's snippet (the python block between
the numpy-snippet markers) for several (layer, head, query block), and compares what it prints
with `flashlab stream query --json`; also walks the reverse index and the headers with NumPy.
Usage: stream_store_numpy.py FLASHLAB DOCS/stream.md. Exit 0 pass, 1 fail, 77 skipped (no numpy).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("skipped: python3-numpy is not installed (apt-get install python3-numpy)")
    sys.exit(77)


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main():
    flashlab, doc = sys.argv[1], sys.argv[2]
    text = open(doc, encoding="utf-8").read()
    m = re.search(r"<!-- numpy-snippet begin -->\s*```python\n(.*?)```\s*<!-- numpy-snippet end -->", text, re.S)
    if not m:
        fail(doc + ": no python block between the numpy-snippet markers")
    snippet = m.group(1)
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        subprocess.run([flashlab, "stream", "trace", "--store", store, "--seq", "700", "--dim", "8", "--block-m", "16",
                        "--block-n", "12", "--k", "5", "--layers", "2", "--heads", "3", "--workload", "needles",
                        "--needle-blocks", "2", "--needles", "2", "--with-scores"], check=True, stdout=subprocess.DEVNULL)
        manifest = json.load(open(os.path.join(store, "manifest.json")))
        for layer, head, q in [(0, 0, 0), (1, 2, 43), (0, 1, 30), (1, 0, 22)]:
            printed = []
            scope = {"store": store, "layer": layer, "head": head, "q": q, "print": lambda *a: printed.append(a)}
            exec(snippet, scope)
            if len(printed) != 1 or len(printed[0]) != 2:
                fail("the snippet should print the key blocks and their masses once")
            blocks, mass = (np.asarray(x) for x in printed[0])
            out = subprocess.run([flashlab, "stream", "query", store, "--reads", "b%d" % q, "--layer", str(layer),
                                  "--head", str(head), "--top", "1000", "--json"], check=True, capture_output=True, text=True)
            edges = sorted(json.loads(out.stdout)["edges"], key=lambda e: e["slot"])
            if [e["r"] for e in edges] != blocks.tolist():
                fail("(%d, %d, %d): NumPy reads %s, flashlab %s" % (layer, head, q, blocks.tolist(), [e["r"] for e in edges]))
            if [e["mass"] for e in edges] != [float(x) for x in mass]:
                fail("(%d, %d, %d): masses differ" % (layer, head, q))
        # The reverse index: readers of key block r in (layer, head) are the rows that hold r.
        nq, nk, H = manifest["n_q"], manifest["n_k"], manifest["heads"]
        ptr = np.load(os.path.join(store, "row_ptr.npy"))
        kb = np.load(os.path.join(store, "key_block.npy"))
        rptr = np.load(os.path.join(store, "rev_ptr.npy"))
        rq = np.load(os.path.join(store, "rev_query.npy"))
        if ptr.shape != (1 + manifest["segments_committed"] * nq,) or kb.shape != (manifest["records"],):
            fail("column lengths disagree with the manifest")
        for seg in range(manifest["segments_committed"]):
            rows = np.repeat(np.arange(nq), np.diff(ptr[seg * nq:(seg + 1) * nq + 1]))
            keys = kb[ptr[seg * nq]:ptr[(seg + 1) * nq]]
            for r in range(nk):
                want = np.sort(rows[keys == r])
                got = rq[rptr[seg * nk + r]:rptr[seg * nk + r + 1]]
                if not np.array_equal(want, got):
                    fail("segment %d, key block %d: readers %s, rows say %s" % (seg, r, got.tolist(), want.tolist()))
        seg_sums = np.load(os.path.join(store, "segment_checksum.npy")).view(np.uint64)
        if seg_sums.shape != (2 * H,):
            fail("segment_checksum.npy has %s entries" % (seg_sums.shape,))
    print("numpy: the documented snippet reads what flashlab reads; the reverse index is the rows' transpose")


main()
