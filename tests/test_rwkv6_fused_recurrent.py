"""fused_recurrent_rwkv6 against the float64 recurrent reference (CPU: Triton interpreter)."""
import pytest
import torch
import torch.nn.functional as F

from fla_kernels.ops.rwkv6.fused_recurrent import CHUNK, fused_recurrent_rwkv6
from references.rwkv6 import rwkv6_recurrent

# max|X - X64| / max|X64|. fp32 dw is a difference of chunk sums of O(1) terms that cancel under strong
# decay (the fp32 chunked reference makes the same ~1e-5 error), hence its wider bound.
TOL = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 2e-2}
TOL_DW_FP32 = 5e-5
# fp16 / bf16 results are computed in fp32 and rounded once: elementwise within half an ulp of the
# float64 value (relative 2^-11 / 2^-8) plus a small fraction of max|ref| for the fp32 arithmetic.
HALF_ULP = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
GATE_NORM = {"normal": 1.0, "strong": 0.05}


def make_inputs(B, T, H, K, V, dtype, gate="normal", h0=False, seed=0):
    """Inputs in `dtype` (w = logsigmoid(randn) / norm), fp32 initial state or None, upstream grads
    (do in `dtype`, as autograd hands it to the kernel; dht float32 like the final state)."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    r, k, v = rnd(B, T, H, K).to(dtype), rnd(B, T, H, K).to(dtype), rnd(B, T, H, V).to(dtype)
    w = (F.logsigmoid(rnd(B, T, H, K)) / GATE_NORM[gate]).to(dtype)
    u = rnd(H, K).to(dtype)
    state = rnd(B, H, K, V) if h0 else None
    do, dht = rnd(B, T, H, V).to(dtype), rnd(B, H, K, V)  # do in dtype: what the kernel receives
    return (r, k, v, w, u), state, do, dht


def run(fn, tensors, state, do, dht, output_final_state, cast=lambda x: x, scale=None):
    """Forward with every input requiring grad, backward of <o, do> + <ht, dht>.

    Returns {name: tensor} for o, ht (when returned) and dr dk dv dw du dh0 (dh0 when a state is given).
    """
    names = ["dr", "dk", "dv", "dw", "du"]
    leaves = [cast(x).detach().requires_grad_() for x in tensors]
    h0 = None if state is None else cast(state).detach().requires_grad_()
    o, ht = fn(*leaves, scale=scale, initial_state=h0, output_final_state=output_final_state)
    loss = (o.double() * do.double()).sum()
    if output_final_state:
        loss = loss + (ht.double() * dht.double()).sum()
    if h0 is not None:
        leaves, names = leaves + [h0], names + ["dh0"]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    out = {"o": o.detach()}
    if output_final_state:
        out["ht"] = ht.detach()
    for name, x, gx in zip(names, leaves, grads):
        out[name] = torch.zeros_like(x) if gx is None else gx  # the reference leaves w unused at T = 1
    return out


def reference(tensors, state, do, dht, output_final_state, scale=None):
    return run(rwkv6_recurrent, tensors, state, do, dht, output_final_state, cast=lambda x: x.double(),
               scale=scale)


def rel_err(x, ref):
    return ((x.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def assert_matches(out, ref, dtype):
    """Every tensor within its relative bound, with the kernel's output dtypes."""
    assert out.keys() == ref.keys()
    for name, x in out.items():
        tol = TOL_DW_FP32 if (name == "dw" and dtype == torch.float32) else TOL[dtype]
        assert torch.isfinite(x).all(), f"{name}: non-finite values"
        err = rel_err(x, ref[name])
        assert err <= tol, f"{name}: max|err| / max|ref| = {err:.3e} > {tol:.1e} ({dtype})"
        if x.dtype in HALF_ULP:
            y = ref[name]
            excess = (x.double() - y).abs() - HALF_ULP[x.dtype] * y.abs() - 1e-4 * y.abs().max()
            assert excess.max() <= 0, f"{name}: more than one rounding from float64 ({excess.max():.3e})"
    assert out["o"].dtype == dtype and out["dr"].dtype == dtype and out["dw"].dtype == dtype
    for name in ("ht", "dh0"):
        if name in out:
            assert out[name].dtype == torch.float32


CASES = [
    # dtype, gate, B, T, H, K, V, initial state, output_final_state
    (torch.float32, "normal", 1, 1, 1, 16, 16, False, False),
    (torch.float32, "strong", 1, 1, 2, 8, 16, True, True),
    (torch.float32, "normal", 2, 37, 1, 16, 8, True, True),
    (torch.float32, "strong", 1, CHUNK, 1, 32, 16, True, True),
    (torch.float32, "strong", 2, CHUNK + 1, 1, 16, 60, True, False),   # V in 2 blocks, non-power of 2
    (torch.float32, "normal", 1, CHUNK + 1, 2, 60, 16, False, True),   # K non-power of 2, K != V
    (torch.float32, "strong", 1, 2 * CHUNK + 3, 1, 8, 8, True, True),  # three chunks
    (torch.float32, "strong", 1, 5, 1, 128, 128, True, True),            # 4 V-blocks
    (torch.float32, "normal", 1, 5, 1, 256, 32, True, True),             # K = 256: 8 warps
    (torch.bfloat16, "strong", 1, CHUNK + 1, 1, 32, 16, True, True),
    (torch.bfloat16, "normal", 1, 37, 2, 16, 40, False, False),
    (torch.float16, "normal", 1, CHUNK, 1, 16, 16, True, True),
    (torch.float16, "strong", 2, 1, 1, 16, 8, True, True),
]


