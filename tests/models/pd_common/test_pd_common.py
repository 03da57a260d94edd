"""pd_common: KVPoll, the two update_status rules, timer defaults, the MIN all-reduce; and their properties."""

import pytest

from kvsim.app import catalog
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.runner import run_property
from kvsim.models.pd_common import status as pd_common
from kvsim.models.pd_common.status import KVPoll, all_reduce_min, apply_updates, leaves_failed, resurrects, update_status
from kvsim.models.pd_staging.variants import FIXED
from kvsim.properties.pd_staging.cases import FAILED_THEN_STALE, STALE_AFTER_CLEAR, StatusTrace

REG = catalog.load()
PROPS = {p.name: p for p in REG.properties_of("pd-staging")}
STATUS_PROPS = ["status_failed_overrides_present", "status_monotone_without_failed", "status_failed_is_terminal",
                "status_no_resurrection", "all_reduce_min_semantics"]
F, B, W, T, S = KVPoll.Failed, KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success


def test_kvpoll_values_are_upstreams():
    assert [(p.name, int(p)) for p in KVPoll] == [("Failed", 0), ("Bootstrapping", 1), ("WaitingForInput", 2),
                                                  ("Transferring", 3), ("Success", 4)]


def test_timer_defaults():
    assert pd_common.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT == 300.0
    assert pd_common.SGLANG_DISAGGREGATION_WAITING_TIMEOUT == 300.0
    assert pd_common.SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL == 5.0
    assert pd_common.SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE == 2
    assert pd_common.SGLANG_DISAGG_STAGING_POOL_SIZE_MB == 4096
    assert pd_common.STAGING_WATERMARK_WAIT_S == 0.001


@pytest.mark.parametrize("rule", ["common", "mori"])
def test_rules_agree_on_the_ordinary_path(rule):
    assert apply_updates(None, [B, W, T, T, S], rule) == [B, W, T, T, S]
    assert update_status(S, T, rule) == S  # statuses only move forward
    assert update_status(S, F, rule) == F  # Failed overrides even Success
    assert update_status(None, F, rule) is None  # a cleared room is never brought back by Failed


def test_common_rule_resurrection_hazard():
    """Stale work recreates a cleared room, and max() lets it overwrite Failed (Failed is the minimum)."""
    assert update_status(None, S, "common") == S and resurrects(None, S, "common")
    assert update_status(None, T, "common") == T
    assert update_status(F, T, "common") == T and leaves_failed(F, T, "common")
    assert apply_updates(T, [F, S], "common") == [F, S]


def test_mori_rule_is_stricter():
    assert update_status(None, S, "mori") is None and not resurrects(None, S, "mori")
    assert update_status(None, T, "mori") is None
    assert update_status(None, B, "mori") == B and update_status(None, W, "mori") == W
    assert all(update_status(F, s, "mori") == F for s in KVPoll)
    assert not any(leaves_failed(F, s, "mori") for s in KVPoll)


def test_status_properties_pass_on_mori_and_fail_on_common_where_only_mori_promises():
    """The hazard reproduced: the same property, called on a common-rule case, fails."""
    PROPS["status_failed_is_terminal"](FAILED_THEN_STALE, FIXED)
    PROPS["status_no_resurrection"](STALE_AFTER_CLEAR, FIXED)
    with pytest.raises(PropertyViolation, match="expected Failed \\(terminal\\), got Transferring"):
        PROPS["status_failed_is_terminal"](StatusTrace("common", T, (F, T)), FIXED)
    with pytest.raises(PropertyViolation, match="absent room, rule common.*got Success"):
        PROPS["status_no_resurrection"](StatusTrace("common", None, (S,)), FIXED)


def test_all_reduce_min():
    assert all_reduce_min([S, S, S]) == S
    assert all_reduce_min([S, T, S]) == T
    assert all_reduce_min([S, F, S]) == F
    assert all_reduce_min([W]) == W
    with pytest.raises(ConfigError, match="polls"):
        all_reduce_min([])


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="rule: expected one of common, mori, got 'nixl'"):
        update_status(None, S, "nixl")
    with pytest.raises(ConfigError, match="new: expected a KVPoll"):
        update_status(None, 7)
    with pytest.raises(ConfigError, match=r"polls\[1\]"):
        all_reduce_min([S, "Success"])
    assert update_status(3, 4) == S  # plain ints are accepted as their KVPoll


