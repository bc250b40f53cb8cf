"""Plots of the rows the planning commands build: wall-clock and cost against GPU count, memory by term.

matplotlib is an optional extra (`pip install ddplan[plot]`) and is imported inside the functions only,
never at `import ddplan.plot`. No pyplot: each figure is a `matplotlib.figure.Figure` on its own Agg
canvas, so no global state is touched, and settings that must be global in matplotlib (the SVG hash
salt) are set in an `rc_context` that restores them. Each function writes one file, PNG or SVG by the
suffix, atomically (a temporary file in the same folder, then os.replace), at a fixed size and dpi; the
SVG carries no date and a fixed hash salt, so the same rows give the same bytes.
"""

from __future__ import annotations

import math
import os
import tempfile
import textwrap
from pathlib import Path

from ddplan.errors import DdplanError
from ddplan.files import _umask

FORMATS = {".png": "png", ".svg": "svg"}
DPI = 150
SCENARIO_SIZE_IN = (12.0, 6.0)
MEMORY_SIZE_IN = (10.0, 6.5)
VALIDATION_SIZE_IN = (10.0, 6.0)
LOG_SPAN = 10.0  # a value axis goes log when its largest value is more than 10x its smallest

SCENARIO_KEYS = ("gpus", "wall_clock_h", "wall_low_h", "wall_high_h", "cost_usd", "cost_low_usd", "cost_high_usd")
# ddplan.fit.TERM_COLUMNS, in the order they stack (the model's state first, then what a step adds)
MEMORY_TERMS = {
    "params_gib": "parameters", "gradients_gib": "gradients", "optimizer_gib": "optimizer states",
    "activations_gib": "activations (saved for backward)", "transient_gib": "activation transient",
    "buffers_gib": "communication buffers", "framework_gib": "framework (CUDA/ROCm context, NCCL/RCCL buffers)",
    "allocator_gib": "allocator slack",
}
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")  # matplotlib's tab10, spelled out so the output does not depend on the rc style
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")
LIMIT_COLOUR = "#b00000"  # a plan's budget and deadline lines: darker than any series colour (COLOURS)
BAND_ALPHA = 0.15  # the low-high band's fill, and its legend swatch
FADED_ALPHA, FADED_WIDTH = 0.3, 0.8  # a family's series other than its best (plan plots over several hardware)
VALIDATION_BAR_ALPHA = 0.35


