"""Routing ``torch.nn.functional.scaled_dot_product_attention`` to flashlab's kernels.

Two ways, chosen by what the installed torch offers:

``"dispatcher"`` (torch ≥ 2.9, which has ``torch.nn.attention.register_flash_attention_impl``
and ``torch.library.get_kernel``): flashlab registers itself as a flash-attention
implementation named ``"flashlab"``; activating it replaces the CUDA kernels of
``aten::_scaled_dot_product_flash_attention`` and its backward, the operators SDPA calls when it
picks its flash backend. Shapes flashlab does not take (a head dim its kernels lack, dropout,
N_q ≠ N_k with a causal mask — SDPA aligns that mask top-left, flashlab bottom-right —, fp32)
go to the kernel that was there before. Everything SDPA does around the call stays: backend
selection, autograd, torch.compile (which calls the same operator), CUDA graphs. So that SDPA
picks the flash backend where it may, flash is put first in SDPA's backend priority while the
route is active (the previous order comes back on remove()).

``"patch"`` (any torch): ``torch.nn.functional.scaled_dot_product_attention`` is replaced by a
function that calls ``flashlab.attention`` for the calls it takes (CUDA, no mask, no dropout,
a problem the library accepts) and the original function otherwise. Code that imported the
function by name before the patch keeps the original.

Either way the returned SdpaRoute counts the calls that ran on flashlab and those passed on,
and undoes the route on ``remove()`` or at the end of a ``with`` block.
"""

import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from . import _capi, _checks
from .errors import FlashlabUnsupportedError, FlashlabValueError

_LOG2E = 1.0 / math.log(2.0)
_NAME = "flashlab"
_DTYPES = {torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_F16}


def _problem(q, k, v, is_causal: bool, scale: Optional[float]) -> Optional[_checks.Problem]:
    """The flashlab problem of an SDPA call on `[B, H, N, d]` tensors, or None if flashlab does not
    take it (the caller then passes the call on)."""
    if not (q.is_cuda and q.dim() == 4 and k.dim() == 4 and v.shape == k.shape):
        return None
    dtype = _DTYPES.get(q.dtype)
    if dtype is None or k.dtype != q.dtype or v.dtype != q.dtype or k.device != q.device or v.device != q.device:
        return None
    B, H, N, d = q.shape
    Bk, Hkv, Nk, dk = k.shape
    if Bk != B or dk != d or Hkv < 1 or H % Hkv:
        return None
    if is_causal and N != Nk:
        return None
    s = 0.0 if scale is None else float(scale)
    if not math.isfinite(s) or s < 0.0:
        return None
    p = _checks.attention_problem(B, N, Nk, H, Hkv, d, s, bool(is_causal), dtype, False)
    return p if p.accepts("attention_check", _capi.DEVICE_CUDA) else None


class SdpaRoute:
    """An active route of SDPA to flashlab (returned by use_for_sdpa()).

    Attributes:
        method: ``"dispatcher"`` or ``"patch"``.
        counts: calls that ran on flashlab (``"forward"``, ``"backward"``) and calls passed on to
            the previous implementation (``"forward_passed_on"``, ``"backward_passed_on"``).
    """

    def __init__(self, method: str):
        self.method = method
        self.counts: Dict[str, int] = {"forward": 0, "backward": 0, "forward_passed_on": 0, "backward_passed_on": 0}
        self.active = True

    def remove(self) -> None:
        """Undo the route: SDPA runs as before use_for_sdpa()."""
        if self.active:
            self._undo()
            self.active = False

    def _undo(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self) -> "SdpaRoute":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


# ------------------------------------------------------------------------------------------------
# "dispatcher": new CUDA kernels for SDPA's flash operators
# ------------------------------------------------------------------------------------------------

