"""pytest setup: the package from this checkout, seeded inputs, and the CUDA requirement switch.

CTest runs these tests with PYTHONPATH=python and FLASHLAB_LIBRARY set to the build's
libflashlab.so; run by hand from the repository root, the package is found here and the library
in build/cuda or build/cpu. FLASHLAB_REQUIRE_CUDA=1 (the GPU CTest test sets it) turns the
"no torch with CUDA" skip of the GPU tests into a failure, so that a GPU run cannot pass by
skipping everything.
"""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: fresh inputs per test, the same on every run."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)


def cuda_or_skip():
    """Skip (or, with FLASHLAB_REQUIRE_CUDA=1, fail) unless torch with a CUDA device is here."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        return torch
    why = "torch is not installed" if torch is None else "torch sees no CUDA device"
    if os.environ.get("FLASHLAB_REQUIRE_CUDA") == "1":
        pytest.fail(f"FLASHLAB_REQUIRE_CUDA=1 but {why}")
    pytest.skip(why, allow_module_level=True)
