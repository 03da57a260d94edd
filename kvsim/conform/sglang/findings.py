"""The pd-staging findings' pure parts on SGLang's own code (`common/staging_handler.py`): three sweeps.

Three decisions of the decode staging handler run as upstream wrote them, on stand-in `self` objects
(`DecodeStagingHandler` methods), a stand-in ring that hands out known allocations, and stand-in sockets and
device events. Each sweep is exhaustive over short operation sequences, smallest first, compared step by step with
the model's `decode_rules` (and `layout` for the slot's size); its finding's property then runs on upstream's own
answers (`Check(..., finding=...)`: failing on a release it is `finding confirmed`, the open-upstream finding
reproduced on the real code with its smallest input, and the target still conforms).

- `DEDUPE` (`staging-dedupe`, `handle_staging_req`): every sequence of up to 4 operations on chunks 0 and 1 (a
  STAGING_REQ, one the ring cannot hold, a scatter), then every sequence of up to 2 with the REQs the handler
  drops (no receiver for the room, no staging ring) and a REQ whose STAGING_RSP send fails, over two geometries
  (the total head count published, or the per-rank one). Per REQ: whether it allocates (`req_allocates`), the
  bytes it asks the ring for (the model's `compute_staging_layout` of the chunk), and each STAGING_RSP sent (to
  the requester's PP rank only with PP prefill writers: (chunk, offset, round, end), ALLOC_OVERSIZED's (-2, 0, -1)
  where the ring refused). Property `late_req_never_reallocates` (a REQ for a chunk already scattered does not
  allocate): finding `sglang-05c7ebf-staging-late-req-realloc`.
- `FAN_IN` (`staging-fan-in`, `handle_chunk_arrived`, `num_writers_for`): eight TP x PP writer layouts (W = 1..4,
  both of `num_writers_for`'s TP branches and a PP decode), every sequence of CHUNK_READY arrivals of up to W + 1
  writers, and an arrival for a room with no receiver: `num_writers_for` against the model's W (`HeadReshard.
  num_writers` x prefill PP stages per decode stage) and whether each arrival submits the scatter
  (`fan_in_complete`). Upstream's `writer_id` is the decode session (the same for every writer), passed as
  such. Property `scatter_after_all_writers` (S11: a scatter only after W distinct writers): findings
  `sglang-05c7ebf-staging-dup-ready` and `sglang-0523-staging-dup-ready-reenqueue`.
- `COMPLETION` (`staging-completion`, `advance_scatter`, `submit_chunk_scatter`): rooms of 1-3 chunks, each never
  allocated (its STAGING_REQ lost; a scatter of it still tried), allocated, scattered with a failing scatter
  kernel, scattered, or scattered and completed, with and without all-ranks Success, before and past the
  completion deadline, and a scatter for a room never registered: what each scatter returns, the allocations
  freed, whether the room is done (`scatter_complete`) or failed (the deadline, `completion_deadline`).
  Property `done_only_when_every_chunk_scattered`: finding `sglang-05c7ebf-staging-lost-req-success`.

Survivors (documented in the declaration; equivalent on every entry and geometry upstream makes): an entry's
offset tested where its id is (both are negative without an allocation) and the fields of an entry without an
allocation (never read); ceiling for floor division of whole quotients (K and V halves, whole tokens of a page,
whole heads); max's arguments swapped and its 1 made 0 or 2 where the TP size is >= 1 or only names the rank;
the layout's factors swapped; `num_writers_for`'s branches at equal or dividing TP and PP sizes; the completion
deadline's exact boundary (wall-clock time).

A release without one of the functions, or whose handler has another shape (before 0.5.19 the fan-in counts were
the caller's: `handle_chunk_arrived(..., chunk_writer_counts)`), is `not present`. 0.5.19-0.5.21 record the
scatter's event with `torch.cuda.Event()`: there `torch` is a stand-in holding that event (the only use these
methods make of it). Release -> model variant: the staging ring's table (`fixed` before 0.5.19, `sglang_0_5_23`).
"""

from __future__ import annotations

import inspect
import threading
import time
from itertools import product
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from kvsim.engine.conformance.adapters import Check, Context, Sweep
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.models.pd_staging.decode_rules import fan_in_complete, req_allocates, scatter_complete
from kvsim.models.pd_staging.layout import HeadReshard, compute_staging_layout
from kvsim.models.pd_staging.state import ALLOC_OVERSIZED, NOT_ALLOCATED

