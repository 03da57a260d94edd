"""A small decode scheduler over a two-pool (full + SWA) paged allocator.

The transition system behind `kvsim explore swa-budget`: requests arrive and
are prefilled, decode one token per step, are retracted under memory pressure
(their KV goes to the CPU and they join the FIFO retracted queue), come back
through `resume_retracted_reqs` (the behaviour under test, variant-dependent),
and finish. Page accounting is physical: each running request holds
`ceil(F / P)` full pages and `ceil(tail(F) / P)` SWA pages. At page size 1 an
arriving or resumed request is pre-allocated its whole length in the SWA pool
too (upstream has no tail path there); its next decode step evicts the SWA
tokens outside the window (upstream's `maybe_evict_swa`, simplified to every step).

A failed `_pre_alloc` (the upstream assertion) and a resume result that breaks
its own contract are flagged in the state (the engine's `flag`: its `flags`), so
the invariants see them as data and the explorer reports the shortest path to
them; a flagged state has no successor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvsim.engine.errors import ConfigError, check_int
from kvsim.engine.actions import tagged, type_table
from kvsim.engine.params import param
from kvsim.engine.system import Invariant, Sometimes, flag, flagged

from .resume import FIXED, RetractedReq, SwaVariant, held_pages, physical_pages, resume_retracted_reqs

ARRIVE, DECODE, RETRACT, RESUME = "arrive", "decode", "retract", "resume"
Arrive = tagged(ARRIVE)
Decode = tagged(DECODE)
Retract = tagged(RETRACT, "rid")
Resume = tagged(RESUME)
ACTIONS = type_table((Arrive, Decode, Retract, Resume))

# What a step did, for a timing policy (`transition`): requests that finished, requests resumed.
Finished = tagged("finished", "rid")
Resumed = tagged("resumed", "count")


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's configuration; its fields are `kvsim explore swa-budget --param` (one place each)."""

    page_size: int = param(2, "tokens per page (both pools)", minimum=1, maximum=1024)
    sliding_window: int = param(4, "SWA window in tokens", minimum=1, maximum=1 << 16)
    full_pages: int = param(4, "pages in the full-attention pool", minimum=1, maximum=64)
    swa_pages: int = param(3, "pages in the SWA pool", minimum=1, maximum=64)
    prompts: tuple[int, ...] = param((1, 3, 2), "prompt length of each request", minimum=1, maximum=1024)
    outputs: tuple[int, ...] = param((3, 2, 2), "output length of each request", minimum=1, maximum=1024)
    reserved_decode_tokens: int = param(0, "num_reserved_decode_tokens per request", minimum=0, maximum=1024)

    def __post_init__(self) -> None:
        check_int(self.page_size, "page_size", minimum=1)
        check_int(self.sliding_window, "sliding_window", minimum=1)
        check_int(self.full_pages, "full_pages", minimum=1)
        check_int(self.swa_pages, "swa_pages", minimum=1)
        check_int(self.reserved_decode_tokens, "reserved_decode_tokens", minimum=0)
        if not self.prompts or len(self.prompts) != len(self.outputs):
            raise ConfigError("outputs", f"one output length per prompt ({len(self.prompts)})", self.outputs)
        for rid, (prompt, output) in enumerate(zip(self.prompts, self.outputs)):
            check_int(prompt, f"prompts[{rid}]", minimum=1)
            check_int(output, f"outputs[{rid}]", minimum=1)
        # every request's peak from one table up to the longest (a simulated workload has up to 100,000 requests
        # of up to 2 x 65,536 tokens: a request's own pass over its fills would be unbounded in all)
        peaks = self.peak_table(max(p + o for p, o in zip(self.prompts, self.outputs)))
        for rid, (prompt, output) in enumerate(zip(self.prompts, self.outputs)):
            # a request that cannot run alone on an empty machine is rejected upstream
            # (_check_if_req_exceed_kv_capacity); here it is a configuration error
            need_full, need_swa = peaks[prompt + output]
            full_tokens = self.full_pages * self.page_size
            if need_full > self.full_pages or need_swa > self.swa_pages or \
                    prompt + output + self.reserved_decode_tokens > full_tokens:
                raise ConfigError(f"prompts[{rid}] + outputs[{rid}]",
                                  f"a request that fits the pools alone ({self.full_pages} full, "
                                  f"{self.swa_pages} SWA pages of {self.page_size})", prompt + output)

    def peak_pages(self, max_fill: int) -> tuple[int, int]:
        """Most pages one request ever holds: decoding up to `max_fill`, pre-allocated (arrival or resume)
        at a fill below it (the step that reaches `max_fill` finishes the request)."""
        return self.peak_table(max_fill)[max_fill]

    def peak_table(self, longest: int) -> list[tuple[int, int]]:
        """`peak_pages(f)` at index f, for every f from 1 to `longest` (index 0 unused), in one pass: the full
        pages held at f, and the most SWA pages held at any fill up to f or pre-allocated at any fill below f."""
        table, held, prealloc = [(0, 0)], 0, 0
        for f in range(1, longest + 1):
            full, swa = held_pages(f, self.page_size, self.sliding_window)
            held = max(held, swa)
            table.append((full, max(held, prealloc)))
            prealloc = max(prealloc, physical_pages(f, self.page_size, self.sliding_window)[1])
        return table


