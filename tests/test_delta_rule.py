"""The delta-rule family (delta_rule, gated_delta_rule, kda): what its references and kernels
promise beyond the checks every op's get (tests/test_references.py: the WY chunked form equals
the loop, gradcheck; tests/test_kernels.py: every kernel against the float64 loop).

The loops are the definition (two steps by hand), the in-call L2 normalisation of q and k is
upstream's, the kernels take packed batches and a float32 beta beside bf16 inputs, and the
harness fails planted bugs (a beta gradient without its correction term, a key that reads the
undecayed state, chunks whose corrected values forget their entering state) on the right tensor and passes the same loop without them.
The gated ops also take upstream's in-call gate (from A_log and dt_bias, passed by name) and beta
from its logit (in (0, 2) with allow_neg_eigval): references, kernels and planted bugs of both.
"""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from harness.cases import Case
from harness.declaration import load_function
from harness.registry import OPS
from harness.runner import Implementation, run_case
from fla_kernels.ops.common import chunk_pairs
from fla_kernels.ops.common.chunk_delta import unit_lower_inverse
from fla_kernels.ops.common.chunk_pairs import SPLIT_SPAN
from fla_kernels.ops.common.tiles import load_rows, store_rows
from references.delta import call_gate_and_beta, l2_normalise
from references.gated_delta_rule import gated_delta_rule_chunked, gated_delta_rule_recurrent
from references.kda import kda_chunked, kda_recurrent
from tests.kernel_testing import (DEVICE, REL_TOL, assert_close, assert_matches_reference, emulated, make_inputs,
                                  reference, run)

