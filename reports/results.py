"""Read long-form result CSVs into typed DataFrames and summarise them.

Every renderer in `reports` goes through `coerce_results`, so it accepts either a frame from
`read_results` or one the harness built in memory from row dicts.
"""
from __future__ import annotations

import math
import os
import warnings
from typing import Iterable, Sequence, Union

import numpy as np
import pandas as pd

from .schema import COLUMNS, FLOAT_COLUMNS, INT_COLUMNS, RUN_COLUMNS, VERDICTS

PathLike = Union[str, "os.PathLike[str]"]

NUMERIC_COLUMNS = INT_COLUMNS + FLOAT_COLUMNS
STRING_COLUMNS = tuple(c for c in COLUMNS if c not in NUMERIC_COLUMNS)
BAD_VERDICTS = ("FAIL", "ERROR")

# Tensors in the order a kernel author reads them: output, state, then gradients.
TENSOR_ORDER = ("o", "ht", "dq", "dr", "dk", "dv", "dg", "dw", "ds", "du", "dh0")


def _to_int(col: pd.Series) -> pd.Series:
    num = pd.to_numeric(col, errors="coerce")
    finite = num[np.isfinite(num.astype("float64"))]
    if (finite == finite.round()).all():
        num = num.where(np.isfinite(num.astype("float64")))
        return num.round().astype("Int64")
    return num.astype("float64")  # not integral after all: keep the values, do not truncate


def coerce_columns(df: pd.DataFrame, columns, int_columns, float_columns) -> pd.DataFrame:
    """A typed copy of `df`: `columns` first (missing ones added empty), then any extras.

    Integer columns become nullable `Int64` (M is empty for ops without slots), float columns
    `float64` with NaN/inf kept, everything else `str` with "" for missing.
    """
    out = df.copy()
    for c in columns:
        if c not in out.columns:
            out[c] = np.nan if c in int_columns or c in float_columns else ""
    for c in out.columns:
        if c in int_columns:
            out[c] = _to_int(out[c].replace("", np.nan))
        elif c in float_columns:
            out[c] = pd.to_numeric(out[c].replace("", np.nan), errors="coerce").astype("float64")
        else:
            out[c] = out[c].astype(object).where(out[c].notna(), "").astype(str)
    extras = [c for c in out.columns if c not in columns]
    return out[list(columns) + extras].reset_index(drop=True)


def coerce_results(df: pd.DataFrame) -> pd.DataFrame:
    """`coerce_columns` with the result schema's columns and types."""
    return coerce_columns(df, COLUMNS, INT_COLUMNS, FLOAT_COLUMNS)


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """`df` itself when it already has the schema's types, else `coerce_results(df)`."""
    ok = all(c in df for c in COLUMNS) and all(df[c].dtype == "float64" for c in FLOAT_COLUMNS) \
        and all(pd.api.types.is_integer_dtype(df[c]) for c in INT_COLUMNS) \
        and not df[list(STRING_COLUMNS)].isna().any().any()
    return df if ok else coerce_results(df)