@pytest.mark.parametrize("name", STATUS_PROPS)
def test_status_properties_hold(name):
    assert run_property(PROPS[name], "fixed", max_examples=200, seed=0).status == "passed"


def _planted(monkeypatch, fn):
    monkeypatch.setattr(pd_common, "update_status", fn)


def test_failed_override_fails_when_failed_is_maxed(monkeypatch):
    real = update_status
    _planted(monkeypatch, lambda cur, new, rule="common": max(cur, new) if cur is not None else real(cur, new, rule))
    result = run_property(PROPS["status_failed_overrides_present"], "fixed", max_examples=300, seed=0)
    assert result.status == "failed" and "expected Failed" in result.message


def test_monotonicity_fails_when_the_last_write_wins(monkeypatch):
    real = update_status
    _planted(monkeypatch, lambda cur, new, rule="common": new if cur is not None else real(cur, new, rule))
    result = run_property(PROPS["status_monotone_without_failed"], "fixed", max_examples=300, seed=0)
    assert result.status == "failed" and "expected >=" in result.message


def test_terminal_and_resurrection_fail_when_mori_uses_the_common_rule(monkeypatch):
    real = update_status
    _planted(monkeypatch, lambda cur, new, rule="common": real(cur, new, "common"))
    for name in ("status_failed_is_terminal", "status_no_resurrection"):
        result = run_property(PROPS[name], "fixed", max_examples=300, seed=0, use_examples=False)
        assert result.status == "failed", name


def test_all_reduce_property_fails_on_max(monkeypatch):
    monkeypatch.setattr(pd_common, "all_reduce_min", lambda polls: max(polls))
    result = run_property(PROPS["all_reduce_min_semantics"], "fixed", max_examples=200, seed=0)
    assert result.status == "failed"


def test_common_rule_changes_of_0_5_20_are_opt_in():
    """update_status's two 0.5.20 changes are keyword flags; without them the rule is PR #35281's (pd-staging's)."""
    assert update_status(F, W) == W  # max(Failed, WaitingForInput): the finding sglang-pd-common-failed-not-sticky
    assert update_status(F, W, failed_terminal=True) == F  # 0.5.20: `if current == KVPoll.Failed: return`
    assert update_status(None, T) == T  # stale work recreates a cleared room
    assert update_status(None, T, opening_only=True) is None  # 0.5.20: only an opening status creates a room
    assert update_status(None, W, opening_only=True) == W and update_status(None, B, opening_only=True) == B
    assert update_status(F, W, failed_terminal=True, opening_only=True) == update_status(F, W, "mori")
    for current in (None,) + tuple(KVPoll):
        for new in KVPoll:  # with both flags the common rule is Mori's, value for value
            assert update_status(current, new, opening_only=True, failed_terminal=True) == update_status(
                current, new, "mori")
    assert apply_updates(F, [W, T], failed_terminal=True) == [F, F]
    assert apply_updates(F, [W, T]) == [W, T]


@pytest.mark.parametrize("n", [5, 33, 1000, 1024, 1025, 40000])
def test_rooms_put_and_read_as_a_tuple_would(n):
    """`put` on a tuple (one copy) and on `Rooms` (two levels copied at once up to 1,024 rooms, a path of
    nodes past that) gives what the same write to a list gives, and both keep the very sequence where the
    room put back is the one there (up to 32 rooms `Rooms.of` is the plain tuple)."""
    import random

    from kvsim.models.pd_common.rooms import Rooms, put

    rng = random.Random(n)
    items = list(range(n))
    rooms = Rooms.of(items)
    for _ in range(200):
        i, v = rng.randrange(n), object()
        items[i] = v
        before, rooms = rooms, put(rooms, i, v)
        assert rooms is not before and rooms[i] is v and before[i] is not v
        assert put(rooms, i, v) is rooms
    assert list(rooms) == items and rooms == Rooms.of(items) and hash(rooms) == hash(Rooms.of(items))
    assert [rooms[i] for i in range(n)] == items and rooms[-1] is items[-1] and rooms[1:4] == tuple(items[1:4])
    assert put((1, 2, 3), 1, 9) == (1, 9, 3) and put((1,), 0, 9) == (9,)
    with pytest.raises(IndexError):
        rooms[n]