class _DispatcherRoute(SdpaRoute):
    def __init__(self, prefer_flash: bool):
        super().__init__("dispatcher")
        from . import torch as ft
        self._ft = ft
        self._fwd_before = torch.library.get_kernel(torch.ops.aten._scaled_dot_product_flash_attention.default, "CUDA")
        self._bwd_before = torch.library.get_kernel(
            torch.ops.aten._scaled_dot_product_flash_attention_backward.default, "CUDA")
        self._lib = torch.library.Library("aten", "IMPL", "CUDA")
        self._lib.impl("_scaled_dot_product_flash_attention", self._forward, "CUDA", with_keyset=True)
        self._lib.impl("_scaled_dot_product_flash_attention_backward", self._backward, "CUDA", with_keyset=True)
        self._priority_before = None
        if prefer_flash:
            before = list(torch._C._get_sdp_priority_order())
            flash = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
            torch._C._set_sdp_priority_order([flash] + [b for b in before if b != flash])
            self._priority_before = before

    def _undo(self) -> None:
        destroy = getattr(self._lib, "_destroy", None)
        if destroy is not None:
            destroy()
        self._lib = None  # without _destroy, dropping the last reference deregisters the kernels
        if self._priority_before is not None:
            torch._C._set_sdp_priority_order(self._priority_before)

    def remove(self) -> None:
        """Undo the route; torch.nn.attention.restore_flash_attention_impl() does the same."""
        if not self.active:
            return
        self.active = False
        self._undo()
        current = getattr(torch.nn.attention, "current_flash_attention_impl", lambda: None)
        if current() == _NAME:
            torch.nn.attention.restore_flash_attention_impl()  # its call back into remove() returns at once

    def _forward(self, keyset, query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
                 scale=None):
        p = None if dropout_p != 0.0 or return_debug_mask else _problem(query, key, value, is_causal, scale)
        if p is None:
            self.counts["forward_passed_on"] += 1
            return self._fwd_before.call_boxed(keyset, query, key, value, dropout_p, is_causal, return_debug_mask,
                                               scale=scale)
        ft = self._ft
        # SDPA's [B, H, N, d] are views of flashlab's [B, N, H, d] (or copies where the strides
        # are not ones the library takes); the output keeps the query's layout, as SDPA's does.
        q, k, v = (ft._kernel_input(t.transpose(1, 2)) for t in (query, key, value))
        out = torch.empty_like(query)
        o = out.transpose(1, 2)
        o_kernel = o if o.is_contiguous() else torch.empty(o.shape, dtype=o.dtype, device=o.device)
        B, H, N, d = query.shape
        lse = torch.empty((B, H, N), dtype=torch.float32, device=query.device)
        ws, nws = ft._workspace(p, "attention_forward_workspace_size", query)
        ft._launch("attention_forward", query, p.address, _capi.DEVICE_CUDA, ft._tensor(q), ft._tensor(k),
                   ft._tensor(v), ft._T(o_kernel.data_ptr()), lse.data_ptr(), ft._ptr(ws), nws, ft._stream(query))
        if o_kernel is not o:
            o.copy_(o_kernel)
        lse.mul_(1.0 / _LOG2E)  # SDPA's logsumexp is natural; flashlab's LSE is base 2
        self.counts["forward"] += 1
        seed = torch.zeros((2,), dtype=torch.uint64, device=query.device)
        offset = torch.zeros((), dtype=torch.uint64, device=query.device)
        debug = torch.empty(0, dtype=query.dtype, device=query.device)
        return out, lse, None, None, N, key.shape[2], seed, offset, debug

    def _backward(self, keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                  dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
        p = None
        if dropout_p == 0.0 and cum_seq_q is None and cum_seq_k is None:
            p = _problem(query, key, value, is_causal, scale)
        if p is None:
            self.counts["backward_passed_on"] += 1
            return self._bwd_before.call_boxed(keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q,
                                               cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                                               philox_offset, scale=scale)
        ft = self._ft
        q, k, v, o, do = (ft._kernel_input(t.transpose(1, 2)) for t in (query, key, value, out, grad_out))
        lse2 = (logsumexp * _LOG2E).contiguous()
        # SDPA's flash backward returns [B, H, N, d] gradients laid out as [B, N, H, d].
        dq, dk, dv = (torch.empty_permuted(t.shape, (0, 2, 1, 3), dtype=t.dtype, device=t.device)
                      for t in (query, key, value))
        ws, nws = ft._workspace(p, "attention_backward_workspace_size", query)
        ft._launch("attention_backward", query, p.address, _capi.DEVICE_CUDA, ft._tensor(q), ft._tensor(k),
                   ft._tensor(v), ft._tensor(o), lse2.data_ptr(), ft._tensor(do),
                   ft._T(dq.data_ptr()), ft._T(dk.data_ptr()), ft._T(dv.data_ptr()), ft._ptr(ws), nws,
                   ft._stream(query))
        self.counts["backward"] += 1
        return dq, dk, dv


_registered_route: Optional[_DispatcherRoute] = None
_prefer_flash = True


def _register_fn():
    """What torch.nn.attention.activate_flash_attention_impl("flashlab") calls."""
    global _registered_route
    _registered_route = _DispatcherRoute(_prefer_flash)
    return _registered_route


def _dispatcher_available() -> bool:
    return (hasattr(torch.nn.attention, "register_flash_attention_impl")
            and hasattr(torch.nn.attention, "activate_flash_attention_impl")
            and hasattr(torch.library, "get_kernel")
            and hasattr(torch._C, "_get_sdp_priority_order"))


if _dispatcher_available():
    # Providers register at import; users opt in with activate_flash_attention_impl("flashlab")
    # or flashlab.torch.use_for_sdpa().
    torch.nn.attention.register_flash_attention_impl(_NAME, register_fn=_register_fn)


# ------------------------------------------------------------------------------------------------
# "patch": F.scaled_dot_product_attention replaced
# ------------------------------------------------------------------------------------------------

class _PatchRoute(SdpaRoute):
    def __init__(self):
        super().__init__("patch")
        from . import torch as ft
        self._ft = ft
        self._before = F.scaled_dot_product_attention

        def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                         scale=None, enable_gqa=False):
            p = None
            if attn_mask is None and dropout_p == 0.0 and (enable_gqa or key.shape[-3] == query.shape[-3]):
                p = _problem(query, key, value, is_causal, scale)
            if p is None:
                self.counts["forward_passed_on"] += 1
                return self._before(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                    is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
            self.counts["forward"] += 1
            o = ft.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=is_causal,
                             scale=scale)
            return o.transpose(1, 2)

        self._patched = scaled_dot_product_attention
        F.scaled_dot_product_attention = scaled_dot_product_attention

    def _undo(self) -> None:
        if F.scaled_dot_product_attention is self._patched:
            F.scaled_dot_product_attention = self._before


