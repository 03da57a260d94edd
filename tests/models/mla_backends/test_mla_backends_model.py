"""mla-backends: pinned conversions and orders, each bug report on its variant, planted mutations of the
properties that hold by construction, and the lifecycle under explore."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.app import catalog
from kvsim.engine.errors import PropertyViolation
from kvsim.engine.explore import explore
from kvsim.engine.registry import REGISTRY
from kvsim.engine.runner import run_property
from kvsim.models.mla_backends import DESCRIPTOR, VARIANTS
from kvsim.models.mla_backends import wrapper as wrapper_module
from kvsim.models.mla_backends.capabilities import PlanContract
from kvsim.models.mla_backends.inputs import RunInput, resolve
from kvsim.models.mla_backends.merge import merge_state
from kvsim.models.mla_backends.metadata import PlanMetadata, dense_from_csr, resolve_dense
from kvsim.models.mla_backends.selection import DEFAULT_ORDER, auto_order, select_backend
from kvsim.properties.mla_backends import merge as merge_props, metadata as metadata_props, selection as sel_props
from kvsim.properties.mla_backends.cases import DECODE_BATCH, EMPTY_PAIR, JIT_FAILURE_ON_SM90, request_of


@pytest.fixture(scope="module", autouse=True)
def loaded():
    catalog.load()


def test_csr_to_dense_pads_to_max_pages_or_the_alignment():
    csr = DECODE_BATCH.csr()  # page 64, kv (0, 1, 130): pages (0, 1, 3)
    assert csr.kv_indptr == (0, 0, 1, 4)
    assert dense_from_csr(csr).width == 3
    assert dense_from_csr(csr, 2).width == 4 and dense_from_csr(csr, 8).width == 8
    empty = request_of(type(DECODE_BATCH)(q_lens=(1,), kv_lens=(0,), page_size=16)).metadata
    assert resolve_dense(empty, 16).block_tables == ((0,),)  # max(1, 0 pages)
    padded = resolve_dense(PlanMetadata(dense=DECODE_BATCH.dense()), 64, 3)  # width 4 -> 6
    assert padded.width == 6 and all(r[4:] == (0, 0) for r in padded.block_tables)


def test_auto_orders_per_compute_capability():
    request = request_of(DECODE_BATCH)
    assert auto_order(request, (8, 0))[:3] == ("fa2", "fa3", "trtllm-gen")
    assert auto_order(request, (8, 9)) == DEFAULT_ORDER
    assert auto_order(request, (9, 0))[:3] == ("fa3", "fa2", "trtllm-gen")
    assert auto_order(request, (10, 0))[:2] == ("fa2", "trtllm-gen")  # small eager work keeps FA2 first
    assert auto_order(request_of(DECODE_BATCH, use_cuda_graph=True), (10, 0))[:2] == ("trtllm-gen",
                                                                                       "cute-dsl-monolithic")
    assert auto_order(request, (12, 0))[:4] == ("fa2", "xqa", "cutile", "fa3")
    split = request_of(DECODE_BATCH, PlanContract(kv_cache_layout="split", kv_kind="independent-split",
                                                  kv_layout="independent-split"))
    trace = select_backend(split, "auto", (10, 0), {"fa2": "unsupported"})
    assert trace.resolved == "fa3" and [c for c, _ in trace.rejections] == ["fa2", "trtllm-gen"]  # packed-only
    trace = select_backend(split, "auto", (10, 0), {"fa2": "unsupported", "fa3": "unsupported"})
    assert trace.error == "unsupported" and [c for c, _ in trace.rejections] == list(trace.candidates)
    assert "cutile: experimental backend" in trace.message


def test_typed_fallback_and_explicit_backends():
    case = JIT_FAILURE_ON_SM90
    trace = select_backend(case.request, "auto", case.cc, case.outcome_map)
    assert trace.error == "failure:jit" and trace.probed == ["fa3"]
    loose = select_backend(case.request, "auto", case.cc, case.outcome_map, variant=VARIANTS["fallback_any_error"])
    assert loose.resolved == "fa2"
    explicit = select_backend(case.request, "cutlass", case.cc, {"cutlass": "unsupported"})
    assert explicit.error == "unsupported" and explicit.probed == ["cutlass"]


def test_run_inputs_table():
    adjacent, independent = RunInput(split=(512, 64), adjacent=True), RunInput(split=(512, 64))
    assert resolve(adjacent, "packed").result == "zero-copy-view"
    assert resolve(independent, "packed").result == "rejected"
    assert resolve(independent, "packed", functional=True).result == "copy"
    assert resolve(RunInput(packed=576), "split").result == "zero-copy-slices"
    # settled against 0.7.4 (conform target run-inputs): a plan that declared packed refuses an independent split
    # even when the backend is split-native
    assert resolve(independent, "split").result == "pass-through"
    assert resolve(independent, "split", accepted="packed").result == "rejected"


def test_empty_pair_merges_to_empty_and_nan_on_4051():
    a, b, _ = EMPTY_PAIR.states()
    v, s = merge_state(*a, *b)
    assert v.tolist() == [[[0.0, 0.0]]] and np.isneginf(s).all()
    v, s = merge_state(*a, *b, VARIANTS["merge_nan_4051"])
    assert np.isnan(v).all() and np.isnan(s).all()


def test_finite_masked_lse_of_4452_is_the_reported_number():
    """#4452 reported LSE about -49994 for a fully masked causal row: -5e4 + log2(64 keys) exactly."""
    from kvsim.models.mla_backends.merge import attention_state

    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((65, 1, 8)), rng.standard_normal((64, 8)), rng.standard_normal((64, 4))
    out, lse = attention_state(q, k, v, 8 ** -0.5, causal=True, variant=VARIANTS["finite_masked_lse_4452"])
    assert float(lse[0, 0]) == -49994.0 and np.allclose(out[0, 0], v.mean(axis=0), atol=1e-6)
    out, lse = attention_state(q, k, v, 8 ** -0.5, causal=True)
    assert np.isneginf(lse[0, 0]) and not out[0].any() and np.isfinite(lse[1:]).all()


