"""flashlab's kernels as PyTorch operators.

Each operation is one ``torch.library.custom_op`` in the ``flashlab`` namespace with a fake
(shape-only) implementation and, where it has a gradient, an autograd rule; so the operators
work under ``torch.compile(fullgraph=True)``, in CUDA graphs, and with autograd:

==============================  ==============================================================
``flashlab::attention_forward``   (q, k, v, causal, scale, deterministic) → (O, LSE base 2)
``flashlab::attention_backward``  (dO, q, k, v, O, LSE, causal, scale, deterministic) → (dQ, dK, dV)
``flashlab::mta_forward``         (q, k, v, w, scale) → (O, LSE)
``flashlab::mta_backward``        (dO, q, k, v, w, O, LSE, scale) → (dQ, dK, dV, dW)
``flashlab::mta_decode``          (q, k, v, w, scale) → O of the last row
``flashlab::stream_estimate``     (q, k, k_blocks, bq, bk, mask) → indices
``flashlab::stream_apply``        (q, k, v, indices, bq, bk) → O
``flashlab::stream_trace``        (q, k, v, indices, bq, bk) → (O, edge records)
==============================  ==============================================================

CUDA tensors (bfloat16/float16) run the fast kernels on the current CUDA stream of their device;
CPU tensors (float32/float64) run the CPU reference. Outputs, LSE and the library's scratch
(workspace) are allocated with torch, so the caching allocator and CUDA graphs see them (an eager
call whose LSE nobody reads has the kernel write it to a per-device sink instead: _lse_sink).
The user-facing functions are ``flashlab.attention``, ``flashlab.mta`` and ``flashlab.stream``;
this module adds ``use_for_sdpa()`` (see flashlab/_sdpa.py).
"""

import ctypes
import math
import threading
from typing import Dict, List, Optional, Tuple

import torch

from . import _capi, _checks
from .errors import FlashlabTypeError, FlashlabUnsupportedError, FlashlabValueError

LN2 = math.log(2.0)
_T = _capi.Tensor
_I64x3 = ctypes.c_int64 * 3
_CUDA_DTYPES = {torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_F16}
_CPU_DTYPES = {torch.float32: _capi.DTYPE_F32, torch.float64: _capi.DTYPE_F64}
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)

try:
    _is_compiling = torch.compiler.is_compiling
except AttributeError:  # torch < 2.3
    _is_compiling = torch._dynamo.is_compiling


# ------------------------------------------------------------------------------------------------
# What every operator shares: argument checks (Python only, traceable), memory, the launch
# ------------------------------------------------------------------------------------------------

def _check_tensors(names: Tuple[str, ...], tensors: Tuple[object, ...]) -> torch.Tensor:
    """TypeError unless all are tensors of the first one's dtype and device, that dtype taken on
    that device (CUDA: bfloat16/float16; CPU: float32/float64). Returns the first tensor."""
    first = tensors[0]
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise FlashlabTypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}",
                                    hint="pass tensors of one kind: all torch, or all NumPy")
        if t.device != first.device:
            raise FlashlabTypeError(f"{name}: on {t.device}, {names[0]} on {first.device}",
                                    hint="move the tensors to one device")
        if t.dtype != first.dtype:
            raise FlashlabTypeError(f"{name}: dtype {t.dtype} differs from {names[0]}'s {first.dtype}",
                                    hint="q, k, v share one dtype")
    if first.is_cuda:
        if first.dtype not in _CUDA_DTYPES:
            raise _checks.unsupported_dtype(names[0], first.dtype, "CUDA", "torch.bfloat16 or torch.float16")
    elif first.device.type == "cpu":
        if first.dtype not in _CPU_DTYPES:
            raise _checks.unsupported_dtype(names[0], first.dtype, "the CPU", "torch.float32 or torch.float64")
    else:
        raise FlashlabTypeError(f"{names[0]}: device {first.device} is neither CUDA nor CPU", hint=None)
    return first


def _check_stat(name: str, t: object, like: torch.Tensor, shape: Tuple[int, ...]) -> None:
    """TypeError/ValueError unless `t` is a statistic or MTA kernel for `like`: float64 beside a
    float64 problem, float32 otherwise, on like's device, of `shape`."""
    if not isinstance(t, torch.Tensor):
        raise FlashlabTypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}", hint=None)
    want = torch.float64 if like.dtype == torch.float64 else torch.float32
    if t.dtype != want:
        raise FlashlabTypeError(f"{name}: dtype {t.dtype}, expected {want} beside q's {like.dtype}",
                                hint="LSE and MTA kernels are float32 (float64 for a float64 CPU problem)")
    if t.device != like.device:
        raise FlashlabTypeError(f"{name}: on {t.device}, q on {like.device}", hint="move the tensors to one device")
    if tuple(t.shape) != shape:
        raise FlashlabValueError(f"{name}: shape {tuple(t.shape)}, expected {shape}", hint=None)


