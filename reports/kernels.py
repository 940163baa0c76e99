"""Reports of the per-kernel split (`python -m harness bench --kernels`): its CSV, a bar chart per
candidate, an HTML section for the bench page and a markdown table.

kernels.csv has one row per (candidate, kernel): ms and launches per forward+backward pass and
the kernel's share of the pass's kernel time (KERNEL_COLUMNS).
"""
from __future__ import annotations

import io
import os
from typing import Iterable, Union

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .html import _table
from .markdown import md_escape
from .plots import png_data_uri
from .schema import SHAPE

PathLike = Union[str, "os.PathLike[str]"]

CANDIDATE = ("op", "dtype", *SHAPE, "variant", "impl")
TOP = 10          # kernels drawn per candidate; the rest are summed into one bar
NAME_CHARS = 48   # kernel names are cut to this length in the figure and the markdown


def read_kernels(paths: Union[PathLike, Iterable[PathLike]]) -> pd.DataFrame:
    """kernels.csv file(s) as one frame with numeric ms, calls and share."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    df = pd.concat([pd.read_csv(p, keep_default_na=False) for p in paths], ignore_index=True)
    for col in ("calls", "ms", "share"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 1] + "…"


def _label(key: tuple) -> str:
    op, dtype, B, T, H, K, V, M, variant, impl = key
    slots = f" M{M}" if str(M) not in ("", "0") else ""
    return f"{op} {variant} · {impl} ({dtype} B{B} T{T} H{H} K{K} V{V}{slots})"


def _top(group: pd.DataFrame) -> pd.DataFrame:
    """The TOP longest kernels of one candidate, the rest summed as "other kernels"."""
    group = group.sort_values("ms", ascending=False)
    head, rest = group.head(TOP), group.iloc[TOP:]
    if rest.empty:
        return head
    other = {"kernel": f"{len(rest)} other kernels", "calls": rest["calls"].sum(),
             "ms": rest["ms"].sum(), "share": rest["share"].sum()}
    return pd.concat([head, pd.DataFrame([other])], ignore_index=True)


def kernels_figure(df: pd.DataFrame, dpi: int = 80) -> bytes | None:
    """PNG: a panel per candidate with a horizontal bar per kernel (ms per forward+backward pass,
    longest on top, share in the label); None without rows."""
    if df.empty:
        return None
    groups = list(df.groupby(list(CANDIDATE), sort=False))
    rows = [len(_top(g)) for _, g in groups]
    heights = [0.6 + 0.28 * n for n in rows]
    fig = Figure(figsize=(9.0, sum(heights) + 0.5 * len(groups)), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(groups), 1, squeeze=False, gridspec_kw={"height_ratios": heights}).ravel()
    for ax, (key, g) in zip(axes, groups):
        top = _top(g)
        y = range(len(top))[::-1]
        ax.barh(list(y), top["ms"], color="#1f77b4")
        ax.set_yticks(list(y), [f"{_short(k)} ({s:.0%})" for k, s in zip(top["kernel"], top["share"])],
                    fontsize=7)
        ax.set_xlim(0, max(top["ms"].max(), 1e-6) * 1.05)
        ax.set_xlabel("ms per forward+backward pass", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(_label(key), fontsize=9, loc="left")
    fig.subplots_adjust(left=0.45, right=0.97, top=1 - 0.3 / fig.get_figheight(),
                        bottom=0.5 / fig.get_figheight(), hspace=0.9 if len(groups) > 1 else 0.2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def kernels_section(df: pd.DataFrame | None) -> list:
    """HTML for the bench page: the figure and the table, or a note why there is none."""
    out = ['<h2 id="kernels">Time per kernel (forward+backward pass)</h2>']
    if df is None or df.empty:
        return out + ['<p class="note">No per-kernel times: run with --kernels on a GPU.</p>']
    png = kernels_figure(df)
    out.append(f'<img alt="time per kernel" src="{png_data_uri(png)}">')
    shown = df.assign(ms=df["ms"].map(lambda v: f"{v:.4g}"), share=df["share"].map("{:.1%}".format),
                      calls=df["calls"].map(lambda v: f"{v:g}"))
    cols = ["op", "variant", "impl", "dtype", "kernel", "calls", "ms", "share"]
    return out + [_table(shown, cols, "kernels-table", is_num=lambda c: c in ("calls", "ms", "share"),
                         context="kernel")]


def render_kernels_markdown(df: pd.DataFrame, top: int = 8) -> str:
    """Per candidate, its `top` longest kernels: ms and launches per pass, share."""
    if df.empty:
        return ""
    lines = []
    for key, g in df.groupby(list(CANDIDATE), sort=False):
        lines += ["", f"**{md_escape(_label(key))}**, time per kernel:", "",
                  "| kernel | calls | ms | share |", "|---|---:|---:|---:|"]
        for r in g.sort_values("ms", ascending=False).head(top).itertuples(index=False):
            lines.append(f"| {md_escape(_short(r.kernel))} | {r.calls:g} | {r.ms:.4g} | {r.share:.1%} |")
    return "\n".join(lines) + "\n"


def kernels_nav() -> str:
    """The bench page's link to the section."""
    return ' · <a href="#kernels">Per kernel</a>'

