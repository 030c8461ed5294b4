"""Context-parallel attention over a ``torch.distributed`` process group: one process per GPU, each
holding a shard of the sequence; K/V shards travel around a ring over NCCL while the fast kernels
work on the shard in hand, and the partial outputs are merged by their LSE (the C ABI's
``flashlab_ring_*``, the attention family's ring: docs/context-parallel.md).

How the sequence of N rows is cut among the G ranks of the group (``layout``):

- ``"zigzag"`` (the default, the layout for causal attention): 2G chunks of N / 2G rows; rank r
  holds chunks r and 2G − 1 − r, one after the other, so every rank has the same causal work;
- ``"contiguous"``: G chunks of N / G rows; rank r holds chunk r.

Each rank passes its own rows, ``[B, N / G, H, d]`` (``shard`` cuts them from a whole tensor,
``gather`` puts them back). The NCCL communicator is made beside the group, on first use per
group and device: rank 0 of the group makes its id and broadcasts it over the group (any backend),
and every rank joins (a collective call: every rank of the group must make the same calls in the
same order, as with any ``torch.distributed`` operation). ``release(group)`` frees it.
"""

import ctypes
import math
import threading
from typing import Dict, Optional, Tuple

import torch

from . import _capi
from .errors import FlashlabTypeError, FlashlabValueError

LN2 = math.log(2.0)
#: Bytes of a ring's id (FLASHLAB_RING_ID_BYTES).
RING_ID_BYTES = 128
LAYOUTS = {"zigzag": 0, "contiguous": 1}
_DTYPES = {torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_F16}

_lock = threading.Lock()
_rings: Dict[Tuple[int, int], int] = {}  # (id(group), device index) -> flashlab_ring*
_groups: Dict[int, object] = {}  # keeps each group alive while its ring is cached


def _dist():
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise FlashlabValueError("group: torch.distributed is not initialised",
                                 hint="call torch.distributed.init_process_group() first (e.g. under torchrun)")
    return dist


def _group_size_rank(group) -> Tuple[int, int]:
    dist = _dist()
    try:
        return dist.get_world_size(group), dist.get_rank(group)
    except (RuntimeError, ValueError, TypeError) as e:
        raise FlashlabTypeError(f"group: not a process group this process belongs to ({e})",
                                hint="pass a torch.distributed ProcessGroup (e.g. dist.group.WORLD)") from None


def _check_layout(layout: str) -> int:
    if layout not in LAYOUTS:
        raise FlashlabValueError(f"layout: {layout!r} is not one of {sorted(LAYOUTS)}",
                                 hint="'zigzag' balances causal work; 'contiguous' keeps rows in order")
    return LAYOUTS[layout]


def _chunk_rows(n_local: int, layout: str) -> Tuple[int, int]:
    """(chunks per rank, rows per chunk) of a rank's `n_local` rows."""
    per_rank = 2 if layout == "zigzag" else 1
    if n_local % per_rank:
        raise FlashlabValueError(f"q: {n_local} rows per rank is odd: the zigzag layout holds two equal chunks",
                                 hint="make N a multiple of 2G, or use layout='contiguous'")
    return per_rank, n_local // per_rank


def shard(x: torch.Tensor, group=None, *, layout: str = "zigzag", rank: Optional[int] = None,
          world: Optional[int] = None) -> torch.Tensor:
    """This rank's rows of a whole ``[B, N, ...]`` tensor, ``[B, N / G, ...]`` (a copy), in the
    ring's local order. `rank` and `world` default to the group's."""
    _check_layout(layout)
    if rank is None or world is None:
        world, rank = _group_size_rank(group)
    n = x.shape[1]
    chunks = 2 * world if layout == "zigzag" else world
    if n % chunks:
        raise FlashlabValueError(f"x: N = {n} rows is not a multiple of the {chunks} chunks of the {layout} "
                                 f"layout on {world} GPUs", hint=f"pad N to a multiple of {chunks}")
    c = n // chunks
    parts = [x[:, rank * c:(rank + 1) * c]]
    if layout == "zigzag":
        j = 2 * world - 1 - rank
        parts.append(x[:, j * c:(j + 1) * c])
    return torch.cat(parts, dim=1).contiguous()


