"""kvsim conform flashinfer against the real flashinfer-python 0.7.4 wheel (cached; a failed download fails
the test): every target conforms on the release, a planted regression in a copy of its tree diverges with a
shrunk input, and the model fixes the targets found stay fixed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from kvsim.conform import source as source_module
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target, select_targets
from kvsim.engine.errors import ConfigError
from kvsim.models.mla_backends.conform import (CASCADE_TEMPLATES, CONTRACTS, PLANNING, POLICY, TRITON_KERNELS)
from kvsim.models.mla_backends.inputs import RunInput, facts, resolve
from kvsim.models.mla_backends.merge import check_states
from kvsim.models.mla_backends.metadata import (CsrMetadata, DenseMetadata, MetadataError, PlanMetadata, check_fields,
                                               resolve_csr, resolve_dense, validate_csr, validate_dense)


@pytest.fixture(scope="module")
def fi_src():
    return resolve_source("flashinfer", version="0.7.4")


def _run(name, source, n=20):
    return run_target(select_targets("flashinfer", name)[0], source, RunOptions(max_examples=n))


def _props(result):
    return {p["property"]: p["status"] for p in result.properties}


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


def test_every_target_is_declared_with_the_model():
    names = {t.name: t for t in select_targets("flashinfer")}
    assert set(names) >= {"merge-references", "metadata", "capabilities", "auto-order", "selection-loops",
                          "triton-merges", "run-inputs", "run-contract"}
    assert all(t.model == "mla-backends" for t in names.values())
    assert names["merge-references"].variant_name("0.7.4") == "merge_nan_4051"  # #4051 open: no guard


def test_merge_references_follow_the_unguarded_merge_and_4051_reproduces(fi_src):
    result = _run("merge-references", fi_src)
    assert result.status == "conforms" and result.divergent == 0 and result.compared == 20 + 4, result
    assert _props(result) == {"empty_states_merge_to_empty": "finding confirmed", "merged_lse_at_least_max": "holds",
                              "merge_identity_is_empty_state": "holds", "merge_is_commutative": "holds"}


def test_triton_merges_follow_the_model_and_the_empty_state_findings_reproduce(fi_src):
    result = _run("triton-merges", fi_src, n=8)
    assert result.status == "conforms" and result.divergent == 0 and result.compared == 8 + 4, result
    assert _props(result) == {"empty_states_merge_to_empty": "finding confirmed",
                              "empty_rows_lse_is_neg_inf": "finding confirmed", "merged_lse_at_least_max": "holds"}
    assert "-50000" in next(p["message"] for p in result.properties if p["property"] == "empty_rows_lse_is_neg_inf")


@pytest.mark.parametrize("name,at_least", [("metadata", 20 + 143), ("capabilities", 20 + 9), ("auto-order", 20 + 403),
                                           ("selection-loops", 20 + 5), ("run-inputs", 2976),
                                           ("run-contract", 20 + 38)])
def test_the_contract_targets_conform(fi_src, name, at_least):
    result = _run(name, fi_src)
    assert result.status == "conforms" and result.divergent == 0 and result.compared >= at_least, result


# -- planted regressions: a copy of the release tree with one line changed ---------------------------------

def _planted(fi_src, tmp_path: Path, relpath: str, line: str, new: str) -> Path:
    tree = tmp_path / "flashinfer-planted"
    shutil.copytree(fi_src.root, tree, copy_function=os.link)
    target = tree / relpath
    text = target.read_text()
    assert text.count(line) == 1, line
    target.unlink()  # a hard link: never write through it into the cache
    target.write_text(text.replace(line, new))
    return tree


def _diverges(fi_src, tmp_path, name, relpath, line, new, n=20):
    tree = _planted(fi_src, tmp_path, relpath, line, new)
    result = _run(name, resolve_source("flashinfer", from_path=str(tree)), n=n)
    assert result.status == "diverges" and result.divergent == 1, result
    assert result.subject == "code under test"
    return result.divergences[0]


def test_planted_sm90_order_change_diverges(fi_src, tmp_path):
    found = _diverges(fi_src, tmp_path, "auto-order", POLICY, 'return _prefer("fa3", "fa2")',
                      'return _prefer("fa2", "fa3")')
    assert found["field"] == "sm90[0]" and found["model"]["sm90"][0] == "fa3"


def test_planted_table_width_change_diverges(fi_src, tmp_path):
    found = _diverges(fi_src, tmp_path, "metadata", PLANNING, "table_width = max(1, max_pages)",
                      "table_width = max_pages")
    assert found["input"]["operation"] in ("dense_from_csr", "resolver")


def test_planted_merge_guard_diverges_from_the_release_variant(fi_src, tmp_path):
    """A reference that guards the empty state no longer behaves as `merge_nan_4051`: the target reports it on the
    smallest input (one token, one head, two empty states)."""
    line = "    v_b = v_b.to(torch.float32)\n    s_max = torch.maximum(s_a, s_b)\n"
    found = _diverges(fi_src, tmp_path, "merge-references", CASCADE_TEMPLATES, line,
                      line + "    s_max = torch.where(torch.isinf(s_max), torch.zeros_like(s_max), s_max)\n")
    assert found["input"]["tokens"] == 1 and found["input"]["heads"] == 1, found


def test_planted_fallback_on_any_error_diverges(fi_src, tmp_path):
    """The fallback_any_error variant's change, planted in upstream's auto loop, is caught: the model's refusal (a
    failure that propagates) against upstream's fallback to the next candidate."""
    line = "            except _BackendPlanUnsupportedError as error:\n                if len(candidates) == 1:"
    found = _diverges(fi_src, tmp_path, "selection-loops", POLICY, line,
                      line.replace("_BackendPlanUnsupportedError", "Exception"), n=40)
    assert "failure" in str(found["model"]), found


