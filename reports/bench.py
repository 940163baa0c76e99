"""Reports of kernel timings (`python -m harness bench`): a typed frame of the bench CSV, a wide
summary with our time over upstream fla's, a bar chart per op, one self-contained HTML page in
the look of the correctness report, and the summary as markdown.

The CSV holds one row per measurement (BENCH_COLUMNS). Phases "fwd" and "fwd+bwd" are timed with
triton.testing.do_bench (median and quartiles, with nominal TFLOP/s and GB/s); "first fwd" and
"first bwd" are one call on a cold Triton cache (compile + autotune + run), their single time in
median_ms. A row with a message did not measure: "SKIP: ..." when the implementation is not
there, anything else (usually "ERROR: ...") when it failed; its numbers are empty.
"""
from __future__ import annotations

import datetime as _dt
import io
import math
import os
from typing import Iterable, Union

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from .html import _CSS, _JS, _cell, _e, _filters, _shapes, _table, write_page
from .kernels import kernels_nav, kernels_section
from .markdown import md_escape
from .plots import png_data_uri
from .results import coerce_columns, fmt_num, run_meta
from .schema import BENCH_COLUMNS, BENCH_FLOAT_COLUMNS, BENCH_INT_COLUMNS, SHAPE

PathLike = Union[str, "os.PathLike[str]"]

DIMS = SHAPE
# One row of the wide table per KEY; SHAPE_KEY is what one figure panel shows.
KEY = ("op", "dtype", *DIMS, "variant", "impl")
SHAPE_KEY = ("op", "dtype", *DIMS)
IMPLS = ("ours", "fla", "torch")
VARIANTS = ("chunk", "fused_chunk", "fused_recurrent")
TIMED_PHASES = ("fwd", "fwd+bwd")
FIRST_PHASES = ("first fwd", "first bwd")
IMPL_COLORS = {"ours": "#1f77b4", "fla": "#ff7f0e", "torch": "#7f7f7f"}
PHASE_ALPHA = {"fwd": 0.5, "fwd+bwd": 1.0}
LOG_SPAN = 30.0   # a panel's x-axis turns logarithmic when its times span more than this factor
MAX_PANELS = 24
# "vs fla" colours: green up to VS_FLA_OK (within timing noise of fla or faster), amber up to
# VS_FLA_NEAR, red above.
VS_FLA_OK = 1.05
VS_FLA_NEAR = 1.5


def _phase_columns(phase: str) -> tuple:
    return (f"{phase} ms", f"{phase} q25-q75", f"{phase} TFLOP/s", f"{phase} GB/s",
            f"{phase} vs fla")


TABLE_VALUE_COLUMNS = (*_phase_columns("fwd"), *_phase_columns("fwd+bwd"), "first fwd s",
                       "first bwd s")
TABLE_COLUMNS = (*KEY, *TABLE_VALUE_COLUMNS)
_RAW_NUMERIC = BENCH_INT_COLUMNS + BENCH_FLOAT_COLUMNS


# -- reading ---------------------------------------------------------------------------------

def coerce_bench(df: pd.DataFrame) -> pd.DataFrame:
    """A typed copy of `df` (see reports.results.coerce_columns), so that frames built in memory
    and frames read from CSV render alike."""
    return coerce_columns(df, BENCH_COLUMNS, BENCH_INT_COLUMNS, BENCH_FLOAT_COLUMNS)


