"""Every kernel of every declared op (an op's variant in `harness.registry.OPS`: "gla-chunk") against
the op's float64 recurrent reference, and the contract each keeps: inputs left as they were and
results deterministic, strided inputs and a custom scale, segments with the state carried, only the
gradients asked for, arguments checked, the op's variants agreeing.

CPU: Triton interpreter, so shapes stay small. Inputs, runner, reference and assertions come from
tests/kernel_testing.py: inputs generated in the kernel's dtype and upcast exactly to float64 for the
reference, one shared upstream gradient for o and one for each final state, and
max|X - X64| <= REL_TOL[dtype] * max|X64| for every tensor. The gate gradients keep that bound under
strong decay: the kernels leave the gate-free terms out of their gate-gradient sums, so fp32 dg / dw
keep 1e-5 and are exactly 0 at T = 1 without an initial state. The token-by-token kernels'
(fused_recurrent) fp16 / bf16 results, computed in fp32 and rounded once, are also within half an ulp
of float64 elementwise.

Each test takes its cases from a table below, rows of (the kernels a case runs on, the case);
`test_every_declared_kernel_has_cases` fails for a declared kernel that a table meant for every
kernel leaves out. The segments and the variants' agreement of the kernels their tables leave out
are checked by tests/test_checks.py::test_our_kernels_pass_every_check.
"""
from collections import namedtuple

import pytest
import torch

from fla_kernels.ops.common.fused_recurrent import CHUNK
from harness.declaration import load_function
from harness.registry import OPS
from tests.kernel_testing import (DEVICE, REL_TOL, assert_close, assert_identical, assert_matches_reference,
                                  assert_unchanged, make_inputs, reference, run, segmented)

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
KERNELS = [f"{op}-{variant}" for op, spec in OPS.items() for variant in spec.variants]

# The inputs of a case, drawn by `make_inputs`; M (slots) only for the ops that have it.
Draw = namedtuple("Draw", "B T H K V dtype gate seed M", defaults=(None,))


def kernel(name):
    """(op declaration, public function) of "op-variant"."""
    op, variant = name.split("-")
    return OPS[op], OPS[op].variant_fn(variant)


def draw(spec, d: Draw):
    """The case's inputs, with an initial state."""
    return make_inputs(spec, d.B, d.T, d.H, d.K, d.V, d.dtype, d.gate, True, d.seed, M=d.M)


def params(table, case_id=lambda *case: ""):
    """pytest params (kernel, *case) of a table of rows (kernels, *case), ids "kernel[-case_id]"."""
    return [pytest.param(name, *case, id="-".join(filter(None, [name, case_id(*case)])))
            for kernels, *case in table for name in kernels]


def grid(kernels, dtypes, gates, shapes, M=None):
    """Reference cases: every shape (B, T, H, K, V, initial state, final state) x gate x dtype."""
    return [(kernels, dtype, gate, *shape, M) for shape in shapes for gate in gates for dtype in dtypes]


def listed(kernels, cases, M=None):
    """Reference cases of rows (dtype, gate, B, T, H, K, V, initial state, final state)."""
    return [(kernels, *case, M) for case in cases]