def plot_scenarios(rows: list[dict], path: str | os.PathLike, *, title: str,
                   series: str | tuple[str, ...] | None = None, best: str = "wall_clock_h",
                   choice: dict | None = None, budget_usd: float | None = None, deadline_h: float | None = None):
    """Wall-clock (h) and cost (USD) against GPU count, one line per scenario, bands shaded on the time panel
    and drawn as bars at each point, side by side, on the cost panel (whose lines lie close together, where
    shaded bands would cover each other); PNG or SVG.

    rows: decision-table rows (`ddplan.plan.build_table`) or plan rows (`ddplan.search.search`).
    series: the row key(s) that name a line; default: "family" (plus "hardware" when rows cover more than
    one) if the rows have a family, else attention and window. The first key picks the colour, the others
    the line style and marker. Where a series has several rows at one GPU count (plan rows: many layouts
    per family), the point is its row with the smallest `best` ("wall_clock_h" or "cost_usd").
    When the first key is "family" and a family has several series (one per hardware), the series holding
    the family's smallest `best` is drawn in full with its band; the others are faded (thin, no band, no
    markers) under one legend entry. Each full line's legend swatch is its band's colour and alpha with the
    line drawn over it. The GPU axis is log base 2; wall-clock and cost go log when they span more than 10x.
    Rows with fits == False are drawn hollow, rows with basis == "measured" get a star. choice: the row a plan
    chose, ringed in black on both panels and named in the legend; budget_usd and deadline_h: the limits asked,
    a dashed red line on the cost and the time panel (the value axes reach them).
    Returns the matplotlib Figure (already written to `path`).
    """
    fmt = _format(path)
    if not rows:
        raise ValueError("no rows to plot")
    missing = sorted({k for k in SCENARIO_KEYS if any(k not in r for r in rows)})
    if missing:
        raise ValueError(f"rows lack {', '.join(missing)}: not decision-table or plan rows")
    if best not in ("wall_clock_h", "cost_usd"):
        raise ValueError(f"best must be 'wall_clock_h' or 'cost_usd', got {best!r}")
    keys = _series_keys(rows, series)
    lines: dict[tuple, dict[int, dict]] = {}  # series -> gpus -> row, in the order rows come
    for r in rows:
        points = lines.setdefault(tuple(str(r[k]) for k in keys), {})
        if r["gpus"] not in points or r[best] < points[r["gpus"]][best]:
            points[r["gpus"]] = r
    labels = _merge_identical(lines)
    lead = _lead_series(lines, best) if keys[0] == "family" else set(lines)

    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=SCENARIO_SIZE_IN, dpi=DPI, layout="constrained")
        ax_time, ax_cost = fig.subplots(1, 2)
        colour = _index([s[0] for s in lines], COLOURS)
        style = _index([s[1:] for s in lines], range(len(lines)))
        handles, oom, measured = [], 0, 0
        shown = [s for s in lines if s in lead]
        for s, points in lines.items():
            pts = [points[g] for g in sorted(points)]
            xs = [p["gpus"] for p in pts]
            c, i = colour[s[0]], style[s[1:]]
            ls, mk = LINESTYLES[i % len(LINESTYLES)], MARKERS[i % len(MARKERS)]
            for ax, (v, lo, hi) in ((ax_time, ("wall_clock_h", "wall_low_h", "wall_high_h")),
                                    (ax_cost, ("cost_usd", "cost_low_usd", "cost_high_usd"))):
                if s not in lead:
                    ax.plot(xs, [p[v] for p in pts], color=c, linestyle=ls, linewidth=FADED_WIDTH, alpha=FADED_ALPHA,
                            zorder=1)
                    continue
                if ax is ax_cost:  # a bar per point, each series a little apart on the (log 2) GPU axis
                    shift = 2 ** (0.06 * (shown.index(s) - (len(shown) - 1) / 2))
                    ax.errorbar([x * shift for x in xs], [p[v] for p in pts],
                                yerr=[[p[v] - p[lo] for p in pts], [p[hi] - p[v] for p in pts]], fmt="none",
                                ecolor=c, elinewidth=2.2, capsize=4, alpha=0.7, zorder=2)
                else:
                    ax.fill_between(xs, [p[lo] for p in pts], [p[hi] for p in pts], color=c, alpha=BAND_ALPHA,
                                    linewidth=0)
                    for k in (lo, hi):  # the band's edges, so overlapping bands can still be told apart
                        ax.plot(xs, [p[k] for p in pts], color=c, linestyle=ls, linewidth=0.6, alpha=0.5, zorder=2)
                (line,) = ax.plot(xs, [p[v] for p in pts], color=c, linestyle=ls, marker=mk, markersize=6,
                                  linewidth=1.6, zorder=3)
                bad = [p for p in pts if p.get("fits") is False]
                ax.plot([p["gpus"] for p in bad], [p[v] for p in bad], linestyle="none", marker=mk, markersize=6,
                        markerfacecolor="white", markeredgecolor=c, markeredgewidth=1.6, zorder=4)
                ok = [p for p in pts if p.get("basis") == "measured"]
                ax.plot([p["gpus"] for p in ok], [p[v] for p in ok], linestyle="none", marker="*", markersize=17,
                        markerfacecolor="gold", markeredgecolor="black", markeredgewidth=1.0, zorder=5)
            if s in lead:  # the swatch is the band as drawn (colour and alpha), the line over it
                handles.append(((Patch(facecolor=c, alpha=BAND_ALPHA, linewidth=0), line), labels[s]))
                oom += len(bad)
                measured += len(ok)
        extra = []
        if len(lead) < len(lines):
            extra.append((Line2D([], [], color="black", linewidth=FADED_WIDTH, alpha=FADED_ALPHA),
                          f"faded: the same {keys[0]}, other {', '.join(keys[1:])} ({len(lines) - len(lead)})"))
        if oom:
            extra.append((Line2D([], [], linestyle="none", marker="o", markerfacecolor="white",
                                 markeredgecolor="black", markeredgewidth=1.6),
                          f"hollow: does not fit in memory ({oom} of {sum(len(lines[s]) for s in lead)} points)"))
        if measured:
            extra.append((Line2D([], [], linestyle="none", marker="*", markersize=14, markerfacecolor="gold",
                                 markeredgecolor="black"), "measured step time"))

        if choice is not None:
            for ax, v in ((ax_time, "wall_clock_h"), (ax_cost, "cost_usd")):
                ax.plot([choice["gpus"]], [choice[v]], linestyle="none", marker="o", markersize=16,
                        markerfacecolor="none", markeredgecolor="black", markeredgewidth=2.0, zorder=6)
            extra.append((Line2D([], [], linestyle="none", marker="o", markersize=12, markerfacecolor="none",
                                 markeredgecolor="black", markeredgewidth=2.0),
                          f"the choice: {choice['gpus']}x {choice.get('hardware', '')}".rstrip()))
        limits = {ax_time: deadline_h, ax_cost: budget_usd}
        for ax, limit, words in ((ax_time, deadline_h, "deadline {:,.4g} h"), (ax_cost, budget_usd, "budget ${:,.0f}")):
            if limit is not None:
                ax.axhline(limit, color=LIMIT_COLOUR, linestyle="--", linewidth=1.4, zorder=1)
                extra.append((Line2D([], [], color=LIMIT_COLOUR, linestyle="--", linewidth=1.4), words.format(limit)))

        gpus = sorted({r["gpus"] for r in rows})
        for ax, ylabel, (v, lo, hi) in ((ax_time, "wall-clock (h)", ("wall_clock_h", "wall_low_h", "wall_high_h")),
                                        (ax_cost, "cost (USD)", ("cost_usd", "cost_low_usd", "cost_high_usd"))):
            _gpu_axis(ax, gpus)
            ys = [p[k] for s, pts in lines.items() for p in pts.values() for k in ((lo, hi) if s in lead else (v,))]
            ys += [limits[ax]] if limits[ax] is not None else []
            _value_axis(ax, min(ys), max(ys))
            ax.set_ylabel(ylabel)
            ax.grid(True, which="major", alpha=0.3)
        ax_time.set_title("wall-clock time to train")
        ax_cost.set_title("cost of the run")
        items = handles + extra
        fig.legend([h for h, _ in items], [label for _, label in items], loc="outside lower center",
                   ncol=min(len(items), 4), frameon=False, handler_map={tuple: HandlerTuple(ndivide=1)},
                   title=f"{', '.join(keys)} (line: central estimate; low-high band: shaded for time, bars for cost)")
        fig.suptitle(_wrap(title), fontsize=11)
        _save(fig, path, fmt)
    return fig


