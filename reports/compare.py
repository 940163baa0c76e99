"""Compare a candidate run with a baseline run, row by row, for the pull-request gate and for
`python -m harness report --baseline`.

Rows are matched on KEY, never on `impl`, so an external implementation of variant "chunk" is
compared with the baseline's "chunk". `compare_runs` gives one row per key with a `status`;
the gate fails on BAD_STATUSES. `render_compare_markdown` and `render_compare_html` render it.

Columns of the comparison table (COMPARE_COLUMNS):
  op, case_id, variant, check, tensor   the key
  dtype, T                              from the candidate's row, else the baseline's
  status                                one of STATUSES (see `compare_runs`)
  verdict_baseline, verdict_candidate   PASS/FAIL/ERROR/SKIP; "" where that run has no row
  ratio_baseline, ratio_candidate       err/bound of each run; NaN where there is none
  growth                                ratio_candidate / ratio_baseline (inf from 0, 1 for 0 -> 0)
  err_baseline, err_candidate           max|X - X64| of each run (not the schema's `base_err`)
  bound_baseline, bound_candidate       the bound of each run
  impl_baseline, impl_candidate         the implementation each run used
  message                               the candidate's message; for a row missing from the
                                        candidate, why (its run of the case errored or skipped)
The table's `attrs` keep `growth_factor` and `ratio_floor` for the renderers.
"""
from __future__ import annotations

import datetime as _dt
import io
import math
import os

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .html import (_CSS, _JS, WRAP_COLUMNS, _cell, _e, _filters, _left_out, _num, _same_note,
                   _table, ratio_class, write_page)
from .markdown import md_escape
from .plots import png_data_uri
from .results import _typed, fmt_num, run_meta
from .schema import CHANCE_SIGMAS

KEY = ("op", "case_id", "variant", "check", "tensor")
GROUP = ("op", "case_id", "variant")  # one run of one implementation on one case
BAD_STATUSES = ("new failure", "still failing", "disappeared", "grew")
STATUSES = ("new failure", "disappeared", "grew", "still failing", "fixed", "new", "grew apart", "shrank",
            "same")
COMPARE_COLUMNS = (*KEY, "dtype", "T", "status", "verdict_baseline", "verdict_candidate",
                   "ratio_baseline", "ratio_candidate", "growth", "err_baseline", "err_candidate",
                   "bound_baseline", "bound_candidate", "impl_baseline", "impl_candidate", "message")
_SETTINGS = ("growth_factor", "ratio_floor", "noise_roundings")   # of compare_runs, in table.attrs
_SIDE = ("dtype", "T", "impl", "verdict", "ratio", "err", "floor", "spread", "atol", "bound", "message")
_NUMERIC = ("T", "ratio_baseline", "ratio_candidate", "growth", "err_baseline", "err_candidate",
            "bound_baseline", "bound_candidate")

_EXPLAIN = {
    "new failure": "FAIL or ERROR in the candidate; passed, skipped or absent in the baseline",
    "still failing": "FAIL or ERROR in both runs",
    "disappeared": "a result of the baseline that the candidate lacks (absent or skipped)",
    "grew": "err/bound grew beyond the growth factor plus the noise between machines, to at least "
            "the ratio floor",
    "fixed": "FAIL or ERROR in the baseline, PASS in the candidate",
    "new": "only in the candidate",
    "grew apart": "an agreement row that grew, but no further than the growth factor of its two "
                  "variants' own golden err/bound in the baseline: one of them moved within its "
                  "own gate (say, became more accurate)",
    "shrank": "err/bound shrank beyond the growth factor",
    "same": "no change worth a mention",
}
STATUS_COLORS = {"new failure": "#d62728", "still failing": "#8c1c13", "disappeared": "#9467bd",
                 "grew": "#ff7f0e", "fixed": "#2ca02c", "new": "#1f77b4", "grew apart": "#bcbd22",
                 "shrank": "#17becf", "same": "#a0a0a0"}
_OP_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_ICON = {"PASS": "✅", "FAIL": "❌"}

