"""One self-contained HTML page for a results frame: inline CSS and JS, plots as base64 PNGs,
no external references. Failures come first, then the worst err/bound tables, the full table
(sortable, filterable), then the plots. The page fits a 1400 px window: tables leave out the
columns that hold one value (a note gives it), hide the rarely read ones behind "more columns"
and wrap long names. Every piece of text from the data or `meta` is escaped."""
from __future__ import annotations

import datetime as _dt
import html as _html
import os
from typing import Iterable

import numpy as np
import pandas as pd

from .patterns import failure_patterns
from .plots import error_vs_T_figure, png_data_uri, ratio_vs_T_figure
from .results import (_plain_impl, coerce_results, fmt_num, run_meta, subject, summarize,
                      tensor_group, tensor_sort_key, worst_ratio)
from .schema import FLOAT_COLUMNS, INT_COLUMNS, RUN_COLUMNS, SHAPE

# err/bound colour bands: green below AMBER_FROM, amber up to 1, red above 1, grey for NaN.
AMBER_FROM = 0.75
# Columns the full table and the failures table keep even when every row has the same value
# (others go to a note).
ALWAYS_SHOWN = ("case_id", "variant", "dtype", "T", "check", "tensor", "err", "bound", "ratio",
                "verdict")
# Columns of the full table hidden until "more columns" is ticked, so that it fits the page: the
# case's axes but dtype and T (its id has them all), the terms of the bound, where the result went
# bad, and bookkeeping.
MORE_COLUMNS = ("B", "H", "K", "V", "M", "h0", "gate", "seed", "rms_rel", "base_err", "floor",
                "atol", "nan", "inf", "first_bad", "wall_s", "case_rows")
FILTER_COLUMNS = ("op", "variant", "impl", "dtype", "check", "tensor", "verdict")
FAILURE_COLUMNS = ("verdict", "case_id", "op", "variant", "dtype", "tensor", "check", "ratio", "err",
                   "bound", "message", "shape", "h0", "gate", "impl", "nan", "inf", "first_bad")
FAILURE_KEPT = ("verdict", "case_id", "variant", "dtype", "tensor", "check", "ratio", "err",
                "bound", "message")
# Long values wrap (at spaces and the "~" of a variant pair) where the page is too narrow for them,
# instead of widening it; in the failures table, whose rows are tall anyway, case ids do too.
WRAP_COLUMNS = {"tensor": "white-space:normal;min-width:8ch;max-width:19ch",
                "variant": "white-space:normal", "impl": "white-space:normal"}
FAILURE_WRAP = {**WRAP_COLUMNS, "case_id": "white-space:normal;min-width:17ch;max-width:22ch",
                "shape": "white-space:normal;max-width:10ch",
                "first_bad": "white-space:normal;max-width:10ch"}
# A NaN in these columns is the result's own (a kernel that returned NaN) where the row counted NaN
# or Inf in the result; any other NaN means the row has no such number (an agreement row has no
# floor, an inputs row no err), and its cell stays empty.
MEASURED = ("err", "rel", "rms_rel", "ratio")
# Checks with a verdict and no numbers: a column of the worst err/bound tables, on the row of the
# variant they check.
WHOLE_RUN = ("inputs", "determinism")

_CSS = """
body{font:13px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px 24px;color:#222}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:14px 0 4px}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:2px 5px;text-align:left;white-space:nowrap;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0;z-index:1}
.sortable{font-size:12px}.sortable th{white-space:normal}
table.meta th{position:static;text-align:right}table.meta td{white-space:normal;max-width:110ch}
.scroll{max-height:75vh;overflow:auto;scrollbar-gutter:stable;border:1px solid #ccc;display:inline-block;max-width:100%}
.sortable th{cursor:pointer;user-select:none}
.sortable th[data-dir=asc]::after{content:" \\25B2"}.sortable th[data-dir=desc]::after{content:" \\25BC"}
.r-ok{background:#d8f0d8}.r-near{background:#ffe2a8}.r-bad{background:#f7b9b9;font-weight:600}
.r-na{background:#e6e6e6;color:#666}
.v-PASS{background:#d8f0d8}.v-FAIL{background:#f08080;font-weight:700}
.v-ERROR{background:#c070c0;color:#fff;font-weight:700}.v-SKIP{background:#e6e6e6;color:#555}
.badge{display:inline-block;padding:3px 10px;margin-right:6px;border-radius:10px;font-weight:600}
.headline{font-size:18px;font-weight:700;padding:4px 12px;border-radius:4px;display:inline-block}
.headline.PASS{background:#d8f0d8}.headline.FAIL{background:#f08080}.headline.EMPTY{background:#e6e6e6}
td.msg{max-width:26ch;overflow:hidden;text-overflow:ellipsis;cursor:pointer}
td.msg.open{white-space:pre-wrap;overflow:visible}
.fail-table td.msg{white-space:pre-wrap;min-width:34ch;max-width:52ch;font-family:ui-monospace,monospace;font-size:11px}
.filters{margin:6px 0;display:flex;flex-wrap:wrap;gap:8px;align-items:center}
.filters input[type=search]{width:28em;padding:3px}
.note{color:#666;font-size:12px}
img.plot{max-width:100%;border:1px solid #ddd;margin:6px 0}
"""

