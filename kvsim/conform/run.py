"""Running conform targets on one source: the environment the engine's runner needs, built once per target.

The engine runs every target (`kvsim.engine.conformance.runner.run_target`); this module gives it what only
the application layer knows: how the declared upstream files are read (`load_upstream`: absent file or
definition -> "not present"; the loader otherwise), how a kernel child is started, the model's descriptor,
and whether the source is a release or the user's own tree ("code under test"). It also captures what the
engine's code logs and warns while it loads and runs (vLLM's "package was not found"), kept with the results
and shown only beside a failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import warnings
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Iterator, Sequence

from kvsim.engine.conformance.adapters import Lockstep
from kvsim.engine.conformance.declare import ConformTarget, Upstream
from kvsim.engine.conformance.linetrace import LineTrace, coverage, documented_lines, statement_lines
from kvsim.engine.conformance.result import TargetResult
from kvsim.engine.conformance.runner import Env, NotPresent, Options, TargetSkipped, run_target
from kvsim.engine.errors import KvsimError

from .loader import load_definitions, names_in
from .source import EngineSource


def subject(source: EngineSource) -> str:
    """How reports name the code checked: a release is "upstream"; the user's own tree "code under test"."""
    return "upstream" if source.origin.startswith("wheel ") and source.version else "code under test"


def load_upstream(source: EngineSource, upstream: Upstream, **loading: Any) -> SimpleNamespace:
    """The declared definitions of one file; NotPresent when the source lacks the file or a name (in process,
    `kvsim.testing`, the caller's answer decides what is there)."""
    from .loader import ANSWER

    if ANSWER.get() is not None:
        return load_definitions(source.file(upstream.file), list(upstream.names), where=upstream.file,
                                version=source.label, **loading)
    if not source.has(upstream.file):
        if upstream.optional:
            return SimpleNamespace()
        raise NotPresent(f"{upstream.file}: absent in {source.label}")
    path = source.file(upstream.file)
    present = names_in(path)
    missing = [n for n in upstream.names if n not in present]
    if missing:
        raise NotPresent(f"{upstream.file}:{','.join(missing)}: absent in {source.label}")
    return load_definitions(path, list(upstream.names), where=upstream.file, version=source.label, **loading)


def environment(target: ConformTarget, source: EngineSource, descriptor: Any, options: Options) -> Env:
    def start_child() -> Any:
        from .loader import MUTANT
        from .triton_child import shared

        return shared(source, options.device, timeout=options.call_timeout, mutant=MUTANT.get(),
                      trace=options.trace)

    @contextlib.contextmanager
    def start_installed(driver: str) -> Iterator[Any]:
        from .installed import prepare
        from .installed_child import shared
        from .loader import MUTANT

        if not source.version:
            raise TargetSkipped(f"{source.label}: a real import needs a release (--version), not a tree")
        child = shared(prepare(source.engine, source.version), driver, timeout=options.call_timeout)
        try:
            child.configure(MUTANT.get(), options.trace, target.files)
            yield child
        finally:
            child.trace = None

    return Env(source=source, load=lambda upstream, **kw: load_upstream(source, upstream, **kw),
               descriptor=descriptor, start_child=start_child, start_installed=start_installed,
               subject=subject(source))


@dataclass
class Captured:
    """What the code under test logged or warned while one target ran."""

    lines: list[str] = field(default_factory=list)


class _Handler(logging.Handler):
    def __init__(self, into: Captured) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.lines.append(f"{record.levelname.lower()} {record.name}: {record.getMessage()}")


@contextlib.contextmanager
def captured() -> Iterator[Captured]:
    into = Captured()
    handler = _Handler(into)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            yield into
    finally:
        root.removeHandler(handler)
    into.lines += [f"warning {w.category.__name__}: {w.message}" for w in seen
                   if not issubclass(w.category, ResourceWarning)]


