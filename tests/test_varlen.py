"""Packed variable-length batches: every chunk and fused_recurrent kernel called with cu_seqlens
(N sequences one after another along T of a batch of one, initial and final states [N, ...]).

Each packed call, with initial states that require grad and the final states in the loss, must
give (a) what the same kernel gives run on each sequence alone (B = 1, its own initial state),
and (b) what the op's float64 reference gives run on each sequence alone, every output and
gradient within REL_TOL of it (tests/kernel_testing.py). The length sets put sequence boundaries
inside chunks, hold a one-token sequence and one longer than a 64-token chunk, and one that fills
a chunk exactly. The options on packed batches, and the gate gradients under extreme decay, are
held to (b). A planted mistake (cu_seqlens one token off) must fail (a), and every bad
cu_seqlens, or initial state that does not match it, is refused with its sentence before any
kernel launches.
"""
from itertools import accumulate

import pytest
import torch

import torch.nn.functional as F

from fla_kernels.utils import check_inputs
from harness.cases import EXTREME_GATE, GATES
from harness.declaration import load_function
from harness.registry import OPS
from tests.kernel_testing import (DEVICE, REL_TOL, assert_close, assert_matches_reference, emulated,
                                  result_names,
                                  state_result_names)

FP32, BF16 = torch.float32, torch.bfloat16
KERNELS = [f"{op}-{variant}" for op in ("linear_attn", "simple_gla", "gla", "rwkv6", "gsa")
           for variant in ("chunk", "fused_recurrent")]
LENGTHS = {"mixed": [1, 23, 70], "full_chunk": [64, 1], "two": [23, 70]}
H, K, V, M = 1, 16, 8, 8
# every kernel in fp32 on the mixed lengths and in bf16 on a full chunk (the whole file stays
# near a minute on two interpreter cores)
CASES = [(name, FP32, "mixed") for name in KERNELS] + [(name, BF16, "full_chunk") for name in KERNELS]
OPTIONS = [("linear_attn", "normalize"), ("simple_gla", "g_gamma"), ("gsa", "g=None")]


def kernel(name, option="none"):
    """(op declaration under `option`, public function) of "op-variant"."""
    op, variant = name.split("-")
    return OPS[op].under(option), OPS[op].variant_fn(variant)


def starts(lengths):
    """cu_seqlens of `lengths` as host integers: [0, l0, l0 + l1, ...]."""
    return list(accumulate(lengths, initial=0))


def draw(spec, lengths, dtype, gate="normal", seed=0, positive=()):
    """(inputs {name: tensor or None}, initial states, do, dhts) of a packed batch of `lengths`,
    from a generator seeded with `seed`: the op's inputs at B = 1, T = sum(lengths) in dtype (log
    gates logsigmoid(randn) / the gate's normaliser, or all EXTREME_GATE; those named in
    `positive` in (0.1, 1.1); those its option leaves out None), do, and one float32 initial
    state and upstream gradient per sequence and state of the op (`positive` ones in (0.1, 1.1))."""
    gen = torch.Generator().manual_seed(seed)
    dims = dict(B=1, T=sum(lengths), H=H, K=K, V=V, M=M)

    def one(name, shape, kind="randn", to=dtype):
        x = torch.rand(shape, generator=gen) + 0.1 if name in positive else torch.randn(shape, generator=gen)
        if kind == "gate":
            x = torch.full_like(x, EXTREME_GATE) if GATES[gate] is None else F.logsigmoid(x) / GATES[gate]
        return x.to(to).to(DEVICE)

    without = spec.option_spec().without
    tensors = {s.name: None if s.name in without else one(s.name, spec.shape_of(s, dims), s.kind)
               for s in spec.inputs}
    state_dims = {**dims, "B": len(lengths)}
    h0, dhts = (tuple(one(s.name, spec.shape_of(s, state_dims), to=torch.float32) for s in spec.states)
                for _ in range(2))
    return tensors, h0, one("do", (1, dims["T"], H, V)), dhts


def forward_backward(fn, spec, tensors, h0, do, dhts, **kw):
    """Every output and gradient of fn (keys `result_names`, None where there is none) under the
    op's option: copies of the tensors (requiring grad where the op gives one) and of the initial
    states requiring grad, the backward of <o, do> + sum <final state, dht>."""
    grads = {s.name for s in spec.inputs if s.grad}
    leaves = {name: None if x is None else x.detach().clone().requires_grad_(name in grads)
              for name, x in tensors.items()}
    states = tuple(s.detach().clone().requires_grad_() for s in h0)
    single = len(states) == 1
    o, finals = fn(*leaves.values(), initial_state=states[0] if single else states,
                   output_final_state=True, **spec.option_spec().kwargs, **kw)
    finals = (finals,) if single else tuple(finals)
    torch.autograd.backward([o, *finals], [do, *dhts])
    values = [o, *finals, *(None if x is None else x.grad for x in leaves.values()),
              *(s.grad for s in states)]
    return {name: None if x is None else x.detach() for name, x in zip(result_names(spec), values)}