_COMPARE_CSS = "".join(
    f".s-{s.replace(' ', '-')}{{background:{c}{'' if s == 'same' else '40'}}}"
    for s, c in STATUS_COLORS.items()) + "td.s-new-failure,td.s-grew,td.s-disappeared{font-weight:700}"


def _failing(verdicts: pd.Series) -> pd.Series:
    """FAIL, ERROR, or a verdict the gate does not know (as `results.overall` counts it)."""
    return ~verdicts.isin(("PASS", "SKIP"))


def _side(df: pd.DataFrame) -> pd.DataFrame:
    """KEY and _SIDE columns of one run, typed, with err/bound filled in where `ratio` is empty,
    and one row per key: the worst, when a run holds a key twice (merged CSVs)."""
    df = _typed(df)
    fill = df["ratio"].isna() & (df["bound"] > 0) & df["err"].notna()
    ratio = df["ratio"].where(~fill, df["err"] / df["bound"])
    out = df[list(KEY) + list(_SIDE)].assign(ratio=ratio)
    if not out.duplicated(list(KEY)).any():
        return out
    rank = np.where(_failing(out["verdict"]), 0, np.where(out["verdict"] == "SKIP", 2, 1))
    out = out.assign(_rank=rank).sort_values(["_rank", "ratio"], ascending=[True, False],
                                             na_position="last", kind="stable")
    return out.drop_duplicates(list(KEY)).drop(columns="_rank")


def _growth(rb: pd.Series, rc: pd.Series) -> pd.Series:
    """rc / rb: NaN where either is NaN, inf from a zero baseline, 1 where both are zero."""
    with np.errstate(divide="ignore", invalid="ignore"):
        g = rc / rb
    g = g.where(~((rb == 0) & (rc > 0)), math.inf)
    return g.where(~((rb == 0) & (rc == 0)), 1.0)