_JS = """
(function(){
'use strict';
// Rows are re-rendered from their saved HTML (moving thousands of <tr> nodes is slow in Chromium).
var tables={};
function num(t){if(t===''||t==='nan')return null;if(t==='inf')return Infinity;if(t==='-inf')return -Infinity;
  var f=parseFloat(t);return isNaN(f)?null:f;}
function setup(table){
  var tb=table.tBodies[0],rows=Array.prototype.slice.call(tb.rows);
  var st={table:table,tb:tb,order:rows.map(function(r,i){return i;}),
    html:rows.map(function(r){return r.outerHTML;}),
    cells:rows.map(function(r){return Array.prototype.map.call(r.cells,function(c){return c.textContent;});}),
    heads:Array.prototype.map.call(table.tHead.rows[0].cells,function(h){return h.getAttribute('data-col');}),
    keep:null};
  st.text=st.cells.map(function(c){return c.join(' ').toLowerCase();});
  Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th,i){
    th.addEventListener('click',function(){sortTable(table.id,i);});});
  table.addEventListener('click',function(ev){var td=ev.target.closest('td.msg');if(td)td.classList.toggle('open');});
  tables[table.id]=st;}
function render(st){
  st.tb.innerHTML=st.order.map(function(i){return st.html[i];}).join('');
  if(st.keep)applyRows(st);}
function sortTable(id,col){
  var st=tables[id],th=st.table.tHead.rows[0].cells[col];
  var dir=th.getAttribute('data-dir')==='asc'?'desc':'asc',s=dir==='asc'?1:-1,isNum=th.hasAttribute('data-num');
  Array.prototype.forEach.call(st.table.tHead.rows[0].cells,function(h){h.removeAttribute('data-dir');});
  th.setAttribute('data-dir',dir);
  var key=st.cells.map(function(c){var t=c[col].trim();return isNum?num(t):(t===''?null:t.toLowerCase());});
  st.order=st.order.slice().sort(function(a,b){var x=key[a],y=key[b];
    if(x===null)return y===null?a-b:1; if(y===null)return -1;
    if(x<y)return -s; if(x>y)return s; return a-b;});
  render(st);}
function applyRows(st){
  var rows=st.tb.rows,n=0;
  for(var k=0;k<rows.length;k++){var ok=st.keep[st.order[k]];rows[k].hidden=!ok;if(ok)n++;}
  return n;}
function applyFilter(){
  var st=tables['results'];if(!st)return;
  var box=document.getElementById('filter-text'),sels=document.querySelectorAll('select.col-filter');
  var terms=box.value.toLowerCase().split(/\\s+/).filter(Boolean),conds=[];
  Array.prototype.forEach.call(sels,function(s){if(s.value!=='')conds.push([st.heads.indexOf(s.getAttribute('data-col')),s.value]);});
  st.keep=st.cells.map(function(c,i){return terms.every(function(t){return st.text[i].indexOf(t)>=0;})&&
    conds.every(function(q){return c[q[0]]===q[1];});});
  var n=applyRows(st);
  document.getElementById('shown').textContent=n+' of '+st.cells.length+' rows shown';}
Array.prototype.forEach.call(document.querySelectorAll('table.sortable'),setup);
Array.prototype.forEach.call(document.querySelectorAll('input.more-cols'),function(b){
  b.addEventListener('change',function(){document.getElementById(b.getAttribute('data-table')).classList.toggle('less',!b.checked);});});
window.rptSort=sortTable;window.rptFilter=applyFilter;
var box=document.getElementById('filter-text');
if(box){box.addEventListener('input',applyFilter);
  Array.prototype.forEach.call(document.querySelectorAll('select.col-filter'),function(s){s.addEventListener('change',applyFilter);});
  document.getElementById('filter-clear').addEventListener('click',function(){
    box.value='';Array.prototype.forEach.call(document.querySelectorAll('select.col-filter'),function(s){s.value='';});applyFilter();});
  applyFilter();}
})();
"""


