"""`kvsim report --out DIR`: the catalog, every bug report and its counterexample chart, as a static site.

One self-contained folder (relative links, one stylesheet, SVG charts; no script, no web font, no
server): `index.html` (models, variants, properties, the bug table), `bugs/ID.html` (status, upstream
source and sites, release verdicts, the counterexample drawn by `kvsim show`, the replay command),
`conform.html` (the results of `kvsim conform ... --json` files given with `--conform`) and
`bench.html` (benchmark results given with `--bench`, each a table and a bar chart). Each bug is
reproduced once (`show.sources.reproduced`), which gives both its status and its counterexample.

The charts are drawn with matplotlib, the `charts` extra. Without it the site is written without them:
each counterexample as text, and the index, each bug page and the command's output say so and name the
extra to install (`CHARTS_MISSING`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from html import escape
from typing import Any, Callable, ContextManager, Sequence

from ..engine.canon import canonical_json
from ..engine.errors import ConfigError
from ..engine.interrupt import BudgetExceeded, Interrupted
from ..engine.registry import BugReport, Registry
from .repro import release_verdicts
from .show import sources
from .show.chart import CaseTable, SequenceChart
from .show.text import render_text

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; margin: 0; color: #1d2733; }
header { background: #1f3a5f; color: #fff; padding: 12px 24px; }
header a { color: #fff; margin-right: 18px; text-decoration: none; font-weight: 600; }
*, *::before, *::after { box-sizing: border-box; }
main { padding: 16px 24px; max-width: 1400px; }
table { border-collapse: collapse; margin: 8px 0 20px; font-size: 14px; max-width: 100%; }
th, td { border: 1px solid #c9d2dc; padding: 4px 8px; text-align: left; vertical-align: top; overflow-wrap: break-word; }
td:last-child { overflow-wrap: anywhere; }  /* a long note or value wraps there, not off the page */
table.nested { margin: 0; font-size: 13px; }
table.nested th, table.nested td { padding: 2px 6px; }
table.nested th { background: #f2f5f9; font-weight: 600; }
svg.picture { max-width: 100%; height: auto; border: 1px solid #c9d2dc; background: #fff; }
th { background: #e8eef6; }
code, pre { font-family: "DejaVu Sans Mono", monospace; font-size: 13px; }
pre { background: #f5f7fa; padding: 8px; overflow-x: auto; }
.status { padding: 1px 6px; border-radius: 3px; font-size: 12px; white-space: nowrap; }
.reproducible { background: #fde2e1; } .open { background: #fff0c2; } .not { background: #e3e8ee; }
.holds { color: #1e7d32; font-weight: 600; } .broken { color: #c0392b; font-weight: 600; }
img.chart { max-width: 100%; border: 1px solid #c9d2dc; background: #fff; }
"""
CHARTS_MISSING = "no charts: matplotlib is not installed (pip install 'kvsim[charts]')"


@dataclass
class SiteResult:
    out: str
    pages: list[str] = field(default_factory=list)
    charts: list[str] = field(default_factory=list)
    bugs: int = 0
    holding: int = 0
    seconds: float = 0.0
    bytes: int = 0
    without_charts: str | None = None  # why the site has no charts (CHARTS_MISSING), if it has none
    not_run: list[str] = field(default_factory=list)  # the bug reports --max-seconds left out

    def to_json(self) -> dict[str, Any]:
        return {"out": self.out, "pages": self.pages, "charts": self.charts, "bugs": self.bugs,
                "holding": self.holding, "seconds": round(self.seconds, 3), "bytes": self.bytes,
                "without_charts": self.without_charts, "complete": not self.not_run,
                "stopped_by": "max-seconds" if self.not_run else None, "not_run": self.not_run}


def drawing_function() -> Callable[..., None] | None:
    """`show.draw.draw` (importing matplotlib), or None where matplotlib is not installed."""
    if not can_draw():
        return None
    from .show.draw import draw  # matplotlib: only to write a report or a chart

    return draw


