"""The RWKV6 references agree with each other, are differentiable, and stay finite under strong decay."""
import functools

import pytest
import torch
import torch.nn.functional as F

import references.common as common
import references.rwkv6 as rwkv6_ref
from references.rwkv6 import rwkv6_chunked, rwkv6_recurrent


def make(B, T, H, K, V, normaliser=1.0, seed=0, dtype=torch.float64, grad=False):
    g = torch.Generator().manual_seed(seed)
    r, k = (torch.randn(B, T, H, K, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g, dtype=dtype)
    w = F.logsigmoid(torch.randn(B, T, H, K, generator=g, dtype=dtype)) / normaliser
    u = torch.randn(H, K, generator=g, dtype=dtype)
    h0 = torch.randn(B, H, K, V, generator=g, dtype=dtype)
    tensors = [r, k, v, w, u, h0]
    return [t.requires_grad_(grad) for t in tensors]


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("T,chunk", [(1, 16), (15, 16), (16, 16), (17, 16), (70, 16), (40, 8)])
@pytest.mark.parametrize("normaliser", [1.0, 0.05, 16.0])
def test_chunked_equals_loop_forward(T, chunk, normaliser):
    r, k, v, w, u, h0 = make(2, T, 2, 6, 5, normaliser)
    o1, s1 = rwkv6_recurrent(r, k, v, w, u, initial_state=h0, output_final_state=True)
    o2, s2 = rwkv6_chunked(r, k, v, w, u, initial_state=h0, output_final_state=True, chunk_size=chunk)
    assert rel(o2, o1) < 1e-12
    assert rel(s2, s1) < 1e-12


@pytest.mark.parametrize("normaliser", [1.0, 0.05])
def test_chunked_equals_loop_gradients(normaliser):
    inputs = make(2, 37, 2, 5, 7, normaliser, grad=True)
    do = torch.randn(2, 37, 2, 7, dtype=torch.float64)
    dht = torch.randn(2, 2, 5, 7, dtype=torch.float64)
    grads = []
    for fn in (rwkv6_recurrent, functools.partial(rwkv6_chunked, chunk_size=8)):
        o, ht = fn(*inputs[:5], scale=0.3, initial_state=inputs[5], output_final_state=True)
        grads.append(torch.autograd.grad([o, ht], inputs, [do, dht]))
    for name, a, b in zip("r k v w u h0".split(), *grads):
        assert rel(b, a) < 1e-11, name


def test_final_state_only_when_asked():
    r, k, v, w, u, _ = make(1, 5, 1, 4, 4)
    assert rwkv6_recurrent(r, k, v, w, u)[1] is None
    assert rwkv6_chunked(r, k, v, w, u)[1] is None


@pytest.mark.parametrize("fn", [rwkv6_recurrent, functools.partial(rwkv6_chunked, chunk_size=4)])
def test_gradcheck(fn):
    inputs = make(1, 6, 2, 3, 2, grad=True)
    def f(*xs):
        return fn(*xs[:5], initial_state=xs[5], output_final_state=True)
    assert torch.autograd.gradcheck(f, inputs)


def test_chunked_is_stable_under_strong_decay():
    r, k, v, w, u, h0 = make(1, 300, 1, 8, 8, normaliser=0.05, grad=True)
    o, ht = rwkv6_chunked(r, k, v, w, u, initial_state=h0, output_final_state=True, chunk_size=64)
    (o.sum() + ht.sum()).backward()
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert all(torch.isfinite(x.grad).all() for x in (r, k, v, w, u, h0))
    assert w.min() < -30  # the decay really is strong: cumulative gates reach thousands


def test_grouped_scores_equal_ungrouped(monkeypatch):
    """The checkpointed groups of chunks give the same values and gradients as one pass."""
    inputs = make(1, 100, 2, 4, 3, 0.05, grad=True)
    o1, _ = rwkv6_chunked(*inputs[:5], chunk_size=8)
    g1 = torch.autograd.grad(o1.sum(), inputs[:5])
    monkeypatch.setattr(rwkv6_ref, "map_chunk_groups",
                        functools.partial(common.map_chunk_groups, max_elements=600))
    o2, _ = rwkv6_ref.rwkv6_chunked(*inputs[:5], chunk_size=8)
    g2 = torch.autograd.grad(o2.sum(), inputs[:5])
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("dtype,limit", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_same_dtype_baseline_is_close_but_not_exact(dtype, limit):
    r, k, v, w, u, h0 = make(1, 70, 2, 8, 8, dtype=torch.float32)
    low = [x.to(dtype) for x in (r, k, v, w, u)]
    o64, _ = rwkv6_recurrent(*(x.double() for x in low))
    ob, _ = rwkv6_chunked(*low, chunk_size=64, operand_dtype=dtype)
    assert ob.dtype == dtype
    err = rel(ob.double(), o64)
    assert 0 < err < limit
