"""Distances of one tensor from the float64 golden, and the verdict under a tolerance."""
from __future__ import annotations

import math

import torch

from harness.tolerance import Tolerance
from reports.schema import CHANCE_SIGMAS


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


def worst_index(diff: torch.Tensor, seq_layout: bool, names: str = "bth") -> str:
    """Where |diff| is largest: (b, t, h) for [B, T, H, ...] tensors (or the leading axes named
    by `names`), else the raw index."""
    if not diff.numel():
        return ""
    idx = torch.unravel_index(diff.flatten().argmax(), diff.shape)
    idx = [int(i) for i in idx]
    if seq_layout and diff.dim() >= len(names):
        return "(" + ", ".join(f"{n}={i}" for n, i in zip(names, idx)) + ")"
    return str(tuple(idx))


def nonfinite_counts(x: torch.Tensor) -> tuple[int, int]:
    return int(torch.isnan(x).sum()), int(torch.isinf(x).sum())


def half_ulp(magnitude: float, dtype: torch.dtype) -> float:
    """Half the spacing of `dtype`'s values at `magnitude` (0 for 0): the rounding one result of
    that size may carry. The floor takes at least this at the tensor's largest value: the golden's
    own rounding is the max over its elements, and a tensor of a few elements (a layer's
    per-head parameter gradient) can sit next to representable values by chance, leaving a floor
    under one rounding step that a correct result, computed in fp32 and rounded once, crosses."""
    if not magnitude or not math.isfinite(magnitude) or not dtype.is_floating_point:
        return 0.0
    info = torch.finfo(dtype)
    return 0.5 * info.eps * 2.0 ** math.floor(math.log2(max(magnitude, info.smallest_normal)))


FEW_ELEMENTS = 16   # below this many, a tensor's baseline error also takes its draws' spread


def _baseline_error(draws, gold, finite) -> float:
    """The baseline's error of a tensor: the largest over its draws and elements; for a tensor of
    fewer than FEW_ELEMENTS elements at least CHANCE_SIGMAS times their root mean square.

    The largest of a few draws is itself a noisy draw: when every one lands near the golden, a
    kernel rounding as well as they do fails (kda, fp32 layer, dA_log [H = 2]: 0.96 of its bound
    in 24 seeds of a correct kernel; with errors of one spread, the kernel's one element is past
    three times the largest of three draws in 2.4 % of draws, its two in 0.5 %). The root mean
    square over every draw and element is a steadier measure of the spread, and CHANCE_SIGMAS of
    it is what the largest error of a tensor of thousands of elements reaches, so a small tensor
    is held to a large one's allowance (false alarms then below 0.4 % for one element and
    0.04 % for two, with the kernel's spread 1.5 times the baseline's)."""
    errors = [(b.detach().to(torch.float64) - gold).abs().where(finite, 0.0) for b in draws]
    return _at_least_their_spread(max(_max(e) for e in errors), torch.stack(errors),
                                  few=gold.numel() < FEW_ELEMENTS)


def _at_least_their_spread(largest: float, errors: torch.Tensor, few: bool, scale: float = 1.0) -> float:
    """`largest`, or where the errors are `few`, at least CHANCE_SIGMAS times their root mean
    square (times `scale`): the baseline's error when its draws are too few for their largest."""
    if not few or not math.isfinite(largest):
        return largest
    return max(largest, CHANCE_SIGMAS * errors.pow(2).mean().sqrt().item() * scale)


