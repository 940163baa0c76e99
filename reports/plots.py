"""Plots of error and err/bound against T, one panel per (op, tensor), returned as PNG bytes.

Uses matplotlib's object API on the Agg canvas (no pyplot, no global state), so it is safe to
call from any thread and never opens a window.
"""
from __future__ import annotations

import base64
import io
import math

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

from .results import coerce_results, subject, tensor_sort_key

DTYPE_MARKERS = {"fp32": "o", "float32": "o", "bf16": "s", "bfloat16": "s",
                 "fp16": "^", "float16": "^", "fp64": "D", "float64": "D"}
_KNOWN = ("chunk", "fused_chunk", "fused_recurrent")


def png_data_uri(png: bytes) -> str:
    """`data:image/png;base64,...` for an <img src>."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _prepare(df: pd.DataFrame, checks: tuple | None, value: str, bad_col: str) -> pd.DataFrame:
    """Rows of `checks` (None: every check but "run") with a tensor and a positive T, with a
    subject (what the line is), `finite` (the value can be drawn) and `bad` (the result had a
    NaN/Inf, or `bad_col` is not finite)."""
    df = coerce_results(df)
    mask = df["check"] != "run" if checks is None else df["check"].isin(checks)
    df = df[mask & (df["tensor"] != "")]
    df = df[df["T"].astype("float64") > 0]
    if df.empty:
        return df
    df = df.assign(subject=subject(df), Tf=df["T"].astype("float64"))
    bad_counts = (df["nan"].fillna(0).astype("int64") > 0) | (df["inf"].fillna(0).astype("int64") > 0)
    df["bad"] = bad_counts | ~np.isfinite(df[bad_col])
    df["finite"] = np.isfinite(df[value]) & ~df["bad"]
    return df


def _reduce(df: pd.DataFrame, value: str, extra: tuple = ()) -> pd.DataFrame:
    """Per (op, tensor, subject, dtype, T): the row with the largest finite `value`, plus `any_bad`
    (some row was `bad` there)."""
    keys = ["op", "tensor", "subject", "dtype", "Tf"]
    fin = df[df["finite"]]
    best = fin.loc[fin.groupby(keys, sort=False)[value].idxmax()] if not fin.empty else fin
    best = best[keys + [value, *extra]]
    bad = df.groupby(keys, sort=False)["bad"].any()
    bad = bad.rename("any_bad").reset_index()
    return bad.merge(best, on=keys, how="left")


def _palette(df: pd.DataFrame) -> dict:
    """{(subject, dtype): colour}, from the whole frame so that both figures agree: one tab20 pair
    per subject (known variants first), the dark shade for fp32/fp64, the light one otherwise."""
    df = df[df["check"] != "run"]
    subs = sorted(set(subject(df)), key=lambda s: (_KNOWN.index(s) if s in _KNOWN else len(_KNOWN), s))
    cmap = matplotlib.colormaps["tab20"]
    out = {}
    for i, s in enumerate(subs):
        for d in set(df["dtype"]):
            light = d not in ("fp32", "float32", "fp64", "float64")
            out[(s, d)] = cmap((2 * i + light) % 20)
    return out


def _ylim(vals: np.ndarray, floor: float, include: tuple = ()) -> tuple:
    """Log-axis limits covering the data, `include`, and at least one decade."""
    v = np.concatenate([vals[np.isfinite(vals)].clip(min=floor), np.asarray(include, float)])
    if v.size == 0:
        return floor, 1.0
    lo, hi = v.min() / 1.6, v.max() * 1.6
    if hi / lo < 10:
        mid = math.sqrt(lo * hi)
        lo, hi = mid / 3.2, mid * 3.2
    return lo, hi


def _render(df: pd.DataFrame, colors: dict, value: str, title: str, ylabel: str, dpi: int,
            bad_label: str, bound_col: str | None = None, hline: float | None = None) -> bytes:
    panels = sorted({(o, t) for o, t in zip(df["op"], df["tensor"])},
                    key=lambda p: (p[0], tensor_sort_key(p[1])))
    keys = sorted({(s, d) for s, d in zip(df["subject"], df["dtype"])},
                  key=lambda k: (list(colors).index(k) if k in colors else 1 << 30, k))
    color = {k: colors.get(k, "#333") for k in keys}
    marker = {k: DTYPE_MARKERS.get(k[1], "v") for k in keys}
    label = {k: f"{k[0]} {k[1]}" for k in keys}

    vals = df[value].to_numpy(dtype="float64")
    if bound_col:
        vals = np.concatenate([vals, df[bound_col].to_numpy(dtype="float64")])
    pos = vals[np.isfinite(vals) & (vals > 0)]
    floor = 10 ** math.floor(math.log10(pos.min()) - 1) if pos.size else 1e-16
    if hline is not None:
        floor = min(floor, hline / 100)
    has_zero = bool((df[value] <= 0).any())

    ncols = min(len(panels), 4)
    nrows = math.ceil(len(panels) / ncols)
    n_handles = len(keys) + (bound_col is not None) + (hline is not None) + bool(df["any_bad"].any())
    legend_in = 0.45 + 0.2 * math.ceil(n_handles / 5)
    width, height = 3.8 * ncols, 2.7 * nrows + 0.45 + legend_in
    fig = Figure(figsize=(width, height), dpi=dpi)  # fixed margins: a layout engine is slow
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    fig.subplots_adjust(left=0.7 / width, right=1 - 0.15 / width, top=1 - 0.55 / height,
                        bottom=legend_in / height, wspace=0.38, hspace=0.55)
    for ax, (op, tensor) in zip(axes, panels):
        sub = df[(df["op"] == op) & (df["tensor"] == tensor)]
        panel_vals = [sub[value].to_numpy(dtype="float64")]
        for k, g in sub.groupby(["subject", "dtype"], sort=True):
            g = g.sort_values("Tf")
            ok = g[g[value].notna()]
            ax.plot(ok["Tf"], ok[value].clip(lower=floor), color=color[k], marker=marker[k],
                    ms=4, lw=1.3)
            if bound_col:
                b = ok[bound_col]
                ax.plot(ok["Tf"][b.notna()], b[b.notna()].clip(lower=floor), color=color[k],
                        ls="--", lw=1, alpha=0.8)
                panel_vals.append(b.to_numpy(dtype="float64"))
            badT = g.loc[g["any_bad"], "Tf"]
            if len(badT):
                ax.scatter(badT, np.full(len(badT), 0.95), transform=ax.get_xaxis_transform(),
                           marker="x", color=color[k], s=40, zorder=5, clip_on=False)
        if hline is not None:
            ax.axhline(hline, color="#c00", ls=":", lw=1.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        inc = (0.1, 2 * hline) if hline is not None else ()
        ax.set_ylim(*_ylim(np.concatenate(panel_vals), floor, inc))
        if hline is not None:
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        Ts = sorted(sub["Tf"].unique())
        ticks = Ts[:: math.ceil(len(Ts) / 8)]  # sweeps are geometric: label the Ts themselves
        ax.set_xticks(ticks, labels=[str(int(t)) for t in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
        if len(Ts) == 1:
            ax.set_xlim(Ts[0] / 2, Ts[0] * 2)
        ax.set_title(f"{op}: {tensor}", fontsize=10)
        ax.set_xlabel("T", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)

    handles = [Line2D([], [], color=color[k], marker=marker[k], ms=4, label=label[k]) for k in keys]
    if bound_col:
        handles.append(Line2D([], [], color="#555", ls="--", label="bound"))
    if hline is not None:
        handles.append(Line2D([], [], color="#c00", ls=":", label=f"err/bound = {hline:g}"))
    if df["any_bad"].any():
        handles.append(Line2D([], [], color="#555", marker="x", ls="", label=bad_label))
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.02 / height),
               ncols=min(len(handles), 5), fontsize=8, frameon=False)
    note = f" (zeros drawn at {floor:.0e})" if has_zero else ""
    fig.suptitle(title + note, fontsize=11, y=1 - 0.12 / height, va="top")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def error_vs_T_figure(df: pd.DataFrame, dpi: int = 80) -> bytes | None:
    """PNG: for golden rows, max relative error vs T (log-log), one panel per (op, tensor), one
    line per (variant, dtype) (colour: variant; shade and marker: dtype), and dashed, the bound
    of the same row in relative units (bound * rel / err). An x at the top of a panel: a NaN/Inf
    in the result at that T. A rel that is not finite (golden all zero) is not drawn.
    None when there is nothing to plot."""
    d = _prepare(df, ("golden",), "rel", bad_col="err")
    if d.empty:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        d = d.assign(bound_rel=np.where(d["err"] > 0, d["bound"] * d["rel"] / d["err"], np.nan))
    r = _reduce(d, "rel", extra=("bound_rel",))
    return _render(r, _palette(coerce_results(df)), "rel",
                   "max relative error vs T (golden); dashed: its bound", "rel err", dpi,
                   bad_label="NaN/Inf in the result", bound_col="bound_rel")


def ratio_vs_T_figure(df: pd.DataFrame, dpi: int = 80) -> bytes | None:
    """PNG: max err/bound vs T, one panel per (op, tensor), for golden and agreement rows (and
    any other check with a ratio), one line per (variant or variant pair, dtype), a dotted line
    at 1. An x at the top: a NaN/Inf result or err/bound there. None when nothing to plot."""
    d = _prepare(df, None, "ratio", bad_col="ratio")
    if d.empty:
        return None
    r = _reduce(d, "ratio")
    return _render(r, _palette(coerce_results(df)), "ratio",
                   "max err/bound vs T (above the dotted line fails)", "err / bound", dpi,
                   bad_label="NaN/Inf result or err/bound", hline=1.0)
