"""layer: the op's layer (fla_kernels.layers) around an implementation: output shape, one call and
two segments through the Cache against a float64 golden of the same layer (outputs and parameter
gradients), inputs and cache left untouched, and truncated training segment by segment. The layer
brings its own gates and state, so it runs once per (op, dtype, T) of a plan, on plain batches of
the op's core call in one dtype (a mixed dtype's layer is its activations' dtype's, which runs)."""
from __future__ import annotations

import copy
import functools

import torch

from harness.allocations import package_of
from harness.cases import DTYPES
from harness.checks.check import Check
from harness.checks.bits import bitwise_equal, describe_difference
from harness.checks.segments import segment_bounds
from harness.metrics import compare_to_golden
from harness.declaration import load_function
from harness.tolerance import tolerance_for

def layer_class(spec):
    """The class of the op's layer (its declaration's `layer`), or None."""
    return None if spec.layer is None else load_function(spec.layer.target)


def build_layer(spec, case, device, dtype):
    """The op's layer with heads of K and V, its parameters drawn from the case's seed."""
    kwargs = dict(hidden_size=case.H * case.V, num_heads=case.H, expand_k=case.K / case.V, expand_v=1.0)
    kwargs.update({arg: getattr(case, symbol) for arg, symbol in spec.layer.symbol_args.items()})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed)
        layer = layer_class(spec)(**kwargs)
    return layer.to(device=device, dtype=dtype)


def _run(layer, kernel, x, dy, segments, backward=True):
    """y and the parameter gradients of sum(y * dy) (with `backward`), the sequence in one call or
    in segments chained through the Cache; the cache states handed in are checked afterwards."""
    layer = copy.deepcopy(layer)
    layer.kernel = kernel
    return run_segments(layer, x, dy, segments, use_cache=True, backward=backward)


def run_segments(layer, x, dy, segments, cache=None, backward=True, **call):
    """(y, the parameter gradients of sum(y * dy), x after, [(a state handed in, its copy)]) of
    `layer` over x's `segments`, each call taking the cache the last one returned (from `cache`;
    none passed without one) and the keywords `call`; without `backward`, no gradients ({}). A
    layer returns (y, attentions, cache), or y alone where it keeps no cache (fla's
    LinearAttention before 0.4). x is copied first, so a layer that writes into it shows."""
    x = x.detach().clone()
    pieces, handed = [], []
    with torch.set_grad_enabled(backward):
        for t0, t1 in segments:
            if cache is not None and len(cache) > 0:
                handed += [(t, t.detach().clone()) for t in tensors_in(cache[0])]
            out = layer(x[:, t0:t1], **({} if cache is None else {"past_key_values": cache}), **call)
            y, cache = (out[0], out[-1]) if isinstance(out, tuple) else (out, None)
            pieces.append(y)
        y = torch.cat(pieces, dim=1)
    if backward:
        (y * dy).sum().backward()
    grads = {f"d{name}": p.grad for name, p in layer.named_parameters() if p.grad is not None}
    return y.detach(), grads, x, handed


def tensors_in(entry) -> list:
    """Every tensor of a cache entry (a tensor, or a dict, tuple or list of them, nested)."""
    if isinstance(entry, torch.Tensor):
        return [entry]
    if isinstance(entry, dict):
        entry = list(entry.values())
    if isinstance(entry, (tuple, list)):
        return [t for e in entry for t in tensors_in(e)]
    return []


