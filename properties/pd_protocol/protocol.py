"""PD control protocol across Mooncake, NIXL and Mori (SGLang PR #35281).

Research note: ../shared/research/sglang.md, sections 1 and 4. The model
has three parts: the bootstrap control loop over byte frames (areas 1 and
3: P3 and P4, data properties), Mori's KV descriptor selection (area 4: P6,
data properties), and the room lifecycle as a transition system (P1, P2,
P3, P5, P7 as invariants; P8 as liveness) for `explore` and the Hypothesis
state machine. The backend is a model parameter (`--param backend=mori`).
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.params import ParamSpec
from kvsim.engine.property import kv_property, stateful_property
from kvsim.engine.registry import REGISTRY, BugReport, ModelSpec
from kvsim.models.pd_common.status import SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE, KVPoll
from kvsim.models.pd_protocol import sim as pd_protocol_sim
from kvsim.models.pd_protocol.system import PdProtocol, ProtocolConfig
from kvsim.models.pd_protocol.mori_layout import ATTENTION_KINDS, VARIANTS, Descriptor, LayoutCase, chosen_descriptors
from kvsim.models.pd_protocol.wire import (ABORT_TAG, BACKENDS, GUARDS, encode_abort, encode_registration, encode_status,
                            encode_transfer_info, handle_bootstrap, handle_decode)

MODEL = "pd-protocol"

REGISTRY.add_model(ModelSpec(
    name=MODEL,
    summary="PD control protocol shared by Mooncake, NIXL and Mori; so far Mori's KV descriptor layout",
    source="sglang PR #35281",
    variants=VARIANTS,
    params=(
        ParamSpec("backend", "str", "mooncake", "PD transfer backend", choices=BACKENDS),
        ParamSpec("rooms", "int", 1, "requests sharing the prefill/decode pair", minimum=1, maximum=3),
        ParamSpec("chunks", "int", 2, "KV chunks per room on the worker queue", minimum=1, maximum=4),
        ParamSpec("faults", "int", 1, "fault actions allowed (drop, stale work, garbage, crash)", minimum=0,
                  maximum=3),
        ParamSpec("staging", "int", 0, "1: the decode sends a staging WATERMARK after registering", minimum=0,
                  maximum=1),
        ParamSpec("max_failures", "int", SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE,
                  "missed heartbeats before _handle_node_failure", minimum=1, maximum=4),
    ),
    system=lambda variant, p: PdProtocol(ProtocolConfig(p["backend"], p["rooms"], p["chunks"], p["faults"],
                                                        bool(p["staging"]), p["max_failures"]), variant),
    simulate=pd_protocol_sim.simulate,
    sim_params=pd_protocol_sim.SIM_PARAMS,
    fault_kinds=("drop", "delay", "duplicate", "reorder", "garble", "crash"),
))


@st.composite
def layout_cases(draw: st.DrawFn, draft_below_stage: bool = True) -> LayoutCase:
    """Model depth, an even PP split, one stage, decode draft layers, same-PP or decode PP=1, attention kind.

    With `draft_below_stage` the decode has fewer draft layers than a prefill stage has layers, the
    configurations the PR's rule is written for (MTP and EAGLE add one draft layer to a deep model).
    """
    local = draw(st.integers(1, 6))
    pp_size = draw(st.integers(1, 4))
    stage = draw(st.integers(0, pp_size - 1))
    draft = draw(st.integers(0, local - 1 if draft_below_stage else local + 3))
    same_pp = draw(st.booleans()) if pp_size > 1 else False
    attention = draw(st.sampled_from(ATTENTION_KINDS))
    return LayoutCase(local * pp_size, pp_size, stage, draft, same_pp, attention)


def _check_layout(case: LayoutCase, variant: str) -> None:
    kv_kind = "K" if case.attention == "mha" else "KV"
    for l, (k, v) in enumerate(chosen_descriptors(case, variant)):
        layer = case.start_layer + l
        want_k = Descriptor(kv_kind, "main", layer)
        if k != want_k:
            raise PropertyViolation(f"{kv_kind} descriptor for local layer {l}: expected main {kv_kind} of global "
                                    f"layer {layer}, got {k}")
        if case.attention == "mha" and v != Descriptor("V", "main", layer):
            raise PropertyViolation(f"V descriptor for local layer {l}: expected main V of global layer {layer}, "
                                    f"got {v}")


# The case: decode with one draft layer, prefill without; decode PP=1, a 4-layer MHA model.
DRAFT_CASE = LayoutCase(num_layers=4, pp_size=1, stage=0, draft_layers=1, same_pp=False, attention="mha")


@kv_property(model=MODEL, strategy=layout_cases(), examples=[DRAFT_CASE])
def layout_selects_main_kv(case: LayoutCase, variant: str) -> None:
    """P6: the K and V chosen for local layer l are the main-model K and V of global layer s + l, never a draft region."""
    _check_layout(case, variant)


@kv_property(model=MODEL, strategy=layout_cases(draft_below_stage=False))
def layout_selects_main_kv_any_draft(case: LayoutCase, variant: str) -> None:
    """P6 over every draft depth, including decodes with at least as many draft layers as a prefill stage has layers."""
    _check_layout(case, variant)


REGISTRY.add_bug(BugReport(
    id="sglang-pr35281-mori-draft-layout",
    model=MODEL,
    variant="pre_35281",
    property="layout_selects_main_kv",
    source="sglang PR #35281 (area 4)",
    summary="Mori split the destination list in half: with draft KV on decode and none on prefill, "
            "main V lands in a draft region",
))

REGISTRY.add_bug(BugReport(
    id="sglang-pr35281-mori-wide-draft-layout",
    model=MODEL,
    variant="fixed",
    property="layout_selects_main_kv_any_draft",
    source="sglang PR #35281 (area 4), post-fix rule",
    summary="the post-fix V-offset rule takes T % n == 0 for the PP case: when the decode has at least as many "
            "draft layers as a prefill stage has layers (e.g. a one-layer stage), V is again taken from a draft region",
    status="open upstream",
    note="Derived from the rule as the research note states it (get_mha_kv_ptrs_with_pp); the real code may "
         "guard this elsewhere. Production drafts (MTP, EAGLE: one layer) on stages of two or more layers are "
         "not affected.",
))


# -- the bootstrap control loop over byte frames (P3, P4) ------------------------------------------

@st.composite
def garbage_frames(draw: st.DrawFn, backend: str, loop: str = "bootstrap") -> tuple[bytes, ...]:
    """What a socket can deliver that is not a well-formed message: truncated, wrong tag, bad room, foreign guard."""
    if loop == "bootstrap":
        valid = draw(st.sampled_from([encode_registration(backend), encode_transfer_info(backend, 7),
                                      encode_abort(7)]))
    else:
        valid = encode_status(backend, 7, KVPoll.Success)
    kind = draw(st.sampled_from(("truncate", "room", "tag", "guard", "empty", "bytes")))
    if kind == "truncate":
        return valid[: draw(st.integers(0, len(valid) - 1))]
    if kind == "room":
        at = 1 if valid[0] == ABORT_TAG or GUARDS[backend] else 0  # the room frame
        bad = draw(st.sampled_from((b"seven", b"", "\u00e9".encode(), b"\xff\xfe", b"-1", b"7.0")))
        return valid[:at] + (bad,) + valid[at + 1:]
    if kind == "tag":
        return (draw(st.sampled_from((b"ABORTX", b"abort", b"STAGING_RSP"))),) + valid[1:]
    if kind == "guard":
        foreign = [g for b, g in GUARDS.items() if g and b != backend] + [b"ZmqGuard"]
        return (draw(st.sampled_from(foreign)),) + valid[1:]
    if kind == "empty":
        return ()
    return tuple(draw(st.lists(st.binary(max_size=8), max_size=6)))


def frame_traffic(params) -> st.SearchStrategy:
    backend = params["backend"]
    room = st.integers(0, 3)
    good = st.one_of(st.just(encode_registration(backend)), room.map(lambda r: encode_transfer_info(backend, r)),
                     room.map(encode_abort))
    rooms = st.dictionaries(room, st.sampled_from(list(KVPoll)), max_size=4)
    frames = st.lists(st.one_of(good, garbage_frames(backend)), min_size=1, max_size=8)
    return st.tuples(st.just(backend), rooms, frames)


@kv_property(model=MODEL, strategy=frame_traffic)
def control_loop_survives_any_frames(case, variant: str) -> None:
    """P3: after any byte-level messages the bootstrap thread is alive, and a rejected message changes no room."""
    _loop_survives(case, variant, handle_bootstrap, "bootstrap thread", "every later room on this rank stalls")


def _loop_survives(case, variant: str, handler, thread: str, consequence: str) -> None:
    backend, rooms, messages = case
    for n, frames in enumerate(messages):
        handled = handler(frames, rooms, backend, variant)
        if not handled.alive:
            raise PropertyViolation(f"{backend} {thread} after message {n} {frames!r}: expected alive, "
                                    f"got dead ({handled.reason}); {consequence}")
        if handled.outcome == "rejected" and handled.rooms != rooms:
            raise PropertyViolation(f"rooms after rejected message {n}: expected unchanged {rooms}, got {handled.rooms}")
        rooms = handled.rooms


def _name(status: KVPoll | None) -> str:
    return "absent" if status is None else status.name


def status_traffic(params) -> st.SearchStrategy:
    backend = params["backend"]
    good = st.builds(lambda r, v: encode_status(backend, r, v), st.integers(0, 3), st.sampled_from(list(KVPoll)))
    rooms = st.dictionaries(st.integers(0, 3), st.sampled_from(list(KVPoll)), max_size=4)
    frames = st.lists(st.one_of(good, garbage_frames(backend, "decode")), min_size=1, max_size=8)
    return st.tuples(st.just(backend), rooms, frames)


@kv_property(model=MODEL, strategy=status_traffic)
def decode_loop_survives_any_frames(case, variant: str) -> None:
    """P3 on the decode side: after any byte-level messages the decode thread is alive; a rejected one changes no room."""
    _loop_survives(case, variant, handle_decode, "decode thread", "no later status reaches any room")


def abort_traffic(params) -> st.SearchStrategy:
    statuses = st.dictionaries(st.integers(0, 3), st.sampled_from(list(KVPoll)), max_size=4)
    return st.tuples(st.just(params["backend"]), statuses, st.lists(st.integers(0, 4), min_size=1, max_size=4))


@kv_property(model=MODEL, strategy=abort_traffic)
def abort_fails_known_unfinished_rooms(case, variant: str) -> None:
    """P4: ABORT makes a known non-Success room Failed in one step; Success and unknown rooms are unchanged; idempotent."""
    backend, rooms, targets = case
    for room in targets:
        before = rooms.get(room)
        after = handle_bootstrap(encode_abort(room), rooms, backend, variant)
        again = handle_bootstrap(encode_abort(room), after.rooms, backend, variant)
        want = before if before in (None, KVPoll.Success) else KVPoll.Failed
        got = after.rooms.get(room)
        if got != want:
            raise PropertyViolation(f"{backend} room {room} after ABORT: expected {_name(want)}, got {_name(got)} "
                                    f"(was {_name(before)}; {after.outcome} {after.reason})")
        others = {k: v for k, v in after.rooms.items() if k != room}
        if others != {k: v for k, v in rooms.items() if k != room}:
            raise PropertyViolation(f"other rooms after ABORT of room {room}: expected unchanged, got {others}")
        if again.rooms != after.rooms:
            raise PropertyViolation(f"rooms after a second ABORT of room {room}: expected {after.rooms}, got {again.rooms}")
        rooms = after.rooms


REGISTRY.add_bug(BugReport(
    id="sglang-pr35281-malformed-kills-loop",
    model=MODEL,
    variant="pre_35281",
    property="control_loop_survives_any_frames",
    source="sglang PR #35281 (area 3)",
    summary="Mooncake and NIXL: one malformed frame kills the bootstrap thread for good; every later room on "
            "that rank stalls until its timeout",
    params={"backend": "mooncake"},
))

REGISTRY.add_bug(BugReport(
    id="sglang-pr35281-mori-abort-dropped",
    model=MODEL,
    variant="pre_35281",
    property="abort_fails_known_unfinished_rooms",
    source="sglang PR #35281 (area 1)",
    summary="Mori checked its guard before dispatch: the unguarded ABORT was dropped as malformed and the prefill "
            "kept transferring into an aborted room",
    params={"backend": "mori"},
))


# -- the room lifecycle transition system (P1, P2, P3, P5, P7; P8 as liveness) --------------------

stateful_property(model=MODEL, name="protocol_invariants",
                  doc="P1, P2, P3, P5 and P7 hold on every step of Hypothesis-chosen interleavings of messages, "
                      "timeouts and faults (one backend; --param backend=...).")

REGISTRY.add_bug(BugReport(
    id="sglang-pr35281-stale-work-flips-success",
    model=MODEL,
    variant="pre_35281",
    property="success_is_sticky",
    driver="explore",
    params={"backend": "nixl"},
    source="sglang PR #35281 (area 2)",
    summary="NIXL: a queued chunk for a room whose transfer_infos were torn down at Success hits "
            "`assert room in transfer_infos`; the catch-all flips the concluded Success to Failed",
))

REGISTRY.add_bug(BugReport(
    id="sglang-pr35281-mori-no-heartbeat",
    model=MODEL,
    variant="pre_35281",
    property="peer_death_fails_unfinished_rooms",
    driver="explore",
    params={"backend": "mori"},
    source="sglang PR #35281 (area 1)",
    summary="Mori decode ran no heartbeat checker: a dead prefill leaves decode rooms waiting for the full "
            "300 s waiting timeout",
))

REGISTRY.add_bug(BugReport(
    id="sglang-pr35281-init-race",
    model=MODEL,
    variant="pre_35281",
    property="no_field_read_before_assignment",
    driver="explore",
    params={"backend": "mooncake", "staging": 0},
    source="sglang PR #35281 (area 5)",
    summary="Mooncake started the bootstrap thread before creating session_lock: a registration in that "
            "window raises AttributeError and kills the thread",
))

REGISTRY.add_bug(BugReport(
    id="sglang-pr35281-staging-ctx-race",
    model=MODEL,
    variant="fixed",
    property="no_field_read_before_assignment",
    driver="explore",
    params={"backend": "mooncake", "staging": 1},
    source="sglang PR #35281 review (area 5 residual)",
    summary="Mooncake still assigns _staging_ctx after the bootstrap thread starts: a WATERMARK in that "
            "window raises AttributeError and kills the thread",
    status="open upstream",
    note="The reviewer's residual race; the upstream post-fix file assigns _staging_ctx late, as modelled.",
))

REGISTRY.add_bug(BugReport(
    id="sglang-pd-common-failed-not-sticky",
    model=MODEL,
    variant="fixed",
    property="failed_is_sticky",
    driver="explore",
    params={"backend": "mooncake"},
    source="sglang CommonKVManager.update_status (Mooncake, NIXL), as of PR #35281",
    summary="a TransferInfo that reaches a prefill room after it failed (bootstrap timeout, ABORT) and before "
            "clear() moves it back to WaitingForInput: update_status takes max(Failed=0, WaitingForInput=2)",
    status="open upstream",
    note="From the status rule as the research note states it (section 1.1); whether the TransferInfo handler "
         "checks for Failed before updating is not in the notes. Mori's rule keeps Failed terminal, so Mori is "
         "not affected; the window is between the failure and the scheduler's next poll.",
))
