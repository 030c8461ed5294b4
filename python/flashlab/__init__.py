"""flashlab from Python: attention, Multi-Token Attention and STREAM sparse tracing.

The package calls ``libflashlab.so`` (the C ABI, ``capi/include/flashlab.h``) through ctypes:
nothing to compile, any Python ≥ 3.9, torch optional (≥ 2.4).

* **torch CUDA tensors** (bfloat16/float16) run the fast CUDA kernels on the current stream;
  ``flashlab.attention`` and ``flashlab.mta`` are differentiable, registered as torch operators
  (``torch.ops.flashlab.*``) that work with ``torch.compile(fullgraph=True)`` and CUDA graphs.
* **NumPy arrays** (float32/float64) run the CPU reference; so do torch CPU tensors of those dtypes.

Layouts are FlashAttention's: ``[B, N, H, d]`` (batch, sequence, heads, head dim). STREAM works
on one head, ``[T, d]``.

The library is found through ``FLASHLAB_LIBRARY`` (a file or its folder), beside the package, or
in the checkout's ``build/cuda`` and ``build/cpu``; see ``flashlab.library_path()``.
"""

import importlib.util
import os
from typing import Any, Optional, Tuple

from . import _capi
from .errors import (
    FlashlabCudaError,
    FlashlabError,
    FlashlabInternalError,
    FlashlabLibraryError,
    FlashlabOutOfMemoryError,
    FlashlabTypeError,
    FlashlabUnsupportedError,
    FlashlabValueError,
)

__version__ = "0.1.0"

# torch is optional. Where it is installed its operators are registered at import (so that
# torch.compile finds them before it traces); FLASHLAB_NO_TORCH=1 skips it for NumPy-only use.
_torch = None
_ft = None
if os.environ.get("FLASHLAB_NO_TORCH") != "1" and importlib.util.find_spec("torch") is not None:
    import torch as _torch

    from . import torch as _ft

from . import stream  # noqa: E402


def _is_torch(x: Any) -> bool:
    return _torch is not None and isinstance(x, _torch.Tensor)


def _np():
    from . import _numpy
    return _numpy


def library_path() -> str:
    """The path of the loaded libflashlab.so (loading it if needed)."""
    return str(_capi.lib().path)


def library_version() -> str:
    """The library's version string."""
    return _capi.lib().version_string


def has_cuda() -> bool:
    """Whether the loaded library has the CUDA kernels."""
    return _capi.lib().cuda


