"""FlashInfer 0.7.4's Triton merges (`flashinfer/triton/cascade.py`, `triton/kernels/cascade.py`) against the model.

`TRITON_MERGES` (a kernel Differential): the kernels and their Python launchers run in the target's kernel child
(`kvsim.conform.triton_child`, `run_merge` here), under the Triton interpreter on the CPU (`TRITON_INTERPRET=1`
is set there before triton is imported: never in the `kvsim conform` process, which loads the kernel file with
triton stood in for, only to declare it). One call of one launcher per input, every parameter drawn:
`merge_state`, `merge_state_in_place` (the mask absent or present, bool or int32), `merge_states` (1 to 3
states) and, with `--device cuda`, `variable_length_merge_states` (0 to 3 states per row, `indptr` their
offsets: the interpreter cannot run its kernel, whose loop index is a Python int there), on random base-2
states (`MERGE_CASES`: rows empty on any side), `v` in float32 or float64 and `s` in float32 or float64 (which
the in-place merge asserts on), and one input in ten made invalid (a state of another shape, a mask of another
length: the launchers assert, the model's `check_states` refuses). The answer is the merged `v` and `s` with
their dtypes, compared with the model's variant `merge_nan_4051` (no empty-state guard: two empty states are
NaN), NaN for NaN, within `Close(rtol 1e-5, atol 1e-5)`; the `merge_states` kernels are compared on the rows
with a key (`live`); the model's merge properties run on the launchers' answers.

Conventions: the launchers' `check_input` and `check_device` are stand-ins that accept CPU tensors (their
contiguity and same-device asserts kept, the CUDA and compute-capability checks dropped); `check_dim` and
`check_shape` are upstream's (`triton/utils.py`). The `merge_states` kernels start from a phantom state
`(0, m=-5e4, d=1)`: a row empty in every state (or with no state) ends as `(0, -50000)`.

No kernel here masks against a padded size (the class of vLLM's head-mask issue): each loops over exactly
`head_dim` and `num_heads` with scalar loads, and the mask is read at `pos < seq_len` (its length is
asserted), so the release reads only what it owns and answers the same on every run.

Findings (open upstream): `empty_states_merge_to_empty`: two empty states merge to NaN in `merge_state_kernel`
and `merge_state_in_place_kernel` (FlashInfer #4051); `empty_rows_lse_is_neg_inf`: the `merge_states`
kernels give a row with no key the finite LSE -50000 (their phantom initial state; #4452's class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Check, Context, Differential
from kvsim.engine.conformance.compare import Close
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.mla_backends.merge import check_states, merge_state, merge_states

from ..kernels import call_kernel, kernel_examples
from ..loader import loaded_cache
from ..source import EngineSource

LAUNCHERS = "flashinfer/triton/cascade.py"
KERNELS = "flashinfer/triton/kernels/cascade.py"
UTILS = "flashinfer/triton/utils.py"
KERNEL_NAMES = ("merge_state_kernel", "merge_state_in_place_kernel", "merge_states_kernel",
                "variable_length_merge_states_kernel")
LAUNCHER_NAMES = ("merge_state", "merge_state_in_place", "merge_states", "variable_length_merge_states")
TWO, IN_PLACE, MANY, VARLEN = LAUNCHER_NAMES
RUNNER = "kvsim.conform.flashinfer.triton_merge:run_merge"
RTOL, ATOL = 1e-5, 1e-5
PHANTOM_LSE = -5e4
BROKEN = ("s_b_rows", "v_b_dim", "mask_rows")
FINDING_4051 = "FlashInfer #4051 (open): two empty states merge to NaN"
FINDING_PHANTOM = "the Triton merge_states kernels' phantom state (m=-5e4): a row with no key has LSE -50000 (#4452's class)"


# --- child side ----------------------------------------------------------------------------------------

_LOADED: dict[str, Any] = loaded_cache()


def _stand_ins() -> dict[str, Any]:
    """`check_input` and `check_device` for CPU tensors: contiguity and one device, no CUDA capability."""

    def check_input(x: Any) -> None:
        assert x.is_contiguous(), "must be contiguous"

    def check_device(tensors: Any, major: Any = None, minor: Any = None) -> None:
        assert all(t.device == tensors[0].device for t in tensors), "tensors on different devices"

    return {"check_input": check_input, "check_device": check_device}


def launchers(source: EngineSource) -> Any:
    """The release's launchers over its kernels (loaded once per child and mutant in force)."""
    from ..triton_child import load_upstream

    key = str(source.root)
    if key not in _LOADED:
        kernels = load_upstream(source, KERNELS, KERNEL_NAMES)
        utils = load_upstream(source, UTILS, ("check_dim", "check_shape"))
        _LOADED[key] = load_upstream(source, LAUNCHERS, LAUNCHER_NAMES, extra_globals={
            **_stand_ins(), "check_dim": utils.check_dim, "check_shape": utils.check_shape,
            **{n: getattr(kernels, n) for n in KERNEL_NAMES}})
    return _LOADED[key]


