"""chunk_rwkv6 against the float64 recurrent reference: outputs, final state, every gradient.

Runs on CPU through the Triton interpreter (set by `import fla_kernels` when
CUDA is absent), so shapes stay small. Inputs are generated in the kernel's
dtype and upcast exactly to float64 for the reference, with one shared random
upstream gradient for o and one for the final state.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fla_kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA)
from fla_kernels.ops.rwkv6.chunk import chunk_rwkv6
from references.rwkv6 import rwkv6_recurrent

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GRAD_NAMES = ("dr", "dk", "dv", "dw", "du")
# max |X - X64| / max |X64| allowed, per kernel dtype
REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}
GATE_NORMALISER = {"normal": 1.0, "strong": 0.05}


def make_inputs(B, T, H, K, V, dtype, gate="normal", use_h0=True, seed=0):
    """r, k, v, w, u in `dtype`, h0 float32 (or None), upstream do (dtype) and dht (float32)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    if gate == "extreme":  # every step decays by exp(-60): a chunk's gate sum reaches -3840
        w = torch.full((B, T, H, K), -60.0)
    else:
        w = F.logsigmoid(randn(B, T, H, K)) / GATE_NORMALISER[gate]
    x = dict(r=randn(B, T, H, K), k=randn(B, T, H, K), v=randn(B, T, H, V), w=w, u=randn(H, K))
    x = {name: t.to(dtype).to(DEVICE) for name, t in x.items()}
    x["h0"] = randn(B, H, K, V).to(DEVICE) if use_h0 else None
    x["do"] = randn(B, T, H, V).to(dtype).to(DEVICE)
    x["dht"] = randn(B, H, K, V).to(DEVICE)
    return x


def run(fn, x, dtype, output_final_state, h0_grad=True):
    """Forward and backward of fn on copies of x cast to dtype; returns every tensor by name."""
    leaves = {n: x[n].to(dtype).detach().clone().requires_grad_() for n in ("r", "k", "v", "w", "u")}
    h0 = None
    if x["h0"] is not None:
        h0 = x["h0"].to(torch.float64 if dtype == torch.float64 else torch.float32).detach().clone()
        h0.requires_grad_(h0_grad)
    o, ht = fn(*leaves.values(), initial_state=h0, output_final_state=output_final_state)
    outputs, grads = [o], [x["do"].to(o.dtype)]
    if output_final_state:
        outputs.append(ht)
        grads.append(x["dht"].to(ht.dtype))
    torch.autograd.backward(outputs, grads)
    out = {"o": o.detach(), "ht": None if ht is None else ht.detach()}
    out.update({"d" + n: t.grad for n, t in leaves.items()})
    out["dh0"] = None if h0 is None else h0.grad
    return out


def assert_close(name, got, ref, rel_tol):
    """max|got - ref| <= rel_tol * max|ref|, finite where the reference is; the message names every term."""
    assert got is not None, f"{name}: the kernel returned None"
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    got = got.double()
    bad = ~torch.isfinite(got)
    assert not bad.any(), f"{name}: {int(bad.sum())} NaN/Inf values, first at {bad.nonzero()[0].tolist()}"
    err = (got - ref).abs().max().item()
    scale = ref.abs().max().item()
    bound = rel_tol * scale
    assert err <= bound, (f"{name}: max abs err {err:.3e} > bound {bound:.3e} (rel_tol {rel_tol:.0e} "
                          f"* max|ref| {scale:.3e}; rel {err / max(scale, 1e-300):.3e})")
    return err / scale if scale > 0 else 0.0


def check_case(B, T, H, K, V, dtype, gate="normal", use_h0=True, output_final_state=True, seed=0):
    x = make_inputs(B, T, H, K, V, dtype, gate, use_h0, seed)
    got = run(chunk_rwkv6, x, dtype, output_final_state)
    ref = run(rwkv6_recurrent, x, torch.float64, output_final_state)
    tol = REL_TOL[dtype]
    rels = {"o": assert_close("o", got["o"], ref["o"], tol)}
    assert got["o"].dtype == dtype
    if output_final_state:
        assert got["ht"].dtype == torch.float32
        rels["ht"] = assert_close("final_state", got["ht"], ref["ht"], tol)
    else:
        assert got["ht"] is None
    for name in GRAD_NAMES:
        assert got[name].dtype == dtype, f"{name} dtype {got[name].dtype}"
        rels[name] = assert_close(name, got[name], ref[name], tol)
    if use_h0:
        assert got["dh0"].dtype == torch.float32
        rels["dh0"] = assert_close("dh0", got["dh0"], ref["dh0"], tol)
    return rels


SHAPES = [  # B, T, H, K, V, initial state, output_final_state
    pytest.param(2, 1, 2, 16, 8, True, True, id="T1"),
    pytest.param(1, 63, 1, 8, 16, False, False, id="T63-K8"),
    pytest.param(1, 64, 2, 64, 16, True, False, id="T64-K64-V16"),
    pytest.param(1, 65, 1, 16, 32, False, True, id="T65"),
    pytest.param(2, 130, 1, 60, 20, True, True, id="T130-nonpow2"),
    pytest.param(1, 70, 1, 100, 72, True, True, id="T70-K100-V72-split"),
]


