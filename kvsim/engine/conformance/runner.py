"""Run one conform target: the one run frame of every target, whatever its shape.

    result = run_target(target, env, options)

`env` is what the caller (`kvsim.conform`) provides: the source, `load(upstream)` for each declared
`Upstream` (raising `NotPresent` when the release has no such file or definition, ConfigError when the code
cannot be used), the model's descriptor, and how to start a kernel child. Everything else is here, once:

* the model variant the release follows (the declaration's release table);
* every call of the code under test under the per-call deadline, its raise or hang an answer (`answers`);
* a Differential through the property runner `kvsim check` uses (`kvsim.engine.runner.run_property`): the
  first divergence is shrunk by Hypothesis; a hang is shrunk under a shorter deadline (`shrink_deadline`: 50
  times the slowest call that returned, at least a quarter second) and at most `MAX_HANGS` times, then the
  smallest hanging input found so far is reported;
* a Sweep over its domain, smallest input first, stopping at the first divergence;
* a Lockstep through `kvsim.engine.stateful.lockstep_class`, shrunk to a short program;
* the model's properties on the code under test's answers (a failing one is run again alone, to shrink it);
* the run's budget (`Options.until`): the target stops between two calls and is `incomplete`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from ..canon import to_jsonable
from ..errors import ConfigError, KvsimError, PropertyViolation
from .adapters import Context, Differential, Lockstep, Sweep
from .answers import FAILED, DidNotReturn, Raised, Refused, capture
from .compare import Difference
from .declare import ConformTarget, Upstream
from .result import FINDING, TargetResult

MAX_HANGS = 40  # calls that did not return, per target, before shrinking a hang stops
SHRINK_DEADLINE_FLOOR = 0.25  # seconds: the shortest deadline a call that shrinks a hang gets


class NotPresent(KvsimError):
    """The release has no such file or definition: the target is "not present" there (information, not an
    error, unless nothing of the engine is found at all)."""


class TargetSkipped(KvsimError):
    """The target cannot run here (say, no CUDA device for `--device cuda`): skipped, with the reason."""


class OutOfTime(KeyboardInterrupt):
    """The run's budget (`--max-seconds`) is spent: the target stops between two calls."""


class _Abandon(KeyboardInterrupt):
    """Shrinking a hang costs the deadline per try: stop after MAX_HANGS and report the smallest so far."""


class Divergence(PropertyViolation):
    pass


CALL_TIMEOUT = 30.0  # the default per-call deadline, in seconds


@dataclass(frozen=True)
class Options:
    max_examples: int = 200
    seed: int | None = None  # None: derandomized (the same inputs every run)
    device: str = "cpu"
    # seconds a call of the code under test may take (None: unbounded); the default is read when the options are
    # made, so a harness whose outcomes must not depend on the machine's load can raise it (tests/conftest.py)
    call_timeout: float | None = field(default_factory=lambda: CALL_TIMEOUT)
    until: float | None = None  # time.monotonic() at which the whole run stops
    trace: Any = None  # a linetrace.LineTrace while `--coverage` measures the checked definitions
    # False: the first divergence as found, and nothing run after it (the properties past it, the probes): a
    # mutation run only needs to know one exists
    shrink: bool = True


@dataclass
class Env:
    source: Any  # has .version, .label
    load: Callable[[Upstream], SimpleNamespace]
    descriptor: Any  # the model's ModelDescriptor
    start_child: Callable[[], Any] | None = None  # a context manager giving a kernel child
    # start_installed(driver): a context manager giving the real-import child of the source's release (`installed`)
    start_installed: Callable[[str], Any] | None = None
    subject: str = "upstream"
    files: list[str] = field(default_factory=list)