def baseline_functions(spec, dtype) -> list:
    """The same-dtype baseline in chunks of the production size, of half and of a quarter of it:
    three draws of a same-dtype computation's rounding. A layer's per-head parameter gradient is
    one element, a sum over every token, whose one draw can land next to the golden by chance
    (gated_delta_rule, bf16, T = 43884: dA_log 0.019 from it in chunks of 64, 0.48 in chunks of
    32; fp16, T = 16384, ddt_bias 0.0006 to 0.063 over chunks and call patterns); every row takes
    the largest error (`compare_to_golden`)."""
    chunked = load_function(spec.reference_chunked)
    return [functools.partial(chunked, operand_dtype=dtype, chunk_size=spec.baseline_chunk_size // parts)
            for parts in (1, 2, 4)]


def compare_runs(make_row, case, prefix: str, label: str, got, gold, bases, shape) -> list[dict]:
    """Rows "<prefix>y<label>" and "<prefix>d<parameter><label>" of a layer run against its golden
    and the baseline's draws (each (y, parameter gradients); `baseline_functions`): the output,
    then every gradient the golden has."""
    (y, grads), (y64, g64) = got, gold
    if tuple(y.shape) != tuple(shape):
        return [make_row("layer", f"{prefix}y{label}", verdict="FAIL",
                         message=f"output shape {tuple(y.shape)}, expected {tuple(shape)}")]
    dtype = case.torch_dtype
    tol = tolerance_for(case.op, "o", case.dtype, case.T, case.dtype)
    rows = [make_row("layer", f"{prefix}y{label}", **_prefixed(label, compare_to_golden(
        y, y64, [yb for yb, _ in bases], tol, True, dtype)))]
    tol = tolerance_for(case.op, "dq", case.dtype, case.T, case.dtype)
    for name in sorted(g64):
        rows.append(make_row("layer", f"{prefix}{name}{label}", **_prefixed(label, compare_to_golden(
            grads.get(name), g64[name], [gb[name] for _, gb in bases], tol, False, dtype))))
    return rows


# float64 through the cache against one float64 call: rounding differs by ~1e-15 (the loop) to
# ~1e-13 (the chunked golden, whose chunks the cuts move); a layer that loses state is off by O(1)
CHAIN_REL_TOL = 1e-9


def _float64_chain_differs(layer, golden_fn, x, dy, segments, y64, g64, backward=True) -> str:
    """'' when the float64 layer run through the cache in `segments` gives one call's output and
    parameter gradients (to CHAIN_REL_TOL of each's largest value); else what differs. Both sides
    are the golden, so a difference is the layer's (its cache loses or misplaces state), which
    the kernel rows, bounded by a baseline through the same layer, cannot show."""
    if not segments:
        return ""
    y, grads, _, _ = _run(copy.deepcopy(layer).double(), golden_fn, x.double(), dy.double(), segments,
                          backward)
    return chain_difference(y, grads, y64, g64)


def chain_difference(y, grads, y64, g64, rel_tol: float = CHAIN_REL_TOL) -> str:
    """'' when a float64 layer's output and parameter gradients through the cache (y, grads) are
    one call's (y64, g64) to `rel_tol` of each's largest value; else what differs."""
    for name, got, want in [("y", y, y64), *((n, grads.get(n), g64[n]) for n in g64)]:
        if got is None or want is None:
            continue
        err, scale = (got - want).abs().max().item(), want.abs().max().item()
        if not err <= rel_tol * max(scale, 1e-300):
            return (f"the float64 layer through the cache differs from one call in {name} by "
                    f"{err:.3g} (max {scale:.3g}): the layer loses or misplaces state between calls")
    return ""


def _training_runs(layer, kernel, x, segments) -> str:
    """'' when a forward and backward per segment, with the state detached between segments,
    runs; else the error."""
    layer = copy.deepcopy(layer)
    layer.kernel = kernel
    cache = None
    try:
        for t0, t1 in segments:
            y, _, cache = layer(x[:, t0:t1], use_cache=True, past_key_values=cache)
            y.float().pow(2).mean().backward()
            cache = cache.detach()
    except Exception as exc:  # reported as the row's message
        return f"{type(exc).__name__}: {exc}"
    return ""


def no_gradients_row(make_row, label: str) -> dict:
    """The row of a layer run on an implementation without a backward: what is checked instead."""
    return make_row("layer", f"{label}gradients", verdict="SKIP", message="the implementation has no "
                    "backward (its run's row says why): the layer's output, cache and input are checked")


def layer_rows(spec, case, impl, device, make_row, backward=True) -> list[dict]:
    """Rows (check "layer") for one implementation; `make_row(check, tensor, **fields)`; without
    `backward`, of the forward alone."""
    if spec.layer is None:
        return []
    dtype = case.torch_dtype
    layer = build_layer(spec, case, device, dtype)
    gen = torch.Generator().manual_seed(case.seed + 1)
    x = torch.randn(case.B, case.T, case.H * case.V, generator=gen).to(device=device, dtype=dtype)
    dy = torch.randn(case.B, case.T, case.H * case.V, generator=gen).to(device=device, dtype=dtype)
    whole = [(0, case.T)]
    golden_fn = load_function(spec.reference_loop if case.T <= spec.loop_max_T else spec.reference_chunked)
    y64, g64, _, _ = _run(copy.deepcopy(layer).double(), golden_fn, x.double(), dy.double(), whole,
                          backward)
    segments = segment_bounds(case.T)
    broken_chain = _float64_chain_differs(layer, golden_fn, x, dy, segments, y64, g64, backward)
    # the baseline runs each call pattern itself: segments round differently from one call
    draws = baseline_functions(spec, dtype)
    baselines = {label: [_run(layer, fn, x, dy, bounds, backward)[:2] for fn in draws]
                 for label, bounds in (("", whole), (" (segments)", segments)) if bounds}
    rows = [] if backward else [no_gradients_row(make_row, "")]

    def compare(label, y, grads):
        rows.extend(compare_runs(make_row, case, "", label, (y, grads), (y64, g64), baselines[label],
                                 x.shape))

    try:
        y, grads, x_after, _ = _run(layer, impl.fn, x, dy, whole, backward)
        compare("", y, grads)
        if segments:
            y, grads, _, handed = _run(layer, impl.fn, x, dy, segments, backward)
            compare(" (segments)", y, grads)
            changed = [describe_difference(a, b) for a, b in handed if not bitwise_equal(a, b)]
            rows.append(make_row("layer", "float64 segments", verdict="FAIL" if broken_chain else "PASS",
                                 message=broken_chain))
            rows.append(make_row("layer", "cache", verdict="FAIL" if changed else "PASS",
                                 message=f"the layer wrote into the cached state ({changed[0]} changed)"
                                 if changed else ""))
            if backward:
                error = _training_runs(layer, impl.fn, x, segments)
                rows.append(make_row("layer", "training", verdict="ERROR" if error else "PASS",
                                     message=f"backward per detached segment: {error}" if error else ""))
        if not bitwise_equal(x_after, x):
            rows.append(make_row("layer", "x", verdict="FAIL", message=f"the layer wrote into its input "
                                 f"({describe_difference(x_after, x)} changed)"))
    except Exception as exc:
        rows.append(make_row("layer", "", verdict="ERROR",
                             message=f"the layer's forward and backward raised {type(exc).__name__}: "
                                     f"{exc}"[:500]))
    return rows


def _prefixed(label: str, metrics: dict) -> dict:
    if label and metrics.get("message"):
        metrics["message"] = f"through the cache{label}: {metrics['message']}"
    return metrics


def rows(ctx, impl, execution) -> list[dict]:
    """Our layer around the implementation; and for an implementation of a set whose own layer
    the op declares (`LayerSpec.upstream`), that layer on its own kernels (harness/upstream_layers.py);
    of the forward alone for an implementation without a backward."""
    make_row = lambda check, tensor, **fields: ctx.row(impl, check, tensor, **fields)  # noqa: E731
    found = layer_rows(ctx.spec, ctx.case, impl, ctx.device, make_row, execution.backward)
    set_name = package_of(impl.fn)
    if set_name in ctx.spec.layer.upstream:
        from harness import upstream_layers   # it builds on this module's helpers
        found += upstream_layers.layer_rows(ctx.spec, ctx.case, impl, set_name, ctx.device, make_row,
                                            execution.backward)
    return found


CHECK = Check("layer", rows, group=("op", "dtype", "T"), forward_only=True,
              applies=lambda ctx, impl: ctx.spec.layer is not None and not ctx.case.packed
              and ctx.case.option == "none" and ctx.sample is None and ctx.case.dtype in DTYPES)
