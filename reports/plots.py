"""Plots of error and err/bound against T, returned as PNG bytes: a panel per (op, tensor) measured
at two T or more; the tensors measured at one T only (an op's layer in a short sweep, every
tensor of a run at one T) side by side in one strip chart per op or layer, not as one-dot panels.

Uses matplotlib's object API on the Agg canvas (no pyplot, no global state), so it is safe to
call from any thread and never opens a window.
"""
from __future__ import annotations

import base64
import io
import math
import re

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

from .results import coerce_results, subject, tensor_group, tensor_sort_key

DTYPE_MARKERS = {"fp32": "o", "float32": "o", "bf16": "s", "bfloat16": "s",
                 "fp16": "^", "float16": "^", "fp64": "D", "float64": "D"}
_KNOWN = ("chunk", "fused_chunk", "fused_recurrent")


def png_data_uri(png: bytes) -> str:
    """`data:image/png;base64,...` for an <img src>."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _prepare(df: pd.DataFrame, checks: tuple | None, value: str, bad_col: str) -> pd.DataFrame:
    """Rows of `checks` (None: every check but "run") with a tensor and a positive T, with `panel`
    (the op, or "<op> layer" for the layer's rows), `tensor` as the tables group it ("dw (no final
    state)" is dw), `subject` (what the line is: the variant or the variant pair), `finite` (the
    value can be drawn) and `bad` (the result had a NaN/Inf, or `bad_col` is infinite, or the row
    failed without one). Rows with nothing to draw (a check with a verdict only) are left out."""
    df = coerce_results(df)
    mask = df["check"] != "run" if checks is None else df["check"].isin(checks)
    df = df[mask & (df["tensor"] != "")]
    df = df[df["T"].astype("float64") > 0]
    if df.empty:
        return df
    bad_counts = (df["nan"].fillna(0).astype("int64") > 0) | (df["inf"].fillna(0).astype("int64") > 0)
    bad = bad_counts | np.isinf(df[bad_col]) | (df[bad_col].isna() & (df["verdict"] == "FAIL"))
    df = df.assign(bad=bad, finite=np.isfinite(df[value]) & ~bad)
    df = df[df["bad"] | df[value].notna()]
    if df.empty:
        return df
    return df.assign(subject=_line_subject(df), tensor=tensor_group(df),
                     Tf=df["T"].astype("float64"),
                     panel=df["op"] + np.where(df["check"] == "layer", " layer", ""))


def _line_subject(df: pd.DataFrame) -> pd.Series:
    """The variant (with its implementation) or, for agreement rows, the pair: every check of a
    variant on one line, its worst value at each T."""
    return subject(df.assign(check=df["check"].where(df["check"] == "agreement", "golden")))


def _reduce(df: pd.DataFrame, value: str, extra: tuple = ()) -> pd.DataFrame:
    """Per (panel, tensor, subject, dtype, T): the row with the largest finite `value`, plus
    `any_bad` (some row was `bad` there)."""
    keys = ["panel", "tensor", "subject", "dtype", "Tf"]
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
    subs = sorted(set(_line_subject(df)),
                  key=lambda s: (_KNOWN.index(s) if s in _KNOWN else len(_KNOWN), s))
    cmap = matplotlib.colormaps["tab20"]
    out = {}
    for i, s in enumerate(subs):
        for d in sorted(set(df["dtype"])):
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


def _T_ticks(Ts: list, min_gap: float) -> list:
    """The Ts to label: the first, the last, and those between at least `min_gap` decades from
    the labels beside them (63, 64 and 65 would print over each other)."""
    kept = [Ts[0]]
    for t in Ts[1:]:
        if math.log10(t / kept[-1]) >= min_gap:
            kept.append(t)
    if len(kept) > 1:
        kept[-1] = Ts[-1]
    return kept


def _layout(df: pd.DataFrame) -> tuple[list, dict]:
    """(line panels, strips): (panel, tensor) measured at two T or more get a panel of their own;
    per panel group, the tensors measured at one T only share a strip chart."""
    n_T = df.groupby(["panel", "tensor"])["Tf"].nunique()
    first = {t: i for i, t in enumerate(pd.unique(df["tensor"]))}
    order = lambda p: (p[0], tensor_sort_key(p[1])[0], first[p[1]])  # noqa: E731
    lines = sorted((p for p, n in n_T.items() if n > 1), key=order)
    strips = {}
    for panel, tensor in sorted((p for p, n in n_T.items() if n == 1), key=order):
        strips.setdefault(panel, []).append(tensor)
    return lines, strips


def _render(df: pd.DataFrame, colors: dict, value: str, title: str, ylabel: str, dpi: int,
            bad_label: str, bound_col: str | None = None, hline: float | None = None) -> bytes:
    lines, strips = _layout(df)
    keys = sorted({(s, d) for s, d in zip(df["subject"], df["dtype"])},
                  key=lambda k: (list(colors).index(k) if k in colors else 1 << 30, k))
    color = {k: colors.get(k, "#333") for k in keys}
    marker = {k: DTYPE_MARKERS.get(k[1], "v") for k in keys}
    # "chunk (tests.implementations:chunk_x)" is labelled "chunk (chunk_x)": a shorter legend
    label = {k: re.sub(r"[\w.]+:(\w+)", r"\1", f"{k[0]} {k[1]}") for k in keys}

    vals = df[value].to_numpy(dtype="float64")
    if bound_col:
        vals = np.concatenate([vals, df[bound_col].to_numpy(dtype="float64")])
    pos = vals[np.isfinite(vals) & (vals > 0)]
    floor = 10 ** math.floor(math.log10(pos.min()) - 1) if pos.size else 1e-16
    if hline is not None:
        floor = min(floor, hline / 100)
    has_zero = bool((df[value] <= 0).any())

    ncols = max(1, min(len(lines), 4))
    line_rows = math.ceil(len(lines) / ncols)
    n_handles = len(keys) + (bound_col is not None) + (hline is not None) + bool(df["any_bad"].any())
    width = 13.2
    longest = max(len(t) for t in label.values())  # about 0.075 in a character, 0.6 the handle
    legend_cols = max(1, min(n_handles, 5, int(width // (0.6 + 0.075 * min(longest, 60)))))
    legend_in = 0.3 + 0.24 * math.ceil(n_handles / legend_cols)
    top_in, ticks_in = 0.7, 0.45  # the titles above the panels; the T axis below the last row
    height = 2.9 * (line_rows + len(strips)) + top_in + ticks_in + legend_in
    fig = Figure(figsize=(width, height), dpi=dpi)  # fixed margins: a layout engine is slow
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(line_rows + len(strips), ncols, left=0.75 / width,
                            right=1 - 0.2 / width, top=1 - top_in / height,
                            bottom=(legend_in + ticks_in) / height, wspace=0.25, hspace=0.55)
    axes = [(fig.add_subplot(grid[i // ncols, i % ncols]), p) for i, p in enumerate(lines)]
    axes += [(fig.add_subplot(grid[line_rows + i, :]), (panel, tensors))
             for i, (panel, tensors) in enumerate(strips.items())]

    def draw(ax, g, x, strip):
        """One (subject, dtype)'s rows `g` at `x`: a line against T, or points apart in a strip."""
        k = (g["subject"].iloc[0], g["dtype"].iloc[0])
        ok, bad = g[value].notna().to_numpy(), g["any_bad"].to_numpy(dtype=bool)
        ax.plot(x[ok], g[value][ok].clip(lower=floor), color=color[k], marker=marker[k], ms=5,
                lw=1.4, ls="" if strip else "-")
        if bound_col:
            b = g[bound_col].notna().to_numpy()
            ax.plot(x[b], g[bound_col][b].clip(lower=floor), color=color[k], alpha=0.8,
                    **(dict(ls="", marker="_", ms=12) if strip else dict(ls="--", lw=1)))
        if bad.any():
            ax.scatter(x[bad], np.full(bad.sum(), 0.95), transform=ax.get_xaxis_transform(),
                       marker="x", color=color[k], s=45, zorder=5, clip_on=False)

    for n, (ax, (panel, what)) in enumerate(axes):
        strip = isinstance(what, list)
        sub = df[(df["panel"] == panel) & df["tensor"].isin(what if strip else [what])]
        Ts = sorted(sub["Tf"].unique())
        ks = sorted({(s, d) for s, d in zip(sub["subject"], sub["dtype"])}, key=keys.index)
        for i, k in enumerate(ks):
            g = sub[(sub["subject"] == k[0]) & (sub["dtype"] == k[1])].sort_values("Tf")
            # in a strip, each tensor's points side by side around its tick
            x = (g["tensor"].map(what.index) + 0.7 * ((i + 0.5) / len(ks) - 0.5)) if strip \
                else g["Tf"]
            draw(ax, g, x.to_numpy(dtype=float), strip)
        if hline is not None:
            ax.axhline(hline, color="#c00", ls=":", lw=1.2)
        ax.set_yscale("log")
        panel_vals = [sub[value].to_numpy(dtype="float64")]
        if bound_col:
            panel_vals.append(sub[bound_col].to_numpy(dtype="float64"))
        inc = (0.1, 2 * hline) if hline is not None else ()
        ax.set_ylim(*_ylim(np.concatenate(panel_vals), floor, inc))
        if hline is not None:
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_locator(NullLocator())   # unlabelled minor ticks of 100 log panels take seconds
        if strip:
            ax.set_xticks(range(len(what)), labels=what)
            ax.set_xlim(-0.6, len(what) - 0.4)
            at = ", ".join(str(int(t)) for t in Ts)
            ax.set_title(f"{panel}: measured at one T only (T = {at})", fontsize=10.5)
        else:
            ax.set_xscale("log")
            labelled = _T_ticks(Ts, 0.16 * math.log10(Ts[-1] / Ts[0]))
            ax.set_xticks(labelled, labels=[str(int(t)) for t in labelled])
            ax.set_xticks(Ts, minor=True)
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_title(f"{panel}: {what}", fontsize=10.5)
            ax.set_xlabel("T", fontsize=9)
        if strip or n % ncols == 0:
            ax.set_ylabel(ylabel, fontsize=9.5)
        ax.tick_params(labelsize=8.5)
        ax.grid(True, which="major", alpha=0.3)

    handles = [Line2D([], [], color=color[k], marker=marker[k], ms=5, label=label[k]) for k in keys]
    if bound_col:
        handles.append(Line2D([], [], color="#555", ls="--", label="bound"))
    if hline is not None:
        handles.append(Line2D([], [], color="#c00", ls=":", label=f"err/bound = {hline:g}"))
    if df["any_bad"].any():
        handles.append(Line2D([], [], color="#555", marker="x", ls="", label=bad_label))
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.05 / height),
               ncols=legend_cols, fontsize=9.5, frameon=False)
    note = f" (zeros drawn at {floor:.0e})" if has_zero else ""
    fig.suptitle(title + note, fontsize=12, y=1 - 0.1 / height, va="top")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def error_vs_T_figure(df: pd.DataFrame, dpi: int = 100) -> bytes | None:
    """PNG: for golden rows, max relative error vs T (log-log), one panel per (op, tensor) (see
    the module), one line per (variant, dtype) (colour: variant; shade and marker: dtype), and
    dashed, the bound of the same row in relative units (bound * rel / err). An x at the top of a
    panel: a NaN/Inf in the result at that T (or a FAIL without an err). A rel that is not finite
    (golden all zero) is not drawn. None when there is nothing to plot."""
    d = _prepare(df, ("golden",), "rel", bad_col="err")
    if d.empty:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        d = d.assign(bound_rel=np.where(d["err"] > 0, d["bound"] * d["rel"] / d["err"], np.nan))
    r = _reduce(d, "rel", extra=("bound_rel",))
    return _render(r, _palette(coerce_results(df)), "rel",
                   "max relative error vs T (golden); dashed: its bound", "rel err", dpi,
                   bad_label="FAIL: NaN/Inf or no err", bound_col="bound_rel")


def ratio_vs_T_figure(df: pd.DataFrame, dpi: int = 100) -> bytes | None:
    """PNG: max err/bound vs T, one panel per (op, tensor) (see the module), one line per
    (variant or variant pair, dtype): the worst of every check with a ratio (golden, sums,
    segments, options; "dw (no final state)" counts as dw), a dotted line at 1. An x at the top:
    a NaN/Inf result or err/bound there, or a FAIL without one. None when nothing to plot."""
    d = _prepare(df, None, "ratio", bad_col="ratio")
    if d.empty:
        return None
    r = _reduce(d, "ratio")
    return _render(r, _palette(coerce_results(df)), "ratio",
                   "max err/bound vs T (above the dotted line fails)", "err / bound", dpi,
                   bad_label="FAIL: NaN/Inf or no err/bound", hline=1.0)