def run_target(target: ConformTarget, env: Env, options: Options) -> TargetResult:
    started = time.perf_counter()
    result = TargetResult(target.name, env.source.version, engine=target.engine, files=list(target.files),
                          subject=env.subject)
    if options.until is not None and time.monotonic() >= options.until:
        result.status, result.note = "not run", "the run's --max-seconds was spent before this target"
        return result.finish(started)
    try:
        adapter = target.resolve_adapter()
        variant = env.descriptor.variant(target.variant_name(env.source.version))
        up = SimpleNamespace()
        for upstream in target.upstream:
            loading = adapter.loading(upstream, up) if adapter.loading is not None else {}
            vars(up).update(vars(env.load(upstream, **loading)))
    except NotPresent as exc:
        result.status, result.note = "not present", str(exc)
        return result.finish(started)
    except KvsimError as exc:
        result.status, result.note = "error", str(exc)
        return result.finish(started)
    ctx = Context(up=up, variant=variant, source=env.source, options=options, target=target)
    try:
        skip = adapter.skip(ctx) if adapter.skip is not None else None
        if skip is not None:
            result.status, result.note = skip
            return result.finish(started)
        if adapter.prepare is not None:
            adapter.prepare(ctx)
        if adapter.kernel:
            if env.start_child is None:
                raise TargetSkipped("no kernel child here")
            with env.start_child() as child:
                ctx.child = child
                _run_shape(adapter, ctx, result, env, options)
        elif adapter.installed:
            if env.start_installed is None:
                raise TargetSkipped("no real-import child here")
            with env.start_installed(adapter.installed) as child:
                ctx.child = child
                _run_shape(adapter, ctx, result, env, options)
        else:
            _run_shape(adapter, ctx, result, env, options)
    except NotPresent as exc:
        result.status, result.note = "not present", str(exc)
    except TargetSkipped as exc:
        result.status = "skipped"
        result.add_note(str(exc))
    except OutOfTime:
        result.status = "incomplete"
        result.add_note(f"--max-seconds stopped it after {result.compared} calls compared")
    except KvsimError as exc:  # the code cannot be used as the adapter needs (a signature, a missing method)
        result.status = "error"
        result.add_note(str(exc))
    if adapter.note is not None and result.status in ("conforms", "diverges", "incomplete"):
        result.add_note(adapter.note(ctx))
    for text in ctx.notes:
        result.add_note(text)
    result.slowest_call = round(ctx.state.get("slowest", 0.0), 4)
    return result.finish(started)


def _run_shape(adapter: Any, ctx: Context, result: TargetResult, env: Env, options: Options) -> None:
    trace = options.trace
    if trace is not None:
        trace.start()
    try:
        if isinstance(adapter, Lockstep):
            _lockstep(adapter, ctx, result, env, options)
        elif isinstance(adapter, Sweep):
            _sweep(adapter, ctx, result, options)
        elif isinstance(adapter, Differential):
            _differential(adapter, ctx, result, env, options)
        else:
            raise ConfigError(f"conform target {ctx.target.key}.adapter", "a Differential, Sweep or Lockstep",
                              type(adapter).__name__)
        for probe in adapter.probes if options.shrink or not result.divergent else ():
            # a raise of the code under test in a probe fails the probe, with where
            message = capture(probe.check, ctx, passthrough=(KvsimError,))
            if isinstance(message, FAILED):
                message = f"the code under test {message}"
            result.prop(probe.name, "holds" if message is None else "fails", message or probe.doc)
    finally:
        if trace is not None:
            trace.stop()


# -- one call of each side --------------------------------------------------------------------------------

def _budget(options: Options) -> None:
    if options.until is not None and time.monotonic() >= options.until:
        raise OutOfTime()


def model_answer(fn: Callable[..., Any], *args: Any) -> Any:
    """The model's answer; its ConfigError is a refusal (any other raise is a bug of kvsim and propagates)."""
    try:
        return fn(*args)
    except ConfigError as exc:
        return Refused(str(exc))


