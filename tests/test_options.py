"""The options beside each op's core: linear attention's normalize, simple GLA's g_gamma (a constant
per-head decay) and gated slot attention's g = None (the ungated form).

References: each option's loop and chunked form against a direct float64 definition written here
(closed forms over time, not loops), and gradcheck on tiny shapes. Kernels: each option against the
float64 loop on the same numbers, fp32 and bf16, the initial state requiring grad and the final state
in the loss (tests/kernel_testing.py's bounds). The layer with normalize. Each comparison is also run
on a planted wrong implementation, which must fail it.
"""
import functools

import pytest
import torch
import torch.nn.functional as F

import fla_kernels as fk
from fla_kernels.layers import LinearAttention
from fla_kernels.ops.gsa.gate import additive_gate
from fla_kernels.ops.linear_attn.normalize import NormalizeFunction
from harness.registry import get_op
from references.gsa import gsa_chunked, gsa_recurrent
from references.linear_attn import linear_attn_chunked, linear_attn_recurrent
from references.simple_gla import simple_gla_chunked, simple_gla_recurrent
from tests.kernel_testing import (DEVICE, REL_TOL, assert_close, assert_matches_reference,
                                  emulated, make_inputs, run)

FP32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64
SIMPLE_GLA, GSA = get_op("simple_gla"), get_op("gsa")


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def forward_backward(fn, inputs, state, seed=1, rounded=None, **kw):
    """[o, *final states, *gradients of the inputs and states that require grad] of
    fn(*inputs, initial_state=state, output_final_state=True, **kw) with seeded upstream
    gradients, rounded to the dtypes `rounded` (one per output) first where given, so that a
    kernel and the float64 loop share them."""
    o, finals = fn(*inputs, initial_state=state, output_final_state=True, **kw)
    outputs = [o, *(finals if isinstance(finals, tuple) else (finals,))]
    gen = torch.Generator().manual_seed(seed)
    upstream = [torch.randn(x.shape, generator=gen, dtype=F64) for x in outputs]
    upstream = [u if r is None else u.to(r) for u, r in zip(upstream, rounded or [None] * len(outputs))]
    states = state if isinstance(state, tuple) else (state,)
    leaves = [x for x in (*inputs, *states) if x is not None and x.requires_grad]
    grads = torch.autograd.grad(outputs, leaves, [u.to(x) for u, x in zip(upstream, outputs)])
    return [x.detach() for x in outputs] + list(grads)


def assert_all_close(got, want, tol, names=None):
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        name = names[i] if names else f"tensor {i}"
        assert rel(a.double(), b.double()) < tol, name


def leaves(*shapes, seed=0, positive=(), dtype=F64):
    """Seeded float64 leaves requiring grad; those numbered in `positive` drawn in (0.1, 1.1)."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.rand(s, generator=gen, dtype=dtype) + 0.1 if i in positive
             else torch.randn(s, generator=gen, dtype=dtype)).requires_grad_()
            for i, s in enumerate(shapes)]


# ----------------------------------------------------------------------------- normalize

def normalized_definition(q, k, v, scale=None, initial_state=None, output_final_state=True,
                          exclusive=False):
    """o_t = scale q_t S_t / (scale q_t . z_t + 1e-10) in closed form: S_t = S_0 + sum_{s <= t}
    k_s^T v_s, z_t = z_0 + sum_{s <= t} k_s. exclusive (planted): z_t without k_t."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    h0, z0 = initial_state
    S = h0[:, None] + torch.cumsum(torch.einsum("bthk,bthv->bthkv", k, v), dim=1)
    z = z0 + torch.cumsum(k, dim=1) - (k if exclusive else 0)
    o = scale * torch.einsum("bthk,bthkv->bthv", q, S) / (scale * (q * z).sum(-1, keepdim=True) + 1e-10)
    return o, (S[:, -1], z[:, -1:])


