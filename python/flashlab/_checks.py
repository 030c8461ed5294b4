"""Shape and argument checks shared by the NumPy and the PyTorch paths, and the problem structs.

The checks here are the ones cheap enough to run in Python before any C call, on shapes only
(tuples), so that torch.compile can trace them; every limit of the kernels themselves (head dims,
dtypes, sizes) is the library's, checked by the C call, whose message the error carries. The
problem structs are cached per shape: building a ctypes struct costs more than the rest of a
call's Python work, and a struct is never written after it is built.
"""

import ctypes
import math
import threading
from typing import Dict, Optional, Sequence, Tuple

from . import _capi
from .errors import FlashlabTypeError, FlashlabUnsupportedError, FlashlabValueError

_CACHE_LIMIT = 512


def _shape_str(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def check_rank(name: str, shape: Sequence[int], rank: int, layout: str) -> None:
    """ValueError unless `shape` has `rank` dimensions."""
    if len(shape) != rank:
        raise FlashlabValueError(
            f"{name}: expected {rank} dimensions {layout}, got shape {_shape_str(shape)}",
            hint=f"reshape {name} to {layout}",
        )


def attention_shapes(q: Sequence[int], k: Sequence[int], v: Sequence[int]) -> Tuple[int, int, int, int, int, int]:
    """(B, N, N_k, H, H_kv, d) of q `[B, N, H, d]`, k and v `[B, N_k, H_kv, d]`; ValueError naming
    the argument whose shape disagrees."""
    check_rank("q", q, 4, "[B, N, H, d]")
    check_rank("k", k, 4, "[B, N_k, H_kv, d]")
    check_rank("v", v, 4, "[B, N_k, H_kv, d]")
    B, N, H, d = (int(s) for s in q)
    if tuple(k) != tuple(v):
        raise FlashlabValueError(
            f"v: shape {_shape_str(v)} differs from k's {_shape_str(k)}",
            hint="k and v are both [B, N_k, H_kv, d]",
        )
    if int(k[0]) != B:
        raise FlashlabValueError(f"k: batch {int(k[0])} differs from q's {B}", hint="q, k and v share B")
    if int(k[3]) != d:
        raise FlashlabValueError(
            f"k: head dim {int(k[3])} differs from q's {d}",
            hint="q, k and v share d (a value head dim of its own is not supported)",
        )
    Nk, Hkv = int(k[1]), int(k[2])
    if Hkv < 1 or H % Hkv != 0:
        raise FlashlabValueError(
            f"k: {Hkv} key/value heads do not divide q's {H} heads",
            hint="grouped-query attention needs H_kv dividing H (H_kv = H for plain attention)",
        )
    return B, N, Nk, H, Hkv, d


def mta_shapes(q: Sequence[int], k: Sequence[int], v: Sequence[int], w: Sequence[int]) -> Tuple[int, int, int, int, int, int]:
    """(B, N, H, d, cq, ck) of q, k, v `[B, N, H, d]` and w `[H, cq, ck]`."""
    for name, s in (("q", q), ("k", k), ("v", v)):
        check_rank(name, s, 4, "[B, N, H, d]")
    for name, s in (("k", k), ("v", v)):
        if tuple(s) != tuple(q):
            raise FlashlabValueError(
                f"{name}: shape {_shape_str(s)} differs from q's {_shape_str(q)}",
                hint="Multi-Token Attention takes q, k, v of one shape [B, N, H, d]",
            )
    check_rank("w", w, 3, "[H, cq, ck]")
    B, N, H, d = (int(s) for s in q)
    if int(w[0]) != H:
        raise FlashlabValueError(f"w: {int(w[0])} kernels for {H} heads", hint="w is [H, cq, ck], one kernel per head")
    return B, N, H, d, int(w[1]), int(w[2])


def stream_shapes(q: Sequence[int], k: Sequence[int], v: Optional[Sequence[int]] = None) -> Tuple[int, int]:
    """(T, d) of STREAM's one-head q, k (and v) `[T, d]`."""
    check_rank("q", q, 2, "[T, d]")
    for name, s in (("k", k), ("v", v)):
        if s is None:
            continue
        check_rank(name, s, 2, "[T, d]")
        if tuple(s) != tuple(q):
            raise FlashlabValueError(
                f"{name}: shape {_shape_str(s)} differs from q's {_shape_str(q)}",
                hint="STREAM takes one head: q, k, v all [T, d]",
            )
    return int(q[0]), int(q[1])


def check_scale(scale: Optional[float]) -> float:
    """The scale for a problem struct: None → 0.0 (the library's 1/√d); ValueError unless a
    finite number > 0 (the ABI reads 0 as "default", so an explicit 0 is refused, not reinterpreted)."""
    if scale is None:
        return 0.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise FlashlabTypeError(f"scale: expected a float or None, got {type(scale).__name__}",
                                hint="pass scale=None for 1/sqrt(d)")
    s = float(scale)
    if not math.isfinite(s) or s <= 0.0:
        raise FlashlabValueError(f"scale: {s} is not a finite number > 0", hint="pass scale=None for 1/sqrt(d)")
    return s


def check_positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FlashlabTypeError(f"{name}: expected an int, got {type(value).__name__}", hint=None)
    if value < 1:
        raise FlashlabValueError(f"{name}: {value} is below 1", hint=f"{name} counts blocks or tokens: at least 1")
    return value


def unsupported_dtype(name: str, dtype: object, device: str, allowed: str) -> FlashlabTypeError:
    return FlashlabTypeError(
        f"{name}: dtype {dtype} is not taken on {device} (takes {allowed})",
        hint="the CUDA kernels take bfloat16/float16 tensors; the CPU reference float32/float64 arrays",
    )


def device_without_cuda() -> FlashlabUnsupportedError:
    return FlashlabUnsupportedError(
        f"{_capi.lib().path} was built without the CUDA kernels",
        hint="build with `make cuda` (the `cuda` preset) and point FLASHLAB_LIBRARY at build/cuda's library",
    )


class _Cache:
    """A bounded dict shared by all threads (entries are immutable once stored)."""

    def __init__(self) -> None:
        self._d: Dict[tuple, object] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple):
        return self._d.get(key)

    def put(self, key: tuple, value):
        with self._lock:
            if len(self._d) >= _CACHE_LIMIT:
                self._d.clear()
            self._d[key] = value
        return value