def run_targets(targets: Sequence[ConformTarget], source: EngineSource, descriptors: Any, options: Options,
                *, measure: bool = False, workers: int = 1) -> list[TargetResult]:
    """Each target on `source`, within the run's budget, the results in the targets' order; with `measure`, each
    result's coverage of its checked definitions; with `workers` > 1, on that many forked worker processes
    (`batches`)."""
    if workers > 1 and len(targets) > 1 and hasattr(os, "fork"):
        return _on_workers(list(targets), source, descriptors, options, measure, workers)
    results = []
    for target in targets:
        trace = LineTrace(files=[u.file for u in target.upstream]) if measure else options.trace
        run_options = replace(options, trace=trace)
        with captured() as logged:
            result = run_target(target, environment(target, source, descriptors[target.model], run_options),
                                run_options)
        if logged.lines and result.status not in ("conforms", "not present", "skipped"):
            result.logged = sorted(set(logged.lines))
        if measure and trace is not None and result.status in ("conforms", "diverges", "incomplete"):
            result.coverage = target_coverage(target, source, trace.executed)
        results.append(result)
    return results


def batches(targets: Sequence[ConformTarget]) -> list[list[int]]:
    """The targets' indexes as a worker runs them, one batch after another, the longer kinds first so that the last
    batch to start is a short one: the targets driving the release's real-import child together (a worker imports a
    release once, about 10 s, for all its drivers), then each kernel target (a worker's one kernel child serves
    every kernel target it runs: triton is imported once a worker), then each lockstep (a stateful search, calls
    many a program), then the rest, each kind in the targets' order."""
    installed: list[int] = []
    kernel: list[list[int]] = []
    lockstep: list[list[int]] = []
    rest: list[list[int]] = []
    for i, target in enumerate(targets):
        try:
            adapter = target.resolve_adapter()
        except KvsimError:  # its run reports the error
            rest.append([i])
            continue
        if adapter.installed:
            installed.append(i)
        else:
            (kernel if adapter.kernel else lockstep if isinstance(adapter, Lockstep) else rest).append([i])
    return [*([installed] if installed else []), *kernel, *lockstep, *rest]


# what a forked worker runs from: (targets, source, descriptors, options, measure), set before the workers fork
_JOB: tuple[Any, ...] | None = None


def _run_batch(indexes: list[int]) -> tuple[list[tuple[int, TargetResult]], BaseException | None]:
    """One batch in a worker: each result with its index, and what stopped the batch (an interrupt), if anything
    did (sent back as a value: a pool's worker that raises it would die with its batch)."""
    assert _JOB is not None
    targets, source, descriptors, options, measure = _JOB
    done: list[tuple[int, TargetResult]] = []
    try:
        for i in indexes:
            done.append((i, run_targets([targets[i]], source, descriptors, options, measure=measure)[0]))
    except KeyboardInterrupt as exc:
        return done, exc
    return done, None


def _worker_start() -> None:
    """A worker's start: signals as `asking_worker_signals` says, its kernel and real-import children closed when
    it ends, and killed when it is ended (SIGTERM: the run's budget was spent while it was busy)."""
    from multiprocessing.util import Finalize

    from kvsim.engine.interrupt import asking_worker_signals, release_held

    from . import installed_child, triton_child

    asking_worker_signals()
    signal.signal(signal.SIGTERM, _end_worker)
    release_held()  # held since the fork (`_on_workers`): a stop passed on meanwhile reaches these handlers now
    Finalize(None, triton_child.close_shared, exitpriority=10)
    Finalize(None, installed_child.close_shared, exitpriority=10)


def _end_worker(signum: int, frame: Any) -> None:
    from . import installed_child, triton_child
    from .child import kill

    for shared in (triton_child._SHARED, installed_child._SHARED):
        for child in list(shared.values()):
            if child.process is not None:
                kill(child.process)
    os._exit(128 + signum)


GRACE_S = 2.0  # seconds past the run's budget after which a worker still busy (an import, a call) is ended


