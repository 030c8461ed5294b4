"""The NumPy path: float32/float64 arrays on the host run the CPU reference through the C ABI.

One C call per operation; outputs are new C-contiguous arrays. Inputs are passed with their
strides where the last axis is contiguous (a stride of 0 tells the library "contiguous");
otherwise a contiguous copy is passed.
"""

import ctypes
from typing import Dict, Optional, Tuple

import numpy as np

from . import _capi, _checks
from .errors import FlashlabTypeError, FlashlabValueError

_DTYPES = {np.dtype(np.float32): _capi.DTYPE_F32, np.dtype(np.float64): _capi.DTYPE_F64}

#: NumPy dtype of STREAM's edge records (flashlab_stream_edge, 24 bytes).
#: Query rows the MTA decode computes at most (FLASHLAB_MTA_DECODE_ROWS).
DECODE_ROWS = 16

EDGE_DTYPE = np.dtype([("q", "<i4"), ("r", "<i4"), ("slot", "<i4"),
                       ("score", "<f4"), ("mass", "<f4"), ("value_norm", "<f4")])
assert EDGE_DTYPE.itemsize == ctypes.sizeof(_capi.StreamEdge)


def _array(name: str, a, dtype: Optional[np.dtype] = None) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise FlashlabTypeError(
            f"{name}: expected a numpy.ndarray or a torch.Tensor, got {type(a).__name__}",
            hint="pass arrays of one kind: all NumPy (CPU reference) or all torch",
        )
    if dtype is not None and a.dtype != dtype:
        raise FlashlabTypeError(f"{name}: dtype {a.dtype} differs from q's {dtype}",
                                hint="q, k, v (and the gradients) share one dtype")
    return a


def _dtype_code(name: str, a: np.ndarray) -> int:
    code = _DTYPES.get(a.dtype)
    if code is None:
        raise _checks.unsupported_dtype(name, a.dtype, "the CPU reference", "float32 or float64")
    return code