@pytest.mark.parametrize("B,T,H,K,V,use_h0,output_final_state", SHAPES)
def test_fp32_matches_float64_reference(B, T, H, K, V, use_h0, output_final_state):
    check_case(B, T, H, K, V, torch.float32, "normal", use_h0, output_final_state)


@pytest.mark.parametrize("gate", ["strong", "extreme"])
@pytest.mark.parametrize("B,T,H,K,V", [(1, 130, 1, 16, 16), (1, 100, 2, 32, 24)])
def test_fp32_strong_decay_is_finite_and_accurate(B, T, H, K, V, gate):
    check_case(B, T, H, K, V, torch.float32, gate, use_h0=True, output_final_state=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("gate", ["normal", "strong"])
@pytest.mark.parametrize("B,T,H,K,V,use_h0", [(1, 130, 1, 16, 16, False), (1, 65, 2, 32, 24, True)])
def test_half_precision_matches_float64_reference(B, T, H, K, V, use_h0, gate, dtype):
    check_case(B, T, H, K, V, dtype, gate, use_h0, output_final_state=True)


def test_gradient_from_final_state_alone():
    """o unused: the only upstream gradient is dht."""
    x = make_inputs(1, 70, 1, 16, 16, torch.float32)
    grads = {}
    for name, fn, dtype in (("kernel", chunk_rwkv6, torch.float32), ("ref", rwkv6_recurrent, torch.float64)):
        leaves = [x[n].to(dtype).clone().requires_grad_() for n in ("r", "k", "v", "w", "u")]
        h0 = x["h0"].to(dtype).clone().requires_grad_()
        _, ht = fn(*leaves, initial_state=h0, output_final_state=True)
        torch.autograd.backward([ht], [x["dht"].to(dtype)])
        grads[name] = [t.grad for t in leaves] + [h0.grad]
    assert grads["kernel"][0].abs().max() == 0, "dr must be zero when only the final state is used"
    for label, got, ref in zip(("dk", "dv", "dw", "dh0"), grads["kernel"][1:4] + grads["kernel"][5:],
                               grads["ref"][1:4] + grads["ref"][5:]):
        assert_close(label, got, ref, REL_TOL[torch.float32])


def test_only_requested_gradients_are_returned():
    x = make_inputs(1, 20, 1, 16, 16, torch.float32)
    r, k, w, u = (x[n] for n in ("r", "k", "w", "u"))
    v = x["v"].clone().requires_grad_()
    h0 = x["h0"].clone()  # no grad
    o, ht = chunk_rwkv6(r, k, v, w, u, initial_state=h0)
    assert ht is None
    o.backward(x["do"])
    assert v.grad is not None and torch.isfinite(v.grad).all() and v.grad.abs().max() > 0
    assert r.grad is None and k.grad is None and w.grad is None and h0.grad is None


def test_scale_is_passed_through():
    x = make_inputs(1, 40, 1, 16, 16, torch.float32, use_h0=False)
    args = [x[n] for n in ("r", "k", "v", "w", "u")]
    o, _ = chunk_rwkv6(*args, scale=0.3)
    o_ref, _ = rwkv6_recurrent(*[a.double() for a in args], scale=0.3)
    assert_close("o", o, o_ref, REL_TOL[torch.float32])


def test_inputs_unchanged_and_results_deterministic():
    x = make_inputs(1, 70, 2, 16, 24, torch.float32, gate="strong")
    before = {n: t.clone() for n, t in x.items() if t is not None}
    first = run(chunk_rwkv6, x, torch.float32, output_final_state=True)
    for name, t in before.items():
        assert torch.equal(x[name], t), f"input {name} was modified"
    second = run(chunk_rwkv6, x, torch.float32, output_final_state=True)
    for name, t in first.items():
        assert torch.equal(t, second[name]), f"{name} differs between two identical calls"


def _args(B=1, T=8, H=2, K=16, V=8, dtype=torch.float32):
    x = make_inputs(B, T, H, K, V, dtype)
    return [x[n] for n in ("r", "k", "v", "w", "u")], x["h0"]


@pytest.mark.parametrize("bad", ["k_shape", "v_batch", "w_time", "u_shape", "h0_shape", "mixed_dtype",
                                 "r_3d", "empty"])
def test_bad_arguments_raise_value_error(bad):
    (r, k, v, w, u), h0 = _args()
    if bad == "k_shape":
        k = k[..., :8]
    elif bad == "v_batch":
        v = torch.cat([v, v])
    elif bad == "w_time":
        w = w[:, :5]
    elif bad == "u_shape":
        u = u[:1]
    elif bad == "h0_shape":
        h0 = h0.transpose(-1, -2)
    elif bad == "mixed_dtype":
        v = v.to(torch.float16)
    elif bad == "r_3d":
        r = r[0]
    elif bad == "empty":
        r, k, v, w = r[:, :0], k[:, :0], v[:, :0], w[:, :0]
    with pytest.raises(ValueError) as info:
        chunk_rwkv6(r, k, v, w, u, initial_state=h0, output_final_state=True)
    message = str(info.value)
    assert message.startswith("chunk_rwkv6") and "\n" not in message
