"""The KV cache events the block pool publishes (vLLM 0.33.0 `vllm/distributed/kv_events.py`), as tagged records.

Only the fields a full-attention group without LoRA, multimodal inputs or lookahead hashing fills in are kept:
`BlockStored` names the hashes of the blocks a request just cached (the parent hash is None for a chain's first
block), `BlockRemoved` one hash whose cache entry went (upstream emits one event per removed hash),
`AllBlocksCleared` a successful `reset_prefix_cache`.
"""

from __future__ import annotations

from kvsim.engine.actions import tagged, type_table

BlockStored = tagged("block_stored", "block_hashes", "parent_block_hash", "token_ids", "block_size")
BlockRemoved = tagged("block_removed", "block_hashes")
AllBlocksCleared = tagged("all_blocks_cleared")
KV_EVENTS = type_table((BlockStored, BlockRemoved, AllBlocksCleared))
