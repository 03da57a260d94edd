"""The pd-staging findings' pure parts on SGLang 0.5.23's own staging handler (`kvsim.conform.sglang.findings`).

Each target conforms to the model's decision (`models.pd_staging.decode_rules`) and reports its finding's
property as `finding confirmed` on the release, with the smallest failing input. Planted copies show the
differential and the properties can fail: a changed fan-in count diverges; the findings' proposed fix
(a distinct "scattered" entry that the dedupe answers) makes the late-REQ property hold and the
differential diverge (the model keeps upstream's rule).
"""

from __future__ import annotations

import os
import shutil

import pytest

from kvsim.conform.sglang.findings import HANDLER
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets
from kvsim.engine.conformance.result import FINDING


def _run(name, source):
    return run_target(select_targets("sglang", name)[0], source, RunOptions())


@pytest.fixture(scope="module")
def release():
    return resolve_source("sglang", version="0.5.23")


def _planted(tmp_path, release, edits):
    tree = tmp_path / "sglang-planted"
    shutil.copytree(release.root, tree, copy_function=os.link)
    target = tree / HANDLER
    text = target.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    target.unlink()
    target.write_text(text)
    return resolve_source("sglang", from_path=str(tree))


def test_the_findings_targets_are_declared_in_pd_staging():
    from kvsim.models.pd_staging.conform import CONFORM

    declared = {t.name: t.adapter for t in CONFORM}
    assert [declared[n] for n in ("staging-dedupe", "staging-fan-in", "staging-completion")] == [
        "kvsim.conform.sglang.findings:DEDUPE", "kvsim.conform.sglang.findings:FAN_IN",
        "kvsim.conform.sglang.findings:COMPLETION"]


@pytest.mark.parametrize("name, compared, prop, first", [
    ("staging-dedupe", 2352, "late_req_never_reallocates", {"geometry": 0, "ops": [["req", 0], ["scatter", 0],
                                                                                 ["req", 0]]}),
    ("staging-fan-in", 1540, "scatter_after_all_writers", {"layout": [2, 1, 1, 1], "writers": [0, 0],
                                                           "registered": True}),
    ("staging-completion", 466, "done_only_when_every_chunk_scattered", {"chunks": ["lost"], "all_success": True,
                                                                          "past_deadline": False, "registered": True}),
])
def test_each_finding_is_confirmed_on_0_5_23_while_the_target_conforms(release, name, compared, prop, first):
    result = _run(name, release)
    assert (result.status, result.compared, result.divergent) == ("conforms", compared, 0)
    [p] = result.properties
    assert p["property"] == prop and p["status"] == FINDING
    assert p["input"] == first  # the smallest failing input of the exhaustive sweep


def test_a_planted_fan_in_change_diverges(tmp_path, release):
    source = _planted(tmp_path, release, [("if len(arrivals) >= num_writers:", "if len(arrivals) > num_writers:")])
    result = _run("staging-fan-in", source)
    assert result.status == "diverges" and result.divergent == 1
    first = result.divergences[0]
    assert first["input"] == {"layout": [1, 1, 1, 1], "writers": [0], "registered": True}
    assert first["difference"] == "submits[0]: model true, upstream false"


def test_the_proposed_dedupe_fix_removes_the_finding_and_departs_from_the_model(tmp_path, release):
    source = _planted(tmp_path, release, [
        ("            decode_req._chunk_events.append((event, alloc_id))\n            chunk_infos[chunk_idx] = (-1, -1, 0, -1, 0)",
         "            decode_req._chunk_events.append((event, alloc_id))\n            chunk_infos[chunk_idx] = (-3, -1, 0, -1, 0)"),
        ("if chunk_idx < len(infos) and infos[chunk_idx][0] >= 0:",
         "if chunk_idx < len(infos) and infos[chunk_idx][0] == -3:\n        offset, rnd, end = -3, 0, -1\n"
         "    elif chunk_idx < len(infos) and infos[chunk_idx][0] >= 0:"),
    ])
    result = _run("staging-dedupe", source)
    [p] = result.properties
    assert p["status"] == "holds" and "not reproduced" in p["message"]
    assert result.status == "diverges"
    first = result.divergences[0]
    assert first["input"] == {"geometry": 0, "ops": [["req", 0], ["scatter", 0], ["req", 0]]}
    assert first["field"] == "[2].allocates"


def test_0_5_19_confirms_the_finding_and_0_5_17_has_another_handler_shape():
    r19 = _run("staging-completion", resolve_source("sglang", version="0.5.19"))
    assert r19.status == "conforms" and r19.properties[0]["status"] == FINDING  # torch.cuda.Event() there
    r17 = _run("staging-fan-in", resolve_source("sglang", version="0.5.17"))
    assert r17.status == "not present" and "chunk_writer_counts" in r17.note
