"""Shared oracle and assertions for the kernel tests (in the spirit of attention-gym's attn_gym/testing).

An op is the harness's declaration (`harness.registry.get_op`), and a test runs the harness's own
case core: inputs drawn by `harness.inputs.make_inputs`, forward and backward by
`harness.execution.run_implementation`. A test then

    x = make_inputs(RWKV6, B, T, H, K, V, torch.bfloat16, gate="strong", h0=True)
    got = run(fused_recurrent_rwkv6, x, output_final_state=True)   # forward + backward, every tensor
    assert_matches_reference(RWKV6, got, reference(RWKV6, x, True), torch.bfloat16)

Inputs are drawn from a CPU generator seeded by the test's seed, in the kernel's dtype, and moved to
`DEVICE`, so CPU and GPU runs see the same numbers and the float64 reference sees them upcast
exactly. One upstream gradient for o (in the inputs' dtype) and one for each final state (float32)
are shared by every implementation.

Result keys (see `result_names`): "o"; "<state>t" for each final state ("ht"); "d<input>" for each
input ("dr", "dw"); "d<state>0" for each initial state ("dh0"). A key maps to None when the tensor
does not exist in that run (no final state asked for, no initial state, gradient not requested).
`make_inputs(..., none=("g",))` passes an input as None (simple GLA without a gate).
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import torch

from harness.cases import DTYPE_NAMES, Case
from harness.declaration import OpSpec, load_function
from harness.execution import run_implementation
from harness.inputs import CaseInputs, make_inputs as draw_case_inputs
from harness.registry import get_op

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RWKV6 = get_op("rwkv6")

# max|X - X64| <= REL_TOL * max|X64|, per kernel dtype
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 2e-2}
# half an ulp, relative: a result computed in fp32 and rounded once to fp16 / bf16 is that close
HALF_ULP = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
ROUNDED_ONCE_SLACK = 1e-4  # of max|X64|, for the fp32 arithmetic before that one rounding


def result_names(spec: OpSpec) -> list:
    """Every key of a `run` result, in a fixed order."""
    return (["o"] + spec.final_state_names() + ["d" + s.name for s in spec.inputs]
            + spec.initial_state_grad_names())


def state_result_names(spec: OpSpec) -> set:
    """Result keys of states and their gradients: float32 whatever the inputs' dtype."""
    return set(spec.final_state_names()) | set(spec.initial_state_grad_names())


@dataclass
class Inputs:
    """One case's tensors (the harness's `CaseInputs`), the names passed as None, and every run's
    `Execution` (the copies the implementations received, for `assert_unchanged`)."""
    spec: OpSpec
    case: Case
    drawn: CaseInputs
    none: tuple = ()
    executions: list = field(default_factory=list)

    @property
    def dtype(self) -> torch.dtype:
        return self.case.torch_dtype

    @property
    def tensors(self) -> dict:
        """Input name -> tensor in call order, None for an input passed as None."""
        return {n: None if n in self.none else x for n, x in self.drawn.tensors.items()}

    @property
    def h0(self):
        return self.drawn.initial_states

    @property
    def do(self):
        return self.drawn.do

    @property
    def dht(self):
        return self.drawn.dhts

    def args(self, dtype=None) -> list:
        """The inputs in call order, cast to `dtype` (default: as generated)."""
        return [None if x is None else x.to(dtype or self.dtype) for x in self.tensors.values()]

    def initial_state(self, dtype=torch.float32):
        """What to pass as `initial_state`: None, a tensor, or a tuple for several states."""
        if self.h0 is None:
            return None
        states = tuple(s.to(dtype) for s in self.h0)
        return states if len(self.spec.states) > 1 else states[0]

    def replace(self, **tensors) -> "Inputs":
        """The same case with some inputs replaced (e.g. by non-contiguous copies of the same values)."""
        drawn = dataclasses.replace(self.drawn, tensors={**self.drawn.tensors, **tensors})
        return dataclasses.replace(self, drawn=drawn, executions=[])

    def snapshot(self) -> dict:
        """Copies of every tensor, for `assert_unchanged`."""
        return {name: x.clone() for name, x in self._all().items()}

    def _all(self) -> dict:
        out = {n: x for n, x in self.tensors.items() if x is not None}
        for s, x in zip(self.spec.states, self.h0 or ()):
            out[s.name + "0"] = x
        out["do"] = self.do
        out.update({"d" + s.name + "t": g for s, g in zip(self.spec.states, self.dht)})
        return out


