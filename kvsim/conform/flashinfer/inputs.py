"""FlashInfer 0.7.4 run-input representations (`_contracts.py`) against `mla-backends`' `inputs` model.

`RUN_INPUTS` (a Sweep, exhaustive, smallest first): the four structural kinds (packed, adjacent split views of
one packed tensor, independent split tensors, the dual nesting) built with split widths (8, 4), (8, 0) or
(0, 4), against every parameter of `_resolve_structural_mla_input`: the planned `widths` (None, each of those,
or (4, 8): a mismatch), `desired` and `accepted` (each representation, None for `accepted`, and an unsupported
name), `expected_dtype` (none, the tensors' dtype or another; with `planned_dtype_name` and
`split_leaf_names`) and `name`; and `_structural_mla_input_facts` on each kind and planned widths. Upstream's
answer is named by identity and storage (the given object or member: pass-through; one tensor on the split's
storage: zero-copy-view; two slices of the packed storage: zero-copy-slices; a new storage: copy) and its
shape (the planned widths, or without them the member's), or it raises; the model's `resolve` / `facts` answer the same or refuse naming the rule. Comparison
(`NamedRefusals`): upstream's `ValueError` equals the model's refusal when its message names the same rule
(`RULE_WORDS`). Small widths stand in for 512 / 64: the rules read only the last-dimension structure.

Conventions: the model's `adjacent` is the adapter's statement of the halves it built (views of one packed
tensor, both halves wider than 0: upstream's `_are_adjacent_last_dim_views` says no view of width 0 is
adjacent); tensors are CPU float32 or bfloat16; malformed nestings, non-tensor leaves and halves of other
ranks, devices or dtypes are upstream's own checks (the model's `RunInput` cannot say them).

Settled (model fixes, `tests/conform/flashinfer/test_conform_flashinfer.py`): the model accepted an unsupported `accepted` layout,
validated the unused packed member of a dual input, could not take planned widths of None, and had no dtype.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterator

from kvsim.engine.conformance.adapters import Context, Sweep
from kvsim.models.mla_backends.inputs import RunInput, facts, resolve

from ..loader import check_signature
from .common import MLA, NamedRefusals, refuse, rule_by_words

CONTRACTS = f"{MLA}/_contracts.py"
KINDS = ("packed", "adjacent-split", "independent-split", "dual")
BUILT = ((8, 4), (8, 0), (0, 4))
PLANNED = (None, (8, 4), (8, 0), (0, 4), (4, 8))
DESIRED = ("packed", "split", "interleaved")
ACCEPTED = (None, "packed", "split", "interleaved")
DTYPES = (("float32", None), ("float32", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16"))
RESOLVE_PARAMS = ("value", "desired", "widths", "name", "accepted", "expected_dtype", "planned_dtype_name",
                  "split_leaf_names")
RULE_WORDS = (("unsupported accepted", "accepted"), ("unsupported", "representation"),
              ("last dimension does not match planned split widths", "packed_width"),
              ("last dimensions do not match planned widths", "split_widths"),
              ("does not match the planned", "dtype"), ("planned split widths are required", "widths_required"),
              ("left split width must be positive", "split_width_sign"),
              ("cannot provide the planned packed representation zero-copy", "rejected"))
MODEL_WORDS = (("accepted representation", "accepted"), ("desired representation", "representation"),
               ("packed last dimension", "packed_width"), ("split last dimensions", "split_widths"),
               ("dtype: expected the planned", "dtype"), ("planned split widths: required", "widths_required"),
               ("split widths: expected a positive left", "split_width_sign"))


@dataclass(frozen=True)
class InputCase:
    """One call: `_structural_mla_input_facts` (`function` "facts") or `_resolve_structural_mla_input` of a `kind`
    built with split widths `built` and dtype `dtype`, planned `widths`, and the resolution's other arguments."""

    function: str
    kind: str
    built: tuple[int, int]
    widths: tuple[int, int] | None
    desired: str = "packed"
    accepted: str | None = None
    dtype: str = "float32"
    expected_dtype: str | None = None

    @property
    def name(self) -> str:
        return "kv_cache" if self.dtype == "bfloat16" else "query"

    def model_input(self) -> RunInput:
        packed = sum(self.built) if self.kind in ("packed", "dual") else None
        split = self.built if self.kind != "packed" else None
        adjacent = self.kind in ("adjacent-split", "dual") and 0 not in self.built
        return RunInput(packed=packed, split=split, adjacent=adjacent, dtype=self.dtype)


