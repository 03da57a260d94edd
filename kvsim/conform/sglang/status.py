"""SGLang's `CommonKVManager.update_status` (`disaggregation/common/conn.py`) against `pd-protocol`'s status rule.

`STATUS` (`update_status`): a sweep. Upstream's method runs unchanged on a stand-in manager (`request_status`,
the deferred-ACK and staging bookkeeping later releases clear when a room opens, and `deferred_bootstrap`: none,
or a stand-in with nothing to notify), with upstream's own `KVPoll` (`base/conn.py`). Every trace is compared
exhaustively, shortest first: a room absent or at any status, then one to three updates with any status, with
and without a deferred bootstrap; after each update the room's status (absent or the value) must be what the
model's `status_update` gives for the release's variant.

The finding's invariant `failed_is_sticky` (P1: a Failed room never becomes non-Failed) then runs on upstream's
own trails (the check `failed_is_sticky`); where it fails, its message adds the whole protocol: `explore` of
pd-protocol's Mooncake system (one room) with upstream's method in place of the model's common rule
(`upstream_rule_in_model`; Mori's rule stays the model's), which finds the catalog's 5-step counterexample on
0.5.19. It is the property of the seed bug `sglang-pd-common-failed-not-sticky`: it fails on the releases before
0.5.20 (`max(Failed, WaitingForInput)` un-fails a room) and holds from 0.5.20, which returns early on a Failed
room. Its pre-fix side is `fails` (the target diverges there, as every seed bug's pre-fix release does in the
release table).

Release -> model variant (the declaration's table): before 0.5.20 `fixed` (the rule as of PR #35281; 0.5.13 has
the same method), 0.5.20 and later, and a tree with no version, `sglang_0_5_23` (flags `common_opening_only`,
`common_failed_terminal`).
Survivors (documented in the declaration): the room's deferred-ACK and staging bookkeeping cleared with its
arguments swapped, and the deferred bootstrap's notification arguments swapped (both outside the model, which has
no deferred ACKs or deferred bootstrap: 0.5.20 clears nothing, 0.5.23 clears the room's), and `max(current,
status)`'s arguments.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from itertools import product
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from kvsim.engine.canon import canonical_json
from kvsim.engine.conformance.adapters import Check, Context, Sweep
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.explore import explore
from kvsim.models.pd_common.status import KVPoll
from kvsim.models.pd_protocol import wire
from kvsim.models.pd_protocol.config import ProtocolConfig
from kvsim.models.pd_protocol.system import PdProtocol
from kvsim.models.pd_protocol.variants import ProtocolVariant
from kvsim.models.pd_protocol.wire import status_update

from ..loader import check_signature
from .layout import msgspec_stand_in

CONN = "sglang/srt/disaggregation/common/conn.py"
BASE = "sglang/srt/disaggregation/base/conn.py"
MAX_UPDATES = 3
ROOM = 7


def prepare(ctx: Context) -> None:
    """Upstream's own KVPoll must be the model's (the method compares with it); the method's signature."""
    upstream_poll = ctx.up.KVPoll
    for poll in KVPoll:
        if getattr(upstream_poll, poll.name, None) != poll.value:
            raise ConfigError(f"{BASE}:KVPoll.{poll.name}", str(poll.value),
                              str(getattr(upstream_poll, poll.name, "absent")))
    update = vars(ctx.up.CommonKVManager).get("update_status")
    if not callable(update):
        raise ConfigError(f"{CONN}:CommonKVManager.update_status", "a method", f"absent in {ctx.source.label}")
    check_signature(update, ("self", "bootstrap_room", "status"), f"{CONN}:CommonKVManager.update_status")
    ctx.state["update"] = update


class DeferredBootstrap:
    """A deferred bootstrap with nothing to notify when a room fails (`fail` -> no notification)."""

    def fail(self, room: int) -> None:
        return None


def stand_in(deferred: bool) -> SimpleNamespace:
    return SimpleNamespace(request_status={}, _deferred_ack_targets={}, _deferred_ack_poisoned_rooms=set(),
                           _staging_outstanding={}, deferred_bootstrap=DeferredBootstrap() if deferred else None,
                           _notify_bootstrap=lambda *a: None)


def upstream_trail(update: Callable[..., None], start: KVPoll | None, updates: tuple[KVPoll, ...],
                   deferred: bool = False) -> list[Any]:
    me = stand_in(deferred)
    if start is not None:
        me.request_status[ROOM] = int(start)
    trail = []
    for new in updates:
        update(me, ROOM, int(new))
        got = me.request_status.get(ROOM)
        trail.append(None if got is None else KVPoll(got))
    return trail