def can_draw() -> bool:
    """Whether matplotlib (the `charts` extra) is installed."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # a module entry of None (hidden) or without a spec
        return False


def _page(title: str, body: str, depth: int = 0) -> str:
    up = "../" * depth
    nav = "".join(f'<a href="{up}{href}">{name}</a>' for name, href in
                  (("Catalog", "index.html"), ("Bugs", "index.html#bugs"), ("Conformance", "conform.html"),
                   ("Benchmarks", "bench.html")))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<link rel="stylesheet" href="{up}style.css"></head>\n<body><header>{nav}</header><main>'
            f"<h1>{escape(title)}</h1>\n{body}\n</main></body></html>\n")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Cells are HTML already (escape text before)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>\n" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>"


def _status(status: str) -> str:
    return f'<span class="status {status.split()[0]}">{escape(status)}</span>'


def _write(path: str, text: str, result: SiteResult) -> None:
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise ConfigError("--out", "a writable folder", os.path.dirname(path), exc.strerror or "") from None
    result.pages.append(os.path.relpath(path, result.out))


def _load_json(flag: str, path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise ConfigError(flag, what, path, exc.strerror or "") from None
    except (ValueError, RecursionError):
        raise ConfigError(flag, what, path, "not JSON") from None


def build_site(out: str, registry: Registry, *, seed: int = 0, conform: Sequence[str] = (),
               bench: Sequence[str] = (), progress: Callable[[str], None] | None = None,
               on_stop: Callable[[], None] | None = None, spent: Callable[[], bool] = lambda: False,
               setup: Callable[[], ContextManager[Any]] = nullcontext,
               batch: Callable[[list[BugReport]], tuple[list[Any], str | None]] | None = None) -> SiteResult:
    """Write the site to `out`. Where the command's --max-seconds runs out (`BudgetExceeded`) while the bug reports
    are reproduced, the site is written with those done so far and names the rest (`not_run`); `on_stop` is
    called then, and once every report ran (the command line disarms its time limit: the pages that follow are
    not cut short). `setup`: what the folders, the inputs and the style sheet are made under (the command line
    holds an alarm there); `spent()`: whether it ran out before a report starts (the rest are not reproduced).
    `batch(bugs)`: the reproductions made ahead, after the inputs are checked (the command line's forked workers):
    (the results made, in order, and what stopped it: "max-seconds", "interrupt" or None); a report it did not
    make is then not run (a stop) or reproduced here (a worker's error, raised here as it was there)."""
    start = time.perf_counter()
    with setup():
        draw = drawing_function()
        conform_docs = [(p, _conform_doc(p)) for p in conform]  # bad input is refused before any work
        bench_docs = [(p, _load_json("--bench", p, "a benchmark's JSON results")) for p in bench]
        for sub in ("", "bugs", "charts", "figures"):
            try:
                os.makedirs(os.path.join(out, sub), exist_ok=True)
            except OSError as exc:
                raise ConfigError("--out", "a folder that can be created", out, exc.strerror or "") from None
        result = SiteResult(out, without_charts=None if draw is not None else CHARTS_MISSING)
        _write(os.path.join(out, "style.css"), STYLE.lstrip(), result)
    rows = []
    bugs = list(registry.bugs.values())
    made, stopped = batch(bugs) if batch is not None else ([], None)
    for repro in made:
        sources.remember(repro, seed)
    for i, bug in enumerate(bugs):
        try:
            if spent() or (stopped == "max-seconds" and not sources.known(bug, seed)):
                raise BudgetExceeded()
            if stopped is not None and not sources.known(bug, seed):
                raise Interrupted()
            if progress is not None:
                progress(bug.id)
            repro = sources.reproduced(bug, seed, registry)
            drawing = sources.of_bug(registry, bug, seed)
            chart = None
            if drawing is not None and draw is not None:
                chart = f"charts/{bug.id}.svg"
                draw(drawing, os.path.join(out, chart))
                result.charts.append(chart)
            svg = sources.picture_of_bug(registry, bug, seed)
            _write(os.path.join(out, "bugs", f"{bug.id}.html"), _bug_page(bug, repro, drawing, chart, seed, svg),
                   result)
        except BudgetExceeded:  # the site is written with the reports done so far
            if on_stop is not None:
                on_stop()
            result.not_run = [b.id for b in bugs[i:]]
            break
        result.bugs += 1
        result.holding += repro.ok
        rows.append(_bug_row(bug, repro))
    else:
        if on_stop is not None:  # every report ran: the pages below are written whole
            on_stop()
    _write(os.path.join(out, "index.html"), _index(registry, rows, result), result)
    _write(os.path.join(out, "conform.html"), _conform_page(conform_docs), result)
    _write(os.path.join(out, "bench.html"), _bench_page(bench_docs, out, draw, result), result)
    result.seconds = time.perf_counter() - start
    result.bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(out) for f in files)
    return result


def _bug_row(bug: BugReport, repro: Any) -> list[str]:
    return [f'<a href="bugs/{escape(bug.id)}.html">{escape(bug.id)}</a>', escape(bug.model), escape(bug.variant),
            f"<code>{escape(bug.check)}</code>", _status(bug.status), "yes" if repro.reproduced else "no",
            {True: "yes", False: "NO", None: "-"}[repro.fixed_passes],
            '<span class="holds">holds</span>' if repro.ok else '<span class="broken">BROKEN</span>']


def _index(registry: Registry, rows: list[list[str]], result: SiteResult) -> str:
    models = [[f"<b>{escape(m.name)}</b>", escape(m.summary), escape(m.source),
               ", ".join(f"<code>{escape(v)}</code>" for v in m.variants.names),
               "yes" if m.system else "-", "yes" if m.simulate else "-"] for m in registry.models.values()]
    props = "".join(f"<details><summary><b>{escape(m.name)}</b>: {len(registry.properties_of(m.name))} "
                    "properties</summary><ul>" + "".join(f"<li><code>{escape(p.name)}</code> ({escape(p.kind)})</li>"
                                                          for p in registry.properties_of(m.name))
                    + "</ul></details>" for m in registry.models.values())
    missing = f"<p><b>{escape(result.without_charts)}</b>: the counterexamples are shown as text.</p>" \
        if result.without_charts else ""
    if result.not_run:
        missing += (f"<p><b>INCOMPLETE</b>: --max-seconds ran out; not reproduced: "
                    f"{escape(', '.join(result.not_run))}.</p>")
    body = (f"<p>{len(registry.models)} models, {len(registry.properties)} properties, {result.bugs} bug reports "
            f"({result.holding} hold).</p>{missing}<h2>Models</h2>"
            + _table(["model", "summary", "upstream source", "variants", "explore", "simulate"], models)
            + f"<h2>Properties</h2>{props}<h2 id=\"bugs\">Bug reports</h2>"
            + _table(["bug", "model", "variant", "must fail", "status", "reproduced", "fixed passes", "verdict"], rows))
    return _page("kvsim catalog", body)


def _bug_page(bug: BugReport, repro: Any, drawing: SequenceChart | CaseTable | None, chart: str | None,
              seed: int, picture: str | None = None) -> str:
    facts = [["model", escape(bug.model)], ["variant where it fails", f"<code>{escape(bug.variant)}</code>"],
             ["must fail", f"<code>{escape(bug.check)}</code> ({'property, Hypothesis' if bug.property else 'explore'})"],
             ["status", _status(bug.status)], ["upstream source", escape(bug.source)],
             ["upstream releases", escape(release_verdicts(bug))],
             ["reproduced", f"{'yes' if repro.reproduced else 'no'} ({repro.examples} "
                            f"{'examples' if bug.property else 'states'}, {repro.seconds:.3f} s)"],
             ["passes on the fix", {True: "yes", False: "NO", None: "-"}[repro.fixed_passes]]]
    for label, value in (("harm", bug.harm), ("affected", bug.affected), ("consequence", bug.consequence),
                         ("smallest fix", bug.fix), ("note", bug.note)):
        if value:
            facts.append([label, escape(value)])
    sites = "".join(f"<li><code>{escape(s.path)}</code>: {escape(', '.join(s.functions))}"
                    f"{' &mdash; ' + escape(s.role) if s.role else ''}</li>" for s in bug.upstream_files)
    replay = f"kvsim repro {bug.id}" + (f" --seed {seed}" if seed else "")
    body = f"<p>{escape(bug.summary)}</p>" + _table(["", ""], facts)
    if sites:
        body += f"<h2>Upstream code</h2><ul>{sites}</ul>"
    body += f"<h2>Replay</h2><pre>{escape(replay)}\nkvsim show {escape(bug.id)} --out {escape(bug.id)}.svg</pre>"
    body += "<h2>Counterexample</h2>"
    if drawing is None:
        body += f"<p>No counterexample: the check does not fail on <code>{escape(bug.variant)}</code>.</p>"
    elif chart is None:  # matplotlib is not installed: the drawing as text
        body += f"<p>{escape(CHARTS_MISSING)}.</p><pre>{escape(render_text(drawing))}</pre>"
    else:
        kind = "sequence chart" if isinstance(drawing, SequenceChart) else "shrunk input"
        body += (f'<p><img class="chart" src="../{escape(chart)}" alt="{kind} of {escape(bug.id)}"></p>'
                 f"<details><summary>as text</summary><pre>{escape(render_text(drawing))}</pre></details>")
    if isinstance(drawing, CaseTable):
        body += "<h3>Shrunk input</h3>" + _table(["field", "value"], [[f"<code>{escape(name)}</code>",
                                                                       _nested(_parsed(value))]
                                                                      for name, value in drawing.rows])
    if picture is not None:
        body += f'<h2>Picture</h2><div class="picture">{picture}</div>'
    return _page(bug.id, body, depth=1)


def _parsed(value: str) -> Any:
    """A table cell's JSON text as its value (a nested field), or the text itself."""
    if value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            pass
    return value


def _nested(value: Any) -> str:
    """A value as HTML: an object as a table of its fields, a list of objects as a table with a row each, a list
    of scalars inline; nested to any depth."""
    if isinstance(value, dict) and value:
        return '<table class="nested"><tbody>' + "".join(f"<tr><th>{escape(str(k))}</th><td>{_nested(v)}</td></tr>"
                                                        for k, v in value.items()) + "</tbody></table>"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        columns = list(dict.fromkeys(k for v in value for k in v))
        return ('<table class="nested"><thead><tr>' + "".join(f"<th>{escape(str(c))}</th>" for c in columns)
                + "</tr></thead><tbody>" + "".join("<tr>" + "".join(f"<td>{_nested(v.get(c, ''))}</td>"
                                                                    for c in columns) + "</tr>" for v in value)
                + "</tbody></table>")
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "<ol start=\"0\">" + "".join(f"<li>{_nested(v)}</li>" for v in value) + "</ol>"
    if isinstance(value, list):
        return f"<code>[{escape(', '.join(_cell(v) for v in value))}]</code>"
    return escape(value if isinstance(value, str) else canonical_json(value))


def _conform_doc(path: str) -> dict:
    doc = _load_json("--conform", path, "the output of kvsim conform ... --json")
    if not isinstance(doc, dict) or not (isinstance(doc.get("results"), list) or isinstance(doc.get("table"), dict)):
        raise ConfigError("--conform", "the output of kvsim conform ... --json (with results or a release table)",
                          path)
    return doc


def _conform_page(docs: list[tuple[str, dict]]) -> str:
    if not docs:
        return _page("Conformance", "<p>No conformance results given (<code>kvsim report --conform FILE</code> "
                                    "takes the output of <code>kvsim conform ENGINE --json</code>).</p>")
    body = ""
    for path, doc in docs:
        results = doc.get("results")
        if results is None:  # the --versions release table: target -> version -> result
            results = [{**r, "version": v, "target": t} for t, row in doc["table"].items() for v, r in row.items()
                       if isinstance(r, dict)]
        engine = str(doc.get("engine") or "")
        results = [r for r in results if isinstance(r, dict)]
        rows = [[escape(str(r.get("target", ""))),
                 escape(_version(r.get("version") or doc.get("version"), engine, r.get("subject"))),
                 _status(str(r.get("status", ""))), escape(str(r.get("compared", ""))),
                 escape(str(r.get("divergent", ""))),
                 escape(", ".join(f"{p.get('property')}: {p.get('status')}" for p in r.get("properties") or [])),
                 escape(str(r.get("note", ""))[:300])] for r in results]
        body += (f"<h2>{escape(engine)} {escape(_version(doc.get('version'), engine, None))}</h2>"
                 f"<p>from <code>{escape(os.path.basename(path))}</code></p>"
                 + _table(["target", "version", "status", "compared", "divergent", "properties", "note"], rows))
        for r in results:
            subject = str(r.get("subject") or "upstream")
            for n, d in enumerate(r.get("divergences") or [], start=1):
                fields = {k: v for k, v in d.items() if k not in ("model", "upstream") and v not in ("", None)}
                fields.update({"model": d.get("model"), subject: d.get("upstream")})
                body += (f"<h3>{escape(str(r.get('target', '')))}: divergence {n}</h3>"
                         + _table(["field", "value"], [[escape(k), _nested(v)] for k, v in fields.items()]))
    return _page("Conformance", body)


def _version(version: Any, engine: str, subject: Any) -> str:
    """A version named one way: the bare release ("0.33.0", not "vllm 0.33.0"); the user's own tree (`--from`)
    as the code under test."""
    text = str(version or "")
    if engine and text.lower().startswith(engine.lower() + " "):
        text = text[len(engine) + 1:]
    if subject == "code under test":
        return f"code under test {text}".strip()
    return text


def _bench_rows(doc: Any) -> list[tuple[str, list[dict]]]:
    """The tables in a benchmark's JSON: a list of row objects, or an object holding such lists."""
    if isinstance(doc, list) and doc and all(isinstance(r, dict) for r in doc):
        return [("results", doc)]
    if isinstance(doc, dict):
        tables = [(k, v) for k, v in doc.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
        scalars = [{"name": k, "value": v} for k, v in doc.items() if not isinstance(v, (list, dict))]
        return tables + ([("summary", scalars)] if scalars else [])
    return []


def _bench_page(docs: list[tuple[str, Any]], out: str, draw_fn: Any, result: SiteResult) -> str:
    if not docs:
        return _page("Benchmarks", "<p>No benchmark results given (<code>kvsim report --bench FILE</code> takes a "
                                   "benchmark's JSON output, e.g. <code>python benchmarks/bench_explore_scale.py "
                                   "--json FILE</code>).</p>")
    body = ""
    for i, (path, doc) in enumerate(docs):
        body += f"<h2>{escape(os.path.basename(path))}</h2>"
        tables = _bench_rows(doc)
        if not tables:
            body += f"<pre>{escape(canonical_json(doc)[:4000])}</pre>"
        for j, (name, rows) in enumerate(tables):
            columns = list(dict.fromkeys(k for r in rows for k in r))
            body += f"<h3>{escape(name)}</h3>" + _table(columns, [[escape(_cell(r.get(c))) for c in columns]
                                                                  for r in rows])
            figure = None if draw_fn is None else _bench_figure(rows, columns, os.path.join(
                out, "figures", f"bench-{i}-{j}.svg"), name)
            if figure:
                result.charts.append(os.path.relpath(figure, out))
                body += f'<p><img class="chart" src="figures/{os.path.basename(figure)}" alt="{escape(name)}"></p>'
    return _page("Benchmarks", body)


def _cell(value: Any) -> str:
    return value if isinstance(value, str) else canonical_json(value)


def _bench_figure(rows: list[dict], columns: list[str], path: str, name: str) -> str | None:
    """A bar chart of the first numeric column against the first text column (or the row number)."""
    numeric = [c for c in columns if all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool)
                                         for r in rows)]
    if not numeric or len(rows) > 60:
        return None
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    text = next((c for c in columns if c not in numeric), None)
    value = next((c for c in numeric if c != "value"), numeric[0]) if text != "name" else numeric[0]
    labels = [_cell(r.get(text)) if text else str(k) for k, r in enumerate(rows)]
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "kvsim", "font.size": 8}):
        fig = Figure(figsize=(8, 0.3 * len(rows) + 1.2))
        ax = fig.add_axes((0.35, 0.12, 0.6, 0.78))
        ax.barh(range(len(rows)), [r[value] for r in rows], color="#1f3a5f")
        ax.set_yticks(range(len(rows)), [label[:50] for label in labels])
        ax.invert_yaxis()
        ax.set_xlabel(value)
        ax.set_title(name)
        fig.savefig(path, format="svg", metadata={"Date": None})
    return path