def upstream_answer(fn: Callable[..., Any], ctx: Context, *args: Any) -> Any:
    """The code under test's answer, under the per-call deadline; once a call has hung, the calls that shrink
    it run under a shorter one (`shrink_deadline`)."""
    from hypothesis.errors import UnsatisfiedAssumption

    seconds = ctx.state.get("shrink_deadline") or ctx.options.call_timeout
    began = time.perf_counter()
    try:
        answer = capture(fn, ctx, *args, seconds=seconds, passthrough=(UnsatisfiedAssumption,))
    finally:
        _budget(ctx.options)
    if isinstance(answer, DidNotReturn):
        if "shrink_deadline" not in ctx.state and answer.reason.startswith("did not return"):
            ctx.state["shrink_deadline"] = shrink_deadline(ctx)
    else:
        ctx.state["slowest"] = max(ctx.state.get("slowest", 0.0), time.perf_counter() - began)
    return answer


def shrink_deadline(ctx: Context) -> float | None:
    """The deadline of the calls that shrink a hang: 50 times the slowest call that returned, at least
    `SHRINK_DEADLINE_FLOOR`, at most the deadline itself."""
    limit = ctx.options.call_timeout
    shorter = max(SHRINK_DEADLINE_FLOOR, 50 * ctx.state.get("slowest", 0.0))
    return shorter if limit is None else min(limit, shorter)


class _Record:
    """The last divergence seen (Hypothesis replays the shrunk input last), the first failure of each check and the
    checks run at all (on an upstream answer that was not a raise or a hang)."""

    def __init__(self) -> None:
        self.divergence: dict[str, Any] | None = None
        self.failures: dict[str, tuple[Any, str]] = {}
        self.ran: set[str] = set()
        self.hangs = 0


def _diverged(record: _Record, ctx: Context, adapter: Differential, case: Any, model: Any, upstream: Any,
              difference: Difference) -> None:
    if isinstance(upstream, DidNotReturn):
        record.hangs += 1
    shown = adapter.describe(ctx, case) if adapter.describe is not None else case
    known = adapter.explain(ctx, case, model, upstream) if adapter.explain is not None else ""
    record.divergence = {"input": to_jsonable(shown), "model": model, "upstream": upstream,
                         "field": difference.path, "difference": difference.line(), "known": known}
    if record.hangs > MAX_HANGS:
        raise _Abandon()


def _compare_once(adapter: Differential, ctx: Context, record: _Record, case: Any, *, checks: bool = True) -> None:
    _budget(ctx.options)
    model = model_answer(adapter.model, ctx, case)
    upstream = upstream_answer(adapter.upstream, ctx, case)
    ctx.count("compared")
    difference = adapter.compare.difference(model, upstream)
    if difference is not None:
        _diverged(record, ctx, adapter, case, model, upstream, difference)
        raise Divergence(difference.line())
    if checks and not isinstance(upstream, FAILED):
        _run_checks(adapter, ctx, record, case, upstream)


def _run_checks(adapter: Differential, ctx: Context, record: _Record, case: Any, upstream: Any,
                only: str | None = None) -> None:
    for check in adapter.checks:
        if (only is None and check.name in record.failures) or (only is not None and check.name != only):
            continue
        record.ran.add(check.name)
        try:
            check.fn(ctx, case, upstream)
        except PropertyViolation as exc:
            shown = adapter.describe(ctx, case) if adapter.describe is not None else case
            record.failures[check.name] = (to_jsonable(shown), str(exc))
            if only is not None:
                raise


# -- the shapes -----------------------------------------------------------------------------------------

def _examples(adapter: Any, options: Options) -> int:
    cap = adapter.examples() if callable(adapter.examples) else adapter.examples
    return min(options.max_examples, cap) if cap else options.max_examples


def _hypothesis(prop: Any, ctx: Context, env: Env, options: Options, record: _Record, *,
                steps: int = 30) -> Any:
    from ..runner import run_property

    try:
        return run_property(prop, ctx.variant, max_examples=_examples(ctx.state["adapter"], options),
                            seed=options.seed, derandomize=options.seed is None, stateful_steps=steps,
                            descriptor=env.descriptor, shrink=options.shrink)
    except _Abandon:
        return None


