"""The #52615 rename and the metric names (research note section 3.3, items 1 and 9).

Item 1: the two naming adapters over the one model (`kvsim.models.kv_offload.names`) give equal traces on
any operation sequence: results, slot ids and every counter, each read by its own names. On the real
releases the same comparison is the `offload_rename` conformance target (vLLM 0.29.0 against 0.30.0).
Item 9: the metric strings the manager reports are the registered new strings (none of the old block
strings), and its counters only grow.
"""

from __future__ import annotations

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.kv_offload import names
from kvsim.models.kv_offload.status import OLD_METRIC_STRINGS, CPUOffloadingMetrics, TieringOffloadingMetrics
from kvsim.models.kv_offload.variants import OffloadVariant

from .cases import OPS_SOMETIMES, PINNED, OpsCase, call, new_manager, resolve, run_ops

MODEL = "kv-offload"
KEYS = tuple(range(10))
RENAME_OPS = ("store", "complete_store", "load", "complete_load", "touch", "lookup", "finish", "reset",
              "take_events", "get_stats")


def named_ops(case: OpsCase, variant: OffloadVariant) -> list[tuple]:
    """The calls the case makes, in the adapters' form (resolved once on the model)."""
    out = []
    for step in run_ops(case, variant):
        op = step.op
        kind = op[0]
        if kind == "store":
            out.append(("prepare_store", op[2], op[1]))
        elif kind == "complete_store":
            out.append(("complete_store", op[2], op[3]))
        elif kind == "load":
            out.append(("prepare_load", op[2], op[1]))
        elif kind in ("complete_load", "touch"):
            out.append((kind, op[2]))
        elif kind == "lookup":
            out.append(("lookup", op[1]))
        elif kind == "finish":
            out.append(("on_request_finished", op[1]))
        elif kind == "reset":
            out.append(("reset_cache",))
        else:
            out.append((kind,))
    return out


@kv_property(model=MODEL, strategy="OPS_CASES", examples=PINNED, sometimes=OPS_SOMETIMES)
def old_and_new_names_trace_equal(case: OpsCase, variant: OffloadVariant) -> None:
    """Item 1: the manager under the old names (block) and the new names (chunk) returns the same results,
    slot ids, evictions, None failures, lookups, events and stats, and the same counters read by each name."""
    ops = named_ops(case, variant)
    kwargs = {"cache_policy": case.policy, "store_threshold": case.store_threshold,
              "max_tracker_size": case.max_tracker_size}
    old = names.trace(names.OLD_NAMES, ops, KEYS, variant, **{names.OLD_NAMES.capacity_arg: case.capacity}, **kwargs)
    new = names.trace(names.NEW_NAMES, ops, KEYS, variant, **{names.NEW_NAMES.capacity_arg: case.capacity}, **kwargs)
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            raise PropertyViolation(f"step {i} {ops[i]!r}: old names give {a!r}, new names {b!r}")
    if len(old) != len(new):
        raise PropertyViolation(f"trace lengths: old {len(old)}, new {len(new)}")


REGISTERED_METRICS = tuple(v for k, v in vars(CPUOffloadingMetrics).items() if k.isupper()) + \
    tuple(v for k, v in vars(TieringOffloadingMetrics).items() if k.isupper())


@kv_property(model=MODEL, strategy="THRESHOLD_CASES")
def metric_names_are_the_new_strings(case: OpsCase, variant: OffloadVariant) -> None:
    """Item 9: every metric `get_stats` reports is a registered string and none is an old block string; the
    registered strings include no old one; the stores-skipped counter only grows and allocation sizes are
    positive."""
    old = [s for s in REGISTERED_METRICS if s in OLD_METRIC_STRINGS or "block" in s]
    if old:
        raise PropertyViolation(f"registered metric strings: expected only the new (chunk) strings, got {old}")
    m = new_manager(case, variant)
    reqs: dict[int, int] = {}
    skipped_total = 0
    for intent in case.ops + (("get_stats",),):
        op = resolve(m, intent, reqs)
        if op is None or op[0] == "finish":
            continue  # finishing would retire the request id; the counters do not need it
        if op[0] != "get_stats":
            call(m, op)
            continue
        stats = m.get_stats()
        reported = [*stats["gauges"], *stats["histograms"], *stats["counters"]]
        unknown = [s for s in reported if s not in REGISTERED_METRICS or s in OLD_METRIC_STRINGS]
        if unknown:
            raise PropertyViolation(f"metrics reported: expected registered new strings, got {unknown}")
        delta = stats["counters"].get(CPUOffloadingMetrics.STORES_SKIPPED, 0)
        if delta < 0:
            raise PropertyViolation(f"stores-skipped counter increment: expected >= 0, got {delta}")
        skipped_total += delta
        sizes = stats["histograms"][CPUOffloadingMetrics.CPU_ALLOCATION_SIZE]
        if any(s <= 0 for s in sizes):
            raise PropertyViolation(f"allocation sizes observed: expected > 0, got {list(sizes)}")