def attention(q, k, v, *, causal: bool = False, scale: Optional[float] = None, return_lse: bool = False,
              deterministic: bool = False, window: Tuple[int, int] = (-1, -1), group: Any = None,
              layout: str = "zigzag", cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: Optional[int] = None,
              max_seqlen_k: Optional[int] = None):
    """Attention ``O = softmax(scale · Q Kᵀ) V``, FlashAttention's call.

    Args:
        q: queries ``[B, N, H, d]``.
        k, v: keys and values ``[B, N_k, H_kv, d]`` (N_k and H_kv from their shape); ``H_kv``
            divides ``H`` (grouped-query attention: query head h reads key/value head
            ``h // (H // H_kv)``). The CPU reference takes every such problem; the CUDA kernels'
            limits are their front door's (today ``d ∈ {64, 128, 256}``,
            and what it states for ``N_k``, ``H_kv`` and windows): a problem they refuse raises
            FlashlabUnsupportedError (a ValueError) with the library's message.
        causal: query i sees key j iff ``j ≤ i + N_k − N`` (bottom-right aligned, as FlashAttention).
            A row that sees no key gets O = 0 (and LSE = −inf).
        scale: softmax scale; None for ``1/√d``.
        window: ``(left, right)``, FlashAttention's ``window_size``: query i sees key j only if
            ``i + N_k − N − left ≤ j ≤ i + N_k − N + right``; −1 leaves a side unbounded.
        return_lse: also return the natural-log ``logsumexp`` of each row's scaled scores,
            float32 ``[B, H, N]`` (not differentiable), as FlashAttention's ``softmax_lse``.
        deterministic: ask the backward for bit-reproducible dQ, dK, dV (the CPU reference always
            is; CUDA: d = 64 and 128, dense or packed, and d = 256 dense on an H100/H200 build with
            sm_90a, where it runs on the fixed-order wgmma-ws kernel; elsewhere d = 256 is refused
            with FlashlabUnsupportedError).
        group: a ``torch.distributed`` process group: context parallelism over its G GPUs, one
            process per GPU. q, k, v are then this rank's shard of the sequence, ``[B, N / G, H,
            d]`` in the ring's local order (``flashlab.ring.shard``), causal counts over the whole
            sequence, and O is this rank's rows (``flashlab.ring``; no window).
        layout: with ``group``, how the sequence is cut: ``"zigzag"`` (balanced causal work) or
            ``"contiguous"``.
        cu_seqlens_q, cu_seqlens_k: packed sequences (FlashAttention's varlen call): q
            ``[total_q, H, d]``, k and v ``[total_k, H_kv, d]``, the B + 1 prefix sums of the
            lengths (cu_seqlens_k None: the queries' lengths); runs attention_varlen, whose
            contract this is (no ``group``). max_seqlen_q, max_seqlen_k: at least the longest
            sequences; None reads them off the lists (for CUDA tensors one small copy to the host
            and a wait for the device: pass them to avoid it).

    Returns:
        ``O`` with q's shape and dtype, or ``(O, lse)``.

    torch tensors: differentiable in q, k, v (one custom operator, ``torch.ops.flashlab.
    attention_forward``, with its backward ``attention_backward``); CUDA bfloat16/float16 run the
    fast kernels on the current stream, CPU float32/float64 the reference. NumPy float32/float64
    arrays run the CPU reference (no autograd: see attention_backward).

    Raises:
        FlashlabTypeError: a non-array argument, mixed kinds, devices or dtypes, a dtype the
            device does not take.
        FlashlabValueError: a shape that does not fit the layout, a scale ≤ 0, a problem the
            library refuses (its message names the field and the limit).
        FlashlabLibraryError: libflashlab.so not found (the message says where it looked).
    """
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if group is not None:
            raise FlashlabUnsupportedError("cu_seqlens_q with group: the ring takes no packed sequences",
                                           hint="run packed sequences on one GPU (no group)")
        if cu_seqlens_q is None:
            raise FlashlabValueError("cu_seqlens_q: None but cu_seqlens_k is given",
                                     hint="packed sequences take cu_seqlens_q (and cu_seqlens_k when keys differ)")
        if cu_seqlens_k is None:
            cu_seqlens_k = cu_seqlens_q
        if max_seqlen_q is None:
            max_seqlen_q = _longest("cu_seqlens_q", cu_seqlens_q)
        if max_seqlen_k is None:
            max_seqlen_k = _longest("cu_seqlens_k", cu_seqlens_k)
        return attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                scale=scale, window=window, return_lse=return_lse, deterministic=deterministic)
    if group is not None:
        if not _is_torch(q):
            raise FlashlabTypeError(f"group: context parallelism takes torch CUDA tensors, q is {type(q).__name__}",
                                    hint="move each rank's shard to its GPU as a torch tensor")
        if tuple(window) != (-1, -1):
            raise FlashlabUnsupportedError(f"window: {tuple(window)} with group: the ring takes no window",
                                           hint="run windowed attention on one GPU (no group)")
        from . import ring
        return ring.attention(q, k, v, group=group, causal=causal, scale=scale, layout=layout, return_lse=return_lse,
                              deterministic=deterministic)
    if _is_torch(q):
        return _ft.attention(q, k, v, causal=causal, scale=scale, return_lse=return_lse, deterministic=deterministic,
                             window=window)
    o, lse2 = _np().attention_forward(q, k, v, bool(causal), scale, bool(deterministic), window)
    if return_lse:
        return o, lse2 * lse2.dtype.type(0.6931471805599453)  # ln 2: base-2 LSE to natural
    return o


