"""Reproduce a catalogued bug report: the property fails on its variant, and (for a seed bug) passes on fixed.

The "fixed" side is the report's `fix_variant` where it names one (a finding with a modelled fix), else the
model's `fixed` variant for a report on another variant. A seed bug holds when it fails before and passes
after; an "open upstream" finding holds when it still reproduces (and its modelled fix, if any, removes it);
a finding on a later release may be present on `fixed` too, which is shown, not required.

A Hypothesis report's fixed side checks every input the report's own search tried (the one that first failed and
the shrunk counterexample among them), then the property's pinned cases and `FIXED_CHECK_EXAMPLES` generated ones,
from the next seed (the search's own would generate its first inputs again). A search report's fixed side is
complete (`search_options`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..engine.descriptor import ModelDescriptor
from ..engine.explore import ExploreOptions, explore
from ..engine.property import KvProperty
from ..engine.registry import REGISTRY, BugReport, Registry
from ..engine.runner import run_property

FIXED_CHECK_EXAMPLES = 100  # generated examples a Hypothesis report's fixed side runs, after the search's inputs


@dataclass(frozen=True)
class BugRun:
    """A bug report resolved once against the catalog (`kvsim repro` does it, and passes the record down): its
    model, its property (None for a report found by search), the variant it must fail on and the one it must pass
    on (`baseline_variant`; None where there is none)."""

    bug: BugReport
    model: ModelDescriptor
    prop: KvProperty | None
    variant: Any
    baseline: Any

    @classmethod
    def resolve(cls, bug: BugReport, registry: Registry) -> "BugRun":
        prop = None if bug.driver == "explore" else registry.property(bug.model, bug.property)  # as looked up before
        model = registry.model(bug.model)
        baseline = baseline_variant(bug)
        return cls(bug, model, prop, model.variant(bug.variant), None if baseline is None else model.variant(baseline))


@dataclass
class ReproResult:
    bug: BugReport
    reproduced: bool
    fixed_passes: bool | None  # None for a finding on `fixed` itself
    examples: int  # examples run, or states searched (to the first violation where the search stopped there)
    seconds: float  # the search on the report's variant
    counterexample: Any
    message: str
    run: BugRun | None = field(default=None, repr=False, compare=False)  # what was run, resolved
    fixed_seconds: float = 0.0  # the check on the fixed side (0 where there is none)
    fixed_examples: int | None = None  # examples run, or states searched, on the fixed side (None where there is none)

    def to_json(self) -> dict[str, Any]:
        b = self.bug
        # a Hypothesis search counts examples, an exhaustive one states: each under its own name
        searched, fixed = ("examples", "fixed_examples") if b.property else ("states", "fixed_states")
        counts = {"examples": None, "states": None, "fixed_examples": None, "fixed_states": None,
                  searched: self.examples, fixed: self.fixed_examples}
        return {"id": b.id, "model": b.model, "variant": b.variant, "property": b.property,
                "invariant": b.invariant, "check": b.check, "source": b.source,
                "status": b.status, "reproduced": self.reproduced, "fixed_passes": self.fixed_passes,
                "verdicts": [v.to_json() for v in b.verdicts],
                **counts, "seconds": round(self.seconds, 4), "fixed_seconds": round(self.fixed_seconds, 4),
                "total_seconds": round(self.seconds + self.fixed_seconds, 4),
                "counterexample": self.counterexample, "message": self.message}

    def fields(self) -> tuple[Any, ...]:
        """What a worker process hands back (plain values: the report and its resolved run stay behind)."""
        return (self.reproduced, self.fixed_passes, self.examples, self.seconds, self.counterexample, self.message,
                self.fixed_seconds, self.fixed_examples)

    @classmethod
    def from_fields(cls, run: BugRun, fields: tuple[Any, ...]) -> "ReproResult":
        reproduced, fixed_passes, examples, seconds, counterexample, message, fixed_seconds, fixed_examples = fields
        return cls(run.bug, reproduced, fixed_passes, examples, seconds, counterexample, message, run, fixed_seconds,
                   fixed_examples)

    @property
    def ok(self) -> bool:
        """The catalog entry holds: reproducible bugs fail before and pass after; findings still reproduce."""
        if self.bug.status == "not reproducible":
            return not self.reproduced
        if self.bug.status == "open upstream" and not self.bug.fix_variant:
            return self.reproduced
        return self.reproduced and bool(self.fixed_passes)


def _verdict(v: Any) -> str:
    return f"{v.release.split(' ')[0]} {v.state}" + (f" in {v.fixed_in.split(' ')[0]}" if v.fixed_in else "")


def release_verdicts(bug: BugReport) -> str:
    """The report's verdict per upstream release in one cell: `05c7ebf present; 0.5.23 fixed in 0.5.21`."""
    return "; ".join(_verdict(v) for v in bug.verdicts) or "-"