def plot_memory(rows: list[dict], path: str | os.PathLike, *, title: str, capacity_gib: float,
                headroom: float = 0.05, fix: tuple[str, float, str] | None = None):
    """Memory per GPU (GiB) stacked by term, one bar per ZeRO stage, with the usable capacity and the limit a
    setup must stay under drawn; PNG or SVG.

    rows: `ddplan.sizing.zero_rows` (the rows of `ddplan memory`). capacity_gib: the device's usable memory,
    GiB = 2^30 bytes. headroom: the fraction of it kept free (`--headroom`, ddplan.memory.HEADROOM), so the
    limit line is at (1 - headroom) x capacity_gib. Terms under 3% of the axis are left unlabelled (the
    legend names every term); bars that do not fit (the row's fits, else total over the limit) are outlined
    red. fix: (the changes in words, its total GiB, its verdict: fits / may not fit), the fix `ddplan memory`
    proposes, drawn as one more bar (its total only, hatched; green when it fits, orange when it may not) after
    the stages. Returns the matplotlib Figure (already written to `path`).
    """
    fmt = _format(path)
    if not rows:
        raise ValueError("no rows to plot")
    if fix is not None and not fix[1] > 0:
        raise ValueError(f"the fix's total must be > 0 GiB, got {fix[1]}")
    missing = sorted({k for k in ("zero", "setup", "total_gib", *MEMORY_TERMS) if any(k not in r for r in rows)})
    if missing:
        raise ValueError(f"rows lack {', '.join(missing)}: not memory rows")
    if not capacity_gib > 0:
        raise ValueError(f"capacity_gib must be > 0, got {capacity_gib}")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    limit_gib = (1 - headroom) * capacity_gib

    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=MEMORY_SIZE_IN, dpi=DPI, layout="constrained")
        ax = fig.subplots()
        xs = list(range(len(rows)))
        top = max(max(r["total_gib"] for r in rows), capacity_gib) * 1.15
        bottoms = [0.0] * len(rows)
        for (key, label), c in zip(MEMORY_TERMS.items(), COLOURS):
            heights = [r[key] for r in rows]
            ax.bar(xs, heights, bottom=bottoms, width=0.6, color=c, label=label, edgecolor="white", linewidth=0.5)
            for x, b, h in zip(xs, bottoms, heights):
                if h >= 0.03 * top:
                    ax.text(x, b + h / 2, f"{h:.1f}", ha="center", va="center", fontsize=8, color="white",
                            fontweight="bold")
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        for x, r in zip(xs, rows):
            fits = r.get("fits", r["total_gib"] <= limit_gib)
            if not fits:
                ax.bar([x], [r["total_gib"]], width=0.6, fill=False, edgecolor="#d00000", linewidth=2.0)
            ax.text(x, r["total_gib"] + 0.01 * top, f"{r['total_gib']:.1f} GiB" + ("" if fits else "\ndoes not fit"),
                    ha="center", va="bottom", fontsize=9, fontweight="bold", color="black" if fits else "#d00000")
        labels = [f"ZeRO-{r['zero']} ({r['setup']})" for r in rows]
        if fix is not None:  # the proposed change: one bar at its total
            changes, fix_gib, verdict = fix
            tone = "#2a9d8f" if verdict == "fits" else "#e07b00"
            ax.bar([len(rows)], [fix_gib], width=0.6, color="none", edgecolor=tone, hatch="//", linewidth=2.0,
                   label="the proposed fix (total)")
            ax.text(len(rows), fix_gib + 0.01 * top, f"{fix_gib:.1f} GiB\n{verdict}", ha="center", va="bottom",
                    fontsize=9, fontweight="bold", color=tone)
            labels.append("fix: " + _wrap(changes, 28))
            xs = [*xs, len(rows)]
        ax.axhline(capacity_gib, color="black", linestyle="--", linewidth=1.2)
        ax.annotate(f"usable\n{capacity_gib:.1f} GiB", xy=(1.0, capacity_gib), xycoords=("axes fraction", "data"),
                    xytext=(4, 0), textcoords="offset points", ha="left", va="bottom", fontsize=9)
        if headroom > 0:
            ax.axhline(limit_gib, color="#d00000", linestyle=":", linewidth=1.2)
            ax.annotate(f"{100 * (1 - headroom):.4g}% of usable:\n{limit_gib:.1f} GiB", xy=(1.0, limit_gib),
                        xycoords=("axes fraction", "data"), xytext=(4, 0), textcoords="offset points", ha="left",
                        va="top", fontsize=9, color="#d00000")
        ax.set_xticks(xs, labels)
        for tick, r in zip(ax.get_xticklabels(), rows):
            if r["setup"] == "native":
                tick.set_fontweight("bold")
        ax.set_xlim(-0.6, len(xs) - 0.4)
        ax.set_ylim(0, top)
        ax.set_ylabel("memory per GPU (GiB)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        handles, labels = ax.get_legend_handles_labels()
        fig.legend(handles[::-1], labels[::-1], loc="outside right center", frameon=False, title="term (top first)")
        fig.suptitle(_wrap(title, 90), fontsize=11)
        _save(fig, path, fmt)
    return fig


_RC = {"svg.hashsalt": "ddplan", "svg.fonttype": "path", "font.size": 10, "axes.titlesize": 10,
       "legend.fontsize": 9, "path.simplify": True}


def _format(path: str | os.PathLike) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"plot file must end in {' or '.join(FORMATS)}, got {str(path)!r}")
    return FORMATS[suffix]