FAMILY = ["delta_rule", "gated_delta_rule", "kda"]


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_kda_loop_is_the_definition():
    """Two steps by hand: S_t = (I - beta_t k_t^T k_t) diag(exp(g_t)) S_{t-1} + beta_t k_t^T v_t,
    the key reading the decayed state; o_t = scale q_t S_t."""
    gen = torch.Generator().manual_seed(0)
    q, k, g = (torch.randn(1, 2, 1, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    k, g = F.normalize(k, dim=-1), F.logsigmoid(g)
    v = torch.randn(1, 2, 1, 2, generator=gen, dtype=torch.float64)
    beta = torch.rand(1, 2, 1, generator=gen, dtype=torch.float64)
    h0 = torch.randn(1, 1, 3, 2, generator=gen, dtype=torch.float64)
    o, ht = kda_recurrent(q, k, v, g, beta, scale=0.5, initial_state=h0, output_final_state=True)
    S = h0[0, 0]
    for t in range(2):
        kt, b = k[0, t, 0], beta[0, t, 0]
        S = (torch.eye(3, dtype=torch.float64) - b * torch.outer(kt, kt)) @ torch.diag(g[0, t, 0].exp()) @ S
        S = S + b * torch.outer(kt, v[0, t, 0])
        assert torch.allclose(o[0, t, 0], 0.5 * q[0, t, 0] @ S, rtol=1e-12, atol=1e-15)
    assert torch.allclose(ht[0, 0], S, rtol=1e-12, atol=1e-15)


def test_a_gate_per_channel_equal_across_k_is_the_scalar_gate():
    """kda with g_t the same in every key channel is gated_delta_rule with that g_t."""
    gen = torch.Generator().manual_seed(1)
    q, k = (F.normalize(torch.randn(2, 19, 2, 4, generator=gen, dtype=torch.float64), dim=-1) for _ in range(2))
    v = torch.randn(2, 19, 2, 3, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(2, 19, 2, generator=gen, dtype=torch.float64))
    beta = torch.rand(2, 19, 2, generator=gen, dtype=torch.float64)
    for gated, kda in ((gated_delta_rule_recurrent, kda_recurrent), (gated_delta_rule_chunked, kda_chunked)):
        o1, s1 = gated(q, k, v, g, beta, output_final_state=True)
        o2, s2 = kda(q, k, v, g[..., None].expand(-1, -1, -1, 4), beta, output_final_state=True)
        assert rel(o2, o1) < 1e-13 and rel(s2, s1) < 1e-13


@pytest.mark.parametrize("op", FAMILY)
def test_in_call_l2_normalisation(op):
    """use_qk_l2norm_in_kernel: the loop and the chunked form on raw q, k equal the loop on q, k
    divided by sqrt(sum of squares + 1e-6), as upstream normalises them."""
    spec = OPS[op]
    x = make_inputs(spec.under("use_qk_l2norm_in_kernel"), 2, 21, 2, 5, 3, torch.float32, "normal", True, seed=2)
    args, h0 = x.args(torch.float64), x.initial_state(torch.float64)
    loop, chunked = load_function(spec.reference_loop), load_function(spec.reference_chunked)
    want, _ = loop(*[l2_normalise(a) if i < 2 else a for i, a in enumerate(args)], initial_state=h0)
    for fn in (loop, lambda *a, **kw: chunked(*a, chunk_size=8, **kw)):
        got, _ = fn(*args, initial_state=h0, use_qk_l2norm_in_kernel=True)
        assert rel(got, want) < 1e-12


@pytest.mark.parametrize("op,variant", [("delta_rule", "fused_recurrent"), ("kda", "fused_recurrent"),
                                        ("gated_delta_rule", "chunk"), ("kda", "chunk")])
def test_kernel_with_in_call_l2_normalisation(op, variant):
    """The kernel with use_qk_l2norm_in_kernel on raw q, k against the reference with it, fp32:
    every output and gradient (dq, dk through the normalisation)."""
    spec = OPS[op].under("use_qk_l2norm_in_kernel")
    x = make_inputs(spec, 1, 12, 2, 16, 8, torch.float32, "normal", True, seed=3)
    fn = spec.variant_fn(variant)

    def call(*args, **kw):
        return fn(*args, use_qk_l2norm_in_kernel=True, **kw)

    def ref(*args, **kw):
        return load_function(spec.reference_loop)(*args, use_qk_l2norm_in_kernel=True, **kw)
    assert_matches_reference(spec, run(call, x), run(ref, x, dtype=torch.float64), torch.float32)


@pytest.mark.parametrize("op,lengths,variant", [("kda", [1, 20, 66], "fused_recurrent"),
                                               ("delta_rule", [5, 11], "fused_recurrent"),
                                               ("gated_delta_rule", [1, 20, 70], "chunk"),
                                               ("kda", [1, 20, 70], "chunk")])
def test_packed_sequences_equal_each_alone(op, lengths, variant):
    """cu_seqlens: every output and gradient equals the float64 loop run sequence by sequence,
    each from its own initial state (one sequence of length 1, one past a 64-token chunk)."""
    spec = OPS[op]
    T, N = sum(lengths), len(lengths)
    x = make_inputs(spec, 1, T, 2, 16, 8, torch.float32, "strong", False, seed=4)
    gen = torch.Generator().manual_seed(5)
    h0, dht = (torch.randn(N, 2, 16, 8, generator=gen).to(DEVICE) for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    leaves = [t.clone().requires_grad_() for t in x.args()]
    h0_leaf = h0.clone().requires_grad_()
    o, ht = spec.variant_fn(variant)(*leaves, initial_state=h0_leaf, output_final_state=True, cu_seqlens=cu)
    torch.autograd.backward([o, ht], [x.do, dht])
    loop = load_function(spec.reference_loop)
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        parts = [t[:, a:b].detach().double().requires_grad_() for t in x.args()]
        s0 = h0[n:n + 1].double().requires_grad_()
        o64, ht64 = loop(*parts, initial_state=s0, output_final_state=True)
        torch.autograd.backward([o64, ht64], [x.do[:, a:b].double(), dht[n:n + 1].double()])
        assert_close(f"o (sequence {n})", o[:, a:b], o64, REL_TOL[torch.float32])
        assert_close(f"ht (sequence {n})", ht[n:n + 1], ht64, REL_TOL[torch.float32])
        assert_close(f"dh0 (sequence {n})", h0_leaf.grad[n:n + 1], s0.grad, REL_TOL[torch.float32])
        for s, leaf, part in zip(spec.inputs, leaves, parts):
            assert_close(f"d{s.name} (sequence {n})", leaf.grad[:, a:b], part.grad, REL_TOL[torch.float32])


@pytest.mark.parametrize("variant", ["fused_recurrent", "chunk"])
def test_float32_beta_beside_bf16_inputs(variant):
    """beta (and g) float32 beside bf16 q, k, v, as layers may compute them: dbeta and dg come
    back float32, never rounded to bf16, the rest bf16. In the interpreter (IEEE products) they
    are float32-precise; on a GPU the chunked form's products of computed operands run in tf32
    (10-bit operands), which bounds them at 2^-9 of their largest value."""
    spec = OPS["gated_delta_rule"]
    x = make_inputs(spec, 1, 9, 2, 16, 16, torch.float32, "normal", True, seed=6)
    wide = ("g", "beta")
    x = x.replace(**{n: t if n in wide else t.to(torch.bfloat16) for n, t in x.drawn.tensors.items()})
    x.drawn = dataclasses.replace(x.drawn, do=x.drawn.do.to(torch.bfloat16))
    got = run(spec.variant_fn(variant), x)
    want = reference(spec, x)
    tf32_products = DEVICE == "cuda" and variant == "chunk"
    for name in ("dg", "dbeta"):
        assert got[name].dtype == torch.float32
        assert not torch.equal(got[name], got[name].bfloat16().float()), f"{name} was rounded to bf16"
        assert_close(name, got[name], want[name], 2.0 ** -9 if tf32_products else REL_TOL[torch.float32])
    assert got["dq"].dtype == got["o"].dtype == torch.bfloat16
    assert_close("o", got["o"], want["o"], REL_TOL[torch.bfloat16])


@pytest.mark.parametrize("op", ["delta_rule", "gated_delta_rule", "kda"])
def test_chunk_kernels_at_every_block_shape(op):
    """The chunked kernels in bf16 against the float64 loop at head sizes that change their blocks
    and warps: K in one block of 16 to 256, V in one to eight V-blocks (32 or, in kda's walks, 64
    wide) under 4 or 8 warps (`_settings`), K in the backward's per-chunk kernels in one or more
    64-wide key blocks (K = 100: two, the second cut short). Triton 3.6 on the H100 miscompiled a
    sum over two or more V blocks with 4 warps, and 16-wide V blocks with 8 warps
    (ops/common/chunk_delta.py). The interpreter runs a shape with two V blocks and one with two
    key blocks; a GPU runs them all."""
    spec = OPS[op]
    shapes = ([(16, 64), (100, 16)] if DEVICE == "cpu"
              else [(K, V) for K in (16, 32, 64, 100, 128, 256) for V in (16, 64, 256)])
    for K, V in shapes:
        x = make_inputs(spec, 1, 70, 2, K, V, torch.bfloat16, "normal", True, seed=7)
        try:
            assert_matches_reference(spec, run(spec.variant_fn("chunk"), x), reference(spec, x), torch.bfloat16)
        except AssertionError as error:
            raise AssertionError(f"K={K} V={V}: {error}") from None


@pytest.mark.parametrize("variant", ["chunk", "fused_recurrent"])
@pytest.mark.parametrize("op", FAMILY)
def test_a_key_head_wider_than_upstreams_limit_is_refused_before_any_launch(op, variant):
    """K past WIDEST_KEY_HEAD (256, upstream's limit; the block-shape test runs K = 256 on a GPU):
    one line naming the op and K, raised before any kernel launches."""
    from fla_kernels.ops.common.chunk_delta import WIDEST_KEY_HEAD
    from tests.gpu_compile import recording_launches
    K = WIDEST_KEY_HEAD + 8
    q, k = (torch.randn(1, 8, 1, K, device=DEVICE) for _ in range(2))
    v, beta = torch.randn(1, 8, 1, 16, device=DEVICE), torch.rand(1, 8, 1, device=DEVICE)
    gate = {"delta_rule": (), "gated_delta_rule": (-torch.rand(1, 8, 1, device=DEVICE),),
            "kda": (-torch.rand(1, 8, 1, K, device=DEVICE),)}[op]
    fn = OPS[op].variant_fn(variant)
    with recording_launches() as launches, pytest.raises(ValueError) as info:
        fn(q, k, v, *gate, beta)
    assert str(info.value) == (f"{fn.__name__}: K = {K} is wider than {WIDEST_KEY_HEAD}, the widest key "
                               "head these kernels take (upstream's limit too).")
    assert launches == []


def failing_rows(op, target, dtype="fp32", variant="fused_recurrent", option="none"):
    """{(check, tensor): row} of the golden rows of `target` ("module:function") that do not
    pass, on one case with an initial state under strong gates (beta near 0 and 1)."""
    case = Case(op=op, dtype=dtype, B=1, T=20, H=2, K=8, V=8, h0="grad", gate="strong", seed=0, option=option)
    rows = run_case(OPS[op], case, [Implementation(variant, target, load_function(target))],
                    torch.device(DEVICE), checks=())
    assert rows
    return {(r["check"], r["tensor"]): r for r in rows if r["verdict"] != "PASS"}


def sweep_failures(op, planted, dtype="fp32", variant="fused_recurrent", option="none"):
    """{(check, tensor)} of the rows of a planted implementation that do not pass (`failing_rows`)."""
    return set(failing_rows(op, f"tests.planted_kernels:{planted}", dtype, variant, option))


@pytest.mark.parametrize("op,correct", [("delta_rule", "delta_rule_like"), ("kda", "kda_like"),
                                        ("delta_rule", "delta_rule_chunks_like")])
def test_the_planted_loops_without_their_bugs_pass(op, correct):
    assert sweep_failures(op, correct) == set()


def test_chunks_whose_corrected_values_drop_the_entering_state_fail_o():
    """U = u instead of u - w h: each chunk's corrected values forget the state it starts from."""
    failed = sweep_failures("delta_rule", "delta_rule_chunks_without_state_correction", variant="chunk")
    assert {("golden", "o"), ("golden", "ht"), ("golden", "dh0")} <= failed, failed


def test_a_triangular_solve_one_row_short_fails_o():
    """Each chunk's last row of (I + A)^{-1} left as the identity's: the chunks' last tokens write
    uncorrected values into the state."""
    failed = sweep_failures("delta_rule", "delta_rule_chunks_solving_one_row_short", variant="chunk")
    assert {("golden", "o"), ("golden", "ht"), ("golden", "dv")} <= failed, failed


def test_a_beta_gradient_without_its_correction_fails_dbeta_only():
    failed = sweep_failures("delta_rule", "delta_rule_beta_grad_without_correction")
    assert ("golden", "dbeta") in failed
    assert all(tensor.startswith("dbeta") for _, tensor in failed), failed


def test_a_key_reading_the_undecayed_state_fails_o():
    failed = sweep_failures("kda", "kda_key_reads_undecayed_state")
    assert {("golden", "o"), ("golden", "ht"), ("golden", "dg")} <= failed, failed


IN_CALL = ["use_beta_sigmoid_in_kernel", "allow_neg_eigval", "use_gate_in_kernel"]


def test_the_in_call_gate_and_beta_are_their_definitions():
    """use_gate_in_kernel: g = -exp(A_log) softplus(g + dt_bias) per head (kda: dt_bias [H * K]
    per channel); use_beta_sigmoid_in_kernel: beta = sigmoid(beta), allow_neg_eigval 2 sigmoid(beta);
    allow_neg_eigval alone refused, as upstream refuses it."""
    gen = torch.Generator().manual_seed(6)
    g, beta = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64), torch.randn(2, 5, 3, generator=gen,
                                                                                   dtype=torch.float64)
    A_log, dt_bias = torch.randn(3, generator=gen, dtype=torch.float64), torch.randn(3, generator=gen,
                                                                                    dtype=torch.float64)
    got_g, got_beta = call_gate_and_beta(g, beta, True, A_log, dt_bias, True, True)
    for h in range(3):
        want = -A_log[h].exp() * torch.log1p(torch.exp(g[..., h] + dt_bias[h]))
        assert torch.allclose(got_g[..., h], want, rtol=1e-14)
    assert torch.allclose(got_beta, 2 / (1 + torch.exp(-beta)), rtol=1e-14)
    gk, bias_k = torch.randn(2, 5, 3, 4, generator=gen, dtype=torch.float64), torch.randn(12, generator=gen,
                                                                                        dtype=torch.float64)
    got_gk, _ = call_gate_and_beta(gk, beta, True, A_log, bias_k)
    assert torch.allclose(got_gk, -A_log[:, None].exp() * F.softplus(gk + bias_k.view(3, 4)), rtol=1e-14)
    with pytest.raises(ValueError, match="requires use_beta_sigmoid_in_kernel"):
        call_gate_and_beta(g, beta, allow_neg_eigval=True)


@pytest.mark.parametrize("option", IN_CALL)
def test_references_under_the_in_call_options_pass_gradcheck(option):
    """The chunked reference under each option: gradcheck in every input (A_log and dt_bias included)."""
    spec = OPS["gated_delta_rule"].under(option)
    gen = torch.Generator().manual_seed(7)
    shapes = {s.name: spec.shape_of(s, dict(B=1, T=5, H=2, K=3, V=2)) for s in spec.inputs}
    kwargs = spec.option_spec().kwargs
    leaves = {n: torch.randn(shp, generator=gen, dtype=torch.float64).requires_grad_() for n, shp in shapes.items()}
    named = [s.name for s in spec.inputs if s.keyword]
    order = [n for n in shapes if n not in named]
    leaves["k"] = F.normalize(leaves["k"].detach(), dim=-1).requires_grad_()

    def fn(*xs):
        given = dict(zip(order + named, xs))
        o, ht = gated_delta_rule_chunked(*[given[n] for n in order], output_final_state=True, chunk_size=2,
                                         **{n: given[n] for n in named}, **kwargs)
        return o, ht
    assert torch.autograd.gradcheck(fn, [leaves[n] for n in order + named])


@pytest.mark.parametrize("op,variant,option", [("gated_delta_rule", "chunk", o) for o in IN_CALL] + [
    ("gated_delta_rule", "fused_recurrent", "use_gate_in_kernel"), ("kda", "chunk", "allow_neg_eigval"),
    ("kda", "fused_recurrent", "use_beta_sigmoid_in_kernel")])
def test_kernels_under_the_in_call_options_pass(op, variant, option):
    """Our kernels take upstream's in-call gate and beta: every golden row passes, dA_log and
    ddt_bias among them."""
    target = OPS[op].variants[variant]
    assert failing_rows(op, target, variant=variant, option=option) == {}


def test_a_packed_batch_under_the_in_call_gate_passes():
    """A_log and dt_bias, passed by name, reach every sequence's call of the references and of the
    packing check's sequence-by-sequence run whole: golden and packing rows pass."""
    case = Case(op="gated_delta_rule", dtype="fp32", B=2, T=20, H=2, K=8, V=8, h0="grad", gate="strong",
                seed=0, varlen="packed", option="use_gate_in_kernel")
    target = OPS["gated_delta_rule"].variants["chunk"]
    rows = run_case(OPS["gated_delta_rule"], case, [Implementation("chunk", target, load_function(target))],
                    torch.device(DEVICE), checks=("packing",))
    assert {"golden", "packing"} <= {r["check"] for r in rows}
    assert {"dA_log", "ddt_bias"} <= {r["tensor"] for r in rows}
    assert all(r["verdict"] == "PASS" for r in rows), [(r["check"], r["tensor"], r["message"]) for r in rows
                                                      if r["verdict"] != "PASS"]


def test_the_in_call_options_are_refused_before_any_launch():
    from tests.gpu_compile import recording_launches
    fn = OPS["gated_delta_rule"].variant_fn("chunk")
    q, k = (F.normalize(torch.randn(1, 8, 2, 16, device=DEVICE), dim=-1) for _ in range(2))
    v, g, beta = torch.randn(1, 8, 2, 16, device=DEVICE), torch.randn(1, 8, 2, device=DEVICE), torch.randn(1, 8, 2,
                                                                                                        device=DEVICE)
    with recording_launches() as launches:
        with pytest.raises(ValueError, match="allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"):
            fn(q, k, v, g, beta, allow_neg_eigval=True)
        with pytest.raises(ValueError, match=r"takes A_log \[H\] = \[2\], got None"):
            fn(q, k, v, g, beta, use_gate_in_kernel=True)
        with pytest.raises(ValueError, match=r"takes dt_bias \[H\] = \[2\], got \[3\]"):
            fn(q, k, v, g, beta, use_gate_in_kernel=True, A_log=torch.zeros(2, device=DEVICE),
               dt_bias=torch.zeros(3, device=DEVICE))
    assert launches == []


@pytest.mark.parametrize("option", IN_CALL)
def test_the_planted_loop_passes_every_in_call_option(option):
    assert sweep_failures("gated_delta_rule", "gated_delta_rule_like", option=option) == set()


def test_allow_neg_eigval_ignored_fails_o_under_that_option_alone():
    """beta left in (0, 1) under allow_neg_eigval: o and the state fail; with the logit alone it passes."""
    failed = sweep_failures("gated_delta_rule", "gated_delta_rule_neg_eigval_ignored", option="allow_neg_eigval")
    assert {("golden", "o"), ("golden", "ht"), ("golden", "dbeta")} <= failed, failed
    assert sweep_failures("gated_delta_rule", "gated_delta_rule_neg_eigval_ignored",
                          option="use_beta_sigmoid_in_kernel") == set()


def test_a_dropped_bias_gradient_fails_ddt_bias_alone():
    failed = failing_rows("gated_delta_rule", "tests.planted_kernels:gated_delta_rule_bias_gradient_dropped",
                          option="use_gate_in_kernel")
    assert list(failed) == [("golden", "ddt_bias")], list(failed)
    assert "returned no tensor (None) where the golden has one" in failed["golden", "ddt_bias"]["message"]


def test_A_log_taken_for_A_fails_o_and_dA_log():
    failed = sweep_failures("gated_delta_rule", "gated_delta_rule_A_log_as_A", option="use_gate_in_kernel")
    assert {("golden", "o"), ("golden", "ht"), ("golden", "dA_log")} <= failed, failed


@triton.jit
def _solve_kernel(A, Ti, scratch, T, BT: tl.constexpr):
    b_A = load_rows(A, 0, 0, T, 1, BT, BT, BT, 0)
    store_rows(Ti, unit_lower_inverse(b_A, scratch, 0, tl.program_id(0) * BT, T, 1, BT), 0, 0, T, 1,
               BT, BT, BT, 0)


def test_the_chunk_solve_is_as_accurate_as_float32_allows():
    """`unit_lower_inverse` against the float64 inverse of I + A, A = strictly_lower(diag(beta) K K^T)
    of unit keys, with beta near 1 and keys alike (Ti's entries grow along the chunk): within two
    float32 epsilons of its largest entry (measured at most 0.72 here over 40 draws; the other
    association of its block substitution reached 2.4, the 64-row solve it replaced 1.3; the
    margin is for another CPU's or the GPU's summation order), and a chunk cut short at T = 40
    leaves zero rows past T."""
    torch.manual_seed(0)
    for trial in range(8):
        k = F.normalize(torch.randn(64, 64, dtype=torch.float64) + trial * 0.3, dim=-1)
        beta = torch.sigmoid(torch.randn(64, dtype=torch.float64) + 2)
        A = torch.tril(beta[:, None] * (k @ k.T), -1).float()
        for T in (64, 40):
            Ti, scratch = torch.zeros(1, 64, 1, 64, device=DEVICE), torch.zeros(1, 64, 1, 64, device=DEVICE)
            _solve_kernel[(1,)](A[None, :, None].to(DEVICE), Ti, scratch, T, BT=64)
            want = torch.linalg.inv(torch.eye(T, dtype=torch.float64) + A[:T, :T].double())
            got = Ti.view(64, 64).double().cpu()
            err = (got[:T, :T] - want).abs().max() / want.abs().max()
            assert err <= 2 * torch.finfo(torch.float32).eps, f"trial {trial}, T={T}: {err:.3g}"
            assert not got[T:].any()


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("gate", ["strong", "extreme"])
def test_kda_chunks_pass_where_blocks_decay_steeply_over_several_key_blocks(dtype, gate):
    """kda's chunk kernels where a 16-row block decays by more than SPLIT_SPAN (the pair kernels'
    column loop) and K takes two of their key blocks (their loop over key blocks runs twice): every
    row passes. On an H100 (Triton 3.6) a tree whose pairs took that path failed o by 100-1000
    times its bound from K = 48 on, and passed at K = 8 and 24 and under the interpreter
    (benchmarks/tuning.md, 2026-11-28): a GPU run of this test is what sees such a compile."""
    spec = OPS["kda"]
    case = Case(op="kda", dtype=dtype, B=1, T=65, H=1, K=64, V=16, h0="grad", gate=gate, seed=0)
    impl = Implementation("chunk", spec.variants["chunk"], load_function(spec.variants["chunk"]))
    rows = run_case(spec, case, [impl], torch.device(DEVICE), checks=())
    failed = [(r["check"], r["tensor"], r.get("ratio")) for r in rows if r["verdict"] != "PASS"]
    assert rows and not failed, failed


STEEP_BLOCK = slice(16, 32)   # the second 16-row block of the first chunk


def _one_steep_block(dtype):
    """kda inputs (T = 70, K = 64: two of the pair kernels' key blocks) under the normal gate but
    -8 a step in every channel of rows 16-31: that block decays by 120 (past SPLIT_SPAN), its
    neighbours by far less."""
    spec = OPS["kda"]
    x = make_inputs(spec, 1, 70, 2, 64, 16, dtype, "normal", True, seed=3)
    g = x.drawn.tensors["g"].clone()
    g[:, STEEP_BLOCK] = -8.0
    span = [-g[:, r].double().sum(1).min().item() for r in (slice(1, 16), slice(17, 32), slice(33, 48))]
    assert span[1] > SPLIT_SPAN.value > max(span[0], span[2]), span
    return spec, x.replace(g=g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kda_pair_blocks_each_take_their_own_path(dtype):
    """kda's pair kernels split a 16-row block's exponent at its first row where the block decays
    by at most SPLIT_SPAN and sum it a column at a time past that, block by block: one steep
    block among mild ones mixes both paths in one chunk, and every result matches the float64
    loop."""
    spec, x = _one_steep_block(dtype)
    assert_matches_reference(spec, run(spec.variant_fn("chunk"), x), reference(spec, x), dtype)


@pytest.mark.skipif(DEVICE != "cpu", reason="patches a constant the interpreter reads at each call")
def test_a_steep_block_split_at_its_first_row_fails(monkeypatch):
    """The same inputs with every block's exponent split at its first row, however steep
    (SPLIT_SPAN lifted): exp(120) overflows float32 and the results are not finite."""
    monkeypatch.setattr(chunk_pairs, "SPLIT_SPAN", tl.constexpr(1e9))
    spec, x = _one_steep_block(torch.float32)
    with pytest.raises(AssertionError, match="NaN/Inf"):
        assert_matches_reference(spec, run(spec.variant_fn("chunk"), x), reference(spec, x), torch.float32)


@pytest.mark.parametrize("packed", [False, True])
def test_kda_forward_without_autograd_stores_nothing_for_a_backward(monkeypatch, packed):
    """kda's chunk forward writes o from the state walk, no output kernel; under no_grad the
    walk stores neither the states nor U (`_fwd_walk_kernel`'s STORE off), a path of its
    own, which on the GPU too gives the same o and final state as the forward autograd records,
    here bit for bit (two V-blocks, several chunks, an initial state; plain and packed)."""
    from fla_kernels.ops.common import chunk_delta
    from fla_kernels.ops.kda import chunk_kda
    launched = []
    launch = chunk_delta.launch

    def recording(kernel, grid, *args, **kwargs):
        launched.append((kernel.fn.__name__, kwargs.get("STORE")))
        return launch(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(chunk_delta, "launch", recording)
    torch.manual_seed(0)
    B, T, H, K, V = (1, 200, 2, 64, 96) if packed else (2, 130, 2, 64, 96)
    N = 3 if packed else B
    q = torch.randn(B, T, H, K, device=DEVICE, dtype=torch.bfloat16)
    k = F.normalize(torch.randn(B, T, H, K, device=DEVICE), dim=-1).to(torch.bfloat16)
    v = torch.randn(B, T, H, V, device=DEVICE, dtype=torch.bfloat16)
    g = (F.logsigmoid(torch.randn(B, T, H, K, device=DEVICE)) / 4).to(torch.bfloat16)
    beta = torch.rand(B, T, H, device=DEVICE).sigmoid().to(torch.bfloat16)
    h0 = torch.randn(N, H, K, V, device=DEVICE, requires_grad=True)
    extra = dict(cu_seqlens=torch.tensor([0, 20, 150, 200], device=DEVICE)) if packed else {}
    o, ht = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, **extra)
    assert {x for x in launched if x[0] == "_fwd_walk_kernel"} == {("_fwd_walk_kernel", True)}, launched
    assert "_fwd_output_kernel" not in {x[0] for x in launched}, launched
    launched.clear()
    with torch.no_grad():
        o_inference, ht_inference = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                              **extra)
    assert {x for x in launched if x[0] == "_fwd_walk_kernel"} == {("_fwd_walk_kernel", False)}, launched
    assert "_fwd_output_kernel" not in {x[0] for x in launched}, launched
    assert torch.equal(o_inference, o.detach()) and torch.equal(ht_inference, ht.detach())


def test_fp16_tf32_tiles_give_what_float32_operands_give():
    """The delta walks' computed operands, U and (bf16 inputs) dU travel in fp16 with a
    power-of-two scale per tile, and so do the scalar gates' states without autograd, and
    delta_rule's in training too (bf16 inputs) (ops/common/tf32_storage.py); with the tensor
    cores emulated on a CPU o, the final state and every gradient are the same bit for bit as
    with float32 operands (on a GPU within a rounding: the walks take them in fp16
    products, which accumulate otherwise than tf32 ones), and o and the final state without
    autograd are training's. Tested both ways: walks that forget their operands' scales
    give another o; readers that forget the states' and U's give other gradients, and for the
    scalar gates another o (kda's walk writes o itself; gated_delta_rule's training states stay
    float32, so its o without autograd is no longer training's); readers that forget dU's give
    other gradients."""
    ours = emulated("tf32_tiles")
    assert ours == {"kda": [True] * 5, "gated_delta_rule": [True] * 5, "delta_rule": [True] * 5}, ours
    planted = emulated("tf32_tiles", "unit_scales")
    assert all(used and not same_o for same_o, _, _, _, used in planted.values()), planted
    states = emulated("tf32_tiles", "unit_state_scales")
    assert states == {"kda": [True, True, False, True, True],
                      "gated_delta_rule": [False, True, False, False, True],
                      "delta_rule": [False, True, False, True, True]}, states
    du = emulated("tf32_tiles", "unscaled_du")
    assert du == {op: [True, True, False, True, True] for op in ("kda", "gated_delta_rule", "delta_rule")}, du


@pytest.mark.parametrize("reverse", [False, True])
def test_chunk_local_cumsums_are_the_float64_sums_rounded_once(reverse):
    """kda's cumulative gate (prefix sums in each chunk of 64) and its gradient's suffix sums:
    T and K that fill neither a chunk nor a key block; each element the float64 sum of its chunk's
    rows rounded once to float32, so no row of another chunk or past T enters."""
    from fla_kernels.ops.common.chunk_delta import chunk_cumgate_channels, chunk_reverse_cumsum
    x = torch.randn(2, 130, 3, 40, device=DEVICE)
    chunks = torch.zeros(2, 192, 3, 40, dtype=torch.float64, device=DEVICE)
    chunks[:, :130] = x
    chunks = chunks.view(2, 3, 64, 3, 40)
    if reverse:
        expected = chunks.flip(2).cumsum(2).flip(2)
        got = chunk_reverse_cumsum(x, 64, torch.float32)
    else:
        expected = chunks.cumsum(2)
        got = chunk_cumgate_channels(x, 64, torch.bfloat16)
    assert torch.equal(got, expected.reshape(2, 192, 3, 40)[:, :130].float())
