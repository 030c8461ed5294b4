"""Grouped-query attention, N_q ≠ N_k, windows and packed sequences on the NumPy path (the CPU
reference through the C ABI), against a float64 NumPy computation written here from the
definitions, with its gradients (dK and dV summed over each group of query heads).

The mask, per sequence, i and j counted from its first query and key, offset = N_k − N_q: query i
sees key j iff 0 ≤ j < N_k, and j ≤ i + offset when causal, and
i + offset − left ≤ j ≤ i + offset + right for a window (−1: that side unbounded). A row that sees
no key gets O = 0, LSE = −inf and no gradient.

Tolerances: max |got − ref| / max |ref| ≤ 1e-12 (float64 inputs), ≤ 2e-6 (float32).
"""
import numpy as np
import pytest

import flashlab
from flashlab.errors import FlashlabTypeError, FlashlabValueError

TOL = {np.float32: 2e-6, np.float64: 1e-12}


def visible(Nq, Nk, causal, window):
    """[Nq, Nk] booleans: which keys each query sees."""
    i = np.arange(Nq)[:, None]
    j = np.arange(Nk)[None, :]
    diag = i + (Nk - Nq)
    ok = np.ones((Nq, Nk), dtype=bool)
    if causal:
        ok &= j <= diag
    left, right = window
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def dense_f64(q, k, v, do, causal, window, scale=None):
    """O [Nq, H, d], LSE (base 2) [H, Nq], dQ, dK, dV of one sequence in float64: q [Nq, H, d],
    k, v [Nk, H_kv, d], query head h reading key/value head h // (H // H_kv)."""
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    Nq, H, d = q.shape
    Nk, Hkv, _ = k.shape
    g = H // Hkv
    s = 1 / np.sqrt(d) if scale is None else scale
    ok = visible(Nq, Nk, causal, window)
    o = np.zeros_like(q)
    lse = np.full((H, Nq), -np.inf)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(H):
        kh, vh = k[:, h // g], v[:, h // g]
        S = np.where(ok, s * q[:, h] @ kh.T, -np.inf)
        m = S.max(axis=1, keepdims=True)
        seen = np.isfinite(m[:, 0])
        m[~seen] = 0
        P = np.exp(S - m)
        l = P.sum(axis=1, keepdims=True)
        P = np.where(seen[:, None], P / np.where(l > 0, l, 1), 0)
        o[:, h] = P @ vh
        lse[h, seen] = (m[seen, 0] + np.log(l[seen, 0])) / np.log(2)
        dP = do[:, h] @ vh.T
        D = (P * dP).sum(axis=1, keepdims=True)
        dS = P * (dP - D)
        dq[:, h] = s * dS @ kh
        dk[:, h // g] += s * dS.T @ q[:, h]
        dv[:, h // g] += P.T @ do[:, h]
    return o, lse, dq, dk, dv


def rel_err(got, ref):
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape
    assert not np.isnan(got).any(), "NaN in the output"
    scale = np.max(np.abs(ref)) if ref.size else 1.0
    # An all-zero reference (a window of one key: P = 1, so dS = 0) is compared absolutely.
    return np.max(np.abs(got - ref)) / (scale if scale > 0 else 1.0) if got.size else 0.0


def lse_err(got, ref):
    empty = np.isneginf(ref)
    assert np.array_equal(np.isneginf(got), empty), "the rows that see no key differ"
    if empty.all():
        return 0.0
    return np.max(np.abs(got[~empty] - ref[~empty])) / max(1.0, np.max(np.abs(ref[~empty])))


def batch_f64(q, k, v, do, causal, window):
    """dense_f64 of each batch entry of [B, N, H, d] tensors, stacked as the library lays them out."""
    outs = [dense_f64(q[b], k[b], v[b], do[b], causal, window) for b in range(q.shape[0])]
    o, lse, dq, dk, dv = (np.stack([r[i] for r in outs]) for i in range(5))
    return o, lse, dq, dk, dv


def check_dense(rng, B, N, Nk, H, Hkv, d, causal, window, dtype):
    q = rng.standard_normal((B, N, H, d)).astype(dtype)
    k = rng.standard_normal((B, Nk, Hkv, d)).astype(dtype)
    v = rng.standard_normal((B, Nk, Hkv, d)).astype(dtype)
    do = rng.standard_normal((B, N, H, d)).astype(dtype)
    o, lse = flashlab.attention_forward(q, k, v, causal=causal, window=window)
    dq, dk, dv = flashlab.attention_backward(do, q, k, v, o, lse, causal=causal, window=window)
    want = batch_f64(q, k, v, do, causal, window)
    tol = TOL[dtype]
    assert o.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert rel_err(o, want[0]) <= tol
    assert lse_err(lse, want[1]) <= tol
    for got, ref in zip((dq, dk, dv), want[2:]):
        assert rel_err(got, ref) <= tol
    # O of a row that sees no key is 0, and so is its dQ
    empty = np.isneginf(want[1]).transpose(0, 2, 1)  # [B, N, H]
    assert np.all(o[empty] == 0) and np.all(dq[empty] == 0)
    return want


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("H,Hkv", [(4, 4), (8, 2), (32, 1)])  # group sizes 1, 4, 32
def test_grouped_query_attention(rng, H, Hkv, dtype):
    check_dense(rng, 2, 19, 19, H, Hkv, 8, False, (-1, -1), dtype)
    check_dense(rng, 1, 19, 23, H, Hkv, 8, True, (-1, -1), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_causal_with_fewer_keys_than_queries_has_rows_that_see_no_key(rng, dtype):
    want = check_dense(rng, 2, 23, 9, 4, 2, 16, True, (-1, -1), dtype)
    assert np.isneginf(want[1]).any()  # the case is what it claims: 14 rows see no key


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_causal_with_more_keys_than_queries(rng, dtype):
    check_dense(rng, 1, 5, 70, 2, 1, 24, True, (-1, -1), dtype)


@pytest.mark.parametrize("window", [(3, 0), (0, 0), (2, 5), (-1, 4), (6, -1), (100, 100), (-1, -1)])
@pytest.mark.parametrize("causal", [False, True])
def test_windows(rng, window, causal):
    # (100, 100) is wider than N and N_k: the same as no window
    check_dense(rng, 1, 17, 21, 4, 2, 8, causal, window, np.float64)


def test_window_that_misses_every_key(rng):
    # N_k − N = −20: the diagonal of the first rows lies left of key 0, a window (0, 0) sees nothing there
    want = check_dense(rng, 1, 25, 5, 2, 2, 8, False, (0, 0), np.float64)
    assert np.isneginf(want[1]).any() and np.isfinite(want[1]).any()


def test_window_wider_than_the_sequence_equals_none(rng):
    q = rng.standard_normal((1, 12, 2, 8))
    k = rng.standard_normal((1, 12, 2, 8))
    v = rng.standard_normal((1, 12, 2, 8))
    a = flashlab.attention(q, k, v, causal=True, window=(1000, 1000))
    b = flashlab.attention(q, k, v, causal=True)
    assert np.array_equal(a, b)


def packed(rng, lens_q, lens_k, H, Hkv, d, dtype):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((int(cu_q[-1]), H, d)).astype(dtype)
    k = rng.standard_normal((int(cu_k[-1]), Hkv, d)).astype(dtype)
    v = rng.standard_normal((int(cu_k[-1]), Hkv, d)).astype(dtype)
    do = rng.standard_normal(q.shape).astype(dtype)
    return q, k, v, do, cu_q, cu_k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (2, 0)), (False, (1, 3))])
def test_packed_sequences(rng, causal, window, dtype):
    # length-1 sequences, a long one, one with more queries than keys, one with no keys at all
    lens_q = [1, 9, 1, 6, 3, 2]
    lens_k = [1, 9, 4, 2, 3, 0]
    H, Hkv, d = 4, 2, 8
    q, k, v, do, cu_q, cu_k = packed(rng, lens_q, lens_k, H, Hkv, d, dtype)
    o, lse = flashlab.attention_varlen_forward(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                               window=window)
    dq, dk, dv = flashlab.attention_varlen_backward(do, q, k, v, o, lse, cu_q, cu_k, max(lens_q), max(lens_k),
                                                    causal=causal, window=window)
    assert o.shape == q.shape and lse.shape == (H, q.shape[0]) and dk.shape == k.shape
    want_o, want_lse = np.zeros(q.shape), np.full((H, q.shape[0]), -np.inf)
    want_dq, want_dk, want_dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(len(lens_q)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_k[b] == 0:
            continue  # a sequence without keys: O = 0, LSE = −inf, no gradient
        r = dense_f64(q[sq], k[sk], v[sk], do[sq], causal, window)
        want_o[sq], want_lse[:, sq], want_dq[sq], want_dk[sk], want_dv[sk] = r
    tol = TOL[dtype]
    assert rel_err(o, want_o) <= tol
    assert lse_err(lse, want_lse) <= tol
    assert rel_err(dq, want_dq) <= tol and rel_err(dk, want_dk) <= tol and rel_err(dv, want_dv) <= tol
    # The natural-log LSE of attention_varlen, and its O, are the same call's.
    o2, lse_nat = flashlab.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                            window=window, return_lse=True)
    assert np.array_equal(o2, o)
    fin = np.isfinite(lse)
    assert np.allclose(lse_nat[fin], lse[fin] * np.log(2), rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_deterministic_is_the_same_reference(rng, causal):
    # deterministic=True on the CPU: the reference's sums already run in one fixed order, so the
    # flag gives the same bits as without it, run after run, and the float64 gradients.
    lens_q, lens_k = [1, 9, 0, 6], [3, 9, 2, 4]
    q, k, v, do, cu_q, cu_k = packed(rng, lens_q, lens_k, 4, 2, 8, np.float64)
    mq, mk = max(lens_q), max(lens_k)
    o, lse = flashlab.attention_varlen_forward(q, k, v, cu_q, cu_k, mq, mk, causal=causal, deterministic=True)
    o_plain, lse_plain = flashlab.attention_varlen_forward(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    assert np.array_equal(o, o_plain) and np.array_equal(lse, lse_plain)
    assert np.array_equal(flashlab.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=causal, deterministic=True), o)
    runs = [flashlab.attention_varlen_backward(do, q, k, v, o, lse, cu_q, cu_k, mq, mk, causal=causal,
                                               deterministic=det) for det in (True, True, False)]
    for got in runs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(runs[0], got))
    want = [np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)]
    for b in range(len(lens_q)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] and lens_k[b]:
            _, _, want[0][sq], want[1][sk], want[2][sk] = dense_f64(q[sq], k[sk], v[sk], do[sq], causal, (-1, -1))
    assert all(rel_err(got, w) <= TOL[np.float64] for got, w in zip(runs[0], want))
    # attention(..., cu_seqlens_q=...) passes the flag on to the packed call.
    o3 = flashlab.attention(q, k, v, causal=causal, deterministic=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert np.array_equal(o3, o)


def test_packed_equals_dense_batch(rng):
    # Equal lengths: the packed call is the dense [B, N, H, d] call reshaped.
    B, N, H, Hkv, d = 3, 7, 4, 4, 8
    q = rng.standard_normal((B, N, H, d))
    k = rng.standard_normal((B, N, Hkv, d))
    v = rng.standard_normal((B, N, Hkv, d))
    cu = np.arange(0, B * N + 1, N, dtype=np.int32)
    dense = flashlab.attention(q, k, v, causal=True)
    pk = flashlab.attention_varlen(q.reshape(B * N, H, d), k.reshape(B * N, Hkv, d), v.reshape(B * N, Hkv, d), cu,
                                   cu, N, N, causal=True)
    assert np.max(np.abs(pk - dense.reshape(B * N, H, d))) <= 1e-14


# ---- refusals, each naming the argument ----------------------------------------------------------

def small(rng, Nq=6, Nk=6, H=4, Hkv=2, d=8):
    return (rng.standard_normal((1, Nq, H, d)), rng.standard_normal((1, Nk, Hkv, d)),
            rng.standard_normal((1, Nk, Hkv, d)))


def test_heads_that_do_not_divide_are_refused(rng):
    q, _, _ = small(rng, H=4)
    k = rng.standard_normal((1, 6, 3, 8))
    with pytest.raises(FlashlabValueError, match="k: 3 key/value heads do not divide q's 4 heads"):
        flashlab.attention(q, k, k)


@pytest.mark.parametrize("window,kind,match", [
    ((-2, 0), FlashlabValueError, "window: the left side -2"),
    ((0, 2**31), FlashlabValueError, "window: the right side 2147483648"),
    ((1.5, 0), FlashlabTypeError, "window: the left side 1.5 is not an int"),
    ((1, 2, 3), FlashlabTypeError, "window: expected a pair"),
    (4, FlashlabTypeError, "window: expected a pair"),
])
def test_bad_window_is_refused(rng, window, kind, match):
    q, k, v = small(rng)
    with pytest.raises(kind, match=match):
        flashlab.attention(q, k, v, window=window)


def varlen_args(rng):
    q, k, v, do, cu_q, cu_k = packed(rng, [2, 3], [2, 3], 2, 2, 8, np.float64)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("cu_q,cu_k,match", [
    ([0, 3, 2, 5], [0, 1, 3, 5], r"cu_seqlens_q\[2\] = 2 is below cu_seqlens_q\[1\] = 3"),  # not increasing
    ([0, 2, 4], None, "cu_seqlens_q: the last entry 4 differs from q's 5 rows"),  # last ≠ total
    (None, [0, -1, 5], r"cu_seqlens_k\[1\] = -1 is negative"),  # negative
    ([1, 3, 5], None, r"cu_seqlens_q\[0\] = 1 is not 0"),
    ([5], None, "cu_seqlens_q: 1 entries, fewer than 2"),
    (None, [0, 1, 2, 5], "cu_seqlens_k: 4 entries but cu_seqlens_q has 3"),  # too long
    ([0.0, 2.0, 5.0], None, "cu_seqlens_q: expected a 1-D integer array"),
])
def test_bad_cu_seqlens_are_refused(rng, cu_q, cu_k, match):
    q, k, v, good_q, good_k = varlen_args(rng)
    cu_q = good_q if cu_q is None else np.asarray(cu_q)
    cu_k = good_k if cu_k is None else np.asarray(cu_k)
    with pytest.raises((FlashlabValueError, FlashlabTypeError), match=match):
        flashlab.attention_varlen(q, k, v, cu_q, cu_k, 5, 5)


def test_sequence_longer_than_max_seqlen_is_refused(rng):
    q, k, v, cu_q, cu_k = varlen_args(rng)
    with pytest.raises(FlashlabValueError, match="cu_seqlens_q holds a sequence of 3 queries, longer than .*max_seqlen_q"):
        flashlab.attention_varlen(q, k, v, cu_q, cu_k, 2, 3)
    with pytest.raises(FlashlabValueError, match="cu_seqlens_k holds a sequence of 3 keys, longer than .*max_seqlen_k"):
        flashlab.attention_varlen(q, k, v, cu_q, cu_k, 3, 2)
    with pytest.raises(FlashlabValueError, match="max_seqlen_q: 0 is below 1"):
        flashlab.attention_varlen(q, k, v, cu_q, cu_k, 0, 3)


def test_varlen_shapes_are_checked(rng):
    q, k, v, cu_q, cu_k = varlen_args(rng)
    with pytest.raises(FlashlabValueError, match=r"q: expected 3 dimensions \[total_q, H, d\]"):
        flashlab.attention_varlen(q[None], k, v, cu_q, cu_k, 3, 3)
    with pytest.raises(FlashlabValueError, match="k: head dim 4 differs from q's 8"):
        flashlab.attention_varlen(q, k[..., :4], v[..., :4], cu_q, cu_k, 3, 3)


def test_attention_with_cu_seqlens_runs_the_packed_call(rng):
    """flashlab.attention(..., cu_seqlens_q=, cu_seqlens_k=) is attention_varlen, the longest
    lengths read off the lists when not given; cu_seqlens_k defaults to cu_seqlens_q."""
    cu_q, cu_k = np.array([0, 3, 3, 10], dtype=np.int32), np.array([0, 5, 6, 6], dtype=np.int32)
    q = rng.standard_normal((10, 4, 16))
    k = rng.standard_normal((6, 2, 16))
    v = rng.standard_normal((6, 2, 16))
    for causal in (False, True):
        got, lse = flashlab.attention(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True)
        want, want_lse = flashlab.attention_varlen(q, k, v, cu_q, cu_k, 7, 5, causal=causal, return_lse=True)
        assert np.array_equal(got, want) and np.array_equal(lse, want_lse)
    kq = rng.standard_normal((10, 2, 16))
    got = flashlab.attention(q, kq, kq, causal=True, cu_seqlens_q=cu_q)
    assert np.array_equal(got, flashlab.attention_varlen(q, kq, kq, cu_q, cu_q, 7, 7, causal=True))
    with pytest.raises(FlashlabValueError, match="cu_seqlens_q: None but cu_seqlens_k"):
        flashlab.attention(q, k, v, cu_seqlens_k=cu_k)
    with pytest.raises(FlashlabValueError, match=r"cu_seqlens_q\[2\] = 2 is below cu_seqlens_q\[1\] = 3"):
        flashlab.attention(q, q, q, cu_seqlens_q=[0, 3, 2, 10])