class Running(NamedTuple):
    rid: int
    fill: int
    full_pages: int
    swa_pages: int


class SchedState(NamedTuple):
    next_arrival: int
    running: tuple[Running, ...]
    retracted: tuple[RetractedReq, ...]
    finished: tuple[int, ...]
    full_free: int
    swa_free: int
    flags: tuple[tuple[str, str], ...] = ()  # (invariant, message) of a failed transition (`flag`)


class SwaScheduler:
    """The transition system; `variant` selects the resume arithmetic."""

    liveness = "every_request_finishes"

    def __init__(self, variant: SwaVariant = FIXED, config: SchedulerConfig = SchedulerConfig()) -> None:
        self.name = "swa-budget"
        self.variant = variant
        self.config = config
        self.n = len(config.prompts)
        self.invariants = (
            Invariant("no_failed_allocation", flagged("no_failed_allocation"),
                      "every _pre_alloc after admission said yes succeeds (B2)"),
            Invariant("budget_nonnegative", flagged("budget_nonnegative"),
                      "both budgets stay >= 0 after each admission (B1)"),
            Invariant("retracted_fifo", flagged("retracted_fifo"),
                      "resume takes a FIFO prefix and keeps the rest in order (B3, B6)"),
            Invariant("pool_conservation", self._conservation,
                      "free + held pages equal the pool size, in both pools"),
            Invariant("requests_accounted", self._accounted,
                      "every request is pending, running, retracted or finished, exactly once"),
        )
        # what the invariants above are about must happen: retraction under pressure, a FIFO queue, a resume
        self.sometimes = (
            Sometimes("a_request_is_retracted", lambda s: bool(s.retracted),
                      "memory pressure retracts a running request"),
            Sometimes("two_requests_wait_retracted", lambda s: len(s.retracted) >= 2,
                      "the retracted queue holds two requests (its FIFO order matters)"),
            Sometimes("a_retracted_request_resumes",
                      lambda s, a, t: a[0] == RESUME and not t.flags and len(t.retracted) < len(s.retracted),
                      "resume_retracted_reqs takes a retracted request back", step=True),
        )

    # -- the contract -------------------------------------------------------------------
    def initial_states(self) -> tuple[SchedState, ...]:
        return (SchedState(0, (), (), (), self.config.full_pages, self.config.swa_pages),)

    def done(self, state: SchedState) -> bool:
        return not state.flags and len(state.finished) == self.n

    def enabled(self, state: SchedState) -> list[tuple]:
        if state.flags:
            return []
        actions: list[tuple] = []
        if state.next_arrival < self.n and self._fits_new(state):
            actions.append(Arrive())
        if state.running:
            if self._decode_fits(state):
                actions.append(Decode())
            else:  # memory pressure: the scheduler must retract someone first
                actions.extend(Retract(r.rid) for r in state.running)
        if state.retracted:
            actions.append(Resume())
        return actions

    def step(self, state: SchedState, action: tuple) -> SchedState:
        return self.transition(state, action)[0]

    def transition(self, state: SchedState, action: tuple) -> tuple[SchedState, tuple[tuple, ...]]:
        """`step`, and what it did: the requests a decode step finished, how many requests a resume took."""
        kind = action[0]
        if kind == ARRIVE:
            return self._arrive(state), ()
        if kind == DECODE:
            return self._decode(state)
        if kind == RETRACT:
            return self._retract(state, action[1]), ()
        if kind == RESUME:
            return self._resume(state)
        raise ValueError(f"unknown action {action!r}")

    # -- transitions ----------------------------------------------------------------------
    def _pages(self, fill: int) -> tuple[int, int]:
        """Pages `_pre_alloc` takes (arrival, resume)."""
        return physical_pages(fill, self.config.page_size, self.config.sliding_window)

    def _held(self, fill: int) -> tuple[int, int]:
        """Pages a decoding request holds after SWA eviction (== `_pages` for page_size > 1)."""
        return held_pages(fill, self.config.page_size, self.config.sliding_window)

    def _fits_new(self, state: SchedState) -> bool:
        full, swa = self._pages(self.config.prompts[state.next_arrival])
        return full <= state.full_free and swa <= state.swa_free

    def _arrive(self, state: SchedState) -> SchedState:
        rid = state.next_arrival
        fill = self.config.prompts[rid]
        full, swa = self._pages(fill)
        running = state.running + (Running(rid, fill, full, swa),)
        return state._replace(next_arrival=rid + 1, running=running, full_free=state.full_free - full,
                              swa_free=state.swa_free - swa)

    def _decode_fits(self, state: SchedState) -> bool:
        more_full = more_swa = 0
        for r in state.running:
            full, swa = self._held(r.fill + 1)
            more_full += full - r.full_pages
            more_swa += max(0, swa - r.swa_pages)
        return more_full <= state.full_free and more_swa <= state.swa_free

    def _decode(self, state: SchedState) -> tuple[SchedState, tuple[tuple, ...]]:
        full_free, swa_free = state.full_free, state.swa_free
        running: list[Running] = []
        finished = list(state.finished)
        done_now = []
        for r in state.running:
            fill = r.fill + 1
            full, swa = self._held(fill)
            full_free -= full - r.full_pages
            swa_free -= swa - r.swa_pages
            if fill == self.config.prompts[r.rid] + self.config.outputs[r.rid]:
                finished.append(r.rid)
                done_now.append(Finished(r.rid))
                full_free, swa_free = full_free + full, swa_free + swa
            else:
                running.append(Running(r.rid, fill, full, swa))
        return state._replace(running=tuple(running), finished=tuple(sorted(finished)), full_free=full_free,
                              swa_free=swa_free), tuple(done_now)

    def _retract(self, state: SchedState, rid: int) -> SchedState:
        victim = next(r for r in state.running if r.rid == rid)
        running = tuple(r for r in state.running if r.rid != rid)
        return state._replace(running=running, retracted=state.retracted + (RetractedReq(rid, victim.fill),),
                              full_free=state.full_free + victim.full_pages,
                              swa_free=state.swa_free + victim.swa_pages)

    def _resume(self, state: SchedState) -> tuple[SchedState, tuple[tuple, ...]]:
        cfg = self.config
        reserve = cfg.reserved_decode_tokens * len(state.running)
        result = resume_retracted_reqs(
            state.retracted, full_budget=state.full_free * cfg.page_size - reserve,
            swa_budget=state.swa_free * cfg.page_size, page_size=cfg.page_size,
            sliding_window=cfg.sliding_window, full_free_pages=state.full_free, swa_free_pages=state.swa_free,
            reserved_decode_tokens=cfg.reserved_decode_tokens, variant=self.variant)
        if result.error is not None:
            return flag(state, "no_failed_allocation", result.error), ()
        k = len(result.resumed)
        if tuple(r.rid for r in state.retracted[:k]) != result.resumed or result.remaining != state.retracted[k:] \
                or len(result.alloc_calls) != k:
            return flag(state, "retracted_fifo", f"resumed {result.resumed} from queue "
                        f"{[r.rid for r in state.retracted]}, left {[r.rid for r in result.remaining]}"), ()
        negative = [(f, s) for f, s in result.budget_trail if f < 0 or s < 0]
        if negative:
            return flag(state, "budget_nonnegative", f"budget after admission: expected >= 0, got {negative[0]}"), ()
        running = list(state.running)
        full_free, swa_free = state.full_free, state.swa_free
        for req in state.retracted[:k]:
            full, swa = self._pages(req.fill_len)
            running.append(Running(req.rid, req.fill_len, full, swa))
            full_free, swa_free = full_free - full, swa_free - swa
        return state._replace(running=tuple(running), retracted=result.remaining, full_free=full_free,
                              swa_free=swa_free), (Resumed(k),)

    # -- invariants ---------------------------------------------------------------------------
    def _conservation(self, state: SchedState) -> str | None:
        held_full = sum(r.full_pages for r in state.running)
        held_swa = sum(r.swa_pages for r in state.running)
        if state.full_free < 0 or state.full_free + held_full != self.config.full_pages:
            return f"full pool: free {state.full_free} + held {held_full}: expected {self.config.full_pages}"
        if state.swa_free < 0 or state.swa_free + held_swa != self.config.swa_pages:
            return f"SWA pool: free {state.swa_free} + held {held_swa}: expected {self.config.swa_pages}"
        return None

    def _accounted(self, state: SchedState) -> str | None:
        seen = list(range(state.next_arrival, self.n)) + [r.rid for r in state.running] + \
            [r.rid for r in state.retracted] + list(state.finished)
        if sorted(seen) != list(range(self.n)):
            return f"request ids across queues: expected each of 0..{self.n - 1} once, got {sorted(seen)}"
        return None

