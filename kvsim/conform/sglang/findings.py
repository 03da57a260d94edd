"""The pd-staging findings' pure parts on SGLang's own code (`common/staging_handler.py`).

Three decisions of the decode staging handler run as upstream wrote them, on stand-in `self`
objects (`DecodeStagingHandler` methods) and stand-in receivers, sockets and device events:

- `staging-dedupe`: `handle_staging_req` (with upstream's `compute_staging_layout` and
  `resolve_total_kv_heads`) and `DecodeStagingHandler.submit_chunk_scatter`, over every sequence of
  up to 4 operations (a STAGING_REQ or a scatter of chunk 0 or 1): whether each REQ allocates,
  against the model's `decode_rules.req_allocates`. Property `late_req_never_reallocates` (a REQ for
  a chunk already scattered does not allocate): finding `sglang-05c7ebf-staging-late-req-realloc`.
- `staging-fan-in`: `DecodeStagingHandler.handle_chunk_arrived` with upstream's own `num_writers_for`
  (W = tp_writers * pp_writers: 1x1, 2x1, 1x2, 1x3, 2x2), over every sequence of CHUNK_READY arrivals of up
  to W + 1 writers: whether each arrival submits the scatter, against `decode_rules.fan_in_complete`.
  Upstream's `writer_id` is the decode session (the same for every writer), passed as such.
  Property `scatter_after_all_writers` (S11: a scatter only after W distinct writers):
  findings `sglang-05c7ebf-staging-dup-ready` and `sglang-0523-staging-dup-ready-reenqueue`.
- `staging-completion`: `DecodeStagingHandler.advance_scatter` after upstream's `handle_staging_req`
  and `submit_chunk_scatter`, over rooms of 1-3 chunks and every choice of which chunks were
  allocated, scattered and completed, with and without all-ranks Success: whether the room is done,
  against `decode_rules.scatter_complete`. Property `done_only_when_every_chunk_scattered`:
  finding `sglang-05c7ebf-staging-lost-req-success`.

Statuses: the differential decides conformance (a divergence makes the target diverge). A finding's
property failing on the release is `finding confirmed` (the open-upstream finding reproduced on the
real code: the target still conforms, so `kvsim conform sglang` stays at exit 0, and the message
names the finding and the smallest failing input); holding, it is `holds` and the note says the
finding did not reproduce there. A release without one of the functions, or whose handler has
another shape (before 0.5.19 the fan-in counts were the caller's: `handle_chunk_arrived(...,
chunk_writer_counts)`), is `not present`. 0.5.19-0.5.21 record the scatter's event with
`torch.cuda.Event()`: there `torch` is a stand-in holding that event (the only use these methods make).
"""

from __future__ import annotations

import inspect
import threading
import time
from itertools import product
from types import SimpleNamespace
from typing import Any, Callable

from kvsim.engine.errors import ConfigError
from kvsim.models.pd_staging.decode_rules import fan_in_complete, req_allocates, scatter_complete
from kvsim.models.pd_staging.state import NOT_ALLOCATED

from ..loader import load_definitions
from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult
from .ring import StagingBufferStandIn

HANDLER = "sglang/srt/disaggregation/common/staging_handler.py"
BUFFER = "sglang/srt/disaggregation/common/staging_buffer.py"
BUFFER_MODULE = "sglang.srt.disaggregation.common.staging_buffer"
FINDING = "finding confirmed"  # an open-upstream finding's property failing on the release, as the catalog says
LATE_REQ = "sglang-05c7ebf-staging-late-req-realloc"
DUP_READY = ("sglang-05c7ebf-staging-dup-ready", "sglang-0523-staging-dup-ready-reenqueue")
LOST_REQ = "sglang-05c7ebf-staging-lost-req-success"
ROOM, SESSION = 7, "decode-session"  # writer_id upstream: the decode's session, the same for every writer
WRITER_SPLITS = ((1, 1), (2, 1), (1, 2), (1, 3), (2, 2))  # (tp_writers, pp_writers): W up to 4
HANDLER_METHODS = ("handle_chunk_arrived", "submit_chunk_scatter", "advance_scatter", "num_writers_for")