def _series_keys(rows: list[dict], series: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if series is None:
        if "family" in rows[0]:
            many_hw = len({r.get("hardware") for r in rows}) > 1
            keys: tuple[str, ...] = ("family", "hardware") if many_hw else ("family",)
        else:
            keys = tuple(k for k in ("attention", "window") if k in rows[0])
    else:
        keys = (series,) if isinstance(series, str) else tuple(series)
    missing = sorted({k for k in keys if any(k not in r for r in rows)})
    if not keys or missing:
        raise ValueError(f"series keys {', '.join(missing) or '(none)'} are not in the rows")
    return keys


def _merge_identical(lines: dict[tuple, dict[int, dict]]) -> dict[tuple, str]:
    """Drop a series whose every point equals an earlier one's (figures, fits and basis; e.g. a window pattern
    the attention ignores) and name both in the earlier one's label, "sdpa-math, SSSL = L", so that no line
    hides under another unexplained."""
    figures = ("wall_clock_h", "wall_low_h", "wall_high_h", "cost_usd", "cost_low_usd", "cost_high_usd")
    labels: dict[tuple, str] = {}
    for s in list(lines):
        same = next((t for t in labels if lines[t].keys() == lines[s].keys() and all(
            math.isclose(lines[t][g][f], lines[s][g][f], rel_tol=1e-9) for g in lines[s] for f in figures)
            and all(lines[t][g].get(k) == lines[s][g].get(k) for g in lines[s] for k in ("fits", "basis"))), None)
        if same is None:
            labels[s] = ", ".join(s)
            continue
        common = next((i for i, (a, b) in enumerate(zip(same, s)) if a != b), len(s))
        labels[same] += " = " + ", ".join(s[common:])
        del lines[s]
    return labels


def _lead_series(lines: dict[tuple, dict[int, dict]], best: str) -> set[tuple]:
    """Per first key (the family): the series holding its smallest `best` value; ties go to the series first
    given (plan rows come ranked)."""
    lead: dict[str, tuple] = {}
    for s, points in lines.items():
        top = min(p[best] for p in points.values())
        if s[0] not in lead or top < min(p[best] for p in lines[lead[s[0]]].values()):
            lead[s[0]] = s
    return set(lead.values())


def _index(values: list, palette) -> dict:
    """Each distinct value -> a palette entry, in the order values first appear (deterministic)."""
    pal = list(palette)
    return {v: pal[i % len(pal)] for i, v in enumerate(dict.fromkeys(values))}


def _gpu_axis(ax, gpus: list[int]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(gpus))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(g) for g in gpus])
    lo, hi = min(gpus), max(gpus)
    ax.set_xlim(lo / 2**0.3, hi * 2**0.3)
    ax.set_xlabel("GPUs")


