"""Implementation sets from elsewhere, run through the same sweeps and checks as ours.

`--impl fla` puts upstream flash-linear-attention's public functions in the place of our variants,
for every variant fla has (each op's declaration lists them under `upstream`). Each is fitted to
the signature of its release (`fitted`: the layout of releases before the head_first change, inputs
a release takes at other places by keyword, such as beta after fla 0.3's gk and gv). One
difference is the op's, not the call's: linear attention, which fla normalises by default (`normalize=True` divides by the running sum of q k^T); the op defined here
is the unnormalised one, so the adapters below pass `normalize=False` unless the case's option
asks for `normalize=True`.
"""
from __future__ import annotations

import functools
import importlib
import inspect

from harness.registry import get_op

SETS = ("fla",)   # the sets an op may declare counterparts in (its declaration's `upstream`)


def available(name: str) -> str:
    """'' when the set's package imports, else why not (one sentence)."""
    if name == "fla":
        try:
            importlib.import_module("fla.ops")
        except Exception as exc:  # an old fla can fail on import with anything
            return (f"fla (flash-linear-attention; pip install fla-core) does not import here: "
                    f"{type(exc).__name__}: {exc}")
    return ""


def release(name: str) -> str:
    """'fla 0.6.0 (fla-core)': the set's package, its version and the distribution that installed
    it, as every row of its implementations carries it ('version unknown' where it says none)."""
    import importlib.metadata as metadata
    module = importlib.import_module(name)
    dists = metadata.packages_distributions().get(name, [])
    version = getattr(module, "__version__", None)
    if version is None and dists:
        version = metadata.version(dists[0])
    where = f" ({', '.join(sorted(set(dists)))})" if dists else ""
    return f"{name} {version or 'version unknown'}{where}"


def fitted(fn, input_names: list[str]):
    """`fn` called as the harness calls every implementation (the op's inputs in its order, then
    keywords), fitted to the signature of the release it comes from:
    - a release from before the layout change (a `head_first` parameter defaulting to True) is
      asked for the [B, T, H, ...] layout with head_first=False;
    - from the first input whose name the release has at another place (fla 0.3's
      fused_recurrent_gated_delta_rule takes gk and gv before beta), the inputs go by keyword.
    `fn` itself where neither applies, or where its signature cannot be read."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn
    names = list(parameters)
    head_first = parameters.get("head_first")
    old_layout = head_first is not None and head_first.default is True
    moved = next((i for i, name in enumerate(input_names)
                  if name in parameters and (i >= len(names) or names[i] != name)), None)
    if moved is not None and not all(name in parameters for name in input_names[moved:]):
        moved = None   # renamed inputs (fla 0.1's chunk_rwkv6 takes q and g): by position
    if not old_layout and moved is None:
        return fn
    first = len(input_names) if moved is None else moved

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if old_layout:
            kwargs.setdefault("head_first", False)
        if len(args) > len(input_names):   # inputs an option adds: their place is the caller's
            return fn(*args, **kwargs)
        keywords = {input_names[i]: x for i, x in enumerate(args) if i >= first}
        return fn(*args[:first], **keywords, **kwargs)
    call.package_under_test = (getattr(fn, "__module__", "") or "").split(".")[0] or None
    return call


def targets(name: str, op: str) -> dict:
    """{variant: 'module:function'} of set `name` for `op` (empty when it has none)."""
    return dict(get_op(op).upstream.get(name, {}))


def _linear_attn(function: str):
    def run(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=False,
            cu_seqlens=None):
        fn = fitted(getattr(importlib.import_module("fla.ops.linear_attn"), function), ["q", "k", "v"])
        options = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        return fn(q, k, v, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state, normalize=normalize, **options)
    run.__name__ = f"fla_{function}"
    run.__doc__ = (f"fla's {function} with normalize=False unless asked (the op as defined here), "
                   "cu_seqlens passed on when given.")
    run.package_under_test = "fla"   # harness.allocations poisons fla's allocations, not ours
    return run


fla_chunk_linear_attn = _linear_attn("chunk_linear_attn")
fla_fused_chunk_linear_attn = _linear_attn("fused_chunk_linear_attn")
fla_fused_recurrent_linear_attn = _linear_attn("fused_recurrent_linear_attn")