def compare_to_golden(x, gold, base, tol: Tolerance, seq_layout: bool, expected_dtype=None) -> dict:
    """Metrics and verdict of kernel tensor `x` against golden `gold` (float64) and baseline `base`.

    `base` may be several draws of the baseline (the same quantity rounded in another order, as
    the layer check's in three chunk sizes): its error is the largest of theirs, and for a tensor of
    a few elements (a per-head decay parameter's gradient, a sum over every token) at least their
    spread's (`_baseline_error`).
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
    base_err = _baseline_error(base if isinstance(base, (list, tuple)) else [base], gold_clean, gold_finite)
    expected_dtype = expected_dtype or x.dtype
    floor = max(_max((gold_clean.to(expected_dtype).to(torch.float64) - gold_clean).abs()),
                half_ulp(gold_max, expected_dtype))
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
        row.update(verdict="FAIL", message=_bound_sentence(err, tol, base_err, floor, row["rel"]),
                   first_bad=worst_index(diff, seq_layout))
    else:
        row.update(verdict="PASS", message="")
    return row


SUMS = {"t": (1,), "b, t, h": (0, 1, 2)}   # label -> the axes of a [B, T, H, ...] tensor summed


def _sum_errors(y, gold, dims) -> torch.Tensor:
    """|sum(y) - sum(gold)| per sum of `dims` of a [B, T, H, ...] tensor. A sum across batch and
    heads as well adds the B * H sums over tokens, and when there are few of them their errors can
    cancel by chance (H100, simple GLA fp16, B * H = 4: the baseline's total off by a quarter of
    what each of its four sums was): there it is at least the root sum of squares of those sums'
    errors, what independent errors of that size add up to, so that a bound follows what the
    baseline's rounding is rather than the luck of its signs."""
    err = (y.sum(dims) - gold.sum(dims)).abs()
    if dims != (1,):
        per_group = y.sum(1) - gold.sum(1)
        err = torch.maximum(err, per_group.pow(2).sum((0, 1)).sqrt())
    return err


def _error_of_sum(y, gold, dims) -> float:
    """The largest of `_sum_errors`."""
    return _max(_sum_errors(y, gold, dims))