def _e(x) -> str:
    return _html.escape(str(x), quote=True)


def ratio_class(r) -> str:
    """CSS class for an err/bound cell."""
    try:
        r = float(r)
    except (TypeError, ValueError):
        return "r-na"
    if r != r:
        return "r-na"
    return "r-ok" if r < AMBER_FROM else ("r-near" if r <= 1.0 else "r-bad")


def _is_num(col: str) -> bool:
    return col in INT_COLUMNS or col in FLOAT_COLUMNS


def _num(val, real_nan: bool = False) -> str:
    """A number for a cell; NaN is blank (no such number for the row) unless `real_nan`: the
    result itself was NaN there."""
    txt = fmt_num(val)
    return "" if txt == "nan" and not real_nan else txt


def _cell(col: str, val, verdict: str, real_nan: bool = False) -> str:
    if col == "ratio":
        cls = "r-bad" if verdict == "FAIL" else ratio_class(val)
        return f'<td class="{cls}">{_e(_num(val, real_nan))}</td>'
    if _is_num(col):
        return f"<td>{_e(_num(val, real_nan))}</td>"
    if col == "verdict":
        return f'<td class="v-{_e(val)}">{_e(val)}</td>'
    if col == "message":
        return f'<td class="msg" title="{_e(val)}">{_e(val)}</td>' if val else "<td></td>"
    if col in ("variant", "impl"):  # a pair may wrap after its "~"
        return f"<td>{_e(val).replace('~', '~<wbr>')}</td>"
    return f"<td>{_e(val)}</td>"


def _result_cell(col: str, val, ctx: tuple) -> str:
    """A cell of the failures or the full table; ctx: (verdict, whether the result had NaN/Inf)."""
    verdict, bad_result = ctx
    return _cell(col, val, verdict, bad_result and col in MEASURED)


def _head(col: str) -> str:
    """A column header that may wrap after "_" or "." when long ("verdict_baseline")."""
    text = _e(col)
    return text.replace("_", "_<wbr>").replace(".", ".<wbr>") if len(col) > 12 else text


def _table(df: pd.DataFrame, columns: Iterable[str], table_id: str, cls: str = "",
           cell=_cell, is_num=_is_num, context: str | tuple = "verdict",
           col_css: dict | None = None, more: Iterable[str] = ()) -> str:
    """A sortable table of `columns` of `df` (the JS hooks on `table_id`). Each cell is
    `cell(col, value, ctx)`, ctx being the row's `context` column (a tuple of values when
    `context` is a tuple of columns); `is_num(col)` marks columns sorted and aligned as numbers.
    `col_css` styles whole columns; the columns of `more` are hidden until a "more columns" box
    above the table is ticked."""
    columns = [c for c in columns if c in df.columns]
    more = [c for c in more if c in columns]
    head = "".join(f'<th data-col="{_e(c)}"{" data-num" if is_num(c) else ""} '
                   f'title="click to sort">{_head(c)}</th>' for c in columns)
    ctxs = (df[context] if isinstance(context, str)
            else df[list(context)].itertuples(index=False, name=None))
    body = []
    for ctx, row in zip(ctxs, df[columns].itertuples(index=False, name=None)):
        body.append("<tr>" + "".join(cell(c, v, ctx) for c, v in zip(columns, row)) + "</tr>")
    # Style columns with one CSS rule each instead of a class per cell.
    nth = {c: f"#{table_id} td:nth-child({i + 1})" for i, c in enumerate(columns)}
    rules = [f"{nth[c]}{{{css}}}" for c, css in (col_css or {}).items() if c in nth]
    if any(is_num(c) for c in columns):
        rules.append(",".join(nth[c] for c in columns if is_num(c)) + "{text-align:right}")
    if more:
        rules.append(",".join(f"#{table_id}.less {t}:nth-child({columns.index(c) + 1})"
                              for c in more for t in ("td", "th")) + "{display:none}")
    style = f"<style>{''.join(rules)}</style>" if rules else ""
    toggle = (f'<label class="note"><input type="checkbox" class="more-cols" data-table='
              f'"{_e(table_id)}"> more columns: {_e(", ".join(more))}</label>' if more else "")
    classes = " ".join(c for c in ("sortable", cls, "less" if more else "") if c)
    return (f'{style}{toggle}<div class="scroll"><table id="{_e(table_id)}" class="{classes}">'
            f'<thead><tr>{head}</tr></thead><tbody>\n' + "\n".join(body)
            + "\n</tbody></table></div>")


