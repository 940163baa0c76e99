"""Tests of the kernel-timing report (reports.bench) on small hand-built bench frames."""
import base64
import csv
import math
import re

import numpy as np
import pandas as pd
import pytest

import reports
from reports.bench import (BENCH_COLUMNS, TABLE_COLUMNS, _xlim, bench_figure, bench_table,
                           coerce_bench, read_bench, render_bench_html, render_bench_markdown,
                           write_bench_html)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FLA_ERROR = "ERROR: NotImplementedError: <fused_chunk> | not for K > 64"


def m(op, impl, variant, phase, median=None, spread=0.05, message="", T=4096, dtype="bf16", **kw):
    """One bench row in the CSV's conventions: quartiles and throughput for timed phases, only
    the time for first calls, no numbers for a failed one."""
    timed = phase in ("fwd", "fwd+bwd") and median is not None
    r = dict(run_id="b1", op=op, impl=impl, variant=variant, dtype=dtype, B=2, T=T, H=4, K=64,
             V=64, M=0, phase=phase, median_ms=median,
             q25_ms=median - spread if timed else None, q75_ms=median + spread if timed else None,
             tflops=10.0 / median if timed else None, gbps=500.0 / median if timed else None,
             message=message, device="NVIDIA H100 80GB HBM3", torch="2.13.0", triton="3.6.0",
             git="abc123")
    r.update(kw)
    return r


def frame(rows):
    return pd.DataFrame(rows, columns=list(BENCH_COLUMNS))


@pytest.fixture(scope="module")
def bench_df():
    return frame([
        m("gla", "torch", "chunked reference", "fwd", 10.0),
        m("gla", "fla", "chunk", "fwd", 0.8),
        m("gla", "fla", "chunk", "fwd+bwd", 2.0),
        m("gla", "ours", "chunk", "fwd", 1.0),
        m("gla", "ours", "chunk", "fwd+bwd", 3.0),
        m("gla", "ours", "chunk", "first fwd", 12500.0),
        m("gla", "ours", "chunk", "first bwd", 30000.0),
        m("gla", "ours", "fused_recurrent", "fwd", 2.0),
        m("gla", "fla", "fused_recurrent", "fwd", 4.0),
        m("rwkv6", "ours", "chunk", "fwd", 1.5),
        m("rwkv6", "ours", "chunk", "fwd+bwd", 2.0),
        m("rwkv6", "fla", "chunk", "fwd", message=FLA_ERROR),
        m("rwkv6", "fla", "chunk", "fwd+bwd", 3.0),
        m("rwkv6", "fla", "fused_chunk", "fwd", message="SKIP: fla is not installed"),
    ])


@pytest.fixture(scope="module")
def table(bench_df):
    return bench_table(bench_df)


@pytest.fixture(scope="module")
def page(bench_df):
    return render_bench_html(bench_df, {"run_id": "b1", "note": "<b>x</b>"})


def cell(table, op, variant, impl, col):
    hit = table[(table["op"] == op) & (table["variant"] == variant) & (table["impl"] == impl)]
    assert len(hit) == 1, (op, variant, impl)
    return hit[col].iloc[0]


def test_columns_are_the_csv_contract():
    assert BENCH_COLUMNS == (
        "run_id", "op", "impl", "variant", "dtype", "B", "T", "H", "K", "V", "M", "phase",
        "median_ms", "q25_ms", "q75_ms", "tflops", "gbps", "message", "device", "torch",
        "triton", "git")
    assert reports.BENCH_COLUMNS is BENCH_COLUMNS and reports.bench_table is bench_table


def test_table_rows_and_order(table):
    assert list(table.columns) == list(TABLE_COLUMNS)
    keys = list(zip(table["op"], table["variant"], table["impl"]))
    assert keys == [("gla", "chunk", "ours"), ("gla", "chunk", "fla"),
                    ("gla", "fused_recurrent", "ours"), ("gla", "fused_recurrent", "fla"),
                    ("gla", "chunked reference", "torch"),
                    ("rwkv6", "chunk", "ours"), ("rwkv6", "chunk", "fla"),
                    ("rwkv6", "fused_chunk", "fla")]
    assert table["T"].dtype == "Int64" and table["T"].tolist() == [4096] * 8


def test_vs_fla_ratios(table):
    assert float(cell(table, "gla", "chunk", "ours", "fwd vs fla")) == pytest.approx(1.25)
    assert float(cell(table, "gla", "chunk", "ours", "fwd+bwd vs fla")) == pytest.approx(1.5)
    assert float(cell(table, "gla", "fused_recurrent", "ours", "fwd vs fla")) == pytest.approx(0.5)
    assert cell(table, "gla", "fused_recurrent", "ours", "fwd+bwd vs fla") == ""  # not measured
    assert (table.loc[table["impl"] != "ours", ["fwd vs fla", "fwd+bwd vs fla"]] == "").all().all()


