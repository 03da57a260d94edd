"""Timed simulation of the PD staging transfer (`kvsim simulate pd-staging`), SGLang 05c7ebf (PR #30545).

Many rooms of one geometry between W prefill writer ranks and one decode
rank, on the seeded discrete-event simulator. The simulation owns no
behaviour of its own: every event is an action of the transition system
(`models.pd_staging.PdStaging.step`), so explore, Hypothesis and the timed
runs cannot drift apart. The simulation only decides *when*:

- rooms arrive as a Poisson process; prefill batch ``i`` of a room runs
  ``(i + 1) * chunk_time`` after its arrival;
- each writer's transfer worker takes ``transfer_time`` per chunk and, for a
  chunk that is not ready, waits ``STAGING_WATERMARK_WAIT_S`` before
  re-enqueueing it (a worker whose whole queue defers parks until a message
  reaches its rank: virtual time spent spinning is unobservable);
- messages go through `kvsim.sim.Channel` (latency, drop, delay, duplicate,
  reorder), a scatter completes ``scatter_time`` after it is submitted;
- upstream timers: the decode waiting timeout (300 s after arrival, before
  all-ranks Success), the staging completion deadline (300 s after Success,
  `fixed` only), heartbeats every 5 s with 2 misses after a prefill death
  (`crash=prefill@T`); the scheduler clears a prefill room as soon as
  `sender.poll()` is terminal.

The summary gives each outcome (Success, or Failed and why), the time to
conclude, rooms that never concluded, leaked staging slots and held prefill
rooms at the end, and the invariants of the system on the final state.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvsim.engine.params import ParamSpec
from kvsim.engine.sim import Channel, FaultPlan, Simulator
from kvsim.engine.trace import TraceRecorder

from . import data
from ..pd_common.status import (SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE,
                        SGLANG_DISAGGREGATION_WAITING_TIMEOUT, STAGING_WATERMARK_WAIT_S, KVPoll)
from .system import DOWN, TERMINAL, UP, PdStaging
from .ring import is_watermark_ready
from .state import changed

SIM_PARAMS = (
    ParamSpec("requests", "int", 200, "rooms in the workload", minimum=1, maximum=100_000),
    ParamSpec("arrival_rate", "float", 20.0, "mean room arrivals per second (Poisson)", minimum=1e-6),
    ParamSpec("writers", "int", 2, "W = P_tp / D_tp prefill writer ranks", minimum=1, maximum=8),
    ParamSpec("page_size", "int", 4, "tokens per KV page", minimum=1),
    ParamSpec("chunked_prefill_size", "int", 8, "prefill batch tokens (the grid is its whole pages)", minimum=1),
    ParamSpec("prompt_len", "int", 30, "L: prompt tokens of every room", minimum=1),
    ParamSpec("decode_prefix_len", "int", 8, "D: decode radix hit, shared by every room", minimum=0),
    ParamSpec("prefill_hit", "int", 0, "prefill radix hit", minimum=0),
    ParamSpec("ring_units", "int", 64, "staging ring size in pages of one writer's heads", minimum=1),
    ParamSpec("chunk_time", "float", 0.02, "seconds of prefill compute per batch", minimum=0.0),
    ParamSpec("transfer_time", "float", 0.002, "seconds of one staged RDMA write", minimum=0.0),
    ParamSpec("scatter_time", "float", 0.001, "seconds from scatter submission to its event", minimum=0.0),
)
FAULT_KINDS = ("drop", "delay", "duplicate", "reorder", "crash")


def simulate(sim: Simulator, recorder: TraceRecorder, variant: str, params: Mapping[str, Any],
             faults: FaultPlan) -> dict[str, Any]:
    run = _Run(sim, recorder, variant, params, faults)
    t = sim.poisson_arrivals(params["requests"], params["arrival_rate"], run.arrive)
    # past this every timer has fired: a room still open then would stay open forever (a hang)
    run.horizon = t + 2 * SGLANG_DISAGGREGATION_WAITING_TIMEOUT + 2 * SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL
    for peer, at in faults.crashes:
        sim.schedule(at, run.crash, peer)
    sim.schedule(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, run.heartbeat)
    sim.run()
    return run.summary()


class _Run:
    def __init__(self, sim: Simulator, recorder: TraceRecorder, variant: str, params: Mapping[str, Any],
                 faults: FaultPlan) -> None:
        self.sim, self.rec, self.p = sim, recorder, params
        cfg = data.StagingSystemConfig(
            rooms=params["requests"], writers=params["writers"], page_size=params["page_size"],
            chunked_prefill_size=params["chunked_prefill_size"], prompt_len=params["prompt_len"],
            decode_prefix_len=params["decode_prefix_len"], prefill_hit=params["prefill_hit"],
            ring_units=params["ring_units"], fault_budget=0)
        self.system = PdStaging(cfg, variant)
        self.state = self.system.initial_states()[0]
        w = cfg.writers
        self.chans = [[self._channel(side, v, faults) for v in range(w)] for side in (UP, DOWN)]
        self.arrived: dict[int, float] = {}
        self.concluded: dict[int, tuple[float, str]] = {}
        self.busy = [False] * w
        self.parked = [False] * w
        self.defers = [0] * w
        self.misses = 0
        self.crashed_at: float | None = None
        self.why = "?"
        self.horizon = 0.0
        for r, d in enumerate(self.state.decode):  # registration failures (unaligned prefix) at time 0
            if d.status in TERMINAL:
                self.concluded[r] = (0.0, "Failed: prefix not page-aligned")

    def _channel(self, side: int, w: int, faults: FaultPlan) -> Channel:
        def deliver(m: tuple) -> None:
            if m in self.state.chans[side][w] and not (side == DOWN and self.state.dead):
                self.apply(("deliver", side, w, m), "prefill reported Failed" if m[0] == "STATUS" else m[0])
                if side == DOWN:
                    self._unpark(w)

        def on_fault(kind: str, m: tuple) -> None:
            self.rec.record(self.sim.now, f"fault_{kind}", [side, w, list(m)])
            if kind in ("drop", "duplicate"):
                self.state = self.system.step(self.state, (kind, side, w, m))

        return Channel(self.sim, faults, deliver, on_fault=on_fault)

    # -- one action of the transition system, and what it sets in motion ---------------------------
    def apply(self, action: tuple, why: str) -> None:
        before = self.state
        self.why = why
        self.rec.record(self.sim.now, action[0], list(action[1:]))
        after = self.system.step(before, action)
        self.state = after
        self._follow(before, after)

    def _follow(self, before: Any, after: Any) -> None:
        # Only what the step touched is looked at: per-room state is a `Rooms` tree whose untouched
        # subtrees are shared, so `changed` costs O(touched rooms), not O(rooms), per event.
        now = self.sim.now
        for side in (UP, DOWN):
            if after.chans[side] is before.chans[side]:
                continue
            for w in range(self.system.cfg.writers):
                old, new = before.chans[side][w], after.chans[side][w]
                if old is new:
                    continue
                added = _added(old, new)
                for m in new[len(new) - added:]:  # sends append at the tail
                    self.chans[side][w].send(m)
        for r in changed(before.decode, after.decode):
            d0, d1 = before.decode[r], after.decode[r]
            for aid in d1.events:
                if aid not in d0.events:
                    self.sim.schedule(self.p["scatter_time"], self._scatter_done, r, aid)
            if d1.all_success and not d0.all_success and self.system.fixed:
                self.sim.schedule(SGLANG_DISAGGREGATION_WAITING_TIMEOUT, self._timer, "deadline", r)
            if d1.status in TERMINAL and d0.status not in TERMINAL:
                why = "Success" if d1.status == KVPoll.Success else f"Failed: {self.why}"
                self.concluded[r] = (now, why)
                self.rec.record(now, "conclude", [r, why])
        for w in range(self.system.cfg.writers):
            rooms = after.prefill[w]
            for r in changed(before.prefill[w], rooms):
                if self.system._poll_concludes(rooms[r]):
                    self.apply(("clear", w, r), self.why)  # the scheduler's next poll
            if len(after.queues[w]) > len(before.queues[w]):
                self._unpark(w)  # a new batch: its chunks may be ready
            self._kick(w)

    # -- events ------------------------------------------------------------------------------------
    def arrive(self, r: int) -> None:
        self.arrived[r] = self.sim.now
        self.rec.record(self.sim.now, "arrive", r)
        for i in range(len(self.system.groups)):
            self.sim.schedule((i + 1) * self.p["chunk_time"], self._batch, r)
        self.sim.schedule(SGLANG_DISAGGREGATION_WAITING_TIMEOUT, self._timer, "waiting_timeout", r)

    def _batch(self, r: int) -> None:
        if ("batch", r) in self._prefill_actions(r):
            self.apply(("batch", r), "batch")

    def _prefill_actions(self, r: int) -> tuple:
        s = self.state
        ok = not s.dead and s.batches[r] < len(self.system.groups) and all(p[r].status is not None for p in s.prefill)
        return (("batch", r),) if ok else ()

    def _kick(self, w: int) -> None:
        if not self.busy[w] and not self.parked[w] and self.state.queues[w] and not self.state.dead:
            self.busy[w] = True
            head = self.state.queues[w][0]
            p = self.state.prefill[w][head.room]
            off = p.offsets[head.chunk_idx] if p.infos and p.status not in (None, KVPoll.Failed) else "go"
            ready = off == "go" or (off is not None and self._ready(w, off))
            self.sim.schedule(self.p["transfer_time"] if ready else STAGING_WATERMARK_WAIT_S, self._work, w)

    def _ready(self, w: int, off: tuple) -> bool:
        return off[0] < 0 or is_watermark_ready(off[2], off[3], self.state.watermarks[w])

    def _work(self, w: int) -> None:
        s = self.state
        if s.dead or not s.queues[w]:
            self.busy[w] = False
            return
        before_len, head = len(s.queues[w]), s.queues[w][0]
        self.apply(("work", w), "work")  # busy stays set: the step's follow-ups must not start this worker
        self.busy[w] = False
        after = self.state.queues[w]
        deferred = len(after) == before_len and after[-1][:5] == head[:5]
        self.defers[w] = self.defers[w] + 1 if deferred else 0
        # every queued chunk waited in turn: sleep until a message reaches this rank or a batch adds work
        self.parked[w] = deferred and self.defers[w] >= len(after)
        self._kick(w)

    def _unpark(self, w: int) -> None:
        if self.parked[w]:
            self.parked[w] = False
            self.defers[w] = 0
            self._kick(w)

    def _scatter_done(self, r: int, aid: int) -> None:
        if aid in self.state.decode[r].events:
            self.apply(("scatter_done", r, aid), "scatter")

    def _timer(self, kind: str, r: int) -> None:
        d = self.state.decode[r]
        if d.status in TERMINAL:
            return
        if (kind == "deadline") == d.all_success:
            why = "staging completion deadline" if kind == "deadline" else "waiting timeout"
            self.apply((kind, r), why)

    def crash(self, peer: str) -> None:
        if self.crashed_at is None:
            self.crashed_at = self.sim.now
            self.rec.record(self.sim.now, "crash", peer)
            self.apply(("peer_death",), "peer death")

    def heartbeat(self) -> None:
        if self.crashed_at is not None:
            self.misses += 1
            if self.misses == SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE:
                self.apply(("heartbeat_failure",), "peer death (heartbeat)")
        if len(self.concluded) < self.p["requests"] and self.sim.now < self.horizon:
            self.sim.schedule(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, self.heartbeat)

    # -- the report ----------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        s, system = self.state, self.system
        outcomes: dict[str, int] = {}
        waits = []
        for r in range(self.p["requests"]):
            at, why = self.concluded.get(r, (None, "never concluded"))
            outcomes[why] = outcomes.get(why, 0) + 1
            if at is not None:
                waits.append(at - self.arrived.get(r, 0.0))
        held = [] if s.dead else sorted({r for rooms in s.prefill for r, p in enumerate(rooms) if p.status is not None})
        leaked = [aid for aid, _ in s.owners]
        violations = [f"{inv.name}: {msg}" for inv in system.invariants if (msg := inv.check(s)) is not None]
        if leaked:
            violations.append(f"leaked staging slots: expected none after every room concluded, got {len(leaked)}")
        if held:
            violations.append(f"prefill rooms never cleared (pages held): expected none, got {len(held)} "
                              f"(first: room {held[0]})")
        return {
            "rooms": self.p["requests"],
            "outcomes": dict(sorted(outcomes.items())),
            "mean_time_to_conclude": round(sum(waits) / len(waits), 6) if waits else None,
            "worst_time_to_conclude": round(max(waits), 6) if waits else None,
            "leaked_slots": len(leaked),
            "held_prefill_rooms": len(held),
            "violations": violations,
        }


def _added(old: tuple, new: tuple) -> int:
    """Messages of `new` beyond those of `old`, as multisets (a step takes, duplicates or appends)."""
    n = len(old)
    if new[:n] == old:  # only appends: the common case, without counting
        return len(new) - n
    rest = list(old)
    added = 0
    for m in new:
        try:
            rest.remove(m)
        except ValueError:
            added += 1
    return added
