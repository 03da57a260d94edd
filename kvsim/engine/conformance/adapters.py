"""The three shapes of a conform adapter, and the context every adapter function is handed.

An adapter states only what is particular to its target: how an input becomes the model's call and
upstream's call, and what each answer is as plain data with field names. The runner (`runner.run_target`)
does the rest, the same way for every target: loading, the per-call deadline, raises and hangs as answers,
comparison, shrinking, properties, coverage, the result.

    PLANNER = Differential(
        inputs=lambda ctx: PLAN_CASES,
        model=lambda ctx, case: plans(plan_mla_context_chunks(*arguments(case))),
        upstream=lambda ctx, case: plans(ctx.up.plan_mla_context_chunks(*arguments(case))),
        compare=Exact(refusals=("AssertionError",)),
        checks=(Check("chunk_starts_are_aligned", lambda ctx, case, plans: ...),))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Mapping, Sequence

from .compare import EXACT, Exact


@dataclass
class Context:
    """What an adapter function is handed: the loaded upstream names (`up`), the model variant the release
    follows, the source, the run's options, a kernel child where the adapter runs one, and a place for the
    adapter's own prepared values (`state`) and counters (`counts`, shown in the note)."""

    up: SimpleNamespace
    variant: Any
    source: Any
    options: Any
    target: Any
    child: Any = None
    state: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def note(self, text: str) -> None:
        if text and text not in self.notes:
            self.notes.append(text)


@dataclass(frozen=True)
class Check:
    """A model property run on the code under test's answer: `fn(ctx, case, answer)` raises PropertyViolation.
    `finding`: the open-upstream finding its failure confirms (the target then still conforms)."""

    name: str
    fn: Callable[[Context, Any, Any], None]
    finding: str = ""


@dataclass(frozen=True)
class Probe:
    """A documented convention checked once per run: `check(ctx)` gives None while the code under test still
    behaves as the target's documentation says, else what changed (the probe then fails)."""

    name: str
    doc: str
    check: Callable[[Context], str | None]


@dataclass(frozen=True)
class Common:
    """What every shape may add: `loading(upstream, loaded so far)` -> the loader's stand-ins for one declared
    file (`extra_globals`, `modules`), `prepare(ctx)` after loading (signatures, patches; a ConfigError there
    is an unusable source), `skip(ctx)` -> None or (status, why) for a release of another shape, `note(ctx)`
    the result's note, `probes`, `examples` (a cap on the examples, for slow targets), and where upstream runs: in-process, in a kernel
    child (`kernel`) or imported for real in a child (`installed`)."""

    prepare: Callable[[Context], None] | None = None
    loading: Callable[[Any, SimpleNamespace], Mapping[str, Any]] | None = None
    skip: Callable[[Context], tuple[str, str] | None] | None = None
    note: Callable[[Context], str] | None = None
    probes: tuple[Probe, ...] = ()
    examples: int | Callable[[], int] | None = None  # a cap, or a function giving it at run time
    kernel: bool = False  # upstream runs in a kernel child (`ctx.child.call(runner, case)`)
    # upstream is a released engine imported for real in a child, driven by this "kvsim.conform.<module>:<Class>"
    # driver (`kvsim.conform.installed_child`); the runner hands that child to the adapter as `ctx.child`
    installed: str = ""


@dataclass(frozen=True)
class Differential(Common):
    """Model and upstream called on the same inputs (Hypothesis, shrunk on a divergence).

    `inputs(ctx)` -> a Hypothesis strategy; `model(ctx, case)` and `upstream(ctx, case)` -> answers (plain data
    with field names; the model refuses with ConfigError); `describe(ctx, case)` -> the input as shown;
    `pinned(ctx)` -> inputs run first, always; `explain(ctx, case, model, upstream)` -> a divergence's known
    cause (said in its note), or ""."""

    inputs: Callable[[Context], Any] | None = None
    model: Callable[[Context, Any], Any] | None = None
    upstream: Callable[[Context, Any], Any] | None = None
    compare: Exact = EXACT
    describe: Callable[[Context, Any], Any] | None = None
    checks: tuple[Check, ...] = ()
    pinned: Callable[[Context], Sequence[Any]] | None = None
    explain: Callable[[Context, Any, Any, Any], str] | None = None  # (ctx, case, model, upstream) -> a known cause


@dataclass(frozen=True)
class Sweep(Differential):
    """A Differential over an exhaustive domain: `domain(ctx)` yields the inputs smallest first, so the first
    divergence is the smallest one."""

    domain: Callable[[Context], Iterable[Any]] | None = None


@dataclass(frozen=True)
class Operation:
    """One kind of call of a lockstep: `args` is a strategy, or `args(view)` -> a strategy or None (not enabled
    now), `view` being the model side (or the lockstep's shadow); `then(view, args)` -> further (name, args)
    calls made right after, in the same step."""

    name: str
    args: Any = None
    then: Callable[[Any, Any], Sequence[tuple[str, Any]]] | None = None


@dataclass(frozen=True)
class Lockstep(Common):
    """Model and upstream driven by one state machine: `start(ctx)` -> a strategy of the initial configuration
    (a dict), `sides(ctx, start)` -> (model side, upstream side[, shadow]), each side with `call(op, args)` ->
    an answer and `observe()` -> a dict compared after every step; `both_upstream`: both sides are code under
    test (a release against a release), so both sides' raises are answers."""

    start: Callable[[Context], Any] | None = None
    sides: Callable[[Context, dict[str, Any]], tuple[Any, ...]] | None = None
    operations: tuple[Operation, ...] = ()
    steps: int = 30
    compare: Exact = EXACT
    both_upstream: bool = False
