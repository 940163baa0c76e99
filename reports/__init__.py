"""Render long-form harness results: typed frames and summaries, plots, one self-contained HTML
page, a markdown summary for pull requests, and a plain-text summary for the terminal."""
from .results import coerce_results, failures, read_results, summarize, verdict_counts, worst_ratio
from .plots import error_vs_T_figure, png_data_uri, ratio_vs_T_figure
from .html import render_html, write_html
from .markdown import render_markdown
from .terminal import render_terminal

__all__ = [
    "read_results", "coerce_results", "summarize", "verdict_counts", "worst_ratio", "failures",
    "error_vs_T_figure", "ratio_vs_T_figure", "png_data_uri",
    "render_html", "write_html", "render_markdown", "render_terminal",
]
