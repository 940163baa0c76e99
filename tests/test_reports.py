"""Tests of the reports package on small synthetic result frames (no kernels, no GPU)."""
import base64
import math
import re

import numpy as np
import pandas as pd
import pytest

from reports.schema import COLUMNS
from reports import (error_vs_T_figure, failures, ratio_vs_T_figure, read_results, render_html,
                     render_markdown, render_terminal, summarize, write_html)
from reports import plots as plots_mod
from reports.__main__ import main as reports_main
from reports.results import coerce_results, worst_ratio

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVIL = "bad shape <script>alert('x')</script> & more"


def row(**kw):
    """One golden PASS row of gla/chunk fp32, T=64 in the harness's conventions, overridden by
    `kw`; ratio from err/bound unless given."""
    r = dict(run_id="r1", case_id="gla-001", op="gla", variant="chunk", impl="ours",
             dtype="fp32", B=2, T=64, H=2, K=32, V=16, M=np.nan, h0="True", gate="normal",
             seed=7, check="golden", tensor="o", err=1e-6, rel=1e-6, rms_rel=5e-7, base_err=1e-6,
             floor=1e-7, atol=1e-6, bound=4e-6, nan=0, inf=0, first_bad="", verdict="PASS",
             message="", device="cpu", torch="2.11.0", triton="3.6.0", git="abc123", wall_s=0.5)
    r.update(kw)
    if "ratio" not in kw:
        r["ratio"] = r["err"] / r["bound"] if r["verdict"] in ("PASS", "FAIL") else np.nan
    return r


def frame(rows):
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def run_row(verdict, message, **kw):
    return row(verdict=verdict, message=message, check="run", tensor="", err=np.nan,
               rel=np.nan, rms_rel=np.nan, base_err=np.nan, floor=np.nan, bound=np.nan,
               nan=np.nan, inf=np.nan, **kw)


@pytest.fixture(scope="module")
def pass_df():
    rows = []
    for T in (16, 64, 256):
        for dt, eps in (("fp32", 1e-7), ("bf16", 1e-2)):
            for t in ("o", "ht", "dq", "dk"):
                rows.append(row(case_id=f"gla-{dt}-{T}", T=T, dtype=dt, tensor=t,
                                err=eps * T ** 0.5, rel=eps * T ** 0.5 / 3, bound=4 * eps * T ** 0.5))
    rows.append(row(check="agreement", variant="chunk~fused_recurrent", impl="ours~ours", tensor="o",
                    err=1e-7, bound=1e-6))
    return frame(rows)


@pytest.fixture(scope="module")
def mixed_df():
    rows = [
        row(case_id="gla-pass", tensor="o"),
        row(case_id="gla-pass", tensor="dk", T=256, err=3e-6),
        row(case_id="rwkv6-fail-dk", op="rwkv6", variant="chunk", tensor="dk", T=256, err=5e-5,
            bound=1e-5, verdict="FAIL", message="err 5e-05 > bound 1e-05"),
        row(case_id="rwkv6-fail-dw", op="rwkv6", variant="chunk", tensor="dw", T=64, err=2e-5,
            bound=1e-5, verdict="FAIL"),
        row(case_id="gla-nan", variant="fused_chunk", dtype="bf16", tensor="o", T=1024,
            err=math.inf, rel=math.inf, rms_rel=math.inf, nan=12, first_bad="(0, 17, 2)",
            verdict="FAIL", message="12 NaN and 0 Inf where the golden is finite; first at (0, 17, 2)"),
        row(case_id="gla-shape", variant="fused_recurrent", tensor="ht", err=np.nan, bound=np.nan,
            verdict="FAIL", message="shape (2, 3) differs from the golden's (2, 4)"),
        row(case_id="gla-agree", check="agreement", variant="chunk~fused_recurrent",
            impl="ours~ours", tensor="ht", err=1e-6, bound=1e-5),
        row(case_id="gla-ext", impl="fla.ops.gla:chunk_gla", tensor="dq", err=2e-6),
        run_row("ERROR", EVIL, case_id="rwkv6-error", op="rwkv6", variant="fused_recurrent", T=16),
        run_row("SKIP", "needs CUDA", case_id="gsa-skip", op="gsa", M=8),
    ]
    return frame(rows)