_problems = _Cache()


class Problem:
    """A problem struct (``c``, passed to the library by address) and its workspace sizes,
    found once per (size query, device) and kept with it."""

    __slots__ = ("c", "address", "_ws")

    def __init__(self, c: ctypes.Structure):
        self.c = c
        self.address = ctypes.addressof(c)
        self._ws: Dict[tuple, int] = {}

    def check(self, check_fn: str, device: int) -> None:
        """Raises the library's error unless ``flashlab_<check_fn>`` accepts this problem on
        `device`; asked once per device (the verdict depends on the problem and the build only)."""
        key = ("check", check_fn, device)
        if key in self._ws:
            return
        L = _capi.lib()
        status = getattr(L, check_fn)(self.address, device)
        if status:
            raise L.fail(status, "flashlab_" + check_fn)
        self._ws[key] = 0

    def accepts(self, check_fn: str, device: int) -> bool:
        """Whether ``flashlab_<check_fn>`` accepts this problem on `device` (no exception)."""
        key = ("accepts", check_fn, device)
        ok = self._ws.get(key)
        if ok is None:
            ok = self._ws[key] = int(getattr(_capi.lib(), check_fn)(self.address, device) == _capi.OK)
        return bool(ok)

    def workspace_bytes(self, size_fn: str, device: int, device_index: int) -> int:
        """Bytes of scratch the size query ``flashlab_<size_fn>`` reports for this problem."""
        key = (size_fn, device, device_index)
        n = self._ws.get(key)
        if n is None:
            L = _capi.lib()
            out = ctypes.c_size_t(0)
            status = getattr(L, size_fn)(self.address, device, ctypes.byref(out))
            if status:
                raise L.fail(status, "flashlab_" + size_fn)
            n = self._ws[key] = int(out.value)
        return n