def read_bench(paths: Union[PathLike, Iterable[PathLike]]) -> pd.DataFrame:
    """One typed frame (see `coerce_bench`) of one or more bench CSVs, rows in file order."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    frames = [pd.read_csv(p, dtype=str, keep_default_na=False, na_filter=False) for p in paths]
    if not frames:
        return coerce_bench(pd.DataFrame(columns=list(BENCH_COLUMNS)))
    return coerce_bench(pd.concat(frames, ignore_index=True))


# -- the wide table --------------------------------------------------------------------------

def _outcome(message: str, median) -> str:
    """"ok", "skipped" (a "SKIP: ..." message) or "failed" (another message, or no time)."""
    if message.startswith("SKIP"):
        return "skipped"
    if message or median is pd.NA or not (median == median):
        return "failed"
    return "ok"


def _plain(v):
    """A key value fit for a dict key and for sorting: None for a missing int."""
    if v is pd.NA or v is None:
        return None
    return int(v) if isinstance(v, (int, np.integer)) else v


def _rank(value, order: tuple) -> tuple:
    """Sort key: the known values of `order` first, in that order, then the rest by name."""
    return (order.index(value), "") if value in order else (len(order), value)


def _sort_key(key: tuple) -> tuple:
    """op, dtype and shape, then variant (ours' known ones first) and impl (ours, fla, torch)."""
    *shape, variant, impl = key
    shape = tuple(-1 if v is None else v for v in shape)
    return (*shape, _rank(variant, VARIANTS), _rank(impl, IMPLS))


def _measurements(df: pd.DataFrame) -> dict:
    """{(KEY values, phase): row as a dict with its outcome}; a later row of the same key and
    phase (a re-run appended to the CSV) replaces an earlier one."""
    out = {}
    for r in df.to_dict("records"):
        key = tuple(_plain(r[c]) for c in KEY)
        out[(key, r["phase"])] = {**r, "outcome": _outcome(r["message"], r["median_ms"])}
    return out


def _sig(x, digits: int = 3) -> str:
    """`digits` significant digits without an exponent ("1.00", "0.0123", "1234"); "" for
    missing."""
    if x is None or x is pd.NA or not (x == x):
        return ""
    x = float(x)
    if x == 0 or math.isinf(x):
        return fmt_num(x)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def _vs_fla(m: dict, key: tuple, phase: str) -> str:
    """Our median over fla's for the same op, dtype, shape, variant and phase; "" unless both
    measured."""
    if key[-1] != "ours":
        return ""
    ours, fla = m.get((key, phase)), m.get((key[:-1] + ("fla",), phase))
    if not ours or not fla or ours["outcome"] != "ok" or fla["outcome"] != "ok" \
            or not fla["median_ms"] > 0:
        return ""
    return _sig(ours["median_ms"] / fla["median_ms"])


def _phase_cells(m: dict, key: tuple, phase: str) -> list:
    """The five cells of one timed phase: ms, q25-q75, TFLOP/s, GB/s, vs fla."""
    r = m.get((key, phase))
    if r is None:
        return [""] * 5
    if r["outcome"] != "ok":
        return [r["outcome"], "", "", "", ""]
    quart = ""
    if r["q25_ms"] == r["q25_ms"] and r["q75_ms"] == r["q75_ms"]:
        quart = f"{_sig(r['q25_ms'])}-{_sig(r['q75_ms'])}"
    return [_sig(r["median_ms"]), quart, _sig(r["tflops"]), _sig(r["gbps"]), _vs_fla(m, key, phase)]


def _first_cell(m: dict, key: tuple, phase: str) -> str:
    """A first-call time in seconds, or its outcome."""
    r = m.get((key, phase))
    if r is None:
        return ""
    return _sig(r["median_ms"] / 1e3) if r["outcome"] == "ok" else r["outcome"]


def bench_table(df: pd.DataFrame) -> pd.DataFrame:
    """The wide summary, one row per (op, dtype, B, T, H, K, V, M, variant, impl), ordered by op,
    dtype and shape, then variant, then impl (ours, fla, torch); columns TABLE_COLUMNS.

    A display table: the key columns keep their types, the values are text rounded to three
    significant digits ("" where not measured, "failed" or "skipped" where the measurement did
    not happen): per timed phase the median ms, "q25-q75", TFLOP/s, GB/s and "vs fla" (our
    median over fla's for the same op, dtype, shape, variant and phase, on our rows where both
    measured); then the first forward and backward call in seconds."""
    df = coerce_bench(df)
    m = _measurements(df)
    keys = sorted({k for k, _ in m}, key=_sort_key)
    rows = []
    for key in keys:
        cells = [*_phase_cells(m, key, "fwd"), *_phase_cells(m, key, "fwd+bwd"),
                 *(_first_cell(m, key, p) for p in FIRST_PHASES)]
        rows.append((*key, *cells))
    out = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    for c in DIMS:
        out[c] = out[c].astype("Int64")
    for c in ("op", "dtype", "variant", "impl", *TABLE_VALUE_COLUMNS):
        out[c] = out[c].astype(str)
    return out


def _no_slots(m: pd.Series) -> bool:
    """True when M is empty or 0 in every row: ops without slots."""
    return bool((m.isna() | (m == 0)).all())


def _shown_columns(table: pd.DataFrame) -> list:
    """Columns of a table worth showing: all but those empty in every row (and M without
    slots)."""
    def empty(c):
        col = table[c]
        if c == "M":
            return _no_slots(col)
        return bool(col.isna().all()) if c in DIMS else bool((col == "").all())
    return [c for c in table.columns if not empty(c)] if len(table) else list(table.columns)


# -- the figure ------------------------------------------------------------------------------

def _impl_colors(impls: Iterable[str]) -> dict:
    """IMPL_COLORS, then tab10's other colours for implementations it does not know."""
    spare = [c for i, c in enumerate(matplotlib.colormaps["tab10"].colors) if i not in (0, 1, 7)]
    out, k = {}, 0
    for impl in sorted(set(impls), key=lambda i: _rank(i, IMPLS)):
        if impl in IMPL_COLORS:
            out[impl] = IMPL_COLORS[impl]
        else:
            out[impl] = spare[k % len(spare)]
            k += 1
    return out


def _panel_title(shape: tuple) -> str:
    op, dtype, *dims = shape
    parts = [f"{d}{v}" for d, v in zip(DIMS, dims) if v is not None and not (d == "M" and v == 0)]
    return f"{op} {dtype} " + " ".join(parts)


def _xlim(values: np.ndarray) -> tuple[float, float, bool]:
    """(lo, hi, log): a log axis when the positive values span more than LOG_SPAN, with room on
    the right for the value labels."""
    v = values[np.isfinite(values) & (values > 0)]
    if v.size == 0:
        return 0.0, 1.0, False
    lo, hi = float(v.min()), float(v.max())
    if hi / lo > LOG_SPAN:
        return 10 ** math.floor(math.log10(lo / 1.5)), hi * 5, True
    return 0.0, hi * 1.35, False


def _draw_bar(ax, y: float, r: dict, color, phase: str, lo: float, log: bool, hi: float):
    """One bar with its q25-q75 whisker and value, or the outcome's word where it did not run."""
    if r["outcome"] != "ok":
        ax.text(0.01, y, r["outcome"], transform=ax.get_yaxis_transform(), va="center",
                ha="left", fontsize=7, color="#c00" if r["outcome"] == "failed" else "#666",
                fontweight="bold")
        return
    med = r["median_ms"]
    ax.barh(y, med - lo, left=lo, height=0.38, color=color, alpha=PHASE_ALPHA[phase],
            edgecolor=color, linewidth=0.8)
    end = med
    if r["q25_ms"] == r["q25_ms"] and r["q75_ms"] == r["q75_ms"]:
        err = [[max(med - r["q25_ms"], 0.0)], [max(r["q75_ms"] - med, 0.0)]]
        ax.errorbar(med, y, xerr=err, fmt="none", ecolor="#222", elinewidth=0.9, capsize=2)
        end = max(med, r["q75_ms"])
    ax.text(end * 1.08 if log else end + 0.012 * hi, y, _sig(med), va="center", ha="left",
            fontsize=7)


def _panel(ax, m: dict, shape: tuple, groups: list, colors: dict, slots: int):
    """Grouped horizontal bars of one (op, dtype, shape): per (variant, impl) fwd above
    fwd+bwd, from the top of `slots` rows, so that bars are equally thick in every panel."""
    rows = [m.get(((*shape, *g), p)) for g in groups for p in TIMED_PHASES]
    vals = np.array([x for r in rows if r and r["outcome"] == "ok"
                     for x in (r["median_ms"], r["q25_ms"], r["q75_ms"])], dtype="float64")
    lo, hi, log = _xlim(vals)
    for i, (variant, impl) in enumerate(groups):
        for j, phase in enumerate(TIMED_PHASES):
            r = m.get(((*shape, variant, impl), phase))
            if r is not None:
                _draw_bar(ax, i + (j - 0.5) * 0.4, r, colors[impl], phase, lo, log, hi)
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(slots - 0.4, -0.6)
    ax.set_yticks(range(len(groups)), labels=[f"{v} · {i}" for v, i in groups])
    ax.set_title(_panel_title(shape), fontsize=9)
    ax.set_xlabel("median ms" + (" (log)" if log else ""), fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, axis="x", which="major", alpha=0.3)


def _legend_handles(colors: dict) -> list:
    handles = [Patch(color=c, label=impl) for impl, c in colors.items()]
    handles += [Patch(facecolor="#555", alpha=PHASE_ALPHA[p], edgecolor="#555",
                      label=f"{p} (upper bar)" if p == "fwd" else p) for p in TIMED_PHASES]
    return handles


def bench_figure(df: pd.DataFrame, dpi: int = 80) -> bytes | None:
    """PNG: a panel per (op, dtype, shape), up to MAX_PANELS, with a pair of horizontal bars per
    (variant, impl): the median ms of fwd (light) and fwd+bwd (solid), whiskers from q25 to q75,
    colour by impl; the x-axis turns logarithmic when a panel spans more than LOG_SPAN. A
    measurement that failed or was skipped shows as that word instead of a bar. None when there
    is no fwd or fwd+bwd row."""
    df = coerce_bench(df)
    df = df[df["phase"].isin(TIMED_PHASES)]
    if df.empty:
        return None
    m = _measurements(df)
    keys = sorted({k for k, _ in m}, key=_sort_key)
    shapes = list(dict.fromkeys(k[:len(SHAPE_KEY)] for k in keys))
    groups = {s: [k[len(SHAPE_KEY):] for k in keys if k[:len(SHAPE_KEY)] == s] for s in shapes}
    shown = shapes[:MAX_PANELS]
    colors = _impl_colors(df["impl"])

    label_in = 0.2 + 0.065 * max(len(f"{v} · {i}") for s in shown for v, i in groups[s])
    ax_w, gap = 4.0, label_in + 0.35
    slots = max(len(groups[s]) for s in shown)
    ax_h = 0.35 + 0.42 * slots
    ncols = min(len(shown), 2)
    nrows = math.ceil(len(shown) / ncols)
    top, bottom, hgap = 0.6, 0.95, 0.8
    width = label_in + ncols * ax_w + (ncols - 1) * gap + 0.3
    height = top + nrows * ax_h + (nrows - 1) * hgap + bottom
    fig = Figure(figsize=(width, height), dpi=dpi)  # fixed margins: a layout engine is slow
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    fig.subplots_adjust(left=label_in / width, right=1 - 0.3 / width, top=1 - top / height,
                        bottom=bottom / height, wspace=gap / ax_w, hspace=hgap / ax_h)
    for ax, shape in zip(axes, shown):
        _panel(ax, m, shape, groups[shape], colors, slots)
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    handles = _legend_handles(colors)
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.02 / height),
               ncols=len(handles), fontsize=8, frameon=False)
    more = f" (first {len(shown)} of {len(shapes)} shapes)" if len(shapes) > len(shown) else ""
    fig.suptitle("median time per call, whiskers q25-q75" + more, fontsize=11,
                 y=1 - 0.12 / height, va="top")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


