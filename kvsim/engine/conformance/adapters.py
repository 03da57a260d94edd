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
from functools import lru_cache
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


def directed_probe(sides: Callable[[Context, dict[str, Any]], tuple[Any, ...]], name: str, what: str,
                   start: dict[str, Any], program: Sequence[Any]) -> Probe:
    """A lockstep's directed program as a probe: fresh sides from `sides(ctx, start)` (model, upstream) step through
    `program` (each action one `call("step", action)`), compared after every step as the lockstep compares; the
    probe fails at the first step whose answer or observation differs."""

    def check(ctx: Context) -> str | None:
        model, real = sides(ctx, start)[:2]
        for i, action in enumerate(program):
            seen = [{"returned": side.call("step", action), **side.observe()} for side in (model, real)]
            if seen[0] != seen[1]:
                key = next(k for k in seen[0] if seen[0][k] != seen[1].get(k))  # the answer first
                return f"{what}: the model and {ctx.source.label} differ after step {i + 1} {action!r}: {key} " \
                       f"model {seen[0][key]}, upstream {seen[1][key]}"
        return None

    return Probe(name, f"{what}: the model's answers and observations and upstream's are equal", check)


@lru_cache(maxsize=4096)
def _made(build: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return build(*args)


def strategy_of(build: Callable[..., Any], *args: Any) -> Any:
    """`build(*args)`, a Hypothesis strategy, made once for equal (hashable) arguments. A strategy is validated at
    its first draw (0.1-0.4 ms for a small one), which a lockstep that builds one every step from what the state
    enables paid at every step; equal strategies draw the same values from the same choices."""
    try:
        return _made(build, args)
    except TypeError:  # an argument with no hash
        return build(*args)


def _sampled(choices: tuple[Any, ...]) -> Any:
    from hypothesis import strategies as st

    return st.sampled_from(choices)


def sampled(choices: Sequence[Any]) -> Any:
    """`st.sampled_from(choices)`, made once for equal choices (`strategy_of`)."""
    return strategy_of(_sampled, tuple(choices))


class SystemSide:
    """A lockstep's model side over a transition system's own actions (`system`, its `state`): `enabled()` the
    actions it enables now as a strategy, `transition(op, action)` one of them taken, answering its effects."""

    system: Any
    state: Any
    idle: bool = False

    def enabled(self) -> Any:
        """The actions the model enables now, as a strategy (None: none, the program has ended). After a step
        that changed nothing (a deferral), the actions that would change nothing again are left out while another
        is enabled, so a program does not spend its steps repeating a deferral."""
        actions = self.system.enabled(self.state)
        if self.idle:
            actions = [a for a in actions if self.system.step(self.state, a) != self.state] or actions
        return sampled(actions) if actions else None

    def transition(self, op: str, action: Any) -> tuple[Any, ...]:
        from ..errors import ConfigError

        if action not in self.system.enabled(self.state):
            raise ConfigError(op, "an action the model enables", action)
        before = self.state
        self.state, effects = self.system.transition(self.state, action)
        self.idle = self.state == before
        return effects