# B, T, H, K, V, initial state, final state: T around the 64-token chunks, K != V, non-powers of
# two, K and V over several blocks
SHAPES = [
    (2, 1, 2, 16, 8, True, True),
    (1, 63, 1, 8, 16, False, False),
    (1, 64, 2, 64, 16, True, False),
    (1, 65, 1, 16, 32, False, True),
    (2, 130, 1, 60, 20, True, True),
    (1, 70, 1, 100, 72, True, True),
]
GLA_SHAPES = SHAPES[:4] + [(1, 130, 1, 60, 20, True, True)] + SHAPES[5:]   # T = 130 at B = 1
GLA_CHUNKED, CHUNKED_LINEAR = ["gla-chunk", "gla-fused_chunk"], ["linear_attn-chunk", "linear_attn-fused_chunk"]
# one kernel set, ops/common/fused_recurrent.py
RECURRENT_FAMILY = ["gla-fused_recurrent", "simple_gla-fused_recurrent", "linear_attn-fused_recurrent"]
RECURRENT_CASES = [   # dtype, gate, B, T, H, K, V, initial state, final state
    (FP32, "strong", 2, 1, 1, 8, 16, False, True),            # dg exactly 0: gate-free terms
    (FP32, "normal", 1, 1, 2, 16, 8, True, True),
    (FP32, "strong", 1, CHUNK - 1, 1, 8, 16, False, False),
    (FP32, "normal", 1, CHUNK + 1, 2, 60, 20, True, True),    # K non-power of 2, K != V
    (FP32, "extreme", 1, CHUNK, 1, 16, 8, True, True),
    (FP32, "strong", 1, 2 * CHUNK + 2, 1, 8, 8, True, True),  # three chunks
    (FP32, "normal", 1, 9, 1, 16, 40, True, True),            # two V-blocks
    (BF16, "strong", 1, CHUNK + 1, 1, 32, 16, True, True),
    (FP16, "normal", 1, 37, 1, 16, 16, True, False),
]
# one kernel set, ops/common/fused_recurrent_delta.py; the gate strength also sets beta's spread
DELTA_FAMILY = ["delta_rule-fused_recurrent", "gated_delta_rule-fused_recurrent", "kda-fused_recurrent"]
# one kernel set, ops/common/chunk_delta.py: T across the 64-token chunks (kda's per-channel
# specialisation against the reference on the first case; test_delta_rule.py has more of it)
DELTA_CHUNKED = ["delta_rule-chunk", "gated_delta_rule-chunk", "kda-chunk"]
DELTA_CHUNK_CASES = [   # dtype, gate, B, T, H, K, V, initial state, final state
    (FP32, "strong", 1, CHUNK + 1, 2, 16, 8, True, True),     # two chunks, beta near 0 and 1
    (FP32, "normal", 2, 1, 1, 12, 40, False, True),           # a decode step, two V-blocks, K not a power of 2
    (FP32, "normal", 1, 2 * CHUNK + 2, 1, 16, 16, True, True),   # three chunks
    (BF16, "normal", 1, 2 * CHUNK + 2, 1, 16, 16, True, True),
]
DELTA_CASES = [   # dtype, gate, B, T, H, K, V, initial state, final state
    (FP32, "strong", 1, CHUNK + 1, 1, 16, 8, True, True),     # two chunks of the gate sums
    (FP32, "normal", 2, 1, 2, 12, 40, False, True),           # a decode step, two V-blocks, K not a power of 2
    (FP32, "extreme", 1, 9, 1, 8, 8, True, True),             # beta exactly 1 or ~1e-26
    (BF16, "normal", 1, 20, 1, 16, 16, True, False),
]
# 16-bit inputs: each dtype under both gate strengths and both shapes, crossed once (under the
# interpreter every product is IEEE fp32, so the dtypes differ only in their casts and stores)
SIXTEEN_BIT_CASES = [(BF16, "normal", 1, 130, 1, 16, 16, False, True),
                     (BF16, "strong", 1, 65, 2, 16, 24, True, True),
                     (FP16, "strong", 1, 130, 1, 16, 16, False, True),
                     (FP16, "normal", 1, 65, 2, 16, 24, True, True)]
