"""The case core: one implementation's forward and backward on a case's inputs, checked against
the op's contract as it returns. The references run through it too (`goldens.py`), so it is part
of the golden cache's fingerprint."""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from harness.cases import Case
from harness.inputs import CaseInputs
from harness.declaration import OpSpec


@dataclass
class Execution:
    """What one forward and backward of an implementation gave."""
    result: dict   # tensor name ("o", "ht", "dq", "dh0", ...) -> output or gradient (None if absent)
    given: dict    # input name -> (the tensor the implementation received, the original it copies)
    backward: bool = True   # False: the forward only (its backward failed or is absent)


class RunFailed(Exception):
    """An implementation's run stopped before its gradients: it returned something the op does not
    (`tensor` names it), or its backward raised; or it lacks part of what the case calls (an
    adapter of an older release raises it: harness.upstream). `forward` holds the outputs it
    returned that match the op, which are still compared with the golden. `verdict` is the row it
    gets: SKIP for a forward-only implementation, whose backward raises NotImplementedError
    (upstream's fused_recurrent of gated_delta_rule) or whose outputs carry no gradient
    (upstream's fused_recurrent_kda, outside autograd), and for what a release lacks; else ERROR.
    `in_backward`: the forward ran whole and only its backward failed or is absent, so checks of
    the forward alone (`Check.forward_only`) still run."""

    def __init__(self, message: str, forward: dict, tensor: str = "", verdict: str = "ERROR",
                 in_backward: bool = False):
        super().__init__(message)
        self.forward, self.tensor, self.verdict, self.in_backward = forward, tensor, verdict, in_backward


def _shape_text(shape, symbols) -> str:
    return f"({', '.join(map(str, shape))}) [{', '.join(map(str, symbols))}]"


def returned_problems(spec: OpSpec, inputs: CaseInputs, returned, t0: int, t1: int) -> tuple[dict, dict]:
    """({name: tensor} of the forward outputs that match the op, {name: why} of those that do not)
    for what one call over steps [t0, t1) returned: (o, final state), with o [B, t1 - t0, H, V]
    and each state its declared shape (one per packed sequence), floating point."""
    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        what = type(returned).__name__ + (f" of {len(returned)}" if isinstance(returned, (tuple, list)) else "")
        return {}, {"o": f"the call returned a {what}; the op returns the pair (o, final state)"}
    o, finals = returned
    dims = {**inputs.dims, "T": t1 - t0}
    wanted = [("o", o, ("B", "T", "H", "V"), dims)]
    if finals is not None:
        finals_tuple = (finals,) if len(spec.states) == 1 else finals
        if not isinstance(finals_tuple, (tuple, list)) or len(finals_tuple) != len(spec.states):
            return ({}, {spec.final_state_names()[0]: f"the final state is a {type(finals).__name__}; "
                         f"the op's is a tuple of {len(spec.states)} tensors"})
        wanted += [(name, x, st.shape, inputs.state_dims) for name, x, st in
                   zip(spec.final_state_names(), finals_tuple, spec.states)]
    good, bad = {}, {}
    for name, x, symbols, sizes in wanted:
        expected = tuple(sizes[d] if isinstance(d, str) else d for d in symbols)
        if x is None and name != "o":
            good[name] = None
        elif not isinstance(x, torch.Tensor):
            bad[name] = f"{name} is a {type(x).__name__}, not a tensor"
        elif not x.is_floating_point():
            bad[name] = f"{name} is {str(x.dtype).replace('torch.', '')}, not floating point"
        elif tuple(x.shape) != expected:
            bad[name] = (f"{name} has shape {_shape_text(tuple(x.shape), symbols)}; the op's is "
                         f"{_shape_text(expected, symbols)}")
        else:
            good[name] = x
    return good, bad


