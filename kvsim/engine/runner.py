"""Run one property on one variant and return a plain result record.

Hypothesis does the generation and the shrinking; the runner only wraps the
property in `@given` (or the generic state machine), applies the settings,
counts the examples and keeps the last failing case, which is the shrunk one
because Hypothesis replays the minimal example last. A stop asked by Ctrl-C or
SIGTERM (`kvsim.engine.interrupt`) ends a run at its next example, with
`Interrupted`, which Hypothesis lets through.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis.stateful import get_state_machine_test
from .canon import to_jsonable
from .descriptor import ModelDescriptor
from .draws import own_draws
from .errors import PropertyViolation
from .memory import spaced_collections
from .interrupt import raise_if_asked
from .params import resolve
from .property import KvProperty
from .registry import REGISTRY
from .stateful import machine_class
from .system import REACH_EXAMPLES, Sometimes, drawn_reach


@dataclass
class PropertyResult:
    property: str
    model: str
    variant: str
    status: str  # "passed", "failed" or "error"
    examples: int
    seconds: float
    counterexample: Any = None
    message: str = ""
    replay: str = ""
    # with `keep_tried`, every case a data property's run checked, in order (the shrunk counterexample last among
    # the failing ones), for a caller that checks them again in this process (the fixed side of a bug report)
    tried: tuple[Any, ...] = field(default=(), repr=False, compare=False)
    # a data property's `sometimes`, in declaration order, each as `reached` says
    reachability: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"property": self.property, "model": self.model, "variant": self.variant,
                "status": self.status, "examples": self.examples, "seconds": round(self.seconds, 4),
                "counterexample": self.counterexample, "message": self.message, "replay": self.replay,
                "reachability": list(self.reachability)}


def _settings(max_examples: int, derandomize: bool, database: Any, phases: tuple[Phase, ...],
              stateful_steps: int) -> settings:
    return settings(max_examples=max_examples, derandomize=derandomize, database=database, deadline=None,
                    verbosity=Verbosity.quiet, phases=phases, stateful_step_count=stateful_steps,
                    suppress_health_check=list(HealthCheck), print_blob=False, report_multiple_bugs=False)


YOUNG_THRESHOLD = 10_000  # the collector's young threshold while a property runs (default 700; a third of mla-chunks' planner checks went to collection)


def _replay_command(prop: KvProperty, variant: str, seed: int | None, max_examples: int,
                    params: dict[str, Any] | None, backend: str | None = None) -> str:
    cmd = f"kvsim check {prop.model} --variant {variant} --property {prop.name} --max-examples {max_examples}"
    if backend is not None:
        cmd += f" --backend {backend}"
    for name, value in sorted((params or {}).items()):
        value = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else value
        cmd += f" --param {name}={value}"
    return cmd + (f" --seed {seed}" if seed is not None else "")


def run_property(prop: KvProperty, variant: Any = "fixed", *, max_examples: int = 100, seed: int | None = None,
                 derandomize: bool = False, database: Any = None, use_examples: bool = True,
                 stateful_steps: int = 30, params: dict[str, Any] | None = None,
                 backend: str | None = None, database_key: str | None = None,
                 descriptor: ModelDescriptor | None = None, shrink: bool = True,
                 interruptible: bool = True, cases: Sequence[Any] = (), keep_tried: bool = False) -> PropertyResult:
    """Run `prop` on `variant`.

    `seed` fixes Hypothesis' generation (same seed, same examples and same
    counterexample); without it and without `derandomize` the run is random.
    `use_examples=False` skips the pinned `@example` cases so a search has to
    find (and shrink) the counterexample itself, as `kvsim repro` wants.
    `database_key` keys the examples saved in `database` (every property runs through one wrapper, so
    without a key they would share one); it is set only with a database, as it also seeds derandomized runs.
    `descriptor`: the model, where the caller resolved it (every kvsim command does; without it, a library call,
    it is looked up by the property's model name).
    `shrink=False`: report the first failing case as found (a mutation run only needs to know that one fails).
    A stop asked by Ctrl-C or SIGTERM (`kvsim.engine.interrupt`) raises `Interrupted` at the next example;
    `interruptible=False` runs on to the end instead (a fuzz round, which counts what it ran).
    `cases`: a data property's cases to check first, as pinned ones, whatever `use_examples` says (the inputs a
    bug report's search tried, on its fix); `keep_tried`: the result keeps every case checked (`tried`).
    """
    model = descriptor if descriptor is not None else REGISTRY.model(prop.model)
    variant = model.variant(variant)  # the one check of the name; the property sees the flag record
    phases = tuple(p for p in Phase if p is not Phase.explain and (use_examples or p is not Phase.explicit)
                   and (shrink or p is not Phase.shrink))
    config = _settings(max_examples, derandomize and seed is None, database, phases, stateful_steps)
    record: dict[str, Any] = {"count": 0, "failure": None, "tried": [] if keep_tried else None,
                              "drawing": False, "drawn": 0, "met": {}}

    stop = raise_if_asked if interruptible else (lambda: None)
    pinned: Callable[[], None] = lambda: None
    if prop.kind == "stateful":
        test = _stateful_test(prop, model, variant, config, record, params, stop)
    else:
        test, check = _data_test(prop, model, variant, config, record, params, backend, stop)
        explicit = [*cases, *(prop.examples if use_examples else ())]
        if explicit:
            pinned = lambda: run_pinned(check, explicit)
    if database_key is not None:
        test.hypothesis.inner_test._hypothesis_internal_add_digest = database_key.encode()
    if seed is not None and database is not None:
        # `hypothesis.seed` turns the database off (a seeded run replays, it does not collect); a fuzz worker
        # wants both its own seed and the shared database, so the seed goes where `seed` would put it
        test._hypothesis_internal_use_seed = seed
    elif seed is not None:
        test = hypothesis.seed(seed)(test)

    start = time.perf_counter()
    status, message = "passed", ""
    try:
        with own_draws(), spaced_collections(YOUNG_THRESHOLD):  # the seed alone names the inputs, whatever this process imported
            pinned()
            record["drawing"] = True  # the cases from here on are drawn: the ones `sometimes` is asked of
            test()
    except PropertyViolation as exc:
        status, message = "failed", str(exc)
    except BaseExceptionGroup as group:  # several distinct failures: report the first
        status, message = "failed", "; ".join(str(e) for e in group.exceptions)
    except Exception as exc:  # the model itself crashed: a bug in kvsim or the model, say so plainly
        status, message = "error", f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    failure = record["failure"]
    return PropertyResult(property=prop.name, model=prop.model, variant=variant.name, status=status,
                          examples=record["count"], seconds=seconds,
                          counterexample=failure if status != "passed" else None, message=message,
                          replay=_replay_command(prop, variant.name, seed, max_examples, params, backend)
                          if status != "passed" else "", tried=tuple(record["tried"] or ()),
                          reachability=reached(prop.sometimes, record,
                                               status == "passed" and max_examples >= REACH_EXAMPLES))


def reached(goals: Sequence[Sometimes[Any]], record: dict[str, Any], whole: bool) -> tuple[dict[str, Any], ...]:
    """Each of a data property's `sometimes`: the first drawn case that met it and its number among the drawn
    ones, or none; unreached where the run drew its `whole` budget (it passed, with at least `REACH_EXAMPLES`
    examples), else not reached within the bound (fewer examples, or a failure ended the run first)."""
    return tuple(drawn_reach(goal, record["drawn"], whole, *record["met"].get(k, ())) for k, goal in enumerate(goals))


def run_pinned(check: Callable[[Any], None], cases: Sequence[Any]) -> None:
    """The pinned cases, in their order, as Hypothesis's explicit phase runs `@example`s: each once, one it rejects
    (`assume`, `reject`) skipped, the first failure raised as is (no shrinking), under seeded global PRNGs
    restored afterwards. Without that phase's cost a case (the PRNGs' states saved and restored, the call's text
    written for its report: about 1 ms), which conform targets pinning whole exhaustive domains paid thousands
    of times. A case that calls `assume` or `reject` runs outside Hypothesis's own test context here, where
    Hypothesis warns that such a call is deprecated: the warning is not shown (with `-W error`, as an engine's
    CI may run, it would fail the check), as the explicit phase it stands for would not show it."""
    import warnings

    from hypothesis.errors import HypothesisDeprecationWarning, UnsatisfiedAssumption

    with seeded_randoms(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"Using `(assume|reject)` outside a property-based test",
                                HypothesisDeprecationWarning)
        for case in cases:
            try:
                check(case)
            except UnsatisfiedAssumption:
                continue


@contextmanager
def seeded_randoms() -> Iterator[None]:
    """`random` (and numpy's global generator, where numpy is imported) seeded with 0 inside, restored after: code
    under test that draws from them draws the same in every run."""
    import random

    numpy = sys.modules.get("numpy")
    kept = random.getstate()
    np_kept = numpy.random.get_state() if numpy is not None else None
    random.seed(0)
    if numpy is not None:
        numpy.random.seed(0)
    try:
        yield
    finally:
        random.setstate(kept)
        if numpy is not None:
            numpy.random.set_state(np_kept)


def _keeping(prop: KvProperty, tried: list[Any]) -> Any:
    """`prop`'s call, each case kept in `tried` first (`run_property(keep_tried=True)`)."""

    def call(case: Any, variant: Any, backend: str | None) -> None:
        tried.append(case)
        prop(case, variant, backend)

    return call


def _asking(prop: Any, goals: Sequence[Sometimes[Any]], record: dict[str, Any]) -> Any:
    """`prop`'s call, each drawn case (`record["drawing"]`: not the pinned ones) counted and asked the `sometimes`
    not met yet first; the first that meets one is kept in `record["met"]` with its number, and it is not asked
    again."""
    pending = list(enumerate(goals))

    def call(case: Any, variant: Any, backend: str | None) -> None:
        if record["drawing"]:
            record["drawn"] += 1
            if pending:
                hit = [k for k, goal in pending if goal.check(case)]
                if hit:
                    record["met"].update((k, (record["drawn"], to_jsonable(case))) for k in hit)
                    pending[:] = [(k, goal) for k, goal in pending if k not in record["met"]]
        prop(case, variant, backend)

    return call


def _data_test(prop: KvProperty, model: ModelDescriptor, variant: Any, config: settings, record: dict[str, Any],
               params: dict[str, Any] | None, backend: str | None,
               stop: Callable[[], None]) -> tuple[Callable[[], None], Callable[[Any], None]]:
    """The property under `@given` (the pinned cases are `run_pinned`'s), and the check of one case."""
    assert prop.fn is not None and prop.strategy is not None
    strategy = prop.build_strategy(resolve(model.params, {**prop.params, **(params or {})}))
    if prop.sometimes:  # asked in a wrapper, as `tried` is kept, so `check`'s text (below) stays as it is
        prop = _asking(prop, prop.sometimes, record)
    if record["tried"] is not None:  # `keep_tried`: the property's calls are kept by a wrapper, not in `check`,
        prop = _keeping(prop, record["tried"])  # whose text seeds a derandomized run (Hypothesis hashes it)

    def check(case: Any) -> None:
        stop()  # Ctrl-C or SIGTERM asked a stop (`kvsim.engine.interrupt`): it ends the run here
        record["count"] += 1
        try:
            prop(case, variant, backend)
        except PropertyViolation as exc:
            record["failure"] = {"case": to_jsonable(case), "message": str(exc)}
            raise
        except Exception as exc:
            record["failure"] = {"case": to_jsonable(case), "message": f"{type(exc).__name__}: {exc}"}
            raise

    return config(given(strategy)(check)), check


def _stateful_test(prop: KvProperty, model: ModelDescriptor, variant: Any, config: settings, record: dict[str, Any],
                   params: dict[str, Any] | None, stop: Callable[[], None]) -> Callable[[], None]:
    if prop.machine is not None:  # a machine of its own (a conform lockstep), not the model's system
        machine = prop.machine(record)
    else:
        machine = machine_class(model.build_system(variant, {**prop.params, **(params or {})}), record)

    def factory() -> Any:
        stop()
        record["count"] += 1
        return machine()

    return get_state_machine_test(factory, settings=config)