def model_trail(variant: ProtocolVariant, start: KVPoll | None, updates: tuple[KVPoll, ...]) -> list[Any]:
    trail, current = [], start
    for new in updates:
        current = status_update(current, new, "mooncake", variant)
        trail.append(current)
    return trail


def traces(ctx: Context) -> Iterator[dict[str, Any]]:
    """Shortest first: (start, updates, deferred bootstrap) with 1..MAX_UPDATES updates."""
    for length in range(1, MAX_UPDATES + 1):
        for start, updates, deferred in product((None,) + tuple(KVPoll), product(tuple(KVPoll), repeat=length),
                                                (False, True)):
            yield {"start": _name(start), "updates": [u.name for u in updates], "deferred_bootstrap": deferred}


def _polls(case: dict[str, Any]) -> tuple[KVPoll | None, tuple[KVPoll, ...]]:
    start = None if case["start"] == "absent" else KVPoll[case["start"]]
    return start, tuple(KVPoll[u] for u in case["updates"])


def upstream(ctx: Context, case: dict[str, Any]) -> dict[str, list[str]]:
    start, updates = _polls(case)
    return {"statuses": [_name(s) for s in upstream_trail(ctx.state["update"], start, updates,
                                                          case["deferred_bootstrap"])]}


def model(ctx: Context, case: dict[str, Any]) -> dict[str, list[str]]:
    start, updates = _polls(case)
    return {"statuses": [_name(s) for s in model_trail(ctx.variant, start, updates)]}


def failed_is_sticky(start: KVPoll | None, trail: list[Any]) -> str:
    """'' when a Failed room stays Failed along the trail, else what un-failed it."""
    before = start
    for n, after in enumerate(trail):
        if before == KVPoll.Failed and after != KVPoll.Failed:
            return f"update {n} moves a Failed room to {'absent' if after is None else after.name}"
        before = after
    return ""


def check_sticky(ctx: Context, case: dict[str, Any], answer: dict[str, list[str]]) -> None:
    start, _ = _polls(case)
    broken = failed_is_sticky(start, [None if s == "absent" else KVPoll[s] for s in answer["statuses"]])
    if not broken:
        return
    update = ctx.state["update"]
    tinfo = _name(upstream_trail(update, KVPoll.Failed, (KVPoll.WaitingForInput,))[0])
    text = [f"{broken}; a TransferInfo (WaitingForInput) on a Failed room leaves it {tinfo}"]
    searched = protocol_search(update, ctx.variant)
    if searched is not None:
        text.append(f"explore of the Mooncake protocol with upstream's update_status: {searched}")
    raise PropertyViolation("; ".join(text))


@contextmanager
def upstream_rule_in_model(update: Callable[..., None]) -> Iterator[None]:
    """The model's common status rule replaced by upstream's method (Mori's rule stays the model's) for a search."""
    real = wire.update_status

    def rule(current: KVPoll | None, new: KVPoll, rule: str = "common", **flags: bool) -> KVPoll | None:
        if rule != "common":
            return real(current, new, rule, **flags)
        return upstream_trail(update, current, (new,))[0]

    wire.update_status = rule  # wire.status_update looks the name up at each call
    try:
        yield
    finally:
        wire.update_status = real


def protocol_search(update: Callable[..., None], variant: ProtocolVariant) -> str | None:
    """explore the Mooncake protocol (one room) with upstream's rule: the finding's counterexample, or None."""
    started = time.perf_counter()
    with upstream_rule_in_model(update):
        found = explore(PdProtocol(ProtocolConfig("mooncake"), variant))
    hit = next((v for v in found.violations if v.property == "failed_is_sticky"), None)
    if hit is None:
        return None
    return (f"{len(hit.trace)} steps over {found.states} states in {time.perf_counter() - started:.2f} s: "
            f"trace {canonical_json(hit.trace)} ({hit.message})")


def _name(poll: Any) -> str:
    return "absent" if poll is None else KVPoll(poll).name


STATUS = Sweep(
    loading=lambda upstream_file, up: {"modules": msgspec_stand_in(), "extra_globals": {"KVPoll": up.KVPoll}}
    if upstream_file.file == CONN else {},
    prepare=prepare, domain=traces, model=model, upstream=upstream,
    checks=(Check("failed_is_sticky", check_sticky),),
    note=lambda ctx: f"model variant {ctx.variant.name}; exhaustive: absent or any status, then 1-{MAX_UPDATES} "
                     f"updates, with and without a deferred bootstrap (early return on Failed since 0.5.20)")
