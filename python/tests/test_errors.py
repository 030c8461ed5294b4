"""Bad input gets an exception that names the argument and the limit (the library's message where
the library found it) — never a crash — and a missing library a message saying where it looked
and how to build it.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flashlab
from flashlab import _capi
from flashlab import FlashlabError, FlashlabTypeError, FlashlabUnsupportedError, FlashlabValueError

PACKAGE = Path(flashlab.__file__).resolve().parent


def arrays(*shapes, dtype=np.float64):
    return [np.zeros(s, dtype=dtype) for s in shapes]


def test_wrong_rank_names_the_argument():
    q, k, v = arrays((2, 3, 4), (1, 3, 2, 4), (1, 3, 2, 4))
    with pytest.raises(FlashlabValueError, match=r"q: expected 4 dimensions \[B, N, H, d\], got shape \(2, 3, 4\)"):
        flashlab.attention(q, k, v)


def test_mismatched_shapes_name_the_argument():
    q, k, v = arrays((1, 3, 2, 4), (1, 3, 2, 4), (1, 4, 2, 4))
    with pytest.raises(FlashlabValueError, match="v: shape"):
        flashlab.attention(q, k, v)
    q, k, v = arrays((1, 3, 2, 4), (1, 3, 2, 8), (1, 3, 2, 8))
    with pytest.raises(FlashlabValueError, match="k: head dim 8 differs from q's 4"):
        flashlab.attention(q, k, v)
    q, k, v = arrays((1, 3, 3, 4), (1, 3, 2, 4), (1, 3, 2, 4))
    with pytest.raises(FlashlabValueError, match="2 key/value heads do not divide q's 3 heads"):
        flashlab.attention(q, k, v)


def test_dtypes():
    q, k, v = arrays((1, 3, 2, 4), (1, 3, 2, 4), (1, 3, 2, 4), dtype=np.float16)
    with pytest.raises(FlashlabTypeError, match="q: dtype float16 is not taken on the CPU reference"):
        flashlab.attention(q, k, v)
    q = q.astype(np.float32)
    with pytest.raises(FlashlabTypeError, match="k: dtype float16 differs from q's float32"):
        flashlab.attention(q, k, v)
    with pytest.raises(FlashlabTypeError, match="k: expected a numpy.ndarray or a torch.Tensor, got list"):
        flashlab.attention(q, [[1.0]], v)


def test_scale_must_be_positive():
    q, k, v = arrays((1, 3, 2, 4), (1, 3, 2, 4), (1, 3, 2, 4))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(FlashlabValueError, match="scale: .* is not a finite number > 0"):
            flashlab.attention(q, k, v, scale=bad)
    with pytest.raises(FlashlabTypeError, match="scale: expected a float"):
        flashlab.attention(q, k, v, scale="1")


def test_the_library_refusal_carries_its_message():
    """An empty sequence passes Python's shape checks; the library refuses it, naming the field."""
    q, k, v = arrays((1, 0, 2, 4), (1, 0, 2, 4), (1, 0, 2, 4))
    with pytest.raises(FlashlabValueError) as e:
        flashlab.attention(q, k, v)
    text = str(e.value)
    assert text.startswith("flashlab_attention_forward: ")
    assert "seq" in text and e.value.status == "FLASHLAB_ERROR_INVALID_ARGUMENT"


def test_mta_errors():
    q, k, v = arrays((1, 5, 2, 4), (1, 5, 2, 4), (1, 5, 2, 4))
    w = np.ones((2, 2, 2))  # ck even
    with pytest.raises(FlashlabValueError, match="ck"):
        flashlab.mta(q, k, v, w)
    with pytest.raises(FlashlabTypeError, match="w: dtype float32, expected float64 beside q's float64"):
        flashlab.mta(q, k, v, np.ones((2, 1, 1), dtype=np.float32))
    with pytest.raises(FlashlabValueError, match=r"w: 3 kernels for 2 heads"):
        flashlab.mta(q, k, v, np.ones((3, 1, 1)))