def _ran_elsewhere(joined: pd.DataFrame, cand: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """For baseline "run" rows (a case that errored or skipped) whose case the candidate did run:
    (mask, whether any candidate row of that case failed). The run row is then not a lost
    result but the old error, fixed or not."""
    ran = cand[cand["check"] != "run"]
    bad = _failing(ran["verdict"]).groupby([ran[c] for c in GROUP]).any()
    looked = joined[list(GROUP)].merge(bad.rename("_bad").reset_index(), on=list(GROUP), how="left")
    mask = (joined["_merge"] == "right_only") & (joined["check"] == "run") \
        & looked["_bad"].notna().to_numpy()
    return mask, looked["_bad"].fillna(False).astype(bool).set_axis(joined.index)


def _why_missing(joined: pd.DataFrame, cand: pd.DataFrame) -> pd.Series:
    """For rows the candidate lacks: its "run" row of the same case (ERROR or SKIP), if any."""
    runs = cand[cand["check"] == "run"].drop_duplicates(list(GROUP))
    runs = runs.assign(_why="the candidate's run of this case: " + runs["verdict"] + ": "
                       + runs["message"])
    looked = joined[list(GROUP)].merge(runs[list(GROUP) + ["_why"]], on=list(GROUP), how="left")
    return looked["_why"].fillna("not in the candidate").set_axis(joined.index)


def _noise(j: pd.DataFrame, side: str, roundings: float) -> pd.Series:
    """The err/bound a correct kernel's numbers move by between machines, on one side's rows:
    `roundings` roundings of the golden in the tensor's dtype (its floor) plus the row's atol,
    and for a sum CHANCE_SIGMAS of its spreads, over its bound; 0 where the row has none. (atol
    covers the tensors whose largest error comes from cancelling terms much larger than the
    result, which move by many of its roundings; a sum of thousands of elements is drawn afresh
    when a kernel rounds them in another order, and one draw, the baseline's, may have been near
    0: the h100 suite on an H200, delta_rule fp16, dbeta summed over 16,384 elements, err/bound
    0.004 then 0.42 and 0.69 from two correct kernels.)"""
    allowance = (roundings * j[f"floor_{side}"].fillna(0.0) + j[f"atol_{side}"].fillna(0.0)
                 + CHANCE_SIGMAS * j[f"spread_{side}"].fillna(0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        noise = allowance / j[f"bound_{side}"]
    return noise.where(np.isfinite(noise), 0.0)


def _sides_golden_ratio(j: pd.DataFrame) -> pd.Series:
    """For each agreement row ("A~B"), the larger err/bound of variants A's and B's golden rows of
    the same case and tensor in the baseline; NaN for other rows and where either is missing. By
    the triangle inequality the two variants differ by at most err_A + err_B, so an agreement
    ratio is at most the larger of their golden ratios."""
    golden = j[(j["check"] == "golden") & j["ratio_baseline"].notna()]
    golden = golden.set_index(["op", "case_id", "variant", "tensor"])["ratio_baseline"]
    golden = golden[~golden.index.duplicated()]
    agree = j["check"] == "agreement"
    sides = j.loc[agree, "variant"].str.split("~", n=1, expand=True).reindex(columns=[0, 1])
    keys = j.loc[agree, ["op", "case_id", "tensor"]]

    def side(i):
        index = pd.MultiIndex.from_arrays([keys["op"], keys["case_id"], sides[i], keys["tensor"]])
        return pd.Series(golden.reindex(index).to_numpy(), index=keys.index)

    return pd.concat([side(0), side(1)], axis=1).max(axis=1, skipna=False).reindex(j.index)


def _status(j: pd.DataFrame, vc: pd.Series, in_c: pd.Series, growth_factor: float,
            ratio_floor: float, noise_roundings: float) -> np.ndarray:
    """The status of each joined row, by the priority of `compare_runs`; `vc` and `in_c` are the
    candidate's verdict and presence, as `compare_runs` reads them."""
    vb, in_b = j["verdict_baseline"], j["_merge"] != "left_only"
    rb, rc = j["ratio_baseline"], j["ratio_candidate"]
    bad_b, bad_c = in_b & _failing(vb), in_c & _failing(vc)
    both_pass = (vb == "PASS") & (vc == "PASS")
    noise = _noise(j, "candidate", noise_roundings)
    grew = both_pass & (rc > growth_factor * rb + noise) & (rc >= ratio_floor)
    apart = rc <= growth_factor * _sides_golden_ratio(j) + noise
    shrank = rb > growth_factor * rc + _noise(j, "baseline", noise_roundings)
    conditions = [
        bad_c & ~bad_b,
        bad_c & bad_b,
        in_b & (~in_c | ((vc == "SKIP") & (vb != "SKIP"))),
        grew & ~apart,
        bad_b & (vc == "PASS"),
        ~in_b & in_c,
        grew & apart,
        shrank & (rb >= ratio_floor),
    ]
    choices = ["new failure", "still failing", "disappeared", "grew", "fixed", "new", "grew apart", "shrank"]
    return np.select(conditions, choices, default="same")


def sort_comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Rows in STATUSES order; failures by how far over the bound they are, the rest by growth,
    largest first (NaN last), then key: a failing golden row at 5x its bound outranks an
    agreement row that went from 0 to 1.1."""
    rank = table["status"].map({s: i for i, s in enumerate(STATUSES)}).fillna(len(STATUSES))
    failing = table["status"].isin(["new failure", "still failing"])
    measure = table["ratio_candidate"].where(failing, table["growth"])
    keyed = table.assign(_rank=rank, _g=measure.fillna(-math.inf))
    keyed = keyed.sort_values(["_rank", "_g", *KEY], ascending=[True, False] + [True] * len(KEY),
                              kind="stable")
    return keyed.drop(columns=["_rank", "_g"]).reset_index(drop=True)


def compare_runs(candidate: pd.DataFrame, baseline: pd.DataFrame, growth_factor: float = 2.0,
                 ratio_floor: float = 0.05, noise_roundings: float = 0.0) -> pd.DataFrame:
    """One row per KEY found in either run, with both sides' verdict, err, bound, err/bound, the
    growth of err/bound and a status, worst first (columns: COMPARE_COLUMNS).

    Statuses, by priority: "new failure" (FAIL/ERROR now, not before), "still failing",
    "disappeared" (in the baseline; absent from the candidate, or skipped there), "grew" (both
    PASS, candidate ratio > growth_factor * baseline ratio + the noise, and >= ratio_floor, so
    that noise on tiny ratios does not count), "fixed", "new" (only in the candidate), "grew
    apart" (an agreement row that grew, to no more than growth_factor times the larger of its two
    variants' golden ratios in the baseline, plus the noise: a variant that became more accurate
    moves away from one that did not, and each variant's own golden row is gated apart), "shrank"
    (the same the other way), "same". The noise is what correct kernels' numbers move by between
    machines and between orders of rounding (`_noise`): `noise_roundings` roundings of the golden
    (the row's floor), its atol and a sum's chance spreads, over its bound. Rows with no ratio on
    either side ("inputs", "determinism") compare by verdict alone; a verdict other than
    PASS/FAIL/ERROR/SKIP counts as failing, as in `results.overall`. A baseline "run" row
    (the case errored or skipped) whose case the candidate ran counts as that case's verdict in
    the candidate (its rows are compared on their own), so a fixed crash is "fixed", not lost.
    """
    cand, base = _side(candidate), _side(baseline)
    j = cand.merge(base, on=list(KEY), how="outer", suffixes=("_candidate", "_baseline"),
                   indicator=True)
    for c in ("dtype", "impl", "verdict", "message"):
        for s in ("_candidate", "_baseline"):
            j[c + s] = j[c + s].fillna("").astype(str)
    in_c = j["_merge"] != "right_only"
    j["dtype"] = j["dtype_candidate"].where(in_c, j["dtype_baseline"])
    j["T"] = j["T_candidate"].where(in_c, j["T_baseline"]).astype("Int64")
    j["growth"] = _growth(j["ratio_baseline"], j["ratio_candidate"])

    ran, ran_bad = _ran_elsewhere(j, cand)
    vc_eff = j["verdict_candidate"].mask(ran, np.where(ran_bad, "FAIL", "PASS"))
    j["status"] = _status(j, vc_eff, in_c | ran, growth_factor, ratio_floor, noise_roundings)
    j["message"] = j["message_candidate"].mask(~in_c, _why_missing(j, cand))
    j.loc[ran, "message"] = "the candidate ran this case (its rows are compared on their own)"

    out = sort_comparison(j[list(COMPARE_COLUMNS)])
    out.attrs.update(growth_factor=float(growth_factor), ratio_floor=float(ratio_floor),
                     noise_roundings=float(noise_roundings))
    return out


def status_counts(table: pd.DataFrame) -> dict:
    """{status: count} in STATUSES order, statuses with no row left out."""
    vc = table["status"].value_counts()
    return {s: int(vc[s]) for s in STATUSES if s in vc}


def compare_verdict(table: pd.DataFrame) -> str:
    """"FAIL" when a row has one of BAD_STATUSES, else "PASS"."""
    return "FAIL" if table["status"].isin(BAD_STATUSES).any() else "PASS"


def _settings(table: pd.DataFrame, meta: dict | None) -> dict:
    """The growth factor and ratio floor the table was made with, unless `meta` gives them."""
    meta = meta or {}
    out = {}
    for k in _SETTINGS:
        v = meta.get(k, table.attrs.get(k))
        if v is not None:
            out[k.replace("_", " ")] = fmt_num(v, 4)
    return out


def _counts_text(table: pd.DataFrame) -> str:
    counts = status_counts(table)
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    return f"{parts} ({len(table)} rows)" if parts else "no rows in either run"


def fmt_growth(g) -> str:
    """"x3.5", "x12", "x∞"; "" for NaN."""
    if g is None or g is pd.NA or g != g:
        return ""
    if math.isinf(g):
        return "x∞"
    return f"x{g:.0f}" if g >= 10 else f"x{g:.2g}"


def _md_side(ratio, verdict: str) -> str:
    """One side's err/bound for a markdown cell, with its verdict when not PASS."""
    if verdict == "":
        return "—"
    txt = "" if (ratio != ratio and verdict != "FAIL") else fmt_num(ratio, 3)
    return txt if verdict == "PASS" and txt else f"{txt} {verdict}".strip()


def _md_rows(rows: pd.DataFrame, max_rows: int, message_chars: int) -> list[str]:
    out = ["| case | variant | check | tensor | baseline err/bound | candidate err/bound | growth "
           "| message |", "|---|---|---|---|---:|---:|---:|---|"]
    for r in rows.head(max_rows).itertuples(index=False):
        out.append(f"| `{md_escape(r.case_id)}` | {md_escape(r.variant)} | {md_escape(r.check)} | "
                   f"{md_escape(r.tensor)} | {_md_side(r.ratio_baseline, r.verdict_baseline)} | "
                   f"{_md_side(r.ratio_candidate, r.verdict_candidate)} | {fmt_growth(r.growth)} "
                   f"| {md_escape(r.message, message_chars)} |")
    if len(rows) > max_rows:
        out.append(f"\n… and {len(rows) - max_rows} more {rows['status'].iloc[0]} rows.")
    return out


def render_compare_markdown(table: pd.DataFrame, meta: dict | None = None, max_rows: int = 30,
                            message_chars: int = 120, incomplete: bool = False) -> str:
    """A pull-request comment: the verdict (**FAIL** when a row has a bad status, or when the
    candidate is `incomplete`: a sweep of it did not finish) with counts per status, `meta` and
    the comparison settings as bullets, then one table per bad status of up to `max_rows` rows
    (err/bound of both runs, growth, the candidate's message), and the count of rows only the
    candidate has, per op and check."""
    verdict = "FAIL" if incomplete else compare_verdict(table)
    out = [f"{_ICON[verdict]} **{verdict}** candidate vs baseline: {_counts_text(table)}", ""]
    info = {str(k): v for k, v in (meta or {}).items()
            if v is not None and v != "" and k not in _SETTINGS}
    info.update(_settings(table, meta))
    if info:
        out += [f"- {md_escape(k)}: {md_escape(v, 200)}" for k, v in info.items()] + [""]
    for status in BAD_STATUSES:
        rows = table[table["status"] == status]
        if len(rows):
            out += [f"**{status}** ({len(rows)}): {_EXPLAIN[status]}", "",
                    *_md_rows(rows, max_rows, message_chars), ""]
    out += _new_rows_note(table)
    return "\n".join(out).rstrip() + "\n"


def _new_rows_note(table: pd.DataFrame) -> list[str]:
    """The rows only the candidate has, counted per op and check: no growth is gated on them
    until the baseline holds them (a check or case added since it was written)."""
    new = table[table["status"] == "new"]
    if new.empty:
        return []
    counts = new.groupby(["op", "check"], sort=True).size()
    parts = ", ".join(f"{op} {check} {n}" for (op, check), n in counts.items())
    return [f"**new** ({len(new)}): not in the baseline, so their growth is not gated ({md_escape(parts, 400)}); "
            "`gate --update-baseline` on a passing run adds them", ""]


def _plot_points(table: pd.DataFrame) -> pd.DataFrame:
    """Rows with a finite err/bound on both sides, zeros and all."""
    rb, rc = table["ratio_baseline"], table["ratio_candidate"]
    return table[np.isfinite(rb) & np.isfinite(rc) & (rb >= 0) & (rc >= 0)]


def compare_figure(table: pd.DataFrame, growth_factor: float = 2.0, ratio_floor: float | None = None,
                   dpi: int = 100) -> bytes | None:
    """PNG: candidate err/bound against baseline err/bound (log-log), one point per row with both,
    coloured by status, marked by op, with y = x, y = growth_factor * x, the ratio floor and
    err/bound = 1 (above it the candidate fails). Zeros are drawn at the lower edge.
    None when no row has both ratios."""
    pts = _plot_points(table)
    if pts.empty:
        return None
    xb, yc = pts["ratio_baseline"].to_numpy(float), pts["ratio_candidate"].to_numpy(float)
    pos = np.concatenate([xb[xb > 0], yc[yc > 0], [1.0]])
    lo = 10 ** math.floor(math.log10(pos.min() / 1.6))
    hi = 10 ** math.ceil(math.log10(pos.max() * 1.6))
    fig = Figure(figsize=(8.4, 6.0), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.1, 0.1, 0.6, 0.82))
    ops = sorted(pts["op"].unique())
    marker = {op: _OP_MARKERS[i % len(_OP_MARKERS)] for i, op in enumerate(ops)}
    for status in reversed(STATUSES):  # the worst statuses drawn last, on top
        sub = pts[pts["status"] == status]
        for op, g in sub.groupby("op", sort=True):
            ax.scatter(g["ratio_baseline"].clip(lower=lo), g["ratio_candidate"].clip(lower=lo),
                       color=STATUS_COLORS[status], marker=marker[op], s=18,
                       alpha=0.5 if status == "same" else 0.9, linewidths=0)
    line = np.array([lo, hi])
    ax.plot(line, line, color="#444", lw=1)
    ax.plot(line, growth_factor * line, color=STATUS_COLORS["grew"], ls="--", lw=1)
    ax.axhline(1.0, color="#c00", ls=":", lw=1.2)
    if ratio_floor:
        ax.axhline(ratio_floor, color="#888", ls="-.", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("baseline err / bound", fontsize=10)
    ax.set_ylabel("candidate err / bound", fontsize=10)
    ax.set_title("err/bound: candidate against baseline, one point per row", fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.tick_params(labelsize=9)
    shown = [s for s in STATUSES if (pts["status"] == s).any()]
    handles = [Line2D([], [], color=STATUS_COLORS[s], marker="o", ls="", label=s) for s in shown]
    handles += [Line2D([], [], color="#555", marker=marker[op], ls="", label=f"op {op}") for op in ops]
    handles += [Line2D([], [], color="#444", lw=1, label="y = x"),
                Line2D([], [], color=STATUS_COLORS["grew"], ls="--", label=f"y = {growth_factor:g} x"),
                Line2D([], [], color="#c00", ls=":", label="candidate fails above")]
    if ratio_floor:
        handles.append(Line2D([], [], color="#888", ls="-.", label=f"ratio floor {ratio_floor:g}"))
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(0.72, 0.5), fontsize=9.5,
               frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _compare_cell(col: str, val, ctx: tuple) -> str:
    """A cell of the comparison table; ctx is (status, verdict_baseline, verdict_candidate)."""
    status, vb, vc = ctx
    if col == "status":
        return f'<td class="s-{_e(status.replace(" ", "-"))}">{_e(val)}</td>'
    if col in ("verdict_baseline", "verdict_candidate"):
        return _cell("verdict", val, "") if val else "<td></td>"
    side = vb if col.endswith("_baseline") else vc
    if col in ("ratio_baseline", "ratio_candidate"):  # the verdict where there is no ratio
        cls = "r-bad" if side == "FAIL" else ratio_class(val) if side != "ERROR" else "v-ERROR"
        return f'<td class="{cls}">{_e(_num(val) or side)}</td>'
    if col == "growth":
        cls = {"grew": ' class="r-bad"', "shrank": ' class="r-ok"'}.get(status, "")
        return f"<td{cls}>{_e(fmt_growth(val))}</td>"
    if col in _NUMERIC:
        return f"<td>{_e(_num(val))}</td>"
    return _cell(col, val, "")


def render_compare_html(table: pd.DataFrame, meta: dict | None = None) -> str:
    """One self-contained page: the verdict and status counts, the err/bound scatter of the
    candidate against the baseline, then every row (bad statuses first), sortable, filterable
    and coloured by err/bound as in the main report."""
    table = sort_comparison(table) if len(table) else table
    verdict = compare_verdict(table)
    settings = _settings(table, meta)
    info = run_meta(table, {k: v for k, v in (meta or {}).items()
                            if k not in _SETTINGS})
    info.update(settings, rows=str(len(table)))
    info.setdefault("report generated", _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S"))
    title = f"candidate vs baseline: {verdict}"
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{_e(title)}</title>", f"<style>{_CSS}{_COMPARE_CSS}</style></head><body>",
           f"<h1>{_e(title)}</h1>",
           '<table class="meta">' + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>"
                                            for k, v in info.items()) + "</table>"]
    badges = "".join(f'<span class="badge s-{_e(s.replace(" ", "-"))}" title="{_e(_EXPLAIN[s])}">'
                     f"{_e(s)} {n}</span>" for s, n in status_counts(table).items())
    out.append(f'<p><span class="headline {verdict}">{verdict}</span> {badges}</p>')
    out.append('<p class="note">The gate fails on: ' + ", ".join(map(_e, BAD_STATUSES)) + ".</p>")
    out += _plot_section(table, settings)
    out += _table_section(table)
    out.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(out)


def _plot_section(table: pd.DataFrame, settings: dict) -> list[str]:
    out = ['<h2 id="plot">err/bound, candidate against baseline</h2>']
    png = compare_figure(table, float(settings.get("growth factor", 2.0)),
                         float(settings["ratio floor"]) if "ratio floor" in settings else None)
    if png is None:
        return out + ['<p class="note">No row has an err/bound in both runs, so there is nothing '
                      "to plot.</p>"]
    missing = len(table) - len(_plot_points(table))
    note = f" {missing} rows without an err/bound in both runs are not drawn." if missing else ""
    return out + [f'<div><img class="plot" alt="candidate vs baseline err/bound" '
                  f'src="{png_data_uri(png)}"></div>',
                  '<p class="note">Above the dashed line err/bound grew beyond the growth factor (the '
                  "gate counts a row as grown only beyond the noise between machines on top of it)."
                  f"{_e(note)}</p>"]


def _table_section(table: pd.DataFrame) -> list[str]:
    """Every row: the key, both err/bounds (the verdict where there is none; FAIL in red), the
    growth and the message, with the verdicts, err and bound behind "more columns"; the columns
    that hold one value throughout, and the implementations when each variant has one, are named
    in a note instead."""
    out = [f'<h2 id="results-h">Rows ({len(table)})</h2>']
    if table.empty:
        return out + ['<p class="note">No rows in either run.</p>']
    cols = ["status", *(c for c in COMPARE_COLUMNS if c != "status")]
    same = _left_out(table[["op", "dtype", "T"]], ())
    for side in ("baseline", "candidate"):
        impl = table[f"impl_{side}"]
        one = _left_out(table.assign(impl=impl)[impl != ""][["op", "variant", "impl"]], ("op",))
        if "impl" in one or (impl == "").all():
            same[f"impl_{side}"] = one.get("impl", "")
    out.append(_same_note("The same in every row, so left out of the table", same))
    out.append(_filters(table, ("status", "op", "variant", "dtype", "check", "tensor",
                                "verdict_baseline", "verdict_candidate"), always="status"))
    out.append('<p class="note">Click a column header to sort; click a message to expand it. '
               "err/bound coloured as in the main report; growth red where it counts.</p>")
    out.append(_table(table, [c for c in cols if c not in same], "results", cell=_compare_cell,
                      is_num=_NUMERIC.__contains__, col_css=WRAP_COLUMNS,
                      context=("status", "verdict_baseline", "verdict_candidate"),
                      more=("verdict_baseline", "verdict_candidate", "err_baseline",
                            "err_candidate", "bound_baseline", "bound_candidate")))
    return out


def write_compare_html(table: pd.DataFrame, path: str | os.PathLike, meta: dict | None = None) -> str:
    """Write `render_compare_html(...)` to `path`; returns the path."""
    return write_page(render_compare_html(table, meta), path)
