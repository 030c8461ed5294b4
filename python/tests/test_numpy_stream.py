"""The NumPy path of STREAM against reference.py's literal specification.

The estimate is compared exactly: inputs are small integers, so every score is exact in float32
and float64 and ties are real ties, decided by the τ order. The application and the edge records
are compared in float64 with 1e-12 relative to max |ref|; float32 edge weights to 1e-5.
"""
import numpy as np
import pytest

import flashlab
import reference
from test_numpy_attention import rel_err


def integer_qk(rng, T, d, dtype=np.float64, lo=-3, hi=4):
    return (rng.integers(lo, hi, size=(T, d)).astype(dtype) for _ in range(2))


def test_the_worked_example_of_the_specification():
    """T = 8, b_q = b_k = 1, Q ≡ 1, K = (0, 3, 3, 0, 3, 0, 0, 0), k = 2: I[7] = (2, 4)."""
    q = np.ones((8, 1))
    k = np.array([0, 3, 3, 0, 3, 0, 0, 0], dtype=np.float64).reshape(8, 1)
    idx = flashlab.stream.estimate(q, k, k_blocks=2, bq=1, bk=1)
    assert idx.dtype == np.int64 and idx.shape == (8, 2)
    assert tuple(idx[7]) == (2, 4)
    assert np.array_equal(idx, reference.stream_estimate(q, k, 2, 1, 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("T,d,bq,bk,kb", [(1, 4, 4, 4, 2), (37, 3, 4, 4, 3), (50, 2, 8, 4, 2), (33, 5, 3, 5, 4),
                                          (64, 4, 8, 8, 20)])
def test_estimate_equals_the_specification(rng, T, d, bq, bk, kb, dtype):
    q, k = integer_qk(rng, T, d, dtype)
    idx = flashlab.stream.estimate(q, k, k_blocks=kb, bq=bq, bk=bk)
    assert np.array_equal(idx, reference.stream_estimate(q, k, kb, bq, bk))


def test_estimate_with_a_user_mask(rng):
    T, bq, bk = 40, 4, 4
    q, k = integer_qk(rng, T, 3)
    mask = rng.random((10, 10)) < 0.5
    mask[5] = False  # a row with no valid block: all −1
    idx = flashlab.stream.estimate(q, k, k_blocks=3, bq=bq, bk=bk, mask=mask)
    assert np.array_equal(idx, reference.stream_estimate(q, k, 3, bq, bk, mask))
    assert (idx[5] == -1).all()
    assert np.array_equal(idx, flashlab.stream.estimate(q, k, k_blocks=3, bq=bq, bk=bk, mask=mask.astype(np.int64)))


@pytest.mark.parametrize("T,bq,bk,kb", [(1, 2, 2, 1), (45, 4, 8, 2), (40, 8, 4, 10)])
def test_apply_and_trace_match_the_sparse_softmax(rng, T, bq, bk, kb):
    d = 6
    q, k, v = (rng.standard_normal((T, d)) for _ in range(3))
    idx = flashlab.stream.estimate(q, k, k_blocks=kb, bq=bq, bk=bk)
    o = flashlab.stream.apply(q, k, v, idx, bq=bq, bk=bk)
    ref_o, ref_edges = reference.stream_trace(q, k, v, idx, bq, bk)
    assert o.shape == (T, d) and rel_err(o, ref_o) <= 1e-12
    o2, edges = flashlab.stream.trace(q, k, v, idx, bq=bq, bk=bk)
    assert rel_err(o2, ref_o) <= 1e-12
    assert edges.dtype == flashlab.stream.EDGE_DTYPE and edges.size == idx.size
    for f in ("q", "r", "slot"):
        assert np.array_equal(edges[f], ref_edges[f].astype(np.int32)), f
    for f in ("score", "mass", "value_norm"):
        assert np.allclose(edges[f], ref_edges[f], rtol=1e-6, atol=1e-6), f
    as_dict = flashlab.stream.edges_as_dict(edges)
    assert set(as_dict) == {"q", "r", "slot", "score", "mass", "value_norm"}


def test_with_every_block_kept_apply_is_dense_causal_attention(rng):
    T, d, b = 30, 4, 4
    q, k, v = (rng.standard_normal((T, d)) for _ in range(3))
    idx = flashlab.stream.estimate(q, k, k_blocks=8, bq=b, bk=b)  # n_k = 8: every valid block kept
    o = flashlab.stream.apply(q, k, v, idx, bq=b, bk=b)
    dense, _ = reference.attention(q[None, :, None], k[None, :, None], v[None, :, None], causal=True, scale=1.0)
    assert rel_err(o, dense[0, :, 0]) <= 1e-12


def test_nan_logits_make_their_row_nan(rng):
    T, d, b = 16, 4, 4
    q, k, v = (rng.standard_normal((T, d)) for _ in range(3))
    idx = flashlab.stream.estimate(q, k, k_blocks=4, bq=b, bk=b)
    q[9, :] = np.nan
    o = flashlab.stream.apply(q, k, v, idx, bq=b, bk=b)
    assert np.isnan(o[9]).all()
    assert not np.isnan(np.delete(o, 9, axis=0)).any()
