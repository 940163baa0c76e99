"""Implementation sets from elsewhere, run through the same sweeps and checks as ours.

`--impl fla` puts upstream flash-linear-attention's public functions in the place of our variants,
for every variant fla has (each op's declaration lists them under `upstream`). fla's functions
take our positional order and keywords; the differences: fla's fused_recurrent_gated_delta_rule
takes gk and gv between g and beta (an adapter passes beta by keyword), and linear attention, which fla
normalises by default (`normalize=True` divides by the running sum of q k^T); the op defined here
is the unnormalised one, so the adapters below pass `normalize=False` unless the case's option
asks for `normalize=True`.
"""
from __future__ import annotations

import importlib

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


def targets(name: str, op: str) -> dict:
    """{variant: 'module:function'} of set `name` for `op` (empty when it has none)."""
    return dict(get_op(op).upstream.get(name, {}))


def _linear_attn(function: str):
    def run(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=False,
            cu_seqlens=None):
        fn = getattr(importlib.import_module("fla.ops.linear_attn"), function)
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


def fla_fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                         output_final_state=False, use_qk_l2norm_in_kernel=False,
                                         cu_seqlens=None):
    """fla's fused_recurrent_gated_delta_rule in our positional order: fla's takes gk and gv
    between g and beta, so beta goes by keyword; cu_seqlens passed on when given."""
    fn = importlib.import_module("fla.ops.gated_delta_rule").fused_recurrent_gated_delta_rule
    options = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
    return fn(q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state,
              output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
              **options)


fla_fused_recurrent_gated_delta_rule.package_under_test = "fla"