def sequence_by_sequence(fn, spec, tensors, h0, do, dhts, cu, dtype=None):
    """The result of fn run on each sequence alone (B = 1, its own initial state and upstream
    gradients; inputs and states cast to dtype, float64 for a reference), put together as a
    packed call's: o and the gradients of inputs with a time axis concatenated along T, states
    and their gradients along N, the others (rwkv6's u) summed."""
    time = spec.sequence_inputs()
    cast = (lambda x: x) if dtype is None else (lambda x: None if x is None else x.to(dtype))
    parts = []
    for n, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        inputs = {name: cast(x[:, a:b] if name in time and x is not None else x)
                  for name, x in tensors.items()}
        parts.append(forward_backward(fn, spec, inputs, [cast(s[n:n + 1]) for s in h0],
                                      cast(do[:, a:b]), [cast(d[n:n + 1]) for d in dhts]))
    states = state_result_names(spec)
    out = {}
    for name, *pieces in zip(result_names(spec), *(part.values() for part in parts)):
        if pieces[0] is None:
            out[name] = None
        elif name == "o" or name[1:] in time:
            out[name] = torch.cat(pieces, dim=1)
        elif name in states:
            out[name] = torch.cat(pieces, dim=0)
        else:
            out[name] = sum(pieces)
    return out


def assert_same_results(got, want, dtype):
    """Every tensor of a packed call within REL_TOL[dtype] of the sequence-by-sequence run's (and
    None where that is None)."""
    for name, x in want.items():
        if x is None:
            assert got[name] is None, f"{name}: a tensor where each sequence alone gives None"
        else:
            assert_close(name, got[name], x, REL_TOL[dtype], dtype)


@pytest.mark.parametrize("name,dtype,lengths", [pytest.param(*case, id=f"{case[0]}-{str(case[1])[6:]}-{case[2]}")
                                                for case in CASES])
def test_packed_equals_each_sequence_alone(name, dtype, lengths):
    spec, fn = kernel(name)
    cu = starts(LENGTHS[lengths])
    tensors, h0, do, dhts = draw(spec, LENGTHS[lengths], dtype)
    index_dtype = torch.int32 if lengths == "mixed" else torch.int64
    got = forward_backward(fn, spec, tensors, h0, do, dhts,
                           cu_seqlens=torch.tensor(cu, dtype=index_dtype, device=DEVICE))
    assert_same_results(got, sequence_by_sequence(fn, spec, tensors, h0, do, dhts, cu), dtype)
    reference = load_function(spec.reference_loop)
    assert_matches_reference(spec, got, sequence_by_sequence(reference, spec, tensors, h0, do, dhts, cu,
                                                             torch.float64), dtype)


@pytest.mark.parametrize("name,option", [(f"{op}-{variant}", option) for op, option in OPTIONS
                                         for variant in ("chunk", "fused_recurrent")])
def test_options_on_packed_batches(name, option):
    """Each option on a packed batch against the float64 reference run on each sequence alone
    (tests/test_options.py holds each kernel's options to the reference): g_gamma as any gate,
    normalize and gsa's g = None with each sequence's own key sum and slot gate (q, k and z0
    positive, as a normaliser's are)."""
    spec, fn = kernel(name, option)
    cu = starts(LENGTHS["two"])
    tensors, h0, do, dhts = draw(spec, LENGTHS["two"], FP32, seed=5, positive=("q", "k", "z"))
    got = forward_backward(fn, spec, tensors, h0, do, dhts, cu_seqlens=torch.tensor(cu, device=DEVICE))
    reference = load_function(spec.reference_loop)
    assert_matches_reference(spec, got, sequence_by_sequence(reference, spec, tensors, h0, do, dhts, cu,
                                                             torch.float64), FP32)


@pytest.mark.parametrize("name", ["simple_gla-chunk", "gla-chunk", "gsa-chunk", "rwkv6-fused_recurrent"])
def test_extreme_decay_keeps_the_gate_gradient_precise(name):
    """Under extreme decay (every log gate -60) the gate gradient is tiny (about 1e-25) beside its
    gate-free terms, which a chunk's last row carries: each sequence must end on a chunk's last
    row for the kernels to leave them out, as they do for a sequence alone (fp32 dg within 1e-5
    of float64; with the padding after each sequence instead, dg was wrong by about 100 %)."""
    spec, fn = kernel(name)
    cu = starts(LENGTHS["two"])
    tensors, h0, do, dhts = draw(spec, LENGTHS["two"], FP32, gate="extreme", seed=3)
    got = forward_backward(fn, spec, tensors, h0, do, dhts, cu_seqlens=torch.tensor(cu, device=DEVICE))
    reference = load_function(spec.reference_loop)
    assert_matches_reference(spec, got, sequence_by_sequence(reference, spec, tensors, h0, do, dhts, cu,
                                                             torch.float64), FP32)