def normalized_inputs(B=2, T=9, H=2, K=3, V=4, seed=0):
    """(q, k, v) with positive q, k (the denominator stays off zero) and the state (S0, z0 > 0)."""
    q, k, v, h0, z0 = leaves((B, T, H, K), (B, T, H, K), (B, T, H, V), (B, H, K, V), (B, 1, H, K),
                             seed=seed, positive=(0, 1, 4))
    return [q, k, v], (h0, z0)


@pytest.mark.parametrize("form", [
    functools.partial(linear_attn_recurrent, normalize=True),
    functools.partial(linear_attn_chunked, normalize=True, chunk_size=4),
    pytest.param(functools.partial(normalized_definition, exclusive=True), marks=pytest.mark.xfail(
        raises=AssertionError, strict=True, reason="planted: the key sum without k_t")),
], ids=["loop", "chunked", "planted"])
def test_normalized_references_are_the_definition(form):
    """Outputs, both final states and every gradient (z0's included) equal the closed form's."""
    inputs, state = normalized_inputs()
    want = forward_backward(normalized_definition, inputs, state, scale=0.6)
    assert_all_close(forward_backward(form, inputs, state, scale=0.6), want, 1e-12,
                     ["o", "S", "z", "dq", "dk", "dv", "dS0", "dz0"])


def test_normalized_references_take_a_state_alone_or_none():
    """S alone as the initial state means z0 = 0; no state, zeros for both; o and the state in
    the inputs' dtype; no final state unless asked."""
    (q, k, v), (h0, z0) = normalized_inputs(B=1, T=6)
    zero = torch.zeros_like(z0)
    for fn in (linear_attn_recurrent, functools.partial(linear_attn_chunked, chunk_size=4)):
        o1, (s1, z1) = fn(q, k, v, initial_state=h0, output_final_state=True, normalize=True)
        o2, (s2, z2) = normalized_definition(q, k, v, initial_state=(h0, zero))
        assert rel(o1, o2) < 1e-12 and rel(s1, s2) < 1e-12 and rel(z1, z2) < 1e-12
        o3, none = fn(q, k, v, normalize=True)
        assert none is None
        o4, _ = normalized_definition(q, k, v, initial_state=(torch.zeros_like(h0), zero))
        assert rel(o3, o4) < 1e-12


@pytest.mark.parametrize("form", ["loop", "chunked"])
def test_normalized_references_gradcheck(form):
    fn = linear_attn_recurrent if form == "loop" else functools.partial(linear_attn_chunked, chunk_size=2)
    inputs, state = normalized_inputs(B=1, T=5, H=1, K=2, V=2)

    def f(q, k, v, h0, z0):
        o, (S, z) = fn(q, k, v, initial_state=(h0, z0), output_final_state=True, normalize=True)
        return o, S, z
    assert torch.autograd.gradcheck(f, [*inputs, *state])


def normalized_kernel_run(fn, dtype, B=1, T=70, H=2, K=16, V=24):
    """Every tensor of a normalised call of fn (its inputs rounded to dtype, states float32) and
    of the float64 loop on the same numbers: (got, want) dicts."""
    inputs, state = normalized_inputs(B, T, H, K, V, seed=3)
    low = [x.detach().to(DEVICE, dtype).requires_grad_() for x in inputs]
    low_state = tuple(s.detach().to(DEVICE, FP32).requires_grad_() for s in state)
    exact = [x.detach().double().requires_grad_() for x in low]
    exact_state = tuple(s.detach().double().requires_grad_() for s in low_state)
    names = ["o", "ht", "zt", "dq", "dk", "dv", "dh0", "dz0"]
    rounded = [dtype, FP32, FP32]
    got = forward_backward(fn, low, low_state, rounded=rounded, normalize=True)
    want = forward_backward(linear_attn_recurrent, exact, exact_state, rounded=rounded, normalize=True)
    return dict(zip(names, got, strict=True)), dict(zip(names, want, strict=True))


