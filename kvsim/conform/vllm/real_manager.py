"""vLLM's real `KVCacheManager`, imported from a release (`kvsim.conform.installed`), driven in the child.

The driver runs inside `kvsim.conform.installed_child` (the release on `sys.path`, vLLM imported) and answers
a small request vocabulary, each answer JSON:

* `build(num_blocks, block_size, enable_caching=True, events=False, max_model_len=None)`: a new manager for one
  full-attention group (`kv_cache_config`: `KVCacheConfig` with `kv_cache_tensors=[]`, as upstream's CPU tests
  build it; the coordinator's and the scheduler's drivers build theirs with it too), hashed
  with sha256 at the block size; every request of the previous manager is forgotten. Answers `observe`.
* `computed(request, tokens)`: `get_computed_blocks` of the request (made on first use from its token list):
  `{"blocks": [ids in order], "hit": tokens}`; the blocks are kept for the request's next `allocate`.
* `allocate(request, new_tokens, computed_tokens=0, lookahead=0)`: one scheduler step (`new_step_starts`, then
  `allocate_slots` with the blocks the last `computed` returned when `computed_tokens` > 0): `{"blocks": [new ids
  in order] | null, "held": [ids]}`.
* `free(request)`: `free`; the request is forgotten. Answers the blocks it held, in its table's order.
* `observe()`: `{"blocks": [[id, ref_cnt, hashed], ...] by id, "free": [ids in the free queue's order],
  "tables": {request: [ids]} of the requests holding blocks, "events": [...]}` (the events `take_events` hands
  over, `[]` unless the manager was built with events: each `{"type": class name, field: value, ...}`, hashes
  as upstream gives them).

The scheduler's side of a request's life cycle, as the lockstep (`kvsim.conform.vllm.lockstep`) drives it:

* `schedule(request, tokens, lookahead=0)`: `computed` then `allocate` of every token after the hit (and
  `lookahead` slots), in one call: `{"hit": [ids], "hit_tokens": n, "new": [ids] | null, "held": [ids]}` (`new`
  null: the pool cannot give them).
* `decode(request, lookahead=0)`: `allocate` of the tokens sampled but not computed yet (and `lookahead` slots):
  `{"new": [ids] | null, "held": [ids]}`.
* `sample(request, token)`: the step's sampled token appended to the request (its block hashes follow).
* `preempt(request)`: `free`, then the request back to waiting with no token computed (it keeps its tokens and is
  recomputed when scheduled again), as the scheduler's preemption does. Answers the blocks it held.
* `reset()`: `reset_prefix_cache`'s answer.

Every request but `observe` takes `observe=True` to answer `{"answer": ..., "state": observe()}` in one round
trip. Releases differ in signatures (0.33.0's `get_computed_blocks` returns a third count): the driver reads
only what both 0.26.0 and 0.33.0 give.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from kvsim.engine.errors import ConfigError

from ..installed_child import dispatch


def _jsonable(value: Any) -> Any:
    """An event's field as JSON: bytes as hex, msgspec structs and dataclasses as their fields, enums by name."""
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    fields = getattr(value, "__struct_fields__", None)
    if fields is None:
        fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:  # a struct without fields (AllBlocksCleared) too
        return {"type": type(value).__name__, **{f: _jsonable(getattr(value, f)) for f in fields}}
    if hasattr(value, "name") and hasattr(value, "value") and type(value).__module__ != "builtins":
        return value.name
    return value