@pytest.fixture(scope="module")
def mixed_html(mixed_df):
    return render_html(mixed_df, {"run_id": "r1", "wall time": "12.5 s", "note": "<b>x</b>"})


# -- results -------------------------------------------------------------------------------

def test_read_results_round_trip(tmp_path, mixed_df):
    df = mixed_df.copy()
    df.loc[0, "case_id"] = "007"  # numeric-looking ids stay strings
    df.loc[1, "err"] = math.inf
    df.loc[0, "message"] = 'multi\nline, "quoted"'
    p1, p2 = tmp_path / "a.csv", tmp_path / "b.csv"
    df.iloc[:4].to_csv(p1, index=False, columns=COLUMNS)
    df.iloc[4:].to_csv(p2, index=False, columns=COLUMNS)
    back = read_results([p1, str(p2)])
    assert list(back.columns) == COLUMNS and len(back) == len(df)
    for c in ("B", "T", "H", "K", "V", "M", "seed", "nan", "inf"):
        assert pd.api.types.is_integer_dtype(back[c]), c
    for c in ("err", "rel", "bound", "ratio", "wall_s"):
        assert back[c].dtype == "float64", c
    assert back.loc[0, "case_id"] == "007" and back.loc[0, "message"] == 'multi\nline, "quoted"'
    assert back.loc[1, "err"] == math.inf
    assert back["M"].isna().sum() == len(df) - 1 and back.loc[9, "M"] == 8
    assert back.loc[8, "message"] == EVIL and back.loc[8, "tensor"] == ""
    assert math.isnan(back.loc[8, "ratio"]) and math.isnan(back.loc[5, "err"])
    assert back.loc[4, "ratio"] == math.inf and back.loc[4, "nan"] == 12
    assert back.loc[4, "first_bad"] == "(0, 17, 2)" and pd.isna(back.loc[8, "nan"])
    assert back.loc[2, "T"] == 256 and back.loc[2, "ratio"] == pytest.approx(5.0)
    assert read_results(p1)["T"].tolist() == [64, 256, 256, 64]


def test_read_results_drops_truncated_line(tmp_path, mixed_df):
    p = tmp_path / "cut.csv"
    mixed_df.to_csv(p, index=False)
    text = p.read_text()
    p.write_text(text + "r1,gla-cut,gla,chunk\n")  # an interrupted write
    with pytest.warns(UserWarning, match="without a verdict"):
        back = read_results(p)
    assert len(back) == len(mixed_df) and "gla-cut" not in set(back["case_id"])


def test_summarize_counts_and_failures(mixed_df):
    s = summarize(mixed_df)
    assert s["counts"] == {"PASS": 4, "FAIL": 4, "ERROR": 1, "SKIP": 1}
    assert s["total"] == 10 and s["overall"] == "FAIL"
    f = s["failures"]
    # FAIL first, ratio descending (inf, and NaN on a FAIL row, count as worst), then ERROR
    assert f["case_id"].tolist() == ["gla-nan", "gla-shape", "rwkv6-fail-dk", "rwkv6-fail-dw",
                                     "rwkv6-error"]
    wt = s["worst_op_tensor"].set_index(["op", "tensor"])
    assert wt.loc[("rwkv6", "dk"), "ratio"] == pytest.approx(5.0)
    assert wt.loc[("gla", "o"), "case_id"] == "gla-nan" and wt.loc[("gla", "o"), "fails"] == 1
    assert wt.loc[("gla", "dk"), "ratio"] == pytest.approx(0.75)
    assert "" not in wt.index.get_level_values("tensor")  # run rows have no tensor
    wv = s["worst_variant"].set_index(["op", "subject", "dtype"])
    assert wv.loc[("gla", "chunk~fused_recurrent", "fp32"), "ratio"] == pytest.approx(0.1)
    assert wv.loc[("rwkv6", "chunk", "fp32"), "ratio"] == pytest.approx(5.0)
    assert wv.loc[("gla", "chunk (fla.ops.gla:chunk_gla)", "fp32"), "ratio"] == pytest.approx(0.5)
    assert wv.loc[("gla", "fused_recurrent", "fp32"), "verdict"] == "FAIL"  # NaN-ratio FAIL kept
    assert summarize(mixed_df[mixed_df["verdict"] == "PASS"])["overall"] == "PASS"
    assert summarize(frame([]))["overall"] == "EMPTY"


