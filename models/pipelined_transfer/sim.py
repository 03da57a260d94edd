"""The timed simulation of pipelined KV transfer (research note section 1.10): a timing policy over the system.

Requests arrive (Poisson) already promoted (gen-first). One context GPU runs
their prefill chunks one forward step at a time, requests in arrival order;
chunk i costs `tokens_i * compute_us_per_token * (1 + context_slowdown * mid_position_i / 1000)`
times a per-request jitter, so later chunks cost more. `h` after a chunk's
forward step, its `compute` action is applied through the `Driver`; every
write the system dispatches (its `Dispatched` effects) joins the FIFO NIC of
its sender rank, shared by all requests, and takes `L + bytes / B` (whole
blocks, `bytes_per_token / ranks` per rank); when it finishes the simulation
applies `write_done`; each result frame reaches the receiver `r` later
(`deliver`, or a `drop_frame` / `dup_frame` the fault plan draws). The
context poll runs whenever it would change something. `crash=receiver@T`
makes the receiver silent for every request still open; the transfer timeout
and the stall report at twice it are actions at their times.

The same workload (same seed) runs twice: pipelined, and the non-pipelined
baseline (one chunk covering the prompt, computed in the same total time).
Per request: the exposed transfer time `F_N - (C_N + h)`, the time
generation was unblocked `U`, and, where its link was free, the max-plus
closed form and the bounds as checks (`violations`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

from kvsim.engine.params import param
from kvsim.engine.sim import Driver, FaultPlan, Simulator
from kvsim.engine.system import first_violation
from kvsim.engine.trace import TraceRecorder

from .chunks import BOUNDARIES, cdiv, prefill_chunks
from .config import PipelinedConfig
from .state import (Compute, CtxConcluded, Deliver, Dispatched, DropFrame, DupFrame, FrameSent, Poll, RxConcluded,
                    Silent, Stalled, StallReport, Timeout, WriteDone)
from .status import LlmRequestState
from .system import PipelinedTransfer
from .timing import exposed_closed_form
from .variants import PipelinedVariant

FAULT_KINDS = ("drop", "duplicate", "crash")
PEERS = ("receiver",)
US = 1e-6
TOLERANCE = 1e-9  # seconds: the closed form is exact; this only absorbs float rounding


@dataclass(frozen=True)
class SimConfig:
    requests: int = param(8, "requests", minimum=1, maximum=5000)
    arrival_rate: float = param(5.0, "mean arrivals per second (Poisson)", minimum=0.01, maximum=1e6)
    prompt_len: int = param(8192, "prompt tokens", minimum=1, maximum=1 << 17)
    chunk_tokens: int = param(2048, "prefill chunk size in tokens", minimum=1, maximum=1 << 17)
    tokens_per_block: int = param(64, "tokens per KV block", minimum=1, maximum=1024)
    prefix_hit: int = param(0, "context-side reuse hit in tokens (travels with slice 0)", minimum=0,
                            maximum=(1 << 17) - 1)
    rx_cached_blocks: int = param(0, "receiver-cached prefix blocks (not sent)", minimum=0, maximum=1 << 12)
    boundary: str = param("A", "chunk-boundary revision", choices=BOUNDARIES)
    swa_window: int = param(0, "a sliding-window layer group's window in tokens (0: none); shorter than the "
                               "prompt, its window travels with the final slice", minimum=0, maximum=1 << 17)
    swa_fraction: float = param(0.5, "share of the KV bytes per token in the window group", minimum=0.0, maximum=1.0)
    ranks: int = param(1, "sender TP writer ranks, one NIC each (TP fan-in)", minimum=1, maximum=8)
    bytes_per_token: int = param(35136, "KV bytes per token over all ranks (DeepSeek-V3 MLA FP8: 61 x 576)",
                                 minimum=1, maximum=1 << 24)
    bandwidth_gbs: float = param(50.0, "link bandwidth per sender rank, GB/s", minimum=1e-3, maximum=1e4)
    latency_us: float = param(10.0, "per-transfer latency L, microseconds", minimum=0.0, maximum=1e6)
    handoff_us: float = param(50.0, "host hand-off h (forward step end to submit), microseconds", minimum=0.0,
                              maximum=1e6)
    aux_us: float = param(20.0, "aux transfer time t_a, microseconds", minimum=0.0, maximum=1e6)
    notify_us: float = param(10.0, "result notification latency r, microseconds", minimum=0.0, maximum=1e6)
    compute_us_per_token: float = param(0.5, "prefill cost per token at context 0, microseconds", minimum=1e-6,
                                        maximum=1e6)
    context_slowdown: float = param(0.25, "extra cost per token per 1K tokens of context (x)", minimum=0.0,
                                    maximum=1e3)
    jitter: float = param(0.1, "per-request compute jitter (uniform +-)", minimum=0.0, maximum=0.9)
    timeout_s: float = param(600.0, "kv_transfer_timeout_ms, seconds", minimum=1e-3, maximum=1e6)


def model_config(params: SimConfig, faults: FaultPlan, one_chunk: bool = False) -> PipelinedConfig:
    return PipelinedConfig(
        requests=params.requests, ranks=params.ranks, prompt_len=params.prompt_len,
        tokens_per_block=params.tokens_per_block,
        chunk_tokens=params.prompt_len if one_chunk else params.chunk_tokens, prefix_hit=params.prefix_hit,
        rx_cached_blocks=params.rx_cached_blocks, swa_window=params.swa_window, boundary=params.boundary,
        fifo=True, timeouts=True,
        faults="drop,dup,silent", fault_budget=1 << 30, max_chunks=1 << 17)


def chunk_costs(params: SimConfig) -> list[float]:
    """Seconds of each prefill chunk's forward step for a request whose jitter factor is 1 (`Scaled`)."""
    out = []
    for start, end in prefill_chunks(params.prompt_len, params.prefix_hit, params.chunk_tokens):
        mid = (start + end) / 2
        out.append((end - start) * params.compute_us_per_token * US * (1 + params.context_slowdown * mid / 1000))
    return out