def _tensor(a: np.ndarray, packed: bool = False) -> Tuple[_capi.Tensor, np.ndarray]:
    """A flashlab_tensor for `a` (and the array it points into, to keep alive): strides of the
    leading dims in elements, 0 for contiguous; a contiguous copy where the last axis is not.
    `packed`: `a` is `[total, H, d]`, the ABI's `[1, total, H, d]` (row stride in stride[1])."""
    if a.flags.c_contiguous:
        return _capi.Tensor(a.ctypes.data), a
    item = a.itemsize
    # A stride of 0 would read as "contiguous" to the library: broadcast arrays are copied too.
    if a.strides[-1] != item or any(s % item or s <= 0 for s in a.strides[:-1]):
        a = np.ascontiguousarray(a)
        return _capi.Tensor(a.ctypes.data), a
    strides = [s // item for s in a.strides[:-1]]
    if len(strides) == 1:  # STREAM's [T, d]: the row stride travels in stride[1]
        strides = [0, strides[0], 0]
    elif packed:  # [total, H, d]: rows and heads in stride[1] and stride[2]
        strides = [0] + strides
    return _capi.Tensor(a.ctypes.data, (ctypes.c_int64 * 3)(*strides)), a


def _call(fn_name: str, *args) -> None:
    L = _capi.lib()
    status = getattr(L, fn_name)(*args)
    if status:
        raise L.fail(status, "flashlab_" + fn_name)


def _ptr(a: Optional[np.ndarray]) -> Optional[int]:
    return None if a is None else a.ctypes.data


def _workspace(problem: _checks.Problem, size_fn: str) -> Tuple[Optional[int], int, Optional[np.ndarray]]:
    n = problem.workspace_bytes(size_fn, _capi.DEVICE_CPU, 0)
    if n == 0:
        return None, 0, None
    ws = np.empty(n, dtype=np.uint8)
    return ws.ctypes.data, n, ws


def stat_dtype(q: np.ndarray) -> np.dtype:
    """The dtype of LSE, W and dW beside q: float64 for a float64 problem, float32 otherwise."""
    return np.dtype(np.float64) if q.dtype == np.float64 else np.dtype(np.float32)


def _stat(name: str, a, q: np.ndarray, shape: tuple) -> np.ndarray:
    a = _array(name, a)
    want = stat_dtype(q)
    if a.dtype != want:
        raise FlashlabTypeError(f"{name}: dtype {a.dtype}, expected {want} beside q's {q.dtype}",
                                hint="statistics and MTA kernels are float64 for a float64 problem, float32 otherwise")
    if a.shape != shape:
        raise FlashlabValueError(f"{name}: shape {a.shape}, expected {shape}", hint=None)
    return np.ascontiguousarray(a)


# ------------------------------------------------------------------------------------------------
# Attention
# ------------------------------------------------------------------------------------------------

def attention_forward(q, k, v, causal: bool, scale: Optional[float], deterministic: bool = False,
                      window: Tuple[int, int] = (-1, -1)):
    """(O, LSE) of the CPU reference; LSE is the ABI's base-2 log-sum-exp `[B, H, N]` (float64 for
    float64 inputs, float32 otherwise)."""
    q = _array("q", q)
    k, v = _array("k", k, q.dtype), _array("v", v, q.dtype)
    dtype = _dtype_code("q", q)
    B, N, Nk, H, Hkv, d = _checks.attention_shapes(q.shape, k.shape, v.shape)
    p = _checks.attention_problem(B, N, Nk, H, Hkv, d, _checks.check_scale(scale), bool(causal), dtype,
                                  bool(deterministic), _checks.check_window(window))
    o = np.empty((B, N, H, d), dtype=q.dtype)
    lse = np.empty((B, H, N), dtype=stat_dtype(q))
    (tq, _q), (tk, _k), (tv, _v) = _tensor(q), _tensor(k), _tensor(v)
    # The forward's scratch holds LSE when the caller passes none (flashlab.h): we always pass it.
    _call("attention_forward", p.address, _capi.DEVICE_CPU, tq, tk, tv, _capi.Tensor(o.ctypes.data),
          lse.ctypes.data, None, 0, None)
    return o, lse


def attention_backward(do, q, k, v, o, lse, causal: bool, scale: Optional[float], deterministic: bool = False,
                       window: Tuple[int, int] = (-1, -1)):
    """(dQ, dK, dV) of the CPU reference for the loss Σ O∘dO."""
    q = _array("q", q)
    k, v = _array("k", k, q.dtype), _array("v", v, q.dtype)
    o, do = _array("o", o, q.dtype), _array("do", do, q.dtype)
    dtype = _dtype_code("q", q)
    B, N, Nk, H, Hkv, d = _checks.attention_shapes(q.shape, k.shape, v.shape)
    for name, a in (("o", o), ("do", do)):
        if a.shape != q.shape:
            raise FlashlabValueError(f"{name}: shape {a.shape} differs from q's {q.shape}", hint=None)
    lse = _stat("lse", lse, q, (B, H, N))
    p = _checks.attention_problem(B, N, Nk, H, Hkv, d, _checks.check_scale(scale), bool(causal), dtype,
                                  bool(deterministic), _checks.check_window(window))
    dq = np.empty_like(q, order="C")
    dk = np.empty((B, Nk, Hkv, d), dtype=q.dtype)
    dv = np.empty((B, Nk, Hkv, d), dtype=q.dtype)
    t = [_tensor(a) for a in (q, k, v, o, do)]
    ws, nws, _ws = _workspace(p, "attention_backward_workspace_size")
    _call("attention_backward", p.address, _capi.DEVICE_CPU, t[0][0], t[1][0], t[2][0], t[3][0], lse.ctypes.data,
          t[4][0], _capi.Tensor(dq.ctypes.data), _capi.Tensor(dk.ctypes.data), _capi.Tensor(dv.ctypes.data),
          ws, nws, None)
    return dq, dk, dv


def _prefix_sums(name: str, cu, rows: int, rows_of: str) -> np.ndarray:
    """A contiguous int32 copy of one cu_seqlens list, checked for what the library cannot see:
    1-D integers, at least two entries, the last equal to the packed tensor's rows. The library
    checks the rest (starts at 0, never decreases, no sequence longer than max_seqlen)."""
    a = np.asarray(cu)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise FlashlabTypeError(f"{name}: expected a 1-D integer array, got dtype {a.dtype} and shape {a.shape}",
                                hint="B sequences take B + 1 prefix sums, e.g. [0, 3, 7] for lengths 3 and 4")
    if a.size < 2:
        raise FlashlabValueError(f"{name}: {a.size} entries, fewer than 2",
                                 hint="B sequences take B + 1 prefix sums, e.g. [0, 3, 7] for lengths 3 and 4")
    if a.min() < -2**31 or a.max() > 2**31 - 1:
        raise FlashlabValueError(f"{name}: entries beyond int32", hint="prefix sums are int32, as FlashAttention's")
    if int(a[-1]) != rows:
        raise FlashlabValueError(f"{name}: the last entry {int(a[-1])} differs from {rows_of}'s {rows} rows",
                                 hint="the last prefix sum is the number of packed rows")
    return np.ascontiguousarray(a, dtype=np.int32)


def _varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window,
                    deterministic=False):
    q = _array("q", q)
    k, v = _array("k", k, q.dtype), _array("v", v, q.dtype)
    dtype = _dtype_code("q", q)
    total_q, total_k, H, Hkv, d = _checks.varlen_shapes(q.shape, k.shape, v.shape)
    cu_q = _prefix_sums("cu_seqlens_q", cu_seqlens_q, total_q, "q")
    cu_k = _prefix_sums("cu_seqlens_k", cu_seqlens_k, total_k, "k")
    if cu_q.size != cu_k.size:
        raise FlashlabValueError(f"cu_seqlens_k: {cu_k.size} entries but cu_seqlens_q has {cu_q.size}",
                                 hint="both list the same B sequences, B + 1 entries each")
    max_q = _checks.check_positive_int("max_seqlen_q", max_seqlen_q)
    max_k = _checks.check_positive_int("max_seqlen_k", max_seqlen_k)
    p = _checks.packed_attention_problem(cu_q.size - 1, max_q, max_k, H, Hkv, d, _checks.check_scale(scale),
                                         bool(causal), dtype, _checks.check_window(window), cu_q.ctypes.data,
                                         cu_k.ctypes.data, total_q, total_k, bool(deterministic))
    return q, k, v, p, (cu_q, cu_k), (total_q, total_k, H, Hkv, d)


def attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal: bool,
                             scale: Optional[float], window: Tuple[int, int], deterministic: bool = False):
    """(O `[total_q, H, d]`, LSE `[H, total_q]`, base 2) of the CPU reference on packed sequences."""
    q, k, v, p, keep, (total_q, total_k, H, Hkv, d) = _varlen_problem(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window, deterministic)
    o = np.empty((total_q, H, d), dtype=q.dtype)
    lse = np.empty((H, total_q), dtype=stat_dtype(q))
    (tq, _q), (tk, _k), (tv, _v) = _tensor(q, packed=True), _tensor(k, packed=True), _tensor(v, packed=True)
    _call("attention_forward", p.address, _capi.DEVICE_CPU, tq, tk, tv, _capi.Tensor(o.ctypes.data),
          lse.ctypes.data, None, 0, None)
    return o, lse


def attention_varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              causal: bool, scale: Optional[float], window: Tuple[int, int],
                              deterministic: bool = False):
    """(dQ, dK, dV) of the CPU reference on packed sequences, for the loss Σ O∘dO (every sum in one
    fixed order: bit-reproducible with deterministic or without)."""
    q, k, v, p, keep, (total_q, total_k, H, Hkv, d) = _varlen_problem(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window, deterministic)
    o, do = _array("o", o, q.dtype), _array("do", do, q.dtype)
    for name, a in (("o", o), ("do", do)):
        if a.shape != q.shape:
            raise FlashlabValueError(f"{name}: shape {a.shape} differs from q's {q.shape}", hint=None)
    lse = _stat("lse", lse, q, (H, total_q))
    dq = np.empty_like(q, order="C")
    dk = np.empty((total_k, Hkv, d), dtype=q.dtype)
    dv = np.empty((total_k, Hkv, d), dtype=q.dtype)
    t = [_tensor(a, packed=True) for a in (q, k, v, o, do)]
    ws, nws, _ws = _workspace(p, "attention_backward_workspace_size")
    _call("attention_backward", p.address, _capi.DEVICE_CPU, t[0][0], t[1][0], t[2][0], t[3][0], lse.ctypes.data,
          t[4][0], _capi.Tensor(dq.ctypes.data), _capi.Tensor(dk.ctypes.data), _capi.Tensor(dv.ctypes.data),
          ws, nws, None)
    return dq, dk, dv


# ------------------------------------------------------------------------------------------------
# Multi-Token Attention
# ------------------------------------------------------------------------------------------------

def _mta_problem(q, k, v, w, scale):
    q = _array("q", q)
    k, v = _array("k", k, q.dtype), _array("v", v, q.dtype)
    dtype = _dtype_code("q", q)
    w = _array("w", w)
    B, N, H, d, cq, ck = _checks.mta_shapes(q.shape, k.shape, v.shape, w.shape)
    w = _stat("w", w, q, (H, cq, ck))
    p = _checks.mta_problem(B, N, H, d, cq, ck, _checks.check_scale(scale), dtype)
    return p, q, k, v, w