def test_worst_ratio_nan_groups_and_raw_input(mixed_df):
    raw = mixed_df.astype(object)  # e.g. built from row dicts: untyped
    w = worst_ratio(raw, ["op"]).set_index("op")
    assert w.loc["rwkv6", "ratio"] == pytest.approx(5.0) and w.loc["rwkv6", "fails"] == 2
    assert w.loc["gla", "ratio"] == math.inf and w.loc["gla", "case_id"] == "gla-nan"
    assert w.loc["gla", "rows"] == 6 and w.loc["gla", "fails"] == 2
    assert "gsa" not in w.index  # only a SKIP row
    assert failures(raw)["verdict"].tolist() == ["FAIL"] * 4 + ["ERROR"]


# -- plots ---------------------------------------------------------------------------------

def _is_png(b):
    return isinstance(b, bytes) and b.startswith(PNG_MAGIC) and len(b) > 1000


def test_plots_normal_and_edge_cases(pass_df, mixed_df):
    assert _is_png(error_vs_T_figure(pass_df)) and _is_png(ratio_vs_T_figure(pass_df))
    single = frame([row(tensor="o"), row(tensor="dk", dtype="bf16")])
    assert _is_png(error_vs_T_figure(single)) and _is_png(ratio_vs_T_figure(single))
    zeros = frame([row(T=T, tensor=t, err=0.0, rel=0.0) for T in (16, 32) for t in ("o", "ht")])
    assert _is_png(error_vs_T_figure(zeros)) and _is_png(ratio_vs_T_figure(zeros))
    nan_only = frame([row(err=np.nan, rel=np.nan, ratio=np.nan, nan=3, verdict="FAIL")])
    assert _is_png(error_vs_T_figure(nan_only)) and _is_png(ratio_vs_T_figure(nan_only))
    assert _is_png(error_vs_T_figure(mixed_df))
    errors = frame([run_row("ERROR", "boom"), run_row("SKIP", "no")])
    assert error_vs_T_figure(errors) is None and ratio_vs_T_figure(errors) is None
    assert error_vs_T_figure(frame([])) is None


# -- html ----------------------------------------------------------------------------------

def test_html_self_contained(mixed_html):
    h = mixed_html
    assert h.startswith("<!DOCTYPE html>") and h.count("<html") == 1
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", h, re.I)
    assert not re.search(r"<(script|link|img)[^>]*\s(src|href)=[\"'](?!data:)", h, re.I)
    assert "@import" not in h and "url(" not in h


def test_html_escapes_text(mixed_html):
    h = mixed_html
    assert h.count("<script") == 1  # only the page's own inline script
    assert "<script>alert" not in h and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in h
    assert "<b>x</b>" not in h and "&lt;b&gt;x&lt;/b&gt;" in h  # meta is escaped too


