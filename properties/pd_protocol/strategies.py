"""Hypothesis strategies of the pd-protocol properties (imported only when a property runs).

The frame strategies are functions of the model's resolved parameters: they read `backend`.
"""

from __future__ import annotations

from typing import Any, Mapping

from hypothesis import strategies as st

from kvsim.models.pd_common.status import KVPoll
from kvsim.models.pd_protocol.mori_layout import ATTENTION_KINDS, LayoutCase
from kvsim.models.pd_protocol.wire import (ABORT_TAG, GUARDS, encode_abort, encode_registration, encode_status,
                                           encode_transfer_info)


@st.composite
def layout_cases(draw: st.DrawFn, draft_below_stage: bool = True, wide: bool = False,
                 rule: str = "mori") -> LayoutCase:
    """Model depth, a PP split, one stage, decode draft layers, same-PP or decode PP=1, attention kind.

    With `draft_below_stage` the decode has fewer draft layers than a prefill stage has layers, the
    configurations the PR's rule is written for (MTP and EAGLE add one draft layer to a deep model).
    Splits are even unless `wide`: then also `get_pp_indices`' uneven split (the last `L % pp` stages
    one layer longer) and explicit `SGLANG_PP_LAYER_PARTITION` lists, and pools that publish layer ids
    beside plain MHA pools, which publish none. `rule="common"` draws MHA cases for
    `get_mha_kv_ptrs_with_pp`. A same-PP decode registers no draft entries (its stage-local list
    mirrors the prefill's; speculative decoding runs on a decode of pp_size 1).
    """
    local = draw(st.integers(1, 6))
    pp_size = draw(st.integers(1, 4))
    stage = draw(st.integers(0, pp_size - 1))
    draft = draw(st.integers(0, local - 1 if draft_below_stage else local + 3))
    same_pp = draw(st.booleans()) if pp_size > 1 else False
    attention = "mha" if rule == "common" else draw(st.sampled_from(ATTENTION_KINDS))
    num_layers, partition, layer_ids = local * pp_size, (), False
    if wide:
        split = draw(st.sampled_from(("even", "uneven", "partition")))
        if split == "uneven":
            num_layers += draw(st.integers(0, pp_size - 1))  # the last L % pp stages get one layer more
        elif split == "partition":
            partition = tuple(draw(st.lists(st.integers(1, 2 * local), min_size=pp_size, max_size=pp_size)))
            num_layers = sum(partition)
        layer_ids = draw(st.booleans())
    return LayoutCase(num_layers, pp_size, stage, 0 if same_pp else draft, same_pp, attention, partition,
                      layer_ids, rule)


LAYOUT_CASES = layout_cases()
LAYOUT_CASES_ANY_DRAFT = layout_cases(draft_below_stage=False, wide=True)
COMMON_LAYOUT_CASES = layout_cases(draft_below_stage=False, wide=True, rule="common")


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


def frame_traffic(params: Mapping[str, Any]) -> st.SearchStrategy:
    """Bootstrap-loop traffic: well-formed registrations, TransferInfos and ABORTs mixed with garbage."""
    backend = params["backend"]
    room = st.integers(0, 3)
    good = st.one_of(st.just(encode_registration(backend)), room.map(lambda r: encode_transfer_info(backend, r)),
                     room.map(encode_abort))
    rooms = st.dictionaries(room, st.sampled_from(list(KVPoll)), max_size=4)
    frames = st.lists(st.one_of(good, garbage_frames(backend)), min_size=1, max_size=8)
    return st.tuples(st.just(backend), rooms, frames)


def status_traffic(params: Mapping[str, Any]) -> st.SearchStrategy:
    """Decode-thread traffic: status triples for rooms 0..3 mixed with garbage."""
    backend = params["backend"]
    good = st.builds(lambda r, v: encode_status(backend, r, v), st.integers(0, 3), st.sampled_from(list(KVPoll)))
    rooms = st.dictionaries(st.integers(0, 3), st.sampled_from(list(KVPoll)), max_size=4)
    frames = st.lists(st.one_of(good, garbage_frames(backend, "decode")), min_size=1, max_size=8)
    return st.tuples(st.just(backend), rooms, frames)


def abort_traffic(params: Mapping[str, Any]) -> st.SearchStrategy:
    """Rooms with statuses, and the rooms (known or not) that ABORTs name in turn."""
    statuses = st.dictionaries(st.integers(0, 3), st.sampled_from(list(KVPoll)), max_size=4)
    return st.tuples(st.just(params["backend"]), statuses, st.lists(st.integers(0, 4), min_size=1, max_size=4))