def _stat_dtype(t: torch.Tensor) -> torch.dtype:
    """LSE, W and dW beside `t`: float64 for a float64 (CPU) problem, float32 otherwise."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _device(t: torch.Tensor) -> int:
    return _capi.DEVICE_CUDA if t.is_cuda else _capi.DEVICE_CPU


def _dtype(t: torch.Tensor) -> int:
    return (_CUDA_DTYPES if t.is_cuda else _CPU_DTYPES)[t.dtype]


def _kernel_input(t: torch.Tensor) -> torch.Tensor:
    """`t` as the library reads it. The CUDA kernels read contiguous tensors starting on a 16-byte
    boundary: anything else is copied. The CPU reference takes strides (in the flashlab_tensor),
    but a zero stride reads as "contiguous" and a negative one is refused: those are copied."""
    if t.is_cuda:
        if not t.is_contiguous():
            return t.contiguous()
        if t.data_ptr() % 16:
            return t.clone()
        return t
    if t.is_contiguous():
        return t
    st = t.stride()
    if st[-1] != 1 or min(st[:-1]) <= 0:
        return t.contiguous()
    return t


def _tensor(t: torch.Tensor) -> _capi.Tensor:
    if t.is_contiguous():
        return _T(t.data_ptr())
    st = t.stride()
    if len(st) == 2:  # STREAM's [T, d]: the row stride in stride[1]
        return _T(t.data_ptr(), _I64x3(0, st[0], 0))
    return _T(t.data_ptr(), _I64x3(st[0], st[1], st[2]))


def _stream(t: torch.Tensor) -> Optional[int]:
    return _raw_stream(t.get_device()) if t.is_cuda else None


def _workspace(problem: _checks.Problem, size_fn: str, like: torch.Tensor) -> Tuple[Optional[torch.Tensor], int]:
    n = problem.workspace_bytes(size_fn, _device(like), like.device.index or 0)
    if n == 0:
        return None, 0
    return torch.empty(n, dtype=torch.uint8, device=like.device), n


def _launch(fn_name: str, like: torch.Tensor, *args) -> None:
    """Calls flashlab_<fn_name>(*args) with `like`'s device current; raises on a failed status."""
    L = _capi.lib()
    if like.is_cuda:
        if not L.cuda:
            raise _checks.device_without_cuda()
        if like.device.index != torch.cuda.current_device():
            with torch.cuda.device(like.device):
                status = getattr(L, fn_name)(*args)
        else:
            status = getattr(L, fn_name)(*args)
    else:
        status = getattr(L, fn_name)(*args)
    if status:
        raise L.fail(status, "flashlab_" + fn_name)


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _precheck(problem: _checks.Problem, like: torch.Tensor, check_fn: str = "attention_check") -> None:
    """The library's verdict on a problem before any allocation, once per problem and device
    (eager mode only: under torch.compile the fake implementation asks the same question)."""
    problem.check(check_fn, _device(like))


# ------------------------------------------------------------------------------------------------
# Attention
# ------------------------------------------------------------------------------------------------

def _attention_problem(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float, deterministic: bool,
                       window: Tuple[int, int] = (-1, -1)):
    B, N, H, d = q.shape
    return _checks.attention_problem(B, N, k.shape[1], H, k.shape[2], d, scale, causal, _dtype(q), deterministic,
                                     window)


class _Plan:
    """What an attention call of one signature needs at launch, found once: the problem (by
    address), the device, the output shapes, the library's two call-struct entries, the size of the
    backward's scratch, the LSE sink. Attention is launch-bound at small sizes (a call's host time
    is the whole cost), so its Python path keeps per call only what cannot be cached: allocation,
    pointers, the stream."""

    __slots__ = ("problem", "address", "device", "cuda", "index", "dev", "several", "o_shape", "lse_shape", "stat_dtype",
                 "fwd", "bwd", "bwd_workspace", "sink")

    def __init__(self, q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float, deterministic: bool,
                 window: Tuple[int, int]):
        self.problem = _attention_problem(q, k, causal, scale, deterministic, window)
        self.address = self.problem.address
        self.cuda = q.is_cuda
        self.device = _capi.DEVICE_CUDA if self.cuda else _capi.DEVICE_CPU
        self.index = q.get_device()
        self.dev = q.device
        # With one device the current one is q's: the launch skips asking (device_count is fixed
        # once CUDA is initialised, as it is when a CUDA tensor exists).
        self.several = self.cuda and torch.cuda.device_count() > 1
        B, N, H, d = q.shape
        self.o_shape = (B, N, H, d)
        self.lse_shape = (B, H, N)
        self.stat_dtype = _stat_dtype(q)
        L = _capi.lib()
        if self.cuda and not L.cuda:
            raise _checks.device_without_cuda()
        self.fwd, self.bwd = L.attention_forward_call, L.attention_backward_call
        self.bwd_workspace = None  # bytes, found on the first backward
        self.sink = 0  # where a forward whose LSE nobody reads writes it (see _lse_sink)


_plans = _checks._Cache()


def _plan(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float, deterministic: bool,
          window: Tuple[int, int] = (-1, -1)) -> _Plan:
    key = (q.shape, k.shape, q.dtype, q.get_device(), causal, scale, deterministic, window)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.put(key, _Plan(q, k, causal, scale, deterministic, window))
    return plan


_tls = threading.local()
_get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
_empty = torch.empty
_empty_like = torch.empty_like
_F32 = torch.float32
_U8 = torch.uint8


def _cuda_calls() -> Tuple[_capi.AttentionCall, _capi.AttentionCall]:
    """This thread's flashlab_attention_call structs for CUDA calls, (forward, backward): each call
    sets the pointers that change and passes the struct, one argument, where the argument-list
    entry would take ten or fourteen, four to eight of them structs that ctypes builds and copies.
    Strides stay 0 (the CUDA path passes contiguous tensors only). One per thread, because the
    library reads it during the call only: the fields are set after every allocation, in
    straight-line code, so nothing else runs on this thread between setting them and the call."""
    calls = getattr(_tls, "calls", None)
    if calls is None:
        calls = _tls.calls = (_capi.AttentionCall(_capi.DEVICE_CUDA), _capi.AttentionCall(_capi.DEVICE_CUDA))
        _tls.fwd, _tls.bwd = calls
    return calls


def _set_tensor(c: _capi.AttentionCall, name: str, t: torch.Tensor) -> None:
    """Field `name` of a call struct: t's data and, unless contiguous, its strides (CPU path)."""
    setattr(c, name, t.data_ptr())
    if not t.is_contiguous():
        st = t.stride()
        getattr(c, name + "_stride")[:] = (st[0], st[1], st[2])


# The kernels always write LSE. A forward whose LSE nobody reads (no grad, return_lse=False)
# writes it to a sink: one buffer per device, grown as needed, never freed. Never freed, because a
# kernel still queued on any stream may write it (freeing would let the caching allocator hand the
# memory to a tensor of the stream it came from); shared by concurrent calls, because nothing reads
# it. It saves one allocation per inference call, a sixth of the call's host time.
_sink_lock = threading.Lock()
_sinks: Dict[int, Tuple[int, int]] = {}  # device index -> (address, bytes)
_sink_buffers: List[torch.Tensor] = []  # every sink ever made, kept alive


