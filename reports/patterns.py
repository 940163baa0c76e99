"""What the failing rows of a run have in common, in one sentence per implementation and dtype, so
a reader sees the likely cause before the list of rows: failing only when the final state is in
the loss, only under strong decay, only at long T, only with an initial state, only when the
sequence is split into calls, only in a gradient's sums over tokens, or, in an fp32 run, with the errors of products in a narrower format
(tf32, fp16, bf16). The sentences describe the rows; they change no verdict."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .schema import FINAL_STATE_UNUSED

from .results import coerce_results, fmt_num, subject, tensor_sort_key

# Values rounded to nearest with p significand bits (the leading one counted) are off by an rms
# relative error of 0.4 * 2^-p and, over many elements, by a largest one of about 0.8 * 2^-p of the
# largest value (tests/test_patterns.py measures both): each gives an estimate of p from a row.
RMS_REL_AT_1_BIT = 0.4
MAX_REL_AT_1_BIT = 0.8
# Formats an fp32 kernel's products may go through: (name, fewest, most significand bits they keep).
# The tensor cores read an fp32 operand as tf32 by truncating it (the error of rounding to 10 bits);
# rounded first, tf32 keeps 11, as fp16 does; conversions to bf16 round (8 bits).
FORMATS = (("tf32", 10, 11), ("fp16", 11, 11), ("bf16", 8, 8))
# An output adds up the roundings of every operand it is made of, so its errors show up to about two
# bits fewer than its operands kept (rows of tests.implementations.through_tf32: 8.6 bits; of
# through_bf16: 7.1), never more.
SHORTFALL_BITS = 2.0
SPREAD_BITS = 1.0  # the middle half of the failing rows' estimates within a bit of each other
AGREE_BITS = 1.5   # and each row's two estimates, in the median: an error that sits in a few
                   # elements has a largest error far above its rms, unlike a rounding


def _tensors(names) -> str:
    return ", ".join(sorted(set(names), key=tensor_sort_key))


def _only_at(bad: pd.DataFrame, rows: pd.DataFrame) -> list[str]:
    """Phrases for the axes on which the failures take only some of the values the rows take."""
    phrases = []
    for axis, say in (("gate", "under {} decay"), ("h0", "with initial state '{}'")):
        values, failing = set(rows[axis].dropna()), set(bad[axis].dropna())
        if len(values) > 1 and failing < values:
            phrases.append(" or ".join(say.format(v) for v in sorted(failing)))
    values, failing = sorted(set(rows["T"].dropna())), sorted(set(bad["T"].dropna()))
    if len(values) > 1 and len(failing) < len(values):
        if failing == [t for t in values if t >= failing[0]]:
            phrases.append(f"at T >= {fmt_num(failing[0])}")
        else:
            phrases.append("at T in {" + ", ".join(fmt_num(t) for t in failing) + "}")
    return phrases


def _final_state(bad: pd.DataFrame, options: pd.DataFrame) -> str:
    """A phrase when every failing golden row has a passing 'final state not in the loss' twin."""
    twins = options.drop_duplicates(["case_id", "tensor"], keep="last").set_index(
        ["case_id", "tensor"])["verdict"]
    keys = [(c, f"{t} ({FINAL_STATE_UNUSED})") for c, t in zip(bad["case_id"], bad["tensor"])]
    found = [twins[k] for k in keys if k in twins.index]
    if found and all(v == "PASS" for v in found):
        return ("they pass in the same cases when the final state is left out of the loss: the "
                "backward seems to drop or mishandle the final state's gradient")
    return ""


def significand_bits(rel: pd.Series, rms_rel: pd.Series) -> tuple[pd.Series, pd.Series]:
    """The significand bits that errors of `rms_rel` and of `rel` suggest, row by row."""
    return np.log2(RMS_REL_AT_1_BIT / rms_rel), np.log2(MAX_REL_AT_1_BIT / rel)


def _mantissa(bad: pd.DataFrame, dtype: str) -> str:
    """A phrase naming the narrower formats whose products would give the failing rows' errors of an
    fp32 run, when the rows agree on a width that fits one; else ""."""
    rows = bad[(bad["rel"] > 0) & (bad["rms_rel"] > 0) & np.isfinite(bad["rel"])
               & np.isfinite(bad["rms_rel"])]
    if dtype != "fp32" or rows.empty:
        return ""
    from_rms, from_max = significand_bits(rows["rel"], rows["rms_rel"])
    low, bits, high = from_rms.quantile([0.25, 0.5, 0.75])
    if high - low > SPREAD_BITS or (from_max - from_rms).abs().median() > AGREE_BITS:
        return ""
    fits = [(name, fewest, most) for name, fewest, most in FORMATS
            if fewest - SHORTFALL_BITS <= bits <= most]
    if not fits:
        return ""
    fewest, most = min(f[1] for f in fits), max(f[2] for f in fits)
    widths = f"{most} bits" if fewest == most else f"{fewest} to {most} bits"
    rms = fmt_num(rows["rms_rel"].median(), 2)
    return (f"their errors (rms_rel {rms} in the median) are those of about {bits:.1f} "
            "significand bits, as products in "
            f"{' or '.join(f[0] for f in fits)} ({widths}) would give, not fp32 (24)")


def failure_patterns(df: pd.DataFrame) -> list[str]:
    """One sentence per (op, implementation, dtype) whose failures share a pattern."""
    df = coerce_results(df)
    if df.empty:
        return []
    df = df.assign(subject=subject(df))
    sentences = []
    for (op, _, _, dtype), rows in df.groupby(["op", "variant", "impl", "dtype"], sort=True):
        golden = rows[rows["check"] == "golden"]
        bad = golden[golden["verdict"] == "FAIL"]
        if bad.empty:
            continue
        who = f"{op} {golden['subject'].iloc[0]} {dtype}"
        options = rows[rows["check"] == "options"]
        only = _only_at(bad, golden)
        extra = [p for p in (_final_state(bad, options), _mantissa(bad, dtype)) if p]
        if only or extra:
            verb = "fails" if bad["tensor"].nunique() == 1 else "fail"
            text = f"{who}: {_tensors(bad['tensor'])} {verb}" + (" only " + " and ".join(only)
                                                                    if only else "")
            sentences.append("; ".join([text, *extra]) + ".")
    sentences += _only_in(df)
    return sentences


# check -> what failing only there, with the same tensor passing in one call, says
ONLY_IN = {
    "segments": ("only when the sequence is split into calls chained through the state (the "
                 "segments check), not in one call: the state handed between calls is wrong"),
    "aggregate": ("only summed over tokens (the aggregate rows), not element by element: their "
                  "errors share a sign, which a parameter every token shares (a decay bias) takes "
                  "whole"),
}


def _only_in(df: pd.DataFrame) -> list[str]:
    """Tensors that fail in a check of ONLY_IN but pass their golden rows in the same cases
    ("dg (sum over t)" counts as dg)."""
    out = []
    for check, says in ONLY_IN.items():
        failing = df[(df["check"] == check) & (df["verdict"] == "FAIL")]
        for (op, dtype, variant, impl), bad in failing.groupby(["op", "dtype", "variant", "impl"]):
            golden = df[(df["op"] == op) & (df["dtype"] == dtype) & (df["variant"] == variant)
                        & (df["impl"] == impl) & (df["check"] == "golden")]
            verdicts = golden.drop_duplicates(["case_id", "tensor"], keep="last").set_index(
                ["case_id", "tensor"])["verdict"]
            keys = {(c, t.split(" (")[0]) for c, t in zip(bad["case_id"], bad["tensor"])}
            keys = [k for k in keys if k in verdicts.index]
            if keys and all(verdicts[k] == "PASS" for k in keys):
                name = golden["subject"].iloc[0] if len(golden) else variant
                verb = "fails" if len({t for _, t in keys}) == 1 else "fail"
                out.append(f"{op} {name} {dtype}: {_tensors(t for _, t in keys)} {verb} {says}.")
    return out