def test_html_failures_before_full_table(mixed_html):
    h = mixed_html
    fail_at, full_at = h.index('id="failures-table"'), h.index('id="results"')
    assert fail_at < full_at
    fail_section = h[fail_at:h.index('id="worst-table"')]
    assert h.index('id="worst-table"') < full_at
    for cid in ("gla-nan", "gla-shape", "rwkv6-fail-dk", "rwkv6-fail-dw", "rwkv6-error"):
        assert cid in fail_section
    assert "gla-pass" not in fail_section and "gsa-skip" not in fail_section
    assert fail_section.index("rwkv6-fail-dk") < fail_section.index("rwkv6-error")
    assert "&lt;script&gt;" in fail_section  # the ERROR message is shown, escaped
    assert "wall time" in h[:fail_at] and "12.5 s" in h[:fail_at] and "abc123" in h[:fail_at]


def test_html_table_hooks_and_colours(mixed_html):
    h = mixed_html
    assert 'id="filter-text"' in h and 'class="col-filter" data-col="verdict"' in h
    assert "function sortTable" in h and "addEventListener('click'" in h and "function applyFilter" in h
    assert re.search(r'<table id="results" class="sortable', h)
    assert '<th data-col="ratio" data-num' in h
    results = h[h.index('id="results"'):]
    rows = [r for r in re.findall(r"<tr>(.*?)</tr>", results, re.S) if "<td" in r]
    assert len(rows) == 10
    by_case = {}
    for r in rows:
        by_case.setdefault(re.search(r"<td>([^<]*)</td>", r).group(1), []).append(r)
    by_case = {k: "".join(v) for k, v in by_case.items()}
    assert '<td class="r-bad">5</td>' in by_case["rwkv6-fail-dk"]
    assert '<td class="r-ok">0.25</td>' in by_case["gla-pass"]
    assert '<td class="r-near">0.75</td>' in by_case["gla-pass"]
    assert '<td class="r-na"></td>' in by_case["rwkv6-error"]
    assert '<td class="v-ERROR">ERROR</td>' in by_case["rwkv6-error"]
    assert '<td class="r-bad">inf</td>' in by_case["gla-nan"]
    assert '<td class="r-bad"></td>' in by_case["gla-shape"]  # no ratio to show, still red
    assert not re.search(r"<td[^>]*>nan</td>", results)  # NaN: a number the row does not have


def test_a_long_run_keeps_every_row_but_the_pass_rows_farthest_from_their_bounds(mixed_df, monkeypatch):
    monkeypatch.setattr("reports.html.ALL_ROWS_SHOWN", 8)   # 6 rows that are not PASS, 4 PASS
    page = render_html(mixed_df, plots=False)
    table = page[page.index('id="results"'):]
    table = table[:table.index("</table>")]
    shown = set(re.findall(r"(gla-[a-z]+|rwkv6-[a-z-]+|gsa-skip)", table))
    assert {"rwkv6-fail-dk", "rwkv6-fail-dw", "gla-nan", "gla-shape", "rwkv6-error", "gsa-skip"} <= shown
    assert "gla-ext" in shown and "gla-agree" not in shown   # err/bound 0.5 kept, 0.1 left out
    assert table.count("<tr>") == 1 + 8
    assert "2 PASS rows farthest from their bounds are left out of this table" in page


def test_html_embeds_plots(mixed_html):
    imgs = re.findall(r'<img[^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', mixed_html)
    assert len(imgs) == 2 and all(base64.b64decode(b).startswith(PNG_MAGIC) for b in imgs)
    assert mixed_html.rindex("<img") > mixed_html.index('id="results"')


def test_html_pass_only_error_only_and_write(tmp_path, pass_df):
    h = render_html(pass_df, {})
    assert 'class="headline PASS"' in h and "No FAIL or ERROR rows" in h and h.count("<img") == 2
    only_err = render_html(frame([run_row("ERROR", "x < y"), run_row("SKIP", "s")]), None)
    assert "x &lt; y" in only_err and "<img" not in only_err and "No golden" in only_err
    assert 'class="headline FAIL"' in only_err
    p = write_html(frame([row()]), tmp_path / "r.html", {"run_id": "w"})
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert str(p).endswith("r.html") and "run w" in text and text.rstrip().endswith("</html>")