# -- HTML ------------------------------------------------------------------------------------

_BENCH_CSS = "td.o-failed{background:#f7b9b9;font-weight:600}td.o-skipped{background:#e6e6e6;color:#555}"


def _vs_class(text: str) -> str:
    """CSS class of a "vs fla" cell (see VS_FLA_OK, VS_FLA_NEAR)."""
    if not text:
        return ""
    r = float(text)
    return "r-ok" if r <= VS_FLA_OK else ("r-near" if r <= VS_FLA_NEAR else "r-bad")


def _dim(col: str, val) -> str:
    """A shape value as text; M = 0 (no slots) as ""."""
    return "" if col == "M" and val is not pd.NA and val == 0 else fmt_num(val)


def _wide_cell(col: str, val, ctx) -> str:
    """A cell of the wide table: outcomes and "vs fla" coloured."""
    if val in ("failed", "skipped"):
        return f'<td class="o-{val}">{val}</td>'
    if col.endswith("vs fla") and val:
        return f'<td class="{_vs_class(val)}">{_e(val)}</td>'
    if col in DIMS:
        return f"<td>{_e(_dim(col, val))}</td>"
    return f"<td>{_e(val)}</td>"


def _raw_cell(col: str, val, ctx) -> str:
    """A cell of the raw rows table: numbers compact, "" where missing; messages expandable."""
    if col in _RAW_NUMERIC:
        txt = fmt_num(val, 4)
        return f"<td>{_e('' if txt == 'nan' else txt)}</td>"
    return _cell(col, val, "")


