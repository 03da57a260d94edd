"""The eviction order a position-aware policy promises (vLLM 0.33.0, issue 30), on operation sequences whose
request contexts record key positions (`strategies.POSITION_CASES`).

* `lru_evicts_a_request_tail_first`: the keys one request ranks (its shared rank, `(request_rank, -position)`)
  leave tail first: an eviction never takes such a key while an idle, unoffered key of the same request rank
  with a later position stays.
* `arc_finishes_in_position_order`: a request whose context records a position for every key it saw is
  applied tail to head at its finish, so the keys the finish moves (stored only, or reused) end each of T1
  and T2 in descending position order, the head the most recent.

Both read the model's value form (`ManagerState`: with positions it carries the LRU ranks and the contexts).
Each is shown failing on a planted change (tests/models/kv_offload/test_kv_offload_positions.py).
"""

from __future__ import annotations

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.kv_offload.manager import ManagerState
from kvsim.models.kv_offload.variants import OffloadVariant

from .cases import OpsCase, iter_ops

MODEL = "kv-offload"


def _fail(case: OpsCase, index: int, op: tuple, message: str) -> None:
    raise PropertyViolation(f"step {index} {op!r} ({case.policy}, capacity {case.capacity}, positions "
                            f"{case.positions}, mixed {case.mixed}): {message}")


def _request_groups(state: ManagerState) -> dict[int, dict[int, int]]:
    """Each request rank of the current LRU generation -> its context's recorded positions (key -> end token)."""
    policy = state.policy
    if policy[0] != "lru" or len(policy) == 2:
        return {}
    return {rank.rank: dict(positions) for entry in state.requests if len(entry) == 3
            for positions, rank in (entry[2],) if rank is not None and rank.cache_generation == policy[4]}


def _lru_ranks(state: ManagerState) -> dict[int, tuple[tuple[int, int], int]]:
    """key -> (rank, ref_cnt) of a ranked LRU state ({} for the unranked form: no positions recorded yet)."""
    policy = state.policy
    if policy[0] != "lru" or len(policy) == 2:
        return {}
    return {k: (rank, ref) for (k, ref, _), rank in zip(policy[1], policy[2])}


@kv_property(model=MODEL, strategy="POSITION_CASES")
def lru_evicts_a_request_tail_first(case: OpsCase, variant: OffloadVariant) -> None:
    """Within one request's rank, LRU evicts tail keys (later positions) before head keys."""
    for i, step in enumerate(iter_ops(case, variant)):
        if step.op[0] != "store" or step.result is None or not step.result.evicted_keys:
            continue
        ranks, groups = _lru_ranks(step.before), _request_groups(step.before)
        evicted, offered = set(step.result.evicted_keys), set(step.op[2])
        for key in evicted:
            if key not in ranks:
                continue  # the unranked form: no context records positions
            (request_rank, _), _ = ranks[key]
            positions = groups.get(request_rank)
            if positions is None or key not in positions:
                continue  # a counter rank, not a request's
            later = [k for k, ((r, _), ref) in ranks.items()
                     if r == request_rank and positions.get(k, 0) > positions[key] and ref == 0
                     and k not in offered | evicted]
            if later:
                _fail(case, i, step.op, f"evicted key {key} (end token {positions[key]}) while its request's later "
                                        f"keys {sorted(later)} stay idle")


def _lists(state: ManagerState) -> tuple[list[int], list[int]]:
    _, t1, t2, *_ = state.policy
    return [k for k, _, _ in t1], [k for k, _, _ in t2]


def _request(state: ManagerState, req: int) -> tuple[tuple | None, dict[int, int]]:
    """A request's frozen access record and its recorded positions (None, {}: no positions recorded)."""
    for entry in state.requests:
        if entry[0] == req and len(entry) == 3:
            return entry[1], dict(entry[2][0])
    return None, {}


@kv_property(model=MODEL, strategy="POSITION_CASES")
def arc_finishes_in_position_order(case: OpsCase, variant: OffloadVariant) -> None:
    """ARC applies a finished request's keys tail to head by position: the keys it moves end each list in
    descending position order."""
    if case.policy != "arc":
        return
    for i, step in enumerate(iter_ops(case, variant)):
        if step.op[0] != "finish":
            continue
        access, positions = _request(step.before, step.op[1])
        if access is None or access[0] != step.before.cache_generation or access[5]:
            continue  # no record in this cache generation, or finished already: the finish changes nothing
        _, seen, inserted, reused, _, _ = access
        if not seen or any(k not in positions for k in seen):
            continue  # not every key has a position: first-seen order applies
        moved = (set(inserted) - set(reused)) | set(reused)
        for name, keys in zip(("T1", "T2"), _lists(step.after)):
            mine = [k for k in keys if k in moved]
            ends = [positions[k] for k in mine]
            if ends != sorted(ends, reverse=True):
                _fail(case, i, step.op, f"{name} holds the request's keys {mine} (end tokens {ends}): not tail to "
                                        f"head")
