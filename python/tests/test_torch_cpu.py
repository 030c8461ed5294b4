"""The torch operators on CPU tensors (float64: the CPU reference through the same custom ops the
CUDA path uses): autograd against torch.autograd.gradcheck, the operator registration against
torch.library.opcheck, torch.compile(fullgraph=True). Skipped where torch is not installed.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashlab  # noqa: E402
import reference  # noqa: E402


def t64(rng, *shape, grad=True):
    return torch.tensor(rng.standard_normal(shape), dtype=torch.float64, requires_grad=grad)


def test_the_operators_are_registered():
    for name in ("attention_forward", "attention_backward", "mta_forward", "mta_backward", "mta_decode",
                 "stream_estimate", "stream_apply", "stream_trace"):
        assert hasattr(torch.ops.flashlab, name), name


def via_operator(causal):
    return lambda a, b, c: torch.ops.flashlab.attention_forward(a, b, c, causal, 0.0, False)[0]


@pytest.mark.parametrize("path", ["eager", "operator"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_reference_and_gradcheck(rng, causal, path):
    """Both ways in: flashlab.attention's eager path (an autograd.Function over the operator's
    body) and the registered operator with its autograd rule."""
    q, k, v = t64(rng, 1, 5, 2, 3), t64(rng, 1, 5, 2, 3), t64(rng, 1, 5, 2, 3)
    fn = (lambda a, b, c: flashlab.attention(a, b, c, causal=causal)) if path == "eager" else via_operator(causal)
    o = fn(q, k, v)
    ref, _ = reference.attention(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), causal)
    assert np.max(np.abs(o.detach().numpy() - ref)) <= 1e-12 * np.max(np.abs(ref))
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_attention_gradcheck_with_nq_not_nk(rng):
    q, k, v = t64(rng, 2, 3, 1, 2), t64(rng, 2, 6, 1, 2), t64(rng, 2, 6, 1, 2)
    assert torch.autograd.gradcheck(lambda a, b, c: flashlab.attention(a, b, c, causal=True), (q, k, v))


def test_mta_gradcheck_in_q_k_v_w(rng):
    q, k, v = t64(rng, 1, 5, 1, 3), t64(rng, 1, 5, 1, 3), t64(rng, 1, 5, 1, 3)
    w = torch.tensor(rng.standard_normal((1, 2, 3)) * 0.5, dtype=torch.float64, requires_grad=True)
    o = flashlab.mta(q, k, v, w)
    ref = reference.mta(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), w.detach().numpy())
    assert np.max(np.abs(o.detach().numpy() - ref)) <= 1e-12 * np.max(np.abs(ref))
    assert torch.autograd.gradcheck(lambda a, b, c, x: flashlab.mta(a, b, c, x), (q, k, v, w))


def test_opcheck(rng):
    q, k, v = t64(rng, 1, 4, 2, 3), t64(rng, 1, 4, 2, 3), t64(rng, 1, 4, 2, 3)
    torch.library.opcheck(torch.ops.flashlab.attention_forward.default, (q, k, v, True, 0.0, False))
    w = torch.tensor(rng.standard_normal((2, 2, 1)), dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.flashlab.mta_forward.default, (q, k, v, w, 0.0))
    qs, ks = torch.tensor(rng.integers(-3, 4, (20, 3)), dtype=torch.float64), torch.tensor(
        rng.integers(-3, 4, (20, 3)), dtype=torch.float64)
    torch.library.opcheck(torch.ops.flashlab.stream_estimate.default, (qs, ks, 2, 4, 4, None))


def test_compile_fullgraph(rng):
    q, k, v = t64(rng, 1, 6, 2, 4), t64(rng, 1, 6, 2, 4), t64(rng, 1, 6, 2, 4)

    def f(a, b, c):
        return (flashlab.attention(a, b, c, causal=True) * 2).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = compiled(q, k, v)
    got.backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    f(q, k, v).backward()
    assert torch.equal(got, f(q, k, v))
    for g, x in zip(grads, (q, k, v)):
        assert torch.allclose(g, x.grad, rtol=0, atol=1e-13)


def test_stream_on_cpu_tensors_matches_numpy(rng):
    q, k, v = (rng.integers(-3, 4, (30, 4)).astype(np.float64) for _ in range(3))
    idx = flashlab.stream.estimate(torch.from_numpy(q), torch.from_numpy(k), k_blocks=3, bq=4, bk=4)
    assert idx.dtype == torch.int64
    assert np.array_equal(idx.numpy(), reference.stream_estimate(q, k, 3, 4, 4))
    o, edges = flashlab.stream.trace(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), idx, bq=4, bk=4)
    ref_o, ref_e = reference.stream_trace(q, k, v, idx.numpy(), 4, 4)
    assert np.max(np.abs(o.numpy() - ref_o)) <= 1e-12 * np.max(np.abs(ref_o))
    assert np.array_equal(edges["r"].numpy(), ref_e["r"].astype(np.int32))
    assert np.array_equal(edges["q"].numpy(), ref_e["q"].astype(np.int32))
    assert np.allclose(edges["mass"].numpy(), ref_e["mass"], rtol=1e-6, atol=1e-6)


def test_torch_errors_name_the_argument(rng):
    q = torch.zeros(1, 4, 2, 8, dtype=torch.float16)
    with pytest.raises(TypeError, match="q: dtype torch.float16 is not taken on the CPU"):
        flashlab.attention(q, q, q)
    q = torch.zeros(1, 4, 2, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match="k: dtype torch.float32 differs"):
        flashlab.attention(q, q.float(), q)
    with pytest.raises(TypeError, match="v: expected a torch.Tensor, got ndarray"):
        flashlab.attention(q, q, q.numpy())
    with pytest.raises(ValueError, match="seq"):
        flashlab.attention(q[:, :0], q[:, :0], q[:, :0])


@pytest.mark.parametrize("path", ["eager", "operator"])
def test_grouped_query_window_gradcheck(rng, path):
    """Grouped-query attention (H = 4 over H_kv = 2), N_q ≠ N_k and a window through both ways in:
    the same values as the NumPy path, and gradients (dK, dV summed over each group) by gradcheck."""
    q, k, v = t64(rng, 1, 5, 4, 3), t64(rng, 1, 7, 2, 3), t64(rng, 1, 7, 2, 3)
    if path == "eager":
        fn = lambda a, b, c: flashlab.attention(a, b, c, causal=True, window=(2, 0))  # noqa: E731
    else:
        fn = lambda a, b, c: torch.ops.flashlab.attention_forward(a, b, c, True, 0.0, False, 2, 0)[0]  # noqa: E731
    o = fn(q, k, v)
    want = flashlab.attention(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), causal=True, window=(2, 0))
    assert np.array_equal(o.detach().numpy(), want)
    plain = flashlab.attention(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), causal=True)
    assert not np.array_equal(want, plain)  # the window changes the result
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_grouped_query_backward_call_shapes_and_refusals(rng):
    """The backward without autograd (flashlab.torch.attention_backward_call) on grouped K/V with
    N_k != N: dK, dV come back [B, N_k, H_kv, d], equal to autograd's; each tensor of the wrong shape
    is refused naming the argument, before any kernel runs (the same checks guard the CUDA path)."""
    from flashlab.torch import attention_backward_call
    q, k, v = t64(rng, 2, 5, 4, 3, grad=False), t64(rng, 2, 9, 2, 3, grad=False), t64(rng, 2, 9, 2, 3, grad=False)
    do = t64(rng, 2, 5, 4, 3, grad=False)
    o, lse = flashlab.attention(q, k, v, causal=True, return_lse=True)
    lse2 = lse / np.log(2.0)  # the operators' LSE is base 2
    dq, dk, dv = attention_backward_call(do, q, k, v, o, lse2, causal=True)
    assert dq.shape == q.shape and dk.shape == (2, 9, 2, 3) and dv.shape == (2, 9, 2, 3)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    flashlab.attention(*leaves, causal=True).backward(do)
    for got, want in zip((dq, dk, dv), (x.grad for x in leaves)):
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="do: shape"):
        attention_backward_call(do[:, :4], q, k, v, o, lse2, causal=True)
    with pytest.raises(ValueError, match="o: shape"):
        attention_backward_call(do, q, k, v, o[:, :, :2], lse2, causal=True)
    with pytest.raises(ValueError, match="key/value heads do not divide"):
        attention_backward_call(do, q, k[:, :, :1].expand(2, 9, 3, 3).contiguous(), v[:, :, :1].expand(2, 9, 3, 3)
                                .contiguous(), o, lse2, causal=True)
    with pytest.raises(ValueError, match="v: "):
        attention_backward_call(do, q, k, v[:, :8], o, lse2, causal=True)
    with pytest.raises(ValueError, match="lse"):
        attention_backward_call(do, q, k, v, o, lse2[:, :2], causal=True)