def cases(ctx: Context) -> Iterator[InputCase]:
    """Facts first, then resolutions; within each, the simpler kinds and widths first."""
    for kind, built, widths, (dtype, _) in itertools.product(KINDS, BUILT, PLANNED[1:], DTYPES[::3]):
        yield InputCase("facts", kind, built, widths, dtype=dtype)
    for kind, built, widths, desired, accepted, (dtype, expected) in itertools.product(
            KINDS, BUILT, PLANNED, DESIRED, ACCEPTED, DTYPES):
        yield InputCase("resolve", kind, built, widths, desired, accepted, dtype, expected)


def build(case: InputCase) -> Any:
    """The run input as a caller passes it: a tensor, a pair of tensors, or the dual nesting (packed, pair)."""
    import torch

    widths = case.built
    packed = torch.arange(2 * 3 * sum(widths), dtype=torch.float32).reshape(2, 3, sum(widths))
    packed = packed.to(getattr(torch, case.dtype))
    adjacent = (packed[..., :widths[0]], packed[..., widths[0]:])
    if case.kind == "packed":
        return packed
    if case.kind == "adjacent-split":
        return adjacent
    if case.kind == "independent-split":
        dtype = getattr(torch, case.dtype)
        return torch.zeros(2, 3, widths[0], dtype=dtype), torch.zeros(2, 3, widths[1], dtype=dtype)
    return packed, adjacent


def leaves(value: Any) -> list[Any]:
    return [x for v in (value if isinstance(value, tuple) else (value,)) for x in (v if isinstance(v, tuple) else (v,))]


def name_result(value: Any, got: Any) -> str:
    """pass-through: the caller's own tensor(s); else a new view (one tensor) or new slices (a pair)."""
    given = leaves(value)
    parts = got if isinstance(got, tuple) else (got,)
    if all(any(p is g for g in given) for p in parts):
        return "pass-through"
    storages = {g.untyped_storage().data_ptr() for g in given}
    if any(p.untyped_storage().data_ptr() not in storages for p in parts):
        return "copy"
    return "zero-copy-slices" if isinstance(got, tuple) else "zero-copy-view"


def model_answer(ctx: Context, case: InputCase) -> dict[str, Any]:
    value = case.model_input()
    try:
        if case.function == "facts":
            kind, dtype = facts(value, case.widths)  # type: ignore[arg-type]
            return {"kind": kind, "dtype": dtype}
        resolution = resolve(value, case.desired, case.widths, accepted=case.accepted,
                             expected_dtype=case.expected_dtype)
    except ValueError as exc:  # the model states upstream's raises as raises: named as its refusal
        refuse(rule_by_words(str(exc), MODEL_WORDS))
    if resolution.result == "rejected":
        refuse("rejected")
    widths = case.widths or case.built
    shape = [[2, 3, widths[0]], [2, 3, widths[1]]] if case.desired == "split" else [2, 3, sum(widths)]
    return {"result": resolution.result, "shape": shape}


def upstream_answer(ctx: Context, case: InputCase) -> dict[str, Any]:
    import torch

    value = build(case)
    if case.function == "facts":
        kind, dtype, _ = ctx.up._structural_mla_input_facts(value, widths=case.widths, name=case.name)
        return {"kind": kind, "dtype": str(dtype).removeprefix("torch.")}
    named = {"expected_dtype": getattr(torch, case.expected_dtype), "planned_dtype_name": "q_data_type",
             "split_leaf_names": ("q_nope", "q_pe")} if case.expected_dtype else {}
    got = ctx.up._resolve_structural_mla_input(value, desired=case.desired, widths=case.widths, name=case.name,
                                               accepted=case.accepted, **named)
    shape = [list(g.shape) for g in got] if isinstance(got, tuple) else list(got.shape)
    return {"result": name_result(value, got), "shape": shape}


def describe(ctx: Context, case: InputCase) -> dict[str, Any]:
    shown = {"function": case.function, "kind": case.kind, "built_widths": list(case.built),
             "planned_widths": None if case.widths is None else list(case.widths), "dtype": case.dtype}
    if case.function == "resolve":
        shown.update(desired=case.desired, accepted=case.accepted, expected_dtype=case.expected_dtype)
    return shown


RUN_INPUTS = Sweep(
    prepare=lambda ctx: check_signature(ctx.up._resolve_structural_mla_input, RESOLVE_PARAMS,
                                        f"{CONTRACTS}:_resolve_structural_mla_input"),
    domain=cases, model=model_answer, upstream=upstream_answer, describe=describe,
    compare=NamedRefusals(refusals=("ValueError",), name_of=lambda message: rule_by_words(message, RULE_WORDS)),
    note=lambda ctx: f"exhaustive: {ctx.counts.get('compared', 0)} calls (facts and resolutions of 4 kinds x 3 "
                     f"built widths x 5 planned widths x 3 desired x 4 accepted x 4 dtype pairs)")
