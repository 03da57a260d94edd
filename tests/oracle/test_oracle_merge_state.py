"""gpu_oracle merge_state (FlashInfer's base-2 merge as CUDA C): every CPU backend against the model, the
agreement with the natural-log merge_attn_states kernel, the NaN variant caught by the differential, a planted
removal of the empty-state guard caught, and the ASan build running clean."""

from __future__ import annotations

import numpy as np
import pytest

from oraclehelp import caught, run

from kvsim.gpu_oracle.kernels.merge_state import backends as ms
from kvsim.gpu_oracle.runtime import asan, build, discovery
from kvsim.models.mla_backends.merge import empty_state, merge_state as reference
from kvsim.properties.mla_backends.cases import EMPTY_PAIR, MergeCase

CPU_BACKENDS = [name for name in ("torch-cpu", "cpu-shim") if discovery.available(name)]
needs_asan = pytest.mark.skipif(not discovery.available("cpu-shim-asan"),
                                reason=f"cpu-shim-asan unavailable: {discovery.probe('cpu-shim-asan')[1]}")


def test_source_is_nvrtc_ready_and_picked_up():
    source = build.kernel_source("merge_state").read_text()
    assert "#include" not in source and "__shared__" not in source
    assert "merge_state" in build.shim_kernels()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_backends_merge_the_empty_pair_to_the_empty_state(backend):
    a, b, _ = EMPTY_PAIR.states()
    v, s = ms.merge_state(backend, *a, *b)
    assert v.tolist() == [[[0.0, 0.0]]] and np.isneginf(s).all()
    case = MergeCase(seed=5, tokens=3, heads=2, dim=5, empty=((True, False) * 3, (True, True, False) * 2, ()))
    a, b, _ = case.states()
    v, s = ms.merge_state(backend, *a, *b, threads=3)
    want_v, want_s = reference(*a, *b)
    assert np.array_equal(np.isneginf(s), np.isneginf(want_s))
    assert np.allclose(v, want_v, rtol=1e-5, atol=1e-6) and np.allclose(s, want_s, rtol=1e-5)
    e = empty_state(3, 2, 5)
    assert np.array_equal(ms.merge_state(backend, *a, *e)[1], a[1])  # the identity, exactly


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_kernel_properties_hold_and_the_nan_variant_is_caught(backend):
    for name in ("merge_state_differential", "merge_state_matches_merge_attn_states"):
        assert run(name, backend, max_examples=60).status == "passed"
    caught_variant = run("merge_state_differential", backend, max_examples=200, variant="merge_nan_4051")
    assert caught_variant.status == "failed" and "NaN" in caught_variant.message


def test_planted_missing_guard_is_caught(monkeypatch, tmp_path):
    if "cpu-shim" not in CPU_BACKENDS:
        pytest.skip("no C++ compiler")
    result = caught(monkeypatch, tmp_path, ms.KERNEL, "const float shift = m < -3.402823466e+38f ? 0.0f : m;",
                    "const float shift = m;", "merge_state_differential", max_examples=200)
    assert "NaN" in result.message


@needs_asan
def test_asan_build_runs_clean_with_the_reference_bytes():
    case = MergeCase(seed=9, tokens=2, heads=3, dim=7, empty=((True,) * 6, (False, True) * 3, ()))
    a, b, _ = case.states()
    child = asan.run_case("merge_state", ms.case_document(*a, *b, threads=4))
    v, s = ms.merge_state("cpu-shim", *a, *b, threads=4)
    asan.expect_clean("merge_state", child, np.concatenate([v.ravel(), s.ravel()]))