REFERENCE_CASES = [
    *grid(GLA_CHUNKED, [FP32], ["normal"], GLA_SHAPES),
    *grid(GLA_CHUNKED, [FP32], ["strong", "extreme"], [(1, 130, 1, 16, 16, True, True),
                                                       (1, 100, 2, 32, 8, True, True)]),
    *listed(GLA_CHUNKED, SIXTEEN_BIT_CASES),
    # fused_chunk_gla went NaN upstream at T=43884 (H=1, K=V=64, bf16, strong decay): that case scaled
    # to what the interpreter can run, many chunks walked in registers
    *grid(["gla-fused_chunk"], [BF16], ["extreme"], [(1, 320, 1, 16, 16, True, True)]),
    *grid(["rwkv6-chunk", "simple_gla-chunk", *CHUNKED_LINEAR], [FP32], ["normal"], SHAPES),
    *grid(["rwkv6-chunk", "simple_gla-chunk"], [FP32], ["strong", "extreme"], [(1, 130, 1, 16, 16, True, True),
                                                                             (1, 100, 2, 32, 24, True, True)]),
    *grid(["simple_gla-chunk"], [FP32], ["strong", "extreme"], [(2, 1, 1, 8, 8, True, True)]),
    *listed(["rwkv6-chunk"], [case[:5] + (32,) + case[6:] if case[3] == 65 else case
                              for case in SIXTEEN_BIT_CASES]),
    *listed(["simple_gla-chunk"], [(BF16, "normal", 1, 130, 1, 16, 16, False, True),
                                   (BF16, "strong", 1, 130, 1, 16, 16, False, True),
                                   (BF16, "strong", 1, 65, 2, 32, 24, True, True),
                                   (BF16, "extreme", 1, 65, 1, 32, 24, True, True),
                                   (FP16, "normal", 1, 65, 2, 32, 24, True, True),
                                   (FP16, "strong", 1, 130, 1, 16, 16, False, True)]),
    *grid(CHUNKED_LINEAR, [BF16], ["normal"], [(1, 130, 1, 16, 16, False, True), (1, 65, 2, 32, 24, True, True)]),
    *grid(CHUNKED_LINEAR, [FP16], ["normal"], [(1, 65, 2, 32, 24, True, True)]),
    *listed(RECURRENT_FAMILY[:2], RECURRENT_CASES),
    *listed(DELTA_FAMILY, DELTA_CASES),
    *listed(DELTA_CHUNKED[:2], DELTA_CHUNK_CASES),
    *listed(DELTA_CHUNKED[2:], DELTA_CHUNK_CASES[:1]),
    # the gate strength means nothing without a gate: linear attention runs the normal-gate cases
    *listed(["linear_attn-fused_recurrent"], [case for case in RECURRENT_CASES if case[1] == "normal"]),
    *listed(["rwkv6-fused_recurrent"], [
        (FP32, "normal", 1, 1, 1, 16, 16, False, False),
        (FP32, "strong", 1, 1, 2, 8, 16, True, True),
        (FP32, "strong", 2, 1, 2, 16, 16, False, True),          # dw exactly 0: gate-free terms
        (FP32, "normal", 2, 37, 1, 16, 8, True, True),
        (FP32, "strong", 1, CHUNK, 1, 32, 16, True, True),
        (FP32, "strong", 2, CHUNK + 1, 1, 16, 60, True, False),   # V in 2 blocks, non-power of 2
        (FP32, "normal", 1, CHUNK + 1, 2, 60, 16, False, True),   # K non-power of 2, K != V
        (FP32, "strong", 1, 2 * CHUNK + 3, 1, 8, 8, True, True),  # three chunks
        (FP32, "strong", 1, 5, 1, 128, 128, True, True),          # 4 V-blocks
        (FP32, "normal", 1, 5, 1, 256, 32, True, True),           # K = 256: 8 warps
        (BF16, "strong", 1, CHUNK + 1, 1, 32, 16, True, True),
        (BF16, "normal", 1, 37, 2, 16, 40, False, False),
        (BF16, "strong", 2, 1, 2, 32, 32, False, True),           # dw exactly 0, in bf16
        (FP16, "normal", 1, CHUNK, 1, 16, 16, True, True),
        (FP16, "strong", 2, 1, 1, 16, 8, True, True),
    ]),
    *[(["gsa-fused_recurrent", "gsa-chunk"], dtype, gate, B, T, H, K, V, h0, oft, M)
      for dtype, gate, B, T, H, K, V, M, h0, oft in [   # the state is the pair hk [B, H, K, M], hv [B, H, M, V]
          (FP32, "normal", 1, 1, 1, 16, 16, 16, False, False),
          (FP32, "strong", 2, 1, 1, 16, 8, 16, False, True),        # dg exactly 0: gate-free terms
          (FP32, "normal", 1, 63, 1, 32, 16, 16, True, True),
          (FP32, "strong", 1, 64, 1, 16, 32, 32, True, True),
          (FP32, "strong", 2, 65, 1, 20, 12, 24, False, True),      # non-powers of two, M = 24
          (FP32, "normal", 1, 130, 1, 16, 8, 16, True, True),       # three chunks
          (FP32, "strong", 1, 5, 1, 128, 40, 64, True, True),       # K = 128, M = 64
          (BF16, "strong", 1, 65, 1, 32, 16, 32, True, True),
          (BF16, "normal", 1, 63, 1, 16, 24, 16, False, False),
          (FP16, "normal", 1, 64, 1, 16, 16, 64, True, True)]],
]