def attention_problem(B: int, N: int, Nk: int, H: int, Hkv: int, d: int, scale: float, causal: bool,
                      dtype: int, deterministic: bool, window: Tuple[int, int] = (-1, -1)) -> Problem:
    key = ("attention", B, N, Nk, H, Hkv, d, scale, causal, dtype, deterministic, window)
    p = _problems.get(key)
    if p is None:
        p = _problems.put(key, Problem(_capi.AttentionProblem(
            ctypes.sizeof(_capi.AttentionProblem), B, N, Nk, H, Hkv, d, scale, int(causal), dtype,
            int(deterministic), window[0], window[1], None, None, 0, 0)))
    return p


def packed_attention_problem(B: int, max_q: int, max_k: int, H: int, Hkv: int, d: int, scale: float, causal: bool,
                             dtype: int, window: Tuple[int, int], cu_q: int, cu_k: int, total_q: int,
                             total_k: int, deterministic: bool = False) -> Problem:
    """A packed-sequences problem (FlashAttention's varlen): B sequences, the prefix sums at the
    addresses cu_q and cu_k (int32, B + 1 each). Not cached: the addresses differ per call."""
    return Problem(_capi.AttentionProblem(
        ctypes.sizeof(_capi.AttentionProblem), B, max_q, max_k, H, Hkv, d, scale, int(causal), dtype,
        int(bool(deterministic)),
        window[0], window[1], cu_q, cu_k, total_q, total_k))


def check_window(window) -> Tuple[int, int]:
    """(left, right) of FlashAttention's window_size: each -1 (unbounded) or 0 ... 2^31 - 1 keys
    on that side of the diagonal; TypeError or ValueError naming `window` otherwise."""
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise FlashlabTypeError(f"window: expected a pair (left, right), got {window!r}",
                                hint="window=(-1, -1) is unbounded; (w, 0) with causal=True is a sliding window")
    out = []
    for side, w in zip(("left", "right"), window):
        if isinstance(w, bool) or not isinstance(w, int):
            raise FlashlabTypeError(f"window: the {side} side {w!r} is not an int",
                                    hint="each side is -1 (unbounded) or a number of keys")
        if w < -1 or w > 2**31 - 1:
            raise FlashlabValueError(f"window: the {side} side {w} is not -1 or 0 ... 2147483647",
                                     hint="keys seen on that side of the diagonal; -1 means unbounded")
        out.append(int(w))
    return out[0], out[1]


def varlen_shapes(q: Sequence[int], k: Sequence[int], v: Sequence[int]) -> Tuple[int, int, int, int, int]:
    """(total_q, total_k, H, H_kv, d) of packed q `[total_q, H, d]`, k and v `[total_k, H_kv, d]`."""
    check_rank("q", q, 3, "[total_q, H, d]")
    check_rank("k", k, 3, "[total_k, H_kv, d]")
    check_rank("v", v, 3, "[total_k, H_kv, d]")
    total_q, H, d = (int(s) for s in q)
    if tuple(k) != tuple(v):
        raise FlashlabValueError(f"v: shape {_shape_str(v)} differs from k's {_shape_str(k)}",
                                 hint="k and v are both [total_k, H_kv, d]")
    if int(k[2]) != d:
        raise FlashlabValueError(f"k: head dim {int(k[2])} differs from q's {d}", hint="q, k and v share d")
    Hkv = int(k[1])
    if Hkv < 1 or H % Hkv != 0:
        raise FlashlabValueError(f"k: {Hkv} key/value heads do not divide q's {H} heads",
                                 hint="grouped-query attention needs H_kv dividing H (H_kv = H for plain attention)")
    return total_q, int(k[0]), H, Hkv, d


def mta_problem(B: int, N: int, H: int, d: int, cq: int, ck: int, scale: float, dtype: int) -> Problem:
    key = ("mta", B, N, H, d, cq, ck, scale, dtype)
    p = _problems.get(key)
    if p is None:
        p = _problems.put(key, Problem(_capi.MtaProblem(
            ctypes.sizeof(_capi.MtaProblem), B, N, H, d, cq, ck, scale, dtype)))
    return p


def stream_problem(T: int, d: int, bq: int, bk: int, k_blocks: int, dtype: int, mask_ptr: Optional[int]) -> Problem:
    # Not cached: the mask pointer differs per call, and STREAM calls are not launch-bound.
    return Problem(_capi.StreamProblem(ctypes.sizeof(_capi.StreamProblem), T, d, bq, bk, k_blocks, dtype,
                                       mask_ptr))