def read_results(paths: Union[PathLike, Iterable[PathLike]]) -> pd.DataFrame:
    """Read one or more long-form result CSVs into one typed frame (see `coerce_results`).

    Rows without a verdict (a line cut short by an interrupted sweep) are dropped with a warning.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    frames = []
    for path in paths:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)
        if "verdict" in frame:
            cut = frame["verdict"].str.strip() == ""
            if cut.any():
                warnings.warn(f"{path}: {int(cut.sum())} row(s) without a verdict (cut short) left "
                              "out; `sweep --resume` runs their cases again", stacklevel=2)
                frame = frame[~cut]
        frames.append(frame)
    if not frames:
        return coerce_results(pd.DataFrame(columns=COLUMNS))
    return coerce_results(pd.concat(frames, ignore_index=True))


def tensor_sort_key(name: str) -> tuple:
    """Sort key putting tensors in TENSOR_ORDER, unknown ones after, alphabetically."""
    return (TENSOR_ORDER.index(name), "") if name in TENSOR_ORDER else (len(TENSOR_ORDER), name)


def _plain_impl(impl: str, variant: str, op: str) -> bool:
    """True when `impl` says nothing beyond `variant`: empty, "ours", the variant itself or its
    function name ("chunk_gla"), part by part for "~" pairs."""
    parts, vparts = impl.split("~"), variant.split("~")
    if len(parts) != len(vparts):
        return impl in ("", variant)
    return all(p in ("", "ours", v, f"{v}_{op}") for p, v in zip(parts, vparts))


def subject(df: pd.DataFrame) -> pd.Series:
    """What each row is about, for grouping and labels: the variant ("chunk", or the pair
    "chunk~fused_recurrent" for agreement rows), with the impl in brackets when it adds something
    ("chunk (fla.ops.gla:chunk_gla)"), and "[check]" for checks other than golden/agreement/run."""
    def one(variant: str, impl: str, op: str, check: str) -> str:
        if check == "agreement" and "~" not in variant and "~" in impl:
            variant, impl = impl, ""  # variant pair only spelled in impl
        name = variant or impl
        if variant and not _plain_impl(impl, variant, op):
            name = f"{variant} ({impl})"
        if check not in ("golden", "agreement", "run", ""):
            name = f"{name} [{check}]"
        return name
    names = {}   # rows share a few (variant, impl, op, check): each named once
    return pd.Series([names[t] if t in names else names.setdefault(t, one(*t))
                      for t in zip(*(df[c].tolist() for c in ("variant", "impl", "op", "check")))],
                     index=df.index, dtype=str)


def verdict_counts(df: pd.DataFrame) -> dict:
    """{verdict: count}, with PASS/FAIL/ERROR/SKIP always present, unknown verdicts appended."""
    vc = df["verdict"].value_counts()
    counts = {v: int(vc.get(v, 0)) for v in VERDICTS}
    counts.update({str(v): int(n) for v, n in vc.items() if v not in counts})
    return counts


def overall(counts: dict) -> str:
    """"FAIL" if any FAIL/ERROR row, "EMPTY" if no row passed or failed, else "PASS"."""
    if any(counts.get(v, 0) for v in BAD_VERDICTS):
        return "FAIL"
    unknown = sum(n for v, n in counts.items() if v not in VERDICTS)
    if unknown:
        return "FAIL"  # a verdict the gate does not know is not a pass
    return "PASS" if counts.get("PASS", 0) else "EMPTY"


def worst_ratio(df: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Per group of `by`: the row with the largest err/bound (a FAIL row with a NaN ratio, i.e. a
    NaN result, counts as the largest; other NaN ratios as the smallest), with the group's row
    count and FAIL count, worst group first. "run" rows (ERROR/SKIP) are left out.

    Columns: *by, ratio, err, bound, rel, check, impl, case_id, T, verdict (of the worst row),
    subject (unless in `by`), rows, fails.
    """
    df = _typed(df)
    by = list(by)
    keyed = df.copy()
    if "subject" not in keyed:
        keyed["subject"] = subject(keyed)
    keyed = keyed[keyed["check"] != "run"]
    extra = ["ratio", "err", "bound", "rel", "check", "impl", "case_id", "T", "verdict"]
    extra += [] if "subject" in by else ["subject"]
    cols = by + extra + ["rows", "fails"]
    if keyed.empty:
        return pd.DataFrame(columns=cols)
    # A FAIL without a ratio (NaN output) is the worst row of its group; other NaNs the least.
    keyed["_r"] = keyed["ratio"].where(keyed["ratio"].notna(),
                                      np.where(keyed["verdict"] == "FAIL", math.inf, -math.inf))
    keyed["_fail"] = keyed["verdict"].eq("FAIL")
    g = keyed.groupby(by, sort=False, dropna=False)
    idx = g["_r"].idxmax()
    out = keyed.loc[idx.values, by + extra + ["_r"]]
    out = out.reset_index(drop=True)
    out["rows"] = g.size().values
    out["fails"] = g["_fail"].sum().astype(int).values
    out = out.sort_values("_r", ascending=False, kind="stable").drop(columns="_r")
    return out.reset_index(drop=True)