def latest_verdict(bug: BugReport) -> str:
    """The verdict for the newest release the report names (`0.5.23 present`), for a narrow table."""
    return _verdict(bug.verdicts[-1]) if bug.verdicts else "-"


def baseline_variant(bug: BugReport) -> str | None:
    """The variant the report must pass on: its modelled fix, else `fixed` for a report on another variant."""
    return bug.fix_variant or (None if bug.variant == "fixed" else "fixed")


def generated_first(run: BugRun) -> bool:
    """The order `repro --all` hands its reports to the forked workers in (a sort key, False first): the reports
    that generate their inputs before the searches. A generated report checks hundreds of inputs (its search,
    then its fixed side: what the search tried and `FIXED_CHECK_EXAMPLES` more); most searches end in a few hundred
    states. With the dearer ones handed out first, the reports the workers end on are short, and one worker
    does not run on alone for long after the other has finished."""
    return run.prop is None


def reproduce(bug: BugReport | BugRun, seed: int = 0) -> ReproResult:
    """Reproduce a bug report: a `BugRun` the caller resolved, or a bare report (resolved here against the
    catalog's registry, for library callers)."""
    run = bug if isinstance(bug, BugRun) else BugRun.resolve(bug, REGISTRY)
    if run.prop is None:
        return _reproduce_by_explore(run)
    bug, prop = run.bug, run.prop
    found = run_property(prop, run.variant, max_examples=bug.max_examples, seed=seed, use_examples=False,
                         params=dict(bug.params), descriptor=run.model, keep_tried=run.baseline is not None)
    fixed_passes, fixed_seconds, fixed_examples = None, 0.0, None
    if run.baseline is not None:  # every input the search above tried, then generated ones (module doc)
        fixed = run_property(prop, run.baseline, max_examples=FIXED_CHECK_EXAMPLES, seed=seed + 1,
                             params=dict(bug.params), descriptor=run.model, cases=found.tried)
        fixed_passes, fixed_seconds, fixed_examples = fixed.status == "passed", fixed.seconds, fixed.examples
    return ReproResult(bug, found.status == "failed", fixed_passes, found.examples, found.seconds,
                       found.counterexample, found.message, run, fixed_seconds, fixed_examples)


def search_options(system: Any, invariant: str) -> ExploreOptions:
    """How a report's search runs: a report on a safety invariant stops at the first state violating it
    (breadth-first, so its path is the shortest, the one a complete search reports) and skips the hang search,
    which cannot change whether that invariant fails; on the fixed side that stop never comes, so the search
    is complete, which is what the side claims. A report on the liveness goal (a hang) needs the whole graph."""
    if invariant == getattr(system, "liveness", "liveness"):
        return ExploreOptions()
    return ExploreOptions(stop_on=frozenset({invariant}), check_liveness=False)


def _reproduce_by_explore(run: BugRun) -> ReproResult:
    bug = run.bug

    def search(variant: Any) -> tuple[Any, float, int]:
        start = time.perf_counter()
        system = run.model.build_system(variant, dict(bug.params))
        result = explore(system, search_options(system, bug.invariant))
        hit = next((v for v in result.violations if v.property == bug.invariant), None)
        return hit, time.perf_counter() - start, result.states

    hit, seconds, states = search(run.variant)
    fixed_passes, fixed_seconds, fixed_states = None, 0.0, None
    if run.baseline is not None:
        fixed_hit, fixed_seconds, fixed_states = search(run.baseline)
        fixed_passes = fixed_hit is None
    counterexample = {"trace": hit.trace, "kind": hit.kind} if hit else None
    return ReproResult(bug, hit is not None, fixed_passes, states, seconds, counterexample,
                       hit.message if hit else "", run, fixed_seconds, fixed_states)
