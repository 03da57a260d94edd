"""pd-staging: properties of the shared PD vocabulary (`models.pd_common`): KVPoll status rules and the MIN all-reduce.

Research note: ../shared/research/sglang.md, sections 1.1 and 4.6 (P1
terminal stickiness, P2 no resurrection). Registered under `pd-staging`;
the status rule ("common" or "mori") is a field of each case, since both are
upstream behaviour at the same commit. Where only Mori promises a property
(sticky Failed, no resurrection) the strategy draws the Mori rule; the tests
show the same property failing on the common rule, which is the hazard.
"""

from __future__ import annotations

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.models.pd_common import status as pd_common
from kvsim.models.pd_common.status import KVPoll
from kvsim.models.pd_staging.variants import StagingVariant

from .cases import FAILED_THEN_STALE, STALE_AFTER_CLEAR, StatusTrace

MODEL = "pd-staging"

def _name(poll: KVPoll | None) -> str:
    return "absent" if poll is None else poll.name


def _trail(case: StatusTrace) -> list[KVPoll | None]:
    return pd_common.apply_updates(case.start, case.updates, case.rule)


@kv_property(model=MODEL, strategy="STATUS_TRACES")
def status_failed_overrides_present(case: StatusTrace, variant: StagingVariant) -> None:
    """Under both rules, Failed on a present room makes it Failed (even over Success); on an absent room, nothing."""
    cur = case.start
    for n, (new, after) in enumerate(zip(case.updates, _trail(case))):
        if new == KVPoll.Failed:
            want = None if cur is None else KVPoll.Failed
            if after != want:
                raise PropertyViolation(f"status after update {n} (Failed on {_name(cur)}, rule {case.rule}): "
                                        f"expected {_name(want)}, got {_name(after)}")
        cur = after


@kv_property(model=MODEL, strategy="STATUS_TRACES")
def status_monotone_without_failed(case: StatusTrace, variant: StagingVariant) -> None:
    """Under both rules a non-Failed update never moves a present non-Failed status backwards."""
    cur = case.start
    for n, (new, after) in enumerate(zip(case.updates, _trail(case))):
        if new != KVPoll.Failed and cur not in (None, KVPoll.Failed) and (after is None or after < cur):
            raise PropertyViolation(f"status after update {n} ({new.name} on {cur.name}, rule {case.rule}): "
                                    f"expected >= {cur.name}, got {_name(after)}")
        cur = after


@kv_property(model=MODEL, strategy="MORI_STATUS_TRACES", examples=(FAILED_THEN_STALE,))
def status_failed_is_terminal(case: StatusTrace, variant: StagingVariant) -> None:
    """P1: once Failed, a room stays Failed (Mori's rule; the common rule's max() lets stale work overwrite it)."""
    cur = case.start
    for n, (new, after) in enumerate(zip(case.updates, _trail(case))):
        if cur == KVPoll.Failed and after != KVPoll.Failed:
            raise PropertyViolation(f"status after update {n} ({new.name} on a Failed room, rule {case.rule}): "
                                    f"expected Failed (terminal), got {_name(after)}")
        cur = after


@kv_property(model=MODEL, strategy="MORI_STATUS_TRACES", examples=(STALE_AFTER_CLEAR,))
def status_no_resurrection(case: StatusTrace, variant: StagingVariant) -> None:
    """P2: an absent room is created only by a handshake status, never by Failed or stale Transferring/Success."""
    cur = case.start
    for n, (new, after) in enumerate(zip(case.updates, _trail(case))):
        if cur is None and after is not None and after not in pd_common.MORI_CREATABLE:
            raise PropertyViolation(f"room after update {n} ({new.name} on an absent room, rule {case.rule}): "
                                    f"expected absent or Bootstrapping/WaitingForInput, got {after.name}")
        cur = after


@kv_property(model=MODEL, strategy="RANK_POLLS")
def all_reduce_min_semantics(rank_polls: tuple[KVPoll, ...], variant: StagingVariant) -> None:
    """The decode MIN all-reduce: Failed if any rank is Failed, Success only if every rank is, else the minimum."""
    got = pd_common.all_reduce_min(rank_polls)
    if (got == KVPoll.Failed) != (KVPoll.Failed in rank_polls):
        raise PropertyViolation(f"reduced poll of {[p.name for p in rank_polls]}: expected Failed iff a rank is "
                                f"Failed, got {got.name}")
    if (got == KVPoll.Success) != all(p == KVPoll.Success for p in rank_polls):
        raise PropertyViolation(f"reduced poll of {[p.name for p in rank_polls]}: expected Success iff every rank "
                                f"is Success, got {got.name}")
    if got not in rank_polls or any(got > p for p in rank_polls):
        raise PropertyViolation(f"reduced poll of {[p.name for p in rank_polls]}: expected the minimum, got {got.name}")
