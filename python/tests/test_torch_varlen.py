"""Packed variable-length sequences with torch tensors: ``flashlab.attention(..., cu_seqlens_q=,
cu_seqlens_k=)`` and ``flashlab.attention_varlen``. CPU float64 tensors run the reference (checked
against the float64 NumPy reference of tests/reference.py, sequence by sequence, to 1e-12); CUDA
bfloat16/float16 tensors run the fast forward with the lists in device memory (to 2e-2·max|ref|
for bfloat16 and 4e-3·max|ref| for float16, the bounds of test_torch_cuda.py's outputs). Autograd
through a packed result: on CPU float64 against torch's own float64 autograd of the masked
softmax, sequence by sequence (1e-10); on CUDA against the same on the rounded inputs, within
test_torch_cuda.py's gradient bounds (3e-2 and 6e-3 of max|ref|). The argument checks are tested on either device.

Skipped without torch; the CUDA tests also without a CUDA device (failed instead with
FLASHLAB_REQUIRE_CUDA=1).
"""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashlab  # noqa: E402
import reference  # noqa: E402
from flashlab.errors import FlashlabTypeError, FlashlabValueError  # noqa: E402

HAVE_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAVE_CUDA and os.environ.get("FLASHLAB_REQUIRE_CUDA") != "1",
                                reason="torch sees no CUDA device")
BOUND = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
GRAD_BOUND = {torch.bfloat16: 3e-2, torch.float16: 6e-3}  # test_torch_cuda.py's gradient bounds


def cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def packed_reference(q, k, v, cu_q, cu_k, causal=False, window=(-1, -1)):
    """(O [total_q, H, d], LSE base 2 [H, total_q]) in float64, one sequence at a time."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    H, d = q.shape[1], q.shape[2]
    o = np.zeros(q.shape)
    lse = np.full((H, q.shape[0]), -np.inf)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if q1 == q0 or k1 == k0:  # no rows, or rows that see no key: O = 0, LSE = −inf
            continue
        ob, lb = reference.attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal, window=window)
        o[q0:q1] = ob[0]
        lse[:, q0:q1] = lb[0]
    return o, lse


def packed_grads(q, k, v, do, cu_q, cu_k, causal=False, window=(-1, -1)):
    """(dQ, dK, dV) in float64 of the loss Σ O∘dO, by torch autograd of the masked softmax written
    out per sequence (the mask of attention_problem.hpp: the diagonal at offset len_k − len_q)."""
    q, k, v, do = (torch.tensor(np.asarray(x, dtype=np.float64)) for x in (q, k, v, do))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    H, d, G = q.shape[1], q.shape[2], q.shape[1] // k.shape[1]
    outs = []
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if q1 == q0:
            continue
        if k1 == k0:
            outs.append(torch.zeros((q1 - q0, H, d), dtype=torch.float64))
            continue
        qs = q[q0:q1].transpose(0, 1)                                    # [H, n, d]
        ks = k[k0:k1].repeat_interleave(G, dim=1).transpose(0, 1)        # [H, nk, d]
        vs = v[k0:k1].repeat_interleave(G, dim=1).transpose(0, 1)
        i = torch.arange(q1 - q0)[:, None]
        j = torch.arange(k1 - k0)[None, :]
        diag = i + (k1 - k0) - (q1 - q0)
        seen = torch.ones_like(i + j, dtype=torch.bool)
        if causal:
            seen &= j <= diag
        if window[0] >= 0:
            seen &= j >= diag - window[0]
        if window[1] >= 0:
            seen &= j <= diag + window[1]
        s = qs @ ks.transpose(1, 2) / np.sqrt(d)
        s = s.masked_fill(~seen, -np.inf)
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows that see no key: P = 0
        outs.append((p @ vs).transpose(0, 1))
    o = torch.cat(outs) if outs else q.new_zeros(q.shape)
    (o * do).sum().backward()
    return q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


def max_rel(got, want):
    got = np.asarray(got, dtype=np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


# ----------------------------------------------------------------------------------- CPU tensors

def test_cpu_attention_with_cu_seqlens_equals_the_reference(rng):
    lq, lk = [5, 1, 0, 70], [9, 0, 3, 70]
    cq, ck = cu(lq), cu(lk)
    q = torch.tensor(rng.standard_normal((sum(lq), 4, 16)))
    k = torch.tensor(rng.standard_normal((sum(lk), 2, 16)))
    v = torch.tensor(rng.standard_normal((sum(lk), 2, 16)))
    for causal in (False, True):
        o, lse = flashlab.attention(q, k, v, causal=causal, cu_seqlens_q=torch.tensor(cq), cu_seqlens_k=torch.tensor(ck),
                                    return_lse=True)
        want_o, want_lse = packed_reference(q, k, v, cq, ck, causal)
        assert max_rel(o.numpy(), want_o) <= 1e-12
        seen = np.isfinite(want_lse)
        assert np.array_equal(np.isfinite(lse.numpy()), seen)
        assert np.allclose(lse.numpy()[seen], want_lse[seen] * np.log(2.0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (3, 2))])
def test_cpu_backward_through_packed_sequences_equals_torch_autograd(rng, causal, window):
    lq, lk = [3, 0, 4, 6], [5, 2, 0, 6]
    cq, ck = cu(lq), cu(lk)
    q = torch.tensor(rng.standard_normal((sum(lq), 4, 8)), requires_grad=True)
    k = torch.tensor(rng.standard_normal((sum(lk), 2, 8)), requires_grad=True)
    v = torch.tensor(rng.standard_normal((sum(lk), 2, 8)), requires_grad=True)
    do = rng.standard_normal((sum(lq), 4, 8))
    o = flashlab.attention_varlen(q, k, v, torch.tensor(cq), torch.tensor(ck), 6, 6, causal=causal, window=window)
    o.backward(torch.tensor(do))
    for got, want in zip((q.grad, k.grad, v.grad), packed_grads(q.detach(), k.detach(), v.detach(), do, cq, ck,
                                                                 causal, window)):
        assert max_rel(got.numpy(), want) <= 1e-10


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_deterministic_backward_through_packed_sequences_is_the_same_bits(rng, causal):
    # deterministic=True on CPU tensors: the reference (already one fixed order), bit for bit the
    # gradients without the flag and those of a second run, and the float64 gradients.
    lq, lk = [3, 0, 4, 6], [5, 2, 0, 6]
    cq, ck = cu(lq), cu(lk)
    q0, k0, v0 = (rng.standard_normal((sum(n), h, 8)) for n, h in ((lq, 4), (lk, 2), (lk, 2)))
    do = rng.standard_normal((sum(lq), 4, 8))
    grads = []
    for det in (True, True, False):
        q, k, v = (torch.tensor(x, requires_grad=True) for x in (q0, k0, v0))
        flashlab.attention_varlen(q, k, v, torch.tensor(cq), torch.tensor(ck), 6, 6, causal=causal,
                                  deterministic=det).backward(torch.tensor(do))
        grads.append((q.grad, k.grad, v.grad))
    for other in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], other))
    for got, want in zip(grads[0], packed_grads(q0, k0, v0, do, cq, ck, causal)):
        assert max_rel(got.numpy(), want) <= 1e-10


@pytest.mark.parametrize("cu_q, cu_k, match", [
    ([0, 3, 2, 5], None, r"cu_seqlens_q\[2\] = 2 is below cu_seqlens_q\[1\] = 3"),  # not increasing
    ([0, 2, 5], [0, 5], "cu_seqlens_k: 2 entries but cu_seqlens_q has 3"),            # wrong count
    ([0, 2, 4], None, "cu_seqlens_q: the last entry 4 differs from q's 5 rows"),     # total mismatch
])
def test_cpu_bad_cu_seqlens_are_refused_by_name(rng, cu_q, cu_k, match):
    q = torch.tensor(rng.standard_normal((5, 2, 8)))
    with pytest.raises(FlashlabValueError, match=match):
        flashlab.attention(q, q, q, cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32),
                           cu_seqlens_k=None if cu_k is None else torch.tensor(cu_k, dtype=torch.int32))


def test_cu_seqlens_k_alone_is_refused():
    q = torch.zeros((5, 2, 8), dtype=torch.float64)
    with pytest.raises(FlashlabValueError, match="cu_seqlens_q: None but cu_seqlens_k"):
        flashlab.attention(q, q, q, cu_seqlens_k=torch.tensor([0, 5], dtype=torch.int32))


# ---------------------------------------------------------------------------------- CUDA tensors

@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [
    dict(lq=[1, 129, 0, 257, 613], lk=None, H=4, Hkv=4, d=64, causal=False, window=(-1, -1)),
    dict(lq=[1, 129, 0, 257, 613], lk=None, H=4, Hkv=4, d=128, causal=True, window=(-1, -1)),
    dict(lq=[1, 5, 200, 300], lk=[1000, 517, 0, 77], H=8, Hkv=2, d=128, causal=True, window=(-1, -1)),
    dict(lq=[300, 1, 77, 520], lk=None, H=32, Hkv=1, d=64, causal=False, window=(-1, -1)),
    dict(lq=[700, 65, 300], lk=None, H=8, Hkv=2, d=64, causal=True, window=(128, 0)),
])
def test_cuda_packed_forward_equals_the_float64_reference(rng, dtype, case):
    lq, lk = case["lq"], case["lk"] or case["lq"]
    cq, ck = cu(lq), cu(lk)
    q64 = rng.standard_normal((sum(lq), case["H"], case["d"]))
    k64 = rng.standard_normal((sum(lk), case["Hkv"], case["d"]))
    v64 = rng.standard_normal((sum(lk), case["Hkv"], case["d"]))
    q, k, v = (torch.tensor(x, dtype=dtype, device="cuda") for x in (q64, k64, v64))
    # The reference sees the rounded inputs the kernel sees.
    qr, kr, vr = (x.float().cpu().numpy() for x in (q, k, v))
    want_o, want_lse = packed_reference(qr, kr, vr, cq, ck, case["causal"], case["window"])
    o, lse = flashlab.attention(q, k, v, causal=case["causal"], window=case["window"],
                                cu_seqlens_q=torch.tensor(cq, device="cuda"),
                                cu_seqlens_k=torch.tensor(ck, device="cuda"),
                                max_seqlen_q=max(lq), max_seqlen_k=max(lk), return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == q.shape and o.dtype == dtype
    got_o = o.float().cpu().numpy()
    assert not np.isnan(got_o).any()
    assert max_rel(got_o, want_o) <= BOUND[dtype]
    got_lse = lse.cpu().numpy() / np.log(2.0)
    seen = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(got_lse), seen), "rows without keys: LSE = -inf exactly there"
    assert np.all(got_o.reshape(-1, case["H"], case["d"])[~seen.T] == 0), "rows without keys: O = 0"
    assert np.max(np.abs(got_lse[seen] - want_lse[seen])) <= 1e-4 * max(np.max(np.abs(want_lse[seen])), 1.0)


@needs_cuda
def test_cuda_packed_argument_errors(rng):
    q = torch.zeros((10, 2, 64), dtype=torch.bfloat16, device="cuda")
    c = torch.tensor([0, 3, 10], dtype=torch.int32, device="cuda")
    with pytest.raises(FlashlabTypeError, match="cu_seqlens_q: expected a 1-D torch.int32 tensor"):
        flashlab.attention_varlen(q, q, q, c.long(), c, 7, 7)
    with pytest.raises(FlashlabTypeError, match="cu_seqlens_k: on cpu, q on cuda"):
        flashlab.attention_varlen(q, q, q, c, c.cpu(), 7, 7)
    with pytest.raises(FlashlabValueError, match="cu_seqlens_k: 2 entries but cu_seqlens_q has 3"):
        flashlab.attention_varlen(q, q, q, c, c[:2], 7, 7)
    with pytest.raises(FlashlabValueError, match="max_seqlen_q"):
        flashlab.attention_varlen(q, q, q, c, c, 0, 7)
    with pytest.raises(FlashlabValueError, match="lse"):
        flashlab.attention_varlen_backward(q, q, q, q, q, torch.zeros((3, 10), device="cuda"), c, c, 7, 7)
    torch.cuda.synchronize()


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [
    dict(lq=[1, 129, 0, 257, 613], lk=None, H=4, Hkv=4, d=64, causal=False, window=(-1, -1)),
    dict(lq=[1, 5, 200, 300], lk=[1000, 517, 0, 77], H=8, Hkv=2, d=128, causal=True, window=(-1, -1)),
    dict(lq=[700, 65, 300], lk=None, H=8, Hkv=2, d=64, causal=True, window=(128, 0)),
])
def test_cuda_packed_autograd_equals_the_float64_gradients(rng, dtype, case):
    lq, lk = case["lq"], case["lk"] or case["lq"]
    cq, ck = cu(lq), cu(lk)
    q, k, v = (torch.tensor(rng.standard_normal(shape), dtype=dtype, device="cuda").requires_grad_()
               for shape in ((sum(lq), case["H"], case["d"]), (sum(lk), case["Hkv"], case["d"]),
                             (sum(lk), case["Hkv"], case["d"])))
    do = torch.tensor(rng.standard_normal((sum(lq), case["H"], case["d"])), dtype=dtype, device="cuda")
    o = flashlab.attention_varlen(q, k, v, torch.tensor(cq, device="cuda"), torch.tensor(ck, device="cuda"),
                                  max(lq), max(lk), causal=case["causal"], window=case["window"])
    o.backward(do)
    torch.cuda.synchronize()
    rounded = [x.detach().float().cpu().numpy() for x in (q, k, v, do)]
    for name, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad),
                               packed_grads(*rounded, cq, ck, case["causal"], case["window"])):
        assert got.dtype == dtype and got.shape == want.shape, name
        g = got.float().cpu().numpy()
        assert not np.isnan(g).any(), name
        assert max_rel(g, want) <= GRAD_BOUND[dtype], name
