"""`kvsim show`: every catalog bug's counterexample drawn, checked by its structure, not its pixels.

The catalog is reproduced once for the module (`sources.reproduced` caches per process); each drawing is
rendered to text and to SVG, and the SVG's element ids (lifelines, arrows, faults, the marked step) are
counted against the chart and against the counterexample the explorer or Hypothesis found.
"""

from __future__ import annotations

import json
import re

import pytest

from kvsim.app import catalog
from kvsim.app.cli import main
from kvsim.app.show import sources
from kvsim.app.show.chart import CaseTable, SequenceChart, chart_hook, sequence_chart
from kvsim.app.show.draw import draw
from kvsim.app.show.text import render_text
from toys import Counter

REG = catalog.load()
WITH_SYSTEM = [m.name for m in REG.models.values() if m.system is not None]


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """bug id -> (repro result, drawing, text, svg text): every catalog bug, rendered once."""
    out = tmp_path_factory.mktemp("charts")
    table = {}
    for bug in REG.bugs.values():
        drawing = sources.of_bug(REG, bug)
        text = svg = None
        if drawing is not None:
            text = render_text(drawing)
            draw(drawing, str(out / f"{bug.id}.svg"))
            svg = (out / f"{bug.id}.svg").read_text()
        table[bug.id] = (sources.reproduced(bug), drawing, text, svg)
    return table


def _ids(svg: str, pattern: str) -> list[str]:
    return re.findall(rf'id="({pattern})"', svg)


def test_every_reproduced_bug_is_drawn_and_only_those(drawn):
    for bug_id, (repro, drawing, _, _) in drawn.items():
        assert (drawing is not None) == repro.reproduced, bug_id
    assert sum(d is None for _, d, _, _ in drawn.values()) == sum(
        b.status == "not reproducible" for b in REG.bugs.values())


def test_explored_bugs_are_sequence_charts_marked_where_the_invariant_fails(drawn):
    charts = 0
    for bug in REG.bugs.values():
        repro, chart, text, svg = drawn[bug.id]
        if bug.driver != "explore" or chart is None:
            continue
        charts += 1
        path = repro.counterexample["trace"]
        assert isinstance(chart, SequenceChart) and chart.actors == "model", bug.id
        system = REG.model(bug.model).build_system(bug.variant, dict(bug.params))
        assert chart.lifelines == tuple(chart_hook(system).lifelines(system)), bug.id
        # every step of the explorer's shortest path is on the chart, and the check fails after the last one
        assert chart.steps == len(path) and chart.marked_step == len(path), bug.id
        assert sorted({a.step for a in chart.arrows}) == list(range(1, len(path) + 1)), bug.id
        assert all(a.sender in chart.lifelines and a.receiver in chart.lifelines for a in chart.arrows)
        # the SVG: one line per lifeline, one element per arrow, faults marked, the step band
        assert len(_ids(svg, r"lifeline-\d+")) == len(chart.lifelines), bug.id
        assert len(_ids(svg, r"arrow-\d+-step-\d+(?:-fault)?")) == len(chart.arrows), bug.id
        assert len(_ids(svg, r"arrow-\d+-step-\d+-fault")) == len(chart.faults), bug.id
        assert _ids(svg, r"violation-step-\d+") == [f"violation-step-{len(path)}"], bug.id
        # the text: one row per arrow, the failing check under the last step
        rows = [line for line in text.splitlines() if re.match(r"\s+\d+  [|*<>xX-]", line)]
        assert len(rows) == len(chart.arrows), bug.id
        marker = "in the initial state" if not path else f"after step {len(path)}"
        assert f"!! {marker}: {bug.invariant} fails" in text, bug.id
    assert charts >= 30


def test_the_charts_name_upstream_actors_and_mark_faults(drawn):
    _, dup, _, _ = drawn["sglang-05c7ebf-staging-dup-ready"]
    assert dup.lifelines == ("prefill scheduler", "prefill writer 0 (transfer worker)",
                             "prefill writer 1 (transfer worker)", "decode (DecodeStagingHandler)")
    (fault,) = dup.faults
    assert fault.label.startswith("DUPLICATE CHUNK_READY") and fault.receiver == "decode (DecodeStagingHandler)"
    _, race, text, _ = drawn["sglang-pr35281-init-race"]
    assert "bootstrap thread" in race.lifelines and "decode thread" in race.lifelines
    last = race.arrows[-1]
    assert (last.sender, last.receiver, last.label, last.step) == ("decode scheduler", "bootstrap thread", "REG",
                                                                   race.marked_step)
    _, drop, _, _ = drawn["trtllm-17665-dropped-notification"]
    assert [a.label for a in drop.faults] == ["req 0: result frame LOST"]
    models = {b.model for b in REG.bugs.values() if isinstance(drawn[b.id][1], SequenceChart)}
    reported = {b.model for b in REG.bugs.values()}  # kv-cache-manager has a system and no bug report yet
    assert models == set(WITH_SYSTEM) & reported - {"swa-budget"}  # swa-budget's one bug is a data property