def test_values_rounded_and_first_calls_in_seconds(table):
    assert cell(table, "gla", "chunk", "ours", "fwd ms") == "1.00"
    assert cell(table, "gla", "chunk", "fla", "fwd ms") == "0.800"
    assert cell(table, "gla", "chunk", "ours", "fwd q25-q75") == "0.950-1.05"
    assert cell(table, "gla", "chunk", "ours", "fwd TFLOP/s") == "10.0"
    assert cell(table, "gla", "chunk", "ours", "fwd+bwd GB/s") == "167"
    assert cell(table, "gla", "chunk", "ours", "first fwd s") == "12.5"
    assert cell(table, "gla", "chunk", "ours", "first bwd s") == "30.0"
    assert cell(table, "gla", "chunked reference", "torch", "fwd ms") == "10.0"
    assert cell(table, "gla", "chunk", "fla", "first fwd s") == ""


def test_failed_fla_row_shows_failed_and_keeps_other_ratios(table):
    assert cell(table, "rwkv6", "chunk", "fla", "fwd ms") == "failed"
    assert cell(table, "rwkv6", "chunk", "fla", "fwd TFLOP/s") == ""
    assert cell(table, "rwkv6", "chunk", "ours", "fwd ms") == "1.50"
    assert cell(table, "rwkv6", "chunk", "ours", "fwd vs fla") == ""
    assert float(cell(table, "rwkv6", "chunk", "ours", "fwd+bwd vs fla")) == pytest.approx(2 / 3, 1e-3)
    assert cell(table, "rwkv6", "fused_chunk", "fla", "fwd ms") == "skipped"


def test_ratio_only_between_same_dtype_and_shape():
    df = frame([m("gla", "ours", "chunk", "fwd", 1.0, T=1024), m("gla", "fla", "chunk", "fwd", 0.5),
                m("gla", "ours", "chunk", "fwd", 3.0, dtype="fp16"),
                m("gla", "fla", "chunk", "fwd", 2.0, dtype="fp16")])
    t = bench_table(df)
    assert list(zip(t["dtype"], t["T"], t["impl"])) == [
        ("bf16", 1024, "ours"), ("bf16", 4096, "fla"), ("fp16", 4096, "ours"), ("fp16", 4096, "fla")]
    assert t["fwd vs fla"].tolist() == ["", "", "1.50", ""]  # bf16 ours is at another T


def test_later_row_of_the_same_measurement_wins():
    df = frame([m("gla", "ours", "chunk", "fwd", 1.0), m("gla", "ours", "chunk", "fwd", 2.0)])
    assert bench_table(df)["fwd ms"].tolist() == ["2.00"]


def test_empty_frame():
    empty = frame([])
    assert bench_table(empty).empty and list(bench_table(empty).columns) == list(TABLE_COLUMNS)
    assert bench_figure(empty) is None
    assert render_bench_markdown(empty) == "No measurements.\n"
    assert render_bench_html(empty).startswith("<!DOCTYPE html>")


def test_figure_png_and_edge_cases(bench_df):
    png = bench_figure(bench_df)
    assert png.startswith(PNG_MAGIC)
    only_first = bench_df[bench_df["phase"].str.startswith("first")]
    assert bench_figure(only_first) is None
    all_failed = frame([m("gla", "fla", "chunk", "fwd", message=FLA_ERROR)])
    assert bench_figure(all_failed).startswith(PNG_MAGIC)
    raw = frame([m("gla", "ours", "chunk", "fwd", 1.0, spread=0.0)])
    raw.loc[0, "q25_ms"] = np.nan  # a whisker that is not there is left out
    assert bench_figure(raw).startswith(PNG_MAGIC)


def test_x_axis_turns_log_beyond_the_span():
    lo, hi, log = _xlim(np.array([0.1, 1.0, 10.0]))
    assert log and lo <= 0.1 and hi >= 10.0
    lo, hi, log = _xlim(np.array([1.0, 20.0, np.nan]))
    assert not log and lo == 0.0 and hi > 20.0
    assert _xlim(np.array([])) == (0.0, 1.0, False)


def test_html_self_contained(page):
    assert page.startswith("<!DOCTYPE html>") and page.count("<html") == 1
    assert "<title>kernel timings</title>" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"<(script|link|img)[^>]*\s(src|href)=[\"'](?!data:)", page, re.I)
    assert "@import" not in page and "url(" not in page and "://" not in page


