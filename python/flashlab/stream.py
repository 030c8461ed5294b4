"""STREAM sparse tracing (docs/stream.md): which key blocks each query block reads, the sparse
attention over them, and the edge records of that reading.

One head of T tokens: q, k, v are ``[T, d]``. Query block ``q`` holds tokens ``q·bq … q·bq+bq−1``,
key block ``r`` tokens ``r·bk … r·bk+bk−1``; ``n_q = ⌈T/bq⌉``, ``n_k = ⌈T/bk⌉``. Scores are the
paper's unscaled logits ``⟨q_t, k_s⟩``: scale q beforehand for ``1/√d``.

NumPy float32/float64 arrays run the CPU reference; torch CUDA tensors the CUDA kernels on the
current stream (torch CPU float32/float64 tensors the reference). The fast CUDA kernels take
bfloat16 or float16, bq = bk = 64, d ∈ {64, 128}; their estimate bfloat16 and the causal mask only.
The CUDA trace runs the fast trace on 16-bit tensors and the clear fp32 kernels on float32 ones.
The library refuses the rest with FlashlabUnsupportedError. None of these is differentiable.
"""

from typing import Any, Dict, Tuple

from . import _capi  # noqa: F401  (the loader, for the docs' cross-reference)


def _torch_module():
    from . import _ft, _is_torch
    return _ft, _is_torch


def estimate(q, k, *, k_blocks: int, bq: int = 64, bk: int = 64, mask=None):
    """Mask estimation: for each query block, the ``k_blocks`` key blocks it reads.

    Args:
        q, k: ``[T, d]``.
        k_blocks: key blocks kept per query block (the paper's k).
        bq, bk: query- and key-block sizes.
        mask: optional user block mask ``[n_q, n_k]`` of 0/1 (bool or integers; NumPy or a torch
            tensor, read on the host), ANDed with causality.

    Returns:
        indices, int64 ``[n_q, k_blocks]``, best first in the reference's order τ; −1 marks an
        empty entry. Same kind (and device) as q.
    """
    ft, is_torch = _torch_module()
    if is_torch(q):
        return ft.stream_estimate_torch(q, k, k_blocks, bq, bk, mask)
    from . import _numpy
    return _numpy.stream_estimate(q, k, k_blocks, bq, bk, mask)


def apply(q, k, v, indices, *, bq: int = 64, bk: int = 64):
    """Mask application: O ``[T, d]``, each query row's softmax over the valid keys (s ≤ t) of
    the key blocks its query block selected in ``indices`` (from estimate()). A row with no valid
    key gets 0."""
    ft, is_torch = _torch_module()
    if is_torch(q):
        return ft.stream_apply_torch(q, k, v, indices, bq, bk)
    from . import _numpy
    return _numpy.stream_apply(q, k, v, indices, bq, bk)


def trace(q, k, v, indices, *, bq: int = 64, bk: int = 64) -> Tuple[Any, Any]:
    """Mask application plus one edge record per entry of ``indices``, in (q, slot) order (NumPy: the
    CPU reference; torch CUDA tensors: the GPU kernels).

    Returns:
        ``(O, edges)``. For NumPy, edges is a structured array of ``EDGE_DTYPE`` (fields ``q``,
        ``r``, ``slot`` int32; ``score``, ``mass``, ``value_norm`` float32), ``n_q·k_blocks``
        long; for torch, a dict of those six tensors. An empty entry (−1) gives ``r = −1`` and
        zero weights. ``score`` is the representative score (max token-valid ⟨q, k⟩), ``mass``
        ``Σ p`` over the block pair, ``value_norm`` ``‖Σ p·V‖₂`` over it.
    """
    ft, is_torch = _torch_module()
    if is_torch(q):
        return ft.stream_trace_torch(q, k, v, indices, bq, bk)
    from . import _numpy
    return _numpy.stream_trace(q, k, v, indices, bq, bk)


def edges_as_dict(edges) -> Dict[str, Any]:
    """A NumPy edge array (from trace()) as one array per field, the form torch's trace returns."""
    from . import _numpy
    return _numpy.edges_as_dict(edges)


def __getattr__(name: str):
    if name == "EDGE_DTYPE":
        from . import _numpy
        return _numpy.EDGE_DTYPE
    raise AttributeError(name)
