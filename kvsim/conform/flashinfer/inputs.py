"""FlashInfer 0.7.4 run-input representations (`_contracts.py`) against `mla-backends`' `inputs` model.

Exhaustive over the four structural kinds (packed, adjacent split views of one packed tensor, independent
split tensors, the dual nesting), both native representations (`desired`), the declared layout
(`accepted`: none, packed, split) and split widths (8, 4) and (8, 0): `_structural_mla_input_facts`
classifies as `inputs.classify`, and `_resolve_structural_mla_input` gives what `inputs.resolve` says.
Convention: upstream returns tensors; the adapter names the result by identity and storage (the given
object or member: pass-through; one tensor on the split's storage: zero-copy-view; two slices of the
packed storage: zero-copy-slices; `ValueError`: rejected). Small widths stand in for 512 / 64: the rules
read only the last-dimension structure.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from kvsim.models.mla_backends.inputs import RunInput, classify, resolve

from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult
from .common import MLA, load

CONTRACTS = f"{MLA}/_contracts.py"
NAMES = ("_resolve_structural_mla_input", "_structural_mla_input_facts")
KINDS = ("packed", "adjacent-split", "independent-split", "dual")


def build(kind: str, widths: tuple[int, int]) -> tuple[Any, RunInput]:
    import torch

    packed = torch.arange(2 * 3 * sum(widths), dtype=torch.float32).reshape(2, 3, sum(widths))
    adjacent = (packed[..., :widths[0]], packed[..., widths[0]:])
    if kind == "packed":
        return packed, RunInput(packed=sum(widths))
    if kind == "adjacent-split":
        return adjacent, RunInput(split=widths, adjacent=widths[1] != 0)
    if kind == "independent-split":
        return (torch.zeros(2, 3, widths[0]), torch.zeros(2, 3, widths[1])), RunInput(split=widths)
    return (packed, adjacent), RunInput(packed=sum(widths), split=widths, adjacent=widths[1] != 0)


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


def run_inputs(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    result = TargetResult("run-inputs", source.version)
    ns = load(source, CONTRACTS, NAMES)
    for kind, desired, accepted, widths in itertools.product(KINDS, ("packed", "split"), (None, "packed", "split"),
                                                             ((8, 4), (8, 0))):
        value, model_input = build(kind, widths)
        facts = ns._structural_mla_input_facts(value, widths=widths, name="query")[0]
        model_kind = classify(model_input)
        result.compared += 1
        if widths[1] != 0 and facts != model_kind:
            result.diverge({"kind": kind, "widths": widths}, model_kind, facts, "_structural_mla_input_facts")
        try:
            got = name_result(value, ns._resolve_structural_mla_input(value, desired=desired, widths=widths,
                                                                        name="query", accepted=accepted))
        except ValueError:
            got = "rejected"
        want = resolve(model_input, desired, widths, accepted=accepted).result
        result.compared += 1
        if got != want:
            result.diverge({"kind": kind, "desired": desired, "accepted": accepted, "widths": widths}, want, got,
                           "_resolve_structural_mla_input")
    result.note = "exhaustive: 4 kinds x 2 native representations x 3 declared layouts x 2 split widths"
    return result.finish(started)


TARGETS = (
    Target("flashinfer", "run-inputs", CONTRACTS, NAMES, "mla-backends",
           "structural run inputs: classification and zero-copy / rejected resolution, exhaustive", run_inputs),
)