def attention_forward(q, k, v, *, causal: bool = False, scale: Optional[float] = None,
                      deterministic: bool = False, window: Tuple[int, int] = (-1, -1)) -> Tuple[Any, Any]:
    """The ABI's forward call: ``(O, LSE)`` with LSE in base 2 (``log2 Σ_j 2^(S_ij·scale·log2 e)``),
    ``[B, H, N]``, float32 (float64 for float64 inputs) — what attention_backward takes. No autograd."""
    if _is_torch(q):
        return _ft.attention_forward_call(q, k, v, causal=causal, scale=scale, deterministic=deterministic,
                                          window=window)
    return _np().attention_forward(q, k, v, bool(causal), scale, bool(deterministic), window)


def attention_backward(do, q, k, v, o, lse, *, causal: bool = False, scale: Optional[float] = None,
                       deterministic: bool = False, window: Tuple[int, int] = (-1, -1)) -> Tuple[Any, Any, Any]:
    """The ABI's backward call: ``(dQ, dK, dV)`` of the loss ``Σ O∘dO``, from the forward's O and
    base-2 LSE (attention_forward). dK and dV have k's shape (``H_kv`` heads: sums over each
    group). For NumPy arrays, the way to get gradients."""
    if _is_torch(q):
        return _ft.attention_backward_call(do, q, k, v, o, lse, causal=causal, scale=scale,
                                           deterministic=deterministic, window=window)
    return _np().attention_backward(do, q, k, v, o, lse, bool(causal), scale, bool(deterministic), window)


def _longest(name: str, cu) -> int:
    """The longest sequence of a prefix-sum list (at least 1; a bad list is left to the checks that
    name it). A CUDA tensor is copied to the host for it."""
    try:
        values = [int(x) for x in (cu.detach().cpu().tolist() if _is_torch(cu) else list(cu))]
    except (TypeError, ValueError):
        return 1
    return max([b - a for a, b in zip(values, values[1:])] + [1])


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                     causal: bool = False, scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
                     return_lse: bool = False, deterministic: bool = False):
    """Attention over packed sequences of different lengths, FlashAttention's varlen call.

    Args:
        q: ``[total_q, H, d]``, the queries of B sequences one after another.
        k, v: ``[total_k, H_kv, d]``, their keys and values (``H_kv`` divides ``H``).
        cu_seqlens_q, cu_seqlens_k: the B + 1 prefix sums of the query and key lengths (int32
            values, starting at 0, never decreasing; the last is total_q, total_k): sequence b owns
            query rows ``cu_seqlens_q[b] … cu_seqlens_q[b+1] − 1`` and the matching key rows.
        max_seqlen_q, max_seqlen_k: at least the longest query and key sequence.
        causal, scale, window: as attention(), per sequence (the diagonal bottom-right aligned in
            each: offset ``len_k − len_q``).
        return_lse: also return the natural-log ``logsumexp`` of each row, ``[H, total_q]``.
        deterministic: ask the backward for bit-reproducible dQ, dK, dV (the CPU reference always
            is; CUDA: the two-kernel design, no atomics, d = 64 and 128).

    NumPy float32/float64 arrays run the CPU reference (no autograd; attention_varlen_backward
    gives the gradients). torch CUDA bfloat16/float16 tensors run the fast forward (the lists:
    int32 tensors on q's device, read there, never copied to the host, so not checked beyond
    their shape; FlashAttention's contract), torch CPU float32/float64 tensors the reference.
    Autograd flows through a torch result on the same device: CUDA runs the fast backward on the
    packed work list (the atomic design's fastest kernel: wgmma-ws on Hopper, else mma; with
    deterministic the two-kernel design), CPU the reference.
    """
    if _is_torch(q):
        o, lse2 = _ft.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                       scale=scale, window=window, deterministic=deterministic)
        return (o, lse2 * 0.6931471805599453) if return_lse else o
    o, lse2 = _np().attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                             bool(causal), scale, window, bool(deterministic))
    if return_lse:
        return o, lse2 * lse2.dtype.type(0.6931471805599453)  # ln 2: base-2 LSE to natural
    return o