def kv_cache_spec(kind: str, block_size: int, sliding_window: int, mamba_cache_mode: str,
                  attention_chunk_size: int = 4) -> Any:
    """One KV cache group's spec, as upstream's CPU tests build them: `full` (`FullAttentionSpec`), `swa`
    (`SlidingWindowSpec`), `local` (`ChunkedLocalAttentionSpec`), `mamba` (`MambaSpec` with prefix caching in
    `mamba_cache_mode`)."""
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    if kind == "full":
        return kvi.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    if kind == "swa":
        return kvi.SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32,
                                     sliding_window=sliding_window)
    if kind == "local":
        return kvi.ChunkedLocalAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32,
                                             attention_chunk_size=attention_chunk_size)
    if kind == "mamba":
        return kvi.MambaSpec(block_size=block_size, shapes=((1,),), dtypes=(torch.float32,),
                             mamba_cache_mode=mamba_cache_mode)
    raise ConfigError("groups", "full, swa, local or mamba", kind)


def mamba_cache_mode(named: str | None = None) -> str:
    """The Mamba prefix-caching mode: `named` if the release's `MambaCacheMode` offers it (else a ConfigError), or
    by default `all` where it does (0.26.0-0.31.0), else `align` (0.33.0)."""
    import typing

    from vllm.config import cache

    modes = typing.get_args(cache.MambaCacheMode)
    if named is not None and named not in modes:
        raise ConfigError("mamba_cache_mode", "one of " + ", ".join(modes), named)
    return named or ("all" if "all" in modes else "align")


def kv_cache_config(num_blocks: int, block_size: int, groups: Sequence[str] = ("full",),
                    sliding_window: int = 4, mode: str | None = None, attention_chunk_size: int = 4) -> Any:
    """The `KVCacheConfig` every driver builds (the manager's, the coordinator's, the scheduler's): one group per
    name in `groups` (layer `layer.<g>`), `kv_cache_tensors=[]` as upstream's CPU tests have it; Mamba in prefix-caching
    `mode` (`mamba_cache_mode`'s default if None), chunked local attention in chunks of `attention_chunk_size`."""
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    mode = mamba_cache_mode(mode) if "mamba" in groups else "none"
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([f"layer.{g}"], kv_cache_spec(kind, block_size, sliding_window, mode, attention_chunk_size))
        for g, kind in enumerate(groups)])


OPS = ("build", "computed", "allocate", "free", "observe", "schedule", "decode", "sample", "preempt", "reset")