def _shapes(df: pd.DataFrame) -> list:
    """"B2 T4096 H2 K64 V64" (M when set, not 0) per row."""
    dims = [c for c in SHAPE if df[c].notna().any()]
    return [" ".join(f"{c}{fmt_num(v)}" for c, v in zip(dims, vals)
                     if v is not pd.NA and v == v and not (c == "M" and v == 0))
            for vals in df[dims].itertuples(index=False, name=None)]


def _worst_cell(r) -> str:
    """A cell of a worst err/bound table: the ratio, or the verdict of a check without one."""
    if r is None:
        return "<td></td>"
    tip = (f"worst: {r.check} row of case {r.case_id}, T={fmt_num(r.T)}; {r.rows} rows, "
           f"{r.fails} FAIL")
    if r.ratio != r.ratio:
        cls = "r-bad" if r.verdict == "FAIL" else f"v-{r.verdict}"
        return f'<td class="{_e(cls)}" title="{_e(tip)}">{_e(r.verdict)}</td>'
    cls = "r-bad" if r.verdict == "FAIL" else ratio_class(r.ratio)
    return f'<td class="{cls}" title="{_e(tip)}">{_e(fmt_num(r.ratio))}</td>'


def _pivot(worst: pd.DataFrame, table_id: str, order: dict) -> str:
    """One worst err/bound table: a row per (subject, dtype), a column per tensor it has,
    in `order` ({tensor: rank})."""
    tensors = sorted(worst["tensor"].unique(), key=lambda t: (tensor_sort_key(t)[0], order[t]))
    head = "<th>variant</th><th>dtype</th>" + "".join(
        f'<th data-num title="worst err/bound of {_e(t)}">{_head(t)}</th>' for t in tensors)
    body = []
    for (subj, dt), g in worst.groupby(["subject", "dtype"], sort=True):
        by_t = {t: r for t, r in zip(g["tensor"], g.itertuples())}
        body.append(f"<tr><td>{_e(subj)}</td><td>{_e(dt)}</td>"
                    + "".join(_worst_cell(by_t.get(t)) for t in tensors) + "</tr>")
    return (f'<style>#{table_id} td:nth-child(n+3){{text-align:right}}</style><div class="scroll">'
            f'<table id="{table_id}" class="sortable worst"><thead><tr>{head}</tr></thead><tbody>'
            + "\n".join(body) + "</tbody></table></div>")


def _worst_tables(df: pd.DataFrame) -> str:
    """Worst err/bound per variant and dtype (rows) and tensor (columns): a table per op for its
    kernels and one for its layer, each with the tensors its rows have. Rows of options,
    segments and sums count as their tensor ("dw (no final state)" as dw) on rows of their own;
    checks with a verdict only ("inputs") are columns of the variant's own row."""
    df = df[df["check"] != "run"]
    if df.empty:
        return '<p class="note">No rows with an err/bound.</p>'
    layer, whole = df["check"].eq("layer"), df["check"].isin(WHOLE_RUN)
    keyed = df.assign(subject=subject(df.assign(check=df["check"].mask(layer | whole, "golden"))),
                      tensor=tensor_group(df), part=df["op"] + np.where(layer, " layer", ""))
    order = {t: i for i, t in enumerate(pd.unique(keyed["tensor"]))}
    worst = worst_ratio(keyed, ["part", "subject", "dtype", "tensor"])
    out = []
    for i, (part, w) in enumerate(worst.groupby("part", sort=True)):
        out.append(f"<h3>{_e(part)}</h3>")
        out.append(_pivot(w, "worst-table" + (f"-{i}" if i else ""), order))
    return "\n".join(out)


