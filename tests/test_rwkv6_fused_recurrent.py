"""fused_recurrent_rwkv6 against the float64 recurrent reference (CPU: Triton interpreter).

Inputs, runner, reference and assertions come from tests/kernel_testing.py. Bounds:
max|X - X64| <= REL_TOL[dtype] * max|X64| for every tensor (dw included: the kernel leaves the
gate-free terms out of its dw sums, so fp32 dw keeps 1e-5 under strong decay), and fp16 / bf16
results, computed in fp32 and rounded once, within half an ulp of the float64 value elementwise.
"""
import pytest
import torch

from fla_kernels.ops.common.fused_recurrent import CHUNK
from fla_kernels.ops.rwkv6.fused_recurrent import fused_recurrent_rwkv6
from tests.kernel_testing import (DEVICE, REL_TOL, RWKV6, assert_close, assert_identical,
                                  assert_matches_reference, assert_unchanged, make_inputs, reference, run,
                                  segmented)

CASES = [
    # dtype, gate, B, T, H, K, V, initial state, output_final_state
    (torch.float32, "normal", 1, 1, 1, 16, 16, False, False),
    (torch.float32, "strong", 1, 1, 2, 8, 16, True, True),
    (torch.float32, "strong", 2, 1, 2, 16, 16, False, True),          # dw exactly 0: gate-free terms
    (torch.float32, "normal", 2, 37, 1, 16, 8, True, True),
    (torch.float32, "strong", 1, CHUNK, 1, 32, 16, True, True),
    (torch.float32, "strong", 2, CHUNK + 1, 1, 16, 60, True, False),   # V in 2 blocks, non-power of 2
    (torch.float32, "normal", 1, CHUNK + 1, 2, 60, 16, False, True),   # K non-power of 2, K != V
    (torch.float32, "strong", 1, 2 * CHUNK + 3, 1, 8, 8, True, True),  # three chunks
    (torch.float32, "strong", 1, 5, 1, 128, 128, True, True),            # 4 V-blocks
    (torch.float32, "normal", 1, 5, 1, 256, 32, True, True),             # K = 256: 8 warps
    (torch.bfloat16, "strong", 1, CHUNK + 1, 1, 32, 16, True, True),
    (torch.bfloat16, "normal", 1, 37, 2, 16, 40, False, False),
    (torch.bfloat16, "strong", 2, 1, 2, 32, 32, False, True),         # dw exactly 0, in bf16
    (torch.float16, "normal", 1, CHUNK, 1, 16, 16, True, True),
    (torch.float16, "strong", 2, 1, 1, 16, 8, True, True),
]


@pytest.mark.parametrize("dtype,gate,B,T,H,K,V,h0,oft", CASES,
                         ids=lambda p: str(p).replace("torch.", "") if not isinstance(p, bool) else str(p))
def test_matches_float64_reference(dtype, gate, B, T, H, K, V, h0, oft):
    x = make_inputs(RWKV6, B, T, H, K, V, dtype, gate, h0)
    got = run(fused_recurrent_rwkv6, x, oft)
    assert (got["ht"] is not None) == oft
    assert_matches_reference(RWKV6, got, reference(RWKV6, x, oft), dtype, rounded_once=True)


def test_custom_scale_and_non_contiguous_inputs():
    x = make_inputs(RWKV6, 1, 20, 2, 16, 16, torch.float32, "normal", True, seed=1)
    # The same values in a [B, H, T, K] buffer, viewed as [B, T, H, K]: non-contiguous.
    strided = x.replace(**{n: t.transpose(1, 2).contiguous().transpose(1, 2)
                           for n, t in x.tensors.items() if n != "u"})
    assert not strided.tensors["r"].is_contiguous()
    got = run(fused_recurrent_rwkv6, strided, True, scale=0.3)
    assert_matches_reference(RWKV6, got, reference(RWKV6, x, True, scale=0.3), torch.float32)


@pytest.mark.parametrize("wanted,loss_on", [(("w", "h0"), "ht"), (("r", "v", "u"), "o"), (("k",), "both")])
def test_subsets_of_gradients_and_of_outputs_used(wanted, loss_on):
    """Only some inputs require grad (the kernels skip what is not needed) and the loss uses only o
    (no gradient for ht) or only ht (none for o): the gradients that are asked for stay right."""
    x = make_inputs(RWKV6, 1, CHUNK + 5, 1, 16, 16, torch.float32, "strong", True, seed=2)
    kw = dict(grads=[n for n in wanted if n != "h0"], h0_grad="h0" in wanted, loss_on=loss_on)
    got = run(fused_recurrent_rwkv6, x, True, **kw)
    ref = reference(RWKV6, x, True, **kw)
    for n in [s.name for s in RWKV6.inputs] + ["h0"]:
        key = "dh0" if n == "h0" else "d" + n
        assert (got[key] is not None) == (n in wanted), f"{key}: returned {'no ' * (got[key] is None)}gradient"
        if n in wanted:
            assert_close(key, got[key], ref[key], REL_TOL[torch.float32])


def test_segments_with_carried_state_equal_one_call():
    """T split in two segments, the final state of the first fed to the second: same o and grads."""
    x = make_inputs(RWKV6, 1, 50, 1, 16, 8, torch.float32, "normal", True, seed=3)
    full = run(fused_recurrent_rwkv6, x, True)
    parts = run(segmented(fused_recurrent_rwkv6, [23]), x, True)
    for name, t in full.items():
        assert_close(f"{name} (segmented vs one call)", parts[name], t, 1e-5)


def test_inputs_unchanged_and_deterministic():
    x = make_inputs(RWKV6, 1, CHUNK + 1, 1, 16, 16, torch.bfloat16, "strong", True, seed=4)
    before = x.snapshot()
    first = run(fused_recurrent_rwkv6, x, True)
    second = run(fused_recurrent_rwkv6, x, True)
    assert_unchanged(x, before)
    assert_identical(first, second)


@pytest.mark.parametrize("bad", ["v_time", "u_shape", "mixed_dtype", "state_shape", "w_ndim"])
def test_rejects_bad_arguments(bad):
    r, k, v, w, u = make_inputs(RWKV6, 1, 8, 2, 16, 8, torch.float32, h0=False).args()
    state = None
    if bad == "v_time":
        v = v[:, :5]
    elif bad == "u_shape":
        u = u[:1]
    elif bad == "mixed_dtype":
        k = k.half()
    elif bad == "state_shape":
        state = torch.zeros(1, 2, 8, 16, device=DEVICE)
    elif bad == "w_ndim":
        w = w[0]
    with pytest.raises(ValueError, match="fused_recurrent_rwkv6"):
        fused_recurrent_rwkv6(r, k, v, w, u, initial_state=state)