ARRIVAL_PARAMS = ("self", "room", "chunk_idx", "page_start", "num_pages", "writer_id")


def other_shape(ns: SimpleNamespace) -> str | None:
    """None, or why this release's handler is not the shape these targets drive (the target is "not present")."""
    params = tuple(inspect.signature(ns.DecodeStagingHandler.handle_chunk_arrived).parameters)
    if params != ARRIVAL_PARAMS:
        return (f"{HANDLER}:DecodeStagingHandler.handle_chunk_arrived takes {params} (the fan-in counts were the "
                "caller's before 0.5.19); this adapter drives the 0.5.19+ handler")
    return None


class _TorchStandIn:
    """`torch` for releases whose scatter records `torch.cuda.Event()` (0.5.19-0.5.21; later `create_device_event`)."""

    cuda = SimpleNamespace(Event=lambda *a, **k: _Event())


def load(source: EngineSource) -> SimpleNamespace:
    """Upstream's handler class and `handle_staging_req`, its allocator-side helpers standing in for the module."""
    buf = load_definitions(source.file(BUFFER), ["compute_staging_layout", "resolve_total_kv_heads"], where=BUFFER,
                           version=source.label, extra_globals={"StagingBuffer": StagingBufferStandIn})
    allocator = SimpleNamespace(ALLOC_OVERSIZED=-2, ALLOC_PENDING=-1)
    module = SimpleNamespace(StagingAllocator=allocator, compute_staging_layout=buf.compute_staging_layout,
                             resolve_total_kv_heads=buf.resolve_total_kv_heads)
    text = open(source.file(HANDLER), encoding="utf-8").read()
    stand_ins: dict[str, Any] = {BUFFER_MODULE: module}
    if "create_device_event" not in text:
        stand_ins["torch"] = _TorchStandIn  # the scatter's event is all these methods use torch for
    ns = load_definitions(source.file(HANDLER), ["DecodeStagingHandler", "handle_staging_req"], where=HANDLER,
                          version=source.label, modules=stand_ins,
                          extra_globals={"create_device_event": lambda device: _Event()})
    for name in HANDLER_METHODS:
        if not callable(getattr(ns.DecodeStagingHandler, name, None)):
            raise ConfigError(f"{HANDLER}:DecodeStagingHandler.{name}", "a method", f"absent in {source.label}")
    return ns


class _Event:
    """A device event: `query()` is the test's choice (`done`), `record` does nothing."""

    done = True

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return self.done


class _Socket:
    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sent.append(frames)


class _Allocator:
    """The decode ring as `handle_staging_req` and the handler use it: `assign` hands out ids and records them."""

    def __init__(self) -> None:
        self.assigned: list[int] = []
        self._scatter_stream = None

    def assign(self, required: int) -> tuple[int, int, int]:
        self.assigned.append(required)
        return len(self.assigned) - 1, 0, 0


def room_setup(ns: SimpleNamespace, tp_writers: int = 1, pp_writers: int = 1) -> SimpleNamespace:
    """A stand-in handler `self` with one registered room, its receiver and decode request."""
    socket = _Socket()
    receiver = SimpleNamespace(chunk_staging_infos=[], bootstrap_infos=[{"pp_rank": 0}],
                               prefill_info=SimpleNamespace(attn_tp_size=tp_writers, pp_size=pp_writers),
                               _connect_to_bootstrap_server=lambda bi: (socket, threading.Lock()))
    decode_req = SimpleNamespace(_chunk_events=[], _staging_all_success=False, _staging_success_ts=0.0,
                                 _staging_scatter_done=False, _staging_failed=False,
                                 req=SimpleNamespace(bootstrap_room=ROOM))
    h = SimpleNamespace(_room_to_receiver={ROOM: receiver}, _room_to_decode_req={ROOM: decode_req}, _writer_counts={},
                        decode_tp=1, kv_manager=SimpleNamespace(pp_size=1), staging_allocator=_Allocator(),
                        completion_timeout=300.0, tp_rank=0, device=None, freed=[], receiver=receiver,
                        decode_req=decode_req)
    cls = ns.DecodeStagingHandler
    for name in HANDLER_METHODS:
        setattr(h, name, (lambda f: lambda *a: f(h, *a))(getattr(cls, name)))
    h._scatter_region = lambda *a: True
    h._free_and_send_watermark = lambda alloc_id, req: h.freed.append(alloc_id)
    return h