def test_html_has_meta_figure_and_tables(page):
    imgs = re.findall(r'<img[^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(imgs) == 1 and base64.b64decode(imgs[0]).startswith(PNG_MAGIC)
    meta = page[:page.index("<img")]
    for text in ("NVIDIA H100 80GB HBM3", "2.13.0", "3.6.0", "abc123", "b1", "B2 T4096 H4 K64 V64"):
        assert text in meta
    order = [page.index(s) for s in ("<img", 'id="bench-table"', 'id="results"',
                                     'id="first-table"', 'id="failed-table"')]
    assert order == sorted(order)
    assert '<table id="results" class="sortable' in page and 'id="filter-text"' in page
    assert 'class="col-filter" data-col="phase"' in page and "function sortTable" in page
    summary = page[page.index('id="bench-table"'):page.index('id="results"')]
    assert '<td class="o-failed">failed</td>' in summary
    assert '<td class="r-near">1.25</td>' in summary and '<td class="r-ok">0.500</td>' in summary
    assert '<th data-col="M"' not in summary  # no slots: M left out


def test_html_lists_failures_escaped(page):
    failed = page[page.index('id="failed-table"'):]
    assert "NotImplementedError" in failed and "SKIP: fla is not installed" in failed
    assert "&lt;fused_chunk&gt;" in failed and "<fused_chunk>" not in page
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    rows = [r for r in re.findall(r"<tr>(.*?)</tr>", failed, re.S) if "<td" in r]
    assert len(rows) == 2


def test_html_first_calls_table(page):
    first = page[page.index('id="first-table"'):page.index('id="failed-table"')]
    rows = [r for r in re.findall(r"<tr>(.*?)</tr>", first, re.S) if "<td" in r]
    assert len(rows) == 1 and "<td>12.5</td>" in rows[0] and "<td>30.0</td>" in rows[0]


def test_write_bench_html(tmp_path, bench_df):
    path = write_bench_html(bench_df, tmp_path / "bench.html")
    assert path == str(tmp_path / "bench.html")
    assert open(path, encoding="utf-8").read().startswith("<!DOCTYPE html>")


def test_read_bench_round_trip(tmp_path, bench_df):
    rows = bench_df.to_dict("records")
    rows[0]["message"] = 'multi\nline, "quoted"'
    paths = [tmp_path / "a.csv", tmp_path / "b.csv"]
    for path, part in zip(paths, (rows[:5], rows[5:])):
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=BENCH_COLUMNS)
            writer.writeheader()
            writer.writerows({k: ("" if v is None or v != v else v) for k, v in r.items()}
                             for r in part)
    back = read_bench(paths)
    assert list(back.columns) == list(BENCH_COLUMNS) and len(back) == len(bench_df)
    for c in ("B", "T", "H", "K", "V", "M"):
        assert back[c].dtype == "Int64", c
    for c in ("median_ms", "q25_ms", "q75_ms", "tflops", "gbps"):
        assert back[c].dtype == "float64", c
    assert back.loc[0, "message"] == 'multi\nline, "quoted"' and back.loc[1, "message"] == ""
    assert back.loc[5, "phase"] == "first fwd" and math.isnan(back.loc[5, "q25_ms"])
    assert math.isnan(back.loc[11, "median_ms"]) and back.loc[11, "message"] == FLA_ERROR
    assert back["M"].tolist() == [0] * len(back)
    assert back.loc[3, "median_ms"] == 1.0 and back.loc[3, "T"] == 4096
    expected = coerce_bench(bench_df.assign(message=[r["message"] for r in rows]))
    pd.testing.assert_frame_equal(back, expected)
    assert len(read_bench(paths[0])) == 5


def test_coerce_fills_missing_columns_and_keeps_extras():
    df = coerce_bench(pd.DataFrame([{"op": "gla", "phase": "fwd", "median_ms": "1.5", "note": 3}]))
    assert list(df.columns) == [*BENCH_COLUMNS, "note"]
    assert df.loc[0, "median_ms"] == 1.5 and df.loc[0, "message"] == "" and pd.isna(df.loc[0, "T"])


def test_markdown_one_line_per_row(bench_df, table):
    md = render_bench_markdown(bench_df)
    lines = md.splitlines()
    table_lines = [ln for ln in lines if ln.startswith("|")]
    assert len(table_lines) == len(table) + 2
    assert table_lines[0].startswith("| op | dtype | B | T | H | K | V | variant | impl | fwd ms")
    assert "| M |" not in table_lines[0]
    assert "| gla | bf16 | 2 | 4096 | 4 | 64 | 64 | chunk | ours | 1.00 |" in md
    assert "| failed |" in md and "| skipped |" in md
    bullets = [ln for ln in lines if ln.startswith("- ")]
    assert len(bullets) == 2 and "NotImplementedError" in bullets[0]
    assert "&lt;fused_chunk&gt; \\| not for K" in bullets[0]  # escaped for a table-free line too


def test_slots_shown_only_where_an_op_has_them():
    df = frame([m("gla", "ours", "chunk", "fwd", 1.0), m("gsa", "ours", "chunk", "fwd", 2.0, M=64)])
    md = render_bench_markdown(df)
    assert "| V | M | variant |" in md
    assert "| 64 |  | chunk | ours | 1.00 |" in md and "| 64 | 64 | chunk | ours | 2.00 |" in md
    meta = render_bench_html(df).split("<h2", 1)[0]
    assert "B2 T4096 H4 K64 V64, B2 T4096 H4 K64 V64 M64" in meta and "M0" not in meta