def mta_forward(q, k, v, w, scale: Optional[float]):
    """(O, LSE) of the MTA reference; LSE `[B, H, N]` as the backward needs it."""
    p, q, k, v, w = _mta_problem(q, k, v, w, scale)
    B, N, H, d = q.shape
    o = np.empty((B, N, H, d), dtype=q.dtype)
    lse = np.empty((B, H, N), dtype=stat_dtype(q))
    t = [_tensor(a) for a in (q, k, v)]
    ws, nws, _ws = _workspace(p, "mta_forward_workspace_size")
    _call("mta_forward", p.address, _capi.DEVICE_CPU, t[0][0], t[1][0], t[2][0], w.ctypes.data,
          _capi.Tensor(o.ctypes.data), lse.ctypes.data, ws, nws, None)
    return o, lse


def mta_backward(do, q, k, v, w, o, lse, scale: Optional[float]):
    """(dQ, dK, dV, dW) of the MTA reference; dW `[H, cq, ck]` in w's dtype, summed over the batch."""
    p, q, k, v, w = _mta_problem(q, k, v, w, scale)
    B, N, H, d = q.shape
    o, do = _array("o", o, q.dtype), _array("do", do, q.dtype)
    for name, a in (("o", o), ("do", do)):
        if a.shape != q.shape:
            raise FlashlabValueError(f"{name}: shape {a.shape} differs from q's {q.shape}", hint=None)
    lse = _stat("lse", lse, q, (B, H, N))
    dq, dk, dv = (np.empty((B, N, H, d), dtype=q.dtype) for _ in range(3))
    dw = np.empty(w.shape, dtype=w.dtype)
    t = [_tensor(a) for a in (q, k, v, o, do)]
    ws, nws, _ws = _workspace(p, "mta_backward_workspace_size")
    _call("mta_backward", p.address, _capi.DEVICE_CPU, t[0][0], t[1][0], t[2][0], w.ctypes.data, t[3][0],
          lse.ctypes.data, t[4][0], _capi.Tensor(dq.ctypes.data), _capi.Tensor(dk.ctypes.data),
          _capi.Tensor(dv.ctypes.data), dw.ctypes.data, ws, nws, None)
    return dq, dk, dv, dw


def mta_decode(q, k, v, w, scale: Optional[float]):
    """O `[B, R, H, d]` of the last R = min(16, N) query rows (row r is token N − R + r), by the
    split-K decode; q, k, v `[B, N, H, d]` (of q only the last R + cq − 1 rows are read)."""
    p, q, k, v, w = _mta_problem(q, k, v, w, scale)
    B, N, H, d = q.shape
    R = min(DECODE_ROWS, N)
    o = np.empty((B, R, H, d), dtype=q.dtype)
    t = [_tensor(a) for a in (q, k, v)]
    ws, nws, _ws = _workspace(p, "mta_decode_workspace_size")
    _call("mta_decode", p.address, _capi.DEVICE_CPU, t[0][0], t[1][0], t[2][0], w.ctypes.data,
          _capi.Tensor(o.ctypes.data), ws, nws, None)
    return o


# ------------------------------------------------------------------------------------------------
# STREAM
# ------------------------------------------------------------------------------------------------

def _stream_problem(q, k, v, k_blocks, bq, bk, mask=None):
    q = _array("q", q)
    k = _array("k", k, q.dtype)
    if v is not None:
        v = _array("v", v, q.dtype)
    dtype = _dtype_code("q", q)
    T, d = _checks.stream_shapes(q.shape, k.shape, None if v is None else v.shape)
    bq, bk = _checks.check_positive_int("bq", bq), _checks.check_positive_int("bk", bk)
    k_blocks = _checks.check_positive_int("k_blocks", k_blocks)
    mask_arr = None
    if mask is not None:
        mask_arr = stream_mask_bytes(mask, T, bq, bk)
    p = _checks.stream_problem(T, d, bq, bk, k_blocks, dtype, _ptr(mask_arr))
    return p, q, k, v, mask_arr


