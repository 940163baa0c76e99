"""Implementation sets from elsewhere, run through the same sweeps and checks as ours.

`--impl fla` puts upstream flash-linear-attention's public functions in the place of our variants,
for every variant fla has (each op's declaration lists them under `upstream`). Each is fitted to
the signature of its release (`fitted`: the layout of releases before the head_first change, inputs
a release names or places otherwise, its own default scale, functions it only stubs). Adapters fit
calling conventions only: what a release computes wrongly stays for the checks to find.

Linear attention differs in the op, not only in the call: fla normalises by default
(`normalize=True` divides o_t by scale q_t . z_t, z_t the running key sum), the op defined here is
the unnormalised one, so the adapters below pass `normalize=False` unless the case's option asks
for `normalize=True`. The option's state is the pair (S, z): fla takes and gives it from 0.5.0;
before, it gives S alone and starts z afresh with each call, so a case with an initial state is a
SKIP there, and without one only its o and S are compared.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys

from harness import interpreted_upstream
from harness.execution import RunFailed, describe_error
from harness.registry import get_op

SETS = ("fla",)   # the sets an op may declare counterparts in (its declaration's `upstream`)


def available(name: str) -> str:
    """'' when the set's package imports, else why not (one sentence)."""
    if name == "fla":
        interpreted_upstream.prepare()
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


# names inputs had in earlier releases: fla 0.1's chunk_rwkv6 took (q, k, v, g, u), later (r, k, v, w, u)
EARLIER_NAMES = {"r": "q", "w": "g"}