# -- markdown and terminal ----------------------------------------------------------------

def test_markdown_fail(mixed_df):
    md = render_markdown(mixed_df, {"run_id": "r1"})
    head = md.splitlines()[0]
    assert "FAIL" in head and "4 FAIL" in head and "1 ERROR" in head and "4 PASS" in head
    for cid in ("gla-nan", "gla-shape", "rwkv6-fail-dk", "rwkv6-fail-dw", "rwkv6-error"):
        assert f"`{cid}`" in md
    assert "gla-pass" not in md.split("**Failures**")[1]
    assert "<script>" not in md and "&lt;script&gt;" in md
    assert "12 NaN and 0 Inf where the golden is finite; first at (0, 17, 2)" in md
    assert "shape (2, 3) differs" in md and "err 5e-05 &gt; bound 1e-05" in md
    assert "| rwkv6 | chunk | fp32 |" in md and "**5** ❌" in md  # worst-ratio table
    assert "**inf** ❌" in md and "**nan** ❌" in md
    assert "Skipped 1: needs CUDA" in md


def test_markdown_pass_and_truncation(pass_df):
    md = render_markdown(pass_df)
    assert md.splitlines()[0].startswith("### ✅ PASS") and "Failures" not in md
    many = frame([row(case_id=f"c{i:02d}", err=1e-5 * (i + 1), verdict="FAIL") for i in range(25)])
    md = render_markdown(many)
    assert "`c24`" in md and "`c05`" in md and "`c04`" not in md and "and 5 more" in md


def test_terminal(mixed_df, pass_df):
    t = render_terminal(mixed_df)
    lines = t.splitlines()
    assert lines[0].startswith("kernel correctness: FAIL") and "FAIL 4" in lines[0]
    fail_lines = [l for l in lines if l.startswith("  FAIL") or l.startswith("  ERROR")]
    assert len(fail_lines) == 5 and all(len(l) <= 160 for l in lines)
    assert "FAIL  rwkv6/chunk fp32 T=256 dk [rwkv6-fail-dk]: err/bound=5: err 5e-05 > bound" in t
    assert "[rwkv6-fail-dw]: err/bound=2 (err=2e-05 bound=1e-05)" in t
    assert "gla/fused_chunk bf16 T=1024 o [gla-nan]: err/bound=inf: 12 NaN" in t
    assert "[rwkv6-error]: bad shape <script>" in t  # plain text: no escaping needed
    worst = [l.split() for l in lines if l.startswith("  ") and not l.startswith("  FAIL")
             and not l.startswith("  ERROR")]
    assert [w[:2] for w in worst[:3]] == [["o", "inf"], ["ht", "FAIL"], ["dk", "5"]]
    ok = render_terminal(pass_df)
    assert ok.startswith("kernel correctness: PASS") and "failures" not in ok
    assert len(render_terminal(frame([row(case_id=f"c{i}", verdict="FAIL", err=1)
                                      for i in range(15)]), max_failures=10).splitlines()) < 20


def test_cli_exit_status(tmp_path, mixed_df, pass_df, capsys):
    bad, good = tmp_path / "bad.csv", tmp_path / "good.csv"
    mixed_df.to_csv(bad, index=False)
    pass_df.to_csv(good, index=False)
    md = tmp_path / "s.md"
    assert reports_main([str(bad), "--markdown", str(md)]) == 1
    assert "FAIL" in md.read_text().splitlines()[0]
    assert reports_main([str(good)]) == 0
    assert "kernel correctness: PASS" in capsys.readouterr().out


def test_coerce_keeps_extra_columns():
    df = frame([row()]).assign(extra="x")
    out = coerce_results(df.drop(columns=["wall_s"]))
    assert list(out.columns) == COLUMNS + ["extra"] and out["wall_s"].isna().all()