def staging_req(ns: SimpleNamespace, h: SimpleNamespace, chunk: int, pages: int = 1) -> bool:
    """Upstream's `handle_staging_req` for (room, chunk): True when it allocated."""
    before = len(h.staging_allocator.assigned)
    msg = [b"STAGING_REQ", str(ROOM).encode(), str(chunk).encode(), str(pages).encode(), SESSION.encode(), b"0"]
    kv_args = SimpleNamespace(page_size=1, kv_item_lens=[8, 8], engine_rank=0, total_kv_head_num=1)
    ns.handle_staging_req(msg, h.staging_allocator, kv_args, 1, 1, {}, h._room_to_receiver,
                          {ROOM: h.receiver.bootstrap_infos})
    return len(h.staging_allocator.assigned) > before


def on_release(name: str, body: Callable[[SimpleNamespace, TargetResult], None]) -> Callable[..., TargetResult]:
    """A target's `run`: the release's handler loaded, "not present" where it has another shape, else `body`
    (exhaustive, so the Hypothesis options do not apply)."""

    def run(source: EngineSource, options: RunOptions) -> TargetResult:
        started = time.perf_counter()
        ns = load(source)
        result = TargetResult(name, source.version)
        if (why := other_shape(ns)) is not None:
            result.status, result.note = "not present", why
        else:
            body(ns, result)
        return result.finish(started)

    return run


# -- staging-dedupe ----------------------------------------------------------------------------------------------

DEDUPE_OPS = (("req", 0), ("req", 1), ("scatter", 0), ("scatter", 1))


def _dedupe(ns: SimpleNamespace, result: TargetResult) -> None:
    first_late: list[Any] | None = None
    for n in range(1, 5):
        for ops in product(DEDUPE_OPS, repeat=n):
            h = room_setup(ns)
            infos, next_id, scattered, got, want = [NOT_ALLOCATED, NOT_ALLOCATED], 0, set(), [], []
            for op, k in ops:
                if op == "req":
                    allocated = staging_req(ns, h, k)
                    got.append(allocated)
                    want.append(req_allocates(infos[k]))
                    if want[-1]:
                        infos[k], next_id = next_id, next_id + 1
                    if allocated and k in scattered and first_late is None:
                        first_late = [list(o) for o in ops]
                else:
                    h.submit_chunk_scatter(ROOM, k, k, 1)
                    if infos[k] >= 0:
                        infos[k] = NOT_ALLOCATED  # the model's scatter clears the slot entry
                        scattered.add(k)
            result.compared += 1
            if got != want:
                result.diverge({"ops": [list(o) for o in ops]}, want, got, "does each STAGING_REQ allocate")
    _finding(result, "late_req_never_reallocates", first_late, (LATE_REQ,),
             "a STAGING_REQ for a chunk already scattered allocates the slot again")
    result.note = "exhaustive: every sequence of up to 4 REQ/scatter operations on chunks 0 and 1"


# -- staging-fan-in ----------------------------------------------------------------------------------------------