def test_stream_errors():
    q, k = arrays((10, 4), (10, 4))
    with pytest.raises(FlashlabValueError, match=r"q: expected 2 dimensions \[T, d\]"):
        flashlab.stream.estimate(q[None], k[None], k_blocks=2)
    with pytest.raises(FlashlabValueError, match="k_blocks: 0 is below 1"):
        flashlab.stream.estimate(q, k, k_blocks=0, bq=2, bk=2)
    with pytest.raises(FlashlabValueError, match=r"mask: shape \(2, 2\), expected \(n_q, n_k\) = \(5, 5\)"):
        flashlab.stream.estimate(q, k, k_blocks=2, bq=2, bk=2, mask=np.ones((2, 2), bool))
    bad = np.ones((5, 5), dtype=np.int32)
    bad[1, 3] = 2
    with pytest.raises(FlashlabValueError, match=r"mask: entry \[1, 3\] is 2, not 0 or 1"):
        flashlab.stream.estimate(q, k, k_blocks=2, bq=2, bk=2, mask=bad)
    idx = flashlab.stream.estimate(q, k, k_blocks=2, bq=2, bk=2)
    with pytest.raises(FlashlabTypeError, match="indices: dtype int32, expected int64"):
        flashlab.stream.apply(q, k, q, idx.astype(np.int32), bq=2, bk=2)
    with pytest.raises(FlashlabValueError, match=r"indices: 4 rows, expected n_q = ceil\(T/bq\) = 5"):
        flashlab.stream.apply(q, k, q, idx[:4], bq=2, bk=2)
    broken = idx.copy()
    broken[4, 0] = 99  # a block that does not exist: the library refuses it
    with pytest.raises(FlashlabValueError):
        flashlab.stream.apply(q, k, q, broken, bq=2, bk=2)


def test_errors_are_also_the_builtin_exceptions():
    assert issubclass(FlashlabValueError, ValueError) and issubclass(FlashlabTypeError, TypeError)
    assert issubclass(FlashlabUnsupportedError, ValueError)
    assert issubclass(flashlab.FlashlabLibraryError, RuntimeError)
    assert all(issubclass(c, FlashlabError) for c in (FlashlabValueError, FlashlabTypeError))


def run_python(code, env_update, cwd):
    env = {k: v for k, v in os.environ.items() if k != "FLASHLAB_LIBRARY"}
    env.update(env_update)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


CALL = "import numpy as np, flashlab\nz = np.zeros((1, 2, 1, 4))\nflashlab.attention(z, z, z)\n"


def test_library_not_found_says_where_it_looked_and_how_to_build(tmp_path):
    """The package copied to a folder with no build beside it: import works, the call explains."""
    shutil.copytree(PACKAGE, tmp_path / "pkg" / "flashlab", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    r = run_python(CALL, {"PYTHONPATH": str(tmp_path / "pkg"), "FLASHLAB_NO_TORCH": "1"}, tmp_path)
    assert r.returncode == 1
    assert "Segmentation" not in r.stderr
    last = r.stderr.strip().splitlines()
    assert any(line.startswith("flashlab.errors.FlashlabLibraryError: libflashlab.so not found; looked in:")
               for line in last), r.stderr
    assert str(tmp_path / "pkg" / "flashlab" / "libflashlab.so") in r.stderr
    assert "build" in r.stderr and "cuda" in r.stderr and "cpu" in r.stderr
    assert "hint: build it in the checkout" in r.stderr and "FLASHLAB_LIBRARY" in r.stderr


def test_flashlab_library_pointing_nowhere(tmp_path):
    r = run_python(CALL, {"PYTHONPATH": str(PACKAGE.parent), "FLASHLAB_LIBRARY": str(tmp_path / "nope.so"),
                          "FLASHLAB_NO_TORCH": "1"}, tmp_path)
    assert r.returncode == 1
    assert f"looked in:\n  {tmp_path / 'nope.so'}" in r.stderr


def test_flashlab_library_not_a_library(tmp_path):
    fake = tmp_path / "libflashlab.so"
    fake.write_text("not an ELF file")
    r = run_python(CALL, {"PYTHONPATH": str(PACKAGE.parent), "FLASHLAB_LIBRARY": str(tmp_path),
                          "FLASHLAB_NO_TORCH": "1"}, tmp_path)
    assert r.returncode == 1
    assert f"{fake}: cannot be loaded" in r.stderr


def test_the_readme_snippet_runs():
    """The README's "From Python" lines, as a newcomer pastes them from the repository root."""
    root = PACKAGE.parent.parent
    readme = (root / "README.md").read_text()
    section = readme.split("## From Python", 1)[1]
    script = section.split("python3 - <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    env = {"PYTHONPATH": "python"}
    if os.environ.get("FLASHLAB_LIBRARY"):
        env["FLASHLAB_LIBRARY"] = os.environ["FLASHLAB_LIBRARY"]
    r = run_python(script, env, root)
    assert r.returncode == 0, r.stderr
    error = float(r.stdout.strip().rsplit(" ", 1)[1])
    assert "max error vs float64 NumPy:" in r.stdout and error < 1e-12


def test_group_takes_torch_cuda_tensors_only():
    q = np.zeros((1, 8, 1, 4), np.float32)
    with pytest.raises(flashlab.FlashlabTypeError, match="group: context parallelism takes torch CUDA tensors"):
        flashlab.attention(q, q, q, group=object())


def test_the_ring_entries_are_declared():
    L = _capi.lib()
    assert L.has_ring() in (0, 1)
    if not L.has_ring():
        status = L.ring_unique_id(None)
        assert status == _capi.ERROR_UNSUPPORTED
        assert "no context-parallel ring" in L.last_error().decode()
