"""Inputs of the kv-offload manager properties, and the pinned upstream cases (no Hypothesis).

An `OpsCase` is a manager configuration and a list of operation *intents*; `run_ops` resolves each
intent against the manager's current state (a load takes keys that are ready, a completed load keys
that are pinned, a reset waits for no load in flight, a finished request is replaced by a fresh one),
so any drawn list is a valid call sequence, as the scheduler would make it.

Intents: ("store", req, keys), ("complete_store", req, keys, success), ("load", req, keys) and
("complete_load", req, keys) (literal keys, for pinned cases), ("load_ready", req, picks) and
("complete_load_pinned", req, picks) (indices into the keys ready, or pinned, at that point),
("complete_pending", req, success) (complete_store of every write-pending key),
("touch", req, keys), ("lookup", key), ("finish", req), ("reset",), ("take_events",), ("get_stats",).
Keys are distinct within one call (the scheduler's contract). With `positions` (each key's end token, as the
scheduler records them) every request's context records them before its first call; `mixed`: odd requests
record none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from kvsim.engine.system import Sometimes
from kvsim.models.kv_offload.manager import CPUOffloadingManager, ManagerState
from kvsim.models.kv_offload.status import LookupResult, OffloadingEvent, PrepareStoreOutput
from kvsim.models.kv_offload.variants import FIXED, OffloadVariant


@dataclass(frozen=True)
class OpsCase:
    capacity: int
    policy: str
    ops: tuple[tuple, ...]
    store_threshold: int = 1
    max_tracker_size: int = 64_000
    positions: tuple[int, ...] | None = None  # key i's end token; None: no context records positions
    mixed: bool = False  # odd requests record no positions

    def positions_of(self, req: int) -> dict[int, int]:
        if self.positions is None or (self.mixed and req % 2):
            return {}
        return dict(enumerate(self.positions))


class Step(NamedTuple):
    """One resolved call: the operation as made, its result, and the manager before and after."""

    op: tuple
    result: Any
    before: ManagerState
    after: ManagerState


def new_manager(case: OpsCase, variant: OffloadVariant = FIXED) -> CPUOffloadingManager:
    return CPUOffloadingManager(case.capacity, case.policy, True, case.store_threshold, case.max_tracker_size,
                                variant)


def resolve(m: CPUOffloadingManager, intent: tuple, reqs: dict[int, int]) -> tuple | None:
    """The call an intent makes on `m` now (None: nothing to do in this state)."""
    kind = intent[0]
    req = reqs.setdefault(intent[1], intent[1]) if len(intent) > 1 and kind not in ("lookup",) else None
    if kind in ("load_ready", "complete_load_pinned"):
        load = kind == "load_ready"
        pool = sorted(k for k, c in m.resident().items() if (c.ref_cnt >= 0 if load else c.ref_cnt > 0))
        keys = tuple(dict.fromkeys(pool[p % len(pool)] for p in intent[2])) if pool else ()
        return ("load" if load else "complete_load", req, keys) if keys else None
    if kind == "complete_pending":
        keys = tuple(sorted(k for k, c in m.resident().items() if c.ref_cnt == -1))
        return ("complete_store", req, keys, intent[2]) if keys else None
    if kind == "reset" and any(c.ref_cnt > 0 for c in m.resident().values()):
        return None  # the scheduler flushes in-flight loads before a reset
    if kind in ("store", "touch", "load", "complete_load"):
        return (kind, req, tuple(intent[2]))
    if kind == "complete_store":
        return (kind, req, tuple(intent[2]), intent[3])
    if kind == "finish":
        return (kind, req)
    return intent


def call(m: CPUOffloadingManager, op: tuple) -> Any:
    kind = op[0]
    if kind == "store":
        return m.prepare_store(op[2], op[1])
    if kind == "complete_store":
        return m.complete_store(op[2], op[3])
    if kind == "load":
        return m.prepare_load(op[2], op[1])
    if kind == "complete_load":
        return m.complete_load(op[2])
    if kind == "touch":
        return m.touch(op[2])
    if kind == "lookup":
        return m.lookup(op[1])
    if kind == "finish":
        return m.on_request_finished(op[1])
    if kind == "reset":
        return m.reset_cache()
    if kind == "take_events":
        return m.take_events()
    if kind == "get_stats":
        return m.get_stats()
    raise ValueError(f"unknown operation {op!r}")


def run_ops(case: OpsCase, variant: OffloadVariant = FIXED, manager: CPUOffloadingManager | None = None) -> list[Step]:
    return list(iter_ops(case, variant, manager))


def iter_ops(case: OpsCase, variant: OffloadVariant = FIXED, manager: CPUOffloadingManager | None = None):
    """`run_ops` one step at a time (a property checks each step before the next one runs)."""
    m = manager if manager is not None else new_manager(case, variant)
    reqs: dict[int, int] = {}
    next_req = 1000
    for intent in case.ops:
        op = resolve(m, intent, reqs)
        if op is None:
            continue
        if op[0] not in ("lookup", "reset", "take_events", "get_stats") and op[1] not in m._contexts:
            context = m.req_context(op[1])  # the scheduler records positions before the request's first call
            for key, end_token in case.positions_of(op[1]).items():
                context.set_offload_key_position(key, end_token)
        before = m.freeze()
        result = call(m, op)
        if op[0] == "finish":  # a finished request sees no more keys: its later intents go to a new request
            reqs[intent[1]] = next_req
            next_req += 1
        yield Step(op, result, before, m.freeze())


# -- pinned upstream cases -------------------------------------------------------------------------

def _out(keys: tuple, ids: tuple, evicted: tuple) -> PrepareStoreOutput:
    return PrepareStoreOutput(keys, ids, evicted)


HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING

# tests/v1/kv_offload/cpu/test_manager.py::test_cpu_manager (LRU, capacity 4), research note 3.4, step by
# step: (operation, expected result). Events are 0.33.0's: the failed store of 9 adds a metadata-only removal.
TEST_CPU_MANAGER = (
    (("store", 0, (1, 2)), _out((1, 2), (0, 1), ())),
    (("lookup", 1), PENDING), (("lookup", 2), PENDING),
    (("take_events",), ()),
    (("complete_store", 0, (1, 2), True), None),
    (("take_events",), (OffloadingEvent((1, 2), removed=False),)),
    (("lookup", 1), HIT), (("lookup", 2), HIT), (("lookup", 3), MISS),
    (("store", 0, (2, 3, 4, 5)), _out((3, 4, 5), (2, 3, 0), (1,))),
    (("take_events",), (OffloadingEvent((1,), removed=True),)),
    (("store", 0, (1, 6)), None),
    (("complete_store", 0, (2, 3, 4, 5), True), None),
    (("lookup", 1), MISS), (("lookup", 2), HIT), (("lookup", 3), HIT), (("lookup", 4), HIT), (("lookup", 5), HIT),
    (("lookup", 0), MISS),
    (("load", 0, (2, 3)), (1, 2)),
    (("store", 0, (6, 7, 8)), None),
    (("complete_load", 0, (2, 3)), None),
    (("store", 0, (6, 7, 8)), _out((6, 7, 8), (3, 2, 1), (2, 3, 4))),
    (("complete_store", 0, (6, 7, 8), True), None),
    (("touch", 0, (5, 6, 7)), None),
    (("store", 0, (9,)), _out((9,), (1,), (8,))),
    (("complete_store", 0, (7, 9), False), None),
    (("lookup", 7), HIT), (("lookup", 9), MISS),
    (("take_events",), (OffloadingEvent((3, 4, 5), removed=False), OffloadingEvent((2, 3, 4), removed=True),
                        OffloadingEvent((6, 7, 8), removed=False), OffloadingEvent((8,), removed=True),
                        OffloadingEvent((9,), removed=True, metadata_only=True))),
)

# test_already_stored_block_not_evicted_during_prepare_store (LRU and ARC, capacity 4): key 2 must survive.
ALREADY_STORED = (
    (("store", 0, (1, 2)), _out((1, 2), (0, 1), ())),
    (("complete_store", 0, (1, 2), True), None),
    (("touch", 0, (1,)), None),
    (("store", 0, (2, 3, 4, 5)), _out((3, 4, 5), (2, 3, 0), (1,))),
    (("complete_store", 0, (2, 3, 4, 5), True), None),
    (("lookup", 2), HIT),
)
# the same calls before #35846: key 2 (the LRU candidate) is evicted and its slot 1 reused
ALREADY_STORED_PRE_FIX = {3: _out((3, 4, 5), (2, 3, 1), (2,)), 5: MISS}

# test_prepare_load_preserves_key_order (LRU, capacity 4): the load spec is co-indexed with the keys, any order.
PREPARE_LOAD_ORDER = (
    (("store", 0, (0, 1, 2)), _out((0, 1, 2), (0, 1, 2), ())),
    (("complete_store", 0, (0, 1, 2), True), None),
    (("load", 0, (0, 1, 2)), (0, 1, 2)),
    (("complete_load", 0, (0, 1, 2)), None),
    (("load", 0, (1, 2, 0)), (1, 2, 0)),
    (("complete_load", 0, (0, 1, 2)), None),
)

# The CPU cache usage gauge (`vllm:kv_offload_cpu_cache_usage_perc`): the chunks in use (write-pending, or
# pinned by a load; not the idle ones) over the capacity. (capacity, operations, expected usage, write, read).
USAGE_GAUGE = (
    (0, (("store", 0, (1, 2)),), 0.0, 0.0, 0.0),  # no slot at all: 0.0, not a division by zero
    (4, (("store", 0, (1, 2)),), 0.5, 0.5, 0.0),  # 2 of 4 write-pending
    (4, (("store", 0, (1, 2)), ("complete_store", 0, (1, 2), True)), 0.0, 0.0, 0.0),  # stored, idle
    (4, (("store", 0, (1, 2)), ("complete_store", 0, (1, 2), True), ("load", 0, (1, 2))), 0.5, 0.0, 0.5),
    (4, (("store", 0, (1, 2, 3, 4)),), 1.0, 1.0, 0.0),  # full
)


def pinned_case(steps: tuple, capacity: int = 4, policy: str = "lru") -> OpsCase:
    return OpsCase(capacity, policy, tuple(op for op, _ in steps))


PINNED = (pinned_case(TEST_CPU_MANAGER), pinned_case(ALREADY_STORED), pinned_case(ALREADY_STORED, policy="arc"),
          pinned_case(PREPARE_LOAD_ORDER))


# -- what some drawn run must do (`sometimes`: a strategy that never draws these corners checks nothing there) --------

def _stores_evicting(case: OpsCase) -> bool:
    return any(step.op[0] == "store" and step.result is not None and step.result.evicted_keys
               for step in run_ops(case))


def _store_refused(case: OpsCase) -> bool:
    return any(step.op[0] == "store" and step.result is None for step in run_ops(case))


def _store_fails(case: OpsCase) -> bool:
    return any(step.op[0] == "complete_store" and step.op[-1] is False for step in run_ops(case))


def _load_runs(case: OpsCase) -> bool:
    return any(step.op[0] == "load" and step.result for step in run_ops(case))


# the strategy of the manager properties (`OPS_CASES`): a full cache evicts or refuses, a store fails, a load runs
OPS_SOMETIMES = (
    Sometimes("a_store_evicts", _stores_evicting, "prepare_store evicts an idle chunk to make room"),
    Sometimes("a_store_is_refused", _store_refused,
              "prepare_store finds no room (every chunk held) and stores nothing"),
    Sometimes("a_store_fails", _store_fails, "complete_store reports a failed transfer"),
    Sometimes("a_load_runs", _load_runs, "prepare_load hands out chunks to load"),
)
