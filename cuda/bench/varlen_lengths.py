#!/usr/bin/env python3
"""Write the packed sequences' lengths of the varlen benchmarks as --cu-seqlens files.

Usage: varlen_lengths.py OUT_DIR NAME...   (writes OUT_DIR/NAME.txt for each NAME)

Each file is the line 'cu_seqlens_q = 0 …' (the prefix sums; the keys take the queries' lengths,
but for the sets of KEYS, which add a line 'cu_seqlens_k = 0 …'), 65536 query tokens in all but
chunks:
  mixed    16 sequences of 8192 … 913 tokens (varlen.sh, varlen_bwd_ab.sh)
  uniform  8 × 8192, the dense shape B = 8, N = 8192 packed
  r128     the mixed lengths rounded to multiples of 128 (no ragged tile; varlen_bwd_lengths.sh)
  s4096    16 × 4096
  s1024    64 × 1024
  chunks   16 chunks of 1024 queries after 0, 3072, 7168 and 15360 earlier keys (key lengths 1024, 4096,
           8192, 16384, four times): chunked prefill against a cache, causal aligned bottom-right
"""
import itertools
import sys

LENGTHS = {
    "mixed": [8192, 7168, 6656, 6000, 5500, 5000, 4500, 4096, 3900, 3500, 3000, 2500, 2000, 1500, 1111, 913],
    "uniform": [8192] * 8,
    "r128": [8192, 7168, 6656, 5888, 5504, 4992, 4480, 4096, 3840, 3456, 3072, 2560, 2048, 1536, 1152, 896],
    "s4096": [4096] * 16,
    "s1024": [1024] * 64,
    "chunks": [1024] * 16,
}
KEYS = {"chunks": [1024, 4096, 8192, 16384] * 4}


def main(argv):
    if len(argv) < 3 or any(name not in LENGTHS for name in argv[2:]):
        sys.exit(f"usage: {argv[0]} OUT_DIR NAME... (NAME one of {', '.join(LENGTHS)})")
    for name in argv[2:]:
        lengths = LENGTHS[name]
        assert sum(lengths) == 65536 or name in KEYS, name
        with open(f"{argv[1]}/{name}.txt", "w") as f:
            f.write("cu_seqlens_q = " + " ".join(str(x) for x in itertools.accumulate([0] + lengths)) + "\n")
            if name in KEYS:
                f.write("cu_seqlens_k = " + " ".join(str(x) for x in itertools.accumulate([0] + KEYS[name])) + "\n")


if __name__ == "__main__":
    main(sys.argv)