def make_inputs(spec: OpSpec, B, T, H, K, V, dtype, gate="normal", h0=True, seed=0, M=None,
                none=(), device=DEVICE) -> Inputs:
    """The case's inputs drawn by the harness (`harness.inputs.make_inputs`) in `dtype` on
    `device`, from a generator seeded with `seed` itself (the numbers the tests' bounds were set
    on): gates by `gate` (harness.cases.GATES, "extreme" included), float32 initial states when
    h0, do and dht. Inputs named in `none` are drawn but passed as None."""
    case = Case(op=spec.name, dtype=DTYPE_NAMES[dtype], B=B, T=T, H=H, K=K, V=V,
                h0="grad" if h0 else "none", gate=gate, seed=seed, M=M or 0)
    drawn = draw_case_inputs(spec, case, device, torch.Generator().manual_seed(seed))
    return Inputs(spec, case, drawn, tuple(none))


def run(fn, x: Inputs, output_final_state=True, *, dtype=None, scale=None, grads=None, h0_grad=True,
        loss_on="both", unused_as_zero=False) -> dict:
    """Forward of fn on x's inputs (cast to `dtype`; states float32, or float64 for a float64 run)
    and backward of <o, do> + <final state, dht>, through the harness's `run_implementation`;
    returns every tensor by `result_names`.

    The kernel gets copies of the inputs with their strides; `assert_unchanged` checks those copies
    afterwards. grads: the input names that require grad (default all); h0_grad: whether the
    initial states do; loss_on: "both", "o" or "ht" (which outputs the loss uses). A requested
    gradient that autograd leaves unset is None, or zeros with unused_as_zero (a reference whose
    graph does not reach an input, e.g. w at T = 1 with no initial state).
    """
    final_state = "off" if not output_final_state else ("unused" if loss_on == "o" else "grad")
    execution = run_implementation(
        fn, x.spec, x.case, dataclasses.replace(x.drawn, scale=scale),
        to_dtype=None if dtype in (None, x.dtype) else dtype, final_state=final_state,
        without=x.none, h0_grad=h0_grad, requires_grad=grads, o_in_loss=loss_on != "ht")
    x.executions.append(execution)
    out = {name: execution.result.get(name) for name in result_names(x.spec)}
    if unused_as_zero:
        for name, (leaf, _) in execution.given.items():
            if name in x.tensors and leaf.requires_grad and out["d" + name] is None:
                out["d" + name] = torch.zeros_like(leaf)
    return out


def reference(spec: OpSpec, x: Inputs, output_final_state=True, **kw) -> dict:
    """`run` of the op's float64 reference on the exactly upcast inputs (same scale, grads, loss)."""
    return run(load_function(spec.reference_loop), x, output_final_state, dtype=torch.float64,
               unused_as_zero=True, **kw)


def segmented(fn, splits):
    """fn with the same public signature, run on T cut at `splits` with the final state of each
    segment passed as the initial state of the next (o concatenated over time). Inputs with a time
    axis ([B, T, ...]) are cut; the others (u) are passed whole."""
    def call(*inputs, scale=None, initial_state=None, output_final_state=False):
        T = inputs[0].shape[1]
        bounds = [0, *splits, T]
        outs, state = [], initial_state
        for a, b in zip(bounds[:-1], bounds[1:]):
            part = [x[:, a:b] if (x is not None and x.dim() >= 3 and x.shape[1] == T) else x for x in inputs]
            last = b == T
            o, state = fn(*part, scale=scale, initial_state=state,
                          output_final_state=output_final_state if last else True)
            outs.append(o)
        return torch.cat(outs, dim=1), state
    return call


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def assert_close(name, got, ref, rel_tol, dtype=None, rounded_once=False):
    """max|got - ref| <= rel_tol * max|ref| and no NaN/Inf where ref is finite; returns the relative error.

    rounded_once: a fp16 / bf16 `got` must also be within half an ulp of ref elementwise (plus
    ROUNDED_ONCE_SLACK * max|ref|): computed in fp32 and rounded once. Every failure message names the
    tensor, the dtype, the error and each term of the bound.
    """
    what = f"{name} ({_dtype_name(dtype or getattr(got, 'dtype', None))})"
    assert got is not None, f"{what}: got None where the reference has a tensor"
    assert tuple(got.shape) == tuple(ref.shape), f"{what}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    g = got.detach().double()
    ref = ref.detach().double().to(g.device)
    bad = ~torch.isfinite(g) & torch.isfinite(ref)
    assert not bad.any(), f"{what}: {int(bad.sum())} NaN/Inf values, first at index {bad.nonzero()[0].tolist()}"
    diff = (g - ref).abs()
    err = diff.max().item() if diff.numel() else 0.0
    scale = ref.abs().max().item() if ref.numel() else 0.0
    bound = rel_tol * scale
    assert err <= bound, (f"{what}: max|err| {err:.3e} > bound {bound:.3e} = rel_tol {rel_tol:.1e} "
                          f"* max|ref| {scale:.3e} ("
                          + (f"relative err {err / scale:.3e})" if scale > 0 else "the reference is exactly 0)"))
    if rounded_once and got.dtype in HALF_ULP:
        excess = diff - HALF_ULP[got.dtype] * ref.abs() - ROUNDED_ONCE_SLACK * scale
        worst = int(excess.argmax())
        assert excess.max() <= 0, (
            f"{what}: more than one rounding from float64 at flat index {worst}: |err| "
            f"{diff.flatten()[worst].item():.3e} > half ulp {HALF_ULP[got.dtype]:.2e} * |ref| "
            f"{ref.abs().flatten()[worst].item():.3e} + {ROUNDED_ONCE_SLACK:.0e} * max|ref| {scale:.3e}")
    return err / scale if scale > 0 else 0.0


