"""One self-contained HTML page for a results frame: inline CSS and JS, plots as base64 PNGs,
no external references. Failures come first, then the full table (sortable, filterable), then
the plots. Every piece of text from the data or `meta` is escaped."""
from __future__ import annotations

import datetime as _dt
import html as _html
import os
from typing import Iterable

import pandas as pd

from .patterns import failure_patterns
from .plots import error_vs_T_figure, png_data_uri, ratio_vs_T_figure
from .results import (FLOAT_COLUMNS, INT_COLUMNS, RUN_COLUMNS, coerce_results, fmt_num,
                      run_meta, summarize, tensor_sort_key)

# err/bound colour bands: green below AMBER_FROM, amber up to 1, red above 1, grey for NaN.
AMBER_FROM = 0.75
# Columns the full table keeps even when every row has the same value (others go to a note).
ALWAYS_SHOWN = ("case_id", "op", "variant", "impl", "dtype", "T", "check", "tensor", "err",
                "bound", "ratio", "verdict", "message")
FILTER_COLUMNS = ("op", "variant", "impl", "dtype", "check", "tensor", "verdict")
FAILURE_COLUMNS = ("verdict", "case_id", "op", "variant", "dtype", "tensor", "check", "ratio", "err",
                   "bound", "message", "shape", "h0", "gate", "impl", "nan", "inf", "first_bad")