def test_planted_swapped_mismatch_values_diverge(fi_src, tmp_path):
    """The planned and given values of a mismatch swapped in its message: the refusal names them."""
    line = 'f"MLA planned run argument {name} mismatch: planned {planned!r}, got "'
    found = _diverges(fi_src, tmp_path, "run-contract", CONTRACTS, line,
                      'f"MLA planned run argument {name} mismatch: planned {actual!r}, got "')
    assert found["field"] == "refusal", found


def test_planted_zero_width_split_change_diverges(fi_src, tmp_path):
    found = _diverges(fi_src, tmp_path, "run-inputs", CONTRACTS, "    if widths[1] == 0:\n        return left",
                      "    if widths[1] == 0:\n        return right")
    assert found["input"]["planned_widths"] == [8, 0], found


def test_planted_kernel_lse_change_diverges(fi_src, tmp_path):
    """The merge kernel's LSE without the running maximum: a byte-level regression of the Triton kernel."""
    found = _diverges(fi_src, tmp_path, "triton-merges", TRITON_KERNELS, "                    tl.log2(d) + s_max,",
                      "                    tl.log2(d),", n=8)
    assert found["field"].startswith("s["), found


# -- the model fixes these targets found -------------------------------------------------------------------

def test_run_inputs_model_refuses_an_unknown_layout_and_checks_only_the_member_handed_on():
    dual = RunInput(packed=10, split=(8, 4))  # the packed member does not match the planned widths
    with pytest.raises(ValueError, match="accepted representation"):
        resolve(RunInput(packed=12), "packed", (8, 4), accepted="interleaved")
    assert resolve(dual, "split", (8, 4)).result == "pass-through"  # its split member is what is handed on
    with pytest.raises(ValueError, match="packed last dimension"):
        resolve(dual, "packed", (8, 4))
    assert resolve(RunInput(split=(8, 4)), "split", None).result == "pass-through"
    with pytest.raises(ValueError, match="planned split widths"):
        resolve(RunInput(split=(8, 4)), "packed", None)
    with pytest.raises(ValueError, match="dtype"):
        resolve(RunInput(packed=12, dtype="float32"), "packed", (8, 4), expected_dtype="bfloat16")
    assert facts(RunInput(split=(8, 4), adjacent=True, dtype="float32"), (8, 4)) == ("adjacent-split", "float32")


def test_metadata_model_takes_the_flat_csr_partial_forms_and_max_q_len_types():
    flat = CsrMetadata((0, 1, 2, 3), (0, 1), (5,), (4,))  # FA's historical flat CSR: more query offsets
    assert validate_csr(flat, 16, strict=False) == flat
    with pytest.raises(MetadataError) as strict:
        validate_csr(flat, 16)
    assert strict.value.rule == "batch_mismatch"
    assert resolve_csr(PlanMetadata(csr=flat), 16, strict=False) == flat
    with pytest.raises(MetadataError) as dense:
        resolve_dense(PlanMetadata(csr=flat), 16, strict=False)
    assert dense.value.rule == "dense_batch"
    for present, has_max, rule in ((("qo_indptr",), False, "partial_form"), ((), True, "partial_form"),
                                   ((), False, "no_form")):
        with pytest.raises(MetadataError) as found:
            check_fields(present, has_max)
        assert found.value.rule == rule
    for bad in (2.0, True):
        with pytest.raises(MetadataError) as found:
            validate_dense(DenseMetadata((0, 1), ((0,),), 1, (1,), bad), 16)  # type: ignore[arg-type]
        assert found.value.rule == "max_q_len"


def test_metadata_model_reports_an_invalid_page_size_first_as_the_resolver_does():
    """FlashInfer 0.7.4's `_MLAPlanMetadataResolver._check_forms` checks the page size before the forms, and
    `resolve_dense` the forms before the alignment: the model reported the missing form or the alignment."""
    csr = CsrMetadata((0, 1), (0, 1), (3,), (4,))
    for bad in (0, -1, True, 2.0):
        for call in (lambda: resolve_csr(PlanMetadata(), bad), lambda: resolve_dense(PlanMetadata(), bad, 0),
                     lambda: resolve_dense(PlanMetadata(csr=csr), bad, 0),
                     lambda: check_fields(("qo_indptr",), True, bad), lambda: check_fields((), False, bad)):
            with pytest.raises(MetadataError) as found:
                call()
            assert found.value.rule == "page_size", (bad, found.value)
    with pytest.raises(MetadataError) as alignment:  # a valid page size: the forms, then the alignment
        resolve_dense(PlanMetadata(csr=csr), 16, 0)
    assert alignment.value.rule == "table_alignment"


def test_merge_model_refuses_states_of_other_shapes():
    v, s = np.zeros((2, 1, 4), np.float32), np.zeros((2, 1), np.float32)
    check_states((v, s), (v, s))
    with pytest.raises(ValueError, match="one shape"):
        check_states((v, s), (v[:1], s[:1]))
    with pytest.raises(ValueError, match="float32 LSE"):
        check_states((v, s.astype(np.float64)), lse_float32=True)
    with pytest.raises(ConfigError):  # the adapter's refusal of it
        from kvsim.conform.flashinfer.triton_merge import LaunchCase, model_answer
        from kvsim.properties.mla_backends.cases import EMPTY_PAIR

        model_answer(None, LaunchCase("merge_state_in_place", EMPTY_PAIR, s_dtype="float64"))