@pytest.mark.parametrize("bug", ["flashinfer-4051-merge-empty-nan", "flashinfer-4452-finite-masked-lse",
                                 "flashinfer-4031-fallback-on-any-error"])
def test_each_property_bug_fails_on_its_variant_and_holds_on_fixed(bug):
    report = REGISTRY.bug(bug)
    prop = REGISTRY.property(report.model, report.property)
    broken = run_property(prop, report.variant, max_examples=report.max_examples, derandomize=True, use_examples=False)
    assert broken.status == "failed", broken
    fixed = run_property(prop, "fixed", max_examples=60, derandomize=True)
    assert fixed.status == "passed", fixed


def test_explore_finds_the_half_published_plan_only_without_transactions():
    assert not explore(DESCRIPTOR.build_system("fixed", {"plans": 3, "requests": (0, 1, 2, 3)})).violations
    found = explore(DESCRIPTOR.build_system("nontransactional_replan", {})).violations
    assert [v.property for v in found] == ["no_half_published_plan"]
    assert found[0].trace == [["plan", 0], ["select", None], ["fail", "error:allocation"]]
    graph = explore(DESCRIPTOR.build_system("fixed", {"use_cuda_graph": 1, "mla_backend": "cutlass",
                                                      "requests": (0, 3)}))
    assert not graph.violations and graph.hang_states == 0


# -- planted mutations: properties that hold by construction must be able to fail --------------------------
def _planted_merge(v_a, s_a, v_b, s_b, variant=None):
    v, s = merge_state(v_a, s_a, v_b, s_b)
    return v + np.float32(1e-3) * (v_a - v_b), s  # an asymmetric weight