def failures(df: pd.DataFrame) -> pd.DataFrame:
    """FAIL rows (worst err/bound first; a NaN ratio on a FAIL row counts as the worst),
    then ERROR rows (by op, case); with a `subject` column (see `subject`)."""
    df = _typed(df)
    if "subject" not in df:
        df = df.assign(subject=subject(df))
    fail = df[df["verdict"] == "FAIL"]
    fail = fail.assign(_k=fail["ratio"].fillna(math.inf))
    fail = fail.sort_values("_k", ascending=False, kind="stable").drop(columns="_k")
    err = df[df["verdict"] == "ERROR"].sort_values(["op", "case_id", "impl"], kind="stable")
    return pd.concat([fail, err]).reset_index(drop=True)


def run_meta(df: pd.DataFrame, meta: dict | None = None) -> dict:
    """Run metadata: `meta` first, then the per-run columns of `df` (values joined when they
    differ), T range, and the summed wall time over distinct (case, impl) when meta has none."""
    out = {str(k): fmt_num(v, 4) if isinstance(v, float) else v
           for k, v in (meta or {}).items() if v is not None and v != ""}
    for c in RUN_COLUMNS:
        vals = [v for v in pd.unique(df[c]) if v != ""] if c in df else []
        if vals and c not in out:
            more = f" (+{len(vals) - 5} more)" if len(vals) > 5 else ""
            out[c] = ", ".join(map(str, vals[:5])) + more
    if "impl" in df and "implementations under test" not in out:
        theirs = [v for v in pd.unique(df["impl"]) if v not in ("", "ours") and "~" not in str(v)]
        if theirs:
            out["implementations under test"] = ", ".join(map(str, theirs[:5])) + (
                f" (+{len(theirs) - 5} more)" if len(theirs) > 5 else "")
    if not any(k in out for k in ("wall_s", "wall", "wall_time")) and "wall_s" in df:
        w = df.drop_duplicates(["run_id", "case_id", "impl"])["wall_s"]
        if w.notna().any():
            out["wall_s (sum over cases)"] = f"{float(w.sum()):.1f}"
    return out


def tensor_group(df: pd.DataFrame) -> pd.Series:
    """The tensor a row speaks of, for the summary tables: "dk (no final state)" counts as dk; the
    checks about a whole run ("inputs", "determinism") are their own group."""
    whole_run = df["check"].isin(["inputs", "determinism"])
    base = df["tensor"].fillna("").astype(str).str.replace(r" \(.*\)$", "", regex=True)
    return base.where(~whole_run, df["check"])


def summarize(df: pd.DataFrame) -> dict:
    """Counts and worst-case tables of a results frame.

    Returns a dict: total (rows), counts ({verdict: n}), overall ("PASS"/"FAIL"/"EMPTY"),
    worst_tensor (per tensor), worst_op_tensor (per op, tensor),
    worst_variant (per op, subject, dtype), worst_detail (per op, subject, dtype, tensor),
    failures (FAIL then ERROR rows). The tables are DataFrames from `worst_ratio`/`failures`.
    """
    df = coerce_results(df)
    counts = verdict_counts(df)
    df = df.assign(subject=subject(df))
    failing = failures(df)
    df = df.assign(tensor=tensor_group(df))
    return {
        "total": int(len(df)),
        "counts": counts,
        "overall": overall(counts),
        "worst_tensor": worst_ratio(df, ["tensor"]),
        "worst_op_tensor": worst_ratio(df, ["op", "tensor"]),
        "worst_variant": worst_ratio(df, ["op", "subject", "dtype"]),
        "worst_detail": worst_ratio(df, ["op", "subject", "dtype", "tensor"]),
        "failures": failing,
    }


def positive(x) -> bool:
    """True for a number > 0; False for 0, NaN, NA, None or text."""
    try:
        return bool(x is not None and x is not pd.NA and float(x) > 0)
    except (TypeError, ValueError):
        return False


def fmt_num(x, digits: int = 3) -> str:
    """Compact number: '' for missing, 'nan'/'inf' spelled out, else %.{digits}g."""
    if x is None or x is pd.NA:
        return ""
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(xf):
        return "nan"
    if math.isinf(xf):
        return "inf" if xf > 0 else "-inf"
    if xf == int(xf) and abs(xf) < 1e15 and not isinstance(x, (float, np.floating)):
        return str(int(xf))
    return f"{xf:.{digits}g}"