def reference_case_id(dtype, gate, B, T, H, K, V, h0, oft, M):
    return (f"{str(dtype)[6:]}-{gate}-B{B}-T{T}-H{H}-K{K}-V{V}" + (f"-M{M}" if M else "")
            + ("-h0" if h0 else "") + ("-ht" if oft else ""))


@pytest.mark.parametrize("name,dtype,gate,B,T,H,K,V,h0,oft,M", params(REFERENCE_CASES, reference_case_id))
def test_matches_float64_reference(name, dtype, gate, B, T, H, K, V, h0, oft, M):
    spec, fn = kernel(name)
    x = make_inputs(spec, B, T, H, K, V, dtype, gate, h0, M=M)
    got = run(fn, x, oft)
    assert all((got[state] is not None) == oft for state in spec.final_state_names())
    assert_matches_reference(spec, got, reference(spec, x, oft), dtype, rounded_once=name.endswith("fused_recurrent"))


UNCHANGED = [
    (GLA_CHUNKED, Draw(1, 70, 1, 16, 24, FP32, "strong", 0)),
    (["rwkv6-chunk"], Draw(1, 70, 2, 16, 24, FP32, "strong", 0)),
    (["simple_gla-chunk"], Draw(1, 70, 2, 16, 24, BF16, "strong", 4)),
    (CHUNKED_LINEAR, Draw(1, 70, 2, 16, 24, BF16, "normal", 4)),
    (RECURRENT_FAMILY, Draw(1, 20, 1, 16, 16, BF16, "strong", 4)),
    (["rwkv6-fused_recurrent"], Draw(1, CHUNK + 1, 1, 16, 16, BF16, "strong", 4)),
    (["gsa-fused_recurrent", "gsa-chunk"], Draw(1, 40, 1, 16, 16, BF16, "strong", 4, M=16)),
    (DELTA_FAMILY, Draw(1, 12, 1, 16, 16, BF16, "strong", 4)),
    (DELTA_CHUNKED, Draw(1, 70, 1, 16, 16, BF16, "strong", 4)),
]


@pytest.mark.parametrize("name,d", params(UNCHANGED))
def test_inputs_unchanged_and_deterministic(name, d):
    spec, fn = kernel(name)
    x = draw(spec, d)
    before = x.snapshot()
    first = run(fn, x, True)
    second = run(fn, x, True)
    assert_unchanged(x, before)
    assert_identical(first, second)


STRIDED = [   # inputs, scale (None: the kernel's default)
    (GLA_CHUNKED + ["rwkv6-chunk"], Draw(1, 20, 2, 16, 8, FP32, "normal", 0), None),
    (RECURRENT_FAMILY, Draw(1, 30, 2, 16, 8, FP32, "normal", 3), 0.3),
    (["simple_gla-chunk", *CHUNKED_LINEAR], Draw(1, 90, 2, 16, 8, FP32, "normal", 3), 0.3),
    (["rwkv6-fused_recurrent"], Draw(1, 20, 2, 16, 16, FP32, "normal", 1), 0.3),
    (["gsa-fused_recurrent", "gsa-chunk"], Draw(1, 20, 2, 16, 8, FP32, "normal", 1, M=16), 0.3),
    (DELTA_FAMILY, Draw(1, 12, 2, 16, 8, FP32, "normal", 3), 0.3),
    (DELTA_CHUNKED, Draw(1, 70, 2, 16, 8, FP32, "normal", 3), 0.3),
]


@pytest.mark.parametrize("name,d,scale", params(STRIDED))
def test_strided_inputs_and_custom_scale(name, d, scale):
    """The same values in a [B, H, T, D] buffer viewed as [B, T, H, D] (non-contiguous), for every
    input with a time axis: the reference's numbers with that scale, bit for bit those of
    contiguous inputs."""
    spec, fn = kernel(name)
    x = draw(spec, d)
    strided = x.replace(**{n: t.transpose(1, 2).contiguous().transpose(1, 2)
                           for n, t in x.tensors.items() if n in spec.sequence_inputs()})
    assert not any(strided.tensors[n].is_contiguous() for n in spec.sequence_inputs())
    got = run(fn, strided, True, scale=scale)
    assert_matches_reference(spec, got, reference(spec, x, True, scale=scale), d.dtype)
    assert_identical(got, run(fn, x, True, scale=scale))


