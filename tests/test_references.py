"""Every op's float64 references, taken from its declaration: the chunked form equals the loop
(outputs, final states, gradients), both are differentiable, the chunked form stays finite under
strong decay, computes in groups of chunks without a change, and rounds operands like a kernel in
that dtype; then what one op's references alone promise.

Inputs are drawn in the declaration's order (inputs, then initial states) from a generator seeded
with the test's seed, each of its kind (`harness.inputs.of_kind`): a log gate is
logsigmoid(randn) / normaliser (0.05: strong decay, 16: weak), a delta rule's beta sigmoid(randn /
normaliser).
A test id names the op, then the normaliser (n0.05) or no_gate: an op without a gate, or one whose
optional gate is passed as None.
"""
import functools

import pytest
import torch

import references.common as common
from harness.declaration import load_function
from harness.inputs import of_kind
from harness.registry import OPS
from references.gla import gla_recurrent
from references.linear_attn import linear_attn_chunked, linear_attn_recurrent
from references.simple_gla import simple_gla_chunked, simple_gla_recurrent

GATED = [op for op, spec in OPS.items() if spec.gates()]
GROUPED = ["gla", "rwkv6", "gsa"]   # the chunked forms that compute their scores in groups of chunks


class Drawn:
    """One op's inputs (in call order) and initial states; M shapes only the ops that use it."""

    def __init__(self, op, B, T, H, K, V, M=0, normaliser=1.0, seed=0, dtype=torch.float64, grad=False):
        self.spec = OPS[op]
        self.dims = dict(B=B, T=T, H=H, K=K, V=V, M=M)
        gen = torch.Generator().manual_seed(seed)

        def draw(symbols):
            return torch.randn([self.dims[s] for s in symbols], generator=gen, dtype=dtype)

        self.inputs = [of_kind(draw(s.shape), s.kind, normaliser or 1.0) for s in self.spec.inputs]
        self.states = [draw(s.shape) for s in self.spec.states]
        for x in self.inputs + self.states:
            x.requires_grad_(grad)
        if normaliser is None:   # the gate is drawn all the same: the other tensors keep their numbers
            self.inputs = [None if s.optional else x for s, x in zip(self.spec.inputs, self.inputs)]

    @property
    def gate(self):
        return self.inputs[[s.name for s in self.spec.inputs].index(self.spec.gates()[0])]

    @property
    def leaves(self) -> list:
        return [x for x in self.inputs + self.states if x is not None]

    @property
    def leaf_names(self) -> list:
        return ([s.name for s, x in zip(self.spec.inputs, self.inputs) if x is not None]
                + [s.name + "0" for s in self.spec.states])

    def upstream(self, seed=1) -> list:
        """Seeded float64 upstream gradients of o and of each final state."""
        gen = torch.Generator().manual_seed(seed)
        shapes = [("B", "T", "H", "V")] + [s.shape for s in self.spec.states]
        return [torch.randn([self.dims[d] for d in shape], generator=gen, dtype=torch.float64) for shape in shapes]


def references(op, **chunked_kw):
    """The op's (loop, chunked form with `chunked_kw`)."""
    spec = OPS[op]
    return (load_function(spec.reference_loop),
            functools.partial(load_function(spec.reference_chunked), **chunked_kw))


def call(fn, inputs, states=None, **kw):
    """fn on the inputs with `states` as its initial state: (o, the final states as a list, or None)."""
    initial = None if states is None else (states[0] if len(states) == 1 else tuple(states))
    o, final = fn(*inputs, initial_state=initial, **kw)
    return o, (None if final is None else [final] if isinstance(final, torch.Tensor) else list(final))


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def gate_params(ops, normalisers, points=((),), point_id=lambda point: []):
    """params (op, *point, normaliser) for each op and point: an op with a gate takes each of
    `normalisers`; an op without one, or whose gate is optional, also runs without (None)."""
    params = []
    for op in ops:
        spec = OPS[op]
        gated = list(normalisers) if spec.gates() else []
        no_gate = [None] if not spec.gates() or any(s.optional for s in spec.inputs) else []
        for n in gated + no_gate:
            for point in points:
                ids = [op, *point_id(point), "no_gate" if n is None else f"n{n}"]
                params.append(pytest.param(op, *point, n, id="-".join(ids)))
    return params