def _data_property(ctx: Context, fn: Callable[[Any, Any], None], strategy: Any, examples: tuple = ()) -> Any:
    from ..property import KvProperty

    return KvProperty(name=ctx.target.name, model=ctx.target.model, doc=ctx.target.doc, kind="data",
                      home=__name__, fn=fn, strategy=strategy, examples=examples)


def _differential(adapter: Differential, ctx: Context, result: TargetResult, env: Env, options: Options) -> None:
    ctx.state["adapter"] = adapter
    record = _Record()
    strategy = adapter.inputs(ctx)
    pinned = tuple(adapter.pinned(ctx)) if adapter.pinned is not None else ()

    def check(case: Any, variant: Any) -> None:
        _compare_once(adapter, ctx, record, case)

    outcome = _hypothesis(_data_property(ctx, check, strategy, pinned), ctx, env, options, record)
    _conclude(outcome, record, ctx, result)
    if record.divergence is not None and adapter.checks and options.shrink:  # the properties past the divergence
        _checks_only(adapter, ctx, env, options, strategy, pinned, record)
    for name in [c.name for c in adapter.checks if c.name in record.failures and options.shrink]:
        record.failures[name] = _shrink_check(adapter, ctx, env, options, strategy, pinned, name) \
            or record.failures[name]
    _report_checks(adapter, record, result)


def _checks_only(adapter: Differential, ctx: Context, env: Env, options: Options, strategy: Any, pinned: tuple,
                 record: _Record) -> None:
    """The model's properties on upstream's answers over the whole budget, comparing nothing (after a
    divergence stopped the differential run, the properties may still fail where it did not reach)."""

    def check(case: Any, variant: Any) -> None:
        upstream = upstream_answer(adapter.upstream, ctx, case)
        if not isinstance(upstream, FAILED):
            _run_checks(adapter, ctx, record, case, upstream)

    _hypothesis(_data_property(ctx, check, strategy, pinned), ctx, env, options, _Record())


def _shrink_check(adapter: Differential, ctx: Context, env: Env, options: Options, strategy: Any,
                  pinned: tuple, name: str) -> tuple[Any, str] | None:
    """The failing check alone, raising, so Hypothesis shrinks its input (same derandomized inputs)."""
    record = _Record()

    def check(case: Any, variant: Any) -> None:
        upstream = upstream_answer(adapter.upstream, ctx, case)
        if not isinstance(upstream, FAILED):
            _run_checks(adapter, ctx, record, case, upstream, only=name)

    _hypothesis(_data_property(ctx, check, strategy, pinned), ctx, env, options, record)
    return record.failures.get(name)


def _sweep(adapter: Sweep, ctx: Context, result: TargetResult, options: Options) -> None:
    record = _Record()
    for case in adapter.domain(ctx):
        try:
            _compare_once(adapter, ctx, record, case)
        except Divergence:
            break
    result.compared = ctx.counts.get("compared", 0)
    if record.divergence is not None:
        _record_divergence(result, record, "the first divergent input of an exhaustive sweep, smallest first")
    _report_checks(adapter, record, result)


