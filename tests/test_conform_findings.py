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

from kvsim.conform.report import run_target
from kvsim.conform.sglang.findings import FINDING, HANDLER
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import ADAPTER_MODULES, RunOptions, select_targets


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


def test_the_findings_module_is_an_sglang_adapter():
    assert "kvsim.conform.sglang.findings" in ADAPTER_MODULES["sglang"]


@pytest.mark.parametrize("name, compared, prop, first", [
    ("staging-dedupe", 340, "late_req_never_reallocates", "[['req', 0], ['scatter', 0], ['req', 0]]"),
    ("staging-fan-in", 1514, "scatter_after_all_writers", "{'tp_writers': 2, 'pp_writers': 1, 'writers': [0, 0]}"),
    ("staging-completion", 168, "done_only_when_every_chunk_scattered", "{'chunk_states': [0], 'all_success': True}"),
])
def test_each_finding_is_confirmed_on_0_5_23_while_the_target_conforms(release, name, compared, prop, first):
    result = _run(name, release)
    assert (result.status, result.compared, result.divergent) == ("conforms", compared, 0)
    [p] = result.properties
    assert p["property"] == prop and p["status"] == FINDING
    assert p["message"].endswith(f"first failing input {first}")


def test_a_planted_fan_in_change_diverges(tmp_path, release):
    source = _planted(tmp_path, release, [("if len(arrivals) >= num_writers:", "if len(arrivals) > num_writers:")])
    result = _run("staging-fan-in", source)
    assert result.status == "diverges" and result.divergent > 0
    assert result.divergences[0]["input"] == {"tp_writers": 1, "pp_writers": 1, "writers": [0]}


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
    assert result.divergences[0]["input"] == {"ops": [["req", 0], ["scatter", 0], ["req", 0]]}


def test_0_5_19_confirms_the_finding_and_0_5_17_has_another_handler_shape():
    r19 = _run("staging-completion", resolve_source("sglang", version="0.5.19"))
    assert r19.status == "conforms" and r19.properties[0]["status"] == FINDING  # torch.cuda.Event() there
    r17 = _run("staging-fan-in", resolve_source("sglang", version="0.5.17"))
    assert r17.status == "not present" and "chunk_writer_counts" in r17.note