@pytest.mark.parametrize("op,T,chunk,normaliser", gate_params(
    OPS, [1.0, 0.05, 16.0], [(1, 16), (15, 16), (16, 16), (17, 16), (70, 16), (40, 8)],
    lambda point: [f"T{point[0]}", f"C{point[1]}"]))
def test_chunked_equals_loop_forward(op, T, chunk, normaliser):
    x = Drawn(op, 2, T, 2, 6, 5, M=4, normaliser=normaliser)
    loop, chunked = references(op, chunk_size=chunk)
    o1, s1 = call(loop, x.inputs, x.states, output_final_state=True)
    o2, s2 = call(chunked, x.inputs, x.states, output_final_state=True)
    assert rel(o2, o1) < 1e-12
    for name, a, b in zip(x.spec.final_state_names(), s1, s2):
        assert rel(b, a) < 1e-12, name


@pytest.mark.parametrize("op,normaliser", gate_params(OPS, [1.0, 0.05]))
def test_chunked_equals_loop_gradients(op, normaliser):
    x = Drawn(op, 2, 37, 2, 5, 7, M=3, normaliser=normaliser, grad=True)
    upstream = x.upstream()
    grads = []
    for fn in references(op, chunk_size=8):
        o, finals = call(fn, x.inputs, x.states, scale=0.3, output_final_state=True)
        grads.append(torch.autograd.grad([o, *finals], x.leaves, upstream))
    for name, a, b in zip(x.leaf_names, *grads):
        assert rel(b, a) < 1e-11, name


@pytest.mark.parametrize("op", OPS)
def test_final_state_only_when_asked_and_without_initial_state(op):
    x = Drawn(op, 1, 5, 1, 4, 4, M=4)
    loop, chunked = references(op, chunk_size=4)
    assert loop(*x.inputs)[1] is None
    assert load_function(x.spec.reference_chunked)(*x.inputs)[1] is None
    o1, s1 = call(loop, x.inputs, output_final_state=True)
    o2, s2 = call(chunked, x.inputs, output_final_state=True)
    assert rel(o2, o1) < 1e-12
    for name, a, b in zip(x.spec.final_state_names(), s1, s2):
        assert rel(b, a) < 1e-12, name


@pytest.mark.parametrize("op,form", [pytest.param(op, form, id=f"{op}-{form}") for op in OPS
                                     for form in ("loop", "chunked")])
def test_gradcheck(op, form):
    x = Drawn(op, 1, 6, 2, 3, 2, M=3, grad=True)
    fn = dict(zip(("loop", "chunked"), references(op, chunk_size=4)))[form]
    n = len(x.inputs)

    def f(*leaves):
        o, finals = call(fn, leaves[:n], leaves[n:], output_final_state=True)
        return (o, *finals)
    assert torch.autograd.gradcheck(f, x.leaves)


@pytest.mark.parametrize("op", GATED)
def test_chunked_is_stable_under_strong_decay(op):
    x = Drawn(op, 1, 300, 1, 8, 8, M=16, normaliser=0.05, grad=True)
    loop, chunked = references(op, chunk_size=64)
    o, finals = call(chunked, x.inputs, x.states, output_final_state=True)
    (o.sum() + sum(s.sum() for s in finals)).backward()
    assert all(torch.isfinite(t).all() for t in [o, *finals])
    assert all(torch.isfinite(t.grad).all() for t in x.leaves)
    assert x.gate.min() < -30  # the decay really is strong: cumulative gates reach thousands
    o1, _ = call(loop, x.inputs, x.states)
    assert rel(o, o1) < 1e-12


@pytest.mark.parametrize("op", GATED)
def test_chunked_float32_stays_finite_under_extreme_decay(op):
    """Every gate -60: a 64-token chunk sums to -3840, far past exp's float32 range."""
    x = Drawn(op, 1, 200, 1, 8, 8, M=16, dtype=torch.float32, grad=True)
    x.inputs = [torch.full_like(t, -60.0).requires_grad_() if s.kind == "gate" else t
                for s, t in zip(x.spec.inputs, x.inputs)]
    o, finals = call(references(op, chunk_size=64)[1], x.inputs, x.states, output_final_state=True)
    (o.sum() + sum(s.sum() for s in finals)).backward()
    assert all(torch.isfinite(t).all() for t in [o, *finals])
    assert all(torch.isfinite(t.grad).all() for t in x.leaves)


