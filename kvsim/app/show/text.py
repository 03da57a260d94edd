"""A counterexample as text: the sequence chart in columns (one per lifeline), or the case as a table.

    step  prefill writer 0   decode
       1  |---------------->|       STAGING_REQ r0 c0
       2  x~~~~~~~~~~~~~~~~~|       DROP STAGING_RSP r0 c0      (fault)
    !! after step 2: suffix_rows_match_prefill fails: ...
"""

from __future__ import annotations

from .chart import CaseTable, SequenceChart

COLUMN = 14  # characters between two lifelines


def chart_text(chart: SequenceChart) -> str:
    names = chart.lifelines
    col = {name: i for i, name in enumerate(names)}
    width = COLUMN * (len(names) - 1) + 1
    lines = [chart.title, f"must fail: {chart.check}" if chart.check else "", "lifelines:"]
    lines += [f"  {chr(65 + i) if i < 26 else i}  {name}" for i, name in enumerate(names)]
    head = "".join(f"{chr(65 + i) if i < 26 else '?':<{COLUMN}}" for i in range(len(names)))[:width]
    lines.append(f"{'step':>5}  {head}")
    if chart.marked_step == 0:
        lines.append(_mark(chart, 0))
    for arrow in chart.arrows:
        row = [" "] * width
        for i in range(len(names)):
            row[i * COLUMN] = "|"
        a, b = col[arrow.sender] * COLUMN, col[arrow.receiver] * COLUMN
        if arrow.local:
            row[a] = "X" if arrow.fault else "*"
        else:
            lo, hi = min(a, b), max(a, b)
            for x in range(lo + 1, hi):
                row[x] = "~" if arrow.fault else "-"
            row[b] = ">" if b > a else "<"
            if arrow.fault:
                row[a] = "x"
        tail = "   (fault)" if arrow.fault else ""
        lines.append(f"{arrow.step:>5}  {''.join(row)}   {arrow.label}{tail}")
        if arrow.step == chart.marked_step and arrow is _last_of_step(chart, arrow.step):
            lines.append(_mark(chart, arrow.step))
    if chart.marked_step is not None and chart.marked_step > 0 and not any(
            a.step == chart.marked_step for a in chart.arrows):
        lines.append(_mark(chart, chart.marked_step))
    lines += [f"note: {n}" for n in chart.notes]
    if chart.replay:
        lines.append(f"replay: {chart.replay}")
    return "\n".join(line for line in lines if line != "")


def _last_of_step(chart: SequenceChart, step: int) -> object:
    return [a for a in chart.arrows if a.step == step][-1]


def _mark(chart: SequenceChart, step: int) -> str:
    where = "in the initial state" if step == 0 else f"after step {step}"
    return f"   !! {where}: {chart.check} fails: {chart.verdict}"


def table_text(table: CaseTable) -> str:
    width = max([len(name) for name, _ in table.rows] + [5])
    lines = [table.title, f"must fail: {table.check}", f"{'field':<{width}}  value", f"{'-' * width}  -----"]
    lines += [f"{name:<{width}}  {value}" for name, value in table.rows]
    lines.append(f"!! {table.check} fails: {table.verdict}")
    lines += [f"note: {n}" for n in table.notes]
    if table.replay:
        lines.append(f"replay: {table.replay}")
    return "\n".join(lines)


def render_text(drawing: SequenceChart | CaseTable) -> str:
    return chart_text(drawing) if isinstance(drawing, SequenceChart) else table_text(drawing)