def test_plot_skips_undefined_rel_without_marking_nan():
    # golden all zero: rel is inf while err is finite; drawn nowhere, but not a NaN result
    df = frame([row(T=T, tensor="dw", err=1e-6, rel=math.inf) for T in (1, 8)]
               + [row(T=8, tensor="o")])
    assert _is_png(error_vs_T_figure(df))
    prepared = plots_mod._prepare(df, ("golden",), "rel", bad_col="err")
    assert not prepared["bad"].any() and prepared["finite"].tolist() == [False, False, True]
    h = render_html(df, {}, plots=False)
    assert "<img" not in h and "Plots left out" in h


# -- a page that fits 1400 px ---------------------------------------------------------------

NO_BOUND_TERMS = dict(rms_rel=np.nan, base_err=np.nan, floor=np.nan, atol=np.nan)
NO_NUMBERS = dict(err=np.nan, rel=np.nan, bound=np.nan, nan=np.nan, inf=np.nan, **NO_BOUND_TERMS)


@pytest.fixture(scope="module")
def checks_df():
    """rwkv6 with every kind of row (golden and agreement at two T, sums, options, inputs, the
    layer at one T) beside a gla run with a tensor rwkv6 lacks."""
    rows = []
    for T in (1, 65):
        case = dict(case_id=f"rwkv6-fp32-T{T}", op="rwkv6", T=T)
        rows += [row(**case, tensor=t, rel=1e-7 * T, rms_rel=5e-8 * T) for t in ("o", "ht", "dw")]
        rows.append(row(**case, check="agreement", variant="chunk~fused_recurrent",
                        impl="ours~ours", tensor="o", err=1e-7, bound=1e-6, **NO_BOUND_TERMS))
        rows.append(row(**case, check="inputs", tensor="", ratio=np.nan, **NO_NUMBERS))
    case = dict(case_id="rwkv6-fp32-T65", op="rwkv6", T=65)
    rows += [row(**case, check="aggregate", tensor="dw (sum over t)", err=2e-5, bound=1e-5,
                 verdict="FAIL", first_bad="(b=0, h=1)", message="the sum over t: err > bound"),
             row(**case, check="agreement", variant="chunk~fused_recurrent", impl="ours~ours",
                 tensor="dw", err=3e-5, bound=1e-5, verdict="FAIL", **NO_BOUND_TERMS),
             row(**case, check="options", tensor="dw (no final state)"),
             row(**case, check="layer", tensor="dbonus"),
             row(**case, check="layer", tensor="cache", ratio=np.nan, **NO_NUMBERS),
             row(case_id="gla-fp32-T64", tensor="dg")]
    return frame(rows)


