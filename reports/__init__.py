"""Render long-form harness results: typed frames and summaries, plots, one self-contained HTML
page, a markdown summary for pull requests, a plain-text summary for the terminal, the
comparison of a candidate run with a baseline run, and the report of kernel timings."""
from .results import coerce_results, failures, read_results, summarize, verdict_counts, worst_ratio
from .plots import error_vs_T_figure, png_data_uri, ratio_vs_T_figure
from .html import render_html, write_html
from .markdown import render_markdown
from .terminal import render_terminal
from .compare import (BAD_STATUSES, KEY, compare_runs, render_compare_html, render_compare_markdown,
                      write_compare_html)
from .bench import (BENCH_COLUMNS, bench_figure, bench_table, coerce_bench, read_bench,
                    render_bench_html, render_bench_markdown, write_bench_html)

__all__ = [
    "read_results", "coerce_results", "summarize", "verdict_counts", "worst_ratio", "failures",
    "error_vs_T_figure", "ratio_vs_T_figure", "png_data_uri",
    "render_html", "write_html", "render_markdown", "render_terminal",
    "KEY", "BAD_STATUSES", "compare_runs", "render_compare_markdown", "render_compare_html",
    "write_compare_html",
    "BENCH_COLUMNS", "read_bench", "coerce_bench", "bench_table", "bench_figure",
    "render_bench_html", "write_bench_html", "render_bench_markdown",
]
