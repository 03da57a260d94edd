"""FlashInfer 0.7.4's Python merge references (`trace/templates/cascade.py`) against `mla-backends`' merge.

`flashinfer.cascade.merge_state` / `merge_state_in_place` / `merge_states` launch CUDA; their trace
templates carry pure-torch references (`_merge_state_reference`, `_merge_state_in_place_reference`,
`_merge_states_reference`), which are what FlashInfer's trace tests compare kernels with. On random
base-2 states (the `MERGE_CASES` strategy: rows empty on any side) each reference is compared with
the model's variant `merge_nan_4051` (the merge without the empty-state guard: the release's Python
behaviour), NaN for NaN, at float32 tolerance; the model's merge properties are then run on the
references. Convention: the references convert base 2 to natural log and back, the model works in
base 2 (`exp2`/`log2`): equal up to float32 rounding (rtol 1e-5, LSE atol 1e-4).

Finding (open upstream, FlashInfer #4051): `empty_states_merge_to_empty` fails on all three references
in 0.7.4: `(0, -inf) ⊕ (0, -inf)` gives NaN.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from kvsim.engine.errors import PropertyViolation
from kvsim.models.mla_backends.merge import empty_state, merge_state, merge_states
from kvsim.models.mla_backends.variants import VARIANTS

from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive
from .common import FINDING, load

TEMPLATES = "flashinfer/trace/templates/cascade.py"
NAMES = ("_merge_state_reference", "_merge_state_in_place_reference", "_merge_states_reference")
RELEASE = VARIANTS["merge_nan_4051"]  # what the release's Python references do
RTOL, LSE_ATOL, ATOL = 1e-5, 1e-4, 1e-5


def close(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> bool:
    (v, s), (wv, ws) = got, want
    same_s = (s == ws) | (np.isnan(s) & np.isnan(ws)) | np.isclose(s, ws, rtol=RTOL, atol=LSE_ATOL)
    same_v = (np.isnan(v) & np.isnan(wv)) | np.isclose(v, wv, rtol=RTOL, atol=ATOL)
    return bool(same_s.all() and same_v.all())


def run_merge(source: EngineSource, options: RunOptions) -> TargetResult:
    import torch

    from kvsim.properties.mla_backends.cases import EMPTY_PAIR
    from kvsim.properties.mla_backends.strategies import MERGE_CASES

    started = time.perf_counter()
    result = TargetResult("merge-references", source.version)
    ns = load(source, TEMPLATES, NAMES)
    t = torch.from_numpy

    def two(v_a: Any, s_a: Any, v_b: Any, s_b: Any) -> tuple[np.ndarray, np.ndarray]:
        v, s = ns._merge_state_reference(t(v_a), t(s_a), t(v_b), t(s_b))
        return v.numpy(), s.numpy()

    def in_place(v_a: Any, s_a: Any, v_b: Any, s_b: Any, mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
        v, s = ns._merge_state_in_place_reference(t(v_a.copy()), t(s_a.copy()), t(v_b), t(s_b),
                                                  None if mask is None else t(mask))
        return v.numpy(), s.numpy()

    def many(vs: list[np.ndarray], ss: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        v, s = ns._merge_states_reference(t(np.stack(vs, axis=1)), t(np.stack(ss, axis=1)))
        return v.numpy(), s.numpy()

    failures: dict[str, str] = {}

    def fail(name: str, message: str) -> None:
        failures.setdefault(name, message)

    def check(case: Any) -> None:
        a, b, c = case.states()
        mask = (np.arange(case.tokens) % 2 == 0)
        model_ab = merge_state(*a, *b, RELEASE)
        for what, got, want in (
                ("_merge_state_reference", two(*a, *b), model_ab),
                ("_merge_state_in_place_reference", in_place(*a, *b), model_ab),
                ("_merge_state_in_place_reference (mask)", in_place(*a, *b, mask),
                 tuple(np.where(mask.reshape((-1,) + (1,) * (x.ndim - 1)), x, y) for x, y in zip(model_ab, a))),
                ("_merge_states_reference", many([a[0], b[0], c[0]], [a[1], b[1], c[1]]),
                 merge_states(np.stack([a[0], b[0], c[0]], 1), np.stack([a[1], b[1], c[1]], 1), RELEASE))):
            result.compared += 1
            if not close(got, want):
                result.diverge({"function": what, "case": repr(case)}, [want[1].tolist()], [got[1].tolist()])
        # the model's properties, on the reference itself
        ab, ba = two(*a, *b), two(*b, *a)
        if not all(np.array_equal(x, y, equal_nan=True) for x, y in zip(ab, ba)):
            fail("merge_is_commutative", f"{case!r}: a ⊕ b != b ⊕ a")
        e = empty_state(case.tokens, case.heads, case.dim)
        ee = two(*e, *e)
        if not (np.array_equal(ee[0], e[0]) and np.array_equal(ee[1], e[1])):
            fail("empty_states_merge_to_empty", f"(0, -inf) ⊕ (0, -inf) = ({ee[0].ravel()[0]}, {ee[1].ravel()[0]}) "
                                                f"with _merge_state_reference; #4051")
        full_a = ~np.isneginf(a[1])
        ae = two(*a, *e)
        # to float32 rounding, not bit for bit: the reference goes through ln 2 and back (settled: adapter fix)
        if not (np.allclose(ae[1][full_a], a[1][full_a], rtol=RTOL, atol=LSE_ATOL)
                and np.allclose(ae[0][full_a], a[0][full_a], rtol=RTOL, atol=ATOL)):
            fail("merge_identity_is_empty_state", f"{case!r}: a ⊕ (0, -inf) != a on non-empty rows")
        finite = ~(np.isneginf(a[1]) & np.isneginf(b[1]))
        if (ab[1][finite] < np.maximum(a[1], b[1])[finite] - LSE_ATOL).any():
            fail("merged_lse_at_least_max", f"{case!r}: merged lse below the larger part")

    drive(MERGE_CASES, check, options)
    try:
        check(EMPTY_PAIR)  # the pinned reproducer of #4051, whatever the random cases drew
    except PropertyViolation:
        pass
    for name in ("merge_is_commutative", "merge_identity_is_empty_state", "merged_lse_at_least_max"):
        result.prop(name, "fails" if name in failures else "holds", failures.get(name, ""))
    name = "empty_states_merge_to_empty"
    if name in failures:
        result.prop(name, FINDING, "open upstream, FlashInfer #4051: " + failures[name])
    else:
        result.prop(name, "holds", "finding #4051 not reproduced on this release")
    result.note = (f"{options.max_examples} random state triples (+ the pinned empty pair) x 4 reference calls, "
                   "against the model's merge_nan_4051 variant; #4051 "
                   + ("reproduces" if name in failures else "does not reproduce"))
    return result.finish(started)


TARGETS = (
    Target("flashinfer", "merge-references", TEMPLATES, NAMES, "mla-backends",
           "the trace templates' Python merge references vs the model's base-2 merge; the merge properties on them",
           run_merge),
)