def _tables(page: str) -> dict:
    """{table id: (header texts, rows of cell html)} of a page."""
    out = {}
    for tid, body in re.findall(r'<table id="([^"]+)"[^>]*>(.*?)</table>', page, re.S):
        heads = [_text(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", body)]
        rows = [re.findall(r"<td[^>]*>.*?</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", body)]
        out[tid] = heads, [r for r in rows if r]
    return out


def test_worst_tables_hold_only_the_tensors_each_op_and_layer_has(checks_df):
    page = render_html(checks_df, plots=False)
    names = re.findall(r"<h3>([^<]*)</h3>", page)
    assert names == ["gla", "rwkv6", "rwkv6 layer"]
    tables = _tables(page)
    gla, rwkv6, layer = (tables[t] for t in ("worst-table", "worst-table-1", "worst-table-2"))
    assert gla[0] == ["variant", "dtype", "dg"]
    assert rwkv6[0] == ["variant", "dtype", "o", "ht", "dw", "inputs"]
    assert layer[0] == ["variant", "dtype", "dbonus", "cache"]
    by_row = {_text(r[0]): r for r in rwkv6[1]}
    assert set(by_row) == {"chunk", "chunk [aggregate]", "chunk [options]", "chunk~fused_recurrent"}
    assert ">PASS</td>" in by_row["chunk"][-1]  # the inputs check, on the variant's own row
    sums = by_row["chunk [aggregate]"]
    assert sums[4].startswith('<td class="r-bad"') and _text(sums[4]) == "2"
    assert sums[2] == "<td></td>"  # sums of o do not exist
    assert ">PASS</td>" in layer[1][0][-1]
    assert "nan" not in page.split('id="worst"')[1].split("<h2")[0]


def _text(cell: str) -> str:
    return re.sub(r"<[^>]+>", "", cell)


def test_cells_without_a_number_are_empty_and_a_nan_result_reads_nan(checks_df):
    nan_result = row(case_id="gla-nan", tensor="o", err=np.nan, rel=np.nan, ratio=np.nan, nan=3,
                     verdict="FAIL", message="3 NaN")
    page = render_html(pd.concat([checks_df, frame([nan_result])]), plots=False)
    tables = _tables(page)
    for tid in ("failures-table", "results"):
        heads, rows = tables[tid]
        key = [heads.index(c) for c in ("case_id", "tensor", "check")]
        cells = {tuple(_text(r[i]) for i in key): r for r in rows}
        agreement = cells[("rwkv6-fp32-T65", "dw", "agreement")]
        for c in ("rms_rel", "base_err", "floor"):
            if c in heads:
                assert agreement[heads.index(c)] == "<td></td>", (tid, c)
        assert cells[("gla-nan", "o", "golden")][heads.index("err")] == "<td>nan</td>"
        if tid == "results":
            assert cells[("rwkv6-fp32-T1", "", "inputs")][heads.index("err")] == "<td></td>"
        nan_cells = [c for r in rows for c in r if re.fullmatch(r"<td[^>]*>nan</td>", c)]
        assert len(nan_cells) == (3 if tid == "results" else 2)  # err, rel, ratio; err, ratio


def test_full_table_leaves_out_what_every_row_shares_and_hides_the_bound_terms(checks_df):
    page = render_html(checks_df.assign(impl=checks_df["impl"].replace("ours", "mypkg:chunk")),
                       plots=False)
    heads, _ = _tables(page)["results"]
    assert "atol" not in heads and "impl" not in heads  # atol: 1e-06 wherever a row has one
    note = page[page.index('id="results-h"'):page.index('id="filter-text"')]
    assert "atol=1e-06" in note and "impl: chunk = mypkg:chunk" in note
    assert 'data-col="impl"' not in page  # nor a filter on a column the table lacks
    assert 'class="more-cols" data-table="results"' in page
    assert re.search(r'<table id="results" class="sortable less">', page)
    assert "#results.less td:nth-child(%d)" % (heads.index("rms_rel") + 1) in page


def test_tensors_measured_at_one_T_share_a_strip_chart_not_one_dot_panels(checks_df):
    prepared = plots_mod._prepare(checks_df, None, "ratio", bad_col="ratio")
    assert "cache" not in set(prepared["tensor"])  # a verdict without a ratio: nothing to draw
    lines, strips = plots_mod._layout(plots_mod._reduce(prepared, "ratio"))
    assert lines == [("rwkv6", "o"), ("rwkv6", "ht"), ("rwkv6", "dw")]
    assert strips == {"gla": ["dg"], "rwkv6 layer": ["dbonus"]}
    assert _is_png(ratio_vs_T_figure(checks_df)) and _is_png(error_vs_T_figure(checks_df))


def test_T_labels_keep_apart():
    Ts = [1, 63, 64, 65, 1000, 4096, 43884]
    gap = 0.16 * math.log10(Ts[-1])
    labelled = plots_mod._T_ticks(Ts, gap)
    assert labelled[0] == 1 and labelled[-1] == 43884 and 64 not in labelled
    assert all(math.log10(b / a) >= gap for a, b in zip(labelled, labelled[1:]))