def normalized_without_dk(q, k, v, scale=None, initial_state=None, output_final_state=False,
                          normalize=True):
    """Planted: the denominator's gradient never reaches k."""
    h0, z0 = initial_state
    o, ht = fk.chunk_linear_attn(q, k, v, q.shape[-1] ** -0.5, h0, True)
    o, zt = NormalizeFunction.apply(o, q, k.detach(), z0, q.shape[-1] ** -0.5)
    return o, (ht, zt)


@pytest.mark.parametrize("fn,dtype", [
    *[pytest.param(fn, dtype, id=f"{fn.__name__}-{str(dtype)[6:]}")
      for fn in (fk.chunk_linear_attn, fk.fused_chunk_linear_attn, fk.fused_recurrent_linear_attn)
      for dtype in (FP32, BF16)],
    pytest.param(normalized_without_dk, FP32, id="planted-no_dk", marks=pytest.mark.xfail(
        raises=AssertionError, strict=True, reason="planted: dk misses the denominator")),
])
def test_normalized_kernels_match_the_reference(fn, dtype):
    got, want = normalized_kernel_run(fn, dtype)
    for name in want:
        expected = dtype if name in ("o", "dq", "dk", "dv") else FP32
        assert got[name].dtype == expected, f"{name}: {got[name].dtype}, expected {expected}"
        assert_close(name, got[name], want[name], REL_TOL[dtype], dtype)


@pytest.mark.parametrize("variant", ["chunk", "fused_chunk"])
def test_normalized_dv_sums_keep_the_state_gradient(variant):
    """bf16 with the tensor cores' operand rounding (the H100's failing case): dv_j = k_j dh_c +
    ..., and with positive keys one 16-bit rounding of dh_c, shared by every row of the chunk,
    adds up in dv's sums over tokens (5.3 against a bound of 4.2 on the H100). With dh kept to
    about 21 bits the sums' errors are the rounding floor's and a little more."""
    rows = emulated("case", "linear_attn", variant, "bf16", "2", "65", "2", "64", "64", "strong",
                    "none", "normalize", "none")
    verdict, err, bound, floor = rows["aggregate: dv (sum over b, t, h)"]
    assert verdict == "PASS" and err <= 1.25 * floor, rows["aggregate: dv (sum over b, t, h)"]
    assert rows["aggregate: dv (sum over t)"][0] == "PASS"


def test_normalized_kernels_check_the_state_pair():
    inputs, state = normalized_inputs(B=1, T=4, H=1, K=4, V=4)
    (q, k, v), (h0, z0) = ([x.detach().to(DEVICE, FP32) for x in xs] for xs in (inputs, state))
    with pytest.raises(ValueError, match=r"^chunk_linear_attn: initial_state z has shape \(1, 1, 4, 1\); "
                                         r"expected \(1, 1, 1, 4\) \[B, 1, H, K\]\.$"):
        fk.chunk_linear_attn(q, k, v, initial_state=(h0, z0.transpose(-1, -2)), normalize=True)
    with pytest.raises(ValueError, match=r"^fused_recurrent_linear_attn: initial_state must be a torch"):
        fk.fused_recurrent_linear_attn(q, k, v, initial_state=(h0, z0))


# ----------------------------------------------------------------------------- g_gamma

def constant_decay_definition(q, k, v, g_gamma, scale=None, initial_state=None,
                              output_final_state=True):
    """S_t = exp(t g) S_0 + sum_{s <= t} exp((t - s) g) k_s^T v_s (t from 1), g = g_gamma[h], in
    closed form; o_t = scale q_t S_t."""
    T = q.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    t = torch.arange(1, T + 1, dtype=q.dtype)
    lower = (t[:, None] >= t[None, :]).to(q.dtype)
    decay = torch.exp(((t[:, None] - t[None, :]) * lower)[:, :, None] * g_gamma) * lower[:, :, None]
    S = (torch.einsum("tsh,bshk,bshv->bthkv", decay, k, v)
         + torch.exp(t[:, None] * g_gamma)[None, :, :, None, None] * initial_state[:, None])
    return scale * torch.einsum("bthk,bthkv->bthv", q, S), S[:, -1]