def assert_matches_reference(spec: OpSpec, got: dict, ref: dict, dtype, rel_tol=None, tol=None,
                             rounded_once=False) -> dict:
    """Every tensor of a `run` result against the reference's: present exactly where the reference's
    is, in the right dtype (states and their gradients float32, the rest `dtype`), within its bound.

    rel_tol: default REL_TOL[dtype]; tol: per-name overrides {"dw": ...}. Returns {name: relative err}.
    """
    assert got.keys() == ref.keys(), f"result keys {sorted(got)} != reference keys {sorted(ref)}"
    rel_tol = REL_TOL[dtype] if rel_tol is None else rel_tol
    states = state_result_names(spec)
    rels = {}
    for name in result_names(spec):
        if ref[name] is None:
            assert got[name] is None, f"{name}: got a tensor where the reference has none"
            continue
        want = torch.float32 if name in states else dtype
        assert got[name] is not None, f"{name} ({_dtype_name(dtype)}): got None where the reference has a tensor"
        assert got[name].dtype == want, (f"{name} ({_dtype_name(dtype)} inputs): dtype {_dtype_name(got[name].dtype)}, "
                                         f"expected {_dtype_name(want)}")
        rels[name] = assert_close(name, got[name], ref[name], (tol or {}).get(name, rel_tol), dtype,
                                  rounded_once)
    return rels


def assert_unchanged(x: Inputs, before: dict):
    """Every input, initial state and upstream gradient bitwise equal to its `x.snapshot()`, and
    so is every copy an implementation received in a `run` of x."""
    now = x._all()
    for name, t in before.items():
        assert torch.equal(now[name], t), f"input {name} was modified"
    for execution in x.executions:
        for name, (received, original) in execution.given.items():
            if received.dtype == original.dtype:
                assert torch.equal(received.detach(), original), f"{name} was modified"


def assert_identical(first: dict, second: dict):
    """Two results of the same call are bitwise equal (determinism)."""
    assert first.keys() == second.keys()
    for name, t in first.items():
        assert (t is None) == (second[name] is None), f"{name}: None in only one of two identical calls"
        if t is not None:
            assert torch.equal(t, second[name]), f"{name} differs between two identical calls"


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def emulated(*args):
    """The JSON result of `python -m tests.emulated_tensor_cores *args`, run under the interpreter
    with the tensor cores' operand rounding emulated (FLA_EMULATE_TENSOR_CORES=1, read when
    fla_kernels is imported, hence a process of its own): the rounding a GPU run has and a plain
    CPU run, whose products are all IEEE fp32, does not. With a GPU the job runs on its real
    tensor cores instead."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    if torch.cuda.is_available():
        for name in ("TRITON_INTERPRET", "FLA_EMULATE_TENSOR_CORES"):
            env.pop(name, None)
    else:
        env.update(TRITON_INTERPRET="1", FLA_EMULATE_TENSOR_CORES="1")
    out = subprocess.run([sys.executable, "-m", "tests.emulated_tensor_cores", *args], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