def _fan_in(ns: SimpleNamespace, result: TargetResult) -> None:
    first_dup: list[Any] | None = None
    for tp, pp in WRITER_SPLITS:
        w = tp * pp
        for n in range(1, w + 2):
            for writers in product(range(w), repeat=n):
                h = room_setup(ns, tp, pp)
                h.receiver.chunk_staging_infos.append((0, 0, 0, 1, 1))  # slot 0 allocated
                arrivals: tuple = ()
                got, want = [], []
                for i, writer in enumerate(writers):
                    got.append(bool(h.handle_chunk_arrived(ROOM, 0, 0, 1, SESSION)))
                    arrivals += ((0, 1, writer),)
                    want.append(fan_in_complete(arrivals, w))
                    if want[-1]:
                        if len({a[2] for a in arrivals}) < w and first_dup is None:
                            first_dup = {"tp_writers": tp, "pp_writers": pp, "writers": list(writers[:i + 1])}
                        arrivals = ()
                result.compared += 1
                if got != want:
                    result.diverge({"tp_writers": tp, "pp_writers": pp, "writers": list(writers)}, want, got,
                                   "does each CHUNK_READY submit the scatter")
    _finding(result, "scatter_after_all_writers", first_dup, DUP_READY,
             "the scatter is submitted before W distinct writers arrived (a duplicate CHUNK_READY counts)")
    result.note = "exhaustive: (tp, pp) writers 1x1, 2x1, 1x2, 1x3, 2x2; arrival sequences of up to W + 1 writers"


# -- staging-completion ------------------------------------------------------------------------------------------

def _completion(ns: SimpleNamespace, result: TargetResult) -> None:
    first_lost: dict[str, Any] | None = None
    for chunks in (1, 2, 3):
        # per chunk: 0 never allocated (its STAGING_REQ lost), 1 allocated, 2 scattered, 3 scattered and completed
        for states in product(range(4), repeat=chunks):
            for all_success in (False, True):
                h = room_setup(ns)
                for k, st in enumerate(states):
                    if st >= 1:
                        staging_req(ns, h, k)
                for k, st in enumerate(states):
                    if st >= 2:
                        h.submit_chunk_scatter(ROOM, k, k, 1)
                        h.decode_req._chunk_events[-1][0].done = st == 3  # the scatter's event fired or not
                h.decode_req._staging_all_success = all_success
                h.decode_req._staging_success_ts = time.monotonic()
                h.advance_scatter(h.decode_req)
                got = bool(h.decode_req._staging_scatter_done)
                infos = [0 if st == 1 else NOT_ALLOCATED for st in states]
                events = [k for k, st in enumerate(states) if st == 2]
                want = scatter_complete(all_success, events, infos)
                result.compared += 1
                if got != want:
                    result.diverge({"chunks": list(states), "all_success": all_success}, want, got, "room done")
                if got and any(st < 2 for st in states) and first_lost is None:
                    first_lost = {"chunk_states": list(states), "all_success": all_success}
    _finding(result, "done_only_when_every_chunk_scattered", first_lost, (LOST_REQ,),
             "the room completes with a chunk never allocated (its STAGING_REQ lost), so never scattered")
    result.note = ("exhaustive: rooms of 1-3 chunks, each never allocated / allocated / scattered / completed, "
                   "with and without all-ranks Success")


def _finding(result: TargetResult, name: str, counterexample: Any, findings: tuple[str, ...], what: str) -> None:
    if counterexample is None:
        result.prop(name, "holds", f"finding {', '.join(findings)} not reproduced on this release")
    else:
        result.prop(name, FINDING, f"{what}: {', '.join(findings)}; first failing input {counterexample}")


TARGETS = (
    Target("sglang", "staging-dedupe", HANDLER, ("handle_staging_req", "DecodeStagingHandler"), "pd-staging",
           "handle_staging_req's dedupe test vs decode_rules.req_allocates; late-REQ finding on upstream",
           on_release("staging-dedupe", _dedupe)),
    Target("sglang", "staging-fan-in", HANDLER, ("DecodeStagingHandler",), "pd-staging",
           "handle_chunk_arrived's fan-in count vs decode_rules.fan_in_complete; dup-ready finding on upstream",
           on_release("staging-fan-in", _fan_in)),
    Target("sglang", "staging-completion", HANDLER, ("DecodeStagingHandler", "handle_staging_req"), "pd-staging",
           "advance_scatter's completion rule vs decode_rules.scatter_complete; lost-REQ finding on upstream",
           on_release("staging-completion", _completion)),
)
