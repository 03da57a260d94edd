"""kvsim conform flashinfer against the real flashinfer-python 0.7.4 wheel (cached; a failed download fails
the test)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvsim.conform import cli, source as source_module
from kvsim.conform.flashinfer.merge import TEMPLATES
from kvsim.conform.flashinfer.metadata import PLANNING
from kvsim.conform.flashinfer.selection import POLICY
from kvsim.conform.report import run_target
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, select_targets


@pytest.fixture(scope="module")
def fi_src():
    return resolve_source("flashinfer", version="0.7.4")


def _run(name, source, n=40):
    return run_target(select_targets("flashinfer", name)[0], source, RunOptions(max_examples=n))


def test_the_wheel_is_fetched_once_and_only_python_is_unpacked(fi_src, monkeypatch):
    assert fi_src.version == "0.7.4" and "flashinfer-python==0.7.4" in fi_src.origin
    assert (fi_src.root / "flashinfer" / "mla" / "_batch_mla" / "_planning.py").is_file()
    wheels = list((source_module.cache_root() / "wheels" / "flashinfer-0.7.4").glob("*.whl"))
    assert [w.name for w in wheels] == ["flashinfer_python-0.7.4-py3-none-any.whl"]
    others = [p for p in (fi_src.root / "flashinfer" / "mla").rglob("*") if p.is_file() and p.suffix != ".py"]
    assert others == []

    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran again")

    monkeypatch.setattr(source_module.subprocess, "run", no_pip)
    assert resolve_source("flashinfer").root == fi_src.root  # the cache answers; no second download


def test_merge_references_follow_the_unguarded_merge_and_4051_reproduces(fi_src):
    result = _run("merge-references", fi_src)
    assert result.status == "conforms" and result.divergent == 0 and result.compared == 4 * 41, result
    props = {p["property"]: p["status"] for p in result.properties}
    assert props == {"merge_is_commutative": "holds", "merge_identity_is_empty_state": "holds",
                     "merged_lse_at_least_max": "holds", "empty_states_merge_to_empty": "finding confirmed"}


def test_triton_merges_follow_the_model_and_the_empty_state_findings_reproduce(fi_src):
    result = _run("triton-merges", fi_src, n=12)
    assert result.status == "conforms" and result.divergent == 0 and result.compared == 4 * 13, result
    [prop] = result.properties
    assert prop["status"] == "finding confirmed" and "NaN" in prop["message"]


def test_metadata_capabilities_and_auto_order_conform(fi_src):
    for name, at_least in (("metadata", 200), ("capabilities", 9 + 9 * 40), ("auto-order", 8 * 40),
                           ("selection-loops", 20), ("run-inputs", 96), ("run-contract", 40)):
        result = _run(name, fi_src)
        assert result.status == "conforms" and result.divergent == 0 and result.compared >= at_least, result


def _planted(fi_src, tmp_path: Path, relpath: str, line: str, new: str) -> Path:
    tree = tmp_path / "flashinfer-planted"
    shutil.copytree(fi_src.root, tree, copy_function=os.link)
    target = tree / relpath
    text = target.read_text()
    assert text.count(line) == 1, line
    target.unlink()  # a hard link: never write through it into the cache
    target.write_text(text.replace(line, new))
    return tree


def test_planted_sm90_order_change_diverges(fi_src, tmp_path):
    tree = _planted(fi_src, tmp_path, POLICY, 'return _prefer("fa3", "fa2")', 'return _prefer("fa2", "fa3")')
    assert cli.main(["flashinfer", "--from", str(tree), "--target", "auto-order", "--max-examples", "10"]) == 1


def test_planted_table_width_change_diverges(fi_src, tmp_path):
    tree = _planted(fi_src, tmp_path, PLANNING, "table_width = max(1, max_pages)", "table_width = max_pages")
    result = _run("metadata", resolve_source("flashinfer", from_path=str(tree)))
    assert result.status == "diverges" and result.divergent > 0, result


def test_planted_merge_guard_diverges_from_the_release_variant(fi_src, tmp_path):
    """A reference that guards the empty state no longer behaves as `merge_nan_4051`: the target reports it."""
    line = "    v_b = v_b.to(torch.float32)\n    s_max = torch.maximum(s_a, s_b)\n"
    tree = _planted(fi_src, tmp_path, TEMPLATES, line,
                    line + "    s_max = torch.where(torch.isinf(s_max), torch.zeros_like(s_max), s_max)\n")
    result = _run("merge-references", resolve_source("flashinfer", from_path=str(tree)))
    assert result.divergent > 0 and result.status == "diverges", result


def test_planted_fallback_on_any_error_diverges(fi_src, tmp_path):
    """The fallback_any_error variant's change, planted in upstream's auto loop, is caught."""
    line = "            except _BackendPlanUnsupportedError as error:\n                if len(candidates) == 1:"
    tree = _planted(fi_src, tmp_path, POLICY, line, line.replace("_BackendPlanUnsupportedError", "Exception"))
    result = _run("selection-loops", resolve_source("flashinfer", from_path=str(tree)), n=80)
    assert result.status == "diverges" and result.divergent > 0, result
