"""Pictures of a counterexample's state, drawn as inline SVG (no dependency): `kvsim report` puts them on bug pages.

A model may have a picture hook, `<the model's package>.picture`, returning plain data:
`memory(case, variant)` for a data property's shrunk case (bars of bytes: kv-zeroing) and `blocks(system, state)`
for a path's failing state (a block pool: kv-cache-manager). `of_case` and `of_state` find the hook and draw it;
a model without one gets no picture.
"""

from __future__ import annotations

import importlib
from html import escape
from types import ModuleType
from typing import Any

WIDTH = 1100  # the picture's width in px (the report's pages fit 1400 px)
LABEL = 150  # the left margin holding each row's name
VIEW_COLORS = ("#4e79a7", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#86bcb6", "#d4a6c8")
PADDING = "#d0d4da"
TOUCHED, ASKED, OUTSIDE = "#e15759", "#2e7d32", "#c0392b"
BLOCK_COLORS = {"null": "#9aa3ad", "held": "#4e79a7", "cached": "#f28e2b", "free": "#e8eef6"}


def hook(package: str) -> ModuleType | None:
    """The model's picture module (`<package>.picture`), or None."""
    name = f"{package}.picture"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def _package(obj: Any) -> str:
    return type(obj).__module__.rpartition(".")[0]


def of_case(case: Any, variant: Any) -> str | None:
    """The memory picture of a data property's shrunk case (the hook found from the variant's package), or None."""
    module = hook(_package(variant)) if isinstance(case, dict) else None
    if module is None or not hasattr(module, "memory"):
        return None
    bars = module.memory(case, variant)
    return memory_svg(bars) if bars else None


def of_state(system: Any, state: Any, step: int) -> str | None:
    """The block-pool picture of a path's state after `step` actions, or None."""
    module = hook(_package(system))
    if module is None or not hasattr(module, "blocks"):
        return None
    pool = module.blocks(system, state)
    return blocks_svg(pool, step) if pool else None


def _svg(height: int, body: str, title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="picture" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" role="img" font-family="DejaVu Sans, sans-serif" font-size="12">'
            f"<title>{escape(title)}</title>{body}</svg>")


def _rect(x: float, y: float, w: float, h: float, fill: str, cls: str, tip: str, extra: str = "") -> str:
    return (f'<rect class="{cls}" x="{x:.2f}" y="{y}" width="{max(w, 0.8):.2f}" height="{h}" fill="{fill}"{extra}>'
            f"<title>{escape(tip)}</title></rect>")


def _text(x: float, y: float, text: str, extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y}"{extra}>{escape(text)}</text>'


def memory_svg(bars: list[dict[str, Any]]) -> str:
    """Each allocation as a bar of bytes: the views owning them (padding grey), the blocks asked for, the bytes
    the kernel touched, and a marker at the first byte written outside the blocks asked for."""
    layers = list(dict.fromkeys(name for bar in bars for _, _, name in bar["owners"] if name is not None))
    color = {name: VIEW_COLORS[i % len(VIEW_COLORS)] for i, name in enumerate(layers)}
    widest = max(bar["shown"] for bar in bars)
    scale = (WIDTH - LABEL - 20) / widest
    parts, y = [], 10
    legend = [(color[n], f"view {n}") for n in layers] + [(PADDING, "padding (no view)"),
                                                          (ASKED, "bytes of the blocks asked for"),
                                                          (TOUCHED, "bytes the kernel wrote")]
    x = 10
    for fill, name in legend:
        parts.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{fill}"/>' + _text(x + 16, y + 11, name))
        x += 28 + 7 * len(name)
    y += 30
    for bar in bars:
        size, shown = bar["size"], bar["shown"]
        parts.append(f'<g class="allocation" data-label="{escape(bar["label"])}">')
        parts.append(_text(10, y + 12, f"{bar['label']} ({size} B)", ' font-weight="bold"'))
        rows = (("owned", [(s, e, color[n] if n is not None else PADDING, f"view {n}" if n is not None else
                            "padding") for s, e, n in bar["owners"]]),
                ("asked for", [(s, e, ASKED, "block asked for") for s, e in bar["asked"]]),
                ("kernel wrote", [(s, e, TOUCHED, "written") for s, e in bar["touched"]]))
        for row, (name, spans) in enumerate(rows):
            top = y + 20 + 22 * row
            parts.append(_text(10, top + 13, name, ' fill="#555"'))
            parts.append(f'<rect x="{LABEL}" y="{top}" width="{size * scale:.2f}" height="16" fill="none" '
                         'stroke="#8a96a3"/>')
            if shown > size:  # what the kernel wrote past the end: the red zone between allocations
                parts.append(f'<rect class="past-end" x="{LABEL + size * scale:.2f}" y="{top}" '
                             f'width="{(shown - size) * scale:.2f}" height="16" fill="none" stroke="{OUTSIDE}" '
                             'stroke-dasharray="3 2"/>')
            cls = {"owned": "owner", "asked for": "asked", "kernel wrote": "touched"}[name]
            for s, e, fill, tip in spans:
                extra = ' data-padding="1"' if tip == "padding" else ""
                parts.append(_rect(LABEL + s * scale, top, (e - s) * scale, 16, fill, cls,
                                   f"{tip}: bytes {s}..{e}", extra))
        bottom = y + 20 + 22 * 3
        parts.append(_text(LABEL, bottom + 10, "0", ' fill="#555" font-size="10"'))
        parts.append(_text(LABEL + size * scale, bottom + 10, str(size), ' fill="#555" font-size="10" '
                                                                          'text-anchor="middle"'))
        if bar["first_outside"] is not None:
            offset, who = bar["first_outside"]
            mx = LABEL + offset * scale
            parts.append(f'<g class="first-outside"><line x1="{mx:.2f}" y1="{y + 16}" x2="{mx:.2f}" y2="{bottom}" '
                         f'stroke="{OUTSIDE}" stroke-width="2"/><polygon points="{mx - 6:.2f},{y + 8} '
                         f'{mx + 6:.2f},{y + 8} {mx:.2f},{y + 17}" fill="{OUTSIDE}"/>'
                         + _text(min(mx + 8, WIDTH - 420), y + 12, f"first byte outside: {offset} = {who}",
                                 f' fill="{OUTSIDE}"') + "</g>")
        parts.append("</g>")
        y = bottom + 24
    return _svg(y, "".join(parts), "memory of the allocations: owned, padding, asked for, written")


def blocks_svg(pool: dict[str, Any], step: int) -> str:
    """The block pool at step `step`: each block by id (held, cached, free, null; ref_cnt and the requests
    holding it), and the free queue from its front (evicted first) to its back."""
    cell, gap = 64, 6
    per_row = (WIDTH - 20) // (cell + gap)
    parts = [_text(10, 16, f"block pool after step {step}", ' font-weight="bold"')]
    x = 10
    for kind, fill in BLOCK_COLORS.items():
        parts.append(f'<rect x="{x + 230}" y="5" width="12" height="12" fill="{fill}" stroke="#8a96a3"/>'
                     + _text(x + 246, 16, kind))
        x += 90
    parts.append(f'<rect x="{x + 230}" y="5" width="12" height="12" fill="none" stroke="#f28e2b" stroke-width="3"/>'
                 + _text(x + 246, 16, "in the cached map"))
    y = 30
    for i, b in enumerate(pool["blocks"]):
        bx, by = 10 + (i % per_row) * (cell + gap), y + (i // per_row) * (cell + gap)
        who = ", ".join(f"req {r}" for r in b["requests"])
        tip = f"block {b['id']}: {b['kind']}, ref_cnt {b['ref']}" + (", in the cached map" if b["cached"] else "") \
            + (f", held by {who}" if who else "")
        stroke = ' stroke="#f28e2b" stroke-width="3"' if b["cached"] else ' stroke="#8a96a3"'
        ink = ' fill="#fff"' if b["kind"] == "held" else ""
        parts.append(f'<g class="block" data-kind="{b["kind"]}" data-id="{b["id"]}">'
                     + _rect(bx, by, cell, cell, BLOCK_COLORS[b["kind"]], "block-cell", tip, stroke)
                     + _text(bx + 6, by + 16, f"#{b['id']}", f' font-weight="bold"{ink}')
                     + _text(bx + 6, by + 32, f"ref {b['ref']}", f' font-size="11"{ink}')
                     + _text(bx + 6, by + 48, who[:10], f' font-size="10"{ink}') + "</g>")
    y += ((len(pool["blocks"]) + per_row - 1) // per_row) * (cell + gap) + 16
    parts.append(_text(10, y + 12, "free queue (front: evicted first)", ' font-weight="bold"'))
    y += 20
    qcell = 40
    kinds = {b["id"]: b["kind"] for b in pool["blocks"]}
    for i, block in enumerate(pool["free_queue"]):
        qx, qy = 10 + (i % 24) * (qcell + 4), y + (i // 24) * (qcell // 2 + 12)
        parts.append(f'<g class="queued" data-id="{block}">'
                     + _rect(qx, qy, qcell, qcell // 2 + 4, BLOCK_COLORS.get(kinds.get(block, "free"), "#fff"),
                             "queue-cell", f"free queue position {i}: block {block}", ' stroke="#8a96a3"')
                     + _text(qx + 8, qy + 17, f"#{block}") + "</g>")
    if not pool["free_queue"]:
        parts.append(_text(10, y + 16, "(empty)"))
    y += ((max(len(pool["free_queue"]), 1) + 23) // 24) * (qcell // 2 + 12) + 10
    return _svg(y, "".join(parts), f"block pool after step {step}")