def _filters(df: pd.DataFrame, columns: Iterable[str] = FILTER_COLUMNS,
             always: str = "verdict") -> str:
    """The filter bar of the "results" table: a text box, and a select for each of `columns`
    with two values or more (`always` gets one regardless)."""
    parts = ['<input type="search" id="filter-text" placeholder="filter rows: words, all must match">']
    for c in columns:
        vals = sorted(v for v in pd.unique(df[c]) if v != "")
        if len(vals) < 2 and c != always:
            continue
        opts = "".join(f'<option value="{_e(v)}">{_e(v)}</option>' for v in vals)
        parts.append(f'<label>{_e(c)} <select class="col-filter" data-col="{_e(c)}">'
                     f'<option value="">all</option>{opts}</select></label>')
    parts.append('<button type="button" id="filter-clear">clear</button>')
    parts.append('<span id="shown" class="note"></span>')
    return '<div class="filters">' + "".join(parts) + "</div>"


def _left_out(df: pd.DataFrame, keep, where_set: bool = True) -> dict:
    """{column: value} for the columns of `df` (but `keep`) that tell nothing row by row, so that a
    table leaves them out and a note gives the value: one value in every row (`where_set`: in
    every row that has one; "" when none has), and `impl` when each variant has one implementation
    ("variant = impl" for those that are not the variant itself)."""
    if len(df) < 2:
        return {}
    out = {}
    for c in df.columns:
        values = list(pd.unique(df[c]))
        if where_set or len(values) == 1:
            values = [v for v in values if not (v is pd.NA or v != v or v == "")]
        if c not in keep and len(values) <= 1:
            out[c] = values[0] if values else ""
    if "impl" in df and "impl" not in keep and "impl" not in out \
            and (df.groupby("variant")["impl"].nunique() <= 1).all():
        pairs = df.drop_duplicates(["variant", "impl"])
        named = [f"{v} = {i}" for v, i, o in zip(pairs["variant"], pairs["impl"], pairs["op"])
                 if not _plain_impl(i, v, o)]
        out["impl"] = "; ".join(named) if named else ", ".join(sorted(set(pairs["impl"])))
    return out


def _same_note(lead: str, same: dict) -> str:
    """A note naming the columns `_left_out` took out of a table, with their values."""
    if not same:
        return ""
    parts = [f"{c}: {v}" if c.startswith("impl") else f"{c}={_num(v) if _is_num(c) else v}"
             for c, v in same.items() if v != ""]
    empty = [c for c, v in same.items() if v == ""]
    parts += ["empty: " + " ".join(empty)] if empty else []
    return f'<p class="note">{_e(lead)}: {_e(", ".join(parts))}</p>'