def _value_axis(ax, lo: float, hi: float) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fmt = FuncFormatter(lambda v, _: (f"{v:,.0f}" if v >= 10 else f"{v:.3g}"))
    if lo > 0 and hi / lo > LOG_SPAN:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(lo / 1.25, hi * 1.25)
    else:
        pad = 0.08 * (hi - lo or abs(hi) or 1.0)
        ax.set_ylim(max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad)
    ax.yaxis.set_major_formatter(fmt)


def _wrap(title: str, width: int = 110) -> str:
    """Each line of the title wrapped at `width` (the line breaks it has are kept)."""
    return "\n".join("\n".join(textwrap.wrap(line, width)) or line for line in title.split("\n"))


def _save(fig, path: str | os.PathLike, fmt: str) -> None:
    """Render to a temporary file beside `path`, then os.replace: readers never see a half-written plot.
    The file gets the permissions the umask gives a new file (mkstemp's own are 0600), as ddplan.files does."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)  # as ddplan.files.atomic_write (checked writable first)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise DdplanError(f"cannot write here: {(e.strerror or type(e).__name__).lower()}", file=str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=fmt, dpi=DPI, metadata={"Date": None} if fmt == "svg" else {"Software": None})
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as e:
        os.unlink(tmp)
        if isinstance(e, OSError):
            raise DdplanError(f"cannot write here: {(e.strerror or type(e).__name__).lower()}", file=str(path)) from None
        raise


def plot_validation(rows: list[dict], path: str | os.PathLike, *, title: str):
    """Error of each validated run (predicted / measured - 1, %) against its GPU count, with its band drawn
    as a vertical bar, one colour per source (then one marker per ten sources: every source drawn); PNG or SVG. rows: `ddplan validate`'s rows (gpus, error_pct,
    band_low_pct, band_high_pct, source). Each legend swatch is the source's bar as drawn (colour, alpha)
    with its point over it. Returns the matplotlib Figure (already written to `path`)."""
    fmt = _format(path)
    if not rows:
        raise ValueError("no rows to plot")
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.lines import Line2D

    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=VALIDATION_SIZE_IN, dpi=DPI, layout="constrained")
        ax = fig.subplots()
        handles = []
        sources = sorted({r["source"] for r in rows})
        for i, src in enumerate(sources):  # past the palette's ten colours, the next marker tells sources apart
            c, mk = COLOURS[i % len(COLOURS)], MARKERS[i // len(COLOURS) % len(MARKERS)]
            mine = [r for r in rows if r["source"] == src]
            xs = [r["gpus"] for r in mine]
            ax.vlines(xs, [r["band_low_pct"] for r in mine], [r["band_high_pct"] for r in mine], color=c,
                      alpha=VALIDATION_BAR_ALPHA, linewidth=4)
            dots = ax.scatter(xs, [r["error_pct"] for r in mine], color=c, marker=mk, zorder=3, s=22)
            handles.append(((Line2D([], [], color=c, alpha=VALIDATION_BAR_ALPHA, linewidth=4), dots),
                            f"{src} ({len(mine)})"))
        ax.axhline(0, color="black", linewidth=1.0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs in the run (log scale)")
        ax.set_ylabel("error of the step time (%): predicted / measured - 1")
        ax.grid(True, alpha=0.3)
        ax.legend([h for h, _ in handles], [label for _, label in handles],
                  handler_map={tuple: HandlerTuple(ndivide=1)}, title="source (runs); bar: the measured value's band",
                  frameon=False, loc="best")
        fig.suptitle(_wrap(title, 90), fontsize=11)
        _save(fig, path, fmt)
    return fig