def gamma_inputs(B=2, T=9, H=2, K=3, V=4, seed=0):
    q, k, v, h0, raw = leaves((B, T, H, K), (B, T, H, K), (B, T, H, V), (B, H, K, V), (H,), seed=seed)
    g_gamma = (-F.softplus(raw.detach()) - 0.1).requires_grad_()   # distinct heads, < 0
    return [q, k, v, g_gamma], h0


CONSTANT_DECAY_FORMS = {
    "loop": lambda q, k, v, g_gamma, **kw: simple_gla_recurrent(q, k, v, g_gamma=g_gamma, **kw),
    "chunked": lambda q, k, v, g_gamma, **kw: simple_gla_chunked(q, k, v, g_gamma=g_gamma,
                                                                 chunk_size=4, **kw),
    "planted": lambda q, k, v, g_gamma, **kw: simple_gla_recurrent(q, k, v, g_gamma=g_gamma.flip(0),
                                                                   **kw),
}


@pytest.mark.parametrize("form", [
    "loop", "chunked",
    pytest.param("planted", marks=pytest.mark.xfail(
        raises=AssertionError, strict=True, reason="planted: each head reads another head's decay")),
])
def test_constant_decay_references_are_the_definition(form):
    inputs, h0 = gamma_inputs()
    want = forward_backward(constant_decay_definition, inputs, h0, scale=0.6)
    assert_all_close(forward_backward(CONSTANT_DECAY_FORMS[form], inputs, h0, scale=0.6), want,
                     1e-12, ["o", "S", "dq", "dk", "dv", "dg_gamma", "dS0"])


@pytest.mark.parametrize("form", ["loop", "chunked"])
def test_constant_decay_references_gradcheck(form):
    fn = simple_gla_recurrent if form == "loop" else functools.partial(simple_gla_chunked, chunk_size=2)
    (q, k, v, g_gamma), h0 = gamma_inputs(B=1, T=5, H=2, K=2, V=2)

    def f(q, k, v, g_gamma, h0):
        return fn(q, k, v, g_gamma=g_gamma, initial_state=h0, output_final_state=True)
    assert torch.autograd.gradcheck(f, [q, k, v, g_gamma, h0])


@pytest.mark.parametrize("fn", [fk.chunk_simple_gla, fk.fused_recurrent_simple_gla, simple_gla_recurrent],
                         ids=lambda fn: fn.__name__)
def test_g_and_g_gamma_together_are_refused(fn):
    (q, k, v, g_gamma), _ = gamma_inputs(B=1, T=4, H=2, K=4, V=4)
    g = torch.zeros(1, 4, 2, dtype=q.dtype)
    with pytest.raises(ValueError, match="g or g_gamma, not both"):
        fn(*(x.detach().to(DEVICE, FP32) for x in (q, k, v, g, g_gamma)))


def with_gamma(fn, gamma):
    """fn with g_gamma = gamma (cast to the call's dtype of q for the float64 loop)."""
    def call(q, k, v, g, **kw):
        return fn(q, k, v, g, gamma.to(torch.float64 if q.dtype == F64 else gamma.dtype), **kw)
    return call


