"""Properties of the CPU offloading manager (research note section 3.3, items 2-6) on operation sequences.

Each runs a drawn `OpsCase` through the model (`cases.run_ops`) and checks every step with the
model's own checks (`kvsim.models.kv_offload.checks`). `prepare_store_never_evicts_an_input_key`
is the one #35846 breaks (variant `pre_already_stored_fix`); the others hold on both variants by
construction and are shown failing on planted mutations (tests/models/kv_offload/test_kv_offload_properties.py).
"""

from __future__ import annotations

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.kv_offload import checks
from kvsim.models.kv_offload.variants import OffloadVariant

from .cases import OPS_SOMETIMES, PINNED, OpsCase, iter_ops

MODEL = "kv-offload"


def _fail(case: OpsCase, index: int, op: tuple, message: str) -> None:
    raise PropertyViolation(f"step {index} {op!r} ({case.policy}, capacity {case.capacity}): {message}")


@kv_property(model=MODEL, strategy="OPS_CASES", examples=PINNED, sometimes=OPS_SOMETIMES)
def capacity_and_free_list_hold(case: OpsCase, variant: OffloadVariant) -> None:
    """Item 2: 0 <= allocated <= capacity; the free list has no duplicates, lies in [0, allocated), and with
    the live slots makes exactly [0, allocated); free slots = len(free) + capacity - allocated."""
    for i, step in enumerate(iter_ops(case, variant)):
        message = checks.capacity_and_free_list(step.after, case.capacity)
        if message is not None:
            _fail(case, i, step.op, message)


@kv_property(model=MODEL, strategy="OPS_CASES", examples=PINNED, sometimes=OPS_SOMETIMES)
def counters_match_ref_counts(case: OpsCase, variant: OffloadVariant) -> None:
    """Item 3: the evictable count is #{ref_cnt == 0}, the write-pending count #{ref_cnt == -1}; neither is
    negative, and no ref_cnt is below -1."""
    for i, step in enumerate(iter_ops(case, variant)):
        message = checks.counters(step.after)
        if message is not None:
            _fail(case, i, step.op, message)


@kv_property(model=MODEL, strategy="OPS_CASES", examples=PINNED, sometimes=OPS_SOMETIMES)
def prepare_store_never_evicts_an_input_key(case: OpsCase, variant: OffloadVariant) -> None:
    """Item 4 (#35846): a key offered to `prepare_store` is never among the keys it evicts; an already-stored
    input key stays."""
    for i, step in enumerate(iter_ops(case, variant)):
        if step.op[0] == "store":
            message = checks.no_input_key_evicted(step.op[2], step.result)
            if message is not None:
                _fail(case, i, step.op, message)


@kv_property(model=MODEL, strategy="OPS_CASES", examples=PINNED, sometimes=OPS_SOMETIMES)
def prepare_store_semantics(case: OpsCase, variant: OffloadVariant) -> None:
    """Item 4: slots returned are distinct, not live before the call, co-indexed with the keys to store
    (each write-pending in its slot); only idle chunks (ref_cnt 0, never a loading one) are evicted; a None
    result leaves every slot as it was."""
    for i, step in enumerate(iter_ops(case, variant)):
        if step.op[0] == "store":
            message = checks.store_semantics(step.before, step.after, step.op[2], step.result)
            if message is not None:
                _fail(case, i, step.op, message)


@kv_property(model=MODEL, strategy="OPS_CASES", examples=PINNED, sometimes=OPS_SOMETIMES)
def prepare_load_in_key_order(case: OpsCase, variant: OffloadVariant) -> None:
    """Item 5: `prepare_load(keys)` returns the keys' slots in key order, for any order of the keys, and pins
    each (ref_cnt + 1)."""
    for i, step in enumerate(iter_ops(case, variant)):
        if step.op[0] != "load":
            continue
        message = checks.load_semantics(step.before, step.op[2], step.result)
        if message is None:
            was, now = checks.resident(step.before), checks.resident(step.after)
            wrong = [k for k in step.op[2] if now[k][0] != was[k][0] + 1]
            if wrong:
                message = f"ref_cnt of {wrong}: expected one more than before, got {[now[k] for k in wrong]}"
        if message is not None:
            _fail(case, i, step.op, message)


@kv_property(model=MODEL, strategy="OPS_CASES", examples=PINNED, sometimes=OPS_SOMETIMES)
def failed_store_recovers(case: OpsCase, variant: OffloadVariant) -> None:
    """Item 6: after `complete_store(keys, success=False)` the pending keys look up as MISS and their slots
    are free for reuse; ready keys in the same call and every other chunk are unaffected."""
    for i, step in enumerate(iter_ops(case, variant)):
        if step.op[0] == "complete_store" and not step.op[3]:
            message = checks.failed_store_recovers(step.before, step.after, step.op[2])
            if message is not None:
                _fail(case, i, step.op, message)
