"""SGLang's `CommonKVManager.update_status` (`disaggregation/common/conn.py`) against `pd-protocol`'s status rule.

Upstream's method runs unchanged on a stand-in manager (`request_status`, the deferred-ACK and
staging bookkeeping 0.5.20+ clears when a room opens, `deferred_bootstrap=None`), with upstream's own
`KVPoll` (`base/conn.py`). Every trace is compared exhaustively: a room absent or at any status,
then one to three updates with any status; after each update the room's status (absent or the
value) must be what the model's `status_update` gives for the release's variant.

The finding's invariant `failed_is_sticky` (P1: a Failed room never becomes non-Failed) then runs
on upstream's own trails, and on the whole protocol: `explore` of pd-protocol's Mooncake system
(one room) with upstream's method in place of the model's common rule (`upstream_rule_in_model`;
Mori's rule stays the model's), which finds the catalog's 5-step counterexample on 0.5.19. It is
the property of the seed bug `sglang-pd-common-failed-not-sticky`: it fails on the releases before
0.5.20 (`max(Failed, WaitingForInput)` un-fails a room) and holds from 0.5.20, which returns early
on a Failed room. Its pre-fix side is `fails` (the target diverges
there, as every seed bug's pre-fix release does in the release table).

Release -> model variant (`status_variant`): before 0.5.20 `fixed` (the rule as of PR #35281; 0.5.13
has the same method), 0.5.20 and later, and a tree with no version, `sglang_0_5_23` (flags
`common_opening_only`, `common_failed_terminal`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from itertools import product
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from kvsim.engine.canon import canonical_json
from kvsim.engine.errors import ConfigError
from kvsim.engine.explore import explore
from kvsim.models.pd_common.status import KVPoll
from kvsim.models.pd_protocol import wire
from kvsim.models.pd_protocol.config import ProtocolConfig
from kvsim.models.pd_protocol.system import PdProtocol
from kvsim.models.pd_protocol.variants import VARIANTS, ProtocolVariant
from kvsim.models.pd_protocol.wire import status_update

from ..loader import check_signature, load_definitions
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult
from .layout import load_method, version_tuple

CONN = "sglang/srt/disaggregation/common/conn.py"
BASE = "sglang/srt/disaggregation/base/conn.py"
EARLY_RETURN_SINCE = (0, 5, 20)  # the first release whose update_status returns early on Failed
STARTS = (None,) + tuple(KVPoll)
MAX_UPDATES = 3
ROOM = 7


def status_variant(version: str | None) -> ProtocolVariant:
    """The pd-protocol variant whose common status rule a release follows (no version: the newest)."""
    nums = version_tuple(version)
    return VARIANTS["sglang_0_5_23"] if nums is None or nums >= EARLY_RETURN_SINCE else VARIANTS.fixed


def load(source: EngineSource) -> Callable[[Any, int, Any], None]:
    upstream_poll = load_definitions(source.file(BASE), ["KVPoll"], where=BASE, version=source.label).KVPoll
    for poll in KVPoll:  # upstream's own enum is what the method compares with: it must be the model's
        if getattr(upstream_poll, poll.name, None) != poll.value:
            raise ConfigError(f"{BASE}:KVPoll.{poll.name}", str(poll.value),
                              str(getattr(upstream_poll, poll.name, "absent")))
    update = load_method(source, CONN, "CommonKVManager", "update_status", {"KVPoll": upstream_poll})
    check_signature(update, ("self", "bootstrap_room", "status"), f"{CONN}:CommonKVManager.update_status")
    return update


def stand_in() -> SimpleNamespace:
    return SimpleNamespace(request_status={}, _deferred_ack_targets={}, _deferred_ack_poisoned_rooms=set(),
                           _staging_outstanding={}, deferred_bootstrap=None, _notify_bootstrap=lambda *a: None)


def upstream_trail(update: Callable[..., None], start: KVPoll | None, updates: tuple[KVPoll, ...]) -> list[Any]:
    me = stand_in()
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


def failed_is_sticky(start: KVPoll | None, trail: list[Any]) -> str:
    """'' when a Failed room stays Failed along the trail, else what un-failed it."""
    before = start
    for n, after in enumerate(trail):
        if before == KVPoll.Failed and after != KVPoll.Failed:
            return f"update {n} moves a Failed room to {'absent' if after is None else after.name}"
        before = after
    return ""


def run_update_status(source: EngineSource, options: RunOptions) -> TargetResult:
    started = time.perf_counter()
    update = load(source)
    loaded = time.perf_counter()
    variant = status_variant(source.version)
    result = TargetResult("update_status", source.version)
    violation = None
    for length in range(1, MAX_UPDATES + 1):
        for start, updates in product(STARTS, product(tuple(KVPoll), repeat=length)):
            got, want = upstream_trail(update, start, updates), model_trail(variant, start, updates)
            result.compared += 1
            case = {"start": "absent" if start is None else start.name, "updates": [u.name for u in updates]}
            if got != want:
                result.diverge(case, [_name(s) for s in want], [_name(s) for s in got])
            broken = failed_is_sticky(start, got)
            if broken and violation is None:  # the first is the shortest: traces go by length
                violation = (case, broken, time.perf_counter() - loaded)
    searched = protocol_search(update, variant)
    if violation is None and searched is None:
        result.prop("failed_is_sticky", "holds")
    else:
        text = []
        if searched is not None:
            text.append(f"explore of the Mooncake protocol with upstream's update_status: {searched}")
        if violation is not None:
            case, broken, seconds = violation
            tinfo = _name(upstream_trail(update, KVPoll.Failed, (KVPoll.WaitingForInput,))[0])
            text.append(f"shortest status trace {case}: {broken} ({seconds:.4f} s after loading); a TransferInfo "
                        f"(WaitingForInput) on a Failed room leaves it {tinfo}")
        result.prop("failed_is_sticky", "fails", "; ".join(text))
    result.note = (f"model variant {variant.name}; exhaustive: absent or any status, then 1-{MAX_UPDATES} updates "
                   f"(early return on Failed since 0.5.20)")
    return result.finish(started)


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


TARGETS = (
    Target("sglang", "update_status", CONN, ("CommonKVManager",), "pd-protocol",
           "the common room-status rule (Mooncake, NIXL), exhaustive over short traces, and failed_is_sticky on "
           "upstream's trails (the seed bug sglang-pd-common-failed-not-sticky)", run_update_status),
)