def _lse_sink(plan: _Plan) -> int:
    B, H, N = plan.lse_shape
    nbytes = max(4 * B * H * N, 1)
    with _sink_lock:
        address, size = _sinks.get(plan.index, (0, 0))
        if size < nbytes:
            size = max(nbytes, 2 * size)
            buf = torch.empty(size, dtype=torch.uint8, device=plan.dev)
            _sink_buffers.append(buf)
            address = buf.data_ptr()
            _sinks[plan.index] = (address, size)
    plan.sink = address
    return address


def _call(plan: _Plan, backward: bool, c: _capi.AttentionCall) -> None:
    """One call of flashlab_attention_forward_call / _backward_call with `plan`'s device current;
    raises on a failed status."""
    fn, name = (plan.bwd, "flashlab_attention_backward_call") if backward else (
        plan.fwd, "flashlab_attention_forward_call")
    if plan.several and plan.index != _get_device():
        with torch.cuda.device(plan.index):
            status = fn(c)
    else:
        status = fn(c)
    if status:
        raise _capi.lib().fail(status, name)


def _ready(t: torch.Tensor) -> torch.Tensor:
    """A CUDA tensor as the kernels read it: itself when contiguous and 16-byte aligned (the
    common case, two cheap queries), else _kernel_input's copy."""
    return t if t.is_contiguous() and not t.data_ptr() & 15 else _kernel_input(t)


def _forward_run(plan: _Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, need_lse: bool = True):
    """O and LSE (None unless need_lse) of one flashlab_attention_forward_call."""
    if not plan.cuda:
        q, k, v = _kernel_input(q), _kernel_input(k), _kernel_input(v)
        o = q.new_empty(plan.o_shape)
        lse = q.new_empty(plan.lse_shape, dtype=plan.stat_dtype)
        c = _capi.AttentionCall(plan.device)
        c.problem, c.o, c.lse = plan.address, o.data_ptr(), lse.data_ptr()
        _set_tensor(c, "q", q), _set_tensor(c, "k", k), _set_tensor(c, "v", v)
        _call(plan, False, c)
        return o, lse
    # The hot path of a launch-bound call: each line here is a measurable part of its host time
    # (python/bench/call_cost.py times them), hence the inlined checks and cached objects.
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    if (qp | kp | vp) & 15 or not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        q, k, v = _ready(q), _ready(k), _ready(v)
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    # empty_like and new_empty: the cheapest ways torch has to allocate (torch.empty's argument
    # parsing costs more); q is contiguous here, so O is too.
    o = _empty_like(q)
    if need_lse:
        lse = q.new_empty(plan.lse_shape, dtype=_F32)
        lp = lse.data_ptr()
    else:
        lse = None
        lp = plan.sink or _lse_sink(plan)
    index = plan.index
    stream = _raw_stream(index)
    try:
        c = _tls.fwd
    except AttributeError:
        c = _cuda_calls()[0]
    c.problem = plan.address
    c.q = qp
    c.k = kp
    c.v = vp
    c.o = o.data_ptr()
    c.lse = lp
    c.stream = stream
    if plan.several and index != _get_device():
        with torch.cuda.device(index):
            status = plan.fwd(c)
    else:
        status = plan.fwd(c)
    if status:
        raise _capi.lib().fail(status, "flashlab_attention_forward_call")
    return o, lse


def _backward_run(plan: _Plan, grad_out, q, k, v, out, lse):
    nws = plan.bwd_workspace
    if nws is None:
        nws = plan.bwd_workspace = plan.problem.workspace_bytes("attention_backward_workspace_size", plan.device,
                                                                max(plan.index, 0))
    if not lse.is_contiguous():
        lse = lse.contiguous()
    if not plan.cuda:
        ws = q.new_empty(nws, dtype=torch.uint8) if nws else None
        q, k, v = _kernel_input(q), _kernel_input(k), _kernel_input(v)
        out, grad_out = _kernel_input(out), _kernel_input(grad_out)
        dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
        c = _capi.AttentionCall(plan.device)
        c.problem, c.lse, c.workspace, c.workspace_bytes = plan.address, lse.data_ptr(), _ptr(ws), nws
        c.dq, c.dk, c.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        for name, t in (("q", q), ("k", k), ("v", v), ("o", out), ("d_o", grad_out)):
            _set_tensor(c, name, t)
        _call(plan, True, c)
        return dq, dk, dv
    # The backward's host time delays its first kernel (the autograd engine adds its own): the
    # same lean path as the forward's.
    qp, kp, vp, op, gp = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), grad_out.data_ptr()
    if (qp | kp | vp | op | gp) & 15 or not (
            q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and out.is_contiguous()
            and grad_out.is_contiguous()):
        q, k, v, out, grad_out = _ready(q), _ready(k), _ready(v), _ready(out), _ready(grad_out)
        qp, kp, vp, op, gp = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), grad_out.data_ptr()
    dq, dk, dv = _empty_like(q), _empty_like(k), _empty_like(v)
    ws = _empty(nws, dtype=_U8, device=plan.dev) if nws else None
    index = plan.index
    stream = _raw_stream(index)
    try:
        c = _tls.bwd
    except AttributeError:
        c = _cuda_calls()[1]
    c.problem = plan.address
    c.q = qp
    c.k = kp
    c.v = vp
    c.o = op
    c.lse = lse.data_ptr()
    c.d_o = gp
    c.dq = dq.data_ptr()
    c.dk = dk.data_ptr()
    c.dv = dv.data_ptr()
    c.workspace = ws.data_ptr() if nws else None
    c.workspace_bytes = nws
    c.stream = stream
    if plan.several and index != _get_device():
        with torch.cuda.device(index):
            status = plan.bwd(c)
    else:
        status = plan.bwd(c)
    if status:
        raise _capi.lib().fail(status, "flashlab_attention_backward_call")
    return dq, dk, dv


def _attention_forward_impl(q, k, v, causal, scale, deterministic, window_left=-1, window_right=-1):
    """O `[B, N, H, d]` and LSE `[B, H, N]` (base 2), one call of flashlab_attention_forward."""
    return _forward_run(_plan(q, k, causal, scale, deterministic, (window_left, window_right)), q, k, v)