def run_merge(source: EngineSource, doc: Mapping[str, Any], device: str) -> dict[str, Any]:
    """One launch (`doc["function"]`) on the packed tensors of `doc`; the merged (v, s), packed."""
    import torch

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    fns = launchers(source)
    t = {k: torch.from_numpy(unpack(v)).to(device) for k, v in doc["tensors"].items()}
    function = doc["function"]
    if function == TWO:
        v, s = fns.merge_state(t["v_a"], t["s_a"], t["v_b"], t["s_b"])
    elif function == IN_PLACE:
        v, s = t["v_a"], t["s_a"]
        fns.merge_state_in_place(v, s, t["v_b"], t["s_b"], t.get("mask"))
    elif function == MANY:
        v, s = fns.merge_states(t["v"], t["s"])
    else:
        v, s = fns.variable_length_merge_states(t["v"], t["s"], t["indptr"])
    if device == "cuda":
        torch.cuda.synchronize()
    return {"v": pack(v.cpu().numpy()), "s": pack(s.cpu().numpy())}


# --- parent side ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LaunchCase:
    """One launch: the states (`MergeCase`), how many are merged (`merge_states`), the rows' state counts
    (`variable_length_merge_states`), the in-place mask, the dtypes, and what was made invalid (`broken`)."""

    function: str
    states: Any  # kvsim.properties.mla_backends.cases.MergeCase
    count: int = 2
    counts: tuple[int, ...] = ()
    mask: tuple[bool, ...] | None = None
    mask_dtype: str = "bool"
    v_dtype: str = "float32"
    s_dtype: str = "float32"
    broken: str | None = None

    def inputs(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(v.astype(self.v_dtype), s.astype(self.s_dtype)) for v, s in self.states.states()]

    def tensors(self) -> dict[str, np.ndarray]:
        """The launcher's arguments as arrays."""
        states = self.inputs()
        if self.function in (TWO, IN_PLACE):
            (v_a, s_a), (v_b, s_b) = states[:2]
            if self.broken == "s_b_rows":
                s_b = s_b[:-1] if s_b.shape[0] > 1 else np.concatenate([s_b, s_b])
            elif self.broken == "v_b_dim":
                v_b = np.concatenate([v_b, v_b[..., :1]], axis=-1)
            out = {"v_a": v_a, "s_a": s_a, "v_b": v_b, "s_b": s_b}
            if self.mask is not None:
                mask = np.array(self.mask, bool)
                if self.broken == "mask_rows":
                    mask = np.concatenate([mask, mask[:1]])
                out["mask"] = mask.astype(self.mask_dtype)
            return out
        if self.function == MANY:
            chosen = states[:self.count]
            return {"v": np.stack([v for v, _ in chosen], 1), "s": np.stack([s for _, s in chosen], 1)}
        rows = [(t, i) for t, k in enumerate(self.counts) for i in range(k)]
        heads, dim = self.states.heads, self.states.dim
        v = np.stack([states[i][0][t] for t, i in rows]) if rows else np.zeros((0, heads, dim), self.v_dtype)
        s = np.stack([states[i][1][t] for t, i in rows]) if rows else np.zeros((0, heads), self.s_dtype)
        return {"v": v, "s": s, "indptr": np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int32)}

    def merged_states(self) -> list[list[np.ndarray]]:
        """Per output row, the LSEs `[H]` of the states it merges."""
        states = self.inputs()
        tokens = self.states.tokens
        if self.function == VARLEN:
            return [[states[i][1][t] for i in range(k)] for t, k in enumerate(self.counts)]
        n = self.count if self.function == MANY else 2
        return [[states[i][1][t] for i in range(n)] for t in range(tokens)]


