"""Timed simulation of the PD control protocol (`kvsim simulate pd-protocol`): a timing policy over `PdProtocol`.

Many rooms between one prefill rank and one decode rank, on the seeded
discrete-event simulator, with the upstream timers (bootstrap and waiting
timeouts 300 s, heartbeat every 5 s, 2 misses) and a fault plan: dropped,
delayed, duplicated, reordered and garbled control messages (a garbled
message reaches its thread as a malformed frame) and prefill deaths
(`crash=prefill@T`).

The simulation holds no protocol state of its own: the one model state is
the `Driver`'s, every change is an action of the same `PdProtocol` that
`explore` searches (with as many rooms as requests and no fault budget), and
the simulation decides only which enabled action happens when: room arrivals
(`decode_init`), the manager's start-up steps, chunk compute and the worker's
transfer time, the timeouts, heartbeats, and what the fault plan does to each
message the system sends (drop, garble, duplicate are fault actions; delay
and reorder only move the delivery time). It learns what happened from each
step's effects: messages to put on a channel, work queued, rooms concluded,
threads died. The trace records every action taken, so it replays through
`run_actions` to the driver's final state.

The summary gives each room's outcome and time to conclude and checks the
bound of P8: a room concludes within its timeout, and within the heartbeat
detection time after the death of its prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import Any

from kvsim.engine.errors import ConfigError
from kvsim.engine.params import param
from kvsim.engine.sim import Channel, Driver, FaultPlan, Simulator
from kvsim.engine.trace import TraceRecorder

from ..pd_common.status import (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL,
                                SGLANG_DISAGGREGATION_WAITING_TIMEOUT)
from .actions import (DECODE, PREFILL, BootstrapTimeout, Clear, Concluded, CrashPrefill, DecodeAbort, DecodeInit,
                      DeliverDecode, DeliverPrefill, Drop, Duplicate, Enqueue, GarbageFrame, HeartbeatMiss, Init,
                      InjectGarbage, PrefillConcluded, PrefillDied, Queued, Sent, SuccessFailed, ThreadDied,
                      ThreadStarted, Work, Worked)
from .config import UNBOUNDED, ProtocolConfig
from .system import ALIVE, UNSTARTED, PdProtocol
from .variants import ProtocolVariant
from .wire import BACKENDS

PEERS = (PREFILL,)  # what `crash=PEER@T` may name
SLACK = 1.0  # seconds of tolerance on the P8 bound (message latency, heartbeat phase)
WORK, HEARTBEAT_MISS = Work(), HeartbeatMiss()  # the actions without fields, built once
# a channel fault that is an action of the model, by the fault's kind (a garbled message is `garble`'s; a delay or
# a reorder only moves the delivery time)
FAULT_ACTIONS = {"drop": Drop, "duplicate": Duplicate}


@dataclass(frozen=True)
class SimConfig:
    """`kvsim simulate pd-protocol --param`: the backend and the workload."""

    backend: str = param("mooncake", "PD transfer backend", choices=BACKENDS)
    requests: int = param(200, "rooms in the workload", minimum=1, maximum=50_000)
    arrival_rate: float = param(4.0, "mean room arrivals per second (Poisson)", minimum=0.01, maximum=1e6)
    chunks: int = param(4, "KV chunks per room", minimum=1, maximum=1024)
    chunk_time: float = param(0.02, "seconds of prefill compute per chunk", minimum=0.0, maximum=3600.0)
    transfer_time: float = param(0.005, "seconds of worker transfer per chunk", minimum=0.0, maximum=3600.0)
    init_step_time: float = param(0.01, "seconds between the prefill manager's start-up steps", minimum=0.0,
                                  maximum=3600.0)
    staging: bool = param(False, "1: the decode sends a staging WATERMARK after registering")


def simulate(sim: Simulator, recorder: TraceRecorder, variant: ProtocolVariant, params: SimConfig,
             faults: FaultPlan) -> tuple[dict[str, Any], Driver]:
    for peer, _ in faults.crashes:
        if peer not in PEERS:
            raise ConfigError("faults crash", f"a peer this model has ({', '.join(PEERS)})", peer)
    run = _Run(sim, recorder, system_for(variant, params), params, faults)
    sim.poisson_arrivals(params.requests, params.arrival_rate, run.arrive)
    for step, name in enumerate(run.system.init):
        sim.schedule((step + 1) * params.init_step_time, run.act, Init(name))
    for _, at in faults.crashes:
        sim.schedule(at, run.act, CrashPrefill())
    sim.schedule(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, run.heartbeat)
    sim.run()
    return run.summary(), run.driver


def system_for(variant: ProtocolVariant, params: SimConfig) -> PdProtocol:
    """The transition system a simulation drives: one room per request, no fault budget (the plan decides)."""
    config = ProtocolConfig(params.backend, rooms=params.requests, chunks=params.chunks, faults=UNBOUNDED,
                            staging=params.staging)
    return PdProtocol(config, variant)


class _Run:
    def __init__(self, sim: Simulator, recorder: TraceRecorder, system: PdProtocol, params: SimConfig,
                 faults: FaultPlan) -> None:
        self.sim, self.rec, self.system, self.p = sim, recorder, system, params
        self.driver = Driver(system)
        self.allows = system.allows
        self.thread_started = False
        self.buffered: list[tuple] = []  # ZMQ queues what arrives before the bootstrap thread runs
        self.computing: set[int] = set()  # rooms whose chunks the prefill is computing
        self.worker_busy = False
        self.started: dict[int, float] = {}
        self.concluded: dict[int, tuple[float, str]] = {}
        self.flips: list[int] = []
        self.prefill_dead_at: float | None = None
        self.to_prefill = self._channel(PREFILL, self.deliver_prefill, faults)
        self.to_decode = self._channel(DECODE, self.deliver_decode, faults)
        self.on_effect = {Sent: self._sent, Queued: self._queued, Concluded: self._concluded,  # by record type
                          PrefillConcluded: self._prefill_concluded, SuccessFailed: self._success_failed,
                          ThreadStarted: self._thread_started, ThreadDied: self._thread_died,
                          PrefillDied: self._prefill_died, Worked: None}

    def _channel(self, side: str, deliver: Any, faults: FaultPlan) -> Channel:
        def garble(message: tuple, rng: Random) -> tuple:
            # the bytes no longer parse: the message is gone and a garbage frame travels in its place
            self.act(Drop(side, message))
            self.act(InjectGarbage(side))
            return GarbageFrame()

        def on_fault(kind: str, message: tuple) -> None:
            fault = FAULT_ACTIONS.get(kind)
            if fault is not None:
                self.act(fault(side, message))
            elif kind != "garble":  # delay, reorder: timing only
                self.rec.record(self.sim.now, f"fault_{kind}", message)

        return Channel(self.sim, faults, deliver, garble=garble, on_fault=on_fault)

    @property
    def state(self) -> Any:
        return self.driver.state

    # -- the one way the model changes ------------------------------------------------------------
    def act(self, action: tuple) -> bool:
        """Take `action` if the system allows it now; react to its effects. False: it was not enabled."""
        if not self.allows(self.driver.state, action):
            return False
        effects = self.driver.apply(action)
        self.rec.record(self.sim.now, "action", action)  # a tagged record: its JSON form is the tuple's, tag first
        clears = []
        for effect in effects:
            handler = self.on_effect[type(effect)]
            if handler is not None:
                handler(effect, clears)
        for room in clears:  # the scheduler's poll sees the terminal status and clears the room
            self.act(Clear(room))
        return True

    # -- effects ------------------------------------------------------------------------------------
    def _sent(self, effect: tuple, clears: list) -> None:
        (self.to_prefill if effect.to == PREFILL else self.to_decode).send(effect.message)

    def _queued(self, effect: tuple, clears: list) -> None:
        self._kick()

    def _concluded(self, effect: tuple, clears: list) -> None:
        r = effect.room
        if r in self.started and r not in self.concluded:  # a room that has not arrived concludes on arrival
            self.concluded[r] = (self.sim.now, f"{effect.status.name}: {effect.why}")
            self.rec.record(self.sim.now, "conclude", [r, effect.status.name, effect.why])

    def _prefill_concluded(self, effect: tuple, clears: list) -> None:
        clears.append(effect.room)

    def _success_failed(self, effect: tuple, clears: list) -> None:
        self.flips.append(effect.room)

    def _thread_started(self, effect: tuple, clears: list) -> None:
        self.thread_started = True
        pending, self.buffered = self.buffered, []
        for message in pending:
            self.act(DeliverPrefill(message))

    def _thread_died(self, effect: tuple, clears: list) -> None:
        self.rec.record(self.sim.now, "thread_died", [effect.thread, effect.reason])

    def _prefill_died(self, effect: tuple, clears: list) -> None:
        self.prefill_dead_at = self.sim.now
        self.rec.record(self.sim.now, "crash", PREFILL)

    # -- timing -------------------------------------------------------------------------------------
    def arrive(self, r: int) -> None:
        self.started[r] = self.sim.now
        if not self.act(DecodeInit(r)):  # the heartbeat checker already failed every room of the dead prefill
            status = self.state.decode[r]
            self.concluded[r] = (self.sim.now, f"{status.name}: bootstrap to a failed prefill")
            self.rec.record(self.sim.now, "conclude", [r, status.name, "bootstrap to a failed prefill"])
            return
        self.sim.schedule(SGLANG_DISAGGREGATION_WAITING_TIMEOUT, self.act, DecodeAbort(r))
        self.sim.schedule(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, self.act, BootstrapTimeout(r))

    def deliver_prefill(self, message: tuple) -> None:
        if not self.thread_started and self.prefill_dead_at is None:
            self.buffered.append(message)
            return
        if self.act(DeliverPrefill(message)) and message[0] == "TINFO":
            r = message[1]
            enqueue = Enqueue(r)  # one record for the room's every chunk
            if r not in self.computing and self.allows(self.state, enqueue):
                self.computing.add(r)
                for c in range(self.p.chunks):
                    self.sim.schedule((c + 1) * self.p.chunk_time, self.act, enqueue)

    def deliver_decode(self, message: tuple) -> None:
        self.act(DeliverDecode(message))

    def _kick(self) -> None:
        if not self.worker_busy and self.state.queue:
            self.worker_busy = True
            self.sim.schedule(self.p.transfer_time, self.work)

    def work(self) -> None:
        self.worker_busy = False
        if self.act(WORK):
            self._kick()

    def heartbeat(self) -> None:
        self.act(HEARTBEAT_MISS)  # enabled only while the prefill is dead and not yet declared failed
        if len(self.concluded) < self.p.requests:
            self.sim.schedule(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, self.heartbeat)

    # -- the report ---------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        state, config = self.state, self.system.config
        outcomes: dict[str, int] = {}
        waits = []
        late = []
        hb_bound = config.max_failures * SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL
        for r in sorted(self.started):
            at, outcome = self.concluded.get(r, (None, "never concluded"))
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if at is None:
                if self.sim.stopped_by is None:  # a budget cut the run short: not concluding yet is no violation
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
        if state.thread not in (ALIVE, UNSTARTED):
            violations.append(f"P3/P7: bootstrap thread died ({state.thread})")
        if state.decode_thread != ALIVE:
            violations.append(f"P3: decode thread died ({state.decode_thread})")
        slowest = sorted(((at - self.started[r], r, outcome) for r, (at, outcome) in self.concluded.items()),
                         key=lambda x: (-x[0], x[1]))[:5]
        waits.sort()
        return {
            "violations": violations,
            "backend": config.backend,
            "rooms": len(self.started),
            "outcomes": dict(sorted(outcomes.items())),
            "median_time_to_conclude": waits[len(waits) // 2] if waits else None,
            "worst_time_to_conclude": waits[-1] if waits else None,
            "p8_heartbeat_bound": hb_bound + SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL,
            "p8_timeout_bound": SGLANG_DISAGGREGATION_WAITING_TIMEOUT,
            "rooms_past_bound": len(late),
            "slowest_rooms": [{"room": r, "outcome": o, "seconds": round(w, 6)} for w, r, o in slowest],
            "bootstrap_thread": state.thread,
            "decode_thread": state.decode_thread,
            "prefill_died_at": self.prefill_dead_at,
        }