attention_forward = torch.library.custom_op(
    "flashlab::attention_forward", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, bool causal, float scale, bool deterministic, int window_left=-1, "
           "int window_right=-1) -> (Tensor, Tensor)",
)(_attention_forward_impl)


@attention_forward.register_fake
def _(q, k, v, causal, scale, deterministic, window_left=-1, window_right=-1):
    B, N, H, d = q.shape
    if all(isinstance(s, int) for s in (*q.shape, *k.shape)):  # symbolic shapes are checked at run time
        _attention_problem(q, k, causal, scale, deterministic, (window_left, window_right)).check(
            "attention_check", _device(q))
    return q.new_empty((B, N, H, d)), q.new_empty((B, H, N), dtype=_stat_dtype(q))


def _attention_backward_impl(grad_out, q, k, v, out, lse, causal, scale, deterministic, window_left=-1,
                             window_right=-1):
    """dQ, dK, dV of the loss Σ O∘dO: one call of flashlab_attention_backward."""
    return _backward_run(_plan(q, k, causal, scale, deterministic, (window_left, window_right)), grad_out, q, k, v,
                         out, lse)


attention_backward = torch.library.custom_op(
    "flashlab::attention_backward", mutates_args=(),
    schema="(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, float scale, "
           "bool deterministic, int window_left=-1, int window_right=-1) -> (Tensor, Tensor, Tensor)",
)(_attention_backward_impl)


@attention_backward.register_fake
def _(grad_out, q, k, v, out, lse, causal, scale, deterministic, window_left=-1, window_right=-1):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_setup(ctx, inputs, output):
    q, k, v, causal, scale, deterministic = inputs[:6]
    window_left, window_right = inputs[6:] if len(inputs) == 8 else (-1, -1)
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.deterministic, ctx.window = causal, scale, deterministic, (window_left, window_right)
    ctx.mark_non_differentiable(lse)


def _attention_grad(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(grad_o, q, k, v, o, lse, ctx.causal, ctx.scale, ctx.deterministic, *ctx.window)
    return dq, dk, dv, None, None, None, None, None


attention_forward.register_autograd(_attention_grad, setup_context=_attention_setup)


class _AttentionFunction(torch.autograd.Function):
    """The eager path's autograd node: the operators' bodies and backward rule, without the
    dispatcher's round trips (see attention())."""

    @staticmethod
    def forward(ctx, q, k, v, plan):
        o, lse = _forward_run(plan, q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.plan = plan
        ctx.mark_non_differentiable(lse)
        # LSE's gradient is never used: without this autograd would make a zero tensor for it
        # (an allocation and a fill kernel) before every backward.
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        if grad_o is None:
            return None, None, None, None
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward_run(ctx.plan, grad_o, q, k, v, o, lse)
        return dq, dk, dv, None


_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", None)
_function_mode_on = getattr(torch._C, "_is_torch_function_mode_enabled", None)
_functorch_stack = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)
_FAST_PATH = None not in (_dispatch_stack_len, _function_mode_on, _functorch_stack)
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_checked = _checks._Cache()
_checked_plans = _checked._d  # read without a method call; _Cache.put only ever clears it in place


def _eager(q, k, v) -> bool:
    """Whether a call may skip the dispatcher: plain tensors, no torch.compile tracing, no torch
    dispatch or function mode (fake tensors, flop counters, set_default_device), no functorch
    transform. Everything else goes through the registered operator, which sees all of them."""
    return (type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor
            and not _dispatch_stack_len() and not _function_mode_on() and _functorch_stack() is None)


def _checked_plan(q, k, v, causal: bool, scale: Optional[float], deterministic: bool,
                  window: Tuple[int, int] = (-1, -1)) -> _Plan:
    """The plan of a call whose arguments passed every check (Python's and the library's), found
    by the arguments' signature; the checks run on the first call of a signature only."""
    key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(), v.get_device(),
           causal, scale, deterministic, window)
    plan = _checked_plans.get(key)
    if plan is None:
        _check_tensors(("q", "k", "v"), (q, k, v))
        _checks.attention_shapes(q.shape, k.shape, v.shape)
        s = _checks.check_scale(scale)
        plan = _plan(q, k, bool(causal), s, bool(deterministic), _checks.check_window(window))
        _precheck(plan.problem, q)
        _checked.put(key, plan)
    return plan


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: Optional[float] = None, return_lse: bool = False, deterministic: bool = False,
              window: Tuple[int, int] = (-1, -1)):
    """flashlab.attention for torch tensors (see flashlab.attention for the contract).

    In eager mode with plain tensors the call skips the dispatcher (its round trips cost more than
    the rest of a small launch): the operator's body runs directly, under a torch.autograd.Function
    with the operator's backward where a gradient is wanted. Under torch.compile, a torch dispatch
    or function mode, a functorch transform or a tensor subclass it calls the registered operator
    torch.ops.flashlab.attention_forward, which those see."""
    if (_FAST_PATH and not _is_compiling() and type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor
            and not _dispatch_stack_len() and not _function_mode_on() and _functorch_stack() is None):  # _eager()
        if window.__class__ is not tuple:  # a list would not hash; check_window names a bad value
            window = _checks.check_window(window)
        plan = _checked_plans.get((q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.get_device(),
                                   k.get_device(), v.get_device(), causal, scale, deterministic, window))
        if plan is None:
            plan = _checked_plan(q, k, v, causal, scale, deterministic, window)
        if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            o, lse = _AttentionFunction.apply(q, k, v, plan)
        else:
            o, lse = _forward_run(plan, q, k, v, return_lse or not plan.cuda)
    else:
        _check_tensors(("q", "k", "v"), (q, k, v))
        B, N, Nk, H, Hkv, d = _checks.attention_shapes(q.shape, k.shape, v.shape)
        s = _checks.check_scale(scale)
        w = _checks.check_window(window)
        if not _is_compiling():
            _precheck(_checks.attention_problem(B, N, Nk, H, Hkv, d, s, bool(causal), _dtype(q), bool(deterministic),
                                                w), q)
        o, lse = attention_forward(q, k, v, bool(causal), s, bool(deterministic), *w)
    if return_lse:
        return o, lse * LN2
    return o


