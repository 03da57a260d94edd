"""Timed simulation of the PD control protocol (`kvsim simulate pd-protocol`).

Many rooms between one prefill rank and one decode rank, on the seeded
discrete-event simulator, with the upstream timers (bootstrap and waiting
timeouts 300 s, heartbeat every 5 s, 2 misses) and a fault plan: dropped,
delayed, duplicated, reordered and garbled control messages (a garbled
message reaches the bootstrap loop as a malformed frame) and prefill deaths
(`crash=prefill@T`). Every per-room step is the one the transition system
uses (`pd_rooms`, `pd_wire`), so the two cannot drift apart.

The summary gives each room's outcome and time to conclude and checks the
bound of P8: a room concludes within its timeout, and within the heartbeat
detection time after the death of its prefill.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvsim.engine.params import ParamSpec
from kvsim.engine.sim import Channel, FaultPlan, Simulator
from kvsim.engine.trace import TraceRecorder

from . import rooms as R
from ..pd_common.status import (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL,
                        SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE, SGLANG_DISAGGREGATION_WAITING_TIMEOUT, KVPoll)
from .wire import BACKENDS, encode_abort, encode_status, handle_bootstrap, handle_decode

SIM_PARAMS = (
    ParamSpec("backend", "str", "mooncake", "PD transfer backend", choices=BACKENDS),
    ParamSpec("requests", "int", 200, "rooms in the workload", minimum=1, maximum=100_000),
    ParamSpec("arrival_rate", "float", 4.0, "mean room arrivals per second (Poisson)", minimum=1e-6),
    ParamSpec("chunks", "int", 4, "KV chunks per room", minimum=1),
    ParamSpec("chunk_time", "float", 0.02, "seconds of prefill compute per chunk", minimum=0.0),
    ParamSpec("transfer_time", "float", 0.005, "seconds of worker transfer per chunk", minimum=0.0),
    ParamSpec("init_step_time", "float", 0.01, "seconds between the prefill manager's start-up steps", minimum=0.0),
    ParamSpec("staging", "int", 0, "1: the decode sends a staging WATERMARK after registering", minimum=0, maximum=1),
)
SLACK = 1.0  # seconds of tolerance on the P8 bound (message latency, heartbeat phase)


def simulate(sim: Simulator, recorder: TraceRecorder, variant: str, params: Mapping[str, Any],
             faults: FaultPlan) -> dict[str, Any]:
    run = _Run(sim, recorder, variant, params, faults)
    sim.poisson_arrivals(params["requests"], params["arrival_rate"], run.arrive)
    for step, name in enumerate(run.init):
        sim.schedule((step + 1) * params["init_step_time"], run.init_step, name)
    for peer, at in faults.crashes:
        sim.schedule(at, run.crash, peer)
    sim.schedule(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, run.heartbeat)
    sim.run()
    return run.summary()


class _Run:
    def __init__(self, sim: Simulator, recorder: TraceRecorder, variant: str, params: Mapping[str, Any],
                 faults: FaultPlan) -> None:
        self.sim, self.rec, self.variant, self.p = sim, recorder, variant, params
        self.backend = params["backend"]
        self.init = R.init_sequence(self.backend, variant)
        self.assigned: set[str] = set()
        self.thread = "unstarted"
        self.buffered: list[tuple] = []  # ZMQ queues what arrives before the thread runs
        self.prefill: dict[int, R.PrefillRoom] = {}
        self.decode: dict[int, KVPoll] = {}
        self.started: dict[int, float] = {}
        self.concluded: dict[int, tuple[float, str]] = {}
        self.flips: list[int] = []
        self.registered = False
        self.prefill_dead_at: float | None = None
        self.misses = 0
        self.node_failed = False  # the heartbeat checker declared the prefill dead
        self.worker_busy = False
        self.queue: list[tuple[int, int]] = []
        garble = lambda message, rng: ("GARBAGE",)  # noqa: E731  the bytes no longer parse
        self.to_prefill = Channel(sim, faults, self.on_prefill_message, garble=garble, on_fault=self._fault)
        self.to_decode = Channel(sim, faults, self.on_decode_message, garble=garble, on_fault=self._fault)
        self.decode_thread = "alive"

    def _fault(self, kind: str, message: Any) -> None:
        self.rec.record(self.sim.now, f"fault_{kind}", list(message))

    # -- decode side ---------------------------------------------------------------------------
    def arrive(self, r: int) -> None:
        self.prefill[r] = R.NEW_PREFILL_ROOM
        self.decode[r] = KVPoll.WaitingForInput
        self.started[r] = self.sim.now
        self.rec.record(self.sim.now, "arrive", r)
        if self.node_failed:
            return self._conclude_decode(r, KVPoll.Failed, "bootstrap to a failed prefill")
        if not self.registered:
            self.registered = True
            self.to_prefill.send(("REG",))
            if self.p["staging"]:
                self.to_prefill.send(("WATERMARK",))
        self.to_prefill.send(("TINFO", r))
        self.sim.schedule(SGLANG_DISAGGREGATION_WAITING_TIMEOUT, self.waiting_timeout, r)
        self.sim.schedule(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, self.bootstrap_timeout, r)

    def waiting_timeout(self, r: int) -> None:
        if self.decode[r] == KVPoll.WaitingForInput:
            self._conclude_decode(r, KVPoll.Failed, "waiting timeout")
            self.to_prefill.send(("ABORT", r))

    def on_decode_message(self, message: tuple) -> None:
        if self.decode_thread != "alive":
            return
        if message[0] == "GARBAGE":
            frames, rooms = (), {}
        else:
            _, r, status = message
            frames, rooms = encode_status(self.backend, r, KVPoll(status)), {r: self.decode[r]}
        handled = handle_decode(frames, rooms, self.backend, self.variant)
        if not handled.alive:
            self.decode_thread = f"decode thread: {handled.reason}"
            self.rec.record(self.sim.now, "thread_died", self.decode_thread)
            return
        for r, status in handled.rooms.items():
            if status != self.decode[r]:
                if status in R.TERMINAL:
                    self._conclude_decode(r, status, "prefill status")
                else:
                    self.decode[r] = status

    def heartbeat(self) -> None:
        if self.prefill_dead_at is not None:
            self.misses += 1
            if self.misses == SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE and \
                    R.has_heartbeat_checker(self.backend, self.variant):
                self.node_failed = True
                for r, status in sorted(self.decode.items()):
                    if status not in R.TERMINAL:
                        self._conclude_decode(r, KVPoll.Failed, "peer death (heartbeat)")
        if len(self.concluded) < self.p["requests"]:
            self.sim.schedule(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, self.heartbeat)

    def _conclude_decode(self, r: int, status: KVPoll, why: str) -> None:
        self.decode[r] = status
        self.concluded[r] = (self.sim.now, f"{status.name}: {why}")
        self.rec.record(self.sim.now, "conclude", [r, status.name, why])

    # -- prefill side --------------------------------------------------------------------------
    def init_step(self, name: str) -> None:
        if self.prefill_dead_at is not None:
            return
        self.assigned.add(name)
        self.rec.record(self.sim.now, "init", name)
        if name == R.START_THREAD:
            self.thread = "alive"
            pending, self.buffered = self.buffered, []
            for message in pending:
                self.on_prefill_message(message)

    def crash(self, peer: str) -> None:
        if self.prefill_dead_at is None:
            self.prefill_dead_at = self.sim.now
            self.rec.record(self.sim.now, "crash", peer)

    def on_prefill_message(self, message: tuple) -> None:
        if self.prefill_dead_at is not None or self.thread not in ("alive", "unstarted"):
            return  # a dead process or a dead thread reads nothing
        if self.thread == "unstarted":
            self.buffered.append(message)
            return
        missing = [f for f in R.fields_read(self.backend, message[0]) if f not in self.assigned]
        if missing:
            return self._thread_dies(f"AttributeError: {missing[0]} ({message[0]})")
        if message[0] == "GARBAGE":
            handled = handle_bootstrap((b"\xff",), {}, self.backend, self.variant)
            if not handled.alive:
                self._thread_dies(f"malformed frame: {handled.reason}")
            return
        if message[0] == "TINFO":
            r = message[1]
            self.prefill[r] = R.on_transfer_info(self.prefill[r], self.backend)
            if self.prefill[r].status == KVPoll.WaitingForInput:
                for c in range(self.p["chunks"]):
                    self.sim.schedule((c + 1) * self.p["chunk_time"], self.enqueue, r, c)
        elif message[0] == "ABORT":
            r = message[1]
            room = self.prefill[r]
            present = {r: room.status} if room.status is not None else {}
            after = handle_bootstrap(encode_abort(r), present, self.backend, self.variant).rooms.get(r)
            self.prefill[r] = room._replace(status=after)
            self._maybe_clear(r)

    def _thread_dies(self, why: str) -> None:
        self.thread = why
        self.rec.record(self.sim.now, "thread_died", why)

    def enqueue(self, r: int, chunk: int) -> None:
        if self.prefill_dead_at is None and self.prefill[r].status in (KVPoll.WaitingForInput, KVPoll.Transferring):
            self.queue.append((r, chunk))
            self._kick()

    def _kick(self) -> None:
        if not self.worker_busy and self.queue:
            self.worker_busy = True
            self.sim.schedule(self.p["transfer_time"], self.work)

    def work(self) -> None:
        self.worker_busy = False
        if self.prefill_dead_at is not None:
            return
        r, chunk = self.queue.pop(0)
        before = self.prefill[r]
        room, outcome = R.worker_step(before, chunk == self.p["chunks"] - 1, self.backend, self.variant)
        self.prefill[r] = room
        if before.succeeded and room.status == KVPoll.Failed:
            self.flips.append(r)
        if outcome == "completed":
            self.to_decode.send(("STATUS", r, int(KVPoll.Success)))
        self._maybe_clear(r)
        self._kick()

    def bootstrap_timeout(self, r: int) -> None:
        if self.prefill_dead_at is None and self.prefill[r].status == KVPoll.Bootstrapping:
            self.prefill[r] = R.bootstrap_timeout(self.prefill[r], self.backend)
            self.to_decode.send(("STATUS", r, int(KVPoll.Failed)))
            self._maybe_clear(r)

    def _maybe_clear(self, r: int) -> None:
        if self.prefill[r].status in R.TERMINAL:
            self.prefill[r] = R.clear(self.prefill[r])

    # -- the report ----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        outcomes: dict[str, int] = {}
        waits = []
        late = []
        hb_bound = SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE * SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL
        for r in sorted(self.started):
            at, outcome = self.concluded.get(r, (None, "never concluded"))
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if at is None:
                late.append(r)
                continue
            waits.append(at - self.started[r])
            bound = self.started[r] + max(SGLANG_DISAGGREGATION_WAITING_TIMEOUT, SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)
            if self.prefill_dead_at is not None and self.prefill_dead_at < at:
                bound = min(bound, max(self.prefill_dead_at, self.started[r]) + hb_bound
                            + SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL)
            if at > bound + SLACK:
                late.append(r)
        violations = []
        if late:
            violations.append(f"P8: {len(late)} rooms concluded after their bound or never (first: room {late[0]})")
        if self.flips:
            violations.append(f"P1: {len(self.flips)} concluded Success rooms turned Failed (first: room {self.flips[0]})")
        if self.thread not in ("alive", "unstarted"):
            violations.append(f"P3/P7: bootstrap thread died ({self.thread})")
        if self.decode_thread != "alive":
            violations.append(f"P3: {self.decode_thread} died")
        slowest = sorted(((at - self.started[r], r, outcome) for r, (at, outcome) in self.concluded.items()),
                         key=lambda x: (-x[0], x[1]))[:5]
        waits.sort()
        return {
            "violations": violations,
            "backend": self.backend,
            "rooms": len(self.started),
            "outcomes": dict(sorted(outcomes.items())),
            "median_time_to_conclude": waits[len(waits) // 2] if waits else None,
            "worst_time_to_conclude": waits[-1] if waits else None,
            "p8_heartbeat_bound": hb_bound + SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL,
            "p8_timeout_bound": SGLANG_DISAGGREGATION_WAITING_TIMEOUT,
            "rooms_past_bound": len(late),
            "slowest_rooms": [{"room": r, "outcome": o, "seconds": round(w, 6)} for w, r, o in slowest],
            "bootstrap_thread": self.thread,
            "decode_thread": self.decode_thread,
            "prefill_died_at": self.prefill_dead_at,
        }
