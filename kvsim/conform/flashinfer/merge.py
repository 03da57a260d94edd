"""FlashInfer 0.7.4's Python merge references (`trace/templates/cascade.py`) against `mla-backends`' merge.

`flashinfer.cascade.merge_state` / `merge_state_in_place` / `merge_states` launch CUDA; their trace templates
carry pure-torch references (`_merge_state_reference`, `_merge_state_in_place_reference`,
`_merge_states_reference`), which are what FlashInfer's trace tests compare kernels with.

`REFERENCES` (a Differential): one call of one reference on random base-2 states (the `MERGE_CASES` strategy:
rows empty on any side, LSEs of scale 1, 8 or 60), every parameter drawn: the in-place merge's `mask` absent
or present (bool, uint8 or int32, any rows), `_merge_states_reference` over 1 to 3 states, and the dtypes of
`v` and `s` (float32 or float64: the reference computes in float32 and hands `v` back in its input's dtype).
The answer is the merged `v` and `s` and their dtypes, compared with the model's variant `merge_nan_4051` (the
merge without the empty-state guard: the release's Python behaviour), NaN for NaN, at float32 tolerance
(`Close(rtol 1e-5, atol 1e-5)`). The model's merge properties run on the references' answers.

Conventions: the references convert base 2 to natural log and back, the model works in base 2 (`exp2` /
`log2`): equal up to float32 rounding; the inputs are float32 values whatever their dtype (both sides read the
same numbers); the model's in-place merge with a mask keeps the unmasked rows of `(v, s)`;
`_merge_state_reference` hands `v` back in float32 whatever its input dtype (it rebinds `v_a` to its float32
copy before `.to(v_a.dtype)`; the CUDA `merge_state` keeps `v_a`'s dtype), the other two in their input's.

Finding (open upstream, FlashInfer #4051): `empty_states_merge_to_empty` fails on all three references in
0.7.4: `(0, -inf) ⊕ (0, -inf)` gives NaN (the pinned `EMPTY_PAIR` reproduces it on every run).

Survivors (declared in `models/mla_backends/conform.py`): the arguments of `torch.maximum(s_a, s_b)` swapped
in the two-state references (a symmetric maximum).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Check, Context, Differential
from kvsim.engine.conformance.compare import Close
from kvsim.engine.errors import PropertyViolation
from kvsim.models.mla_backends.merge import merge_state, merge_states

TWO, IN_PLACE, MANY = "_merge_state_reference", "_merge_state_in_place_reference", "_merge_states_reference"
FUNCTIONS = (TWO, IN_PLACE, MANY)
DTYPES = ("float32", "float64")
MASK_DTYPES = ("bool", "uint8", "int32")
RTOL, ATOL = 1e-5, 1e-5
FINDING_4051 = "FlashInfer #4051 (open): two empty states merge to NaN"


@dataclass(frozen=True)
class ReferenceCall:
    """One call of one reference: the states (`MergeCase`), how many are merged (`_merge_states_reference`), the
    in-place merge's mask (None: no mask argument) and the dtypes the tensors are given in."""

    function: str
    states: Any  # kvsim.properties.mla_backends.cases.MergeCase
    count: int = 2
    mask: tuple[bool, ...] | None = None
    mask_dtype: str = "bool"
    v_dtype: str = "float32"
    s_dtype: str = "float32"

    def inputs(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return self.states.states()[:self.count]

    def rows(self) -> np.ndarray:
        """[T, 1] the rows the call merges (all, or the mask's)."""
        if self.mask is None:
            return np.ones((self.states.tokens, 1), bool)
        return np.array(self.mask, bool)[:, None]


@st.composite
def reference_calls(draw: st.DrawFn) -> ReferenceCall:
    from kvsim.properties.mla_backends.strategies import MERGE_CASES

    case = draw(MERGE_CASES)
    function = draw(st.sampled_from(FUNCTIONS))
    count = draw(st.integers(1, 3)) if function == MANY else 2
    mask = None
    if function == IN_PLACE and draw(st.booleans()):
        mask = tuple(draw(st.lists(st.booleans(), min_size=case.tokens, max_size=case.tokens)))
    return ReferenceCall(function, case, count, mask, draw(st.sampled_from(MASK_DTYPES)),
                         draw(st.sampled_from(DTYPES)), draw(st.sampled_from(DTYPES)))


def pinned(ctx: Context) -> list[ReferenceCall]:
    """#4051's reproducer through every reference (the in-place one with a mask too)."""
    from kvsim.properties.mla_backends.cases import EMPTY_PAIR

    return [ReferenceCall(TWO, EMPTY_PAIR), ReferenceCall(IN_PLACE, EMPTY_PAIR),
            ReferenceCall(IN_PLACE, EMPTY_PAIR, mask=(True,)), ReferenceCall(MANY, EMPTY_PAIR, count=2)]


def answer(v: Any, s: Any) -> dict[str, Any]:
    """A merged state as the answer holds it: both arrays and the dtypes they came in."""
    return {"v": np.asarray(v), "v_dtype": str(v.dtype).removeprefix("torch."), "s": np.asarray(s),
            "s_dtype": str(s.dtype).removeprefix("torch.")}


def model_answer(ctx: Context, call: ReferenceCall) -> dict[str, Any]:
    states = call.inputs()
    if call.function == MANY:
        v, s = merge_states(np.stack([x[0] for x in states], 1), np.stack([x[1] for x in states], 1), ctx.variant)
    else:
        (v_a, s_a), (v_b, s_b) = states
        v, s = merge_state(v_a, s_a, v_b, s_b, ctx.variant)
        if call.function == IN_PLACE and call.mask is not None:
            rows = call.rows()
            v, s = np.where(rows[..., None], v, v_a), np.where(rows, s, s_a)
    return answer(v.astype(np.float32 if call.function == TWO else call.v_dtype), s.astype(np.float32))


def upstream_answer(ctx: Context, call: ReferenceCall) -> dict[str, Any]:
    import torch

    def tensor(x: np.ndarray, dtype: str) -> Any:
        return torch.from_numpy(x.astype(dtype))

    states = [(tensor(v, call.v_dtype), tensor(s, call.s_dtype)) for v, s in call.inputs()]
    if call.function == MANY:
        v, s = ctx.up._merge_states_reference(torch.stack([x[0] for x in states], 1),
                                              torch.stack([x[1] for x in states], 1))
    elif call.function == TWO:
        v, s = ctx.up._merge_state_reference(*states[0], *states[1])
    else:
        mask = None if call.mask is None else torch.tensor(call.mask).to(getattr(torch, call.mask_dtype))
        v, s = ctx.up._merge_state_in_place_reference(*states[0], *states[1], mask)
    return answer(v.numpy(), s.numpy())


def describe(ctx: Context, call: ReferenceCall) -> dict[str, Any]:
    c = call.states
    return {"function": call.function, "tokens": c.tokens, "heads": c.heads, "dim": c.dim, "seed": c.seed,
            "empty": [list(e) for e in c.empty], "lse_scale": c.lse_scale, "states": call.count,
            "mask": None if call.mask is None else list(call.mask), "mask_dtype": call.mask_dtype,
            "v_dtype": call.v_dtype, "s_dtype": call.s_dtype}


# -- the model's merge properties on the references' answers ------------------------------------------------

def _lses(call: ReferenceCall) -> np.ndarray:
    return np.stack([s for _, s in call.inputs()])  # [n, T, H]


def merged(call: ReferenceCall) -> np.ndarray:
    """[T, H] the (token, head) rows the call merges."""
    return np.broadcast_to(call.rows(), _lses(call).shape[1:])


def check_empty(ctx: Context, call: ReferenceCall, got: dict[str, Any]) -> None:
    """Rows empty in every merged state come out as the empty state (0, -inf), never NaN (#4051)."""
    empty = np.isneginf(_lses(call)).all(axis=0) & merged(call)
    bad = empty & ~(np.isneginf(got["s"]) & (got["v"] == 0).all(axis=-1))
    if bad.any():
        t = tuple(int(i) for i in np.argwhere(bad)[0])
        raise PropertyViolation(f"{call.function}: row {list(t)} empty in every state: expected (0, -inf), got "
                                f"({got['v'][t].ravel()[0]}, {got['s'][t]})")


def check_lse_at_least_max(ctx: Context, call: ReferenceCall, got: dict[str, Any]) -> None:
    """The merged LSE is at least the largest part's, on rows with a key (float32 rounding allowed)."""
    lses = _lses(call)
    live = ~np.isneginf(lses).all(axis=0) & merged(call)
    peak = lses.max(axis=0)
    bad = live & ~(got["s"] >= peak - 1e-4 - RTOL * np.abs(peak))
    if bad.any():
        t = tuple(int(i) for i in np.argwhere(bad)[0])
        raise PropertyViolation(f"{call.function}: merged lse at {list(t)}: expected >= {peak[t]}, got {got['s'][t]}")


def check_identity(ctx: Context, call: ReferenceCall, got: dict[str, Any]) -> None:
    """A row with exactly one non-empty part merges to that part (the empty state is the identity)."""
    states = call.inputs()
    lses = _lses(call)
    alone = (~np.isneginf(lses)).sum(axis=0) == 1
    for i, (v, s) in enumerate(states):
        rows = alone & ~np.isneginf(s) & merged(call)
        close_s = np.isclose(got["s"], s, rtol=RTOL, atol=1e-4)
        close_v = np.isclose(got["v"], v, rtol=RTOL, atol=ATOL).all(axis=-1)
        bad = rows & ~(close_s & close_v)
        if bad.any():
            t = tuple(int(x) for x in np.argwhere(bad)[0])
            raise PropertyViolation(f"{call.function}: row {list(t)} has state {i} alone: expected it back, got "
                                    f"lse {got['s'][t]} for {s[t]}")


def check_commutative(ctx: Context, call: ReferenceCall, got: dict[str, Any]) -> None:
    """`a ⊕ b` equals `b ⊕ a` bit for bit (the two-state reference, asked again with the states swapped)."""
    if call.function != TWO:
        return
    swapped = upstream_answer(ctx, _swapped(call))
    for key in ("v", "s"):
        if not np.array_equal(got[key], swapped[key], equal_nan=True):
            raise PropertyViolation(f"a ⊕ b vs b ⊕ a: expected equal {key}, got {got[key].ravel()[:3].tolist()} vs "
                                    f"{swapped[key].ravel()[:3].tolist()}")


class _Swapped:
    """A `MergeCase` whose first two states are exchanged."""

    def __init__(self, case: Any) -> None:
        self.case, self.tokens, self.heads, self.dim = case, case.tokens, case.heads, case.dim

    def states(self) -> list[tuple[np.ndarray, np.ndarray]]:
        a, b, c = self.case.states()
        return [b, a, c]


def _swapped(call: ReferenceCall) -> ReferenceCall:
    return ReferenceCall(TWO, _Swapped(call.states), call.count, None, call.mask_dtype, call.v_dtype, call.s_dtype)


REFERENCES = Differential(
    inputs=lambda ctx: reference_calls(), pinned=pinned, model=model_answer, upstream=upstream_answer,
    compare=Close(rtol=RTOL, atol=ATOL), describe=describe,
    checks=(Check("empty_states_merge_to_empty", check_empty, finding=FINDING_4051),
            Check("merged_lse_at_least_max", check_lse_at_least_max),
            Check("merge_identity_is_empty_state", check_identity),
            Check("merge_is_commutative", check_commutative)),
    note=lambda ctx: f"model variant {ctx.variant.name} (the release's references have no empty-state guard)")
