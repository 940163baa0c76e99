"""A synthetic results frame shaped like a real sweep, for demos and for trying the renderers.

`python -m reports.demo OUT.html` writes a sample page.
"""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from .schema import COLUMNS

_OPS = {
    "gla": (("chunk", "fused_chunk", "fused_recurrent"), ("o", "ht", "dq", "dk", "dv", "dg", "dh0")),
    "rwkv6": (("chunk", "fused_recurrent"), ("o", "ht", "dr", "dk", "dv", "dw", "du", "dh0")),
}
_EPS = {"fp32": 1.2e-7, "bf16": 7.8e-3}
_RUN = dict(run_id="demo-run", device="NVIDIA H100 80GB HBM3", torch="2.11.0", triton="3.6.0",
            git="abc1234")


def _golden(rng, base: dict, op: str, v: str, t: str, eps: float, planted: bool) -> dict:
    T, dtype, gate = base["T"], base["dtype"], base["gate"]
    scale = 10.0 if t == "ht" else 1.0
    base_err = eps * scale * T ** 0.5 * rng.uniform(0.5, 2)
    floor = eps * scale * 0.5
    bound = (3 if t.startswith("d") else 2) * base_err + 2 * floor + 1e-6
    err = bound * min(rng.lognormal(-1.6, 0.7), 0.97)
    nan, first_bad, message = 0, "", ""
    if planted and (op, v, dtype, gate, t) == ("gla", "fused_chunk", "bf16", "strong", "o") \
            and T == base["_Tmax"]:
        err, nan, first_bad = np.inf, 37, "(0, 3811, 1)"
        message = f"{nan} NaN and 0 Inf where the golden is finite; first at {first_bad}"
    elif planted and (op, v, dtype, t) == ("rwkv6", "chunk", "bf16", "dk") and T >= 1024:
        err = bound * 3.2
        message = (f"err {err:.3g} > bound {bound:.3g} = 3 * base_err {base_err:.3g} "
                   f"+ 2 * floor {floor:.3g}")
    return dict(base, variant=v, impl="ours", check="golden", tensor=t, err=err,
                rel=err / (scale * 3), rms_rel=err / (scale * 9), base_err=base_err, floor=floor,
                atol=1e-6, bound=bound, ratio=err / bound, nan=nan, inf=0, first_bad=first_bad,
                verdict="PASS" if err <= bound else "FAIL", message=message)


def synthetic_results(Ts=(16, 64, 256, 1024, 4096), seed: int = 0, planted: bool = True) -> pd.DataFrame:
    """Rows for gla and rwkv6 over `Ts` x {fp32, bf16} x 2 gates, golden and agreement checks,
    in the harness's conventions (impl "ours", agreement variant "chunk~fused_recurrent").
    With `planted`: a NaN FAIL (gla fused_chunk bf16, strong gate, largest T), ratio FAILs
    (rwkv6 chunk dk bf16, T >= 1024), an ERROR whose message holds markup; SKIPs always."""
    rng = np.random.default_rng(seed)
    rows = []
    for op, (variants, tensors) in _OPS.items():
        for dtype, eps in _EPS.items():
            for T in Ts:
                for gate in ("normal", "strong"):
                    base = dict(_RUN, case_id=f"{op}-{dtype}-T{T}-{gate}", op=op, dtype=dtype, B=2,
                                T=T, H=2, K=64, V=64, M=np.nan, h0="grad", gate=gate,
                                seed=1000 + T, wall_s=round(0.05 * T ** 0.5, 3), _Tmax=max(Ts))
                    for v in variants:
                        planted_error = ("rwkv6", "fused_recurrent", "bf16", "strong", min(Ts))
                        if planted and (op, v, dtype, gate, T) == planted_error:
                            rows.append(dict(base, variant=v, impl="ours", check="run", tensor="",
                                             verdict="ERROR", message="CompilationError: at 12:4: "
                                             "<tl.dot> shape [16, 64] vs [64, 16] & more"))
                        elif (v, dtype) == ("fused_chunk", "fp32") and T == max(Ts):
                            rows.append(dict(base, variant=v, impl="ours", check="run", tensor="",
                                             verdict="SKIP", message="T too long for the interpreter"))
                        else:
                            rows += [_golden(rng, base, op, v, t, eps, planted) for t in tensors]
                    for t in ("o", "ht"):
                        bound = 4 * eps * T ** 0.5
                        err = bound * rng.uniform(0.05, 0.7)
                        rows.append(dict(base, variant="chunk~fused_recurrent", impl="ours~ours",
                                         check="agreement", tensor=t, err=err, bound=bound,
                                         ratio=err / bound, nan=0, inf=0, verdict="PASS", message=""))
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


if __name__ == "__main__":
    from .html import write_html
    out = sys.argv[1] if len(sys.argv) > 1 else "sample_report.html"
    write_html(synthetic_results(), out, {"command": "python -m harness sweep --op gla rwkv6"})
    print(out)