def gather(x_local: torch.Tensor, group=None, *, layout: str = "zigzag") -> torch.Tensor:
    """The whole ``[B, N, ...]`` tensor from every rank's shard (an all-gather over `group`)."""
    _check_layout(layout)
    dist = _dist()
    world, _ = _group_size_rank(group)
    parts = [torch.empty_like(x_local) for _ in range(world)]
    dist.all_gather(parts, x_local.contiguous(), group=group)
    per_rank, c = _chunk_rows(x_local.shape[1], layout)
    chunks = [None] * (per_rank * world)
    for r, p in enumerate(parts):
        chunks[r] = p[:, :c]
        if layout == "zigzag":
            chunks[2 * world - 1 - r] = p[:, c:]
    return torch.cat(chunks, dim=1)


def _ring(group, device: torch.device) -> int:
    """The flashlab_ring* of this process for `group` on `device`, made on first use."""
    key = (id(group), device.index)
    ring = _rings.get(key)
    if ring is not None:
        return ring
    L = _capi.lib()
    if not L.has_ring():  # the library's own refusal, with its hint
        raise L.fail(L.ring_unique_id(None), "flashlab_ring_unique_id")
    dist = _dist()
    world, rank = _group_size_rank(group)
    with _lock:
        ident = (ctypes.c_ubyte * RING_ID_BYTES)()
        if rank == 0:
            status = L.ring_unique_id(ident)
            if status:
                raise L.fail(status, "flashlab_ring_unique_id")
        box = [bytes(ident)]
        src = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast_object_list(box, src=src, group=group)
        ctypes.memmove(ident, box[0], RING_ID_BYTES)
        handle = ctypes.c_void_p()
        with torch.cuda.device(device):
            status = L.ring_create(ident, world, rank, ctypes.byref(handle))
        if status:
            raise L.fail(status, "flashlab_ring_create")
        _rings[key] = handle.value
        _groups[key[0]] = group
    return handle.value


def release(group=None) -> None:
    """Frees this process's rings of `group` (after the work enqueued on them has finished)."""
    L = _capi.lib()
    with _lock:
        for key in [k for k in _rings if k[0] == id(group)]:
            torch.cuda.synchronize(key[1])
            status = L.ring_destroy(_rings.pop(key))
            if status:
                raise L.fail(status, "flashlab_ring_destroy")
        _groups.pop(id(group), None)