def attention_varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                              *, causal: bool = False, scale: Optional[float] = None,
                              window: Tuple[int, int] = (-1, -1), deterministic: bool = False) -> Tuple[Any, Any, Any]:
    """``(dQ, dK, dV)`` of the loss ``Σ O∘dO`` over packed sequences, from the forward's O and
    base-2 LSE ``[H, total_q]`` (attention_varlen_forward): NumPy arrays and torch CPU tensors on
    the CPU reference, torch CUDA bfloat16/float16 tensors on the fast backward (deterministic: as
    attention_varlen)."""
    if _is_torch(q):
        return _ft.attention_varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                             max_seqlen_k, causal=causal, scale=scale, window=window,
                                             deterministic=deterministic)
    return _np().attention_varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k, bool(causal), scale, window, bool(deterministic))


def attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                             causal: bool = False, scale: Optional[float] = None,
                             window: Tuple[int, int] = (-1, -1), deterministic: bool = False) -> Tuple[Any, Any]:
    """The ABI's forward call over packed sequences: ``(O, LSE)``, LSE base 2, ``[H, total_q]``
    (NumPy, the CPU reference; torch tensors as attention_varlen, no autograd) — what
    attention_varlen_backward takes."""
    if _is_torch(q):
        with _torch.no_grad():
            return _ft._varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                                       window, deterministic)
    return _np().attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                          bool(causal), scale, window, bool(deterministic))


def mta(q, k, v, w, *, scale: Optional[float] = None, return_lse: bool = False):
    """Multi-Token Attention (causal): a ``cq × ck`` convolution over the scores before the softmax.

    ``Ŝ = conv(mask₀(scale · Q Kᵀ), W)`` per head, future positions set to 0 before the
    convolution and to −∞ after it, ``O = softmax(Ŝ) V`` (docs/mta.md has the exact semantics).

    Args:
        q, k, v: ``[B, N, H, d]``, one shape.
        w: ``[H, cq, ck]``, one kernel per head (``ck`` odd); float32 (float64 beside float64
            CPU inputs).
        scale: softmax scale; None for ``1/√d``.
        return_lse: also return the forward's LSE (``[B, H, N]``, as the library writes it).

    torch tensors: differentiable in q, k, v and w (dW in w's dtype, summed over the batch). NumPy
    arrays: the CPU reference, gradients through mta_backward.
    """
    if _is_torch(q):
        return _ft.mta(q, k, v, w, scale=scale, return_lse=return_lse)
    o, lse = _np().mta_forward(q, k, v, w, scale)
    return (o, lse) if return_lse else o


def mta_backward(do, q, k, v, w, o, lse, *, scale: Optional[float] = None):
    """``(dQ, dK, dV, dW)`` of the loss ``Σ O∘dO`` for Multi-Token Attention (the forward's O, LSE)."""
    if _is_torch(q):
        _ft._check_tensors(("q", "k", "v", "o", "do"), (q, k, v, o, do))
        from . import _checks
        _checks.mta_shapes(q.shape, k.shape, v.shape, w.shape)
        return _ft.mta_backward(do, q, k, v, w, o, lse, _checks.check_scale(scale))
    return _np().mta_backward(do, q, k, v, w, o, lse, scale)


def mta_decode(q, k, v, w, *, scale: Optional[float] = None):
    """MTA decode (split-K over the keys on the GPU): the outputs ``[B, R, H, d]`` of the last
    ``R = min(16, N)`` query rows (row r is token ``N − R + r``), equal to the forward's last R
    rows up to rounding. q, k, v ``[B, N, H, d]`` (of q only the last ``R + cq − 1`` rows are read)."""
    if _is_torch(q):
        return _ft.mta_decode_last(q, k, v, w, scale=scale)
    return _np().mta_decode(q, k, v, w, scale)


__all__ = [
    "attention", "attention_forward", "attention_backward", "attention_varlen", "attention_varlen_forward",
    "attention_varlen_backward", "mta", "mta_backward", "mta_decode", "stream",
    "library_path", "library_version", "has_cuda",
    "FlashlabError", "FlashlabValueError", "FlashlabUnsupportedError", "FlashlabTypeError", "FlashlabCudaError",
    "FlashlabOutOfMemoryError", "FlashlabInternalError", "FlashlabLibraryError",
]
