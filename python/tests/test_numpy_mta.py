"""The NumPy path of Multi-Token Attention against reference.py's scalar-loop convolution, and
its gradients (q, k, v and the kernel w) against finite differences of that reference.

Tolerances: float64 1e-12 relative to max |ref| (forward); gradients 1e-7 (finite-difference
error ~1e-9). w has the statistics' dtype: float64 beside float64 inputs, float32 beside float32.
"""
import numpy as np
import pytest

import flashlab
import reference
from test_numpy_attention import rel_err


def inputs(rng, B, N, H, d, cq, ck, dtype=np.float64):
    q, k, v = (rng.standard_normal((B, N, H, d)).astype(dtype) for _ in range(3))
    w = (rng.standard_normal((H, cq, ck)) * 0.5).astype(np.float64 if dtype == np.float64 else np.float32)
    return q, k, v, w


@pytest.mark.parametrize("shape", [(1, 1, 1, 4, 1, 1), (1, 9, 2, 8, 2, 3), (2, 70, 1, 16, 3, 5), (1, 33, 2, 8, 4, 1)])
def test_forward_matches_float64_reference(rng, shape):
    q, k, v, w = inputs(rng, *shape)
    o = flashlab.mta(q, k, v, w)
    assert o.shape == q.shape and o.dtype == np.float64
    assert rel_err(o, reference.mta(q, k, v, w)) <= 1e-12


def test_float32_forward(rng):
    q, k, v, w = inputs(rng, 1, 40, 2, 16, 2, 3, np.float32)
    o = flashlab.mta(q, k, v, w, scale=0.2)
    assert o.dtype == np.float32
    assert rel_err(o, reference.mta(q, k, v, w, scale=0.2)) <= 5e-6


def test_identity_kernel_is_causal_attention(rng):
    """cq = ck = 1 with W = 1 is plain causal attention (the MTA page's second check)."""
    q, k, v, _ = inputs(rng, 1, 12, 2, 8, 1, 1)
    w = np.ones((2, 1, 1))
    o = flashlab.mta(q, k, v, w)
    ref, _ = reference.attention(q, k, v, causal=True)
    assert rel_err(o, ref) <= 1e-12


@pytest.mark.parametrize("shape", [(1, 5, 1, 3, 2, 3), (2, 4, 2, 2, 2, 1)])
def test_gradients_match_finite_differences(rng, shape):
    q, k, v, w = inputs(rng, *shape)
    do = rng.standard_normal(q.shape)
    o, lse = flashlab.mta(q, k, v, w, return_lse=True)
    dq, dk, dv, dw = flashlab.mta_backward(do, q, k, v, w, o, lse)
    assert dw.dtype == np.float64 and dw.shape == w.shape
    fd = [
        reference.finite_difference(lambda x: reference.mta(x, k, v, w), q, do),
        reference.finite_difference(lambda x: reference.mta(q, x, v, w), k, do),
        reference.finite_difference(lambda x: reference.mta(q, k, x, w), v, do),
    ]
    for got, ref in zip((dq, dk, dv), fd):
        assert rel_err(got, ref) <= 1e-7
    fd_w = reference.finite_difference(lambda x: reference.mta(q, k, v, x), w, do)
    assert rel_err(dw, fd_w) <= 1e-7


@pytest.mark.parametrize("N", [3, 50])
def test_decode_is_the_last_rows_of_the_forward(rng, N):
    B, H, d, cq, ck = 1, 2, 16, 3, 3
    q, k, v, w = inputs(rng, B, N, H, d, cq, ck)
    R = min(16, N)
    last = flashlab.mta_decode(q, k, v, w)
    assert last.shape == (B, R, H, d)
    assert rel_err(last, reference.mta(q, k, v, w)[:, N - R:]) <= 1e-12
