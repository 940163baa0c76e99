"""Shared oracle and assertions for the kernel tests (in the spirit of attention-gym's attn_gym/testing).

An op family is described once by an `OpSpec`: its inputs in call order with their layouts, which of
them are log gates, its recurrent state tensors and its float64 reference. A test then

    x = make_inputs(RWKV6, B, T, H, K, V, torch.bfloat16, gate="strong", h0=True)
    got = run(fused_recurrent_rwkv6, x, output_final_state=True)   # forward + backward, every tensor
    assert_matches_reference(RWKV6, got, reference(RWKV6, x, True), torch.bfloat16)

Inputs are drawn from a seeded CPU generator in the kernel's dtype and moved to `DEVICE`, so CPU and
GPU runs see the same numbers and the float64 reference sees them upcast exactly. One upstream
gradient for o (in the inputs' dtype, as autograd hands it to a kernel) and one for each final state
(float32) are shared by every implementation.

Result keys (see `result_names`): "o"; "<state>t" for each final state ("ht"); "d<input>" for each
input ("dr", "dw"); "d<state>0" for each initial state ("dh0"). A key maps to None when the tensor
does not exist in that run (no final state asked for, no initial state, gradient not requested).

Other op families reuse the module with their own spec, e.g. (layout letters: B T H K V M)
    GLA = OpSpec("gla", {"q": "BTHK", "k": "BTHK", "v": "BTHV", "g": "BTHK"}, ("g",), gla_recurrent)
    SIMPLE_GLA = OpSpec("simple_gla", {"q": "BTHK", "k": "BTHK", "v": "BTHV", "g": "BTH"}, ("g",), ...)
    GSA = OpSpec("gsa", {"q": "BTHK", "k": "BTHK", "v": "BTHV", "s": "BTHM", "g": "BTHM"}, ("g",), ...,
                 states={"hk": "BHKM", "hv": "BHMV"})
and `make_inputs(..., none=("g",))` passes an input as None (simple GLA without a gate).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from references.rwkv6 import rwkv6_recurrent

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# gates = logsigmoid(randn) / normaliser; "extreme" sets every gate to EXTREME_GATE instead
GATE_NORMALISER = {"normal": 1.0, "strong": 0.05, "weak": 16.0}
EXTREME_GATE = -60.0  # every step decays by exp(-60): a 64-token chunk's gate sum reaches -3840

# max|X - X64| <= REL_TOL * max|X64|, per kernel dtype
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 2e-2}
# half an ulp, relative: a result computed in fp32 and rounded once to fp16 / bf16 is that close
HALF_ULP = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
ROUNDED_ONCE_SLACK = 1e-4  # of max|X64|, for the fp32 arithmetic before that one rounding


@dataclass(frozen=True)
class OpSpec:
    """What the oracle needs to know about one op family's public signature.

    The public function is called as fn(*inputs, scale=, initial_state=, output_final_state=) and
    returns (o [B, T, H, V], final state or None); with several states both are tuples.
    """
    name: str
    inputs: dict            # input name -> layout (letters of B T H K V M), in call order
    gates: tuple            # the inputs that are log gates
    reference: Callable     # float64 reference with the public signature
    states: dict = field(default_factory=lambda: {"h": "BHKV"})  # state name -> layout

    @property
    def multi_state(self) -> bool:
        return len(self.states) > 1


RWKV6 = OpSpec("rwkv6", {"r": "BTHK", "k": "BTHK", "v": "BTHV", "w": "BTHK", "u": "HK"}, ("w",),
               rwkv6_recurrent)


def result_names(spec: OpSpec) -> list:
    """Every key of a `run` result, in a fixed order."""
    return (["o"] + [s + "t" for s in spec.states] + ["d" + n for n in spec.inputs]
            + ["d" + s + "0" for s in spec.states])


def state_result_names(spec: OpSpec) -> set:
    """Result keys of states and their gradients: float32 whatever the inputs' dtype."""
    return {s + "t" for s in spec.states} | {"d" + s + "0" for s in spec.states}


@dataclass
class Inputs:
    """One case's tensors: inputs (in `dtype`, on the device), initial states (float32 or None),
    upstream gradients do (in `dtype`) and dht (float32, one per state)."""
    spec: OpSpec
    dtype: torch.dtype
    tensors: dict           # input name -> tensor, or None for an input passed as None
    h0: Optional[tuple]     # one float32 tensor per state, or None
    do: torch.Tensor
    dht: tuple

    def args(self, dtype=None) -> list:
        """The inputs in call order, cast to `dtype` (default: as generated)."""
        return [None if x is None else x.to(dtype or self.dtype) for x in self.tensors.values()]

    def initial_state(self, dtype=torch.float32):
        """What to pass as `initial_state`: None, a tensor, or a tuple for several states."""
        if self.h0 is None:
            return None
        states = tuple(s.to(dtype) for s in self.h0)
        return states if self.spec.multi_state else states[0]

    def replace(self, **tensors) -> "Inputs":
        """The same case with some inputs replaced (e.g. by non-contiguous copies of the same values)."""
        return dataclasses.replace(self, tensors={**self.tensors, **tensors})

    def snapshot(self) -> dict:
        """Copies of every tensor, for `assert_unchanged`."""
        return {name: x.clone() for name, x in self._all().items()}

    def _all(self) -> dict:
        out = {n: x for n, x in self.tensors.items() if x is not None}
        for name, s in zip(self.spec.states, self.h0 or ()):
            out[name + "0"] = s
        out["do"] = self.do
        out.update({"d" + name + "t": g for name, g in zip(self.spec.states, self.dht)})
        return out


