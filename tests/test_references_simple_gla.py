"""The simple GLA and linear attention references agree with each other, are differentiable, stay
finite under strong decay, and simple GLA without a gate is linear attention."""
import functools

import pytest
import torch
import torch.nn.functional as F

from references.linear_attn import linear_attn_chunked, linear_attn_recurrent
from references.simple_gla import simple_gla_chunked, simple_gla_recurrent


def make(B, T, H, K, V, normaliser=1.0, seed=0, dtype=torch.float64, grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g, dtype=dtype)
    gate = F.logsigmoid(torch.randn(B, T, H, generator=g, dtype=dtype)) / normaliser
    h0 = torch.randn(B, H, K, V, generator=g, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v, gate, h0)]


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("T,chunk", [(1, 16), (15, 16), (16, 16), (17, 16), (70, 16), (40, 8)])
@pytest.mark.parametrize("normaliser", [1.0, 0.05, 16.0, None])
def test_chunked_equals_loop_forward(T, chunk, normaliser):
    q, k, v, g, h0 = make(2, T, 2, 6, 5, normaliser or 1.0)
    g = None if normaliser is None else g
    o1, s1 = simple_gla_recurrent(q, k, v, g, initial_state=h0, output_final_state=True)
    o2, s2 = simple_gla_chunked(q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=chunk)
    assert rel(o2, o1) < 1e-12
    assert rel(s2, s1) < 1e-12


@pytest.mark.parametrize("normaliser", [1.0, 0.05, None])
def test_chunked_equals_loop_gradients(normaliser):
    inputs = make(2, 37, 2, 5, 7, normaliser or 1.0, grad=True)
    if normaliser is None:
        inputs[3] = None
    leaves = [x for x in inputs if x is not None]
    do = torch.randn(2, 37, 2, 7, dtype=torch.float64)
    dht = torch.randn(2, 2, 5, 7, dtype=torch.float64)
    grads = []
    for fn in (simple_gla_recurrent, functools.partial(simple_gla_chunked, chunk_size=8)):
        o, ht = fn(*inputs[:4], scale=0.3, initial_state=inputs[4], output_final_state=True)
        grads.append(torch.autograd.grad([o, ht], leaves, [do, dht]))
    for a, b in zip(*grads):
        assert rel(b, a) < 1e-11


def test_final_state_only_when_asked():
    q, k, v, g, _ = make(1, 5, 1, 4, 4)
    assert simple_gla_recurrent(q, k, v, g)[1] is None
    assert simple_gla_chunked(q, k, v, g)[1] is None
    assert linear_attn_recurrent(q, k, v)[1] is None
    assert linear_attn_chunked(q, k, v)[1] is None


@pytest.mark.parametrize("fn", [simple_gla_recurrent, functools.partial(simple_gla_chunked, chunk_size=4)])
def test_gradcheck(fn):
    inputs = make(1, 6, 2, 3, 2, grad=True)

    def f(*xs):
        return fn(*xs[:4], initial_state=xs[4], output_final_state=True)
    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize("fn", [linear_attn_recurrent, functools.partial(linear_attn_chunked, chunk_size=4)])
def test_gradcheck_linear_attn(fn):
    q, k, v, _, h0 = make(1, 6, 2, 3, 2, grad=True)

    def f(*xs):
        return fn(*xs[:3], initial_state=xs[3], output_final_state=True)
    assert torch.autograd.gradcheck(f, (q, k, v, h0))


def test_chunked_is_stable_under_strong_decay():
    q, k, v, g, h0 = make(1, 300, 1, 8, 8, normaliser=0.05, grad=True)
    o, ht = simple_gla_chunked(q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=64)
    (o.sum() + ht.sum()).backward()
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v, g, h0))
    assert g.min() < -30  # the decay really is strong: cumulative gates reach thousands
    o1, _ = simple_gla_recurrent(q, k, v, g, initial_state=h0)
    assert rel(o, o1) < 1e-12


def test_without_gate_is_linear_attention():
    q, k, v, _, h0 = make(2, 21, 2, 4, 3, grad=True)
    for a, b in ((simple_gla_recurrent, linear_attn_recurrent), (simple_gla_chunked, linear_attn_chunked)):
        o1, s1 = a(q, k, v, None, scale=0.7, initial_state=h0, output_final_state=True)
        o2, s2 = b(q, k, v, scale=0.7, initial_state=h0, output_final_state=True)
        assert torch.equal(o1, o2) and torch.equal(s1, s2)
    # and a zero gate is no gate
    zero = torch.zeros(2, 21, 2, dtype=torch.float64)
    o3, _ = simple_gla_recurrent(q, k, v, zero, scale=0.7, initial_state=h0)
    assert rel(o3, o1) < 1e-14


def test_operand_rounding_is_the_same_dtype_baseline():
    """operand_dtype=bf16 on float32 inputs: close to float64 (bf16-sized error), not equal to it;
    operand_dtype=None on float32 inputs: float32-sized error."""
    q, k, v, g, h0 = make(1, 70, 2, 16, 16, dtype=torch.float32)
    o64, _ = simple_gla_recurrent(*(x.double() for x in (q, k, v, g)), initial_state=h0.double())
    o32, _ = simple_gla_chunked(q, k, v, g, initial_state=h0, chunk_size=64)
    obf, _ = simple_gla_chunked(q, k, v, g, initial_state=h0, chunk_size=64, operand_dtype=torch.bfloat16)
    assert o32.dtype == obf.dtype == torch.float32
    assert rel(o32.double(), o64) < 1e-5
    assert 1e-4 < rel(obf.double(), o64) < 2e-2