def attention_forward_call(q, k, v, *, causal: bool = False, scale: Optional[float] = None,
                           deterministic: bool = False, window: Tuple[int, int] = (-1, -1)):
    """flashlab.attention_forward for torch tensors: (O, LSE base 2), no autograd."""
    if _FAST_PATH and not _is_compiling() and _eager(q, k, v):
        return _forward_run(_checked_plan(q, k, v, causal, scale, deterministic, window), q, k, v)
    _check_tensors(("q", "k", "v"), (q, k, v))
    _checks.attention_shapes(q.shape, k.shape, v.shape)
    return attention_forward(q, k, v, bool(causal), _checks.check_scale(scale), bool(deterministic),
                             *_checks.check_window(window))


# ----------------------------------------------------------------------------- packed sequences

_CU_HINT = "the B + 1 prefix sums of the sequence lengths as a 1-D torch.int32 tensor on q's device, e.g. [0, 3, 7]"


def _check_cu_seqlens(name: str, t: object, like: torch.Tensor) -> torch.Tensor:
    """One prefix-sum list beside torch q: a 1-D int32 tensor on q's device, at least 2 entries.
    Its values stay on the device (FlashAttention's varlen contract): the kernels read them."""
    if not isinstance(t, torch.Tensor):
        raise FlashlabTypeError(f"{name}: expected a torch.Tensor beside torch q, got {type(t).__name__}",
                                hint=_CU_HINT)
    if t.device != like.device:
        raise FlashlabTypeError(f"{name}: on {t.device}, q on {like.device}", hint=_CU_HINT)
    if t.dtype != torch.int32 or t.dim() != 1:
        raise FlashlabTypeError(f"{name}: expected a 1-D torch.int32 tensor, got dtype {t.dtype} and shape "
                                f"{tuple(t.shape)}", hint=_CU_HINT)
    if t.numel() < 2:
        raise FlashlabValueError(f"{name}: {t.numel()} entries, fewer than 2", hint=_CU_HINT)
    return t if t.is_contiguous() else t.contiguous()


def _check_cu_pair(cu_q, cu_k, q):
    """Both prefix-sum lists beside CUDA q (_check_cu_seqlens), of the same B + 1 entries."""
    cu_q = _check_cu_seqlens("cu_seqlens_q", cu_q, q)
    cu_k = _check_cu_seqlens("cu_seqlens_k", cu_k, q)
    if cu_q.numel() != cu_k.numel():
        raise FlashlabValueError(f"cu_seqlens_k: {cu_k.numel()} entries but cu_seqlens_q has {cu_q.numel()}",
                                 hint="both list the same B sequences, B + 1 entries each")
    return cu_q, cu_k


def _varlen_forward_cuda(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, deterministic):
    """(O [total_q, H, d], LSE [H, total_q] base 2) of the fast forward on packed CUDA tensors."""
    total_q, total_k, H, Hkv, d = _checks.varlen_shapes(q.shape, k.shape, v.shape)
    cu_q, cu_k = _check_cu_pair(cu_q, cu_k, q)
    max_q = _checks.check_positive_int("max_seqlen_q", max_q)
    max_k = _checks.check_positive_int("max_seqlen_k", max_k)
    L = _capi.lib()
    if not L.cuda:
        raise _checks.device_without_cuda()
    p = _checks.packed_attention_problem(cu_q.numel() - 1, max_q, max_k, H, Hkv, d, scale, causal, _dtype(q), window,
                                         cu_q.data_ptr(), cu_k.data_ptr(), total_q, total_k, deterministic)
    q, k, v = _ready(q), _ready(k), _ready(v)
    o = torch.empty_like(q)
    lse = q.new_empty((H, total_q), dtype=_F32)
    index = q.get_device()
    args = (p.address, _capi.DEVICE_CUDA, _capi.Tensor(q.data_ptr()), _capi.Tensor(k.data_ptr()),
            _capi.Tensor(v.data_ptr()), _capi.Tensor(o.data_ptr()), lse.data_ptr(), None, 0, _raw_stream(index))
    with torch.cuda.device(index):
        status = L.attention_forward(*args)
    if status:
        raise L.fail(status, "flashlab_attention_forward")
    return o, lse


def _varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, deterministic=False):
    """(O, LSE base 2) of packed torch tensors: CUDA runs the fast forward, CPU the reference."""
    _check_tensors(("q", "k", "v"), (q, k, v))
    s = _checks.check_scale(scale)
    w = _checks.check_window(window)
    if q.is_cuda:
        return _varlen_forward_cuda(q, k, v, cu_q, cu_k, max_q, max_k, bool(causal), s, w, bool(deterministic))
    from . import _numpy
    host = [t.detach().numpy() if isinstance(t, torch.Tensor) else t for t in (q, k, v, cu_q, cu_k)]
    o, lse = _numpy.attention_varlen_forward(*host, max_q, max_k, bool(causal), scale, w, bool(deterministic))
    return torch.from_numpy(o), torch.from_numpy(lse)