def make_inputs(spec: OpSpec, B, T, H, K, V, dtype, gate="normal", h0=True, seed=0, M=None,
                none=(), device=DEVICE) -> Inputs:
    """Seeded inputs in `dtype` on `device`: randn, gates logsigmoid(randn) / GATE_NORMALISER[gate]
    (or all EXTREME_GATE for gate="extreme"); float32 initial states when h0; do and dht.

    Values are drawn on the CPU in a fixed order (inputs in call order, initial states, do, dht), so
    a case has the same numbers on every device. Inputs named in `none` are drawn but passed as None.
    """
    dims = dict(B=B, T=T, H=H, K=K, V=V, M=M)
    g = torch.Generator().manual_seed(seed)

    def randn(layout):
        return torch.randn(*(dims[c] for c in layout), generator=g)

    tensors = {}
    for name, layout in spec.inputs.items():
        x = randn(layout)
        if name in spec.gates:
            x = torch.full_like(x, EXTREME_GATE) if gate == "extreme" else F.logsigmoid(x) / GATE_NORMALISER[gate]
        tensors[name] = None if name in none else x.to(dtype).to(device)
    states = tuple(randn(layout).to(device) for layout in spec.states.values()) if h0 else None
    do = randn("BTHV").to(dtype).to(device)
    dht = tuple(randn(layout).to(device) for layout in spec.states.values())
    return Inputs(spec, dtype, tensors, states, do, dht)


def run(fn, x: Inputs, output_final_state=True, *, dtype=None, scale=None, grads=None, h0_grad=True,
        loss_on="both", unused_as_zero=False) -> dict:
    """Forward of fn on x's inputs (cast to `dtype`; states float32, or float64 for a float64 run)
    and backward of <o, do> + <final state, dht>; returns every tensor by `result_names`.

    The kernel sees the caller's tensors themselves (no copy) when no cast is needed, so a check that
    inputs are unchanged afterwards is a real one. grads: the input names that require grad (default
    all); h0_grad: whether the initial states do; loss_on: "both", "o" or "ht" (which outputs the
    loss uses). A requested gradient that autograd leaves unset is None, or zeros with unused_as_zero
    (a reference whose graph does not reach an input, e.g. w at T = 1 with no initial state).
    """
    spec = x.spec
    dtype = dtype or x.dtype
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = {n: None if t is None else t.to(dtype).detach().requires_grad_(grads is None or n in grads)
              for n, t in x.tensors.items()}
    h0 = None
    if x.h0 is not None:
        h0 = tuple(s.to(state_dtype).detach().requires_grad_(h0_grad) for s in x.h0)
    o, ht = fn(*leaves.values(), scale=scale,
               initial_state=None if h0 is None else (h0 if spec.multi_state else h0[0]),
               output_final_state=output_final_state)
    hts = (None,) * len(spec.states) if ht is None else (tuple(ht) if spec.multi_state else (ht,))

    outputs, upstream = [], []
    if loss_on in ("both", "o"):
        outputs.append(o)
        upstream.append(x.do.to(o.dtype))
    if loss_on in ("both", "ht") and ht is not None:
        outputs += list(hts)
        upstream += [g.to(s.dtype) for s, g in zip(hts, x.dht)]
    if any(t.requires_grad for t in outputs):
        torch.autograd.backward(outputs, upstream)

    def grad_of(t):
        if t is None or not t.requires_grad:
            return None
        return torch.zeros_like(t) if (t.grad is None and unused_as_zero) else t.grad

    out = {"o": o.detach()}
    out.update({s + "t": None if t is None else t.detach() for s, t in zip(spec.states, hts)})
    out.update({"d" + n: grad_of(t) for n, t in leaves.items()})
    out.update({"d" + s + "0": grad_of(None if h0 is None else h0[i]) for i, s in enumerate(spec.states)})
    return out


def reference(spec: OpSpec, x: Inputs, output_final_state=True, **kw) -> dict:
    """`run` of the op's float64 reference on the exactly upcast inputs (same scale, grads, loss)."""
    return run(spec.reference, x, output_final_state, dtype=torch.float64, unused_as_zero=True, **kw)


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
    """Every input, initial state and upstream gradient bitwise equal to its `x.snapshot()`."""
    now = x._all()
    for name, t in before.items():
        assert torch.equal(now[name], t), f"input {name} was modified"


def assert_identical(first: dict, second: dict):
    """Two results of the same call are bitwise equal (determinism)."""
    assert first.keys() == second.keys()
    for name, t in first.items():
        assert (t is None) == (second[name] is None), f"{name}: None in only one of two identical calls"
        if t is not None:
            assert torch.equal(t, second[name]), f"{name} differs between two identical calls"