@pytest.mark.parametrize("fn,dtype,planted", [
    *[pytest.param(fn, dtype, False, id=f"{fn.__name__}-{str(dtype)[6:]}")
      for fn in (fk.chunk_simple_gla, fk.fused_recurrent_simple_gla) for dtype in (FP32, BF16)],
    pytest.param(fk.chunk_simple_gla, FP32, True, id="planted-heads_swapped", marks=pytest.mark.xfail(
        raises=AssertionError, strict=True, reason="planted: each head reads another head's decay")),
])
def test_constant_decay_kernels_match_the_reference(fn, dtype, planted):
    """g_gamma float32 (a gate) beside q, k, v in dtype; its gradient is None, as the g it stands
    for is passed as None."""
    x = make_inputs(SIMPLE_GLA, 1, 70, 2, 16, 24, dtype, "normal", True, seed=2, none=("g",))
    gamma = torch.tensor([-0.05, -0.7], device=DEVICE)
    got = run(with_gamma(fn, gamma.flip(0) if planted else gamma), x)
    want = run(with_gamma(simple_gla_recurrent, gamma), x, dtype=F64, unused_as_zero=True)
    assert_matches_reference(SIMPLE_GLA, got, want, dtype)


def test_g_gamma_takes_no_gradient():
    q, k, v = (torch.randn(1, 5, 2, 8, device=DEVICE, requires_grad=True) for _ in range(3))
    g_gamma = torch.full((2,), -0.3, device=DEVICE, requires_grad=True)
    for fn in (fk.chunk_simple_gla, fk.fused_recurrent_simple_gla):
        o, _ = fn(q, k, v, g_gamma=g_gamma)
        o.sum().backward()
        assert g_gamma.grad is None and q.grad is not None


# ----------------------------------------------------------------------------- gsa, g = None

def ungated_definition(q, k, v, s, g=None, scale=None, initial_state=None, output_final_state=True,
                       normalised=True):
    """The gated loop on s'_t = exp(s_t) / sum_{u <= t} exp(s_u) and
    g_t = log(sum_{u < t} exp(s_u) / sum_{u <= t} exp(s_u)) (0 at t = 0), written out.
    normalised=False (planted): s itself is written, with that g."""
    e = torch.cumsum(torch.exp(s), dim=1)
    g = torch.log(torch.cat([e[:, :1], e[:, :-1]], dim=1) / e)
    return gsa_recurrent(q, k, v, torch.exp(s) / e if normalised else s, g, scale, initial_state,
                         output_final_state)


def gsa_inputs(B=2, T=9, H=2, K=3, V=4, M=3, seed=0):
    q, k, v, s, hk0, hv0 = leaves((B, T, H, K), (B, T, H, K), (B, T, H, V), (B, T, H, M),
                                  (B, H, K, M), (B, H, M, V), seed=seed)
    return [q, k, v, s, None], (hk0, hv0)


@pytest.mark.parametrize("form", [
    gsa_recurrent,
    functools.partial(gsa_chunked, chunk_size=4),
    pytest.param(functools.partial(ungated_definition, normalised=False), marks=pytest.mark.xfail(
        raises=AssertionError, strict=True, reason="planted: s written without its normalisation")),
], ids=["loop", "chunked", "planted"])
def test_ungated_references_are_the_definition(form):
    inputs, state = gsa_inputs()
    want = forward_backward(ungated_definition, inputs, state, scale=0.6)
    assert_all_close(forward_backward(form, inputs, state, scale=0.6), want, 1e-12,
                     ["o", "hk", "hv", "dq", "dk", "dv", "ds", "dhk0", "dhv0"])


@pytest.mark.parametrize("form", ["loop", "chunked"])
def test_ungated_references_gradcheck(form):
    fn = gsa_recurrent if form == "loop" else functools.partial(gsa_chunked, chunk_size=2)
    (q, k, v, s, _), (hk0, hv0) = gsa_inputs(B=1, T=5, H=1, K=2, V=2, M=2)

    def f(q, k, v, s, hk0, hv0):
        o, (hk, hv) = fn(q, k, v, s, None, initial_state=(hk0, hv0), output_final_state=True)
        return o, hk, hv
    assert torch.autograd.gradcheck(f, [q, k, v, s, hk0, hv0])