def _varlen_backward_cuda(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale, window, deterministic):
    """(dQ, dK, dV) of the fast backward (the atomic design's fastest kernel that takes packed
    sequences: wgmma-ws on Hopper, else mma; deterministic: the two-kernel design, no atomics) on
    packed CUDA tensors, from the forward's O and base-2 LSE [H, total_q]."""
    total_q, total_k, H, Hkv, d = _checks.varlen_shapes(q.shape, k.shape, v.shape)
    cu_q, cu_k = _check_cu_pair(cu_q, cu_k, q)
    for name, t in (("o", o), ("do", do)):
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise FlashlabValueError(f"{name}: shape {tuple(t.shape)} {t.dtype} on {t.device} differs from q's "
                                     f"{tuple(q.shape)} {q.dtype} on {q.device}", hint=None)
    if lse.shape != (H, total_q) or lse.dtype != _F32 or lse.device != q.device:
        raise FlashlabValueError(f"lse: shape {tuple(lse.shape)} {lse.dtype} on {lse.device}, expected float32 "
                                 f"[{H}, {total_q}] on {q.device}", hint="the base-2 LSE of the packed forward")
    L = _capi.lib()
    if not L.cuda:
        raise _checks.device_without_cuda()
    p = _checks.packed_attention_problem(cu_q.numel() - 1, max_q, max_k, H, Hkv, d, scale, causal, _dtype(q), window,
                                         cu_q.data_ptr(), cu_k.data_ptr(), total_q, total_k, deterministic)
    index = q.get_device()
    nws = p.workspace_bytes("attention_backward_workspace_size", _capi.DEVICE_CUDA, index)
    q, k, v, o, do, lse = _ready(q), _ready(k), _ready(v), _ready(o), _ready(do), lse.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ws = q.new_empty(nws, dtype=_U8) if nws else None
    args = (p.address, _capi.DEVICE_CUDA, _capi.Tensor(q.data_ptr()), _capi.Tensor(k.data_ptr()),
            _capi.Tensor(v.data_ptr()), _capi.Tensor(o.data_ptr()), lse.data_ptr(), _capi.Tensor(do.data_ptr()),
            _capi.Tensor(dq.data_ptr()), _capi.Tensor(dk.data_ptr()), _capi.Tensor(dv.data_ptr()),
            ws.data_ptr() if nws else None, nws, _raw_stream(index))
    with torch.cuda.device(index):
        status = L.attention_backward(*args)
    if status:
        raise L.fail(status, "flashlab_attention_backward")
    return dq, dk, dv


def _varlen_backward(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale, window, deterministic=False):
    """(dQ, dK, dV) of packed torch tensors: CUDA runs the fast backward, CPU the reference."""
    _check_tensors(("q", "k", "v", "o", "do"), (q, k, v, o, do))
    s = _checks.check_scale(scale)
    w = _checks.check_window(window)
    if q.is_cuda:
        return _varlen_backward_cuda(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, bool(causal), s, w,
                                     bool(deterministic))
    from . import _numpy
    host = [t.detach().numpy() if isinstance(t, torch.Tensor) else t for t in (do, q, k, v, o, lse, cu_q, cu_k)]
    return tuple(torch.from_numpy(g) for g in
                 _numpy.attention_varlen_backward(*host, max_q, max_k, bool(causal), scale, w, bool(deterministic)))


class _VarlenFunction(torch.autograd.Function):
    """Packed sequences under autograd: the forward, and its backward on the same device (CUDA:
    the fast atomic backward on the packed work list; CPU: the reference). LSE is not
    differentiable (as the dense attention's)."""

    @staticmethod
    def forward(ctx, q, k, v, args):
        o, lse = _varlen_forward(q, k, v, *args)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = args
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        q, k, v, o, lse = ctx.saved_tensors
        if grad_o is None:
            return None, None, None, None
        dq, dk, dv = _varlen_backward(grad_o.to(q.dtype), q, k, v, o, lse, *ctx.args)
        return dq, dk, dv, None


def attention_varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                              causal=False, scale=None, window=(-1, -1), deterministic=False):
    """flashlab.attention_varlen_backward for torch tensors: (dQ, dK, dV) from the forward's O and
    base-2 LSE [H, total_q], no autograd. CUDA bfloat16/float16 run the fast backward on the current
    stream, the lists read on the device; CPU float32/float64 the reference."""
    return _varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                            scale, window, deterministic)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None,
                     window=(-1, -1), deterministic=False):
    """flashlab.attention_varlen for torch tensors: (O, LSE base 2). CUDA bfloat16/float16 run the
    fast forward on the current stream with the lists read on the device (no host copy, so their
    contents are not checked here); CPU float32/float64 the reference, which checks them."""
    args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window, bool(deterministic))
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
        return _VarlenFunction.apply(q, k, v, args)
    return _varlen_forward(q, k, v, *args)


_checked_backward = _checks._Cache()
_checked_backward_plans = _checked_backward._d


def attention_backward_call(do, q, k, v, o, lse, *, causal: bool = False, scale: Optional[float] = None,
                            deterministic: bool = False, window: Tuple[int, int] = (-1, -1)):
    """flashlab.attention_backward for torch tensors: (dQ, dK, dV), no autograd."""
    if (_FAST_PATH and not _is_compiling() and _eager(q, k, v) and type(do) is _Tensor and type(o) is _Tensor
            and type(lse) is _Tensor):
        if window.__class__ is not tuple:
            window = _checks.check_window(window)
        # One lookup by the signature of all six tensors: the checks below ran for it once.
        key = (q.shape, k.shape, v.shape, do.shape, o.shape, lse.shape, q.dtype, k.dtype, v.dtype, do.dtype, o.dtype,
               lse.dtype, q.get_device(), k.get_device(), v.get_device(), do.get_device(), o.get_device(),
               lse.get_device(), causal, scale, deterministic, window)
        plan = _checked_backward_plans.get(key)
        if plan is None:
            _check_backward_args(do, q, k, v, o, lse)
            plan = _checked_backward.put(key, _checked_plan(q, k, v, causal, scale, deterministic, window))
        return _backward_run(plan, do, q, k, v, o, lse)
    _check_backward_args(do, q, k, v, o, lse)
    return attention_backward(do, q, k, v, o, lse, bool(causal), _checks.check_scale(scale), bool(deterministic),
                              *_checks.check_window(window))


def _check_backward_args(do, q, k, v, o, lse) -> None:
    _check_tensors(("q", "k", "v", "o", "do"), (q, k, v, o, do))
    B, N, Nk, H, Hkv, d = _checks.attention_shapes(q.shape, k.shape, v.shape)
    for name, t in (("o", o), ("do", do)):
        if t.shape != q.shape:
            raise FlashlabValueError(f"{name}: shape {tuple(t.shape)} differs from q's {tuple(q.shape)}", hint=None)
    _check_stat("lse", lse, q, (B, H, N))


# ------------------------------------------------------------------------------------------------
# Multi-Token Attention
# ------------------------------------------------------------------------------------------------

