"""A request's context as the offloading manager sees it: vLLM 0.33.0's `ReqContext` (`vllm/v1/kv_offload/base.py`).

The scheduler owns one per request and passes it with every manager call. Two things in it matter to the
model: the key positions the scheduler records (`set_offload_key_position(key, end_token)`: vLLM 0.33.0's
offloading connector scheduler records one for every key it offloads, the key's end-token position, as block
hashes arrive and before it offers the key; and for each boundary key it looks up), and the LRU policy's
request rank (`_RequestRank`: the cache generation it was taken in and the rank; upstream also keeps the owning
policy, one per manager here). The request's cache access record (`_RequestCacheAccess`) upstream lives in the
context too; the model keeps it in the manager by request id (`manager.RequestCacheAccess`).

A context without positions is what the model did before it had them: every rank is then a fresh counter
value, so the LRU order is the order of assignment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class RequestRank(NamedTuple):
    """`_RequestRank`: the rank a request's keys with a position share (valid in one cache generation)."""

    cache_generation: int
    rank: int


@dataclass
class ReqContext:
    req_id: int
    offload_key_positions: dict[int, int] = field(default_factory=dict)
    request_rank: RequestRank | None = None

    def set_offload_key_position(self, key: int, end_token: int) -> None:
        self.offload_key_positions[key] = end_token

    def get_offload_key_position(self, key: int) -> int | None:
        return self.offload_key_positions.get(key)

    @property
    def positional(self) -> bool:
        return bool(self.offload_key_positions)

    def freeze(self) -> tuple:
        return (tuple(sorted(self.offload_key_positions.items())), self.request_rank)

    @classmethod
    def thaw(cls, req_id: int, frozen: tuple) -> "ReqContext":
        positions, rank = frozen
        return cls(req_id, dict(positions), None if rank is None else RequestRank(*rank))