def _failed_cell(col: str, val, ctx) -> str:
    """A cell of the failed-measurements table: the outcome coloured, the message in full."""
    if col == "outcome":
        return f'<td class="o-{_e(val)}">{_e(val)}</td>'
    return _cell(col, val, "")


def _display_shapes(df: pd.DataFrame) -> list:
    """"B2 T4096 H4 K64 V64" per row, M left out where it is 0 (no slots)."""
    return _shapes(df.assign(M=df["M"].mask(df["M"] == 0)))


def _meta(df: pd.DataFrame, meta: dict | None) -> dict:
    """The page's header: device, versions, git, run id and shape first, then the rest."""
    info = run_meta(df, meta)
    shapes = list(dict.fromkeys(_display_shapes(df))) if len(df) else []
    if shapes and "shape" not in info:
        more = f" (+{len(shapes) - 5} more)" if len(shapes) > 5 else ""
        info["shape"] = ", ".join(shapes[:5]) + more
    info.setdefault("rows", str(len(df)))
    info.setdefault("report generated", _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S"))
    first = [k for k in ("device", "torch", "triton", "git", "run_id", "shape") if k in info]
    return {k: info[k] for k in first + [k for k in info if k not in first]}


def _not_measured(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that failed or were skipped, with their outcome, a shape and a message to show."""
    outcome = [_outcome(msg, med) for msg, med in zip(df["message"], df["median_ms"])]
    out = df.assign(outcome=outcome, shape=_display_shapes(df))
    out = out[out["outcome"] != "ok"]
    return out.assign(message=out["message"].replace("", "no time and no message recorded"))


def _first_calls(table: pd.DataFrame) -> pd.DataFrame:
    """The wide table's rows with a first-call time, shape and first-call columns only."""
    has = (table["first fwd s"] != "") | (table["first bwd s"] != "")
    return table.loc[has, [*KEY, *(f"{p} s" for p in FIRST_PHASES)]]


def _meta_table(info: dict) -> str:
    return '<table class="meta">' + "".join(
        f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in info.items()) + "</table>"


def _figure_section(df: pd.DataFrame) -> list:
    out = ['<h2 id="figure">Median times</h2>']
    png = bench_figure(df)
    if png is None:
        return out + ['<p class="note">No fwd or fwd+bwd measurement to plot.</p>']
    return out + [f'<div><img class="plot" alt="median times per variant and implementation" '
                  f'src="{png_data_uri(png)}"></div>']


def _summary_section(table: pd.DataFrame) -> list:
    out = [f'<h2 id="summary">Summary ({len(table)} rows)</h2>']
    if table.empty:
        return out + ['<p class="note">No measurements.</p>']
    out.append(f'<p class="note">Times in ms (median, q25-q75), first calls in s; vs fla: our '
               f"median over fla's for the same op, dtype, shape, variant and phase (below 1 we "
               f"are faster; green up to {VS_FLA_OK:g}, amber up to {VS_FLA_NEAR:g}, red above)."
               "</p>")
    return out + [_table(table, _shown_columns(table), "bench-table", cell=_wide_cell,
                         is_num=lambda c: c in DIMS or c in TABLE_VALUE_COLUMNS, context="impl")]


def _raw_section(df: pd.DataFrame) -> list:
    out = [f'<h2 id="results-h">All measurements ({len(df)} rows)</h2>']
    if df.empty:
        return out + ['<p class="note">No rows.</p>']
    same = [c for c in ("run_id", "device", "torch", "triton", "git")
            if len(df) > 1 and df[c].nunique() <= 1]
    cols = [c for c in df.columns if c not in same and not (c == "M" and _no_slots(df["M"]))]
    out.append(_filters(df, ("op", "impl", "variant", "dtype", "phase"), always="phase"))
    out.append('<p class="note">Click a column header to sort; click a message to expand it.</p>')
    return out + [_table(df, cols, "results", cell=_raw_cell, is_num=_RAW_NUMERIC.__contains__,
                         context="phase")]


def _first_section(table: pd.DataFrame) -> list:
    first = _first_calls(table)
    out = ['<h2 id="first">First call: compile, autotune and run (s)</h2>']
    if first.empty:
        return out + ['<p class="note">No first-call measurement.</p>']
    return out + [_table(first, _shown_columns(first), "first-table", cell=_wide_cell,
                         is_num=lambda c: c in DIMS or c.endswith(" s"), context="impl")]


def _failed_section(df: pd.DataFrame) -> list:
    bad = _not_measured(df)
    out = [f'<h2 id="failed">Failed or skipped measurements ({len(bad)})</h2>']
    if bad.empty:
        return out + ['<p class="note">Every measurement ran.</p>']
    cols = ("outcome", "op", "dtype", "shape", "variant", "impl", "phase", "message")
    return out + [_table(bad, cols, "failed-table", cls="fail-table", cell=_failed_cell,
                         is_num=lambda c: False, context="phase")]


def render_bench_html(df: pd.DataFrame, meta: dict | None = None,
                      kernels: pd.DataFrame | None = None) -> str:
    """One self-contained page (inline CSS, JS and PNG, everything from the data escaped):
    "kernel timings", the run's device, versions, git, run id and shape, the figure, the wide
    table, every row (sortable, filterable), the first calls, the failed or skipped
    measurements with their messages and, given `kernels` (kernels.csv), the time per kernel."""
    df = coerce_bench(df)
    table = bench_table(df)
    n_bad = len(_not_measured(df))
    title = "kernel timings"
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{_e(title)}</title>", f"<style>{_CSS}{_BENCH_CSS}</style></head><body>",
           f"<h1>{_e(title)}</h1>", _meta_table(_meta(df, meta)),
           '<p class="nav"><a href="#figure">Median times</a> · <a href="#summary">Summary</a> · '
           '<a href="#results-h">All measurements</a> · <a href="#first">First calls</a> · '
           f'<a href="#failed">Failed or skipped ({n_bad})</a>'
           + (kernels_nav() if kernels is not None else "") + '</p>']
    out += _figure_section(df)
    out += _summary_section(table)
    out += _raw_section(df)
    out += _first_section(table)
    out += _failed_section(df)
    if kernels is not None:
        out += kernels_section(kernels)
    out.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(out)


def write_bench_html(df: pd.DataFrame, path: str | os.PathLike, meta: dict | None = None,
                     kernels: pd.DataFrame | None = None) -> str:
    """Write `render_bench_html(...)` to `path`; returns the path."""
    return write_page(render_bench_html(df, meta, kernels), path)


# -- markdown --------------------------------------------------------------------------------

def _md_failures(df: pd.DataFrame, message_chars: int) -> list:
    """One bullet per failed or skipped measurement, with its message."""
    bad = _not_measured(df)
    return [f"- {r.outcome}: {md_escape(r.op)} {md_escape(r.dtype)} {md_escape(r.variant)} "
            f"{md_escape(r.impl)} {md_escape(r.phase)}: {md_escape(r.message, message_chars)}"
            for r in bad.itertuples(index=False)]


def render_bench_markdown(df: pd.DataFrame, message_chars: int = 160) -> str:
    """The wide table as a markdown table, one line per row of `bench_table` (columns empty in
    every row left out), then a bullet per failed or skipped measurement with its message."""
    df = coerce_bench(df)
    table = bench_table(df)
    if table.empty:
        return "No measurements.\n"
    cols = _shown_columns(table)
    right = set(DIMS) | set(TABLE_VALUE_COLUMNS)
    lines = ["| " + " | ".join(md_escape(c) for c in cols) + " |",
             "|" + "".join("---:|" if c in right else "---|" for c in cols)]
    for row in table[cols].itertuples(index=False, name=None):
        cells = [_dim(c, v) if c in DIMS else v for c, v in zip(cols, row)]
        lines.append("| " + " | ".join(md_escape(v) for v in cells) + " |")
    failures = _md_failures(df, message_chars)
    if failures:
        lines += ["", *failures]
    return "\n".join(lines) + "\n"