def _lockstep(adapter: Lockstep, ctx: Context, result: TargetResult, env: Env, options: Options) -> None:
    from ..property import KvProperty
    from ..stateful import LockstepDivergence, call_line, lockstep_class

    ctx.state["adapter"] = adapter
    record = _Record()
    upstream_call = lambda ctx_, side, op, args: side.call(op, args)  # noqa: E731 - captured with the deadline

    def make_sides(config: Any) -> tuple[Any, Any, Any]:
        made = adapter.sides(ctx, config)
        model, upstream = made[0], made[1]
        return model, upstream, made[2] if len(made) > 2 else model

    def step(model: Any, upstream: Any, program: list[str], op: str | None, args: Any) -> None:
        _budget(ctx.options)
        if op is not None:
            program.append(call_line(op, args))
            a = upstream_answer(upstream_call, ctx, model, op, args) if adapter.both_upstream \
                else model_answer(model.call, op, args)
            b = upstream_answer(upstream_call, ctx, upstream, op, args)
        else:
            a = b = None
        ctx.count("compared")
        if isinstance(b, FAILED) or isinstance(a, FAILED):
            seen_a, seen_b = {"returned": a}, {"returned": b}
        else:
            seen_a = {"returned": a, **_observe(model, ctx, adapter.both_upstream)}
            seen_b = {"returned": b, **_observe(upstream, ctx, True)}
        difference = adapter.compare.difference(seen_a, seen_b)
        if difference is not None:
            if isinstance(b, DidNotReturn):
                record.hangs += 1
            record.divergence = {"input": {"program": list(program)}, "model": seen_a, "upstream": seen_b,
                                 "field": difference.path, "difference": difference.line(),
                                 "program": list(program)}
            if record.hangs > MAX_HANGS:
                raise _Abandon()
            raise LockstepDivergence(f"after {program[-1]}: {difference.line()}", record.divergence)

    machine = lockstep_class(adapter.start(ctx), make_sides, adapter.operations, step, {})
    prop = KvProperty(name=ctx.target.name, model=ctx.target.model, doc=ctx.target.doc, kind="stateful",
                      home=__name__, machine=lambda rec: machine)
    outcome = _hypothesis(prop, ctx, env, options, record, steps=adapter.steps)
    _conclude(outcome, record, ctx, result)


def _observe(side: Any, ctx: Context, upstream: bool) -> dict[str, Any]:
    if not upstream:
        return dict(side.observe())
    seen = upstream_answer(lambda ctx_: dict(side.observe()), ctx)
    return {"observe": seen} if isinstance(seen, FAILED) else seen


# -- the result -----------------------------------------------------------------------------------------

def _conclude(outcome: Any, record: _Record, ctx: Context, result: TargetResult) -> None:
    result.compared = ctx.counts.get("compared", 0)
    if record.divergence is not None:
        note = ""
        if outcome is None:
            note = (f"shrinking stopped after {MAX_HANGS} calls that did not return; the smallest hanging "
                    f"input found is shown")
        elif outcome.status == "error":
            note = ("this input diverged once and not when Hypothesis ran it again: the code under test (or "
                    "what it reads) is not deterministic on it")
        elif outcome.status == "passed":
            note = "diverged on one run only"
        if ctx.state.get("shrink_deadline") and isinstance(record.divergence.get("upstream"), DidNotReturn):
            note = "; ".join(t for t in (note, f"found under the {ctx.options.call_timeout:g} s deadline, shrunk "
                                              f"under {ctx.state['shrink_deadline']:g} s a call") if t)
        _record_divergence(result, record, note)
        return
    if outcome is not None and outcome.status != "passed":
        # the model or the adapter itself raised: a bug of kvsim, said as such (never a Hypothesis internal)
        result.status = "error"
        result.add_note(f"kvsim's model or adapter raised on an input (a bug in kvsim): {outcome.message}")


def _record_divergence(result: TargetResult, record: _Record, note: str) -> None:
    d = record.divergence
    assert d is not None
    more = {k: v for k, v in d.items() if k not in ("input", "model", "upstream", "difference", "known")}
    note = "; ".join(t for t in (d.get("known", ""), note) if t)
    result.diverge(d["input"], _shown(d["model"]), _shown(d["upstream"]), note, difference=d["difference"], **more)


def _shown(answer: Any) -> Any:
    return str(answer) if isinstance(answer, (Raised, DidNotReturn, Refused)) else answer


def _report_checks(adapter: Any, record: _Record, result: TargetResult) -> None:
    for check in getattr(adapter, "checks", ()):
        failed = record.failures.get(check.name)
        if failed is None and check.name not in record.ran:  # every upstream call raised or hung: nothing to check
            result.prop(check.name, "not run", "the code under test answered no input (it raised or hung), so the "
                        "property was never checked")
        elif failed is None:
            result.prop(check.name, "holds", f"finding {check.finding} not reproduced" if check.finding else "")
        else:
            shown, message = failed
            status = FINDING if check.finding else "fails"
            prefix = f"{check.finding}: " if check.finding else ""
            result.prop(check.name, status, prefix + message, input=shown)
