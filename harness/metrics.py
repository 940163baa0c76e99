"""Distances of one tensor from the float64 golden, and the verdict under a tolerance."""
from __future__ import annotations

import math

import torch

from harness.tolerance import Tolerance


def _max(x: torch.Tensor) -> float:
    return x.max().item() if x.numel() else 0.0


def first_bad_index(bad: torch.Tensor, seq_layout: bool) -> str:
    """The earliest offending index: (b, t, h) by time for [B, T, H, ...] tensors, else the raw index."""
    idx = bad.nonzero()
    if not len(idx):
        return ""
    if seq_layout and bad.dim() >= 3:
        order = idx[:, 1] * bad.shape[0] * bad.shape[2] + idx[:, 0] * bad.shape[2] + idx[:, 2]
        b, t, h = idx[order.argmin(), :3].tolist()
        return f"(b={b}, t={t}, h={h})"
    return str(tuple(idx[0].tolist()))


def nonfinite_counts(x: torch.Tensor) -> tuple[int, int]:
    return int(torch.isnan(x).sum()), int(torch.isinf(x).sum())


def compare_to_golden(x, gold, base, tol: Tolerance, seq_layout: bool, expected_dtype=None) -> dict:
    """Metrics and verdict of kernel tensor `x` against golden `gold` (float64) and baseline `base`.

    `expected_dtype` is the dtype the public contract promises (default: x's own); the floor is the
    rounding of the golden into it, and a tensor returned in another dtype fails.
    """
    if x is None:
        return _missing(tol)
    if tuple(x.shape) != tuple(gold.shape):
        return {"verdict": "FAIL", "message": f"shape {tuple(x.shape)} differs from the golden's "
                f"{tuple(gold.shape)}", "bound": math.nan, "atol": tol.atol}
    gold_finite = torch.isfinite(gold)
    x64 = x.detach().to(torch.float64)
    nan, inf = nonfinite_counts(x64)
    bad = ~torch.isfinite(x64) & gold_finite
    diff = (x64 - gold).abs().where(gold_finite & ~bad, torch.zeros((), dtype=torch.float64, device=gold.device))
    gold_clean = gold.where(gold_finite, torch.zeros((), dtype=torch.float64, device=gold.device))
    gold_max = _max(gold_clean.abs())
    err = math.inf if bad.any() else _max(diff)
    base_diff = (base.detach().to(torch.float64) - gold_clean).abs()
    base_err = _max(base_diff.where(gold_finite, torch.zeros_like(base_diff)))
    expected_dtype = expected_dtype or x.dtype
    floor = _max((gold_clean.to(expected_dtype).to(torch.float64) - gold_clean).abs())
    bound = tol.bound(base_err, floor)
    rms_gold = gold_clean.pow(2).mean().sqrt().item() if gold.numel() else 0.0
    rms_diff = diff.pow(2).mean().sqrt().item() if gold.numel() else 0.0
    row = {
        "err": err, "rel": err / gold_max if gold_max else (0.0 if err == 0 else math.inf),
        "rms_rel": rms_diff / rms_gold if rms_gold else (0.0 if rms_diff == 0 else math.inf),
        "base_err": base_err, "floor": floor, "atol": tol.atol, "bound": bound,
        "ratio": err / bound if bound else (0.0 if err == 0 else math.inf),
        "nan": nan, "inf": inf, "first_bad": first_bad_index(bad, seq_layout),
    }
    if not math.isfinite(base_err):
        row.update(verdict="ERROR", message="the same-dtype baseline is not finite here, so no bound "
                   "can be formed (a harness problem, not the kernel's)")
    elif x.dtype != expected_dtype:
        row.update(verdict="FAIL", message=f"returned in {_name(x.dtype)}; the contract is {_name(expected_dtype)}")
    elif bad.any():
        row.update(verdict="FAIL", message=f"{nan} NaN and {inf} Inf where the golden is finite; "
                   f"first at {row['first_bad']}")
    elif err > bound:
        row.update(verdict="FAIL", message=_bound_sentence(err, tol, base_err, floor, row["rel"]))
    else:
        row.update(verdict="PASS", message="")
    return row


def compare_variants(xa, xb, gold, bound: float, seq_layout: bool) -> dict:
    """Agreement of two implementations: max|xa - xb| within the sum of their golden bounds."""
    if xa is None or xb is None:
        return {"verdict": "FAIL", "message": "one of the two variants returned no tensor", "bound": bound}
    a64, b64 = xa.detach().to(torch.float64), xb.detach().to(torch.float64)
    bad = torch.isfinite(a64) != torch.isfinite(b64)
    both = torch.isfinite(a64) & torch.isfinite(b64)
    diff = (a64 - b64).abs().where(both, torch.zeros((), dtype=torch.float64, device=a64.device))
    err = math.inf if bad.any() else _max(diff)
    gold_max = _max(gold.abs())
    nan_a, inf_a = nonfinite_counts(a64)
    nan_b, inf_b = nonfinite_counts(b64)
    row = {"err": err, "rel": err / gold_max if gold_max else math.nan, "rms_rel": math.nan,
           "base_err": math.nan, "floor": math.nan, "atol": math.nan, "bound": bound,
           "ratio": err / bound if bound else (0.0 if err == 0 else math.inf),
           "nan": nan_a + nan_b, "inf": inf_a + inf_b, "first_bad": first_bad_index(bad, seq_layout)}
    if bad.any():
        row.update(verdict="FAIL", message=f"one variant is finite where the other is not; first at "
                   f"{row['first_bad']}")
    elif err > bound:
        row.update(verdict="FAIL", message=f"variants differ by {err:.3g}, more than the sum of their "
                   f"bounds {bound:.3g} (rel {row['rel']:.3g})")
    else:
        row.update(verdict="PASS", message="")
    return row


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _missing(tol: Tolerance) -> dict:
    return {"verdict": "FAIL", "message": "the implementation returned no tensor (None) where the "
            "golden has one", "atol": tol.atol, "bound": math.nan}


def _bound_sentence(err, tol, base_err, floor, rel) -> str:
    return (f"err {err:.3g} (rel {rel:.3g}) > bound {tol.bound(base_err, floor):.3g} = "
            f"{tol.factor:g} x baseline err {base_err:.3g} + {tol.floor_factor:g} x floor {floor:.3g} "
            f"+ atol {tol.atol:.3g}")
