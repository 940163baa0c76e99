"""A short plain-text summary for the end of a CLI run."""
from __future__ import annotations

import pandas as pd

from .patterns import failure_patterns
from .results import coerce_results, fmt_num, positive, summarize


def _one_line(text, width: int) -> str:
    s = " ".join(str(text).splitlines())
    return s if len(s) <= width else s[: width - 3] + "..."


def _reason(r) -> str:
    """Why a row failed, most telling part first."""
    if r.verdict == "ERROR" or r.check in ("inputs", "determinism"):
        return " ".join(str(r.message).split()) or "(no message)"
    ratio = f"err/bound={fmt_num(r.ratio)}"
    if r.message:  # the harness's own sentence names the terms
        return f"{ratio}: {' '.join(str(r.message).split())}"
    if positive(r.nan) or positive(r.inf):
        return f"{ratio}: nan={fmt_num(r.nan)} inf={fmt_num(r.inf)} first at {r.first_bad or '?'}"
    return f"{ratio} (err={fmt_num(r.err)} bound={fmt_num(r.bound)})"


def render_terminal(df: pd.DataFrame, max_failures: int = 10, width: int = 160) -> str:
    """Counts, worst err/bound per tensor, and up to `max_failures` failures, one line each
    (the reason is cut to fit `width` characters; the case id never is)."""
    df = coerce_results(df)
    s = summarize(df)
    counts = "  ".join(f"{v} {n}" for v, n in s["counts"].items() if n) or "no rows"
    lines = [f"kernel correctness: {s['overall']}  ({s['total']} rows: {counts})"]
    w = s["worst_tensor"]
    if not w.empty:
        lines.append("worst err/bound per tensor:")
        for r in w.itertuples(index=False):
            flag = f"  {r.fails} FAIL" if r.fails else ""
            check = "" if "[" in str(r.subject) else f" {r.check}"
            where = f"{r.subject}{check} T={fmt_num(r.T)} case {r.case_id}"
            value = fmt_num(r.ratio) if r.ratio == r.ratio else r.verdict  # no ratio: the verdict
            line = f"  {r.tensor or '-':<6} {value:>8}{flag}  ({where})"
            lines.append(_one_line(line, width))
    shared = failure_patterns(df)
    if shared:
        lines.append("what the failures share:")
        lines += [f"  {p}" for p in shared]
    f = s["failures"]
    if len(f):
        more = f", first {max_failures}" if len(f) > max_failures else ""
        lines.append(f"failures ({len(f)}{more}):")
        for r in f.head(max_failures).itertuples(index=False):
            what = r.tensor or "-"
            head = f"  {r.verdict:<5} {r.op}/{r.subject} {r.dtype} T={fmt_num(r.T)} {what}"
            head = f"{head} [{r.case_id}]: "  # never cut: the case id is what one reruns
            lines.append(head + _one_line(_reason(r), max(40, width - len(head))))
        if len(f) > max_failures:
            lines.append(f"  ... and {len(f) - max_failures} more")
    return "\n".join(lines) + "\n"