def _mta_problem(q: torch.Tensor, w: torch.Tensor, scale: float):
    B, N, H, d = q.shape
    return _checks.mta_problem(B, N, H, d, w.shape[1], w.shape[2], scale, _dtype(q))


def _mta_inputs(q, k, v, w, scale):
    """The problem and the tensors as the library reads them (W contiguous)."""
    return (_mta_problem(q, w, scale), _kernel_input(q), _kernel_input(k), _kernel_input(v), w.contiguous())


@torch.library.custom_op("flashlab::mta_forward", mutates_args=(),
                         schema="(Tensor q, Tensor k, Tensor v, Tensor w, float scale) -> (Tensor, Tensor)")
def mta_forward(q, k, v, w, scale):
    """O `[B, N, H, d]` and LSE fp32 `[B, H, N]` of Multi-Token Attention."""
    p, q, k, v, w = _mta_inputs(q, k, v, w, scale)
    B, N, H, d = q.shape
    o = torch.empty((B, N, H, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N), dtype=_stat_dtype(q), device=q.device)
    ws, nws = _workspace(p, "mta_forward_workspace_size", q)
    _launch("mta_forward", q, p.address, _device(q), _tensor(q), _tensor(k), _tensor(v), w.data_ptr(),
            _T(o.data_ptr()), lse.data_ptr(), _ptr(ws), nws, _stream(q))
    return o, lse


@mta_forward.register_fake
def _(q, k, v, w, scale):
    B, N, H, d = q.shape
    return q.new_empty((B, N, H, d)), q.new_empty((B, H, N), dtype=_stat_dtype(q))


@torch.library.custom_op(
    "flashlab::mta_backward", mutates_args=(),
    schema="(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor w, Tensor out, Tensor lse, float scale) "
           "-> (Tensor, Tensor, Tensor, Tensor)")
def mta_backward(grad_out, q, k, v, w, out, lse, scale):
    """dQ, dK, dV and dW (fp32, summed over the batch) of Multi-Token Attention."""
    p, q, k, v, w = _mta_inputs(q, k, v, w, scale)
    out, grad_out, lse = _kernel_input(out), _kernel_input(grad_out), lse.contiguous()
    dq, dk, dv = (torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))
    dw = torch.empty(w.shape, dtype=w.dtype, device=w.device)
    ws, nws = _workspace(p, "mta_backward_workspace_size", q)
    _launch("mta_backward", q, p.address, _device(q), _tensor(q), _tensor(k), _tensor(v), w.data_ptr(),
            _tensor(out), lse.data_ptr(), _tensor(grad_out), _T(dq.data_ptr()), _T(dk.data_ptr()),
            _T(dv.data_ptr()), dw.data_ptr(), _ptr(ws), nws, _stream(q))
    return dq, dk, dv, dw


@mta_backward.register_fake
def _(grad_out, q, k, v, w, out, lse, scale):
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape), w.new_empty(w.shape)


def _mta_setup(ctx, inputs, output):
    q, k, v, w, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, w, o, lse)
    ctx.scale = scale
    ctx.mark_non_differentiable(lse)


def _mta_grad(ctx, grad_o, grad_lse):
    q, k, v, w, o, lse = ctx.saved_tensors
    dq, dk, dv, dw = mta_backward(grad_o, q, k, v, w, o, lse, ctx.scale)
    return dq, dk, dv, dw, None


mta_forward.register_autograd(_mta_grad, setup_context=_mta_setup)


DECODE_ROWS = 16  # FLASHLAB_MTA_DECODE_ROWS


@torch.library.custom_op("flashlab::mta_decode", mutates_args=(),
                         schema="(Tensor q, Tensor k, Tensor v, Tensor w, float scale) -> Tensor")
def mta_decode(q, k, v, w, scale):
    """O `[B, R, H, d]` of the last R = min(16, N) query rows (row r is token N − R + r)."""
    p, q, k, v, w = _mta_inputs(q, k, v, w, scale)
    B, N, H, d = q.shape
    o = torch.empty((B, min(DECODE_ROWS, N), H, d), dtype=q.dtype, device=q.device)
    ws, nws = _workspace(p, "mta_decode_workspace_size", q)
    _launch("mta_decode", q, p.address, _device(q), _tensor(q), _tensor(k), _tensor(v), w.data_ptr(),
            _T(o.data_ptr()), _ptr(ws), nws, _stream(q))
    return o


@mta_decode.register_fake
def _(q, k, v, w, scale):
    B, N, H, d = q.shape
    return q.new_empty((B, min(DECODE_ROWS, N), H, d))


def _mta_args(q, k, v, w, scale):
    _check_tensors(("q", "k", "v"), (q, k, v))
    if not isinstance(w, torch.Tensor):
        raise FlashlabTypeError(f"w: expected a torch.Tensor, got {type(w).__name__}", hint=None)
    s = _checks.check_scale(scale)
    return s


def mta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, *, scale: Optional[float] = None,
        return_lse: bool = False):
    """flashlab.mta for torch tensors (see flashlab.mta for the contract)."""
    s = _mta_args(q, k, v, w, scale)
    B, N, H, d, cq, ck = _checks.mta_shapes(q.shape, k.shape, v.shape, w.shape)
    _check_stat("w", w, q, (H, cq, ck))
    o, lse = mta_forward(q, k, v, w, s)
    return (o, lse) if return_lse else o


def mta_decode_last(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, *,
                    scale: Optional[float] = None) -> torch.Tensor:
    """flashlab.mta_decode for torch tensors."""
    s = _mta_args(q, k, v, w, scale)
    B, N, H, d, cq, ck = _checks.mta_shapes(q.shape, k.shape, v.shape, w.shape)
    _check_stat("w", w, q, (H, cq, ck))
    return mta_decode(q, k, v, w, s)


# ------------------------------------------------------------------------------------------------
# STREAM
# ------------------------------------------------------------------------------------------------

def _stream_problem(q, k_blocks, bq, bk, mask=None):
    T, d = q.shape
    return _checks.stream_problem(T, d, bq, bk, k_blocks, _dtype(q), _ptr(mask))


