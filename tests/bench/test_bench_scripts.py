"""The CPU side of the GPU measurement scripts (cuda/bench): the deal model's lists, the lengths
files, the timeline logs' parser and the per-instruction profile reader. Each list of the model
must hold every tile of every sequence exactly once, in the order its kernel deals them; each
parser must keep what a run printed and refuse what it cannot read, by name."""
import csv
import io
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cuda", "bench")
sys.path.insert(0, BENCH)

import bwd_timeline  # noqa: E402
import fwd_timeline  # noqa: E402
import ncu_sass_mix  # noqa: E402
import packed_deal  # noqa: E402

MIXED = [8192, 7168, 6656, 6000, 5500, 5000, 4500, 4096, 3900, 3500, 3000, 2500, 2000, 1500, 1111, 913]


def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(BENCH, script), *map(str, args)], capture_output=True,
                          text=True)


# ---- packed_deal.py: the lists

def tiles_of(units):
    return sorted((b, h) for b, h, _ in units)


@pytest.mark.parametrize("w", [1, 2, 3, 8])
def test_striped_list_holds_every_tile_once_longest_rows_first(w):
    lengths, heads, br = [300, 0, 1, 129, 1000, 64], 3, 128
    units = [u for u in packed_deal.striped_units(lengths, heads, br, 128, True, w) if u[2]]
    expected = sorted((b, h) for b, n in enumerate(lengths) for h in range(heads) for _ in range((n + br - 1) // br))
    assert tiles_of(units) == expected
    if w == 1:  # stripes of one row, from the highest down: key tiles (row + 1 at Br = Bc) never grow
        assert all(a[2] >= b[2] for a, b in zip(units, units[1:]))


def test_compacted_list_runs_the_most_keys_first_whatever_the_packed_order():
    heads, br = 2, 192
    for lengths in (MIXED, MIXED[::-1], [77, 300, 300, 600, 1, 0]):
        units = [u for u in packed_deal.compact_units(lengths, heads, br, 128, False) if u[2]]
        seqs = [b for b, _, _ in units]
        order = list(dict.fromkeys(seqs))  # sequences in list order
        assert [lengths[b] for b in order] == sorted((n for n in lengths if n), reverse=True)
        ties = [b for b in order if lengths[b] == 300]
        assert ties == sorted(ties)  # ties in packed order


@pytest.mark.parametrize("order", ["rows", "aligned"])
def test_chunk_stripes_hold_every_tile_once(order):
    len_q, len_k, heads, br = [128, 300, 64, 500, 1, 0], [3000, 300, 1200, 200, 900, 50], 2, 128
    units = packed_deal.chunk_units(len_q, len_k, heads, br, 128, order, 4)
    expected = sorted((b, h) for b, n in enumerate(len_q) for h in range(heads) for _ in range((n + br - 1) // br))
    assert tiles_of(units) == expected


def test_chunk_numbering_is_the_packed_numbering_for_self_attention():
    lengths = [300, 0, 1, 129, 1000, 64]
    assert packed_deal.chunk_units(lengths, lengths, 3, 128, 128, "numbering", 1) == \
        list(packed_deal.packed_units(lengths, 3, 128, 128, True))


def test_key_aligned_stripes_put_a_chunk_after_a_long_prefix_first():
    units = packed_deal.chunk_units([8192, 128], [8192, 65536], 1, 128, 128, "aligned", 8)
    assert units[0][0] == 1 and units[0][2] == 65536 // 128
    # For self-attention the key-aligned order is the query-row order.
    assert packed_deal.chunk_units(MIXED, MIXED, 2, 128, 128, "aligned", 8) == \
        packed_deal.chunk_units(MIXED, MIXED, 2, 128, 128, "rows", 8)


def test_unit_cost_lengthens_every_block_with_keys():
    units = list(packed_deal.dense_units(1024, 1, 4, 128, 128, False))
    plain, costly = packed_deal.deal(units, 132), packed_deal.deal(units, 132, 1.5)
    assert costly[2] == pytest.approx(plain[2] + 1.5)  # 32 units on 132 blocks: one unit a block


@pytest.mark.parametrize("args, words", [
    (["--stripe", "0", "--causal", "100"], "--stripe 0"),
    (["--unit-cost", "-1", "100"], "--unit-cost"),
    (["0", "0"], "one at least 1"),
    (["--keys", "5", "--", "5", "6"], "--keys"),
    (["--causal", "--keys", "-5", "--", "5"], "--keys"),
])
def test_packed_deal_refuses_nonsense_by_name(args, words):
    r = run("packed_deal.py", *args)
    assert r.returncode == 2 and words in r.stderr


def test_packed_deal_prints_the_chunk_rows():
    r = run("packed_deal.py", "--causal", "--br", "128", "--keys", 1024, 16384, "--", 1024, 1024)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [row["list"].split(" (")[0] for row in rows] == \
        ["packed", "packed, striped by query row", "packed, striped by key-aligned row"]
    assert all(0 < float(row["of_even_deal"]) <= 1 for row in rows)


# ---- varlen_lengths.py

def test_lengths_files_carry_keys_only_where_they_differ(tmp_path):
    r = run("varlen_lengths.py", tmp_path, "mixed", "chunks")
    assert r.returncode == 0, r.stderr
    mixed = (tmp_path / "mixed.txt").read_text().splitlines()
    assert len(mixed) == 1 and mixed[0].split()[-1] == "65536"
    chunks = (tmp_path / "chunks.txt").read_text().splitlines()
    assert chunks[0].startswith("cu_seqlens_q = 0 1024 ") and chunks[0].split()[-1] == str(16 * 1024)
    assert chunks[1].startswith("cu_seqlens_k = 0 1024 5120 ") and chunks[1].split()[-1] == str(4 * 29696)
    assert run("varlen_lengths.py", tmp_path, "nonsense").returncode != 0


# ---- the timeline logs

LOG = ("""== ours_fwd_d64_1x2048: span per call (us) [40.1, 39.0]
   +     0.0 gap    0.0 dur     38.2  void flashlab::cuda::detail::ws_fwd_kernel<flashlab::X>"""
       """ | grid 132x1x1 block 384x1x1 regs 168 smem 200704
== cudnn_bwd_1024_c0: span per call (us) [97.1, 77.2]
   +     0.0 gap    0.0 dur      0.8  Memset (Device)
   +    12.0 gap   11.2 dur      7.1  void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*)
""")


def test_timeline_log_rows_keep_each_kernel_and_its_launch(tmp_path):
    path = tmp_path / "t.log"
    path.write_text(LOG)
    rows = list(bwd_timeline.log_rows(str(path)))
    assert rows[0] == ("ours_fwd_d64_1x2048", "40.1 39.0", 0, "ws_fwd_kernel", "0.0", "0.0", "38.2",
                       "132x1x1", "384x1x1", "168", "200704")
    assert rows[1][:7] == ("cudnn_bwd_1024_c0", "97.1 77.2", 0, "memset", "0.0", "0.0", "0.8")
    assert rows[2][2:4] == (1, "compute_dot_do_o_specialized") and len(rows[2]) == 7


def test_timeline_command_lines(tmp_path, capsys):
    path = tmp_path / "t.log"
    path.write_text(LOG)
    fwd_timeline.from_log(str(path), "D", "DEV", "C")
    out = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert out[0][-4:] == ["grid", "block", "registers", "smem_bytes"] and out[1][-1] == "200704"
    assert run("fwd_timeline.py", "--nonsense").returncode == 2
    assert run("bwd_timeline.py", "--help").returncode == 2


# ---- ncu_sass_mix.py

def test_sass_mix_reads_a_source_page_and_refuses_another_file(tmp_path):
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_mio",
              "stall_wait"]
    page = tmp_path / "a.csv"
    with open(page, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerow(header)
        w.writerow(["0x10", "      MUFU.EX2 R1, R2", "30", "1,000", "20", "10"])
        w.writerow(["0x20", "@!P0  BRA 0x10", "5", "400", "0", "5"])
    rows = ncu_sass_mix.load(str(page))
    mix, mio, stalls, samples = ncu_sass_mix.summary(rows)
    assert mix["MUFU"] == 1000 and mix["BRA"] == 400 and mio["MUFU"] == 20 and samples == 35
    assert stalls["wait"] == 15
    r = run("ncu_sass_mix.py", page, page, "--top", 1)
    assert r.returncode == 0 and "MUFU" in r.stdout
    bad = tmp_path / "b.csv"
    bad.write_text("a,b\n")
    r = run("ncu_sass_mix.py", bad, page)
    assert r.returncode != 0 and "no 'Address' header" in r.stderr


# ---- ab_builds.py

BENCH_HEADER = "dtype,pass,d,causal,N,H,B,ms,min_ms,max_ms,tflops,H_kv\n"


def write_round(out, r, name, rows):
    path = out / f"r{r}_{name}.bwd.csv"
    path.write_text(BENCH_HEADER + "".join(f"bf16,bwd,128,{c},{n},{h},1,{ms},{ms},{ms},{tf},{hkv}\n"
                                           for c, n, h, hkv, ms, tf in rows))
    return path


def ab_run(tmp_path):
    out = tmp_path / "ab"
    out.mkdir()
    (out / "gpu.txt").write_text("name, clocks.max.sm [MHz], power.limit [W]\nNVIDIA H200, 1980 MHz, 700.00 W\n")
    tflops = {"before": [500, 520, 510], "after": [530, 490, 540]}
    for r in range(3):
        for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
            t = tflops[name][r]
            p = write_round(out, r, name, [(0, 8192, 16, 16, 1000.0 / t, t), (1, 8192, 32, 8, 2000.0 / t, t + 1)])
            os.utime(p, (r * 10 + (name == "after"), r * 10 + (name == "after")))  # before runs first
    return out


def test_ab_table_takes_the_median_round_of_each_build(tmp_path):
    r = run("ab_builds.py", ab_run(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("pass d causal N B | before after")
    plain = next(l for l in lines if l.startswith("bwd 128 0 8192 1 |"))
    assert "| 510.0 530.0 | 1.039 | - | 500/520/510 530/490/540" in plain
    assert any(l.startswith("bwd 128 1 8192 1 h32:8 |") for l in lines)


def test_ab_archive_rows_are_the_median_rounds_of_plain_shapes(tmp_path):
    r = run("ab_builds.py", ab_run(tmp_path), "--archive", "2026-11-28 21:43", "after=abc1234:wgmma-ws-x")
    assert r.returncode == 0, r.stderr
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert len(rows) == 1  # the grouped shape is not of the archive's layout
    assert rows[0][:11] == ["2026-11-28 21:43", "NVIDIA H200", "abc1234", "bf16", "bwd", "wgmma-ws-x", "128", "0",
                            "8192", "16", "1"]
    assert rows[0][14] == "530" and len(rows[0]) == 19


@pytest.mark.parametrize("args, words", [((), "no r<round>"), (("--archive", "D", "after"), "NAME=COMMIT:KERNEL"),
                                         (("--archive", "D", "nobody=abc1234:k"), "no rows of build 'nobody'")])
def test_ab_builds_refuses_by_name(tmp_path, args, words):
    out = tmp_path / "empty"
    out.mkdir()
    r = run("ab_builds.py", ab_run(tmp_path) if args else out, *args)
    assert r.returncode != 0 and words in r.stderr


def test_ab_builds_sh_refuses_an_unknown_set_and_a_missing_binary(tmp_path):
    sh = os.path.join(BENCH, "ab_builds.sh")
    r = subprocess.run(["bash", sh, "nonsense", str(tmp_path), "1", "a=/bin/true"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown shape set" in r.stderr
    r = subprocess.run(["bash", sh, "bwd", str(tmp_path), "1", f"a={tmp_path}/none"], capture_output=True, text=True)
    assert r.returncode == 2 and "is not an executable" in r.stderr


# ---- cubin_diff.py

def tiny_cubin(text):
    """An EM_CUDA ELF image with one kernel `k`: sections null, .shstrtab, .text.k."""
    import struct
    names = b"\0.shstrtab\0.text.k\0"
    body = names + text
    shoff = 64 + len(body)
    header = (b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0,
                                                                64, 3, 1))
    def sh(name, typ, off, size):
        return struct.pack("<IIQQQQIIQQ", name, typ, 0, 0, off, size, 0, 0, 1, 0)
    shdrs = sh(0, 0, 0, 0) + sh(1, 3, 64, len(names)) + sh(11, 1, 64 + len(names), len(text))
    return header + body + shdrs


def test_cubin_diff_reads_cubin_files_and_tells_a_changed_kernel(tmp_path):
    for name, text in (("old", b"\x01" * 16), ("same", b"\x01" * 16), ("new", b"\x02" * 16)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.cubin").write_bytes(tiny_cubin(text))
    r = run("cubin_diff.py", tmp_path / "old", tmp_path / "same")
    assert r.returncode == 0 and "identical by name: 1" in r.stdout, r.stdout + r.stderr
    r = run("cubin_diff.py", tmp_path / "old", tmp_path / "new")
    assert r.returncode == 1 and "DIFFERENT: a.cubin: k" in r.stdout, r.stdout + r.stderr