def fitted(fn, input_names: list[str]):
    """`fn` called as the harness calls every implementation (the op's inputs in its order, then
    keywords), fitted to the signature of the release it comes from:
    - a release from before the layout change (a `head_first` parameter defaulting to True) is
      asked for the [B, T, H, ...] layout with head_first=False;
    - an input the release names otherwise goes under the release's name (`_release_name`), and
      from the first input the release takes at another place (fla 0.3's
      fused_recurrent_gated_delta_rule takes gk and gv before beta) the inputs go by keyword;
    - scale=None is left out where the release means its default by something else (fla 0.1's
      fused_chunk_gla: -1), so that it is K ** -0.5 there too;
    - a NotImplementedError of the call (a function the release only stubs, as fused_chunk_gla
      from fla 0.4.1) is a SKIP saying that the release lacks it.
    Inputs go by position where the signature cannot be read or names an input in no known way."""
    parameters = parameters_of(fn)
    head_first = parameters.get("head_first")
    old_layout = head_first is not None and head_first.default is True
    names, first = release_keywords(parameters, input_names)
    scale = parameters.get("scale")
    scale_sentinel = scale is not None and scale.default not in (None, scale.empty)
    label = _label(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if old_layout:
            kwargs.setdefault("head_first", False)
        if scale_sentinel and "scale" in kwargs and kwargs["scale"] is None:
            del kwargs["scale"]
        if len(args) <= len(input_names):   # more: inputs an option adds, whose place is the caller's
            kwargs.update(zip(names[first:], args[first:]))
            args = args[:first]
        try:
            return fn(*args, **kwargs)
        except NotImplementedError as exc:
            raise _lacks(f"{label} raises {describe_error(exc)}") from exc
    call.package_under_test = (getattr(fn, "package_under_test", None)   # an adapter's, as it says
                               or (getattr(fn, "__module__", "") or "").split(".")[0] or None)
    return call


def set_function(target: str, spec):
    """The 'module:function' of an implementation set, loaded and fitted to its release, as the
    sweep and the bench call it. A release without the module or the function (kda before fla
    0.4) lacks it: each case is a SKIP row saying so. A module there that fails to import is the
    release's error: each case an ERROR row with it. Either way the sweep goes on."""
    module_name, fn_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a release's module can fail on import with anything
        if isinstance(exc, ModuleNotFoundError) and exc.name and module_name.startswith(exc.name):
            return _failing(target, f"{release(module_name.split('.')[0])} has no module {module_name}")
        return _failing(target, f"{module_name} does not import: {describe_error(exc)}", "ERROR")
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        return _failing(target, f"{release(module_name.split('.')[0])}'s {module_name} has no {fn_name}")
    return fitted(fn, [s.name for s in spec.inputs])


def _failing(target: str, what: str, verdict: str = "SKIP"):
    """A stand-in for `target` whose every call fails: a SKIP row saying the release lacks `what`,
    or an ERROR row saying `what` went wrong."""
    def call(*args, **kwargs):
        raise _lacks(what) if verdict == "SKIP" else RunFailed(what, {})
    call.__name__ = target.split(":")[1]
    call.package_under_test = target.split(".")[0]
    return call


@functools.lru_cache(maxsize=None)
def _fitted_once(fn):
    """`fitted` of a linear-attention function, read once per function, not at every call."""
    return fitted(fn, ["q", "k", "v"])


def parameters_of(fn) -> dict:
    """{name: inspect.Parameter} of `fn`'s signature, empty where it cannot be read."""
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def release_keywords(parameters: dict, input_names: list[str]) -> tuple[list[str], int]:
    """(the release's name of each input, the index of the first input the release takes at
    another place, from which they go by keyword); every input by position where the release
    has a name for none of the ways in `_release_name`."""
    places = [n for n, p in parameters.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    names = [_release_name(i, n, parameters, places, input_names) for i, n in enumerate(input_names)]
    if None in names:
        return list(input_names), len(input_names)
    first = next((i for i, name in enumerate(names) if i >= len(places) or places[i] != name), len(names))
    return names, first


def _release_name(i: int, name: str, parameters: dict, places: list, input_names: list) -> str | None:
    """The release's name of input `name` (the i-th): its own or its earlier one (EARLIER_NAMES);
    else the release's parameter at its place where that is no other input's (fla's
    fused_recurrent_gla takes g as gk); else its own where the release takes any keyword (fla's
    stubs take only **kwargs); else None."""
    for candidate in (name, EARLIER_NAMES.get(name)):
        if candidate in parameters:
            return candidate
    if i < len(places) and places[i] not in input_names:
        return places[i]
    return name if any(p.kind == p.VAR_KEYWORD for p in parameters.values()) else None


def _label(fn) -> str:
    """"fla 0.4.2's fused_chunk_gla": the function under its package's name and version."""
    package = (getattr(fn, "__module__", "") or "").split(".")[0]
    version = getattr(sys.modules.get(package), "__version__", "")
    return f"{package} {version}".strip() + f"'s {getattr(fn, '__name__', 'function')}"


def _version(package: str) -> tuple:
    """The package's version as numbers ((0, 4, 2)); () where it says none."""
    text = getattr(importlib.import_module(package), "__version__", "") or ""
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _lacks(what: str) -> RunFailed:
    """The SKIP of a call the release cannot make: `what` it lacks, in words."""
    return RunFailed(f"the release lacks what this case calls: {what}", {}, verdict="SKIP")


def targets(name: str, op: str) -> dict:
    """{variant: 'module:function'} of set `name` for `op` (empty when it has none)."""
    return dict(get_op(op).upstream.get(name, {}))


STATEFUL_NORMALIZE = (0, 5)   # the fla release from which normalize=True takes and gives (S, z)


def _linear_attn(function: str):
    def run(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=False,
            cu_seqlens=None):
        fn = getattr(importlib.import_module("fla.ops.linear_attn"), function)
        options = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        if options and "cu_seqlens" not in parameters_of(fn):
            raise _lacks(f"{_label(fn)} takes no cu_seqlens")
        stateless = normalize and () < _version("fla") < STATEFUL_NORMALIZE   # (): unknown, the newest
        if stateless and isinstance(initial_state, tuple):
            raise _lacks(f"{_label(fn)} takes no normaliser state z0 with normalize=True")
        o, final = _fitted_once(fn)(q, k, v, scale=scale, initial_state=initial_state,
                                    output_final_state=output_final_state, normalize=normalize,
                                    **options)
        if stateless and output_final_state:
            raise RunFailed(f"the release lacks the final zt: {_label(fn)} keeps no normaliser state "
                            "with normalize=True, so the gradients, which zt's reaches, are not "
                            "compared", {"o": o.detach(), "ht": final.detach()}, "zt", verdict="SKIP")
        return o, final
    run.__name__ = f"fla_{function}"
    run.release_name = function   # the name a layer's module calls it by
    run.__doc__ = (f"fla's {function} with normalize=False unless asked (the op as defined here), "
                   "cu_seqlens passed on when given; the normaliser state as the module says.")
    run.package_under_test = "fla"   # harness.allocations poisons fla's allocations, not ours
    return run


fla_chunk_linear_attn = _linear_attn("chunk_linear_attn")
fla_fused_chunk_linear_attn = _linear_attn("fused_chunk_linear_attn")
fla_fused_recurrent_linear_attn = _linear_attn("fused_recurrent_linear_attn")
