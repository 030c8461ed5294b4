"""flashlab_attention_call from Python: the package's ctypes struct (its flashlab_tensor members
spelled out as two fields each) must lay out as the header's, or the torch path's every call would
read pointers from the wrong offsets. On the CPU reference, with NumPy arrays, no torch: the
call-struct entries must give exactly (bit for bit) what the argument-list entries give, with every
tensor in its own field and strided ones in theirs, so each field's offset is exercised.
"""
import ctypes

import numpy as np
import pytest

from flashlab import _capi, _checks


def _lib():
    try:
        return _capi.lib()
    except Exception as e:  # the library-not-found message is test_errors.py's to check
        pytest.skip(f"no libflashlab.so: {e}")


def test_the_struct_spells_out_flashlab_tensor():
    # A flashlab_tensor is a pointer and three int64 (32 bytes, alignment 8); each member of the
    # call struct starts where the header's would: after struct_size, problem and device (int,
    # padded to 8), then members in the header's order.
    C = _capi.AttentionCall
    assert ctypes.sizeof(_capi.Tensor) == 32
    tensors = ("q", "k", "v", "o")
    for i, name in enumerate(tensors):
        assert getattr(C, name).offset == 24 + 32 * i
        assert getattr(C, name + "_stride").offset == 24 + 32 * i + 8
    assert C.lse.offset == 152
    for i, name in enumerate(("d_o", "dq", "dk", "dv")):
        assert getattr(C, name).offset == 160 + 32 * i
    assert (C.workspace.offset, C.workspace_bytes.offset, C.stream.offset) == (288, 296, 304)
    assert ctypes.sizeof(C) == 312
    assert C().struct_size == 312


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_call_struct_equals_the_argument_list(rng, dtype):
    L = _lib()
    B, N, Nk, H, Hkv, d = 2, 9, 11, 4, 2, 8
    code = _capi.DTYPE_F32 if dtype == np.float32 else _capi.DTYPE_F64
    p = _checks.attention_problem(B, N, Nk, H, Hkv, d, 0.0, True, code, False)
    q = rng.standard_normal((B, N, H, 2 * d)).astype(dtype)[..., :d]  # strided: every row 2d apart
    k, v = (rng.standard_normal((B, Nk, Hkv, d)).astype(dtype) for _ in range(2))
    do = rng.standard_normal((B, N, H, d)).astype(dtype)
    item = q.itemsize
    T = _capi.Tensor

    def strided(a):
        st = [s // item for s in a.strides[:3]]
        return T(a.ctypes.data, (ctypes.c_int64 * 3)(*st))

    o1, o2 = np.zeros((B, N, H, d), dtype), np.ones((B, N, H, d), dtype)
    l1, l2 = (np.zeros((B, H, N), dtype) for _ in range(2))
    assert L.attention_forward(p.address, _capi.DEVICE_CPU, strided(q), T(k.ctypes.data), T(v.ctypes.data),
                               T(o1.ctypes.data), l1.ctypes.data, None, 0, None) == 0, L.last_error()
    c = _capi.AttentionCall(_capi.DEVICE_CPU)
    c.problem, c.q, c.k, c.v, c.o, c.lse = p.address, q.ctypes.data, k.ctypes.data, v.ctypes.data, o2.ctypes.data, \
        l2.ctypes.data
    c.q_stride[:] = [s // item for s in q.strides[:3]]
    assert L.attention_forward_call(c) == 0, L.last_error()
    assert not np.isnan(o2).any()
    assert np.array_equal(o1, o2) and np.array_equal(l1, l2)

    nws = p.workspace_bytes("attention_backward_workspace_size", _capi.DEVICE_CPU, 0)
    g1 = [np.zeros(a.shape, dtype) for a in (do, k, v)]
    g2 = [np.full(a.shape, 7.0, dtype) for a in (do, k, v)]
    assert L.attention_backward(p.address, _capi.DEVICE_CPU, strided(q), T(k.ctypes.data), T(v.ctypes.data),
                                T(o1.ctypes.data), l1.ctypes.data, T(do.ctypes.data), *(T(g.ctypes.data) for g in g1),
                                None, nws, None) == 0, L.last_error()
    c.o, c.d_o = o1.ctypes.data, do.ctypes.data
    c.dq, c.dk, c.dv = (g.ctypes.data for g in g2)
    c.workspace, c.workspace_bytes = None, nws
    assert L.attention_backward_call(c) == 0, L.last_error()
    for a, b in zip(g1, g2):
        assert not np.isnan(b).any()
        assert np.array_equal(a, b)


def test_call_struct_refusals_name_the_entry_and_the_field(rng):
    L = _lib()
    p = _checks.attention_problem(1, 4, 4, 1, 1, 8, 0.0, False, _capi.DTYPE_F32, False)
    x = np.zeros((1, 4, 1, 8), np.float32)
    c = _capi.AttentionCall(_capi.DEVICE_CPU)
    c.problem, c.q, c.k, c.v, c.o = p.address, x.ctypes.data, x.ctypes.data, x.ctypes.data, None
    status = L.attention_forward_call(c)
    assert status == _capi.ERROR_INVALID_ARGUMENT
    assert L.last_error().decode().startswith("flashlab_attention_forward_call: o.data is NULL")
    c.o = x.ctypes.data
    c.struct_size = 16
    assert L.attention_backward_call(c) == _capi.ERROR_INVALID_ARGUMENT
    msg = L.last_error().decode()
    assert msg.startswith("flashlab_attention_backward_call: call->struct_size = 16") and "sizeof(flashlab_attention_call)" in msg