def test_data_property_bugs_are_tables_of_the_shrunk_input(drawn):
    tables = 0
    for bug in REG.bugs.values():
        repro, table, text, svg = drawn[bug.id]
        if table is None or not isinstance(table, CaseTable):
            continue
        tables += 1
        case = repro.counterexample["case"]
        assert [name.split(".")[0] for name, _ in table.rows][:1] == [next(iter(case))] if isinstance(case, dict) \
            else table.rows[0][0] == "case"
        assert 'id="case-table"' in svg and f"{bug.property} fails" in text, bug.id
    assert tables >= 10


def test_a_system_without_a_chart_hook_gets_one_lifeline_per_action_kind():
    system = Counter(limit=10, bad=6)
    chart = sequence_chart(system, 0, [("inc",), ("double",), ("inc",), ("double",), ("inc",)], title="toy",
                           check="not_bad", kind="invariant", verdict="6")  # 1, 2, 3, 6: the chart ends there
    assert chart_hook(system) is None and chart.actors == "action kinds"
    assert chart.lifelines == ("inc", "double") and chart.marked_step == chart.steps == 4
    assert [(a.step, a.sender, a.local) for a in chart.arrows] == [(1, "inc", True), (2, "double", True),
                                                                    (3, "inc", True), (4, "double", True)]


def test_show_command_text_svg_png_and_json(tmp_path, capsys):
    assert main(["show", "sglang-pr35281-init-race"]) == 0
    out = capsys.readouterr().out
    assert "bootstrap thread" in out and "!! after step 3: no_field_read_before_assignment fails" in out
    png = tmp_path / "race.png"
    assert main(["show", "sglang-pr35281-init-race", "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["show", "sglang-05c7ebf-staging-skip-pop", "--json"]) == 1  # not reproducible: nothing to draw
    assert json.loads(capsys.readouterr().out)["counterexample"] is None
    assert main(["show", "sglang-pr35281-init-race", "--out", str(tmp_path / "x.pdf"), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["field"] == "--out"


def test_show_from_saved_counterexamples_and_a_trace(tmp_path, capsys):
    saved = tmp_path / "explore.json"
    assert main(["explore", "pd-protocol", "--variant", "pre_35281", "--save", str(saved)]) == 1
    capsys.readouterr()
    assert main(["show", "--from", str(saved), "--json"]) == 0
    chart = json.loads(capsys.readouterr().out)
    found = json.loads(saved.read_text())
    assert chart["kind"] == "sequence" and chart["marked_step"] == len(found["trace"]) == chart["steps"]
    assert chart["check"] == found["invariant"]
    case = tmp_path / "check.json"
    assert main(["check", "swa-budget", "--variant", "pre_af7c62e", "--property",
                 "resumed_requests_fit_physical_pages", "--max-examples", "300", "--save", str(case)]) == 1
    capsys.readouterr()
    assert main(["show", "--from", str(case), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["kind"] == "table" and dict(table["rows"])["page_size"] == json.dumps(
        json.loads(case.read_text())["counterexample"]["case"]["page_size"])
    trace = tmp_path / "sim.jsonl"
    assert main(["simulate", "pipelined-transfer", "--faults", "drop=0.2", "--trace", str(trace)]) in (0, 1)
    capsys.readouterr()
    assert main(["show", "--from", str(trace), "--steps", "12", "--json"]) == 0
    chart = json.loads(capsys.readouterr().out)
    assert chart["lifelines"][0] == "context executor (PyExecutor)" and chart["actors"] == "model"
    assert len({a["step"] for a in chart["arrows"]}) == 12
    broken = tmp_path / "broken.jsonl"
    broken.write_text(trace.read_text().replace('"seed":0', '"seed":1', 1))
    assert main(["show", "--from", str(broken)]) == 2  # the re-run does not give the trace's digest