from .ring import StagingBufferStandIn

HANDLER = "sglang/srt/disaggregation/common/staging_handler.py"
BUFFER = "sglang/srt/disaggregation/common/staging_buffer.py"
BUFFER_MODULE = "sglang.srt.disaggregation.common.staging_buffer"
LATE_REQ = "sglang-05c7ebf-staging-late-req-realloc"
DUP_READY = ("sglang-05c7ebf-staging-dup-ready", "sglang-0523-staging-dup-ready-reenqueue")
LOST_REQ = "sglang-05c7ebf-staging-lost-req-success"
ROOM, OTHER_ROOM, SESSION = 7, 8, "decode-session"  # writer_id upstream: the decode's session, for every writer
HANDLER_METHODS = ("handle_chunk_arrived", "submit_chunk_scatter", "advance_scatter", "num_writers_for")
ARRIVAL_PARAMS = ("self", "room", "chunk_idx", "page_start", "num_pages", "writer_id")
TIMEOUT = 300.0  # the handler's completion_timeout (SGLANG_DISAGGREGATION_WAITING_TIMEOUT's default)


def skip(ctx: Context) -> tuple[str, str] | None:
    """("not present", why) where this release's handler is not the shape these targets drive."""
    params = tuple(inspect.signature(ctx.up.DecodeStagingHandler.handle_chunk_arrived).parameters)
    if params != ARRIVAL_PARAMS:
        return ("not present", f"{HANDLER}:DecodeStagingHandler.handle_chunk_arrived takes {params} (the fan-in "
                               "counts were the caller's before 0.5.19); this adapter drives the 0.5.19+ handler")
    return None


class _TorchStandIn:
    """`torch` for releases whose scatter records `torch.cuda.Event()` (0.5.19-0.5.21; later `create_device_event`)."""

    cuda = SimpleNamespace(Event=lambda *a, **k: _Event())


def loading(upstream: Any, up: SimpleNamespace) -> dict[str, Any]:
    """The buffer file with a stand-in device buffer; the handler with upstream's own ring class and layout
    helpers standing in for the buffer module (loaded first), and a device event."""
    if upstream.file == BUFFER:
        return {"extra_globals": {"StagingBuffer": StagingBufferStandIn}}
    module = SimpleNamespace(StagingAllocator=up.StagingAllocator, compute_staging_layout=up.compute_staging_layout,
                             resolve_total_kv_heads=up.resolve_total_kv_heads)
    return {"modules": {BUFFER_MODULE: module}, "extra_globals": {"create_device_event": lambda device: _Event()}}


def prepare(ctx: Context) -> None:
    for name in HANDLER_METHODS:
        if not callable(getattr(ctx.up.DecodeStagingHandler, name, None)):
            raise ConfigError(f"{HANDLER}:DecodeStagingHandler.{name}", "a method", f"absent in {ctx.source.label}")
    if "create_device_event" not in ctx.source.file(HANDLER).read_text(encoding="utf-8"):
        ctx.up.DecodeStagingHandler.submit_chunk_scatter.__globals__["torch"] = _TorchStandIn


class _Event:
    """A device event: `query()` is the test's choice (`done`), `record` does nothing."""

    done = True

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return self.done


class _Socket:
    def __init__(self, pp_rank: int, log: list[list[Any]], fails: Callable[[], bool]) -> None:
        self.pp_rank, self.log, self.fails = pp_rank, log, fails

    def send_multipart(self, frames: list[bytes]) -> None:
        if self.fails():
            raise ConnectionError("the prefill's bootstrap socket is gone")
        # pp rank, room, chunk, offset, round, end, session
        self.log.append([self.pp_rank] + [int(f) for f in frames[1:6]] + [frames[6].decode()])


def allocation(i: int) -> tuple[int, int, int]:
    """The stand-in ring's i-th allocation: (alloc_id, offset, round); the first is id 0 at offset 0."""
    return i, 1000 * i, i % 3


class _Allocator:
    """The decode ring as `handle_staging_req` and the handler use it: `assign` hands out `allocation(i)`, or None
    (a chunk larger than the ring) while `refuse` is set, and records the bytes asked."""

    total_size = 1 << 30

    def __init__(self) -> None:
        self.assigned: list[int] = []
        self.made, self.refuse = 0, False
        self._scatter_stream = None

    def assign(self, required: int) -> tuple[int, int, int] | None:
        self.assigned.append(required)
        if self.refuse:
            return None
        self.made += 1
        return allocation(self.made - 1)


