"""Where a counterexample to draw comes from: a catalogued bug (reproduced once per process), or a file.

A file is a saved counterexample of `check` or `explore` (or their `--json` output,
`counterexample.sniff`), or a JSONL trace of `kvsim simulate`, which is re-run from its header and
checked against its digest before its actions are drawn.
"""

from __future__ import annotations

from typing import Any

from ...engine.errors import ConfigError, TraceError
from ...engine.registry import BugReport, Registry
from ...engine.trace import read_trace
from .. import counterexample
from ..repro import BugRun, ReproResult, reproduce
from . import picture
from .chart import CaseTable, SequenceChart, case_table, realize, sequence_chart

TRACE_STEPS = 40  # the steps of a long trace drawn by default: those ending at the first violation

_REPRODUCED: dict[tuple[str, int], ReproResult] = {}


def reproduced(bug: BugReport, seed: int = 0, registry: Registry | None = None) -> ReproResult:
    """`repro.reproduce(bug, seed)`, run once per process: `kvsim report` and `show` share it. `registry`: the
    catalog the caller holds, which the report is resolved against."""
    key = (bug.id, seed)
    if key not in _REPRODUCED:
        _REPRODUCED[key] = reproduce(bug if registry is None else BugRun.resolve(bug, registry), seed=seed)
    return _REPRODUCED[key]


def remember(result: ReproResult, seed: int = 0) -> None:
    """A reproduction made elsewhere (a forked worker of `kvsim report`), as `reproduced` would have made it."""
    _REPRODUCED[(result.bug.id, seed)] = result


def known(bug: BugReport, seed: int = 0) -> bool:
    """Whether `reproduced(bug, seed)` has its result already."""
    return (bug.id, seed) in _REPRODUCED


def of_bug(registry: Registry, bug: BugReport, seed: int = 0) -> SequenceChart | CaseTable | None:
    """The drawing of a bug report's counterexample; None where the bug does not reproduce."""
    result = reproduced(bug, seed, registry)
    if not result.reproduced or result.counterexample is None:
        return None
    title = f"{bug.id}: {bug.model} [{bug.variant}]"
    replay = f"kvsim repro {bug.id}" + (f" --seed {seed}" if seed else "")
    found = result.counterexample
    if bug.driver == "explore":
        system = registry.model(bug.model).build_system(bug.variant, dict(bug.params))
        return _path_chart(system, found["trace"], None, title, bug.invariant or "", found.get("kind", "invariant"),
                           result.message, replay)
    return _property_chart(registry, bug.model, bug.variant, dict(bug.params), bug.property or "", found,
                           result.message, title, replay)


def picture_of_bug(registry: Registry, bug: BugReport, seed: int = 0) -> str | None:
    """The inline SVG picture of a bug report's counterexample (`picture`): the memory of a data property's shrunk
    case, or the state a path ends in (its failing step); None where the model has no picture hook or the bug
    does not reproduce."""
    result = reproduced(bug, seed, registry)
    if not result.reproduced or result.counterexample is None:
        return None
    found = result.counterexample
    spec = registry.model(bug.model)
    if bug.driver != "explore" and registry.property(bug.model, bug.property or "").kind != "stateful":
        return picture.of_case(found.get("case"), spec.variants.resolve(bug.variant))
    system = spec.build_system(bug.variant, dict(bug.params))
    trace, initial = (found["trace"], None) if bug.driver == "explore" else (found.get("actions") or [],
                                                                             found.get("initial"))
    state, actions = realize(system, trace, initial)
    for action in actions:
        state = system.step(state, action)
    return picture.of_state(system, state, len(actions))


def _path_chart(system: Any, trace: list, initial: Any, title: str, check: str, kind: str, verdict: str,
                replay: str) -> SequenceChart:
    start, actions = realize(system, trace, initial)
    return sequence_chart(system, start, actions, title=title, check=check, kind=kind, verdict=verdict,
                          replay=replay)


def _property_chart(registry: Registry, model: str, variant: str, params: dict, name: str, found: dict,
                    verdict: str, title: str, replay: str) -> SequenceChart | CaseTable:
    prop = registry.property(model, name)
    if prop.kind == "stateful":
        system = registry.model(model).build_system(variant, params)
        return _path_chart(system, found.get("actions") or [], found.get("initial"), title,
                           found.get("invariant", ""), "invariant", verdict, replay)
    return case_table(found.get("case"), title=title, check=name, verdict=verdict, replay=replay)


def of_file(path: str, registry: Registry, steps: int = TRACE_STEPS) -> SequenceChart | CaseTable:
    """The drawing of a saved counterexample (checked against its format and model first,
    `counterexample.validated`) or of a simulation trace (`steps`: the trace window)."""
    doc = counterexample.sniff(path)
    if doc is None:
        return _trace_chart(path, registry, steps)
    found = counterexample.validated(path, doc, registry)
    run = found.run
    title = f"{path}: {run.model.name} [{run.variant.name}]"
    replay = f"kvsim replay {path}"
    message = str(doc.get("message", ""))
    try:
        if found.kind == "case":
            return case_table(found.case, title=title, check=found.check, verdict=message, replay=replay)
        return _path_chart(run.system(), found.trace, found.initial, title, found.invariant or found.check,
                           found.kind, message, replay)
    except ValueError as exc:  # a path that is not a path of the rebuilt system
        raise TraceError(path, 1, f"the counterexample does not replay: {exc}") from None


def _trace_chart(path: str, registry: Registry, steps: int) -> SequenceChart:
    from ..simulate import header_params, simulate_model

    trace = read_trace(path)
    header = trace.header
    spec = registry.models.get(header["model"])
    if spec is None or spec.simulate is None:
        raise TraceError(path, 1, f"header field model: expected a model with a timed simulation, got "
                                  f"{header['model']!r}")
    params = header_params(path, spec, header["params"])
    try:
        result = simulate_model(spec, header["variant"], header["seed"], params, header["faults"] or None,
                                max_events=(trace.end or {}).get("events") or None)
    except ConfigError as exc:
        raise TraceError(path, 1, f"header does not describe a run: {exc}") from None
    if result.digest != trace.digest:
        raise TraceError(path, len(trace.steps) + 2, "the re-run does not give the trace's digest (kvsim replay "
                                                     f"{path} says where it diverges)")
    driver = result.driver
    system, actions = driver.system, list(driver.actions)
    first_bad = _first_violation(system, driver.initial, actions)
    check, verdict, end = "", "no invariant fails on this run", len(actions)
    if first_bad is not None:
        end, check, verdict = first_bad
    start = max(1, end - steps + 1)
    chart = sequence_chart(system, driver.initial, actions, title=f"{path}: {spec.name} [{header['variant']}] seed "
                           f"{header['seed']}", check=check, kind="invariant", verdict=verdict,
                           replay=f"kvsim replay {path}", window=(start, end))
    if first_bad is None:
        chart.marked_step = None
    chart.notes.append(f"steps {start}..{end} of {len(actions)} actions the simulation took"
                       + (f" (faults: {header['faults']})" if header["faults"] else ""))
    return chart


def _first_violation(system: Any, state: Any, actions: list) -> tuple[int, str, str] | None:
    """(step, invariant, message) of the first state on the path where an invariant fails."""
    for n, action in enumerate(actions, start=1):
        state = system.step(state, action)
        for inv in system.invariants:
            message = inv.check(state)
            if message is not None:
                return n, inv.name, message
    return None