class ManagerDriver:
    """One real `KVCacheManager` at a time and the requests made on it, answering the requests above."""

    def __init__(self) -> None:
        from vllm.utils.hashing import sha256
        from vllm.v1.core import kv_cache_utils

        self._sha256 = sha256
        kv_cache_utils.init_none_hash(sha256)  # PYTHONHASHSEED is fixed by the parent: the same NONE_HASH each run
        self.manager: Any = None
        self.block_size = 0
        self.per_group = False  # answers name every group's blocks (the coordinator's driver), else group 0's
        self.requests: dict[str, Any] = {}
        self.computed_blocks: dict[str, Any] = {}

    def handle(self, op: str, args: Mapping[str, Any]) -> Any:
        return dispatch(self, op, args, OPS, self.manager is not None, "manager", "observe")

    def op_build(self, num_blocks: int, block_size: int, enable_caching: bool = True, events: bool = False,
                 max_model_len: int | None = None) -> Any:
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.kv_cache_manager import KVCacheManager

        self.manager = KVCacheManager(kv_cache_config(num_blocks, block_size),
                                      max_model_len=max_model_len or num_blocks * block_size,
                                      scheduler_block_size=block_size, hash_block_size=block_size,
                                      enable_caching=enable_caching, enable_kv_cache_events=events)
        self.block_size, self.per_group = block_size, False
        self.hasher = kv_cache_utils.get_request_block_hasher(block_size, self._sha256)
        self.requests.clear()
        self.computed_blocks.clear()
        return self.op_observe()

    def _request(self, request: str, tokens: list[int] | None = None) -> Any:
        if request not in self.requests:
            if tokens is None:
                raise ConfigError("request", "a request first seen with its tokens (op computed)", request)
            from vllm.sampling_params import SamplingParams
            from vllm.v1.request import Request

            self.requests[request] = Request(request, list(tokens), SamplingParams(max_tokens=1), None,
                                             block_hasher=self.hasher)
        return self.requests[request]

    def _ids(self, block_ids: Sequence[Sequence[int]]) -> list:
        """Block ids per group as the driver answers them: every group's (`per_group`), else group 0's."""
        return [list(g) for g in block_ids] if self.per_group else list(block_ids[0])

    def op_computed(self, request: str, tokens: list[int]) -> Any:
        blocks, hit = self.manager.get_computed_blocks(self._request(request, tokens))[:2]
        self.computed_blocks[request] = blocks
        return {"blocks": self._ids(blocks.get_block_ids()), "hit": hit}

    def op_allocate(self, request: str, new_tokens: int, computed_tokens: int = 0, lookahead: int = 0) -> Any:
        """One scheduler step's `allocate_slots` (`new_step_starts` first, as `Scheduler.schedule` does: Mamba's
        manager defers a hit on a block cached in the same step)."""
        self.manager.new_step_starts()
        req = self._request(request)
        computed = self.computed_blocks.pop(request, None) if computed_tokens else None
        blocks = self.manager.allocate_slots(req, new_tokens, computed_tokens, computed,
                                             num_lookahead_tokens=lookahead)
        if blocks is not None:  # what the scheduler does once the step ran: the request's tokens are computed
            from vllm.v1.request import RequestStatus

            req.num_computed_tokens += computed_tokens + new_tokens
            req.status = RequestStatus.RUNNING
        return {"blocks": None if blocks is None else self._ids(blocks.get_block_ids()), "held": self._held(request)}

    def _held(self, request: str) -> list:
        return self._ids(self.manager.get_block_ids(request))

    def _holds(self, request: str) -> bool:
        return any(self.manager.get_block_ids(request))

    def op_free(self, request: str) -> Any:
        held = self._held(request) if request in self.requests else []
        self.manager.free(self._request(request))
        del self.requests[request]
        self.computed_blocks.pop(request, None)
        return held

    def op_schedule(self, request: str, tokens: list[int], lookahead: int = 0) -> Any:
        req = self._request(request, tokens)
        hit = self.op_computed(request, tokens)
        allocated = self.op_allocate(request, req.num_tokens - req.num_computed_tokens - hit["hit"], hit["hit"],
                                     lookahead)
        return {"hit": hit["blocks"], "hit_tokens": hit["hit"], "new": allocated["blocks"], "held": allocated["held"]}

    def op_decode(self, request: str, lookahead: int = 0) -> Any:
        req = self._request(request)
        allocated = self.op_allocate(request, req.num_tokens - req.num_computed_tokens, lookahead=lookahead)
        return {"new": allocated["blocks"], "held": allocated["held"]}

    def op_sample(self, request: str, token: int) -> Any:
        req = self._request(request)
        req.append_output_token_ids(token)
        return req.num_tokens

    def op_preempt(self, request: str) -> Any:
        from vllm.v1.request import RequestStatus

        req = self._request(request)
        held = self._held(request)
        self.manager.free(req)
        req.status, req.num_computed_tokens = RequestStatus.PREEMPTED, 0
        self.computed_blocks.pop(request, None)
        return held

    def op_reset(self) -> Any:
        return bool(self.manager.reset_prefix_cache())

    def op_observe(self) -> Any:
        pool = self.manager.block_pool
        return {"blocks": [[b.block_id, b.ref_cnt, b.block_hash is not None] for b in pool.blocks],
                "free": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
                "tables": {r: self._held(r) for r in sorted(self.requests) if self._holds(r)},
                # asked only of a request holding blocks: for another, 0.26.0-0.31.0 read `req_to_blocks[r]`, a
                # defaultdict, and would add its empty entry (a change the observation would make)
                "common": {r: list(self.manager.get_num_common_prefix_blocks(r)) for r in sorted(self.requests)
                           if self._holds(r)},
                "events": [_jsonable(e) for e in self.manager.take_events()]}