@pytest.mark.parametrize("op", GROUPED)
def test_grouped_scores_equal_ungrouped(op, monkeypatch):
    """The checkpointed groups of chunks give the same values and gradients as one pass."""
    x = Drawn(op, 1, 100, 2, 4, 3, M=5, normaliser=0.05, grad=True)
    chunked = references(op, chunk_size=8)[1]
    o1, _ = chunked(*x.inputs)
    g1 = torch.autograd.grad(o1.sum(), x.inputs)
    checkpoint, groups = torch.utils.checkpoint.checkpoint, []

    def counted_checkpoint(*args, **kw):
        groups.append(args)
        return checkpoint(*args, **kw)
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counted_checkpoint)
    monkeypatch.setitem(common.map_chunk_groups.__kwdefaults__, "max_elements", 600)
    o2, _ = chunked(*x.inputs)
    g2 = torch.autograd.grad(o2.sum(), x.inputs)
    assert groups, "the chunked form computed no group of chunks"
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("op,dtype,limit", [
    pytest.param(op, dtype, limit, id=f"{op}-{str(dtype)[6:]}") for op in OPS
    for dtype, limit in [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)]])
def test_same_dtype_baseline_is_close_but_not_exact(op, dtype, limit):
    """Inputs in `dtype`, operands rounded to it: close to float64 on the same inputs, not equal."""
    x = Drawn(op, 1, 70, 2, 8, 8, M=16, dtype=torch.float32)
    low = [t.to(dtype) for t in x.inputs]
    loop, baseline = references(op, chunk_size=64, operand_dtype=dtype)
    o64, _ = loop(*(t.double() for t in low))
    ob, _ = baseline(*low)
    assert ob.dtype == dtype
    assert 0 < rel(ob.double(), o64) < limit


@pytest.mark.parametrize("op", OPS)
def test_operand_rounding_is_the_same_dtype_baseline(op):
    """operand_dtype=bf16 on float32 inputs: close to float64 (bf16-sized error), not equal to it;
    operand_dtype=None on float32 inputs: float32-sized error."""
    x = Drawn(op, 1, 70, 2, 16, 16, M=16, dtype=torch.float32)
    loop, chunked = references(op, chunk_size=64)
    o64, _ = call(loop, [t.double() for t in x.inputs], [s.double() for s in x.states])
    o32, _ = call(chunked, x.inputs, x.states)
    obf, _ = call(chunked, x.inputs, x.states, operand_dtype=torch.bfloat16)
    assert o32.dtype == obf.dtype == torch.float32
    assert rel(o32.double(), o64) < 1e-5
    assert 1e-4 < rel(obf.double(), o64) < 2e-2


def test_gla_loop_is_the_definition():
    """Two steps by hand: S_1 = diag(exp(g_1)) S_0 + k_1^T v_1, o_t = scale q_t S_t."""
    x = Drawn("gla", 1, 2, 1, 3, 2)
    (q, k, v, g), (h0,) = x.inputs, x.states
    o, ht = gla_recurrent(q, k, v, g, scale=0.5, initial_state=h0, output_final_state=True)
    S = h0[0, 0]
    for t in range(2):
        S = torch.exp(g[0, t, 0])[:, None] * S + torch.outer(k[0, t, 0], v[0, t, 0])
        assert torch.allclose(o[0, t, 0], 0.5 * q[0, t, 0] @ S, rtol=1e-14, atol=0)
    assert torch.allclose(ht[0, 0], S, rtol=1e-14, atol=0)


def test_simple_gla_without_gate_is_linear_attention():
    x = Drawn("simple_gla", 2, 21, 2, 4, 3, grad=True)
    (q, k, v, _), (h0,) = x.inputs, x.states
    for a, b in ((simple_gla_recurrent, linear_attn_recurrent), (simple_gla_chunked, linear_attn_chunked)):
        o1, s1 = a(q, k, v, None, scale=0.7, initial_state=h0, output_final_state=True)
        o2, s2 = b(q, k, v, scale=0.7, initial_state=h0, output_final_state=True)
        assert torch.equal(o1, o2) and torch.equal(s1, s2)
    # and a zero gate is no gate
    zero = torch.zeros(2, 21, 2, dtype=torch.float64)
    o3, _ = simple_gla_recurrent(q, k, v, zero, scale=0.7, initial_state=h0)
    assert rel(o3, o1) < 1e-14
