"""The NumPy path of attention (the CPU reference through the C ABI) against reference.py's
float64 formulas: outputs and LSE, and gradients against finite differences.

Tolerances: max |got − ref| / max |ref| ≤ 1e-12 for float64, ≤ 2e-6 for float32 (the reference
accumulates in the input precision; fp32 round-off on these sizes is ~1e-7). LSE is compared
absolutely (its values are O(1)). Gradients: finite differences with h = 1e-6 in float64 have
error ~1e-9, so ≤ 1e-7 relative.
"""
import numpy as np
import pytest

import flashlab
import reference

TOL = {np.float32: 2e-6, np.float64: 1e-12}


def rel_err(got, ref):
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape
    assert not np.isnan(got).any(), "NaN in the output"
    return np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-300)


def qkv(rng, B, N, Nk, H, Hkv, d, dtype):
    q = rng.standard_normal((B, N, H, d)).astype(dtype)
    k = rng.standard_normal((B, Nk, Hkv, d)).astype(dtype)
    v = rng.standard_normal((B, Nk, Hkv, d)).astype(dtype)
    return q, k, v


SHAPES = [  # (B, N, N_k, H, d): N = 1, N not a multiple of the 64-row tiles, N_q ≠ N_k both ways
    (1, 1, 1, 1, 8),
    (2, 37, 37, 3, 16),
    (1, 130, 130, 2, 64),
    (1, 5, 70, 2, 24),
    (2, 70, 5, 1, 8),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_float64_reference(rng, shape, causal, dtype):
    B, N, Nk, H, d = shape
    q, k, v = qkv(rng, B, N, Nk, H, H, d, dtype)
    o, lse = flashlab.attention_forward(q, k, v, causal=causal)
    ref_o, ref_lse = reference.attention(q, k, v, causal=causal)
    assert o.dtype == dtype and o.shape == q.shape
    assert rel_err(o, ref_o) <= TOL[dtype]
    assert lse.dtype == dtype and lse.shape == (B, H, N)  # float64 end to end for float64
    empty = np.isneginf(ref_lse)  # causal with N > N_k: rows that see no key
    assert np.array_equal(np.isneginf(lse), empty)
    lse_tol = 2e-6 if dtype == np.float32 else 1e-12
    assert np.max(np.abs(lse[~empty] - ref_lse[~empty])) <= lse_tol * max(1.0, np.max(np.abs(ref_lse[~empty])))
    if empty.any():
        assert np.all(o.transpose(0, 2, 1, 3)[empty] == 0)


def test_attention_returns_natural_lse_and_explicit_scale(rng):
    q, k, v = qkv(rng, 1, 9, 9, 2, 2, 16, np.float64)
    o, lse = flashlab.attention(q, k, v, scale=0.3, return_lse=True)
    ref_o, ref_lse2 = reference.attention(q, k, v, scale=0.3)
    assert rel_err(o, ref_o) <= 1e-12
    # natural log of Σ_j exp(0.3·⟨q_i, k_j⟩), computed here directly
    s = 0.3 * np.einsum("bnhd,bmhd->bhnm", q, k)
    direct = np.log(np.exp(s).sum(axis=-1))
    assert np.max(np.abs(lse - direct)) <= 1e-12 * np.max(np.abs(direct))
    assert np.allclose(lse, ref_lse2 * np.log(2.0), rtol=0, atol=1e-12)


def test_grouped_query_attention_is_right_or_refused_by_name(rng):
    """H_kv dividing H: where the library takes it, equal to the reference (which repeats each K/V
    head over its group of query heads); where not, its refusal names heads_kv."""
    q, k, v = qkv(rng, 2, 9, 9, 4, 2, 8, np.float64)
    try:
        o = flashlab.attention(q, k, v, causal=True)
    except flashlab.FlashlabUnsupportedError as e:
        assert "heads_kv" in str(e), str(e)
        return
    ref, _ = reference.attention(q, k, v, causal=True)
    assert rel_err(o, ref) <= 1e-12


def test_strided_inputs_read_as_their_values(rng):
    """A q that is a transposed view ([B, H, N, d] memory) gives the same O as its copy."""
    base = rng.standard_normal((1, 3, 20, 16))
    q = base.transpose(0, 2, 1, 3)  # [B, N, H, d] view, not contiguous
    k, v = (rng.standard_normal((1, 20, 3, 16)) for _ in range(2))
    assert not q.flags.c_contiguous
    o = flashlab.attention(q, k, v, causal=True)
    ref, _ = reference.attention(q, k, v, causal=True)
    assert rel_err(o, ref) <= 1e-12


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 4, 4, 2, 3), (1, 3, 5, 1, 2), (2, 5, 3, 1, 3)])
def test_gradients_match_finite_differences(rng, shape, causal):
    B, N, Nk, H, d = shape
    q, k, v = qkv(rng, B, N, Nk, H, H, d, np.float64)
    do = rng.standard_normal((B, N, H, d))
    o, lse = flashlab.attention_forward(q, k, v, causal=causal)
    dq, dk, dv = flashlab.attention_backward(do, q, k, v, o, lse, causal=causal)
    fd_q = reference.finite_difference(lambda x: reference.attention(x, k, v, causal)[0], q, do)
    fd_k = reference.finite_difference(lambda x: reference.attention(q, x, v, causal)[0], k, do)
    fd_v = reference.finite_difference(lambda x: reference.attention(q, k, x, causal)[0], v, do)
    for got, ref in ((dq, fd_q), (dk, fd_k), (dv, fd_v)):
        assert got.shape == ref.shape
        assert rel_err(got, ref) <= 1e-7


def test_float32_gradients_match_the_float64_ones(rng):
    q, k, v = qkv(rng, 1, 33, 33, 2, 2, 8, np.float64)
    do = rng.standard_normal(q.shape)
    o64, lse64 = flashlab.attention_forward(q, k, v, causal=True)
    g64 = flashlab.attention_backward(do, q, k, v, o64, lse64, causal=True)
    f32 = [x.astype(np.float32) for x in (q, k, v, do)]
    o32, lse32 = flashlab.attention_forward(*f32[:3], causal=True)
    g32 = flashlab.attention_backward(f32[3], *f32[:3], o32, lse32, causal=True)
    for a, b in zip(g32, g64):
        assert a.dtype == np.float32
        assert rel_err(a, b) <= 1e-5


def test_nan_input_is_not_hidden(rng):
    q, k, v = qkv(rng, 1, 8, 8, 1, 1, 8, np.float64)
    v[0, 3, 0, 2] = np.nan
    o = flashlab.attention(q, k, v)
    assert np.isnan(o[0, :, 0, 2]).all()


def test_large_scores_do_not_overflow(rng):
    """±800 scores: exp overflows in float64 without the max subtraction of online softmax."""
    q = np.full((1, 4, 1, 2), 20.0)
    k = np.array([[[[20.0, 20.0]]], [[[-20.0, -20.0]]], [[[20.0, 20.0]]], [[[0.0, 0.0]]]]).reshape(1, 4, 1, 2)
    v = rng.standard_normal((1, 4, 1, 2))
    o, lse = flashlab.attention_forward(q, k, v, scale=1.0)
    ref_o, ref_lse = reference.attention(q, k, v, scale=1.0)
    assert np.isfinite(o).all() and rel_err(o, ref_o) <= 1e-12
    assert np.allclose(lse, ref_lse, rtol=1e-12, atol=0)
