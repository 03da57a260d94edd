"""Timing properties (research note section 1.10): the max-plus closed form against its recursion, and the timed
simulation against both on random workloads (one request, a free link), with the bounds."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.engine.sim import FaultPlan, Simulator
from kvsim.engine.trace import TraceRecorder
from kvsim.models.pipelined_transfer import sim as pt_sim
from kvsim.models.pipelined_transfer.timing import exposed_by_recursion, exposed_closed_form
from kvsim.models.pipelined_transfer.variants import PipelinedVariant

MODEL = "pipelined-transfer"
TOLERANCE = 1e-9


@dataclass(frozen=True)
class MaxPlusCase:
    compute: tuple[float, ...]  # p_j of the emitted slices (the first from promotion)
    durations: tuple[float, ...]  # t_j
    handoff: float


@dataclass(frozen=True)
class WorkloadCase:
    params: pt_sim.SimConfig
    seed: int


@kv_property(model=MODEL, strategy="MAX_PLUS")
def max_plus_closed_form_is_the_recursion(case: MaxPlusCase, variant: PipelinedVariant) -> None:
    """`F_N - (C_N + h) = max_k [sum_{j>=k} t_j - sum_{j>k} p_j]` for the FIFO recursion on a free link, and
    `t_N <= exposed <= sum t_j`."""
    ends, c = [], 0.0
    for p in case.compute:
        c += p
        ends.append(c)
    got = exposed_by_recursion(ends, case.durations, case.handoff)
    want = exposed_closed_form(ends, case.durations)
    if abs(got - want) > TOLERANCE:
        raise PropertyViolation(f"exposed transfer time: expected the closed form {want!r}, got {got!r} from the "
                                f"recursion (p {case.compute}, t {case.durations})")
    if not case.durations[-1] - TOLERANCE <= got <= sum(case.durations) + TOLERANCE:
        raise PropertyViolation(f"exposed {got!r}: expected within [t_N, sum t_j] = [{case.durations[-1]!r}, "
                                f"{sum(case.durations)!r}]")


@kv_property(model=MODEL, strategy="WORKLOADS")
def simulation_matches_closed_form(case: WorkloadCase, variant: PipelinedVariant) -> None:
    """The timed simulation of one request on a free link (through the transition system) exposes exactly the
    closed form's transfer time, within the bounds, and pipelining costs at most (N-1) L (plus re-sent bytes)."""
    sim = Simulator(case.seed)
    recorder = TraceRecorder({"model": MODEL, "seed": case.seed}, keep=False)
    summary, driver = pt_sim.simulate(sim, recorder, variant, case.params, FaultPlan())
    if summary["violations"]:
        raise PropertyViolation(summary["violations"][0])
    if summary["closed_form_checked"] != case.params.requests or summary["completed"] != case.params.requests:
        raise PropertyViolation(f"requests checked against the closed form: expected {case.params.requests} "
                                f"(each alone on its link), got {summary['closed_form_checked']} of "
                                f"{summary['completed']} completed")
