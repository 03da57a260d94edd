"""pd-protocol areas 1 and 3: the bootstrap loop over byte frames (P3, P4) on every backend."""

import pytest

from kvsim.app import catalog
from kvsim.app.repro import reproduce
from kvsim.engine.runner import run_property
from kvsim.models.pd_common.status import KVPoll
from kvsim.models.pd_protocol import FIXED, VARIANTS
from kvsim.models.pd_protocol.wire import (BACKENDS, encode_abort, encode_registration, encode_status,
                                           encode_transfer_info, handle_bootstrap, handle_decode)

REG = catalog.load()
P3 = REG.property("pd-protocol", "control_loop_survives_any_frames")
P4 = REG.property("pd-protocol", "abort_fails_known_unfinished_rooms")
PRE = VARIANTS["pre_35281"]
ROOMS = {1: KVPoll.Transferring, 2: KVPoll.Success, 3: KVPoll.Failed}


@pytest.mark.parametrize("backend", BACKENDS)
def test_well_formed_messages_parse_on_every_backend(backend):
    for variant in VARIANTS.values():
        assert handle_bootstrap(encode_registration(backend), ROOMS, backend, variant).outcome == "register"
        info = handle_bootstrap(encode_transfer_info(backend, 4), ROOMS, backend, variant)
        assert info.outcome == "transfer_info" and info.alive and info.rooms == ROOMS


@pytest.mark.parametrize("frames", [(), (b"7",), (b"\xff", b"a", b"b", b"c", b"d", b"e"), (b"x", b"1", b"2", b"3", b"4", b"y")])
def test_malformed_frames_kill_mooncake_and_nixl_before_and_are_dropped_after(frames):
    for backend in ("mooncake", "nixl"):
        assert not handle_bootstrap(frames, ROOMS, backend, PRE).alive
    for backend in BACKENDS:
        handled = handle_bootstrap(frames, ROOMS, backend, FIXED)
        assert handled.alive and handled.outcome == "rejected" and handled.rooms == ROOMS
    assert handle_bootstrap(frames, ROOMS, "mori", PRE).alive  # Mori's loop already caught errors


def test_abort_semantics_and_mori_before_the_fix():
    for backend in BACKENDS:
        after = handle_bootstrap(encode_abort(1), ROOMS, backend, FIXED).rooms
        assert after == {**ROOMS, 1: KVPoll.Failed}
        for room in (2, 9):  # Success and unknown rooms are left alone
            assert handle_bootstrap(encode_abort(room), ROOMS, backend, FIXED).rooms == ROOMS
    dropped = handle_bootstrap(encode_abort(1), ROOMS, "mori", PRE)
    assert dropped.outcome == "rejected" and dropped.rooms[1] == KVPoll.Transferring


@pytest.mark.parametrize("backend", BACKENDS)
def test_p3_and_p4_hold_on_fixed(backend):
    for prop in (P3, P4):
        result = run_property(prop, "fixed", max_examples=200, seed=0, params={"backend": backend})
        assert result.status == "passed", result.message


@pytest.mark.parametrize("backend, p3_fails, p4_fails", [("mooncake", True, False), ("nixl", True, False),
                                                          ("mori", False, True)])
def test_pre_fix_failures_per_backend(backend, p3_fails, p4_fails):
    p3 = run_property(P3, "pre_35281", max_examples=300, seed=0, params={"backend": backend})
    p4 = run_property(P4, "pre_35281", max_examples=300, seed=0, params={"backend": backend})
    assert (p3.status == "failed", p4.status == "failed") == (p3_fails, p4_fails)
    if p3_fails:
        assert f"--param backend={backend}" in p3.replay


def test_bug_reports_hold():
    for bug_id in ("sglang-pr35281-malformed-kills-loop", "sglang-pr35281-mori-abort-dropped"):
        result = reproduce(REG.bug(bug_id))
        assert result.ok and result.reproduced and result.fixed_passes, bug_id


def test_decode_loop_status_messages_and_malformed_frames():
    rooms = {0: KVPoll.WaitingForInput, 1: KVPoll.Failed}
    for backend in BACKENDS:
        ok = handle_decode(encode_status(backend, 0, KVPoll.Success), rooms, backend, FIXED)
        assert ok.rooms[0] == KVPoll.Success and ok.alive
        late = handle_decode(encode_status(backend, 1, KVPoll.Success), rooms, backend, FIXED)
        assert late.rooms == rooms  # a concluded receiver drops late news
        for frames in [(), (b"0", b"9", b"0"), (b"x",)]:
            assert handle_decode(frames, rooms, backend, FIXED).outcome == "rejected"
    assert not handle_decode((b"0", b"x", b"0"), rooms, "mooncake", PRE).alive
    assert not handle_decode((), rooms, "nixl", PRE).alive
    assert handle_decode((b"x",), rooms, "nixl", PRE).alive  # only the empty message is known to kill it
    assert handle_decode((), rooms, "mori", PRE).alive


@pytest.mark.parametrize("backend, fails", [("mooncake", True), ("nixl", True), ("mori", False)])
def test_decode_loop_property(backend, fails):
    prop = REG.property("pd-protocol", "decode_loop_survives_any_frames")
    assert run_property(prop, "fixed", max_examples=150, seed=0, params={"backend": backend}).status == "passed"
    old = run_property(prop, "pre_35281", max_examples=300, seed=0, params={"backend": backend})
    assert (old.status == "failed") == fails