def test_planted_asymmetric_merge_breaks_commutativity(monkeypatch):
    monkeypatch.setattr(merge_props, "merge_state", _planted_merge)
    with pytest.raises(PropertyViolation):
        merge_props.merge_is_commutative(type(EMPTY_PAIR)(seed=1, tokens=2, heads=1, dim=3), VARIANTS.fixed)


def test_planted_unpadded_conversion_breaks_the_round_trip(monkeypatch):
    def pad_with_seven(csr, alignment=None):  # pads rows with page 7 instead of 0
        d = dense_from_csr(csr, alignment)
        counts = [b - a for a, b in zip(csr.kv_indptr, csr.kv_indptr[1:])]
        rows = tuple(r[:n] + (7,) * (d.width - n) for r, n in zip(d.block_tables, counts))
        return type(d)(d.cum_seq_lens_q, rows, d.width, d.seq_lens, d.max_q_len)

    monkeypatch.setattr(metadata_props, "dense_from_csr", pad_with_seven)
    with pytest.raises(PropertyViolation):
        metadata_props.csr_dense_csr_round_trip(DECODE_BATCH, VARIANTS.fixed)


def test_planted_explicit_substitution_is_caught(monkeypatch):
    def substituting(request, backend="auto", cc=(9, 0), outcomes={}, **kw):
        return select_backend(request, "auto" if backend != "cute-dsl" else backend, cc, outcomes, **kw)

    monkeypatch.setattr(sel_props, "select_backend", substituting)
    case = type(JIT_FAILURE_ON_SM90)(request_of(DECODE_BATCH), backend="cutlass", cc=(9, 0),
                                     outcomes=(("cutlass", "unsupported"),))
    with pytest.raises(PropertyViolation):
        sel_props.explicit_backend_never_falls_back(case, VARIANTS.fixed)


def test_planted_selecting_run_is_caught_by_explore(monkeypatch):
    original = wrapper_module.WrapperSystem._run

    def probing_run(self, state, lse_mode):
        state, effects = original(self, state, lse_mode)
        return state._replace(last_run=(state.last_run[0], 1, state.last_run[2])), effects

    monkeypatch.setattr(wrapper_module.WrapperSystem, "_run", probing_run)
    found = explore(DESCRIPTOR.build_system("fixed", {})).violations
    assert [v.property for v in found] == ["run_never_selects"]


def test_bad_parameters_are_one_line_errors(capsys):
    from kvsim.app.cli import main

    assert main(["explore", "mla-backends", "--param", "device=sm70"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "device" in err[0] and "sm70" in err[0]
    assert main(["explore", "mla-backends", "--param", "plans=33"]) == 2  # past the cap (32)


def test_paged_mla_matches_sdpa_and_a_planted_page_swap_is_caught(monkeypatch):
    from kvsim.models.mla_backends import paged
    from kvsim.properties.mla_backends.cases import PAGED_DECODE, PAGED_PREFILL

    for case in (PAGED_DECODE, PAGED_PREFILL):
        merge_props.paged_mla_matches_sdpa(case, VARIANTS.fixed)
    original = paged.request_pages

    def swapped(metadata, b, page_size):  # the dense form reads its pages in reverse order
        pages = original(metadata, b, page_size)
        return pages if isinstance(metadata, paged.CsrMetadata) else tuple(reversed(pages))

    monkeypatch.setattr(paged, "request_pages", swapped)
    with pytest.raises(PropertyViolation):
        merge_props.paged_mla_matches_sdpa(PAGED_DECODE, VARIANTS.fixed)


def test_planted_sink_blind_contract_check_is_caught(monkeypatch):
    from kvsim.models.mla_backends import contract

    real = contract.validate_run

    def sink_blind(planned, run):
        return real(planned, type(run)(**{**run.__dict__, "sinks": planned.use_sinks}))

    monkeypatch.setattr(sel_props, "validate_run", sink_blind)
    with pytest.raises(PropertyViolation):
        sel_props.run_must_match_its_plan((contract.InputContract(), "sinks"), VARIANTS.fixed)