class Scaled(Sequence[float]):
    """One request's chunk costs: the workload's (`chunk_costs`) times its jitter factor, each taken when read
    (the same float a cost computed with the factor last gives). Held per request, 5,000 requests of 131,072
    one-token chunks were 655 M floats, about 20 GB, before the first event."""

    def __init__(self, costs: list[float], scale: float) -> None:
        self.costs, self.scale = costs, scale

    def __len__(self) -> int:
        return len(self.costs)

    def __getitem__(self, i: int) -> float:  # type: ignore[override]  (an index only: no run reads a slice)
        return self.costs[i] * self.scale

    def __iter__(self) -> Iterator[float]:
        scale = self.scale
        return (cost * scale for cost in self.costs)


class Total(Sequence[float]):
    """A request's costs as the baseline's one chunk: their sum, taken the first time the baseline reads it (a
    run a budget ends reads a few: 5,000 requests of 131,072 chunks were 655 M additions before its first
    event)."""

    def __init__(self, costs: Sequence[float]) -> None:
        self.costs = costs
        self.total: float | None = None

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> float:  # type: ignore[override]  (an index only: no run reads a slice)
        if i not in (0, -1):
            raise IndexError(i)
        if self.total is None:
            self.total = sum(self.costs)
        return self.total


def simulate(sim: Simulator, recorder: TraceRecorder, variant: PipelinedVariant, params: SimConfig,
             faults: FaultPlan) -> tuple[dict[str, Any], Driver]:
    rng = sim.rng
    arrivals, t = [], 0.0
    for _ in range(params.requests):
        t += rng.expovariate(params.arrival_rate)
        arrivals.append(t)
    scales = [1 + rng.uniform(-params.jitter, params.jitter) for _ in range(params.requests)]
    costs = chunk_costs(params)
    workload = (arrivals, [Scaled(costs, s) for s in scales])
    base_sim = Simulator(sim.seed + 1, max_events=sim.max_events)  # the baseline's own clock and fault draws
    base = _Run(base_sim, None, PipelinedTransfer(variant, model_config(params, faults, True)), params, faults,
                (arrivals, [Total(c) for c in workload[1]]))
    base.start()
    base_sim.run()
    run = _Run(sim, recorder, PipelinedTransfer(variant, model_config(params, faults)), params, faults, workload)
    run.start()
    sim.run()
    return run.summary(base), run.driver


