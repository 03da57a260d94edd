"""A counterexample drawn with matplotlib, to SVG or PNG.

A sequence chart: one vertical lifeline per actor, one row per arrow (a step that sends to several
actors takes several rows under one step number), a local step as a box on its lifeline, a fault in red
with a dashed line and a cross at its start, and a red band under the step where the check fails, with
the invariant and its message. A data case: a two-column table. Every element carries an SVG id
(`lifeline-I`, `arrow-K-step-N` with `-fault` for a fault, `violation-step-N`, `case-table`), so a
test can check a drawing's structure without looking at pixels.
"""

from __future__ import annotations

import os
import textwrap

from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

from ...engine.errors import ConfigError
from .chart import CaseTable, SequenceChart

FORMATS = ("svg", "png")
FAULT, NORMAL, MARK = "#c0392b", "#1f3a5f", "#fdecea"
DX, ROW = 2.4, 0.34  # inches between lifelines, between rows
STYLE = {"svg.fonttype": "none", "svg.hashsalt": "kvsim", "font.family": "DejaVu Sans", "font.size": 8}


def output_format(path: str) -> str:
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in FORMATS:
        raise ConfigError("--out", "a file ending in .svg or .png", path)
    return ext


def draw(drawing: SequenceChart | CaseTable, path: str) -> None:
    """Write `drawing` to `path` (.svg or .png; a ConfigError for anything else or an unwritable path)."""
    fmt = output_format(path)
    with rc_context(STYLE):
        fig = draw_sequence(drawing) if isinstance(drawing, SequenceChart) else draw_table(drawing)
        try:
            fig.savefig(path, format=fmt, dpi=110 if fmt == "png" else 72,
                        metadata={"Date": None} if fmt == "svg" else None)
        except OSError as exc:
            raise ConfigError("--out", "a writable file path", path, exc.strerror or "") from None


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def draw_sequence(chart: SequenceChart) -> Figure:
    n = max(len(chart.lifelines), 1)
    rows = len(chart.arrows) + (1 if chart.marked_step == 0 else 0)
    verdict = _wrap(f"{'in the initial state' if chart.marked_step == 0 else f'after step {chart.marked_step}'}: "
                    f"{chart.check} fails: {chart.verdict}", 40 + 28 * n) if chart.marked_step is not None else ""
    width = max(7.0, DX * (n - 1) + 4.2)
    extra = 0.25 * verdict.count("\n") + (0.5 if verdict else 0) + 0.3 * len(chart.notes)
    height = 1.5 + ROW * (rows + 1) + extra
    fig = Figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-1.4, width - 1.4)
    ax.set_ylim(-(height - 0.9), 0.9)
    ax.axis("off")
    x = {name: i * DX for i, name in enumerate(chart.lifelines)}
    bottom = -ROW * (rows + 0.6)
    ax.text(-1.3, 0.72, _wrap(chart.title, 120), fontsize=9, fontweight="bold", va="top", gid="title")
    for i, name in enumerate(chart.lifelines):
        ax.plot([x[name], x[name]], [0.05, bottom], color="#7a8796", linewidth=1, linestyle=(0, (4, 3)),
                gid=f"lifeline-{i}")
        ax.add_patch(FancyBboxPatch((x[name] - DX * 0.45, 0.08), DX * 0.9, 0.36, boxstyle="round,pad=0.02",
                                    facecolor="#e8eef6", edgecolor=NORMAL, linewidth=0.8, gid=f"lifeline-head-{i}"))
        ax.text(x[name], 0.26, _wrap(name, 26), ha="center", va="center", fontsize=7, color=NORMAL)
    y = -ROW * 0.6
    if chart.marked_step == 0:
        _mark(ax, chart, 0, y, x)
        y -= ROW
    last_of = {a.step: k for k, a in enumerate(chart.arrows)}
    for k, arrow in enumerate(chart.arrows):
        color = FAULT if arrow.fault else NORMAL
        gid = f"arrow-{k}-step-{arrow.step}" + ("-fault" if arrow.fault else "")
        ax.text(-1.3, y, str(arrow.step), va="center", fontsize=7, color="#555555")
        a, b = x[arrow.sender], x[arrow.receiver]
        if arrow.local:
            ax.add_patch(Rectangle((a - 0.09, y - 0.09), 0.18, 0.18, facecolor=color, edgecolor=color, gid=gid))
            ax.text(a + 0.16, y, arrow.label, va="center", fontsize=7, color=color)
        else:
            note = ax.annotate("", xy=(b, y), xytext=(a, y),
                               arrowprops={"arrowstyle": "-|>", "color": color, "linewidth": 1.1,
                                           "linestyle": "--" if arrow.fault else "-", "shrinkA": 0, "shrinkB": 0})
            note.arrow_patch.set_gid(gid)
            if arrow.fault:
                ax.plot([a], [y], marker="x", color=FAULT, markersize=6, gid=f"fault-mark-{k}")
            ax.text((a + b) / 2, y + 0.05, arrow.label, ha="center", va="bottom", fontsize=7, color=color)
        if arrow.step == chart.marked_step and last_of[arrow.step] == k:
            y -= ROW * 0.75
            _mark(ax, chart, arrow.step, y, x)
        y -= ROW
    if chart.marked_step and chart.marked_step not in last_of:
        _mark(ax, chart, chart.marked_step, y, x)
        y -= ROW
    if verdict:
        ax.text(-1.3, y - 0.1, verdict, va="top", fontsize=7.5, color=FAULT, gid="verdict")
        y -= 0.25 * (verdict.count("\n") + 1) + 0.2
    for note in chart.notes:
        ax.text(-1.3, y - 0.1, note, va="top", fontsize=7, color="#555555")
        y -= 0.3
    return fig


def _mark(ax: object, chart: SequenceChart, step: int, y: float, x: dict) -> None:
    left, right = -1.35, max(x.values(), default=0) + 1.2
    ax.add_patch(Rectangle((left, y - ROW * 0.35), right - left, ROW * 0.7, facecolor=MARK, edgecolor=FAULT,
                           linewidth=0.8, gid=f"violation-step-{step}"))
    ax.text(left + 0.1, y, f"!! {chart.check} fails here", va="center", fontsize=7.5, color=FAULT,
            fontweight="bold")


def draw_table(table: CaseTable) -> Figure:
    rows = [(name, _wrap(value, 70)) for name, value in table.rows]
    lines = sum(v.count("\n") + 1 for _, v in rows)
    verdict = _wrap(f"{table.check} fails: {table.verdict}", 110)
    height = 1.2 + 0.24 * (lines + 1) + 0.22 * (verdict.count("\n") + 1)
    fig = Figure(figsize=(9.0, height))
    ax = fig.add_axes((0.02, 0.02, 0.96, 1 - 0.75 / height))
    ax.axis("off")
    fig.text(0.02, 1 - 0.15 / height, _wrap(table.title, 110), fontsize=9, fontweight="bold", va="top", gid="title")
    tab = ax.table(cellText=[list(r) for r in rows] or [["case", "-"]], colLabels=["field", "value"],
                   cellLoc="left", colLoc="left", colWidths=[0.3, 0.7], bbox=(0, 0.22, 1, 0.74))
    tab.set_gid("case-table")
    tab.auto_set_font_size(False)
    tab.set_fontsize(7.5)
    ax.text(0, 0.12, verdict, transform=ax.transAxes, va="top", fontsize=7.5, color=FAULT, gid="verdict")
    return fig