@pytest.mark.parametrize("dtype,gate,B,T,H,K,V,h0,oft", CASES,
                         ids=lambda p: str(p).replace("torch.", "") if not isinstance(p, bool) else str(p))
def test_matches_float64_reference(dtype, gate, B, T, H, K, V, h0, oft):
    tensors, state, do, dht = make_inputs(B, T, H, K, V, dtype, gate, h0)
    out = run(fused_recurrent_rwkv6, tensors, state, do, dht, oft)
    assert ("ht" in out) == oft
    assert_matches(out, reference(tensors, state, do, dht, oft), dtype)


def test_custom_scale_and_non_contiguous_inputs():
    tensors, state, do, dht = make_inputs(1, 20, 2, 16, 16, torch.float32, "normal", True, seed=1)
    # The same values in a [B, H, T, K] buffer, viewed as [B, T, H, K]: non-contiguous.
    strided = tuple(x.transpose(1, 2).contiguous().transpose(1, 2) for x in tensors[:4]) + (tensors[4],)
    assert not strided[0].is_contiguous()
    out = run(fused_recurrent_rwkv6, strided, state, do, dht, True, scale=0.3)
    assert_matches(out, reference(tensors, state, do, dht, True, scale=0.3), torch.float32)


@pytest.mark.parametrize("wanted,loss_on", [(("w", "h0"), "ht"), (("r", "v", "u"), "o"), (("k",), "both")])
def test_subsets_of_gradients_and_of_outputs_used(wanted, loss_on):
    """Only some inputs require grad (the kernels skip what is not needed) and the loss uses only o
    (no gradient for ht) or only ht (none for o): the gradients that are asked for stay right."""
    tensors, state, do, dht = make_inputs(1, CHUNK + 5, 1, 16, 16, torch.float32, "strong", True, seed=2)
    names = ["r", "k", "v", "w", "u", "h0"]
    results = {}
    for impl, cast in ((fused_recurrent_rwkv6, lambda x: x.clone()), (rwkv6_recurrent, lambda x: x.double())):
        args = {n: cast(x).requires_grad_(n in wanted) for n, x in zip(names, list(tensors) + [state])}
        h0 = args.pop("h0")
        o, ht = impl(*args.values(), initial_state=h0, output_final_state=True)
        loss = 0
        if loss_on in ("o", "both"):
            loss = loss + (o.double() * do.double()).sum()
        if loss_on in ("ht", "both"):
            loss = loss + (ht.double() * dht.double()).sum()
        loss.backward()
        args["h0"] = h0
        assert all((args[n].grad is not None) == (n in wanted) for n in names)
        results[impl] = {n: args[n].grad for n in wanted}
    for n in wanted:
        tol = TOL_DW_FP32 if n == "w" else TOL[torch.float32]
        err = rel_err(results[fused_recurrent_rwkv6][n], results[rwkv6_recurrent][n])
        assert err <= tol, f"d{n}: {err:.3e} > {tol:.1e}"


def test_segments_with_carried_state_equal_one_call():
    """T split in two segments, the final state of the first fed to the second: same o and grads."""
    tensors, state, do, dht = make_inputs(1, 50, 1, 16, 8, torch.float32, "normal", True, seed=3)
    full = run(fused_recurrent_rwkv6, tensors, state, do, dht, True)
    leaves = [x.clone().requires_grad_() for x in tensors]
    h0 = state.clone().requires_grad_()
    s = 23
    o1, h1 = fused_recurrent_rwkv6(*(x[:, :s] for x in leaves[:4]), leaves[4], initial_state=h0,
                                   output_final_state=True)
    o2, h2 = fused_recurrent_rwkv6(*(x[:, s:] for x in leaves[:4]), leaves[4], initial_state=h1,
                                   output_final_state=True)
    o = torch.cat([o1, o2], dim=1)
    ((o * do).sum() + (h2 * dht).sum()).backward()
    for name, x in zip(["o", "ht", "dr", "dk", "dv", "dw", "du", "dh0"],
                       [o, h2] + [x.grad for x in leaves] + [h0.grad]):
        err = rel_err(x, full[name].double())
        assert err <= 1e-5, f"{name}: segmented vs one call {err:.3e}"


def test_inputs_unchanged_and_deterministic():
    tensors, state, do, dht = make_inputs(1, CHUNK + 1, 1, 16, 16, torch.bfloat16, "strong", True, seed=4)
    before = [x.clone() for x in tensors] + [state.clone()]
    first = run(fused_recurrent_rwkv6, tensors, state, do, dht, True)
    second = run(fused_recurrent_rwkv6, tensors, state, do, dht, True)
    for x, y in zip(list(tensors) + [state], before):
        assert torch.equal(x, y)
    for name in first:
        assert torch.equal(first[name], second[name]), f"{name} differs between two identical calls"


@pytest.mark.parametrize("bad", ["v_time", "u_shape", "mixed_dtype", "state_shape", "w_ndim"])
def test_rejects_bad_arguments(bad):
    (r, k, v, w, u), _, _, _ = make_inputs(1, 8, 2, 16, 8, torch.float32)
    state = None
    if bad == "v_time":
        v = v[:, :5]
    elif bad == "u_shape":
        u = u[:1]
    elif bad == "mixed_dtype":
        k = k.half()
    elif bad == "state_shape":
        state = torch.zeros(1, 2, 8, 16)
    elif bad == "w_ndim":
        w = w[0]
    with pytest.raises(ValueError, match="fused_recurrent_rwkv6"):
        fused_recurrent_rwkv6(r, k, v, w, u, initial_state=state)
