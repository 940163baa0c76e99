"""The chunk-state kernels (ops/common/chunk_state.py) on their own (the Triton interpreter on CPU,
or the GPU): the scalar-gate path against the same gate broadcast over K (summed per chunk by
masked products), and the forward's states stored in 16 bits as the float32 ones rounded (to
nearest on a GPU; the interpreter's 16-bit stores truncate), the final state apart and never
rounded."""
import fla_kernels  # noqa: F401  (sets the interpreter up before triton is imported)
import pytest
import torch
import torch.nn.functional as F
import triton

from fla_kernels.ops.common.chunk_state import chunk_bwd_dh, chunk_fwd_h
from tests.kernel_testing import DEVICE

BT = 64
B, T, H, K, V = 1, 2 * BT + 5, 2, 32, 16


def _inputs(strength: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    k, v, q, do = (torch.randn(B, T, H, d, generator=gen) for d in (K, V, K, V))
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen)) * strength
    h0 = torch.randn(B, H, K, V, generator=gen)
    return tuple(x.to(DEVICE) for x in (q, k, v, do, g, h0))


def _broadcast(g):
    return g[..., None].expand(B, T, H, K).contiguous()


@pytest.mark.parametrize("strength", [1.0, 60.0], ids=["normal", "strong"])
def test_scalar_gate_states_match_the_gate_broadcast_over_k(strength):
    _, k, v, _, g, h0 = _inputs(strength)
    states, final = chunk_fwd_h(k, v, g, h0, BT, True, None)
    want, want_final = chunk_fwd_h(k, v, _broadcast(g), h0, BT, True, None)
    assert states.shape == (B, H, triton.cdiv(T, BT), K, V) and final.dtype == torch.float32
    torch.testing.assert_close(states, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, want_final, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(final, chunk_fwd_h(k, v, None, h0, BT, True, None)[1]), \
        "the gate must act"


@pytest.mark.parametrize("exclusive", [False, True], ids=["inclusive", "exclusive"])
@pytest.mark.parametrize("strength", [1.0, 60.0], ids=["normal", "strong"])
def test_scalar_gate_state_gradients_match_the_gate_broadcast_over_k(strength, exclusive):
    q, _, _, do, g, _ = _inputs(strength, seed=1)
    dht = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    got = chunk_bwd_dh(q, g, do, dht, 0.5, BT, exclusive, True, True, None)
    want = chunk_bwd_dh(q, _broadcast(g), do, dht, 0.5, BT, exclusive, True, True, None)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_exclusive_and_inclusive_scalar_prefixes_differ():
    q, _, _, do, g, _ = _inputs(1.0, seed=2)
    inclusive = chunk_bwd_dh(q, g, do, None, 1.0, BT, False, True, True, None)[1]
    exclusive = chunk_bwd_dh(q, g, do, None, 1.0, BT, True, True, True, None)[1]
    assert (inclusive - exclusive).abs().max() > 1e-3


@pytest.mark.parametrize("kernel", ["states", "dh"])
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float16])
def test_states_stored_in_16_bits_are_the_float32_ones_rounded(state_dtype, kernel):
    q, k, v, do, g, h0 = _inputs(1.0, seed=3)
    if kernel == "states":
        states, final = chunk_fwd_h(k, v, g, h0, BT, True, None, state_dtype=state_dtype)
        want, want_final = chunk_fwd_h(k, v, g, h0, BT, True, None)
    else:
        dht = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(5)).to(DEVICE)
        states, final = chunk_bwd_dh(q, g, do, dht, 0.5, BT, False, True, True, None,
                                     state_dtype=state_dtype)
        want, want_final = chunk_bwd_dh(q, g, do, dht, 0.5, BT, False, True, True, None)
    assert states.dtype == state_dtype
    if DEVICE == "cuda":
        assert torch.equal(states, want.to(state_dtype))
    else:
        info = torch.finfo(state_dtype)
        ulp = info.eps * want.abs() + info.smallest_normal * info.eps  # subnormals: a fixed step
        assert ((states.float() - want).abs() <= ulp).all()
        assert not torch.equal(states.float(), want), "the states must be rounded"
    assert torch.equal(final, want_final), "the final state (dh0) stays float32, never rounded"



@pytest.mark.skipif(DEVICE != "cuda",
                    reason="the GPU's kernels round what they read to 16-bit operands")
@pytest.mark.parametrize("op", ["gla", "rwkv6"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gated_results_are_the_same_to_the_bit_with_16_bit_states_and_scores(op, dtype,
                                                                             monkeypatch):
    """The forward's states and scores A are stored in the inputs' dtype because every kernel
    that reads them rounds them to 16-bit operands anyway: stored in float32 instead, the
    output, final state and every gradient must come out the same to the bit."""
    from fla_kernels.ops.common import chunk_gated
    from fla_kernels.ops.gla import chunk_gla
    from fla_kernels.ops.rwkv6 import chunk_rwkv6
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 200, 2, 64, generator=gen).to(DEVICE, dtype) for _ in range(3))
    g = (F.logsigmoid(torch.randn(2, 200, 2, 64, generator=gen)) / 8).to(DEVICE, dtype)
    h0 = torch.randn(2, 2, 64, 64, generator=gen).to(DEVICE)
    u = torch.randn(2, 64, generator=gen).to(DEVICE, dtype)
    do = torch.randn(2, 200, 2, 64, generator=gen).to(DEVICE, dtype)

    def call():
        x = [t.detach().clone().requires_grad_() for t in (q, k, v, g, u, h0)]
        if op == "gla":
            o, ht = chunk_gla(*x[:4], initial_state=x[5], output_final_state=True)
        else:
            o, ht = chunk_rwkv6(*x[:5], initial_state=x[5], output_final_state=True)
        (o * do).sum().backward()
        return [o, ht] + [t.grad for t in x if t.grad is not None]

    narrow = call()
    monkeypatch.setattr(chunk_gated, "store_dtype", lambda dtype: torch.float32)
    wide = call()
    assert len(narrow) == (8 if op == "rwkv6" else 7)
    for a, b in zip(narrow, wide):
        assert torch.equal(a, b)
