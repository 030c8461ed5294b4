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
              deterministic: bool = False):
    """Attention ``O = softmax(scale · Q Kᵀ) V``, FlashAttention's call.

    Args:
        q: queries ``[B, N, H, d]``.
        k, v: keys and values ``[B, N_k, H_kv, d]``; ``H_kv`` divides ``H`` (grouped-query
            attention) where the library takes it. The CUDA kernels today take ``N_k = N``,
            ``H_kv = H`` and ``d ∈ {64, 128}``; other problems raise FlashlabUnsupportedError
            (a ValueError) with the library's message.
        causal: query i sees key j iff ``j ≤ i + N_k − N`` (bottom-right aligned, as FlashAttention).
        scale: softmax scale; None for ``1/√d``.
        return_lse: also return the natural-log ``logsumexp`` of each row's scaled scores,
            float32 ``[B, H, N]`` (not differentiable), as FlashAttention's ``softmax_lse``.
        deterministic: ask the backward for a bit-reproducible dQ (where the kernels have one).

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
    if _is_torch(q):
        return _ft.attention(q, k, v, causal=causal, scale=scale, return_lse=return_lse, deterministic=deterministic)
    o, lse2 = _np().attention_forward(q, k, v, bool(causal), scale, bool(deterministic))
    if return_lse:
        return o, lse2 * lse2.dtype.type(0.6931471805599453)  # ln 2: base-2 LSE to natural
    return o


def attention_forward(q, k, v, *, causal: bool = False, scale: Optional[float] = None,
                      deterministic: bool = False) -> Tuple[Any, Any]:
    """The ABI's forward call: ``(O, LSE)`` with LSE in base 2 (``log2 Σ_j 2^(S_ij·scale·log2 e)``),
    ``[B, H, N]``, float32 (float64 for float64 inputs) — what attention_backward takes. No autograd."""
    if _is_torch(q):
        return _ft.attention_forward_call(q, k, v, causal=causal, scale=scale, deterministic=deterministic)
    return _np().attention_forward(q, k, v, bool(causal), scale, bool(deterministic))


def attention_backward(do, q, k, v, o, lse, *, causal: bool = False, scale: Optional[float] = None,
                       deterministic: bool = False) -> Tuple[Any, Any, Any]:
    """The ABI's backward call: ``(dQ, dK, dV)`` of the loss ``Σ O∘dO``, from the forward's O and
    base-2 LSE (attention_forward). For NumPy arrays, the way to get gradients."""
    if _is_torch(q):
        return _ft.attention_backward_call(do, q, k, v, o, lse, causal=causal, scale=scale,
                                           deterministic=deterministic)
    return _np().attention_backward(do, q, k, v, o, lse, bool(causal), scale, bool(deterministic))


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
    "attention", "attention_forward", "attention_backward", "mta", "mta_backward", "mta_decode", "stream",
    "library_path", "library_version", "has_cuda",
    "FlashlabError", "FlashlabValueError", "FlashlabUnsupportedError", "FlashlabTypeError", "FlashlabCudaError",
    "FlashlabOutOfMemoryError", "FlashlabInternalError", "FlashlabLibraryError",
]