def use_for_sdpa(*, method: Optional[str] = None, prefer_flash: bool = True) -> SdpaRoute:
    """Route ``F.scaled_dot_product_attention`` to flashlab's CUDA kernels where they take the call.

    Args:
        method: ``"dispatcher"`` (the default where torch has
            ``torch.nn.attention.register_flash_attention_impl``: flashlab becomes SDPA's flash
            backend) or ``"patch"`` (the default elsewhere: the Python function is replaced).
        prefer_flash: with ``"dispatcher"``, put the flash backend first in SDPA's priority while
            the route is active, so SDPA picks it (and so flashlab) wherever flash may run.

    Returns:
        An SdpaRoute: ``.counts`` says which calls ran on flashlab, ``.remove()`` (or leaving a
        ``with`` block) undoes the route.

    Example::

        import flashlab.torch
        route = flashlab.torch.use_for_sdpa()     # the one line
        loss = model(x).sum(); loss.backward()    # SDPA calls now run on flashlab
        print(route.counts)
    """
    global _prefer_flash
    if method is None:
        method = "dispatcher" if _dispatcher_available() else "patch"
    if method == "dispatcher":
        if not _dispatcher_available():
            raise FlashlabUnsupportedError(
                f"use_for_sdpa(method='dispatcher'): torch {torch.__version__} has no "
                "torch.nn.attention.register_flash_attention_impl / torch.library.get_kernel",
                hint="use method='patch' (the default on this torch) or torch ≥ 2.9",
            )
        _prefer_flash = bool(prefer_flash)
        torch.nn.attention.activate_flash_attention_impl(_NAME)
        assert _registered_route is not None and _registered_route.active
        return _registered_route
    if method == "patch":
        return _PatchRoute()
    raise FlashlabValueError(f"use_for_sdpa: method {method!r} is unknown",
                                     hint="choose 'dispatcher' or 'patch' (None picks the one this torch allows)")