def test_the_kernels_gate_is_the_references():
    """`additive_gate` (float32, g as -softplus) against the float64 definition: s' and g, and
    their gradients to s."""
    s64 = torch.randn(2, 50, 3, 4, dtype=F64) * 3
    s32 = s64.float().requires_grad_()
    s64.requires_grad_()
    e = torch.cumsum(torch.exp(s64), dim=1)
    want = (torch.exp(s64) / e, torch.log(torch.cat([e[:, :1], e[:, :-1]], dim=1) / e))
    got = additive_gate(s32)
    assert got[0].dtype == got[1].dtype == FP32
    gen = torch.Generator().manual_seed(0)
    up = [torch.randn(x.shape, generator=gen, dtype=F64) for x in want]
    for name, a, b in zip(("s'", "g"), got, want):
        assert_close(name, a, b, 1e-6)
    ds = torch.autograd.grad(got, s32, [u.float() for u in up])[0]
    assert_close("ds", ds, torch.autograd.grad(want, s64, up)[0], 1e-5)


def written_unnormalised(q, k, v, s, g, **kw):
    """Planted: the kernel runs on s itself with the ungated form's gate."""
    return fk.chunk_gsa(q, k, v, s, additive_gate(s)[1], **kw)


@pytest.mark.parametrize("fn,dtype", [
    *[pytest.param(fn, dtype, id=f"{fn.__name__}-{str(dtype)[6:]}")
      for fn in (fk.chunk_gsa, fk.fused_recurrent_gsa) for dtype in (FP32, BF16)],
    pytest.param(written_unnormalised, FP32, id="planted-unnormalised", marks=pytest.mark.xfail(
        raises=AssertionError, strict=True, reason="planted: s written without its normalisation")),
])
def test_ungated_kernels_match_the_reference(fn, dtype):
    """g = None: s' in s's dtype and g float32 feed the gated kernels; ds through both."""
    x = make_inputs(GSA, 1, 66, 1, 16, 16, dtype, "normal", True, seed=4, M=8, none=("g",))
    got = run(fn, x)
    want = run(gsa_recurrent, x, dtype=F64, unused_as_zero=True)
    assert_matches_reference(GSA, got, want, dtype)


# ----------------------------------------------------------------------------- the layer

@pytest.mark.parametrize("mode", LinearAttention.MODES)
def test_normalized_layer(mode):
    """Positive inputs and projections (the denominator stays off zero): the output is
    o_proj(the normalised float64 reference on the layer's projections); the state is the pair
    (S, z) and two segments through the cache give one call."""
    torch.manual_seed(0)
    layer = LinearAttention(hidden_size=16, num_heads=2, mode=mode, normalize=True).to(DEVICE)
    with torch.no_grad():
        for proj in (layer.q_proj, layer.k_proj):
            proj.weight.abs_()
    x = torch.rand(2, 20, 16, device=DEVICE)
    y, _, cache = layer(x, use_cache=True)
    q, k, v = (t.double() for t in layer.kernel_inputs(x))
    o, (S, z) = linear_attn_recurrent(q, k, v, output_final_state=True, normalize=True)
    want = o.flatten(-2) @ layer.o_proj.weight.double().T
    assert_close("y", y, want, REL_TOL[FP32])
    S_t, z_t = cache[0]
    assert S_t.shape == (2, 2, 8, 8) and z_t.shape == (2, 1, 2, 8)
    assert_close("z", z_t, z, REL_TOL[FP32])
    assert [tuple(t.shape) for t in layer.init_state(2)] == [(2, 2, 8, 8), (2, 1, 2, 8)]
    first, _, cache = layer(x[:, :7], use_cache=True)
    second, _, _ = layer(x[:, 7:], use_cache=True, past_key_values=cache)
    assert_close("two segments", torch.cat([first, second], dim=1), y, REL_TOL[FP32])