@pytest.mark.parametrize("name", KERNELS)
def test_scale_is_passed_through(name):
    """A direct call without an initial state (M: the slots of the ops that have them)."""
    spec, fn = kernel(name)
    x = make_inputs(spec, 1, 40, 1, 16, 16, FP32, h0=False, M=16)
    o, _ = fn(*x.args(), scale=0.3)
    o_ref, _ = load_function(spec.reference_loop)(*x.args(torch.float64), scale=0.3)
    assert_close("o", o, o_ref, REL_TOL[FP32])


SEGMENTS = [   # inputs, where T is cut, scale
    (RECURRENT_FAMILY, Draw(1, 30, 2, 16, 8, FP32, "normal", 3), [17], 0.3),
    (["simple_gla-chunk", *CHUNKED_LINEAR], Draw(1, 90, 2, 16, 8, FP32, "normal", 3), [37], 0.3),
    (["rwkv6-fused_recurrent"], Draw(1, 50, 1, 16, 8, FP32, "normal", 3), [23], None),
    (["gsa-fused_recurrent", "gsa-chunk"], Draw(1, 36, 1, 16, 8, FP32, "normal", 3, M=16), [17], None),
    (DELTA_CHUNKED, Draw(1, 90, 1, 16, 8, FP32, "normal", 3), [37], 0.3),
]


@pytest.mark.parametrize("name,d,split,scale", params(SEGMENTS))
def test_segments_with_carried_state_equal_one_call(name, d, split, scale):
    """T cut in segments, the final state of each fed to the next: the same o, states and gradients."""
    spec, fn = kernel(name)
    x = draw(spec, d)
    full = run(fn, x, True, scale=scale)
    parts = run(segmented(fn, split), x, True, scale=scale)
    for key, t in full.items():
        assert_close(f"{key} (segmented vs one call)", parts[key], t, 1e-5)


LONG_STRONG = Draw(1, CHUNK + 5, 1, 16, 16, FP32, "strong", 2)
GRADIENT_SUBSETS = [   # inputs, [(the gradients asked for, what the loss uses, final state returned)]
    # o unused: the only upstream gradient is the final state's
    (GLA_CHUNKED + ["rwkv6-chunk", *CHUNKED_LINEAR], Draw(1, 70, 1, 16, 16, FP32, "normal", 0),
     [(("all",), "ht", True)]),
    (GLA_CHUNKED + ["rwkv6-chunk"], Draw(1, 20, 1, 16, 16, FP32, "normal", 0), [(("v",), "both", False)]),
    (CHUNKED_LINEAR, Draw(1, 70, 1, 16, 16, FP32, "normal", 0), [(("v",), "both", False)]),
    (["simple_gla-chunk"], Draw(1, 70, 1, 16, 16, FP32, "strong", 0),
     [(("all",), "ht", True), (("g",), "both", False)]),
    (["gla-fused_recurrent"], LONG_STRONG, [(("g", "h0"), "ht", True)]),
    (["simple_gla-fused_recurrent"], LONG_STRONG, [(("q", "v"), "o", True), (("g",), "both", True)]),
    (["linear_attn-fused_recurrent"], LONG_STRONG, [(("k",), "both", True)]),
    (["rwkv6-fused_recurrent"], LONG_STRONG, [(("w", "h0"), "ht", True), (("r", "v", "u"), "o", True),
                                              (("k",), "both", True)]),
    # normal gates: under strong decay dh0 after 24 steps is ~1e-230, below float32's range
    (["gsa-fused_recurrent", "gsa-chunk"], Draw(1, 24, 1, 16, 8, FP32, "normal", 2, M=16),
     [(("g", "h0"), "ht", True), (("q", "v", "s"), "o", True), (("k", "s"), "both", True)]),
    # normal gates (dh0 under strong decay is below float32's range), strong beta for delta_rule
    (DELTA_FAMILY[1:], Draw(1, 12, 1, 16, 8, FP32, "normal", 2), [(("g", "h0"), "ht", True), (("beta",), "o", True)]),
    (DELTA_FAMILY[:1], Draw(1, 12, 1, 16, 8, FP32, "strong", 2), [(("all",), "ht", True), (("k",), "both", False)]),
    (DELTA_CHUNKED[1:], Draw(1, 70, 1, 16, 8, FP32, "normal", 2), [(("g", "h0"), "ht", True), (("beta",), "o", True)]),
    (DELTA_CHUNKED[:1], Draw(1, 70, 1, 16, 8, FP32, "strong", 2), [(("all",), "ht", True), (("k",), "both", False)]),
]


