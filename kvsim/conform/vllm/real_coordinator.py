"""vLLM's real KV cache coordinator over several KV cache groups, imported from a release and driven in the child
(`kvsim.conform.installed_child`), beside `real_manager`'s one-group driver.

`CoordinatorDriver` adds to `ManagerDriver`'s vocabulary (whose answers stay group 0's):

* `build_hybrid(num_blocks, block_size, groups, sliding_window=4, events=False, use_eagle=False,
  mamba_cache_mode=None)`: a manager over the named groups (`full`, `swa`, `mamba`, in group order), built as
  upstream's CPU tests build hybrid configs (`KVCacheConfig` with `kv_cache_tensors=[]`, one `KVCacheGroupSpec` per
  group: `FullAttentionSpec`, `SlidingWindowSpec`, `MambaSpec` with prefix caching: mode `all` where the release
  has it (0.26.0-0.30.0), else `align`, unless `mamba_cache_mode` names one), `use_eagle` as the scheduler passes
  it with EAGLE/MTP speculative decoding (no group flagged, so every group gets the EAGLE last-block drop, as
  upstream falls back). Answers `observe` plus `{"coordinator": class name, "mamba_cache_mode": ...}`.
* `hits(request, tokens)`: the lookups a scheduler makes for a new request, none of which changes the pool:
  `per_group` (`find_longest_cache_hit_per_group` up to `num_tokens - 1`: each group's hit and block ids),
  `reconciled` (`get_computed_blocks`) and `connector`, the local hit the scheduler hands a KV connector:
  0.27.0+ `KVCacheManager.get_computed_blocks_for_connector`, the release's own code; 0.26.0 has no such method:
  there the choice is in `Scheduler.schedule`, which cannot be built here (its `VllmConfig` needs a model config,
  read from the Hugging Face hub), so the driver runs the same branch on the real coordinator's per-group hits
  and applies the release's reduction, `max(per_group_hits)`, after checking that line is in the release's
  `vllm/v1/core/sched/scheduler.py` (`scheduler_line`: the line as the release has it).
* `computed` and `allocate` answer every group's block ids (`{"blocks": [[ids] per group], ...}`); each
  `allocate` is one scheduler step (`new_step_starts` first, as `Scheduler.schedule` does). `decode(request,
  token)`: the request's sampled token appended (its block hashes grow with it), then `allocate` of one slot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvsim.engine.errors import ConfigError

from .real_manager import ManagerDriver

SCHEDULER_MAX_LINE = "num_new_local_computed_tokens = max(per_group_hits)"


class CoordinatorDriver(ManagerDriver):
    def __init__(self) -> None:
        super().__init__()
        self.mamba_cache_mode = ""

    def handle(self, op: str, args: Any) -> Any:
        if op == "build_hybrid":  # a build, so no manager is needed before it
            return self.op_build_hybrid(**dict(args))
        return super().handle(op, args)

    def spec(self, kind: str, block_size: int, sliding_window: int) -> Any:
        import torch
        from vllm.v1 import kv_cache_interface as kvi

        if kind == "full":
            return kvi.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        if kind == "swa":
            return kvi.SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32,
                                         sliding_window=sliding_window)
        if kind == "mamba":
            return kvi.MambaSpec(block_size=block_size, shapes=((1,),), dtypes=(torch.float32,),
                                 mamba_cache_mode=self.mamba_cache_mode)
        raise ConfigError("groups", "full, swa or mamba", kind)

    def op_build_hybrid(self, num_blocks: int, block_size: int, groups: list[str], sliding_window: int = 4,
                        events: bool = False, use_eagle: bool = False, mamba_cache_mode: str | None = None) -> Any:
        import typing

        from vllm.config import cache
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

        modes = typing.get_args(cache.MambaCacheMode)
        if mamba_cache_mode is not None and mamba_cache_mode not in modes:
            raise ConfigError("mamba_cache_mode", "one of " + ", ".join(modes), mamba_cache_mode)
        self.mamba_cache_mode = mamba_cache_mode or ("all" if "all" in modes else "align")
        config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec([f"layer.{g}"], self.spec(kind, block_size, sliding_window))
            for g, kind in enumerate(groups)])
        self.op_build(num_blocks, block_size, events=events)  # the hasher at the block size, the requests forgotten
        self.manager = KVCacheManager(config, max_model_len=num_blocks * block_size, scheduler_block_size=block_size,
                                      hash_block_size=block_size, enable_caching=True, enable_kv_cache_events=events,
                                      use_eagle=use_eagle)
        return {**self.op_observe(), "coordinator": type(self.manager.coordinator).__name__,
                "mamba_cache_mode": self.mamba_cache_mode if "mamba" in groups else None}

    # -- the lookups -----------------------------------------------------------------------------------------
    @staticmethod
    def ids(blocks: Any) -> list[list[int]]:
        return [[b.block_id for b in group] for group in blocks]

    def scheduler_line(self) -> str:
        """The release's own max-over-groups line (0.26.0), or a ConfigError where the release lacks it."""
        import vllm

        path = Path(vllm.__file__).parent / "v1" / "core" / "sched" / "scheduler.py"
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() == SCHEDULER_MAX_LINE:
                return line.strip()
        raise ConfigError("release", f"a scheduler with {SCHEDULER_MAX_LINE!r} (0.26.0) or a manager with "
                                     "get_computed_blocks_for_connector (0.27.0+)", str(path))

    def connector_hit(self, req: Any) -> dict[str, Any]:
        from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator

        manager = self.manager
        if hasattr(manager, "get_computed_blocks_for_connector"):
            blocks, hit = manager.get_computed_blocks_for_connector(req)[:2]
            return {"hit": hit, "blocks": blocks.get_block_ids(), "by": "get_computed_blocks_for_connector"}
        # 0.26.0: Scheduler.schedule's branch for a request with a connector, on the real coordinator
        coordinator = manager.coordinator
        if manager.kv_cache_config.has_mamba_layers and isinstance(coordinator, HybridKVCacheCoordinator):
            computed, per_group_hits = coordinator.find_longest_cache_hit_per_group(req.block_hashes,
                                                                                    req.num_tokens - 1)
            line = self.scheduler_line()
            return {"hit": max(per_group_hits), "blocks": self.ids(computed), "by": line}
        blocks, hit = manager.get_computed_blocks(req)[:2]
        return {"hit": hit, "blocks": blocks.get_block_ids(), "by": "get_computed_blocks"}

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

    def op_computed(self, request: str, tokens: list[int]) -> Any:
        blocks, hit = self.manager.get_computed_blocks(self._request(request, tokens))[:2]
        self.computed_blocks[request] = blocks
        return {"blocks": blocks.get_block_ids(), "hit": hit}

    def op_allocate(self, request: str, new_tokens: int, computed_tokens: int = 0, lookahead: int = 0) -> Any:
        self.manager.new_step_starts()
        req = self._request(request)
        computed = self.computed_blocks.pop(request, None) if computed_tokens else None
        blocks = self.manager.allocate_slots(req, new_tokens, computed_tokens, computed,
                                             num_lookahead_tokens=lookahead)
        if blocks is not None:
            req.num_computed_tokens += computed_tokens + new_tokens
        return {"blocks": None if blocks is None else blocks.get_block_ids(),
                "held": [list(g) for g in self.manager.get_block_ids(request)]}

    def op_decode(self, request: str, token: int) -> Any:
        self._request(request).append_output_token_ids(token)
        return self.op_allocate(request, 1)