class _Run:
    def __init__(self, sim: Simulator, recorder: TraceRecorder | None, system: PipelinedTransfer,
                 params: SimConfig, faults: FaultPlan, workload: tuple[list[float], Sequence[Sequence[float]]]) -> None:
        self.sim, self.recorder, self.system, self.p, self.faults = sim, recorder, system, params, faults
        self.driver = Driver(system)
        self.arrivals, self.costs = workload
        n = params.requests
        self.gpu_queue: list[int] = []
        self.gpu_busy = False
        self.nic_free = [0.0] * params.ranks
        self.nic_owners: list[list[int]] = [[] for _ in range(params.ranks)]  # requests with a write on the NIC
        self.shared = [False] * n  # its link was not free: the closed form does not apply
        self.compute_ends: list[list[float]] = [[] for _ in range(n)]
        self.emitted: list[list[int]] = [[] for _ in range(n)]  # indices (into compute_ends) of emitting chunks
        self.durations: list[dict[int, float]] = [{} for _ in range(n)]  # chunk index -> t_j (rank 0)
        self.submitting = [0] * n  # the chunk whose compute action is being applied
        self.final_submit: list[float | None] = [None] * n
        self.final_done: list[float | None] = [None] * n
        self.unblocked: list[float | None] = [None] * n
        self.ctx_done: list[float | None] = [None] * n
        self.stalled: list[float | None] = [None] * n
        self.timers: dict[int, list] = {}  # rid -> its pending timeout event
        self.bytes_per_block = params.tokens_per_block * params.bytes_per_token / params.ranks
        self.bandwidth = params.bandwidth_gbs * 1e9

    # -- events ---------------------------------------------------------------------------------
    def start(self) -> None:
        for r, at in enumerate(self.arrivals):
            self.sim.schedule(at, self.arrive, r)
        for peer, at in self.faults.crashes:
            if peer == "receiver":
                self.sim.schedule(at, self.crash)

    def arrive(self, r: int) -> None:
        self.record("arrival", {"rid": r})
        self.gpu_queue.append(r)
        self.next_step()

    def next_step(self) -> None:
        if self.gpu_busy or not self.gpu_queue:
            return
        r = self.gpu_queue[0]
        i = len(self.compute_ends[r])
        self.gpu_busy = True
        self.sim.schedule(self.costs[r][i], self.step_done, r)

    def step_done(self, r: int) -> None:
        self.gpu_busy = False
        self.compute_ends[r].append(self.sim.now)
        if len(self.compute_ends[r]) == len(self.costs[r]):
            self.gpu_queue.pop(0)
        self.sim.schedule(self.p.handoff_us * US, self.submit, r)
        self.next_step()

    def submit(self, r: int) -> None:
        q = self.driver.state.reqs[r]
        if not self.system.computing(q):
            return
        armed = q.clock
        self.submitting[r] = q.computed
        self.apply(Compute(r))
        if q.computed == len(self.costs[r]) - 1:
            self.final_submit[r] = self.sim.now
        if not armed and self.driver.state.reqs[r].clock:
            self.timers[r] = self.sim.schedule(self.p.timeout_s, self.timeout, r)

    def nic(self, r: int, k: int, write: tuple) -> None:
        t = self.p.aux_us * US if write.is_aux else (self.p.latency_us * US + self.write_bytes(write) / self.bandwidth)
        if any(o != r for o in self.nic_owners[k]):
            self.shared[r] = True
            for o in self.nic_owners[k]:
                self.shared[o] = True
        self.nic_owners[k].append(r)
        begin = max(self.sim.now, self.nic_free[k])
        self.nic_free[k] = begin + t
        if k == 0 and not write.is_aux:
            self.durations[r][self.submitting[r]] = t
        self.sim.schedule(self.nic_free[k] - self.sim.now, self.write_finished, r, k, write)

    def write_bytes(self, write: tuple) -> float:
        """Whole blocks; with a window group each group carries its share of the bytes per token."""
        n = self.system.cfg.blocks
        swa = sum(1 for u, _ in write.cells if u >= n)
        if not self.p.swa_window:
            return len(write.cells) * self.bytes_per_block
        f = self.p.swa_fraction
        return ((len(write.cells) - swa) * (1 - f) + swa * f) * self.bytes_per_block

    def write_finished(self, r: int, k: int, write: tuple) -> None:
        self.nic_owners[k].remove(r)
        if self.driver.state.reqs[r].silent:
            return  # the peer never acknowledges: the write stays unsettled
        flight = self.driver.state.flight[r][k]
        assert flight and flight[0] == write, "the NIC is FIFO, so a request's writes settle in order"
        if write.is_last:
            done = self.final_done[r]
            self.final_done[r] = self.sim.now if done is None else max(done, self.sim.now)
        self.apply(WriteDone(r, k, 0))

    def frame_arrives(self, r: int, k: int) -> None:
        if self.driver.state.reqs[r].silent or not self.driver.state.frames[r][k]:
            return
        rng = self.sim.rng
        if self.faults.drop and rng.random() < self.faults.drop:
            self.apply(DropFrame(r, k))
            return
        if self.faults.duplicate and rng.random() < self.faults.duplicate:
            self.apply(DupFrame(r, k))
            self.sim.schedule(0.0, self.frame_arrives, r, k)
        self.apply(Deliver(r, k))

    def crash(self) -> None:
        for r in range(self.p.requests):
            if not (self.system.ctx_done(self.driver.state, r) and self.system.rx_done(self.driver.state, r)):
                self.apply(Silent(r))

    def timeout(self, r: int) -> None:
        if Timeout(r) in self.system.enabled(self.driver.state):
            self.apply(Timeout(r))
            self.sim.schedule(self.p.timeout_s, self.stall, r)

    def stall(self, r: int) -> None:
        if StallReport(r) in self.system.enabled(self.driver.state):
            self.apply(StallReport(r))

    # -- the driver -------------------------------------------------------------------------------
    def apply(self, action: tuple) -> None:
        r = action[1] if len(action) > 1 else None
        for effect in self.driver.apply(action):
            follow = _FOLLOW.get(type(effect))
            if follow is not None:
                follow(self, effect)
        if r is not None:
            s = self.driver.state
            q = s.reqs[r]
            self.record(action[0], {"action": list(action), "ctx": int(q.ctx), "computed": q.computed,
                                    "freed": q.freed, "rx": int(s.rx[r].state),
                                    "in_flight": sum(len(f) for f in s.flight[r])})
        if r is not None and self.system.poll_enabled(self.driver.state, r):
            self.apply(Poll(r))

    # -- what an effect sets in motion (`_FOLLOW`, by record type) ---------------------------------------
    def _on_dispatched(self, e: Dispatched) -> None:
        self.nic(e.rid, e.rank, e.write)

    def _on_frame_sent(self, e: FrameSent) -> None:
        self.sim.schedule(self.p.notify_us * US, self.frame_arrives, e.rid, e.rank)

    def _on_rx_concluded(self, e: RxConcluded) -> None:
        if e.state == LlmRequestState.DISAGG_GENERATION_TRANS_COMPLETE:
            self.unblocked[e.rid] = self.sim.now

    def _on_ctx_concluded(self, e: CtxConcluded) -> None:
        self.ctx_done[e.rid] = self.sim.now
        timer = self.timers.pop(e.rid, None)
        if timer is not None:
            self.sim.cancel(timer)

    def _on_stalled(self, e: Stalled) -> None:
        self.stalled[e.rid] = self.sim.now

    def record(self, event: str, data: dict[str, Any]) -> None:
        if self.recorder is not None:
            self.recorder.record(self.sim.now, event, data)

    # -- the report -------------------------------------------------------------------------------
    def exposed(self, r: int) -> float | None:
        if self.final_done[r] is None or self.final_submit[r] is None:
            return None
        return self.final_done[r] - self.final_submit[r]

    def summary(self, base: "_Run") -> dict[str, Any]:
        p, state = self.p, self.driver.state
        violations = []
        bad = first_violation(self.system, state)
        if bad:
            violations.append(f"{bad[0]}: {bad[1]}")
        worst, checked = 0.0, 0
        per_request = []
        for r in range(p.requests):
            exp, exp_base = self.exposed(r), base.exposed(r)
            emitted = sorted(self.durations[r])
            row = {"rid": r, "arrival": self.arrivals[r], "chunks": len(self.costs[r]), "slices": len(emitted),
                   "exposed": exp, "baseline_exposed": exp_base, "unblocked": self.unblocked[r],
                   "baseline_unblocked": base.unblocked[r], "stalled": self.stalled[r] is not None,
                   "free_link": not self.shared[r] and not base.shared[r]}
            per_request.append(row)
            if exp is None or self.shared[r] or base.shared[r]:
                continue
            ends = [self.compute_ends[r][j] for j in emitted]
            ts = [self.durations[r][j] for j in emitted]
            closed = exposed_closed_form(ends, ts)
            checked += 1
            worst = max(worst, abs(closed - exp))
            row["closed_form"] = closed
            if abs(closed - exp) > TOLERANCE:
                violations.append(f"request {r}: exposed {exp!r} s, expected the closed form {closed!r} s")
            if not ts[-1] - TOLERANCE <= exp <= sum(ts) + TOLERANCE:
                violations.append(f"request {r}: exposed {exp!r} s, expected within [t_N, sum t_j] = "
                                  f"[{ts[-1]!r}, {sum(ts)!r}]")
            if self.unblocked[r] is not None and base.unblocked[r] is not None:
                extra = (sum(ts) - len(ts) * p.latency_us * US) - (base.durations[r][0] - p.latency_us * US)
                bound = (len(ts) - 1) * p.latency_us * US + extra
                if self.unblocked[r] - base.unblocked[r] > bound + TOLERANCE:
                    violations.append(f"request {r}: pipelined - baseline {self.unblocked[r] - base.unblocked[r]!r}"
                                      f" s, expected <= (N-1) L + re-sent bytes / B = {bound!r} s")
        done = [row for row in per_request if row["unblocked"] is not None]
        def mean(key: str) -> float | None:
            vals = [row[key] - row["arrival"] if key.endswith("unblocked") else row[key] for row in done
                    if row[key] is not None]
            return sum(vals) / len(vals) if vals else None
        return {
            "violations": violations,
            "requests": p.requests,
            "completed": len(done),
            "stalled": sum(1 for row in per_request if row["stalled"]),
            "waiting_receivers": sum(1 for rx in state.rx
                                     if rx.state == LlmRequestState.DISAGG_GENERATION_TRANS_IN_PROGRESS),
            "mean_exposed_s": mean("exposed"),
            "mean_baseline_exposed_s": mean("baseline_exposed"),
            "mean_unblocked_latency_s": mean("unblocked"),
            "mean_baseline_unblocked_latency_s": mean("baseline_unblocked"),
            "closed_form_checked": checked,
            "closed_form_worst_error_s": worst,
            "blocks": cdiv(p.prompt_len, p.tokens_per_block),
            "per_request": per_request,
        }


def single_request(params: SimConfig) -> SimConfig:
    """The same workload with one request: its link is free, so the closed form applies."""
    return replace(params, requests=1)


_FOLLOW = {Dispatched: _Run._on_dispatched, FrameSent: _Run._on_frame_sent, RxConcluded: _Run._on_rx_concluded,
           CtxConcluded: _Run._on_ctx_concluded, Stalled: _Run._on_stalled}
