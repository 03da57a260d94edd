"""The variant record of `mla-backends`: one flag per upstream change, read at exactly that line.

* `merge_guards_empty_state` (FlashInfer #4401 for CUDA, #4054 / #5262 pending for the Python
  references, #4051 open; vLLM #28181 CUDA, #39148 Triton): `merge_state` clamps the exponent so
  that two empty states `(0, -inf)` merge to `(0, -inf)`, not NaN. Read in `merge.merge_state`.
* `masked_rows_lse_neg_inf` (FlashInfer #4452): a causal row that sees no key (`qo_len > kv_len`)
  reports LSE `-inf`, not a large finite number. Read in `merge.attention_state`.
* `transactional_plan` (#4031, `BatchMLAPagedAttentionWrapper.plan`: publish only on success):
  a rejected or failed re-plan leaves the previous plan live. Read in `wrapper.WrapperSystem`.
* `fallback_only_on_unsupported` (#4031, `_BatchMLAPagedAttentionAutoBackend`): auto selection
  falls back only on the typed `_BackendPlanUnsupportedError`; invalid input, JIT, allocation
  and runtime errors propagate. Read in `selection.select_backend`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class MlaBackendsVariant(Variant):
    merge_guards_empty_state: bool  # #4051 / #4401; vLLM #28181, #39148
    masked_rows_lse_neg_inf: bool  # #4452
    transactional_plan: bool  # #4031: publish the plan only on success
    fallback_only_on_unsupported: bool  # #4031: auto catches only the typed unsupported signal


VARIANTS = VariantTable(
    MlaBackendsVariant("fixed", True, True, True, True),
    MlaBackendsVariant("merge_nan_4051", False, True, True, True),
    MlaBackendsVariant("finite_masked_lse_4452", True, False, True, True),
    MlaBackendsVariant("nontransactional_replan", True, True, False, True),
    MlaBackendsVariant("fallback_any_error", True, True, True, False),
)
FIXED = VARIANTS.fixed
