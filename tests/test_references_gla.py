"""The GLA references agree with each other, are differentiable, and stay finite under strong decay."""
import functools

import pytest
import torch
import torch.nn.functional as F

import references.common as common
import references.gla as gla_ref
from references.gla import gla_chunked, gla_recurrent


def make(B, T, H, K, V, normaliser=1.0, seed=0, dtype=torch.float64, grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g, dtype=dtype)
    gate = F.logsigmoid(torch.randn(B, T, H, K, generator=g, dtype=dtype)) / normaliser
    h0 = torch.randn(B, H, K, V, generator=g, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v, gate, h0)]


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_loop_is_the_definition():
    """Two steps by hand: S_1 = diag(exp(g_1)) S_0 + k_1^T v_1, o_t = scale q_t S_t."""
    q, k, v, g, h0 = make(1, 2, 1, 3, 2)
    o, ht = gla_recurrent(q, k, v, g, scale=0.5, initial_state=h0, output_final_state=True)
    S = h0[0, 0]
    for t in range(2):
        S = torch.exp(g[0, t, 0])[:, None] * S + torch.outer(k[0, t, 0], v[0, t, 0])
        assert torch.allclose(o[0, t, 0], 0.5 * q[0, t, 0] @ S, rtol=1e-14, atol=0)
    assert torch.allclose(ht[0, 0], S, rtol=1e-14, atol=0)


@pytest.mark.parametrize("T,chunk", [(1, 16), (15, 16), (16, 16), (17, 16), (70, 16), (40, 8)])
@pytest.mark.parametrize("normaliser", [1.0, 0.05, 16.0])
def test_chunked_equals_loop_forward(T, chunk, normaliser):
    q, k, v, g, h0 = make(2, T, 2, 6, 5, normaliser)
    o1, s1 = gla_recurrent(q, k, v, g, initial_state=h0, output_final_state=True)
    o2, s2 = gla_chunked(q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=chunk)
    assert rel(o2, o1) < 1e-12
    assert rel(s2, s1) < 1e-12


@pytest.mark.parametrize("normaliser", [1.0, 0.05])
def test_chunked_equals_loop_gradients(normaliser):
    inputs = make(2, 37, 2, 5, 7, normaliser, grad=True)
    do = torch.randn(2, 37, 2, 7, dtype=torch.float64)
    dht = torch.randn(2, 2, 5, 7, dtype=torch.float64)
    grads = []
    for fn in (gla_recurrent, functools.partial(gla_chunked, chunk_size=8)):
        o, ht = fn(*inputs[:4], scale=0.3, initial_state=inputs[4], output_final_state=True)
        grads.append(torch.autograd.grad([o, ht], inputs, [do, dht]))
    for name, a, b in zip("q k v g h0".split(), *grads):
        assert rel(b, a) < 1e-11, name


def test_final_state_only_when_asked():
    q, k, v, g, _ = make(1, 5, 1, 4, 4)
    assert gla_recurrent(q, k, v, g)[1] is None
    assert gla_chunked(q, k, v, g)[1] is None


@pytest.mark.parametrize("fn", [gla_recurrent, functools.partial(gla_chunked, chunk_size=4)])
def test_gradcheck(fn):
    inputs = make(1, 6, 2, 3, 2, grad=True)

    def f(*xs):
        return fn(*xs[:4], initial_state=xs[4], output_final_state=True)
    assert torch.autograd.gradcheck(f, inputs)


def test_chunked_is_stable_under_strong_decay():
    q, k, v, g, h0 = make(1, 300, 1, 8, 8, normaliser=0.05, grad=True)
    o, ht = gla_chunked(q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=64)
    (o.sum() + ht.sum()).backward()
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v, g, h0))
    assert g.min() < -30  # the decay really is strong: cumulative gates reach thousands


def test_chunked_float32_stays_finite_under_extreme_decay():
    """Every gate -60: a 64-token chunk sums to -3840, far past exp's float32 range."""
    q, k, v, g, h0 = make(1, 200, 1, 8, 8, dtype=torch.float32, grad=True)
    g = torch.full_like(g, -60.0).requires_grad_()
    o, ht = gla_chunked(q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=64)
    (o.sum() + ht.sum()).backward()
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v, g, h0))


def test_grouped_scores_equal_ungrouped(monkeypatch):
    """The checkpointed groups of chunks give the same values and gradients as one pass."""
    inputs = make(1, 100, 2, 4, 3, 0.05, grad=True)
    o1, _ = gla_chunked(*inputs[:4], chunk_size=8)
    g1 = torch.autograd.grad(o1.sum(), inputs[:4])
    monkeypatch.setattr(gla_ref, "map_chunk_groups",
                        functools.partial(common.map_chunk_groups, max_elements=600))
    o2, _ = gla_ref.gla_chunked(*inputs[:4], chunk_size=8)
    g2 = torch.autograd.grad(o2.sum(), inputs[:4])
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("dtype,limit", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_same_dtype_baseline_is_close_but_not_exact(dtype, limit):
    q, k, v, g, _ = make(1, 70, 2, 8, 8, dtype=torch.float32)
    low = [x.to(dtype) for x in (q, k, v, g)]
    o64, _ = gla_recurrent(*(x.double() for x in low))
    ob, _ = gla_chunked(*low, chunk_size=64, operand_dtype=dtype)
    assert ob.dtype == dtype
    err = rel(ob.double(), o64)
    assert 0 < err < limit
