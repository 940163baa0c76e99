"""What the failing rows of a run have in common, in one sentence per implementation and dtype, so
a reader sees the likely cause before the list of rows: failing only when the final state is in
the loss, only under strong decay, only at long T, only with an initial state, only when the
sequence is split into calls, or with relative errors at the precision of tf32 products in an
fp32 run. The sentences describe the rows; they change no verdict."""
from __future__ import annotations

import pandas as pd

from harness.schema import FINAL_STATE_UNUSED

from .results import coerce_results, fmt_num, subject, tensor_sort_key

TF32_REL = (1e-4, 1e-2)  # median relative error of an fp32 run whose products kept 10 bits


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


def _tf32(bad: pd.DataFrame, dtype: str) -> str:
    rel = bad["rel"].dropna()
    if dtype != "fp32" or rel.empty:
        return ""
    median = float(rel.median())
    if TF32_REL[0] <= median <= TF32_REL[1]:
        return (f"their relative errors (median {fmt_num(median)}) are those of tf32 products "
                "(10-bit mantissa), not of fp32")
    return ""


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
        extra = [p for p in (_final_state(bad, options), _tf32(bad, dtype)) if p]
        if only or extra:
            verb = "fails" if bad["tensor"].nunique() == 1 else "fail"
            text = f"{who}: {_tensors(bad['tensor'])} {verb}" + (" only " + " and ".join(only)
                                                                    if only else "")
            sentences.append("; ".join([text, *extra]) + ".")
    sentences += _segments_only(df)
    return sentences


def _segments_only(df: pd.DataFrame) -> list[str]:
    """Tensors that fail when the sequence is split into chained calls but pass in one call."""
    seg = df[(df["subject"].str.endswith("[segments]")) & (df["verdict"] == "FAIL")]
    out = []
    for (op, dtype, variant, impl), bad in seg.groupby(["op", "dtype", "variant", "impl"]):
        golden = df[(df["op"] == op) & (df["dtype"] == dtype) & (df["variant"] == variant)
                    & (df["impl"] == impl) & (df["check"] == "golden")]
        verdicts = golden.drop_duplicates(["case_id", "tensor"], keep="last").set_index(
            ["case_id", "tensor"])["verdict"]
        keys = [k for k in zip(bad["case_id"], bad["tensor"]) if k in verdicts.index]
        if keys and all(verdicts[k] == "PASS" for k in keys):
            name = golden["subject"].iloc[0] if len(golden) else variant
            verb = "fails" if len({t for _, t in keys}) == 1 else "fail"
            out.append(f"{op} {name} {dtype}: {_tensors(t for _, t in keys)} {verb} only when the "
                       "sequence is split into calls chained through the state (the segments "
                       "check) and pass in one call: the state handed between calls is wrong.")
    return out
