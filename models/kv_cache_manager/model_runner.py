"""What the model runner writes into the blocks the manager's tables name: the ledger `checks.hit_state_identity`
reads (block id -> the kind of state it holds and the tokens it is the state of: `("full", (1, 1, 2))`).

The manager decides which block sits at which position of a request's table; the runner writes there. One step
of a request computes its tokens `[start, end)`:

* an attention group (`full`, `swa`, `local`) writes each new token's KV into the block at position `token // block_size`:
  that block then holds the KV of the request's tokens up to `min(end, (i + 1) * block_size)` (its contents depend
  on the whole prefix), the null block (id 0) never;
* a Mamba group in mode `align` writes the state after `end` tokens into the running column
  `cdiv(end, block_size) - 1` (vLLM's `preprocess_mamba_align_fused_kernel`: `new_state_idx`, the state copied
  there from the previous running column first, which is only read). Without speculative decoding every
  scheduled token is accepted, so `end` is the step's end; the accepted-token bias of a step with draft tokens
  (`postprocess_mamba_fused_kernel`) is the runner's, not stated here.

A block keeps what was last written into it until it is written again (a freed block's contents survive in the
free queue, which is what a prefix hit relies on).
"""

from __future__ import annotations

from typing import Sequence

WRITERS = ("full", "swa", "local", "mamba")


def step_writes(kinds: Sequence[str], tables: Sequence[Sequence[int]], tokens: Sequence[int], start: int, end: int,
                block_size: int) -> dict[int, tuple[str, tuple[int, ...]]]:
    """The blocks one step of a request writes, each with its kind and the prefix its contents are now the state of."""
    if not 0 <= start < end <= len(tokens):
        raise ValueError(f"a step computes tokens [start, end) of the request: got [{start}, {end}) of "
                         f"{len(tokens)}")
    writes: dict[int, tuple[int, ...]] = {}
    for kind, table in zip(kinds, tables):
        if kind in ("full", "swa", "local"):
            for i in range(start // block_size, -(-end // block_size)):
                if i < len(table) and table[i]:
                    writes[table[i]] = (kind, tuple(tokens[:min(end, (i + 1) * block_size)]))
        elif kind == "mamba":
            i = -(-end // block_size) - 1
            if i < len(table) and table[i]:
                writes[table[i]] = (kind, tuple(tokens[:end]))
        else:
            raise ValueError(f"kinds: expected one of {', '.join(WRITERS)}, got {kind!r}")
    return writes