def test_packed_gla_gate_gradient_keeps_the_final_state_gradient():
    """gla, bf16 with float32 gates, packed, with the tensor cores' operand rounding (the H100's
    failing case): each sequence's last chunk takes its final state's float32 gradient dh, and
    dg at its last rows sums k_j . dk_j through it with nothing to cancel them; dh rounded once to
    bf16 in v dh^T put dg at 1.3 times its bound (golden and options rows alike)."""
    rows = emulated("case", "gla", "chunk", "bf16-fp32gates", "2", "65", "2", "64", "64", "strong",
                    "packed", "none", "none")
    dg = {name: row for name, row in rows.items() if name.split(": ")[1].startswith("dg")}
    assert dg and all(verdict == "PASS" for verdict, *_ in dg.values()), dg
    verdict, err, bound, floor = rows["golden: dg"]
    assert err < bound / 2, rows["golden: dg"]


def test_a_shifted_cu_seqlens_is_caught():
    """The comparison catches a packed call whose sequence boundary is one token off."""
    spec, fn = kernel("simple_gla-chunk")
    lengths = LENGTHS["mixed"]
    cu = starts(lengths)
    tensors, h0, do, dhts = draw(spec, lengths, FP32)
    shifted = [cu[0], cu[1] + 1, *cu[2:]]
    got = forward_backward(fn, spec, tensors, h0, do, dhts, cu_seqlens=torch.tensor(shifted, device=DEVICE))
    with pytest.raises(AssertionError, match=r"^o \(float32\): max\|err\|"):
        assert_same_results(got, sequence_by_sequence(fn, spec, tensors, h0, do, dhts, cu), FP32)


def test_check_inputs_reads_the_sequences():
    tensors = dict(q=torch.randn(1, 7, 2, 4, device=DEVICE), v=torch.randn(1, 7, 2, 3, device=DEVICE))
    layouts = dict(q="BTHK", v="BTHV")
    sizes = check_inputs("op", tensors, layouts, initial_state=torch.zeros(3, 2, 4, 3, device=DEVICE),
                         cu_seqlens=torch.tensor([0, 2, 3, 7], device=DEVICE))
    assert sizes == dict(B=1, T=7, H=2, K=4, V=3, N=3, cu_seqlens=(0, 2, 3, 7))
    assert check_inputs("op", tensors, layouts)["N"] == 1


def _bad_calls():
    """(what, arguments to change, the error's text after "<op>: "), for a packed batch of
    sequences [3, 4] (T = 7)."""
    cu = torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE)
    return [
        ("list", dict(cu_seqlens=[0, 3, 7]), r"cu_seqlens must be a torch\.Tensor or None, got list\."),
        ("2-D", dict(cu_seqlens=cu[None]), r"cu_seqlens must be a 1-D tensor \[N \+ 1\], got a 2-D one\."),
        ("float", dict(cu_seqlens=cu.float()),
         r"cu_seqlens has dtype torch\.float32; expected int32 or int64\."),
        ("device", dict(cu_seqlens=torch.tensor([0, 3, 7], device="meta")),
         rf"cu_seqlens is on meta but the inputs are on {DEVICE}"),
        ("B=2", dict(B=2), r"with cu_seqlens the inputs must have B = 1 \(the sequences packed along T\), "
                           r"got B = 2\."),
        ("one value", dict(cu_seqlens=cu[:1]), r"cu_seqlens must hold N \+ 1 >= 2 values, got 1\."),
        ("start", dict(cu_seqlens=cu + 1), r"cu_seqlens must start at 0, got 1\."),
        ("empty sequence", dict(cu_seqlens=torch.tensor([0, 3, 3, 7], device=DEVICE)),
         r"cu_seqlens must be strictly increasing \(every sequence at least one token\), "
         r"got cu_seqlens\[2\] = 3 after 3\."),
        ("decreasing", dict(cu_seqlens=torch.tensor([0, 5, 3, 7], device=DEVICE)),
         r"cu_seqlens must be strictly increasing .* got cu_seqlens\[2\] = 3 after 5\."),
        ("end", dict(cu_seqlens=cu[:2]), r"cu_seqlens must end at T = 7, got 3\."),
        ("states", dict(N=3), r"initial_state( hk)? has shape \(3, .*\); expected \(2, .*\) \[N, H, "),
    ]


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("change,message", [pytest.param(*bad, id=what) for what, *bad in _bad_calls()])
def test_bad_cu_seqlens_are_refused(name, change, message):
    spec, fn = kernel(name)
    tensors, states, _, _ = draw(spec, [3, 4], FP32)
    if "N" in change:
        states = draw(spec, [1] * change["N"], FP32)[1]
    if "B" in change:
        tensors = {name: x.expand(change["B"], *x.shape[1:]) if x.dim() >= 3 else x
                   for name, x in tensors.items()}
    cu_seqlens = change.get("cu_seqlens", torch.tensor([0, 3, 7], device=DEVICE))
    op = fn.__name__
    with pytest.raises(ValueError, match=rf"^{op}: {message}") as info:
        fn(*tensors.values(), initial_state=states if len(states) > 1 else states[0],
           output_final_state=True, cu_seqlens=cu_seqlens)
    assert "\n" not in str(info.value)

