"""States of the pd-staging transition system (`models.pd_staging`): immutable, hashable NamedTuples.

Field names follow the upstream maps they stand for (sglang 05c7ebf, PR
#30545; research note ../shared/research/sglang.md, section 2.2):
`_staging_outstanding`, `transfer_infos`, `chunk_staging_infos`,
`_writer_counts`, `_chunk_events`, `remote_watermarks`.
"""

from __future__ import annotations

from typing import NamedTuple

from ..pd_common.status import KVPoll
from .ring import StagingAllocator

ALLOC_OVERSIZED = -2
NOT_ALLOCATED = -1
TERMINAL = (KVPoll.Success, KVPoll.Failed)


class Chunk(NamedTuple):
    """A `TransferKVChunk` on a writer's queue; `counted` is the `staging_counted` flag."""

    room: int
    chunk_idx: int
    page_start: int
    num_pages: int
    is_last: bool
    counted: bool = False
    dst_done: bool = False  # (proposed fix only) the modelled destination was written on an earlier pass


class PrefillRoom(NamedTuple):
    status: KVPoll | None  # request_status[room]; None once clear() popped it
    outstanding: int  # _staging_outstanding[room]; 0 when absent
    infos: bool  # transfer_infos[room] present (popped by teardown and clear)
    offsets: tuple  # per chunk_idx: None, or the `SlotOffset` STAGING_RSP taught
    outcome: KVPoll | None  # the terminal status clear() saw
    ack: bool = False  # an ABORT_ACK is owed once the room's chunks drain (_deferred_ack_targets[room])


class DecodeRoom(NamedTuple):
    status: KVPoll  # what the receiver reports; Success/Failed once concluded
    registered: bool  # in _room_to_receiver; False after unregister_decode_req
    infos: tuple[int, ...]  # chunk_staging_infos alloc ids: -1 none (or scattered), -2 oversized
    counts: tuple  # _writer_counts: per chunk_idx, the arrivals (page_start, num_pages, writer)
    events: tuple[int, ...]  # _chunk_events: alloc ids of submitted scatters not yet complete
    success_from: tuple[bool, ...]  # prefill_response_tracker: Success received from each writer
    all_success: bool  # _staging_all_success
    rows: tuple[int, ...]  # own suffix rows [D, D + N*ps) x W head slices
    held: bool = False  # failed, its slots held until every ABORT_ACK (deferred decode KV release)
    acks: tuple[int, ...] = ()  # the writers whose ABORT_ACK arrived while held


class StagingState(NamedTuple):
    batches: tuple[int, ...]  # prefill batches done per room (a `Rooms` past `Rooms.B` rooms, as below)
    prefill: tuple[tuple[PrefillRoom, ...], ...]  # [writer][room]
    queues: tuple[tuple[Chunk, ...], ...]  # [writer]
    watermarks: tuple[tuple[int, int], ...]  # remote_watermarks[session] per writer
    decode: tuple[DecodeRoom, ...]
    ring: StagingAllocator
    memory: tuple[int, ...]  # ring cells
    owners: tuple[tuple[int, int], ...]  # (alloc_id, room) of live allocations
    prefix: tuple[int, ...]  # shared radix-prefix rows [0, D) x W
    chans: tuple[tuple[tuple[tuple, ...], ...], ...]  # [UP or DOWN][writer]: FIFO of messages in flight
    dead: bool  # the prefill node died
    faults_left: int
    flags: tuple[tuple[str, str], ...]  # (invariant, message) seen at a transition


def _fast_replace(cls: type) -> None:
    """Give a state record a `_replace` that builds the new tuple in one call: namedtuple's own goes through a
    keyword dict, `map` and `_make` on every call, and a step of the timed simulation replaces several records.
    The record is unpacked once (as `field_setter`'s setters do), not indexed field by field. The same result (an
    unknown field name is a TypeError here, a ValueError there)."""
    fields = cls._fields
    params = ", ".join(f"{f}=_SAME" for f in fields)
    olds = "".join(f"_{i}, " for i in range(len(fields)))
    values = "".join(f"_{i} if {f} is _SAME else {f}, " for i, f in enumerate(fields))
    namespace = {"_SAME": object(), "_tuple_new": tuple.__new__, "_cls": cls}
    exec(f"def _replace(self, *, {params}):\n    {olds}= self\n    return _tuple_new(_cls, ({values}))\n",  # noqa: S102
         namespace)  # the source is built above from the record's field names only
    replace = namespace["_replace"]
    replace.__qualname__ = f"{cls.__name__}._replace"
    replace.__doc__ = f"A new {cls.__name__} with the fields given replaced."
    cls._replace = replace


for _record in (Chunk, PrefillRoom, DecodeRoom, StagingState):
    _fast_replace(_record)


def field_setter(cls: type, field: str):
    """`set(record, value)`: `record._replace(<field>=value)` without `_replace`'s keyword handling, unpacked once
    and built in one call (a step's hot path sets a state's channels, queues and rooms)."""
    fields = cls._fields
    olds = "".join(f"_{i}, " for i in range(len(fields)))
    values = "".join("value, " if f == field else f"_{i}, " for i, f in enumerate(fields))
    namespace = {"_tuple_new": tuple.__new__, "_cls": cls}
    source = f"def set_{field}(record, value):\n    {olds}= record\n    return _tuple_new(_cls, ({values}))\n"
    exec(source, namespace)  # noqa: S102 -- the source is built above from the record's field names only
    setter = namespace[f"set_{field}"]
    setter.__doc__ = f"`record._replace({field}=value)` of a {cls.__name__}."
    return setter


# the state's fields a step sets alone most often (a setter costs about half a keyword `_replace`), and a prefill
# room's offsets (STAGING_RSP, the most frequent delivery)
set_queues, set_prefill, set_decode, set_chans, set_watermarks, set_memory, set_prefix = (
    field_setter(StagingState, f) for f in ("queues", "prefill", "decode", "chans", "watermarks", "memory", "prefix"))
set_offsets = field_setter(PrefillRoom, "offsets")


def remove(seq: tuple, item) -> tuple:
    """`seq` without the first occurrence of `item`."""
    if seq and seq[0] == item:  # the head (a channel's delivery)
        return seq[1:]
    i = seq.index(item)
    return seq[:i] + seq[i + 1:]