def room_setup(ctx: Context, tp: tuple[int, int] = (1, 1), pp: tuple[int, int] = (1, 1)) -> SimpleNamespace:
    """A stand-in handler `self` with one registered room, its receiver (two prefill PP ranks' bootstrap infos)
    and decode request; `tp`, `pp`: (prefill, decode) attention TP and PP sizes."""
    sent: list[list[Any]] = []
    failing = {"rsp": False}
    sockets = {r: (_Socket(r, sent, lambda: failing["rsp"]), threading.Lock()) for r in (0, 1)}
    receiver = SimpleNamespace(chunk_staging_infos=[], bootstrap_infos=[{"pp_rank": 0}, {"pp_rank": 1}],
                               prefill_info=SimpleNamespace(attn_tp_size=tp[0], pp_size=pp[0]),
                               _connect_to_bootstrap_server=lambda bi: sockets[bi["pp_rank"]])
    decode_req = SimpleNamespace(_chunk_events=[], _staging_all_success=False, _staging_success_ts=0.0,
                                 _staging_scatter_done=False, _staging_failed=False,
                                 req=SimpleNamespace(bootstrap_room=ROOM))
    h = SimpleNamespace(_room_to_receiver={ROOM: receiver}, _room_to_decode_req={ROOM: decode_req}, _writer_counts={},
                        decode_tp=tp[1], kv_manager=SimpleNamespace(pp_size=pp[1]), staging_allocator=_Allocator(),
                        completion_timeout=TIMEOUT, tp_rank=0, device=None, freed=[], receiver=receiver,
                        decode_req=decode_req, sent=sent, failing=failing, scatter_ok=True)
    cls = ctx.up.DecodeStagingHandler
    for name in HANDLER_METHODS:
        setattr(h, name, (lambda f: lambda *a: f(h, *a))(getattr(cls, name)))
    h.regions = []  # each scatter: (staging offset, page_start, num_pages, the room's request, the room's receiver)

    def scatter_region(offset: int, page_start: int, num_pages: int, req: Any, recv: Any) -> bool:
        h.regions.append([offset, page_start, num_pages, req is decode_req, recv is receiver])
        return h.scatter_ok

    h._scatter_region = scatter_region
    h._free_and_send_watermark = lambda alloc_id, req: h.freed.append(alloc_id)
    return h


# -- staging-dedupe ----------------------------------------------------------------------------------------------

# (heads, prefill TP, decode TP, engine rank, page size, head bytes, layers, heads published as the total): more
# heads than decode ranks, fewer, the per-rank count published, one decode rank (engine rank of another group)
GEOMETRIES = ((4, 4, 2, 1, 2, 3, 2, True), (2, 1, 4, 3, 1, 5, 1, True), (8, 2, 4, 2, 4, 2, 3, False),
              (4, 2, 1, 1, 2, 4, 1, True))
CORE_OPS = ("req", "oversized", "scatter")
# dropped REQs (no receiver for the room, no staging ring), a lost STAGING_RSP, a REQ naming no PP rank
OTHER_OPS = ("req_unregistered", "req_no_ring", "req_rsp_lost", "req_any_pp")
REQUESTER = 1  # the prefill PP rank that sends the STAGING_REQs


def dedupe_cases(ctx: Context) -> Iterator[dict[str, Any]]:
    for n in range(1, 5):
        for ops in product(product(CORE_OPS, (0, 1)), repeat=n):
            yield {"geometry": 0, "ops": [list(o) for o in ops]}
    for g in range(len(GEOMETRIES)):
        for n in (1, 2):
            for ops in product(product(CORE_OPS + OTHER_OPS, (0, 1)), repeat=n):
                if g or any(op in OTHER_OPS for op, _ in ops):
                    yield {"geometry": g, "ops": [list(o) for o in ops]}


def chunk_pages(chunk: int) -> int:
    return 1 + chunk  # chunk 0: one page, chunk 1: two