def stream_mask_bytes(mask, T: int, bq: int, bk: int) -> np.ndarray:
    """The user block mask as the ABI reads it: C-contiguous uint8 0/1 `[n_q, n_k]` on the host."""
    m = np.asarray(mask)
    n_q, n_k = -(-T // bq), -(-T // bk)
    if m.shape != (n_q, n_k):
        raise FlashlabValueError(f"mask: shape {m.shape}, expected (n_q, n_k) = {(n_q, n_k)}",
                                 hint="one entry per (query block, key block): n_q = ceil(T/bq), n_k = ceil(T/bk)")
    if m.dtype == np.bool_:
        return np.ascontiguousarray(m, dtype=np.uint8)
    if m.dtype.kind not in "iu":
        raise FlashlabTypeError(f"mask: dtype {m.dtype}, expected bool or an integer type holding 0/1", hint=None)
    bad = np.argwhere((m != 0) & (m != 1))
    if bad.size:
        qb, rb = (int(x) for x in bad[0])
        raise FlashlabValueError(f"mask: entry [{qb}, {rb}] is {m[qb, rb]}, not 0 or 1", hint=None)
    return np.ascontiguousarray(m, dtype=np.uint8)


def stream_estimate(q, k, k_blocks: int, bq: int, bk: int, mask=None) -> np.ndarray:
    """Indices int64 `[n_q, k_blocks]` (−1 = empty) of the STREAM mask estimate."""
    p, q, k, _, _mask = _stream_problem(q, k, None, k_blocks, bq, bk, mask)
    n_q = ctypes.c_int64(0)
    _call("stream_query_blocks", p.address, ctypes.byref(n_q))
    idx = np.empty((n_q.value, k_blocks), dtype=np.int64)
    tq, tk = _tensor(q), _tensor(k)
    ws, nws, _ws = _workspace(p, "stream_estimate_workspace_size")
    _call("stream_estimate", p.address, _capi.DEVICE_CPU, tq[0], tk[0], idx.ctypes.data, ws, nws, None)
    return idx


def _indices(indices, T: int, bq: int) -> np.ndarray:
    idx = _array("indices", indices)
    if idx.dtype != np.int64:
        raise FlashlabTypeError(f"indices: dtype {idx.dtype}, expected int64", hint="pass what stream.estimate returned")
    _checks.check_rank("indices", idx.shape, 2, "[n_q, k_blocks]")
    n_q = -(-T // bq)
    if idx.shape[0] != n_q:
        raise FlashlabValueError(f"indices: {idx.shape[0]} rows, expected n_q = ceil(T/bq) = {n_q}", hint=None)
    return np.ascontiguousarray(idx)


def stream_apply(q, k, v, indices, bq: int, bk: int) -> np.ndarray:
    """O `[T, d]` of the sparse attention over the key blocks in `indices`."""
    idx = _array("indices", indices)
    p, q, k, v, _ = _stream_problem(q, k, v, idx.shape[1] if idx.ndim == 2 else 1, bq, bk)
    idx = _indices(idx, q.shape[0], bq)
    o = np.empty(q.shape, dtype=q.dtype)
    t = [_tensor(a) for a in (q, k, v)]
    ws, nws, _ws = _workspace(p, "stream_apply_workspace_size")
    _call("stream_apply", p.address, _capi.DEVICE_CPU, t[0][0], t[1][0], t[2][0], idx.ctypes.data,
          _capi.Tensor(o.ctypes.data), ws, nws, None)
    return o


def stream_trace(q, k, v, indices, bq: int, bk: int) -> Tuple[np.ndarray, np.ndarray]:
    """(O `[T, d]`, edge records: a structured array of EDGE_DTYPE, n_q·k_blocks long)."""
    idx = _array("indices", indices)
    p, q, k, v, _ = _stream_problem(q, k, v, idx.shape[1] if idx.ndim == 2 else 1, bq, bk)
    idx = _indices(idx, q.shape[0], bq)
    o = np.empty(q.shape, dtype=q.dtype)
    edges = np.empty(idx.size, dtype=EDGE_DTYPE)
    t = [_tensor(a) for a in (q, k, v)]
    ws, nws, _ws = _workspace(p, "stream_apply_workspace_size")
    _call("stream_trace", p.address, _capi.DEVICE_CPU, t[0][0], t[1][0], t[2][0], idx.ctypes.data,
          _capi.Tensor(o.ctypes.data), edges.ctypes.data, ws, nws, None)
    return o, edges


def edges_as_dict(edges: np.ndarray) -> Dict[str, np.ndarray]:
    """The edge records as one array per field."""
    return {name: edges[name].copy() for name in EDGE_DTYPE.names}