# The kernels' local layout: the rank's chunks one after the other, each [B, c, ...]; for B = 1
# that is the caller's [1, N / G, ...] itself.
def _to_ring(x: torch.Tensor, per_rank: int) -> torch.Tensor:
    if x.shape[0] == 1 or per_rank == 1:
        return x.contiguous()
    b, n = x.shape[0], x.shape[1]
    return x.reshape(b, per_rank, n // per_rank, *x.shape[2:]).transpose(0, 1).contiguous()


def _from_ring(x: torch.Tensor, b: int, per_rank: int) -> torch.Tensor:
    if b == 1 or per_rank == 1:
        return x
    return x.transpose(0, 1).reshape(b, per_rank * x.shape[2], *x.shape[3:])


class _Call:
    """One ring problem: the whole problem's C struct, the ring, the local layout."""

    def __init__(self, q, k, group, causal, scale, layout, deterministic):
        world, _ = _group_size_rank(group)
        b, n_local, h, d = q.shape
        self.b, self.world, self.layout = b, world, _check_layout(layout)
        self.per_rank, self.c = _chunk_rows(n_local, layout)
        p = _capi.lib().attention_defaults()
        p.batch, p.seq_q, p.heads, p.heads_kv, p.head_dim = b, n_local * world, h, k.shape[2], d
        p.scale = 0.0 if scale is None else float(scale)
        p.causal, p.dtype, p.deterministic = int(bool(causal)), _DTYPES[q.dtype], int(bool(deterministic))
        self.problem = p
        self.ring = _ring(group, q.device)

    def workspace(self, backward: bool, like: torch.Tensor) -> Tuple[Optional[torch.Tensor], int]:
        L = _capi.lib()
        n = ctypes.c_size_t()
        status = L.ring_workspace_size(ctypes.byref(self.problem), self.layout, self.world, int(backward),
                                       ctypes.byref(n))
        if status:
            raise L.fail(status, "flashlab_ring_workspace_size")
        if n.value == 0:
            return None, 0
        return torch.empty(n.value, dtype=torch.uint8, device=like.device), n.value

    def launch(self, fn: str, like: torch.Tensor, *pointers) -> None:
        L = _capi.lib()
        ws, n = self.workspace(fn == "ring_backward", like)
        stream = torch.cuda.current_stream(like.device).cuda_stream
        with torch.cuda.device(like.device):
            status = getattr(L, fn)(ctypes.byref(self.problem), self.layout, self.ring, *pointers,
                                    None if ws is None else ws.data_ptr(), n, stream)
        if status:
            raise L.fail(status, "flashlab_" + fn)


class _RingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, call):
        qr, kr, vr = (_to_ring(t, call.per_rank) for t in (q, k, v))
        o = torch.empty_like(qr)
        lse = torch.empty(call.per_rank, call.b, q.shape[2], call.c, dtype=torch.float32, device=q.device)
        call.launch("ring_forward", q, qr.data_ptr(), kr.data_ptr(), vr.data_ptr(), o.data_ptr(), lse.data_ptr())
        ctx.save_for_backward(qr, kr, vr, o, lse)
        ctx.call = call
        ctx.set_materialize_grads(False)
        lse_out = lse.permute(1, 2, 0, 3).reshape(call.b, q.shape[2], call.per_rank * call.c) * LN2
        ctx.mark_non_differentiable(lse_out)  # as the single-GPU attention's LSE
        return _from_ring(o, call.b, call.per_rank), lse_out

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        if grad_o is None:
            return None, None, None, None
        qr, kr, vr, o, lse = ctx.saved_tensors
        call = ctx.call
        dor = _to_ring(grad_o, call.per_rank)
        dq, dk, dv = torch.empty_like(qr), torch.empty_like(kr), torch.empty_like(vr)
        call.launch("ring_backward", qr, qr.data_ptr(), kr.data_ptr(), vr.data_ptr(), o.data_ptr(), lse.data_ptr(),
                    dor.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
        return (_from_ring(dq, call.b, call.per_rank), _from_ring(dk, call.b, call.per_rank),
                _from_ring(dv, call.b, call.per_rank), None)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None, causal: bool = False,
              scale: Optional[float] = None, layout: str = "zigzag", return_lse: bool = False,
              deterministic: bool = False):
    """This rank's part of attention over the whole sequence the group holds.

    Args:
        q: this rank's queries ``[B, N / G, H, d]`` in the ring's local order (``shard``);
            CUDA bfloat16/float16, on this rank's GPU.
        k, v: its keys and values ``[B, N / G, H_kv, d]`` (H_kv divides H).
        group: the ``torch.distributed`` process group of the G ranks (None: the default group).
        causal: query i sees key j iff j ≤ i, i and j counted over the whole sequence.
        scale: softmax scale; None for ``1/√d``.
        layout: ``"zigzag"`` or ``"contiguous"`` (the module comment).
        return_lse: also return this rank's natural-log LSE, float32 ``[B, H, N / G]``.
        deterministic: a bit-reproducible dQ (the Hopper backward's; elsewhere refused).

    Returns:
        This rank's rows of O, ``[B, N / G, H, d]``, or ``(O, lse)``. Differentiable in q, k, v.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise FlashlabTypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}", hint=None)
        if not t.is_cuda:
            raise FlashlabTypeError(f"{name}: on {t.device}: the ring runs on CUDA tensors",
                                    hint="move this rank's shard to its GPU")
        if t.dtype not in _DTYPES:
            raise FlashlabTypeError(f"{name}: dtype {t.dtype}: the ring takes torch.bfloat16 or torch.float16",
                                    hint=None)
        if t.device != q.device or t.dtype != q.dtype:
            raise FlashlabTypeError(f"{name}: {t.dtype} on {t.device}, q is {q.dtype} on {q.device}",
                                    hint="q, k, v share one dtype and device")
        if t.dim() != 4:
            raise FlashlabValueError(f"{name}: shape {tuple(t.shape)} is not [B, N / G, H, d]", hint=None)
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise FlashlabValueError(f"k, v: shapes {tuple(k.shape)}, {tuple(v.shape)} do not fit q's {tuple(q.shape)}",
                                 hint="k and v are [B, N / G, H_kv, d] with q's B, N / G and d")
    call = _Call(q, k, group, causal, scale, layout, deterministic)
    o, lse = _RingFunction.apply(q, k, v, call)
    return (o, lse) if return_lse else o

