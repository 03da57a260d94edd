"""The manager's invariants (research note section 3.3, items 2-6) as checks returning None or a message.

State checks read a `ManagerState` (the value form of the manager); step checks compare the state
before and after one operation with its result. The transition system runs both on every state and
step; the properties run them on Hypothesis-drawn operation sequences.
"""

from __future__ import annotations

from typing import Sequence

from .manager import ManagerState
from .status import PrepareStoreOutput


def resident(state: ManagerState) -> dict[int, tuple[int, int]]:
    """key -> (ref_cnt, chunk_id) of every chunk the policy holds."""
    frozen = state.policy
    entries = frozen[1] if frozen[0] == "lru" else frozen[1] + frozen[2]
    return {key: (ref, cid) for key, ref, cid in entries}


def capacity_and_free_list(state: ManagerState, capacity: int) -> str | None:
    """Item 2: 0 <= allocated <= capacity; the free list has no duplicates and lies in [0, allocated);
    live and free ids are disjoint and together exactly [0, allocated)."""
    allocated, free = state.num_allocated_chunks, state.free_list
    if not 0 <= allocated <= capacity:
        return f"allocated chunks: expected in [0, {capacity}], got {allocated}"
    if len(set(free)) != len(free):
        return f"free list: expected no duplicates, got {list(free)}"
    if any(not 0 <= c < allocated for c in free):
        return f"free list: expected ids in [0, {allocated}), got {list(free)}"
    live = [cid for _, cid in resident(state).values()]
    if len(set(live)) != len(live):
        return f"live chunk ids: expected distinct, got {sorted(live)}"
    if set(live) & set(free):
        return f"chunk ids both live and free: expected none, got {sorted(set(live) & set(free))}"
    if sorted(live + list(free)) != list(range(allocated)):
        return f"live + free chunk ids: expected exactly 0..{allocated - 1}, got {sorted(live + list(free))}"
    return None


def counters(state: ManagerState) -> str | None:
    """Item 3: evictable == #{ref_cnt == 0}, write-pending == #{ref_cnt == -1}, neither negative, ref_cnt >= -1."""
    refs = [ref for ref, _ in resident(state).values()]
    if any(ref < -1 for ref in refs):
        return f"ref_cnt: expected >= -1, got {min(refs)}"
    if state.num_evictable_cache_chunks != refs.count(0) or state.num_evictable_cache_chunks < 0:
        return f"_num_evictable_cache_chunks: expected {refs.count(0)} (ref_cnt == 0), got " \
               f"{state.num_evictable_cache_chunks}"
    if state.num_write_pending_chunks != refs.count(-1) or state.num_write_pending_chunks < 0:
        return f"_num_write_pending_chunks: expected {refs.count(-1)} (ref_cnt == -1), got " \
               f"{state.num_write_pending_chunks}"
    return None


def no_input_key_evicted(keys: Sequence[int], out: PrepareStoreOutput | None) -> str | None:
    """Item 4 (#35846): `prepare_store` never evicts a key it was offered."""
    if out is None:
        return None
    hit = [k for k in out.evicted_keys if k in keys]
    if hit:
        return f"prepare_store({list(keys)}) evicted input keys {hit}: expected none (an already-stored key " \
               f"must stay)"
    return None


def store_semantics(before: ManagerState, after: ManagerState, keys: Sequence[int],
                    out: PrepareStoreOutput | None) -> str | None:
    """Item 4: slots returned are distinct, not live before, co-indexed with the keys to store; only idle
    (ref_cnt 0) chunks are evicted; a None result leaves every slot as it was."""
    was, now = resident(before), resident(after)
    if out is None:
        if was != now or before.free_list != after.free_list or \
                before.num_allocated_chunks != after.num_allocated_chunks:
            return f"prepare_store({list(keys)}) returned None: expected the slots unchanged, got {was} -> {now}"
        return None
    if len(out.chunk_ids) != len(out.keys_to_store):
        return f"slots returned: expected one per key to store ({len(out.keys_to_store)}), got {len(out.chunk_ids)}"
    if len(set(out.chunk_ids)) != len(out.chunk_ids):
        return f"slots returned: expected distinct, got {list(out.chunk_ids)}"
    live_before = {cid: k for k, (_, cid) in was.items() if k not in out.evicted_keys}
    reused = [c for c in out.chunk_ids if c in live_before]
    if reused:
        return f"slots returned: expected none live before the call, got {reused} (held by " \
               f"{[live_before[c] for c in reused]})"
    for key, cid in zip(out.keys_to_store, out.chunk_ids):
        if now.get(key) != (-1, cid):
            return f"key {key}: expected write-pending in slot {cid}, got {now.get(key)}"
    pinned = [k for k in out.evicted_keys if was.get(k, (None,))[0] != 0]
    if pinned:
        return f"evicted keys {pinned}: expected only idle chunks (ref_cnt 0), got ref_cnt " \
               f"{[was.get(k) for k in pinned]}"
    return None


def load_semantics(state: ManagerState, keys: Sequence[int], chunk_ids: Sequence[int]) -> str | None:
    """Item 5: `prepare_load` returns the keys' slots in key order (co-indexed)."""
    slots = resident(state)
    expected = [slots[k][1] for k in keys]
    if list(chunk_ids) != expected:
        return f"prepare_load({list(keys)}): expected slots {expected} in key order, got {list(chunk_ids)}"
    return None


def failed_store_recovers(before: ManagerState, after: ManagerState, keys: Sequence[int]) -> str | None:
    """Item 6: after `complete_store(keys, success=False)` the pending keys are gone and their slots free;
    every other chunk (ready keys in the same call included) is as it was."""
    was, now = resident(before), resident(after)
    pending = [k for k in dict.fromkeys(keys) if was.get(k, (None,))[0] == -1]
    for key in pending:
        if key in now:
            return f"key {key} after a failed store: expected absent (MISS), got {now[key]}"
        if was[key][1] not in after.free_list:
            return f"slot {was[key][1]} of key {key} after a failed store: expected on the free list, got " \
                   f"{list(after.free_list)}"
    others = {k: v for k, v in was.items() if k not in pending}
    if {k: now.get(k) for k in others} != others:
        return f"chunks not pending in the failed store: expected unchanged {others}, got " \
               f"{ {k: now.get(k) for k in others} }"
    return None


STATE_CHECKS = ("capacity_and_free_list", "counters")