def _chunk_count(T: int, block: int) -> int:
    """The chunks of `block` tokens T tokens count as (a last partial chunk joins the one before)."""
    return max(T // block, 1)


def _chunk_sums(err, block: int) -> torch.Tensor:
    """[B, chunks, H, ...]: a [B, T, H, ...] tensor summed over each `block` tokens, a last
    partial chunk counting with the one before it (so fewer than two chunks are one)."""
    blocks = _chunk_count(err.shape[1], block)
    owner = (torch.arange(err.shape[1], device=err.device) // block).clamp(max=blocks - 1)
    return err.new_zeros(err.shape[0], blocks, *err.shape[2:]).index_add_(1, owner, err)


def few_chunk_sums(shape, block: int) -> bool:
    """Whether the sums over tokens of a [B, T, H, ...] gradient rest on fewer than FEW_ELEMENTS
    chunk sums of one baseline's errors, so that more draws of it are wanted (harness/redraws.py)."""
    return math.prod(shape) // shape[1] * _chunk_count(shape[1], block) < FEW_ELEMENTS


def _baseline_error_of_sum(draws, gold, dims, block: int) -> float:
    """The same-dtype baseline's error of the sums of `dims`, from one or more draws of it (the
    baseline, and the same arithmetic rounded afresh: harness/redraws.py).

    Per draw and sum, `_sum_errors`, and at least what the sum's chunks' errors add up to by
    chance: the root sum of squares of its terms' errors summed over each `block` tokens (the
    baseline's chunk, whose rows share a state and so their errors' signs). One long sum is one
    draw, and a lucky one leaves a correct kernel no room: on the H200, delta_rule's fp16 dbeta
    summed over 16,384 and 65,536 tokens (B = H = 1) sat at 1.46 and 1.50 x a bound of three
    times the baseline's 0.074 and 0.054, where its chunks add up to 0.20 and 0.36, the kernel's
    own deviations spreading 0.16 and 0.29 without leaning (now 0.55 and 0.59); so did fla's bf16
    dbeta over 1,000 and 4,096 tokens (1.20 and 1.35 x, now 0.78 and 0.67). The error is the
    largest over draws and sums; where all the draws together hold fewer than FEW_ELEMENTS chunk
    sums, at least CHANCE_SIGMAS times their root mean square, scaled to the chunks one sum adds
    up (`_at_least_their_spread`, as `_baseline_error` takes a few elements' spread; here the
    draws count together, since the redraws are made to reach FEW_ELEMENTS)."""
    largest, chunk_sums = 0.0, []
    for base in draws:
        chunks = _chunk_sums(base - gold, block)
        chunk_sums.append(chunks)
        largest = max(largest, _max(torch.maximum(_sum_errors(base, gold, dims), chunks.pow(2).sum(dims).sqrt())))
    pooled = torch.stack(chunk_sums)
    per_sum = math.prod(pooled.shape[1 + d] for d in dims)
    return _at_least_their_spread(largest, pooled, few=pooled.numel() < FEW_ELEMENTS, scale=math.sqrt(per_sum))


def _chance_bounds(deviation, rounding, dims, bound: float, atol: float):
    """(bounds, leans): per sum of `dims`, its bound (the tensor's `bound`, or more where chance
    explains the sum) and how far its deviations lean one way, in their root sum of squares.

    A kernel's deviation from the golden rounded to its dtype, summed, is chance where it leans
    one way by at most CHANCE_SIGMAS times the root sum of squares of its terms (terms of random
    sign rarely do more: Hoeffding gives 2 exp(-CHANCE_SIGMAS^2 / 2)); such a sum may also be off
    by the golden's rounding of it plus CHANCE_SIGMAS spreads of fresh roundings (the root sum of
    squares of the golden's). On the H100 a gated delta rule dg summed over 8,192 tokens sat at
    1.02 x a bound whose drawn floor was a fraction of that spread. A sum that leans further
    keeps the baseline's bound, so errors of one sign fail as before."""
    leans = deviation.sum(dims).abs() / deviation.pow(2).sum(dims).sqrt().clamp(min=1e-300)
    allowed = rounding.sum(dims).abs() + CHANCE_SIGMAS * rounding.pow(2).sum(dims).sqrt() + atol
    bounds = torch.where(leans <= CHANCE_SIGMAS, allowed.clamp(min=bound), torch.full_like(allowed, bound))
    return bounds, leans


def compare_sums(x, gold, base, tol: Tolerance, expected_dtype, across_heads: bool, block: int) -> list:
    """[(label, metrics)] of the sums of gradient `x` [B, T, H, ...] over tokens (when T > 1), and
    over batch, tokens and heads (when `across_heads`: B * H > 1), against the golden's sums, in
    float64. `base`: the same-dtype baseline, or several draws of it (harness/redraws.py).

    Errors of one sign that each element hides add up in a sum, where a model's shared parameters
    (a decay bias, a norm's weight) take them. The bound is the tensor's tolerance applied to the
    same sums of the same-dtype baseline (Tolerance.of_sum; at least what the baseline's chunks of
    `block` tokens add up to by chance, `_baseline_error_of_sum`), and the floor is the error of the
    sums of the golden rounded to the tensor's dtype (rounding to nearest has no sign), plus in
    fp32 the accumulation share of each term; across batch and heads, both are at least what
    their sums over tokens add up to (`_error_of_sum`). That floor is one draw of the roundings:
    a kernel's elements, a little off the golden's, round afresh, so a sum whose deviations from
    the rounded golden do not lean one way beyond chance is also allowed its floor plus
    CHANCE_SIGMAS spreads of such roundings (`_chance_bounds`). Each row keeps its sums' spread
    (reports/schema.py), the room the gate gives a sum that a kernel rounds in another order.
    Nothing is compared where the golden row already fails the tensor's shape or type, which its
    row reports."""
    if x is None or tuple(x.shape) != tuple(gold.shape) or not x.is_floating_point():
        return []
    draws = [b.detach().to(torch.float64) for b in (base if isinstance(base, (list, tuple)) else [base])]
    rounded = gold.to(expected_dtype).to(torch.float64)
    element_floor = _max((rounded - gold).abs())
    x64 = x.detach().to(torch.float64)
    deviation = x64 - rounded
    out = []
    for label, dims in SUMS.items():
        if (label == "t" and gold.shape[1] == 1) or (label != "t" and not across_heads):
            continue  # a sum of one term, or the same sum as the other
        terms = math.prod(gold.shape[d] for d in dims)
        gold_sum = gold.sum(dims)
        x_sum = x64.sum(dims)
        spread = _max(deviation.pow(2).sum(dims).sqrt())
        base_err = _baseline_error_of_sum(draws, gold, dims, block)
        sum_tol, floor = tol.of_sum(_error_of_sum(rounded, gold, dims), element_floor, terms)
        diff = (x_sum - gold_sum).abs()
        finite = bool(torch.isfinite(x_sum).all())
        err = _max(diff) if finite else math.inf
        bound = sum_tol.bound(base_err, floor)
        baseline_bound, lean = bound, math.nan
        if finite and err > bound:
            bounds, leans = _chance_bounds(deviation, rounded - gold, dims, bound, tol.atol)
            over = torch.where(bounds > 0, diff / bounds.clamp(min=1e-300), (diff > 0) * math.inf)
            worst = int(torch.argmax(over))
            err, bound = diff.flatten()[worst].item(), bounds.flatten()[worst].item()
            lean = leans.flatten()[worst].item()
        gold_max, rms_gold = _max(gold_sum.abs()), gold_sum.pow(2).mean().sqrt().item()
        row = {"err": err, "rel": err / gold_max if gold_max else (0.0 if err == 0 else math.inf),
               "rms_rel": (diff.pow(2).mean().sqrt().item() / rms_gold if rms_gold else
                           (0.0 if err == 0 else math.inf)),
               "base_err": base_err, "floor": floor, "spread": spread if finite else math.nan,
               "atol": tol.atol, "bound": bound,
               "ratio": err / bound if bound else (0.0 if err == 0 else math.inf),
               "nan": 0, "inf": 0, "first_bad": "", "verdict": "PASS", "message": ""}
        if not math.isfinite(base_err) or not math.isfinite(floor):
            row.update(verdict="ERROR", message="the golden's or the baseline's sums are not finite "
                       "here, so no bound can be formed (a harness problem, not the kernel's)")
        elif not math.isfinite(err):
            row.update(verdict="FAIL", message="the sums are not finite (see the tensor's golden row)")
        elif err > bound:
            names = "bh" if label == "t" else ""
            why = (_bound_sentence(err, sum_tol, base_err, floor, row["rel"]) if bound <= baseline_bound
                   else f"err {err:.3g} (rel {row['rel']:.3g}) > bound {bound:.3g}, the sum's own "
                        f"rounding and {CHANCE_SIGMAS:g} spreads of fresh ones")
            if lean > CHANCE_SIGMAS:
                why += (f"; its deviations from the rounded golden lean one way, {lean:.3g} x their "
                        f"root sum of squares (chance: up to {CHANCE_SIGMAS:g})")
            row.update(verdict="FAIL", first_bad=worst_index(diff, bool(names), names),
                       message=f"the sum over {label}: " + why)
        out.append((label, row))
    return out


def compare_variants(xa, xb, gold, bound: float, seq_layout: bool, floor: float = math.nan,
                     atol: float = math.nan) -> dict:
    """Agreement of two implementations: max|xa - xb| within the sum of their golden bounds; `floor`
    and `atol` are the sums of theirs too (the gate's noise model reads them)."""
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
           "base_err": math.nan, "floor": floor, "atol": atol, "bound": bound,
           "ratio": err / bound if bound else (0.0 if err == 0 else math.inf),
           "nan": nan_a + nan_b, "inf": inf_a + inf_b, "first_bad": first_bad_index(bad, seq_layout)}
    if bad.any():
        row.update(verdict="FAIL", message=f"one variant is finite where the other is not; first at "
                   f"{row['first_bad']}")
    elif err > bound:
        row.update(verdict="FAIL", message=f"variants differ by {err:.3g}, more than the sum of their "
                   f"bounds {bound:.3g} (rel {row['rel']:.3g})", first_bad=worst_index(diff, seq_layout))
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
