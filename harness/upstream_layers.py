"""Upstream's own layers (an implementation set's layers package, such as fla.layers) through the
layer check.

Each op's declaration may name its upstream layer (`LayerSpec.upstream`). With an implementation of
that set under test, the layer is built with the case's heads in the implementation's mode,
seeded, and run on its own kernels. Its golden is the same layer (same parameters) in float64 with
our float64 reference in the place of every function of the op that its module calls
(`as_release_call` fits the reference to the release's calling convention: its names, its state
layout, its packed sequences, what it asks the kernel to do to beta and g) and its helpers (fla.modules)
in float32 (harness/float32_helpers.py); its baseline, the layer with our same-dtype baseline there.
So the rows show what the layer's code does to its kernels (inputs, state layouts, the cache,
masks), not how its projections are designed, which are its own: one call; segments through the
release's cache, and that chain in float64 against one float64 call (a layer that loses or
misplaces its state between calls); the input and the cached states left untouched; and a
left-padded batch against each sequence alone.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import sys

import torch

from harness.checks.bits import bitwise_equal, describe_difference
from harness.checks.layer import (baseline_functions, chain_difference, compare_runs, no_gradients_row,
                                  run_segments)
from harness.checks.segments import segment_bounds
from harness.declaration import load_function
from harness.float32_helpers import helpers_in_float32
from harness.metrics import compare_to_golden
from harness.packing import per_sequence
from harness.upstream import parameters_of, release_keywords
from harness.tolerance import tolerance_for

CACHES = {"fla": "fla.models.utils:Cache"}   # each set's cache of layer states across calls
HELPERS = {"fla": "fla.modules"}   # each set's layer helpers, run in float32 in the golden (float32_helpers)
# the float64 chain against one float64 call where the helpers round to float32 (~1e-7 relative,
# ~1e-6 summed over tokens); a layer that loses or misplaces its state is off by O(1)
CHAIN_REL_TOL_FLOAT32_HELPERS = 1e-4
PADDED = 3   # tokens of left padding given to the second sequence of the masked batch
# keywords of upstream functions that change how, not what, they compute (a host copy of
# cu_seqlens, how much of the forward the backward recomputes)
PERFORMANCE_ONLY = {"cu_seqlens_cpu", "checkpoint_level", "chunk_indices"}


def in_kernel_transforms(values: dict, inputs: dict) -> None:
    """What a release's call asks its kernel to do to beta and g first, done here in float64 so
    the reference sees the inputs the kernel computes with (fla's delta-rule family):
    use_beta_sigmoid_in_kernel, beta = sigmoid(beta), twice that with allow_neg_eigval;
    use_gate_in_kernel, g = -exp(A_log) softplus(g + dt_bias), A_log [H] per head and dt_bias
    shaped as g's head and channel axes. The keywords are taken out of `values`; a gate
    `lower_bound` is left in, to be refused."""
    sigmoid = values.pop("use_beta_sigmoid_in_kernel", False)
    doubled = values.pop("allow_neg_eigval", False)
    if doubled and not sigmoid:
        raise NotImplementedError("allow_neg_eigval without use_beta_sigmoid_in_kernel, which the "
                                  "release refuses too")
    if sigmoid:
        inputs["beta"] = torch.sigmoid(inputs["beta"]) * (2.0 if doubled else 1.0)
    A_log, dt_bias = values.pop("A_log", None), values.pop("dt_bias", None)
    if values.pop("use_gate_in_kernel", False):
        g = inputs["g"]
        heads = g.shape[2:]   # [H] or [H, K] of g [B, T, H(, K)]
        raw = g if dt_bias is None else g + dt_bias.view(heads)
        rate = A_log.exp().view(heads[:1] + (1,) * (len(heads) - 1))   # per head, over g's channels
        inputs["g"] = -rate * torch.nn.functional.softplus(raw)
    elif A_log is not None or dt_bias is not None:
        raise NotImplementedError("A_log or dt_bias without use_gate_in_kernel")


def shape_arguments(case, arguments: dict) -> dict:
    """The layer's constructor arguments of a case: a string names a size of the case ("H", "K",
    "V", "M", "H*V", "K/V", "V/K"); anything else is taken as it is."""
    sizes = {"H": case.H, "K": case.K, "V": case.V, "M": case.M, "H*V": case.H * case.V,
             "K/V": case.K / case.V, "V/K": case.V / case.K}
    return {name: sizes[value] if isinstance(value, str) else value for name, value in arguments.items()}


def _swap_state(state):
    """A state [..., K, V] as [..., V, K] and back (a tuple: each)."""
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return type(state)(_swap_state(s) for s in state)
    return state.transpose(-1, -2)


def as_release_call(reference, original, spec):
    """`reference` (the op's inputs in our order, then our keywords) callable as the release's
    layers call `original`: the inputs under the release's names (`release_keywords`), a state
    with V before K where the call says `state_v_first`, packed sequences (`cu_seqlens`) one by
    one; the inputs' `in_kernel_transforms`. A keyword the reference does not model raises, so a
    row says so instead of a wrong golden, unless it is the release's default or PERFORMANCE_ONLY."""
    parameters = parameters_of(original)
    input_names = [s.name for s in spec.inputs]
    names, _ = release_keywords(parameters, input_names)
    accepted = set(inspect.signature(reference).parameters)
    packed = per_sequence(reference, spec)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(*args, **kwargs):
        values = dict(signature.bind(*args, **kwargs).arguments)
        values.update(values.pop(next((n for n, p in parameters.items() if p.kind == p.VAR_KEYWORD),
                                      "**"), {}))
        inputs = dict(zip(input_names, (values.pop(name, None) for name in names)))
        in_kernel_transforms(values, inputs)
        inputs = list(inputs.values())
        v_first = bool(values.pop("state_v_first", False))
        if values.pop("head_first", False):
            raise NotImplementedError(f"the layer calls {original.__name__} with head_first=True")
        cu_seqlens = values.pop("cu_seqlens", None)
        if "initial_state" in values:
            values["initial_state"] = _swap_state(values["initial_state"]) if v_first else values["initial_state"]
        for name in set(values) - accepted:
            default = parameters[name].default if name in parameters else inspect.Parameter.empty
            if name in PERFORMANCE_ONLY or (default is not inspect.Parameter.empty and not
                                            isinstance(values[name], torch.Tensor) and values[name] == default):
                del values[name]   # asked for as the release does by default, or for speed only
        unknown = sorted(set(values) - accepted)
        if unknown:
            raise NotImplementedError(f"the layer calls {original.__name__} with {', '.join(unknown)}, "
                                      "which the golden does not model")
        if cu_seqlens is not None:
            o, final = packed(*inputs, cu_seqlens=cu_seqlens, **values)
        else:
            o, final = reference(*inputs, **values)
        return o, (_swap_state(final) if v_first else final)

    return call


def release_names(spec, set_name: str) -> list[str]:
    """The names under which the set's layers call the op's functions: an adapter of ours carries
    its release's name; a release's own function (importable here or not) is its name."""
    names = set()
    for target in spec.upstream.get(set_name, {}).values():
        module, name = target.split(":")
        ours = module.startswith("harness.")
        names.add(getattr(load_function(target), "release_name", name) if ours else name)
    return sorted(names)


@contextlib.contextmanager
def kernels_replaced(layer, names, spec, reference):
    """The op's functions `names` in `layer`'s module replaced by `reference` fitted to each
    (`as_release_call`), for the duration."""
    module = sys.modules[type(layer).__module__]
    saved = {name: getattr(module, name) for name in names if callable(getattr(module, name, None))}
    try:
        for name, original in saved.items():
            setattr(module, name, as_release_call(reference, original, spec))
        yield
    finally:
        for name, original in saved.items():
            setattr(module, name, original)


def _run(layer, x, dy, segments, cache_class, backward, mask=None):
    """`run_segments` of a copy of the release's layer: one call (with `mask` as its
    attention_mask, where given), or segments through a new cache of the release's; keywords
    the call does not need are not passed (fla 0.1's LinearAttention.forward takes x alone)."""
    chained = len(segments) > 1
    call = ({"use_cache": True} if chained else {}) | ({} if mask is None else {"attention_mask": mask})
    return run_segments(copy.deepcopy(layer), x, dy, segments, cache_class() if chained else None,
                        backward, **call)


def lacks(layer, label: str) -> dict:
    """{row: why} of the rows the release's layer cannot have: its forward names no
    past_key_values (it keeps no cache, so no segments) or no attention_mask (no padded batch)."""
    forward = parameters_of(layer.forward)
    name = f"{label} ({type(layer).__name__}.forward({', '.join(forward)}))"
    rows = ((f"{label}: cache", "past_key_values", "its segments through a cache are"),
            (f"{label}: padded batch", "attention_mask", "its left-padded batch is"))
    return {row: f"{name} takes no {keyword}: {what} not run" for row, keyword, what in rows
            if keyword not in forward}


def layer_rows(spec, case, impl, set_name: str, device, make_row, backward=True) -> list[dict]:
    """Rows (check "layer", tensors "<set> layer: ...") of the set's own layer in `impl`'s mode;
    without `backward`, of its forward alone."""
    target, arguments = spec.layer.upstream[set_name]
    label = f"{set_name} layer"
    dtype = case.torch_dtype
    try:
        cache_class = load_function(CACHES[set_name])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(case.seed)
            layer = load_function(target)(mode=impl.variant, layer_idx=0,
                                          **shape_arguments(case, arguments)).to(device=device, dtype=dtype)
        layer.train(backward)   # an inference kernel's layer runs in inference (fla's refuse training there)
    except Exception as exc:
        return [make_row("layer", label, verdict="SKIP", message=f"{target} in mode {impl.variant} does not "
                         f"build here: {type(exc).__name__}: {exc}"[:500])]
    gen = torch.Generator().manual_seed(case.seed + 1)
    width = layer.hidden_size
    x = torch.randn(case.B, case.T, width, generator=gen).to(device=device, dtype=dtype)
    dy = torch.randn(case.B, case.T, width, generator=gen).to(device=device, dtype=dtype)
    golden_fn = load_function(spec.reference_loop if case.T <= spec.loop_max_T else spec.reference_chunked)
    draws = baseline_functions(spec, dtype)
    names = release_names(spec, set_name)
    rows = [] if backward else [no_gradients_row(make_row, f"{label}: ")]

    def references(x_, dy_, segments, mask=None):
        with kernels_replaced(layer, names, spec, golden_fn), helpers_in_float32(HELPERS[set_name]):
            gold = _run(copy.deepcopy(layer).double(), x_.double(), dy_.double(), segments, cache_class,
                        backward, mask)[:2]
        bases = []
        for baseline_fn in draws:
            with kernels_replaced(layer, names, spec, baseline_fn):
                bases.append(_run(layer, x_, dy_, segments, cache_class, backward, mask)[:2])
        return gold, bases

    def compare(suffix, got, gold, base):
        rows.extend(compare_runs(make_row, case, f"{label}: ", suffix, got, gold, base, x.shape))

    step = "its references"
    try:
        whole = [(0, case.T)]
        gold, base = references(x, dy, whole)
        step = "its forward and backward" if backward else "its forward"
        y, grads, x_after, _ = _run(layer, x, dy, whole, cache_class, backward)
        compare("", (y, grads), gold, base)
        if not bitwise_equal(x_after, x):
            rows.append(make_row("layer", f"{label}: x", verdict="FAIL", message=f"the layer wrote into "
                                 f"its input ({describe_difference(x_after, x)} changed)"))
        lacking = lacks(layer, label)
        rows += [make_row("layer", row, verdict="SKIP", message=why) for row, why in lacking.items()]
        segments = segment_bounds(case.T)
        if segments and f"{label}: cache" not in lacking:
            step = "its segments through the cache"
            gold_s, base_s = references(x, dy, segments)
            broken_chain = chain_difference(*gold_s, *gold, rel_tol=CHAIN_REL_TOL_FLOAT32_HELPERS)
            rows.append(make_row("layer", f"{label}: float64 segments", verdict="FAIL" if broken_chain
                                 else "PASS", message=broken_chain))
            y, grads, _, handed = _run(layer, x, dy, segments, cache_class, backward)
            compare(" (segments)", (y, grads), gold_s, base_s)
            changed = [describe_difference(a, b) for a, b in handed if not bitwise_equal(a, b)]
            rows.append(make_row("layer", f"{label}: cache", verdict="FAIL" if changed else "PASS",
                                 message=f"the layer wrote into the cached state ({changed[0]} changed)"
                                 if changed else ""))
        if case.B > 1 and case.T > PADDED and f"{label}: padded batch" not in lacking:
            step = "a left-padded batch"
            rows += _padded_rows(layer, x, dy, references, cache_class, label, case, make_row, dtype,
                                 backward)
    except Exception as exc:
        rows.append(make_row("layer", label, verdict="ERROR", message=f"{step} raised "
                             f"{type(exc).__name__}: {exc}"[:500]))
    return rows


def _padded_rows(layer, x, dy, references, cache_class, label, case, make_row, dtype, backward) -> list[dict]:
    """The batch with its second sequence left-padded by PADDED tokens (attention_mask 0 there):
    its y at the real tokens against the golden of that sequence alone, and its first sequence
    against the golden of the whole first sequence."""
    mask = torch.ones(case.B, case.T, dtype=torch.long, device=x.device)
    mask[1, :PADDED] = 0
    y, *_ = _run(layer, x, torch.zeros_like(dy), [(0, case.T)], cache_class, backward, mask)
    rows = []
    for b, start in ((0, 0), (1, PADDED)):
        xs, dys = x[b:b + 1, start:], dy[b:b + 1, start:]
        (y64, _), bases = references(xs, dys, [(0, xs.shape[1])])
        rows.append(make_row("layer", f"{label}: y (padded batch, sequence {b})", **compare_to_golden(
            y[b:b + 1, start:], y64, [yb for yb, _ in bases],
            tolerance_for(case.op, "o", case.dtype, case.T, case.dtype),
            True, dtype)))
    return rows