@torch.library.custom_op(
    "flashlab::stream_estimate", mutates_args=(),
    schema="(Tensor q, Tensor k, int k_blocks, int bq, int bk, Tensor? mask) -> Tensor")
def stream_estimate(q, k, k_blocks, bq, bk, mask):
    """Indices int64 `[n_q, k_blocks]` of the STREAM mask estimate (mask: host uint8 [n_q, n_k])."""
    p = _stream_problem(q, k_blocks, bq, bk, mask)
    q, k = _kernel_input(q), _kernel_input(k)
    n_q = -(-q.shape[0] // bq)
    idx = torch.empty((n_q, k_blocks), dtype=torch.int64, device=q.device)
    ws, nws = _workspace(p, "stream_estimate_workspace_size", q)
    _launch("stream_estimate", q, p.address, _device(q), _tensor(q), _tensor(k), idx.data_ptr(), _ptr(ws), nws,
            _stream(q))
    return idx


@stream_estimate.register_fake
def _(q, k, k_blocks, bq, bk, mask):
    return q.new_empty((-(-q.shape[0] // bq), k_blocks), dtype=torch.int64)


@torch.library.custom_op("flashlab::stream_apply", mutates_args=(),
                         schema="(Tensor q, Tensor k, Tensor v, Tensor indices, int bq, int bk) -> Tensor")
def stream_apply(q, k, v, indices, bq, bk):
    """O `[T, d]` of the sparse attention over the key blocks in `indices`."""
    p = _stream_problem(q, indices.shape[1], bq, bk)
    q, k, v, indices = _kernel_input(q), _kernel_input(k), _kernel_input(v), indices.contiguous()
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ws, nws = _workspace(p, "stream_apply_workspace_size", q)
    _launch("stream_apply", q, p.address, _device(q), _tensor(q), _tensor(k), _tensor(v), indices.data_ptr(),
            _T(o.data_ptr()), _ptr(ws), nws, _stream(q))
    return o


@stream_apply.register_fake
def _(q, k, v, indices, bq, bk):
    return q.new_empty(q.shape)


@torch.library.custom_op(
    "flashlab::stream_trace", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor indices, int bq, int bk) -> (Tensor, Tensor)")
def stream_trace(q, k, v, indices, bq, bk):
    """O `[T, d]` and the edge records as int32 `[n_q·k, 6]` (q, r, slot, then the bit patterns
    of the fp32 score, mass, value_norm)."""
    p = _stream_problem(q, indices.shape[1], bq, bk)
    q, k, v, indices = _kernel_input(q), _kernel_input(k), _kernel_input(v), indices.contiguous()
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    edges = torch.empty((indices.numel(), 6), dtype=torch.int32, device=q.device)
    ws, nws = _workspace(p, "stream_trace_workspace_size", q)
    _launch("stream_trace", q, p.address, _device(q), _tensor(q), _tensor(k), _tensor(v), indices.data_ptr(),
            _T(o.data_ptr()), edges.data_ptr(), _ptr(ws), nws, _stream(q))
    return o, edges


@stream_trace.register_fake
def _(q, k, v, indices, bq, bk):
    return q.new_empty(q.shape), q.new_empty((indices.numel(), 6), dtype=torch.int32)


def _stream_args(names, tensors, bq, bk):
    first = _check_tensors(names, tensors)
    _checks.stream_shapes(*(t.shape for t in tensors))
    _checks.check_positive_int("bq", bq)
    _checks.check_positive_int("bk", bk)
    return first


def _stream_indices(indices, q: torch.Tensor, bq: int) -> None:
    if not isinstance(indices, torch.Tensor):
        raise FlashlabTypeError(f"indices: expected a torch.Tensor, got {type(indices).__name__}", hint=None)
    if indices.dtype != torch.int64 or indices.device != q.device:
        raise FlashlabTypeError(f"indices: {indices.dtype} on {indices.device}, expected torch.int64 on {q.device}",
                                hint="pass what stream.estimate returned")
    _checks.check_rank("indices", indices.shape, 2, "[n_q, k_blocks]")
    n_q = -(-q.shape[0] // bq)
    if indices.shape[0] != n_q:
        raise FlashlabValueError(f"indices: {indices.shape[0]} rows, expected n_q = ceil(T/bq) = {n_q}", hint=None)


def stream_estimate_torch(q, k, k_blocks: int, bq: int, bk: int, mask) -> torch.Tensor:
    _stream_args(("q", "k"), (q, k), bq, bk)
    _checks.check_positive_int("k_blocks", k_blocks)
    m = None
    if mask is not None:
        from . import _numpy
        src = mask.cpu().numpy() if isinstance(mask, torch.Tensor) else mask
        m = torch.from_numpy(_numpy.stream_mask_bytes(src, q.shape[0], bq, bk))
    return stream_estimate(q, k, k_blocks, bq, bk, m)


def stream_apply_torch(q, k, v, indices, bq: int, bk: int) -> torch.Tensor:
    _stream_args(("q", "k", "v"), (q, k, v), bq, bk)
    _stream_indices(indices, q, bq)
    return stream_apply(q, k, v, indices, bq, bk)


def stream_trace_torch(q, k, v, indices, bq: int, bk: int) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    _stream_args(("q", "k", "v"), (q, k, v), bq, bk)
    _stream_indices(indices, q, bq)
    o, e = stream_trace(q, k, v, indices, bq, bk)
    f = e[:, 3:].view(torch.float32)
    edges = {"q": e[:, 0], "r": e[:, 1], "slot": e[:, 2], "score": f[:, 0], "mass": f[:, 1], "value_norm": f[:, 2]}
    return o, edges


# ------------------------------------------------------------------------------------------------
# Routing F.scaled_dot_product_attention to flashlab
# ------------------------------------------------------------------------------------------------

from ._sdpa import SdpaRoute, use_for_sdpa  # noqa: E402  (needs the operators above)

__all__: List[str] = [
    "attention_forward", "attention_backward", "mta_forward", "mta_backward", "mta_decode",
    "stream_estimate", "stream_apply", "stream_trace", "use_for_sdpa", "SdpaRoute",
]