def run_implementation(fn, spec: OpSpec, case: Case, inputs: CaseInputs, to_dtype=None,
                       segments=None, final_state="grad", without=(), h0_grad=True,
                       requires_grad=None, o_in_loss=True) -> Execution:
    """Forward and backward with the shared upstream gradients.

    Inputs are cloned first (optionally cast to `to_dtype`), so no implementation sees another's
    tensors; `given` keeps the copies to check afterwards that none was written to. An op with one
    state takes and returns it as a tensor, with several as tuples. With `segments` ([(t0, t1)...])
    the forward runs once per segment of T, each taking the previous one's final state, and the
    backward runs through the whole chain. final_state: "grad" (returned, its upstream gradient in
    the loss), "unused" (returned, not in the loss) or "off" (output_final_state=False); the
    inputs named in `without` are passed as None; h0_grad=False passes a case's initial state
    without requires_grad; `requires_grad` names the inputs whose gradients are taken (default
    all); o_in_loss=False leaves o out of the loss (only the final states' gradients flow).
    Initial states and their upstream gradients stay float32 unless `to_dtype` is float64 (a
    golden). The case's option (`OpSpec.under`) adds its keywords and inputs (by name where
    declared `keyword`) and passes its `without` inputs as None; a packed case passes
    `cu_seqlens`. What each call returns is checked against the op before anything else uses
    it: RunFailed names a wrong shape or type, and a backward that raises.
    """
    spec = spec.under(case.option)
    option = spec.option_spec()
    without = tuple(without) + option.without
    call = dict(option.kwargs)
    if inputs.cu_seqlens is not None:
        if segments:
            raise ValueError("a packed case is not cut into segments")
        call["cu_seqlens"] = inputs.cu_seqlens
    state_dtype = torch.float64 if to_dtype == torch.float64 else None

    def upstream(x, dtype=to_dtype):
        return x.detach().clone() if dtype is None else x.detach().to(dtype)

    def leaf(x, grad=True, dtype=to_dtype):
        return upstream(x, dtype).requires_grad_(grad)

    single = len(spec.states) == 1
    differentiable = {s.name for s in spec.inputs if s.grad}
    leaves = {name: leaf(x, name in differentiable and (requires_grad is None or name in requires_grad))
              for name, x in inputs.tensors.items() if name not in without}
    given = {name: (x, inputs.tensors[name]) for name, x in leaves.items()}
    h0 = None
    if inputs.initial_states is not None:
        h0 = tuple(leaf(x, case.h0 == "grad" and h0_grad, state_dtype) for x in inputs.initial_states)
        given.update({f"initial {s.name}": (x, orig) for s, x, orig in
                      zip(spec.states, h0, inputs.initial_states)})
    sequence = spec.sequence_inputs()
    by_name = {s.name for s in spec.inputs if s.keyword}
    T = inputs.dims["T"]
    pieces, finals = [], h0
    for t0, t1 in segments or [(0, T)]:
        now = {name: leaves.get(name) for name in inputs.tensors}
        now = {name: x[:, t0:t1] if name in sequence and x is not None else x for name, x in now.items()}
        args = [x for name, x in now.items() if name not in by_name]
        named = {name: x for name, x in now.items() if name in by_name}
        state = None if finals is None else (finals[0] if single else finals)
        returned = fn(*args, scale=inputs.scale, initial_state=state,
                      output_final_state=final_state != "off" or t1 < T, **named, **call)
        good, bad = returned_problems(spec, inputs, returned, t0, t1)
        if bad:
            name, why = next(iter(bad.items()))
            where = f" (segment [{t0}, {t1}))" if segments else ""
            forward = {} if segments else {k: v.detach() for k, v in good.items() if v is not None}
            raise RunFailed(f"returned wrong{where}: {why}", forward, name)
        o, finals = returned
        pieces.append(o)
        finals = (finals,) if single else finals
    o = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
    if finals is None:
        finals = (None,) * len(spec.states)
    do = upstream(inputs.do)
    dhts = tuple(upstream(x, state_dtype) for x in inputs.dhts)
    given["the upstream gradient of o"] = (do, inputs.do)
    outputs, grads = ([o], [do]) if o_in_loss else ([], [])
    for s, final, dht, orig in zip(spec.states, finals, dhts, inputs.dhts):
        given[f"the upstream gradient of {s.name}t"] = (dht, orig)
        if final is not None and final_state == "grad":
            outputs.append(final)
            grads.append(dht)
    result = {"o": o.detach()}
    for name, final in zip(spec.final_state_names(), finals):
        result[name] = None if final is None else final.detach()
    if outputs and not any(x.requires_grad for x in outputs):
        raise RunFailed("no backward: its outputs carry no gradient (computed outside autograd)",
                        {} if segments else {k: v for k, v in result.items() if v is not None},
                        verdict="SKIP", in_backward=True)
    try:
        if outputs:
            torch.autograd.backward(outputs, grads)
    except Exception as exc:
        forward_only = isinstance(exc, NotImplementedError)
        raise RunFailed(f"{'no backward: it' if forward_only else 'backward'} raised {describe_error(exc)}",
                        {} if segments else {k: v for k, v in result.items() if v is not None},
                        verdict="SKIP" if forward_only else "ERROR", in_backward=True) from exc
    for name, x in leaves.items():
        if name in differentiable:
            result["d" + name] = x.grad
    if case.h0 == "grad" and h0_grad:
        for name, x in zip(spec.initial_state_grad_names(), h0):
            result[name] = x.grad
    return Execution(result, given)


def unsupported(fn, spec: OpSpec, case: Case) -> str:
    """Why `fn` cannot be called as the case asks (a packed case's `cu_seqlens`, the keywords and
    inputs of its option), read from its signature, or "" (also when it takes **kwargs or has no
    signature to read)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return ""
    if any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        return ""
    option = spec.under(case.option).option_spec()
    wanted = (["cu_seqlens"] if case.packed else []) + list(option.kwargs) + [s.name for s in option.inputs]
    missing = [name for name in wanted if name not in parameters]
    if not missing:
        return ""
    what = "packed sequences (cu_seqlens)" if missing == ["cu_seqlens"] else ", ".join(missing)
    return f"the implementation does not take {what}, which this case needs"


def rejected_or_error(exc: BaseException, case: Case) -> tuple[str, str]:
    """(verdict, message) of a run that raised: SKIP where the implementation says it does not
    implement what the case asks beyond the core call (NotImplementedError on a packed case or
    an option), a RunFailed's own verdict, else ERROR."""
    if isinstance(exc, RunFailed):
        return exc.verdict, describe_error(exc)
    if isinstance(exc, NotImplementedError) and (case.packed or case.option != "none"):
        return "SKIP", f"the implementation rejects this case's call: {describe_error(exc)}"
    return "ERROR", describe_error(exc)


def execute(fn, spec: OpSpec, case: Case, inputs: CaseInputs, to_dtype=None, **options) -> dict:
    """Every output and gradient of one forward and backward (see run_implementation)."""
    return run_implementation(fn, spec, case, inputs, to_dtype, **options).result


def describe_error(exc: BaseException) -> str:
    """One line: the exception's type and the first and last lines of its text (a RunFailed is
    already a sentence of the harness's)."""
    if isinstance(exc, RunFailed):
        return str(exc)[:500]
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if len(lines) <= 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(exc).__name__}: {text}"[:500]