@pytest.mark.parametrize("name,d,wanted,loss_on,oft", [
    pytest.param(p.values[0], p.values[1], *subset, id=f"{p.id}-{'+'.join(subset[0])}-loss_{subset[1]}"
                 + ("" if subset[2] else "-no_ht"))
    for p in params(GRADIENT_SUBSETS) for subset in p.values[2]])
def test_only_the_gradients_asked_for(name, d, wanted, loss_on, oft):
    """Only some inputs require grad ("h0": the initial states; "all": every one), the loss uses o,
    the final states or both: each gradient asked for is returned and right, and no other."""
    spec, fn = kernel(name)
    x = draw(spec, d)
    every, inputs = wanted == ("all",), [s.name for s in spec.inputs]
    kw = dict(grads=None if every else [n for n in wanted if n in inputs], h0_grad=every or "h0" in wanted,
              loss_on=loss_on)
    got = run(fn, x, oft, **kw)
    asked = {"d" + n: every or n in wanted for n in inputs}
    asked.update({key: every or "h0" in wanted for key in spec.initial_state_grad_names()})
    for key, want in asked.items():
        assert (got[key] is not None) == want, f"{key}: returned {'no ' * (got[key] is None)}gradient"
        if want and loss_on != "ht":
            assert torch.isfinite(got[key]).all() and got[key].abs().max() > 0, f"{key}: zero or not finite"
    if every and loss_on == "ht":
        assert got["d" + inputs[0]].abs().max() == 0, f"d{inputs[0]} must be zero when only the final state is used"
    assert_matches_reference(spec, got, reference(spec, x, oft, **kw), FP32)


BAD_ARGUMENTS = [   # the inputs come with an initial state (and ask for the final state), the bad arguments
    (GLA_CHUNKED, True, ["k_narrow", "v_batch", "g_time", "h0_transposed", "v_fp16", "q_ndim", "empty", "all_int32"]),
    (["rwkv6-chunk"], True, ["k_narrow", "v_batch", "w_time", "u_one_head", "h0_transposed", "v_fp16", "r_ndim",
                             "empty"]),
    (["simple_gla-chunk"], False, ["v_time", "g_per_channel", "g_fp16", "state_wrong_shape", "q_ndim", "empty"]),
    (CHUNKED_LINEAR, False, ["v_time", "v_fp16", "state_wrong_shape", "q_ndim", "empty", "state_not_tensor"]),
    (["gla-fused_recurrent"], False, ["v_time", "g_one_channel", "k_fp16"]),
    (["simple_gla-fused_recurrent"], False, ["g_extra_dim", "state_wrong_shape"]),
    (["linear_attn-fused_recurrent"], False, ["k_ndim", "q_int64"]),
    (["rwkv6-fused_recurrent"], False, ["v_time", "u_one_head", "k_fp16", "state_wrong_shape", "w_ndim"]),
    (["gsa-fused_recurrent", "gsa-chunk"], False, ["v_time", "s_narrow", "g_narrow", "k_fp16", "hk_narrow",
                                                   "hv_transposed", "state_not_pair", "q_ndim", "empty"]),
    (DELTA_FAMILY + DELTA_CHUNKED, True, ["beta_time", "beta_extra_dim", "k_fp16", "h0_transposed", "empty"]),
    (DELTA_FAMILY[1:] + DELTA_CHUNKED[1:], False, ["g_time", "beta_fp16"]),
]
ONE_INPUT = {   # "<input>_<how>": that input made so
    "time": lambda t: t[:, :5],                 # fewer steps than the others
    "batch": lambda t: torch.cat([t, t]),       # a batch twice the others'
    "ndim": lambda t: t[0],                     # one dimension fewer
    "narrow": lambda t: t[..., :8],             # a last dimension of 8 (16 elsewhere)
    "one_channel": lambda t: t[..., :1],
    "one_head": lambda t: t[:1],
    "extra_dim": lambda t: t[..., None],
    "per_channel": lambda t: t[..., None].expand(*t.shape, 16),
    "fp16": lambda t: t.half(),                 # a dtype the others don't have
    "int64": lambda t: t.long(),
}


