"""Charts for the HTML report, drawn by matplotlib and handed back as inert `data:image/svg+xml` URIs.

Embedding the SVG as a base64 image (not inline markup) makes it inert: a label taken from a trace or a
folder name cannot become an element of the report page, whatever it contains. Mathtext is off so a `$`
in a name is drawn as a dollar sign. Text stays text in the SVG (`svg.fonttype = 'none'`), which keeps
each chart to a few tens of kilobytes.

A chart is a function of its figures alone, and drawing one takes tens of milliseconds: each is drawn once
per process for the same figures (`memoized`), so a report written again, or a notebook that shows a trial
again, reuses it.
"""

from __future__ import annotations

import base64
import functools
import io
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # no display: render to files only, before pyplot is imported anywhere

import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

RC = {
    "svg.fonttype": "none",
    "svg.hashsalt": "advisor",  # stable element ids: the same session gives the same report
    "text.parse_math": False,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}

# One colour per breakdown role (same order as advisor.analysis.breakdown.ROLES) and per trial decision.
ROLE_COLORS = {
    "kernel": "#4c78a8", "memcpy": "#f58518", "memset": "#e45756", "communication": "#72b7b2",
    "runtime": "#54a24b", "dataloader": "#eeca3b", "cpu_op": "#b279a2", "other": "#bab0ac",
}
DECISION_COLORS = {"baseline": "#4c78a8", "kept": "#54a24b", "reverted": "#bab0ac", "failed": "#e45756"}


CHARTS_KEPT = 128  # about 20 KB each
DRAWN: dict[tuple[str, str], str] = {}  # (chart, repr of its arguments) -> its data URI, oldest first


def memoized(draw: Callable[..., str]) -> Callable[..., str]:
    """`draw`, remembering in DRAWN the charts it drew by the repr of their arguments (plain data: lists,
    dicts, numbers, strings), the oldest forgotten first."""
    @functools.wraps(draw)
    def chart(*args, **kwargs) -> str:
        key = (draw.__name__, repr((args, kwargs)))
        if key not in DRAWN:
            if len(DRAWN) >= CHARTS_KEPT:
                del DRAWN[next(iter(DRAWN))]
            DRAWN[key] = draw(*args, **kwargs)
        return DRAWN[key]

    return chart


def svg_data_uri(fig: Figure) -> str:
    """The figure as a base64 `data:image/svg+xml` URI; closes the figure."""
    buf = io.BytesIO()
    with plt.rc_context(RC):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(rows: int) -> tuple[Figure, object]:
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(9.0, 0.9 + 0.38 * max(rows, 1)))
    return fig, ax


@memoized
def breakdown_chart(labels: list[str], breakdown_ms: list[dict[str, float]], roles: tuple[str, ...],
                    role_labels: dict[str, str]) -> str:
    """Stacked horizontal bars: each bar one trial (or trace), each segment a role's ms per step."""
    with plt.rc_context(RC):
        fig, ax = _figure(len(labels))
        y = list(range(len(labels)))
        left = [0.0] * len(labels)
        for role in roles:
            widths = [b.get(role) or 0.0 for b in breakdown_ms]
            if not any(widths):
                continue
            ax.barh(y, widths, left=left, color=ROLE_COLORS.get(role, "#999999"), label=role_labels.get(role, role),
                    height=0.6)
            left = [a + b for a, b in zip(left, widths)]
        ax.set_yticks(y, labels)
        ax.invert_yaxis()  # first trial on top, as in the tables
        ax.set_xlabel("ms per profiled step")
        if ax.get_legend_handles_labels()[0]:  # no trial with a trace: nothing to name
            ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        return svg_data_uri(fig)


@memoized
def throughput_chart(labels: list[str], samples_per_s: list[float | None], decisions: list[str],
                     unit: str = "samples/s", intervals: list | None = None) -> str:
    """Horizontal bars of steady-state samples/s (or steps/s: `unit`) per trial, coloured by the decision,
    with each trial's recorded 95% interval as an error bar (the tables' ± figure)."""
    with plt.rc_context(RC):
        fig, ax = _figure(len(labels))
        y = list(range(len(labels)))
        values = [v or 0.0 for v in samples_per_s]
        ax.barh(y, values, color=[DECISION_COLORS.get(d, "#999999") for d in decisions], height=0.6)
        spans = [_interval(i, v) for i, v in zip(intervals or [None] * len(labels), samples_per_s)]
        ends = list(values)
        for yi, v, span in zip(y, samples_per_s, spans):
            if span is not None:
                ax.errorbar([v], [yi], xerr=[[v - span[0]], [span[1] - v]], fmt="none", ecolor="#333333",
                            elinewidth=1, capsize=3)
                ends[yi] = max(v, span[1])
        for yi, v, d, end in zip(y, samples_per_s, decisions, ends):
            ax.text(end, yi, f" {v:.1f} ({d})" if v else f" no measurement ({d})", va="center", fontsize=8)
        ax.set_yticks(y, labels)
        ax.invert_yaxis()
        ax.set_xlabel(f"{unit} (steady state" + ("; bars: 95% interval)" if any(spans) else ")"))
        ax.set_xlim(0, max(ends + [1.0]) * 1.3)
        return svg_data_uri(fig)


