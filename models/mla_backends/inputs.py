"""Query and KV-cache representations at `run()` (FlashInfer 0.7.4, `_contracts.py`).

A run input is a packed tensor (last dim 576 = 512 + 64), a 2-tuple of split halves (512, 64),
or a trusted "dual" nesting of both. `classify` names it as upstream's `_structural_mla_input_facts`
does: `packed`, `adjacent-split` (the halves are consecutive views of one storage, so one packed
view covers them), `independent-split`, `dual`. `resolve` is `_resolve_structural_mla_input`: what
a backend that needs `desired` gets from what the caller gave:

| needs  | given                 | result                                   |
| ------ | --------------------- | ---------------------------------------- |
| packed | packed / dual         | pass-through                             |
| packed | adjacent split        | one zero-copy packed view                |
| packed | independent split     | rejected: re-plan for split input        |
| split  | split / dual          | pass-through                             |
| split  | packed                | zero-copy slices                         |

A packed member of width `512 + 0` needs no view: the left half is it. The research note's functional API
(`batch_mla_paged_attention`) alone may concatenate an independent split for a packed-native runner
(`functional=True`); FlashInfer 0.7.4 ships no `_functional.py`: its one such copy is the wrapper's planless
CUTLASS path, which `torch.cat`s a split tuple that cannot be viewed packed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

KINDS = ("packed", "adjacent-split", "independent-split", "dual")
RESULTS = ("pass-through", "zero-copy-view", "zero-copy-slices", "copy", "rejected")


@dataclass(frozen=True)
class RunInput:
    """A structural run input: `packed` is the packed width (or None), `split` the two widths (or None);
    `adjacent` says the split halves sit side by side in one storage with matching strides; `dtype` is its
    tensors' dtype."""

    packed: int | None = None
    split: tuple[int, int] | None = None
    adjacent: bool = False
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.packed is None and self.split is None:
            raise ValueError("a run input is a packed tensor, a split pair or both")


class Resolution(NamedTuple):
    result: str  # one of RESULTS
    copies: bool
    message: str = ""


REPRESENTATIONS = ("packed", "split")


def classify(value: RunInput) -> str:
    if value.packed is not None:
        return "dual" if value.split is not None else "packed"
    return "adjacent-split" if value.adjacent else "independent-split"


def _check_packed(value: RunInput, widths: tuple[int, int], expected_dtype: str | None) -> None:
    """`_validate_packed_structural_input`: the packed member's width, then its dtype."""
    if value.packed != sum(widths):
        raise ValueError(f"packed last dimension: expected {sum(widths)}, got {value.packed}")
    if expected_dtype is not None and value.dtype != expected_dtype:
        raise ValueError(f"dtype: expected the planned {expected_dtype}, got {value.dtype}")


def _check_split(value: RunInput, widths: tuple[int, int], expected_dtype: str | None) -> None:
    """`_validate_split_structural_input`: the halves' dtype, then their widths."""
    if expected_dtype is not None and value.dtype != expected_dtype:
        raise ValueError(f"dtype: expected the planned {expected_dtype}, got {value.dtype}")
    if value.split != widths:
        raise ValueError(f"split last dimensions: expected {widths}, got {value.split}")


def facts(value: RunInput, widths: tuple[int, int]) -> tuple[str, str]:
    """`_structural_mla_input_facts`: (kind, dtype), the primary member validated (the packed one of a dual)."""
    if value.packed is not None:
        _check_packed(value, widths, None)
    else:
        _check_split(value, widths, None)
    return classify(value), value.dtype


def resolve(value: RunInput, desired: str, widths: tuple[int, int] | None = (512, 64), *, accepted: str | None = None,
            functional: bool = False, expected_dtype: str | None = None) -> Resolution:
    """What a backend whose native representation is `desired` ("packed" or "split") receives; `accepted` is the
    layout the plan declared (`MLAInputContract`): a plan that declared packed refuses an independent split
    even for a split-native backend (the run must match its plan). Only the member handed on is validated
    (its widths against the planned `widths`, its dtype against `expected_dtype`); without planned widths
    (None) the member asked for passes through and no conversion is possible."""
    if desired not in REPRESENTATIONS:
        raise ValueError(f"desired representation: expected packed or split, got {desired!r}")
    if accepted is not None and accepted not in REPRESENTATIONS:
        raise ValueError(f"accepted representation: expected packed, split or None, got {accepted!r}")
    kind = classify(value)
    if accepted == "packed" and kind == "independent-split" and (widths is None or widths[1] != 0) and not functional:
        return Resolution("rejected", False, "planned packed, given an independent split: re-plan for split input")
    if widths is None:
        if (value.packed if desired == "packed" else value.split) is not None:
            return Resolution("pass-through", False)
        raise ValueError("planned split widths: required to convert, got None")
    if desired == "split":
        if value.split is not None:
            _check_split(value, widths, expected_dtype)
            return Resolution("pass-through", False)
        if widths[0] <= 0 or widths[1] < 0:
            raise ValueError(f"split widths: expected a positive left and a non-negative right, got {widths}")
        _check_packed(value, widths, expected_dtype)
        return Resolution("zero-copy-slices", False)
    if value.packed is not None:
        _check_packed(value, widths, expected_dtype)
        return Resolution("pass-through", False)
    _check_split(value, widths, expected_dtype)
    if widths[1] == 0:
        return Resolution("pass-through", False)  # the left half alone is the packed tensor
    if kind == "adjacent-split":
        return Resolution("zero-copy-view", False)
    if functional:
        return Resolution("copy", True, "functional API concatenates the independent split (warns once)")
    return Resolution("rejected", False, "cannot provide the planned packed representation zero-copy; "
                      "re-plan for split input")
