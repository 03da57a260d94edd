"""The variants of kv-zeroing: the record `ZeroingVariant` (one flag per upstream change) and `VARIANTS`, `fixed` first."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class ZeroingVariant(Variant):
    """What d6af803 (and the later upstream planner `fixed` follows) changed, one flag per change."""

    # d6af803: assert block_size % kernel_block_size == 0 and shape[block_dim] % ratio == 0 (before: floor ratio)
    whole_kernel_blocks: bool
    # d6af803: a segment carries the logical block stride apart from its page (one kernel block's data span),
    # one segment per virtual kernel block, with the alignment assertion (before: one
    # page of stride * ratio words, used as the stride too)
    separate_stride: bool
    # later upstream: merge segments at one address, keeping the widest page (before: skip a buffer whose
    # data_ptr was already seen)
    merge_overlaid: bool
    # d6af803: 3-D launch, BLOCK_SIZE = next power of two of the widest page, masked to the page (before:
    # smallest power-of-two divisor of every page, unmasked)
    masked_launch: bool
    # vLLM 0.29.0: views standardized block dim first, every other dimension whose stride spans more than a block
    # is outer (found by `kvsim conform vllm`; before: only the dimensions before the block dimension)
    outer_past_block: bool


VARIANTS = VariantTable(
    ZeroingVariant("fixed", whole_kernel_blocks=True, separate_stride=True, merge_overlaid=True,
                   masked_launch=True, outer_past_block=True),
    ZeroingVariant("pre_d6af803", whole_kernel_blocks=False, separate_stride=False, merge_overlaid=False,
                   masked_launch=False, outer_past_block=False),
    # vLLM 0.28.0 (d6af803, before the merge of overlaid segments and the standardized views of 0.29.0)
    ZeroingVariant("first_view_overlaid", whole_kernel_blocks=True, separate_stride=True, merge_overlaid=False,
                   masked_launch=True, outer_past_block=False),
)
FIXED = VARIANTS.fixed
