"""The GSA references agree with each other, are differentiable, and stay finite under strong decay."""
import functools

import pytest
import torch
import torch.nn.functional as F

import references.common as common
import references.gsa as gsa_ref
from references.gsa import gsa_chunked, gsa_recurrent


def make(B, T, H, K, V, M, normaliser=1.0, seed=0, dtype=torch.float64, grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g, dtype=dtype)
    s = torch.randn(B, T, H, M, generator=g, dtype=dtype)
    gate = F.logsigmoid(torch.randn(B, T, H, M, generator=g, dtype=dtype)) / normaliser
    hk0 = torch.randn(B, H, K, M, generator=g, dtype=dtype)
    hv0 = torch.randn(B, H, M, V, generator=g, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v, s, gate, hk0, hv0)]


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("T,chunk", [(1, 16), (15, 16), (16, 16), (17, 16), (70, 16), (40, 8)])
@pytest.mark.parametrize("normaliser", [1.0, 0.05, 16.0])
def test_chunked_equals_loop_forward(T, chunk, normaliser):
    q, k, v, s, g, hk0, hv0 = make(2, T, 2, 6, 5, 4, normaliser)
    o1, (a1, b1) = gsa_recurrent(q, k, v, s, g, initial_state=(hk0, hv0), output_final_state=True)
    o2, (a2, b2) = gsa_chunked(q, k, v, s, g, initial_state=(hk0, hv0), output_final_state=True,
                               chunk_size=chunk)
    assert rel(o2, o1) < 1e-12
    assert rel(a2, a1) < 1e-12
    assert rel(b2, b1) < 1e-12


@pytest.mark.parametrize("normaliser", [1.0, 0.05])
def test_chunked_equals_loop_gradients(normaliser):
    inputs = make(2, 37, 2, 5, 7, 3, normaliser, grad=True)
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(2, 37, 2, 7, dtype=torch.float64, generator=gen)
    dhk = torch.randn(2, 2, 5, 3, dtype=torch.float64, generator=gen)
    dhv = torch.randn(2, 2, 3, 7, dtype=torch.float64, generator=gen)
    grads = []
    for fn in (gsa_recurrent, functools.partial(gsa_chunked, chunk_size=8)):
        o, (hk, hv) = fn(*inputs[:5], scale=0.3, initial_state=tuple(inputs[5:]), output_final_state=True)
        grads.append(torch.autograd.grad([o, hk, hv], inputs, [do, dhk, dhv]))
    for name, a, b in zip("q k v s g hk0 hv0".split(), *grads):
        assert rel(b, a) < 1e-11, name


def test_without_initial_state_and_final_state_only_when_asked():
    q, k, v, s, g, _, _ = make(1, 5, 1, 4, 4, 4)
    assert gsa_recurrent(q, k, v, s, g)[1] is None
    assert gsa_chunked(q, k, v, s, g)[1] is None
    o1, (a1, b1) = gsa_recurrent(q, k, v, s, g, output_final_state=True)
    o2, (a2, b2) = gsa_chunked(q, k, v, s, g, output_final_state=True, chunk_size=4)
    assert rel(o2, o1) < 1e-12 and rel(a2, a1) < 1e-12 and rel(b2, b1) < 1e-12


@pytest.mark.parametrize("fn", [gsa_recurrent, functools.partial(gsa_chunked, chunk_size=4)])
def test_gradcheck(fn):
    inputs = make(1, 6, 2, 3, 2, 3, grad=True)

    def f(*xs):
        o, (hk, hv) = fn(*xs[:5], initial_state=xs[5:], output_final_state=True)
        return o, hk, hv
    assert torch.autograd.gradcheck(f, inputs)


def test_chunked_is_stable_under_strong_decay():
    q, k, v, s, g, hk0, hv0 = make(1, 300, 1, 8, 8, 16, normaliser=0.05, grad=True)
    o, (hk, hv) = gsa_chunked(q, k, v, s, g, initial_state=(hk0, hv0), output_final_state=True,
                              chunk_size=64)
    (o.sum() + hk.sum() + hv.sum()).backward()
    assert all(torch.isfinite(x).all() for x in (o, hk, hv))
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v, s, g, hk0, hv0))
    assert g.min() < -30  # the decay really is strong: cumulative gates reach thousands


def test_grouped_scores_equal_ungrouped(monkeypatch):
    """The checkpointed groups of chunks give the same values and gradients as one pass."""
    inputs = make(1, 100, 2, 4, 3, 5, 0.05, grad=True)
    o1, _ = gsa_chunked(*inputs[:5], chunk_size=8)
    g1 = torch.autograd.grad(o1.sum(), inputs[:5])
    monkeypatch.setattr(gsa_ref, "map_chunk_groups",
                        functools.partial(common.map_chunk_groups, max_elements=600))
    o2, _ = gsa_ref.gsa_chunked(*inputs[:5], chunk_size=8)
    g2 = torch.autograd.grad(o2.sum(), inputs[:5])
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("dtype,limit", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_same_dtype_baseline_is_close_but_not_exact(dtype, limit):
    q, k, v, s, g, _, _ = make(1, 70, 2, 8, 8, 16, dtype=torch.float32)
    low = [x.to(dtype) for x in (q, k, v, s, g)]
    o64, _ = gsa_recurrent(*(x.double() for x in low))
    ob, _ = gsa_chunked(*low, chunk_size=64, operand_dtype=dtype)
    assert ob.dtype == dtype
    err = rel(ob.double(), o64)
    assert 0 < err < limit