@st.composite
def launch_cases(draw: st.DrawFn, functions: tuple[str, ...]) -> LaunchCase:
    from kvsim.properties.mla_backends.strategies import MERGE_CASES

    case = draw(MERGE_CASES)
    function = draw(st.sampled_from(functions))
    count = draw(st.integers(1, 3)) if function == MANY else 2
    counts = tuple(draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))) if function == VARLEN else ()
    mask = None
    if function == IN_PLACE and draw(st.booleans()):
        mask = tuple(draw(st.lists(st.booleans(), min_size=case.tokens, max_size=case.tokens)))
    broken = None
    if function in (TWO, IN_PLACE) and draw(st.integers(0, 9)) == 0:
        broken = draw(st.sampled_from(BROKEN if mask is not None else BROKEN[:2]))
    s_dtype = draw(st.sampled_from(("float32", "float32", "float64")))
    return LaunchCase(function, case, count, counts, mask, draw(st.sampled_from(("bool", "int32"))),
                      draw(st.sampled_from(("float32", "float64"))), s_dtype, broken)


def functions(ctx: Context) -> tuple[str, ...]:
    """The launchers this device runs: the interpreter cannot run `variable_length_merge_states_kernel` (its loop
    index is a Python int there, and the kernel calls `iter.to(tl.int64)` on it), so it runs on a GPU only."""
    return LAUNCHER_NAMES if ctx.options.device == "cuda" else LAUNCHER_NAMES[:3]


def pinned(ctx: Context) -> list[LaunchCase]:
    """#4051's reproducer through each launcher (and, on a GPU, a row of no states through the variable-length
    one)."""
    from kvsim.properties.mla_backends.cases import EMPTY_PAIR

    cases = [LaunchCase(TWO, EMPTY_PAIR), LaunchCase(IN_PLACE, EMPTY_PAIR, mask=(True,)),
             LaunchCase(IN_PLACE, EMPTY_PAIR, mask=(False,)), LaunchCase(MANY, EMPTY_PAIR, count=2),
             LaunchCase(VARLEN, EMPTY_PAIR, counts=(0,)), LaunchCase(VARLEN, EMPTY_PAIR, counts=(3,))]
    return [c for c in cases if c.function in functions(ctx)]


def live(case: LaunchCase, s: np.ndarray) -> np.ndarray:
    """[T, H] the rows with a key (the `merge_states` kernels' phantom state decides the others)."""
    rows = case.merged_states()
    heads = case.states.heads
    return np.array([[any(not np.isneginf(x[h]) for x in row) for h in range(heads)] for row in rows],
                    bool).reshape(len(rows), heads)