def zero_states(x):
    return [torch.zeros([x.case.dims()[d] for d in s.shape], device=DEVICE) for s in x.spec.states]


WHOLE_CALL = {   # the others: (arguments by name, initial state, inputs) -> (arguments, initial state)
    "empty": lambda a, h0, x: ({n: t[:, :0] if n in x.spec.sequence_inputs() else t for n, t in a.items()}, h0),
    "all_int32": lambda a, h0, x: ({n: t.to(torch.int32) for n, t in a.items()}, h0),
    "h0_transposed": lambda a, h0, x: (a, h0.transpose(-1, -2)),
    "state_wrong_shape": lambda a, h0, x: (a, torch.zeros(1, 2, 8, 16, device=DEVICE)),
    "state_not_tensor": lambda a, h0, x: (a, [[0.0]]),
    "hk_narrow": lambda a, h0, x: (a, (zero_states(x)[0][..., :8], zero_states(x)[1])),
    "hv_transposed": lambda a, h0, x: (a, (zero_states(x)[0], zero_states(x)[1].transpose(-1, -2))),
    "state_not_pair": lambda a, h0, x: (a, zero_states(x)[0]),
}


@pytest.mark.parametrize("name,with_h0,bad", [pytest.param(p.values[0], p.values[1], bad, id=f"{p.id}-{bad}")
                                              for p in params(BAD_ARGUMENTS) for bad in p.values[2]])
def test_rejects_bad_arguments(name, with_h0, bad):
    """A ValueError of one line that starts with the public function's name."""
    spec, fn = kernel(name)
    x = make_inputs(spec, 1, 8, 2, 16, 8, FP32, h0=with_h0, M=16)
    args, state = dict(zip(x.tensors, x.args())), x.initial_state()
    target, _, how = bad.partition("_")
    if target in args and how in ONE_INPUT:
        args[target] = ONE_INPUT[how](args[target])
    else:
        args, state = WHOLE_CALL[bad](args, state, x)
    with pytest.raises(ValueError) as info:
        fn(*args.values(), initial_state=state, output_final_state=with_h0)
    message = str(info.value)
    assert message.startswith(fn.__name__) and "\n" not in message, message


VARIANTS_AGREE = {   # op: inputs, scale
    "gsa": (Draw(1, 40, 1, 16, 16, FP32, "normal", 6, M=32), None),
    "linear_attn": (Draw(1, 71, 1, 16, 16, FP32, "normal", 5), 0.4),
    "simple_gla": (Draw(1, 71, 1, 16, 16, FP32, "normal", 5), 0.4),
    "delta_rule": (Draw(1, 71, 1, 16, 16, FP32, "normal", 5), 0.4),
    "gated_delta_rule": (Draw(1, 71, 1, 16, 16, FP32, "normal", 5), 0.4),
}


@pytest.mark.parametrize("op", VARIANTS_AGREE)
def test_variants_agree(op):
    """Every variant of the op on the same inputs with the same scale: each within fp32 precision
    of the first declared one, either taken as the reference."""
    spec, (d, scale) = OPS[op], VARIANTS_AGREE[op]
    x = draw(spec, d)
    results = {variant: run(spec.variant_fn(variant), x, True, scale=scale) for variant in spec.variants}
    first, *others = spec.variants
    for variant in others:
        for key, t in results[first].items():
            assert_close(f"{key} ({variant} vs {first})", results[variant][key], t, 1e-5)
            assert_close(f"{key} ({first} vs {variant})", t, results[variant][key], 1e-5)


TABLES = {"REFERENCE_CASES": REFERENCE_CASES, "UNCHANGED": UNCHANGED, "STRIDED": STRIDED,
          "GRADIENT_SUBSETS": GRADIENT_SUBSETS, "BAD_ARGUMENTS": BAD_ARGUMENTS}   # each names every kernel


@pytest.mark.parametrize("table", TABLES)
def test_every_declared_kernel_has_cases(table):
    named = {name for kernels, *_ in TABLES[table] for name in kernels}
    assert named == set(KERNELS), (f"{table}: no cases for {sorted(set(KERNELS) - named)}; "
                                   f"not declared: {sorted(named - set(KERNELS))}")
