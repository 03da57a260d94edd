"""Vocabulary shared by the SGLang PD (prefill/decode disaggregation) models.

Follows `python/sglang/srt/disaggregation/base/conn.py` (`KVPoll`),
`common/conn.py` (`CommonKVManager.update_status`), the Mori override in
`mori/conn.py`, and the decode-side poll all-reduce in
`disaggregation/decode.py`, all at sglang 05c7ebf (PR #30545); research note
../shared/research/sglang.md, sections 1.1 and 1.2.

Two status rules exist upstream, and both are modelled because they differ
exactly where stale work lands:

- ``"common"`` (Mooncake, NIXL): an absent room is *created* by any
  non-``Failed`` status (resurrection hazard); ``Failed`` overrides a present
  room; otherwise ``max(current, new)``. ``Failed`` is the smallest value, so
  ``max`` lets a later non-``Failed`` status overwrite ``Failed`` too.
- ``"mori"``: an absent room may only be created as ``Bootstrapping`` or
  ``WaitingForInput``; ``Failed`` is terminal.

The rule is a parameter of the call, not a model variant: both rules are
upstream behaviour at the same commit, in different backends. SGLang 0.5.20
changed the common rule twice (an absent room is created only by an opening
status; a Failed room returns early): keyword flags of `update_status`
(`opening_only`, `failed_terminal`), off by default, which pd-protocol's
`sglang_0_5_23` variant turns on.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Iterable, Sequence

from kvsim.engine.errors import ConfigError, require


class KVPoll(IntEnum):
    """Per-room transfer status; the integer order is what `max` and the MIN all-reduce use."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


# The members a step reads on its hot path, as module constants: on Python 3.11 every attribute read of an enum
# class goes through `EnumType.__getattr__`'s hook, several times the cost of reading a global.
FAILED, TRANSFERRING, SUCCESS = KVPoll.Failed, KVPoll.Transferring, KVPoll.Success

STATUS_RULES = ("common", "mori")

# Mori creates an absent room only from the handshake statuses; anything later is stale work.
MORI_CREATABLE = (KVPoll.Bootstrapping, KVPoll.WaitingForInput)

# Upstream environment defaults at 05c7ebf (section 1.2); seconds unless named otherwise.
SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT = 300.0
SGLANG_DISAGGREGATION_WAITING_TIMEOUT = 300.0  # since 05c7ebf also the staging completion deadline
SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL = 5.0
SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE = 2  # consecutive failures before _handle_node_failure
SGLANG_DISAGG_STAGING_POOL_SIZE_MB = 4096
STAGING_WATERMARK_WAIT_S = 0.001  # bounded wait before a deferred staging chunk is re-enqueued


def check_rule(rule: str) -> str:
    require(rule in STATUS_RULES, "rule", f"one of {', '.join(STATUS_RULES)}", rule)
    return rule


def as_poll(value: object, field: str) -> KVPoll:
    """Accept a KVPoll or its integer value; anything else is a ConfigError naming `field`."""
    if isinstance(value, KVPoll):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value in KVPoll._value2member_map_:
        return KVPoll(value)
    raise ConfigError(field, "a KVPoll (0..4)", value)


def update_status(current: KVPoll | None, new: KVPoll, rule: str = "common", *, opening_only: bool = False,
                  failed_terminal: bool = False) -> KVPoll | None:
    """The room's status after `update_status(room, new)`; `current=None` means the room is absent.

    Returns None when the room stays absent. Pure: the caller stores the result.
    `opening_only` and `failed_terminal` are the two changes SGLang 0.5.20 made to the common rule
    (`CommonKVManager.update_status`, still so in 0.5.23): only an opening status (Bootstrapping,
    WaitingForInput) creates an absent room, and an early return keeps a Failed room Failed. The
    caller passes its variant's flags; both default to the rule as of PR #35281 (0.5.13-0.5.19).
    """
    check_rule(rule)
    new = as_poll(new, "new")
    if current is not None:
        current = as_poll(current, "current")
    if current is None:
        if new == FAILED:
            return None  # a cleared room is never brought back by Failed (both rules)
        if (rule == "mori" or opening_only) and new not in MORI_CREATABLE:
            return None  # Mori (and common since 0.5.20) refuses to create a room from stale Transferring/Success
        return new  # common before 0.5.20: the resurrection hazard; stale work recreates the room
    if new == FAILED:
        return FAILED  # Failed overrides everything present, Success included
    if (rule == "mori" or failed_terminal) and current == FAILED:
        return FAILED  # Mori, and common since 0.5.20 (`if current == KVPoll.Failed: return`)
    # common before 0.5.20: Failed (0) is the minimum, so max() lets any later status overwrite it
    return max(current, new)


def apply_updates(current: KVPoll | None, updates: Iterable[KVPoll], rule: str = "common", *,
                  opening_only: bool = False, failed_terminal: bool = False) -> list[KVPoll | None]:
    """The status after each update in turn (the trail a property inspects)."""
    trail: list[KVPoll | None] = []
    later = {k: True for k, on in (("opening_only", opening_only), ("failed_terminal", failed_terminal)) if on}
    for new in updates:
        current = update_status(current, new, rule, **later)  # the 0.5.20 flags only when asked for
        trail.append(current)
    return trail


def all_reduce_min(polls: Sequence[KVPoll]) -> KVPoll:
    """Decode-side gloo MIN all-reduce of the per-rank polls of one request.

    Any rank at Failed makes every rank see Failed; Success needs every rank at Success.
    """
    require(len(polls) >= 1, "polls", "at least one decode rank's poll", list(polls))
    return min(as_poll(p, f"polls[{i}]") for i, p in enumerate(polls))


def resurrects(current: KVPoll | None, new: KVPoll, rule: str = "common") -> bool:
    """True when the update creates a room that was absent with a status past the handshake."""
    after = update_status(current, new, rule)
    return current is None and after is not None and after not in MORI_CREATABLE


def leaves_failed(current: KVPoll | None, new: KVPoll, rule: str = "common") -> bool:
    """True when a Failed room stops being Failed (P1, terminal stickiness, is broken)."""
    return current == KVPoll.Failed and update_status(current, new, rule) != KVPoll.Failed