def answer(case: LaunchCase, v: np.ndarray, s: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {"v_dtype": str(v.dtype), "s_dtype": str(s.dtype)}
    if case.function in (MANY, VARLEN):
        keep = live(case, s)
        out.update(v_live=v[keep], s_live=s[keep], shape=list(v.shape))
    else:
        out.update(v=v, s=s)
    return out


def model_merge(ctx: Context, case: LaunchCase) -> tuple[np.ndarray, np.ndarray]:
    """The model's merged state of the launch (float32, `v` in the launcher's output dtype)."""
    t = case.tensors()
    if case.function in (TWO, IN_PLACE):
        v_a, s_a, v_b, s_b = t["v_a"], t["s_a"], t["v_b"], t["s_b"]
        check_states((v_a, s_a), (v_b, s_b), lse_float32=case.function == IN_PLACE)
        mask = t.get("mask")
        if mask is not None and mask.shape != (v_a.shape[0],):
            raise ValueError(f"mask: expected {v_a.shape[0]} rows, got {list(mask.shape)}")
        v, s = merge_state(v_a, s_a, v_b, s_b, ctx.variant)
        if mask is not None:
            rows = mask.astype(bool)
            v, s = np.where(rows[:, None, None], v, v_a), np.where(rows[:, None], s, s_a)
        return v.astype(case.v_dtype), s.astype(np.float32)
    if case.function == MANY:
        check_states((t["v"], t["s"]), stacked=True)
        v, s = merge_states(t["v"], t["s"], ctx.variant)
        return v.astype(case.v_dtype), s
    heads, dim = case.states.heads, case.states.dim
    parts = []
    for a, b in zip(t["indptr"], t["indptr"][1:]):
        if a == b:  # a row of no states: the empty state
            parts.append((np.zeros((heads, dim), np.float32), np.full(heads, -np.inf, np.float32)))
            continue
        v, s = merge_states(t["v"][None, a:b], t["s"][None, a:b], ctx.variant)
        parts.append((v[0], s[0]))
    return (np.stack([p[0] for p in parts]).astype(case.v_dtype).reshape(-1, heads, dim),
            np.stack([p[1] for p in parts]).reshape(-1, heads))


def model_answer(ctx: Context, case: LaunchCase) -> dict[str, Any]:
    try:
        v, s = model_merge(ctx, case)
    except ValueError as exc:  # the model's shape contract: a refusal
        raise ConfigError("merge inputs", "states of one shape", str(exc)) from exc
    return answer(case, v, s)


def upstream_answer(ctx: Context, case: LaunchCase) -> dict[str, Any]:
    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    got = call_kernel(ctx, RUNNER, {"function": case.function,
                                    "tensors": {k: pack(v) for k, v in case.tensors().items()}})
    v, s = unpack(got["v"]), unpack(got["s"])
    ctx.state["last"] = (v, s)
    return answer(case, v, s)


def describe(ctx: Context, case: LaunchCase) -> dict[str, Any]:
    c = case.states
    shown = {"function": case.function, "tokens": c.tokens, "heads": c.heads, "dim": c.dim, "seed": c.seed,
             "empty": [list(e) for e in c.empty], "lse_scale": c.lse_scale, "v_dtype": case.v_dtype,
             "s_dtype": case.s_dtype}
    if case.function == MANY:
        shown["states"] = case.count
    if case.function == VARLEN:
        shown["states_per_row"] = list(case.counts)
    if case.function == IN_PLACE:
        shown.update(mask=None if case.mask is None else list(case.mask), mask_dtype=case.mask_dtype)
    if case.broken:
        shown["broken"] = case.broken
    return shown


# -- the model's merge properties on the launchers' answers -------------------------------------------------

def _full(ctx: Context, case: LaunchCase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The launch's whole (v, s) and [T, H] the rows it merged that have no key."""
    v, s = ctx.state["last"]
    merged = np.ones(s.shape, bool)
    if case.function == IN_PLACE and case.mask is not None:
        merged = np.broadcast_to(np.array(case.mask, bool)[:, None], s.shape)
    return v, s, ~live(case, s) & merged


def empty_rows_check(functions: tuple[str, ...], what: str) -> Any:
    """A check that the rows of `functions`' launches with no key (`what`) come out as (0, -inf)."""

    def check(ctx: Context, case: LaunchCase, got: Any) -> None:
        if case.function not in functions:
            return
        v, s, empty = _full(ctx, case)
        bad = empty & ~(np.isneginf(s) & (v == 0).all(axis=-1))
        if bad.any():
            t = tuple(int(i) for i in np.argwhere(bad)[0])
            raise PropertyViolation(f"{case.function}: row {list(t)} {what}: expected (0, -inf), got "
                                    f"({v[t].ravel()[0]}, {s[t]})")
    return check


def check_lse_at_least_max(ctx: Context, case: LaunchCase, got: Any) -> None:
    """The merged LSE is at least the largest part's on every row with a key (float32 rounding allowed)."""
    v, s, _ = _full(ctx, case)
    for t, row in enumerate(case.merged_states()):
        if case.function == IN_PLACE and case.mask is not None and not case.mask[t]:
            continue
        for h in range(s.shape[1]):
            parts = [float(x[h]) for x in row if not np.isneginf(x[h])]
            if parts and not s[t, h] >= max(parts) - 1e-4 - RTOL * abs(max(parts)):
                raise PropertyViolation(f"{case.function}: merged lse at {[t, h]}: expected >= {max(parts)}, got "
                                        f"{s[t, h]}")


def loading(upstream: Any, up: Any) -> dict[str, Any]:
    """In this process the kernel file loads with triton stood in for (it runs only in the kernel child)."""
    from ..loader import Inert

    if upstream.file == KERNELS:
        return {"modules": {"triton": Inert("triton"), "triton.language": Inert("triton.language")}}
    return {}


TRITON_MERGES = Differential(
    kernel=True, examples=kernel_examples, loading=loading, inputs=lambda ctx: launch_cases(functions(ctx)),
    pinned=pinned,
    model=model_answer, upstream=upstream_answer, describe=describe,
    compare=Close(refusals=("AssertionError",), rtol=RTOL, atol=ATOL),
    checks=(Check("empty_states_merge_to_empty", empty_rows_check((TWO, IN_PLACE), "empty on both sides"),
                  finding=FINDING_4051),
            Check("empty_rows_lse_is_neg_inf", empty_rows_check((MANY, VARLEN), "has no key"),
                  finding=FINDING_PHANTOM),
            Check("merged_lse_at_least_max", check_lse_at_least_max)),
    note=lambda ctx: f"model variant {ctx.variant.name}; the launchers under the Triton interpreter "
                     f"({ctx.options.device})")