def kv_args(g: tuple) -> SimpleNamespace:
    heads, _, decode_tp, rank, page_size, head_bytes, layers, total = g
    per_rank = max(1, heads // decode_tp)
    args = SimpleNamespace(page_size=page_size, kv_item_lens=[page_size * per_rank * head_bytes] * (2 * layers),
                           engine_rank=rank)
    if total:
        args.total_kv_head_num = heads
    else:
        args.kv_head_num = per_rank
    return args


def slot_bytes(g: tuple, chunk: int) -> int:
    """The model's size of the chunk's staging slot on the decode rank (all its writers); a per-rank head count
    published stands for that many heads on each decode rank."""
    heads, prefill_tp, decode_tp, rank, page_size, head_bytes, layers, total = g
    heads = heads if total else max(1, heads // decode_tp) * decode_tp
    layout = compute_staging_layout(HeadReshard(heads, prefill_tp, decode_tp), rank % decode_tp,
                                    chunk_pages(chunk) * page_size, layers, head_bytes)
    return layout.total_bytes


def dedupe_upstream(ctx: Context, case: dict[str, Any]) -> list[dict[str, Any]]:
    g = GEOMETRIES[case["geometry"]]
    h = room_setup(ctx, (g[1], g[2]))
    ring = h.staging_allocator
    steps = []
    for op, k in case["ops"]:
        if op == "scatter":
            steps.append({"op": op, "scattered": bool(h.submit_chunk_scatter(ROOM, k, k, 1))})
            continue
        asked, made, sent = len(ring.assigned), ring.made, len(h.sent)
        ring.refuse, h.failing["rsp"] = op == "oversized", op == "req_rsp_lost"
        room = OTHER_ROOM if op == "req_unregistered" else ROOM
        msg = [b"STAGING_REQ", str(room).encode(), str(k).encode(), str(chunk_pages(k)).encode(), SESSION.encode()]
        if op != "req_any_pp":
            msg.append(str(REQUESTER).encode())
        ctx.up.handle_staging_req(msg, None if op == "req_no_ring" else ring, kv_args(g), g[2], g[1], {},
                                  h._room_to_receiver, {ROOM: h.receiver.bootstrap_infos})
        steps.append({"op": op, "allocates": ring.made > made, "asked": ring.assigned[asked:], "rsp": h.sent[sent:]})
    return steps


def dedupe_model(ctx: Context, case: dict[str, Any]) -> list[dict[str, Any]]:
    g = GEOMETRIES[case["geometry"]]
    infos = [NOT_ALLOCATED, NOT_ALLOCATED]
    slots: dict[int, tuple[int, int, int]] = {}  # chunk -> (offset, round, end) of its live allocation
    made, steps = 0, []
    for op, k in case["ops"]:
        if op == "scatter":
            scattered = infos[k] >= 0
            if scattered:
                infos[k] = NOT_ALLOCATED  # the model's scatter clears the slot entry
            steps.append({"op": op, "scattered": scattered})
            continue
        if op in ("req_unregistered", "req_no_ring"):  # dropped: no room to allocate for, or no ring
            steps.append({"op": op, "allocates": False, "asked": [], "rsp": []})
            continue
        allocates = req_allocates(infos[k])
        asked = [slot_bytes(g, k)] if allocates else []
        if allocates and op == "oversized":
            infos[k], allocates = ALLOC_OVERSIZED, False
        elif allocates:
            alloc_id, offset, rnd = allocation(made)
            made += 1
            infos[k], slots[k] = alloc_id, (offset, rnd, offset + asked[0])
        reply = [ALLOC_OVERSIZED, 0, -1] if infos[k] == ALLOC_OVERSIZED else list(slots[k])
        rsp_to = [REQUESTER] if ctx.variant.pp_prefill_writers and op != "req_any_pp" else [0, 1]
        rsp = [] if op == "req_rsp_lost" else [[r, ROOM, k] + reply + [SESSION] for r in rsp_to]
        steps.append({"op": op, "allocates": allocates, "asked": asked, "rsp": rsp})
    return steps


def late_req(ctx: Context, case: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    """A REQ for a chunk already scattered does not allocate it again."""
    scattered: set[int] = set()
    for (op, k), step in zip(case["ops"], steps):
        if op == "scatter" and step["scattered"]:
            scattered.add(k)
        elif step.get("allocates") and k in scattered:
            raise PropertyViolation(f"a STAGING_REQ for chunk {k}, already scattered, allocates the slot again")


DEDUPE = Sweep(
    loading=loading, prepare=prepare, skip=skip, domain=dedupe_cases, model=dedupe_model, upstream=dedupe_upstream,
    checks=(Check("late_req_never_reallocates", late_req, finding=LATE_REQ),),
    note=lambda ctx: f"exhaustive: every sequence of up to 4 REQ / oversized REQ / scatter operations on chunks 0 "
                     f"and 1, and of up to 2 with dropped REQs, a lost STAGING_RSP and a REQ naming no PP rank, over "
                     f"{len(GEOMETRIES)} geometries")


# -- staging-fan-in ----------------------------------------------------------------------------------------------

# (prefill TP, decode TP, prefill PP, decode PP): W = tp_writers * pp_writers
WRITER_LAYOUTS = ((1, 1, 1, 1), (2, 1, 1, 1), (4, 2, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 3, 1), (2, 1, 2, 1),
                  (1, 1, 2, 2))
HEADS = 8  # a head count every layout's TP sizes divide


def writers(layout: tuple[int, int, int, int]) -> int:
    """The model's W: the prefill TP ranks writing one decode rank, times the prefill PP stages per decode stage."""
    p, d, pp, dpp = layout
    return HeadReshard(HEADS, p, d).num_writers * (pp // dpp)


def fan_in_cases(ctx: Context) -> Iterator[dict[str, Any]]:
    for layout in WRITER_LAYOUTS:
        yield {"layout": list(layout), "writers": [0], "registered": False}
        w = writers(layout)
        for n in range(1, w + 2):
            for arrived in product(range(w), repeat=n):
                yield {"layout": list(layout), "writers": list(arrived), "registered": True}


CHUNK, PAGE_START, NUM_PAGES = 1, 5, 2  # the chunk every writer reports ready, and its pages
SLOT = allocation(0)  # the chunk's allocation


def fan_in_upstream(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    p, d, pp, dpp = case["layout"]
    h = room_setup(ctx, (p, d), (pp, dpp))
    alloc_id, offset, rnd = SLOT
    h.receiver.chunk_staging_infos.extend([(-1, -1, 0, -1, 0), (alloc_id, offset, rnd, offset + 1, NUM_PAGES)])
    room = ROOM if case["registered"] else OTHER_ROOM
    submits = [bool(h.handle_chunk_arrived(room, CHUNK, PAGE_START, NUM_PAGES, SESSION)) for _ in case["writers"]]
    return {"num_writers": h.num_writers_for(h.receiver), "submits": submits, "scatters": h.regions}


def fan_in_model(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    w, arrivals, submits, scatters, slot = writers(tuple(case["layout"])), (), [], [], True
    for writer in case["writers"]:
        if not case["registered"]:  # an arrival for a room with no receiver is dropped
            submits.append(False)
            continue
        arrivals += ((PAGE_START, NUM_PAGES, writer),)
        submits.append(fan_in_complete(arrivals, w))
        if submits[-1]:
            arrivals = ()
            if slot:  # the scatter reads the slot once; it is cleared then
                scatters.append([SLOT[1], PAGE_START, NUM_PAGES, True, True])
                slot = False
    return {"num_writers": w, "submits": submits, "scatters": scatters}


def all_writers(ctx: Context, case: dict[str, Any], answer: dict[str, Any]) -> None:
    """S11: a scatter is submitted only once W distinct writers arrived."""
    seen: set[int] = set()
    for writer, submitted in zip(case["writers"], answer["submits"]):
        seen.add(writer)
        if submitted:
            if len(seen) < answer["num_writers"]:
                raise PropertyViolation(f"the scatter is submitted after writers {sorted(seen)} of "
                                        f"{answer['num_writers']} arrived (a duplicate CHUNK_READY counts)")
            seen = set()


FAN_IN = Sweep(
    loading=loading, prepare=prepare, skip=skip, domain=fan_in_cases, model=fan_in_model, upstream=fan_in_upstream,
    checks=(Check("scatter_after_all_writers", all_writers, finding=", ".join(DUP_READY)),),
    note=lambda ctx: f"exhaustive: {len(WRITER_LAYOUTS)} TP x PP writer layouts (W 1-4); arrival sequences of up "
                     f"to W + 1 writers, and one for an unregistered room")


# -- staging-completion ------------------------------------------------------------------------------------------

# per chunk: never allocated (a scatter of it still tried), allocated, its scatter failing, scattered, completed
CHUNK_STATES = ("lost", "allocated", "scatter_fails", "scattered", "completed")


def completion_cases(ctx: Context) -> Iterator[dict[str, Any]]:
    yield {"chunks": ["scattered"], "all_success": True, "past_deadline": False, "registered": False}
    for n in (1, 2, 3):
        for states, all_success, late in product(product(CHUNK_STATES, repeat=n), (False, True), (False, True)):
            if all_success or not late:
                yield {"chunks": list(states), "all_success": all_success, "past_deadline": late, "registered": True}


def completion_req(ctx: Context, h: SimpleNamespace, k: int) -> None:
    g = GEOMETRIES[0]
    ctx.up.handle_staging_req([b"STAGING_REQ", str(ROOM).encode(), str(k).encode(), b"1", SESSION.encode()],
                              h.staging_allocator, kv_args(g), g[2], g[1], {}, h._room_to_receiver,
                              {ROOM: h.receiver.bootstrap_infos[:1]})


def completion_upstream(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    h = room_setup(ctx)
    for k, state in enumerate(case["chunks"]):
        if state != "lost":
            completion_req(ctx, h, k)
    room = ROOM if case["registered"] else OTHER_ROOM
    scatters = []
    for k, state in enumerate(case["chunks"]):
        if state != "allocated":
            h.scatter_ok = state != "scatter_fails"
            scatters.append(bool(h.submit_chunk_scatter(room, k, 10 + k, 2 + k)))
            if scatters[-1]:
                h.decode_req._chunk_events[-1][0].done = state == "completed"  # the scatter's event fired or not
    h.decode_req._staging_all_success = case["all_success"]
    h.decode_req._staging_success_ts = time.monotonic() - (2 * TIMEOUT if case["past_deadline"] else 0.0)
    h.advance_scatter(h.decode_req)
    sent = len(h.sent)
    for k, state in enumerate(case["chunks"]):  # a late STAGING_REQ for each chunk after the scatters
        completion_req(ctx, h, k)
    return {"scatters": scatters, "regions": h.regions, "freed": sorted(h.freed),
            "done": bool(h.decode_req._staging_scatter_done), "failed": bool(h.decode_req._staging_failed),
            "late_replies": [r[3] for r in h.sent[sent:]]}


def completion_model(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    states, made = case["chunks"], 0
    infos, events, freed, scatters, regions = [], [], [], [], []
    for state in states:  # the allocations, in chunk order
        infos.append(allocation(made) if state != "lost" else None)
        made += state != "lost"
    for k, state in enumerate(states):
        if state == "allocated":
            continue
        tried = case["registered"] and infos[k] is not None  # the scatter kernel runs on an allocated slot
        if tried:
            regions.append([infos[k][1], 10 + k, 2 + k, True, True])
        submitted = tried and state != "scatter_fails"
        scatters.append(submitted)
        if submitted:
            (freed if state == "completed" else events).append(infos[k][0])
            infos[k] = None
    ids = [NOT_ALLOCATED if i is None else i[0] for i in infos]
    done = scatter_complete(case["all_success"], events, ids)
    failed = ctx.variant.completion_deadline and case["all_success"] and not done and case["past_deadline"]
    late = []  # a late REQ: a live slot answers its offset, a cleared or lost one is allocated anew (the finding)
    for k in range(len(states)):
        if req_allocates(ids[k]):
            late.append(allocation(made)[1])
            made += 1
        else:
            late.append(infos[k][1])
    return {"scatters": scatters, "regions": regions, "freed": sorted(freed), "done": done, "failed": failed,
            "late_replies": late}


def every_chunk_scattered(ctx: Context, case: dict[str, Any], answer: dict[str, Any]) -> None:
    """A room completes only once every chunk was scattered."""
    if answer["done"] and any(s in ("lost", "allocated", "scatter_fails") for s in case["chunks"]):
        raise PropertyViolation("the room completes with a chunk never scattered (its STAGING_REQ lost, or its "
                                "scatter not submitted)")


COMPLETION = Sweep(
    loading=loading, prepare=prepare, skip=skip, domain=completion_cases, model=completion_model,
    upstream=completion_upstream,
    checks=(Check("done_only_when_every_chunk_scattered", every_chunk_scattered, finding=LOST_REQ),),
    note=lambda ctx: "exhaustive: rooms of 1-3 chunks, each lost / allocated / scatter failing / scattered / "
                     "completed, with and without all-ranks Success, before and past the completion deadline")