def _on_workers(targets: list[ConformTarget], source: EngineSource, descriptors: Any, options: Options,
                measure: bool, workers: int) -> list[TargetResult]:
    """The batches on `workers` forked processes, the results in the targets' order. A stop asked of this
    process is passed on to the workers as SIGINT (Ctrl-C reaches them already); each stops at its next check.
    A batch still running `GRACE_S` after the run's budget (a release's import does not stop between calls) is
    ended with its worker, its targets `incomplete`."""
    import multiprocessing as mp

    from kvsim.engine.interrupt import asked, held_across_forks

    global _JOB
    _JOB = (targets, source, descriptors, options, measure)
    found: dict[int, TargetResult] = {}
    stopped: BaseException | None = None
    try:
        chunks = batches(targets)
        with held_across_forks():  # until each worker has its handlers (`_worker_start`)
            pool = mp.get_context("fork").Pool(min(workers, len(chunks)), initializer=_worker_start)
        with pool:
            pending = {k: pool.apply_async(_run_batch, (chunk,)) for k, chunk in enumerate(chunks)}
            passed = False
            while pending:
                next(iter(pending.values())).wait(0.1)
                for k in [k for k, r in pending.items() if r.ready()]:
                    done, exc = pending.pop(k).get()
                    found.update(done)
                    stopped = stopped or exc
                if asked() and not passed:
                    passed = True
                    for worker in mp.active_children():
                        os.kill(worker.pid, signal.SIGINT)
                if pending and options.until is not None and time.monotonic() > options.until + GRACE_S:
                    break
            if pending:
                pool.terminate()  # (each worker kills its children as it goes: `_end_worker`)
            else:
                pool.close()  # the workers end on their own, closing their children (`_worker_start`)
            pool.join()
    finally:
        _JOB = None
    if stopped is not None:
        raise stopped
    return [found[i] if i in found else _ended(targets[i], source) for i in range(len(targets))]


def _ended(target: ConformTarget, source: EngineSource) -> TargetResult:
    result = TargetResult(target.name, source.version, engine=target.engine, files=list(target.files),
                          subject=subject(source))
    result.status = "incomplete"
    result.note = "--max-seconds was spent while its worker ran it (the worker was ended)"
    return result


def upstream_texts(target: ConformTarget, source: EngineSource) -> Iterator[tuple[Upstream, str]]:
    """(upstream, its file's text) for each of the target's upstream files this source has, each read once."""
    for upstream in target.upstream:
        if source.has(upstream.file):
            yield upstream, source.file(upstream.file).read_text(encoding="utf-8", errors="replace")


def unreached_in(target: ConformTarget, upstream: Upstream, text: str, *,
                 every_line: bool = False) -> dict[str, set[int]]:
    """{checked definition: the statement lines (`every_line`: all lines) its `unreached` declarations name} in
    this upstream file's text."""
    found: dict[str, set[int]] = {}
    for checked in upstream.checked_names:  # an Unreached may name a method of a checked class
        mine = [u for u in target.unreached if u.definition == checked or u.definition.startswith(checked + ".")]
        lines = set().union(*documented_lines(text, mine, every_line=every_line).values()) if mine else set()
        if lines:
            found[checked] = lines
    return found


def target_coverage(target: ConformTarget, source: EngineSource, executed: set[tuple[str, int]]) -> dict[str, Any]:
    """The coverage of a target's checked definitions by the lines a run `executed`, its declared unreached
    lines left out of the count (the one place `--coverage` and `--mutants` assemble it)."""
    executable: dict[str, dict[str, set[int]]] = {}
    unreached: dict[str, dict[str, set[int]]] = {}
    for upstream, text in upstream_texts(target, source):
        executable.setdefault(upstream.file, {}).update(statement_lines(text, upstream.checked_names))
        unreached.setdefault(upstream.file, {}).update(unreached_in(target, upstream, text))
    return coverage(executed, executable, unreached)


def deadline(max_seconds: float | None) -> float | None:
    return None if not max_seconds else time.monotonic() + max_seconds