def _interval(interval: object, value: float | None) -> tuple[float, float] | None:
    """A recorded [low, high] around `value`, or None when there is none to draw."""
    if (not value or not isinstance(interval, (list, tuple)) or len(interval) != 2
            or not all(isinstance(x, (int, float)) for x in interval) or not interval[0] <= value <= interval[1]):
        return None
    return max(0.0, float(interval[0])), float(interval[1])


# A capacity line is drawn only when a peak reaches this share of it: against 25 GB of host RAM, peaks of
# half a GB would be slivers, and the chart is there to compare the trials.
CAPACITY_SCALE = 0.2


@memoized
def memory_chart(labels: list[str], peak_bytes: list[float | None], capacity_bytes: float | None,
                 sources: list[str]) -> str:
    """Peak memory per trial (GB) against the device capacity (dashed line) when it is known and a peak comes
    near it; a capacity far off the scale is named under the axis instead."""
    with plt.rc_context(RC):
        fig, ax = _figure(len(labels))
        y = list(range(len(labels)))
        gb = [(v or 0.0) / 1e9 for v in peak_bytes]
        ax.barh(y, gb, color="#4c78a8", height=0.6)
        for yi, v in zip(y, peak_bytes):
            ax.text((v or 0.0) / 1e9, yi, f" {v / 1e9:.2f} GB" if v else " unknown", va="center", fontsize=8)
        top = max(gb + [0.001])
        off_scale = ""
        if capacity_bytes:
            cap = capacity_bytes / 1e9
            if top >= CAPACITY_SCALE * cap:
                ax.axvline(cap, color="#e45756", linestyle="--", linewidth=1.2)
                ax.text(cap, -0.6, f" capacity {cap:.1f} GB", color="#e45756", fontsize=8, va="bottom")
                top = max(top, cap)
            else:
                off_scale = f"; capacity {cap:.1f} GB, off the scale"
        ax.set_yticks(y, labels)
        ax.invert_yaxis()
        ax.set_xlim(0, top * 1.25)
        source = sorted({s for s in sources if s})
        ax.set_xlabel("peak memory, GB" + (f" ({'; '.join(source)})" if source else "") + off_scale)
        return svg_data_uri(fig)


@memoized
def memory_timeline_chart(series: list[tuple[str, tuple[float, ...], tuple[float, ...]]],
                          capacity_bytes: float | None, cumulative: bool) -> str:
    """Allocated memory over the trace (one line per device), against capacity when it is known."""
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(9.0, 2.6))
        for label, times, values in series:
            ax.step(times, [v / 1e9 for v in values], where="post", label=label, linewidth=1.2)
        if capacity_bytes:
            ax.axhline(capacity_bytes / 1e9, color="#e45756", linestyle="--", linewidth=1.2)
            ax.text(0, capacity_bytes / 1e9, f" capacity {capacity_bytes / 1e9:.1f} GB", color="#e45756",
                    fontsize=8, va="bottom")
        ax.set_xlabel("ms since the first memory event")
        ax.set_ylabel("GB allocated since the trace started" if cumulative else "GB allocated")
        ax.set_ylim(bottom=0)
        if len(series) > 1:
            ax.legend(frameon=False)
        return svg_data_uri(fig)


@memoized
def rank_timeline_chart(labels: list[str], segments: list[list], highlight: int | None,
                        role_labels: dict[str, str]) -> str:
    """One step per rank, side by side in time: each bar a rank, each segment [role, start_us, end_us] the
    role holding that moment; the bar at index `highlight` (the straggler) is outlined."""
    with plt.rc_context(RC):
        fig, ax = _figure(len(labels))
        shown = set()
        for y, rank_segments in enumerate(segments):
            by_role: dict[str, list[tuple[float, float]]] = {}
            for role, start, end in rank_segments:
                by_role.setdefault(role, []).append((start / 1000, (end - start) / 1000))
            for role, spans in by_role.items():
                ax.broken_barh(spans, (y - 0.3, 0.6), color=ROLE_COLORS.get(role, "#999999"),
                               label=None if role in shown else role_labels.get(role, role))
                shown.add(role)
            if y == highlight:
                end = max((e for _, _, e in rank_segments), default=0.0) / 1000
                ax.add_patch(matplotlib.patches.Rectangle((0, y - 0.4), end, 0.8, fill=False, edgecolor="#e45756",
                                                          linewidth=1.5))
        ax.set_yticks(list(range(len(labels))), labels)
        ax.invert_yaxis()
        ax.set_xlabel("ms from the start of the step")
        if shown:
            ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        return svg_data_uri(fig)