_CSS = """
body{font:13px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px 24px;color:#222}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:left;white-space:nowrap;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0;z-index:1}
table.meta th{position:static;text-align:right}
.scroll{max-height:75vh;overflow:auto;border:1px solid #ccc;display:inline-block;max-width:100%}
.sortable th{cursor:pointer;user-select:none}
.sortable th[data-dir=asc]::after{content:" \\25B2"}.sortable th[data-dir=desc]::after{content:" \\25BC"}
.r-ok{background:#d8f0d8}.r-near{background:#ffe2a8}.r-bad{background:#f7b9b9;font-weight:600}
.r-na{background:#e6e6e6;color:#666}
.v-PASS{background:#d8f0d8}.v-FAIL{background:#f08080;font-weight:700}
.v-ERROR{background:#c070c0;color:#fff;font-weight:700}.v-SKIP{background:#e6e6e6;color:#555}
.badge{display:inline-block;padding:3px 10px;margin-right:6px;border-radius:10px;font-weight:600}
.headline{font-size:18px;font-weight:700;padding:4px 12px;border-radius:4px;display:inline-block}
.headline.PASS{background:#d8f0d8}.headline.FAIL{background:#f08080}.headline.EMPTY{background:#e6e6e6}
td.msg{max-width:60ch;overflow:hidden;text-overflow:ellipsis}
td.msg.open{white-space:pre-wrap;overflow:visible;max-width:none}
.fail-table td.msg{white-space:pre-wrap;min-width:40ch;max-width:90ch;font-family:ui-monospace,monospace;font-size:12px}
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


def _num(val, verdict: str) -> str:
    """A number for a cell; NaN is blank except on FAIL rows, where it is the finding."""
    txt = fmt_num(val)
    return "" if txt == "nan" and verdict != "FAIL" else txt


def _cell(col: str, val, verdict: str) -> str:
    if col == "ratio":
        cls = "r-bad" if verdict == "FAIL" else ratio_class(val)
        return f'<td class="{cls}">{_e(_num(val, verdict))}</td>'
    if _is_num(col):
        return f"<td>{_e(_num(val, verdict))}</td>"
    if col == "verdict":
        return f'<td class="v-{_e(val)}">{_e(val)}</td>'
    if col == "message":
        return f'<td class="msg" title="{_e(val)}">{_e(val)}</td>' if val else "<td></td>"
    return f"<td>{_e(val)}</td>"


def _table(df: pd.DataFrame, columns: Iterable[str], table_id: str, cls: str = "",
           cell=_cell, is_num=_is_num, context: str | tuple = "verdict") -> str:
    """A sortable table of `columns` of `df` (the JS hooks on `table_id`). Each cell is
    `cell(col, value, ctx)`, ctx being the row's `context` column (a tuple of values when
    `context` is a tuple of columns); `is_num(col)` marks columns sorted and aligned as numbers."""
    columns = [c for c in columns if c in df.columns]
    head = "".join(f'<th data-col="{_e(c)}"{" data-num" if is_num(c) else ""} '
                   f'title="click to sort">{_e(c)}</th>' for c in columns)
    ctxs = (df[context] if isinstance(context, str)
            else df[list(context)].itertuples(index=False, name=None))
    body = []
    for ctx, row in zip(ctxs, df[columns].itertuples(index=False, name=None)):
        body.append("<tr>" + "".join(cell(c, v, ctx) for c, v in zip(columns, row)) + "</tr>")
    # Right-align numeric columns with one CSS rule per column instead of a class per cell.
    align = ",".join(f"#{table_id} td:nth-child({i + 1})" for i, c in enumerate(columns) if is_num(c))
    style = f"<style>{align}{{text-align:right}}</style>" if align else ""
    ident = f' id="{_e(table_id)}"'
    return (f'{style}<div class="scroll"><table{ident} class="sortable {cls}"><thead><tr>{head}</tr>'
            f'</thead><tbody>\n' + "\n".join(body) + "\n</tbody></table></div>")


def _shapes(df: pd.DataFrame) -> list:
    """"B2 T4096 H2 K64 V64" (M when set) per row."""
    dims = [c for c in ("B", "T", "H", "K", "V", "M") if df[c].notna().any()]
    return [" ".join(f"{c}{fmt_num(v)}" for c, v in zip(dims, vals) if v is not pd.NA and v == v)
            for vals in df[dims].itertuples(index=False, name=None)]


def _pivot(worst: pd.DataFrame) -> str:
    """Worst err/bound per (op, subject, dtype) x tensor, as a coloured table."""
    if worst.empty:
        return '<p class="note">No rows with an err/bound.</p>'
    tensors = sorted(worst["tensor"].unique(), key=tensor_sort_key)
    head = "".join(f"<th>{_e(h)}</th>" for h in ("op", "variant", "dtype")) + "".join(
        f'<th data-num title="worst err/bound of {_e(t)}">{_e(t)}</th>' for t in tensors)
    body = []
    for (op, subj, dt), g in worst.groupby(["op", "subject", "dtype"], sort=True):
        by_t = {t: r for t, r in zip(g["tensor"], g.itertuples())}
        cells = []
        for t in tensors:
            r = by_t.get(t)
            if r is None:
                cells.append("<td></td>")
            else:
                tip = f"worst: case {r.case_id} T={fmt_num(r.T)}; {r.rows} rows, {r.fails} FAIL"
                cls = "r-bad" if r.verdict == "FAIL" else ratio_class(r.ratio)
                cells.append(f'<td class="{cls}" title="{_e(tip)}">{_e(fmt_num(r.ratio))}</td>')
        body.append(f"<tr><td>{_e(op)}</td><td>{_e(subj)}</td><td>{_e(dt)}</td>{''.join(cells)}</tr>")
    return (f'<style>#worst-table td:nth-child(n+4){{text-align:right}}</style><div class="scroll">'
            f'<table id="worst-table" class="sortable"><thead><tr>{head}</tr></thead><tbody>'
            + "\n".join(body) + "</tbody></table></div>")


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
        fails = fails.assign(shape=_shapes(fails))
        out.append(_table(fails, FAILURE_COLUMNS, "failures-table", cls="fail-table"))
    else:
        out.append('<p class="note">No FAIL or ERROR rows.</p>')

    out.append('<h2 id="worst">Worst err/bound per variant and tensor</h2>')
    out.append('<p class="note">green &lt; %g, amber up to 1, red above 1 (fails), grey: no ratio. '
               "Hover a cell for the worst case.</p>" % AMBER_FROM)
    out.append(_pivot(s["worst_detail"]))

    out.append(f'<h2 id="results-h">All results ({len(df)} rows)</h2>')
    const = [c for c in df.columns if len(df) > 1 and c not in ALWAYS_SHOWN
             and df[c].nunique(dropna=False) <= 1]
    cols = [c for c in df.columns if c not in const]
    same = [c for c in const if c not in RUN_COLUMNS]  # run columns are in the header already
    if same:
        vals = {c: _num(df[c].iloc[0], "") if _is_num(c) else df[c].iloc[0] for c in same}
        parts = [f"{_e(c)}={_e(v)}" for c, v in vals.items() if v != ""]
        empty = [_e(c) for c, v in vals.items() if v == ""]
        if empty:
            parts.append("empty: " + " ".join(empty))
        out.append('<p class="note">Same in every row, so left out of the table: '
                   + ", ".join(parts) + "</p>")
    out.append(_filters(df))
    out.append('<p class="note">Click a column header to sort; click a message to expand it.</p>')
    out.append(_table(df, cols, "results"))

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
