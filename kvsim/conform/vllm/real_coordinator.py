"""vLLM's real KV cache coordinator over several KV cache groups, imported from a release and driven in the child
(`kvsim.conform.installed_child`), beside `real_manager`'s one-group driver.

`CoordinatorDriver` adds to `ManagerDriver`'s vocabulary (whose answers are group 0's until `build_hybrid`):

* `build_hybrid(num_blocks, block_size, groups, sliding_window=4, events=False, use_eagle=False,
  mamba_cache_mode=None, max_model_len=None, attention_chunk_size=4)`: a manager over the named groups (`full`,
  `swa`, `local`, `mamba`, in group order), built as upstream's CPU tests build hybrid configs
  (`real_manager.kv_cache_config`: `KVCacheConfig` with `kv_cache_tensors=[]`, one `KVCacheGroupSpec` per group:
  `FullAttentionSpec`, `SlidingWindowSpec`, `ChunkedLocalAttentionSpec`, `MambaSpec`
  with prefix caching: mode `all` where the release has it (0.26.0-0.31.0), else `align`, unless `mamba_cache_mode`
  names one), `use_eagle` as the scheduler passes it with EAGLE/MTP speculative decoding (no group flagged, so every
  group gets the EAGLE last-block drop, as upstream falls back). Answers `observe` plus `{"coordinator": class
  name, "mamba_cache_mode": ...}`.
* `hits(request, tokens)`: the lookups a scheduler makes for a new request, none of which changes the pool:
  `per_group` (`find_longest_cache_hit_per_group` up to `num_tokens - 1`: each group's hit and block ids),
  `reconciled` (`get_computed_blocks`) and `connector`, the local hit the scheduler hands a KV connector where
  the manager chooses it: 0.27.0+ `KVCacheManager.get_computed_blocks_for_connector`, the release's own code;
  0.26.0 has no such method (the choice, `max(per_group_hits)`, is in `Scheduler.schedule`, which
  `real_scheduler.SchedulerDriver` drives for target `connector_hit_48195`): null there.
* after `build_hybrid`, every answer names every group's block ids (`{"blocks": [[ids] per group], ...}`, the
  tables, a free's blocks). `decode(request, token)`: the request's sampled token appended (its block hashes grow
  with it), then `allocate` of one slot; without `token`, `ManagerDriver`'s.
"""

from __future__ import annotations

from typing import Any

from . import real_manager
from .real_manager import ManagerDriver, kv_cache_config


class CoordinatorDriver(ManagerDriver):
    def __init__(self) -> None:
        super().__init__()
        self.mamba_cache_mode = ""

    def handle(self, op: str, args: Any) -> Any:
        if op == "build_hybrid":  # a build, so no manager is needed before it
            return self.op_build_hybrid(**dict(args))
        return super().handle(op, args)

    def op_build_hybrid(self, num_blocks: int, block_size: int, groups: list[str], sliding_window: int = 4,
                        events: bool = False, use_eagle: bool = False, mamba_cache_mode: str | None = None,
                        max_model_len: int | None = None, attention_chunk_size: int = 4) -> Any:
        from vllm.v1.core.kv_cache_manager import KVCacheManager

        self.mamba_cache_mode = real_manager.mamba_cache_mode(mamba_cache_mode)
        config = kv_cache_config(num_blocks, block_size, groups, sliding_window, self.mamba_cache_mode,
                                 attention_chunk_size)
        self.op_build(num_blocks, block_size, events=events)  # the hasher at the block size, the requests forgotten
        self.per_group = True
        self.manager = KVCacheManager(config, max_model_len=max_model_len or num_blocks * block_size,
                                      scheduler_block_size=block_size,
                                      hash_block_size=block_size, enable_caching=True, enable_kv_cache_events=events,
                                      use_eagle=use_eagle)
        return {**self.op_observe(), "coordinator": type(self.manager.coordinator).__name__,
                "mamba_cache_mode": self.mamba_cache_mode if "mamba" in groups else None}

    # -- the lookups -----------------------------------------------------------------------------------------
    @staticmethod
    def ids(blocks: Any) -> list[list[int]]:
        return [[b.block_id for b in group] for group in blocks]

    def connector_hit(self, req: Any) -> dict[str, Any] | None:
        """0.27.0+: the manager's `get_computed_blocks_for_connector`; before it the choice is the scheduler's
        (`Scheduler.schedule`, driven by `real_scheduler.SchedulerDriver`): None."""
        if not hasattr(self.manager, "get_computed_blocks_for_connector"):
            return None
        blocks, hit = self.manager.get_computed_blocks_for_connector(req)[:2]
        return {"hit": hit, "blocks": blocks.get_block_ids()}

    def op_hits(self, request: str, tokens: list[int]) -> Any:
        req = self._request(request, tokens)
        coordinator = self.manager.coordinator
        per_group = coordinator.find_longest_cache_hit_per_group(req.block_hashes, req.num_tokens - 1) \
            if hasattr(coordinator, "find_longest_cache_hit_per_group") else None
        blocks, hit = self.manager.get_computed_blocks(req)[:2]
        return {"per_group": None if per_group is None else {"hits": list(per_group[1]),
                                                             "blocks": self.ids(per_group[0])},
                "reconciled": {"hit": hit, "blocks": blocks.get_block_ids()},
                "connector": self.connector_hit(req)}

    def op_decode(self, request: str, token: int | None = None, lookahead: int = 0) -> Any:
        """`token` given: appended (its block hashes follow), then `allocate` of one slot; else `ManagerDriver`'s
        decode (the lockstep samples first)."""
        if token is None:
            return super().op_decode(request, lookahead)
        self._request(request).append_output_token_ids(token)
        return self.op_allocate(request, 1, lookahead=lookahead)
