"""A markdown summary of a results frame, sized for a pull-request comment."""
from __future__ import annotations

import pandas as pd

from .patterns import failure_patterns
from .results import coerce_results, fmt_num, positive, run_meta, summarize, tensor_sort_key

_ICON = {"PASS": "✅", "FAIL": "❌", "EMPTY": "⚠️"}


def md_escape(text, limit: int | None = None) -> str:
    """One table-cell-safe line: HTML-escaped (GitHub would eat `<tag>`), pipes escaped,
    newlines folded, cut to `limit` characters."""
    s = " ".join(str(text).split())
    if limit is not None and len(s) > limit:
        s = s[: limit - 1] + "…"
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace("|", "\\|").replace("`", "&#96;")


def _counts_line(counts: dict, total: int) -> str:
    parts = [f"{n} {v}" for v, n in counts.items() if n]
    return ", ".join(parts) + f" ({total} rows)" if parts else "no rows"


def _worst_table(worst: pd.DataFrame) -> list[str]:
    """Pivot: one line per (op, variant, dtype), one column per tensor, cell = worst err/bound."""
    tensors = sorted(worst["tensor"].unique(), key=tensor_sort_key)
    lines = ["| op | variant | dtype | " + " | ".join(md_escape(t) for t in tensors) + " |",
             "|---|---|---|" + "---:|" * len(tensors)]
    for (op, subj, dt), g in worst.groupby(["op", "subject", "dtype"], sort=True):
        by_t = dict(zip(g["tensor"], g["ratio"]))
        failed = set(g.loc[g["verdict"] == "FAIL", "tensor"])
        cells = []
        for t in tensors:
            if t not in by_t:
                cells.append("")
                continue
            txt = fmt_num(by_t[t], 2)
            cells.append(f"**{txt}** ❌" if by_t[t] > 1 or t in failed else txt)
        lines.append(f"| {md_escape(op)} | {md_escape(subj)} | {md_escape(dt)} | "
                     + " | ".join(cells) + " |")
    return lines


def render_markdown(df: pd.DataFrame, meta: dict | None = None, max_failures: int = 20,
                    message_chars: int = 160) -> str:
    """Headline (PASS/FAIL with counts), run metadata, worst err/bound per
    (op, variant, dtype) x tensor, then the first `max_failures` FAIL/ERROR rows."""
    df = coerce_results(df)
    s = summarize(df)
    info = run_meta(df, meta)
    verdict = s["overall"]
    out = [f"### {_ICON[verdict]} {verdict}: {_counts_line(s['counts'], s['total'])}", ""]
    keys = [k for k in ("run_id", "device", "torch", "triton", "git") if k in info]
    keys += [k for k in info if k not in keys]
    if keys:
        out += [" · ".join(f"{md_escape(k)}: `{md_escape(info[k], 80)}`" for k in keys), ""]

    worst = s["worst_detail"]
    if not worst.empty:
        table = _worst_table(worst)
        n_var = len(table) - 2
        out += ["<details" + (" open" if n_var <= 12 else "") + ">",
                f"<summary>Worst err/bound per variant and tensor ({n_var} rows; "
                "above 1 fails)</summary>", "", *table, "", "</details>", ""]

    shared = failure_patterns(df)
    if shared:
        out += ["**What the failures share:**", "", *(f"- {md_escape(p)}" for p in shared), ""]
    fails = s["failures"]
    if len(fails):
        out += [f"**Failures** ({len(fails)}):", "",
                "| verdict | case | op/variant | dtype | tensor/check | err | bound | ratio | message |",
                "|---|---|---|---|---|---:|---:|---:|---|"]
        for r in fails.head(max_failures).itertuples(index=False):
            what = r.tensor if r.tensor else r.check
            if r.tensor and r.check not in ("golden", ""):
                what = f"{r.tensor} ({r.check})"
            msg = r.message
            if not msg and (positive(r.nan) or positive(r.inf)):
                msg = f"nan={fmt_num(r.nan)} inf={fmt_num(r.inf)} first at {r.first_bad}"
            nums = [fmt_num(x) if r.verdict == "FAIL" else "" for x in (r.err, r.bound, r.ratio)]
            out.append(f"| {r.verdict} | `{md_escape(r.case_id)}` | {md_escape(r.op)}/"
                       f"{md_escape(r.subject)} | {md_escape(r.dtype)} | "
                       f"{md_escape(what)} | " + " | ".join(nums) +
                       f" | {md_escape(msg, message_chars)} |")
        if len(fails) > max_failures:
            out.append(f"\n… and {len(fails) - max_failures} more.")
        out.append("")

    skipped = df[df["verdict"] == "SKIP"]
    if len(skipped):
        reasons = skipped["message"].replace("", "(no reason given)").value_counts().head(5)
        out += [f"Skipped {len(skipped)}: " + "; ".join(
            f"{md_escape(m, 100)} ({n})" for m, n in reasons.items()), ""]
    return "\n".join(out).rstrip() + "\n"