def _with_bad_result(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with `_bad`: the row counted NaN or Inf in its result (see MEASURED)."""
    return df.assign(_bad=(df["nan"].fillna(0) > 0) | (df["inf"].fillna(0) > 0))


# rows of the full table past which it keeps every row but PASS and the PASS rows nearest their
# bounds: a run of 172,886 rows gave an 83 MB page, 40 s to write and too heavy for a browser
ALL_ROWS_SHOWN = 20_000


def _rows_shown(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the full table, in their order: all of `df` up to ALL_ROWS_SHOWN rows; past it
    every row that is not a PASS and, to fill the rest, the PASS rows of highest err/bound."""
    if len(df) <= ALL_ROWS_SHOWN:
        return df
    df = df.reset_index(drop=True)
    passing = df["verdict"] == "PASS"
    room = max(ALL_ROWS_SHOWN - int((~passing).sum()), 0)
    nearest = df.loc[passing, "ratio"].fillna(-1.0).nlargest(room).index
    return df[~passing | df.index.isin(nearest)]


def render_html(df: pd.DataFrame, meta: dict | None = None, plots: bool = True) -> str:
    """The report page as a string. `meta` (run id, device, versions, git, wall time, command,
    anything) is shown in the header before the run columns found in `df`. `plots=False`
    leaves the figures out (faster)."""
    df = coerce_results(df)
    s = summarize(df)
    info = run_meta(df, meta)
    info.setdefault("rows", str(len(df)))
    if len(df):
        info.setdefault("T range", f"{fmt_num(df['T'].min())} .. {fmt_num(df['T'].max())}")
    info.setdefault("report generated", _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S"))
    title = f"Kernel correctness: {s['overall']}"
    if "run_id" in info:
        title += f" — run {info['run_id']}"

    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{_e(title)}</title>", f"<style>{_CSS}</style></head><body>",
           f"<h1>{_e(title)}</h1>"]
    out.append('<table class="meta">' + "".join(
        f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in info.items()) + "</table>")
    badges = "".join(f'<span class="badge v-{_e(v)}">{_e(v)} {n}</span>'
                     for v, n in s["counts"].items())
    out.append(f'<p><span class="headline {_e(s["overall"])}">{_e(s["overall"])}</span> '
               f"{badges}</p>")
    out.append('<p class="nav"><a href="#failures">Failures</a> · <a href="#worst">Worst err/bound'
               '</a> · <a href="#results-h">All results</a> · <a href="#plots">Plots</a></p>')

    fails = s["failures"]
    out.append(f'<h2 id="failures">Failures ({len(fails)})</h2>')
    shared = failure_patterns(df)
    if shared:
        out.append('<p class="note">What the failures share:</p><ul class="patterns">'
                   + "".join(f"<li>{_e(p)}</li>" for p in shared) + "</ul>")
    if len(fails):
        fails = _with_bad_result(fails.assign(shape=_shapes(fails)))
        same = _left_out(fails[[c for c in FAILURE_COLUMNS if c in fails]], FAILURE_KEPT, False)
        out.append(_same_note("The same in every failure, so left out of the table", same))
        out.append(_table(fails, [c for c in FAILURE_COLUMNS if c not in same], "failures-table",
                          cls="fail-table", cell=_result_cell, context=("verdict", "_bad"),
                          col_css=FAILURE_WRAP))
    else:
        out.append('<p class="note">No FAIL or ERROR rows.</p>')

    out.append('<h2 id="worst">Worst err/bound per variant and tensor</h2>')
    out.append('<p class="note">green &lt; %g, amber up to 1, red above 1 (fails); checks without '
               "an err/bound show their verdict. Hover a cell for the worst case.</p>" % AMBER_FROM)
    out.append(_worst_tables(df))

    out.append(f'<h2 id="results-h">All results ({len(df)} rows)</h2>')
    shown = _rows_shown(df)
    if len(shown) < len(df):
        out.append(f'<p class="note">{len(df) - len(shown):,} PASS rows farthest from their bounds are '
                   f'left out of this table, which holds every other row and the PASS rows nearest '
                   f'their bounds, {len(shown):,} in all; the results CSV holds every row.</p>')
    same = _left_out(df, ALWAYS_SHOWN)
    run_same = {c: v for c, v in same.items() if c not in RUN_COLUMNS}  # in the header already
    out.append(_same_note("The same in every row that has one, so left out of the table", run_same))
    out.append(_filters(df, [c for c in FILTER_COLUMNS if c not in same]))
    out.append('<p class="note">Click a column header to sort; click a message to expand it.</p>')
    out.append(_table(_with_bad_result(shown), [c for c in df.columns if c not in same], "results",
                      cell=_result_cell, context=("verdict", "_bad"), col_css=WRAP_COLUMNS,
                      more=MORE_COLUMNS))

    out.append('<h2 id="plots">Error against T</h2>')
    figs = [("relative error vs T", error_vs_T_figure), ("err/bound vs T", ratio_vs_T_figure)]
    figs = [(alt, fig(df)) for alt, fig in figs] if plots else []
    figs = [(alt, f) for alt, f in figs if f is not None]
    if figs:
        for alt, f in figs:
            out.append(f'<div><img class="plot" alt="{alt}" src="{png_data_uri(f)}"></div>')
    elif plots:
        out.append('<p class="note">No golden or agreement rows with a tensor to plot.</p>')
    else:
        out.append('<p class="note">Plots left out of this page.</p>')
    out.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(out)


def write_page(text: str, path: str | os.PathLike) -> str:
    """Write a page to `path` (UTF-8, to a temp file then renamed, so a reader never sees half a
    page); returns the path."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def write_html(df: pd.DataFrame, path: str | os.PathLike, meta: dict | None = None) -> str:
    """Write `render_html(df, meta)` to `path`; returns the path."""
    return write_page(render_html(df, meta), path)
