"""`kvsim conform ENGINE --mutants [N]`: how strong the checks are on this code, measured by mutation.

For each target, every mutant of its checked upstream definitions (`kvsim.engine.conformance.mutants`; N: a
sample of N spread over the code) is loaded in place of the real code, one at a time, and the target runs on
it. A mutant is *killed* when the target diverges (a divergence, a raise, a hang or a failing property, exit 1
of a normal run), *survives* when the target still conforms, and is *not loadable* when the mutated code cannot
be used (it does not load, or changes a checked signature: a normal run's exit 2, so not counted). A survivor
is *reached* when the unmutated run executed its line or the statement holding it (a weak check, or an
equivalent mutant) and *not reached* otherwise (an input gap). Mutants on the lines a target declares no input
reaches (`ConformTarget.unreached`, with the reason) are not made (counted as `unreached`). A survivor the
target's declaration documents (`ConformTarget.survivors`: an equivalent mutant, with the reason; matched by
definition, operator and text, and by the replacement and the source line where the declaration names them) is
listed as such and left out of the score.

score = killed / (mutants - not loadable - documented survivors). Exit 1 when a target has an undocumented
survivor, 2 when its unmutated run diverges or errs (nothing to measure against; a target not present or skipped
there is not measured and not counted), 3 when `--max-seconds` or a stop (Ctrl-C, SIGTERM) cut the run short, else 0: a
stop ends the mutant it came in (it is not counted), names the rest as not run and prints what ran, and the
command's kernel and real-import children end with it. Each mutant's calls run under a deadline of 50 times the unmutated run's slowest call
(at least 1 s, at most `--call-timeout`), so a mutant that hangs costs seconds, not the default deadline. A kernel
target's mutants run one after another in one kernel child (`triton_child.shared`: it loads each mutant afresh),
and each stops at its first divergence (the pinned inputs come first).
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from kvsim.app import junit
from kvsim.engine.conformance.linetrace import LineTrace, statement_of
from kvsim.engine.conformance.mutants import Mutant, mutants, sample
from kvsim.engine.interrupt import Interrupted, asked, stopping_on_signals
from kvsim.engine.progress import Progress

from .loader import mutated
from .run import run_targets, target_coverage, unreached_in, upstream_texts
from .source import EngineSource
from .targets import Options, descriptors

MUTANT_DEADLINE_FLOOR = 1.0
STOPPED = "stopped: a stop (Ctrl-C, SIGTERM) was asked"


@dataclass
class MutationResult:
    target: str
    status: str = "measured"  # measured / baseline diverges / baseline error / not present / skipped / incomplete
    mutants: int = 0
    killed: int = 0
    not_loadable: int = 0
    survivors: list[dict[str, Any]] = field(default_factory=list)
    documented: list[dict[str, Any]] = field(default_factory=list)
    not_run: int = 0
    unreached: int = 0  # mutants on lines the target declares no input reaches (`Unreached`): not made
    coverage: dict[str, Any] | None = None  # the unmutated run's coverage of the checked definitions
    seconds: float = 0.0
    note: str = ""

    @property
    def score(self) -> float | None:
        counted = self.mutants - self.not_loadable - len(self.documented) - self.not_run
        return round(100.0 * self.killed / counted, 1) if counted > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "score": self.score, "survived": len(self.survivors)}


def target_mutants(target: Any, source: EngineSource) -> list[Mutant]:
    return [m for upstream, text in upstream_texts(target, source) if upstream.checked_names
            for m in mutants(text, upstream.file, upstream.checked_names)]


def documented(target: Any, mutant: Mutant, text: str = "") -> str | None:
    """The reason of the first `Survivor` declaration covering `mutant` (`text`: its upstream file's text, where a
    declaration's `line` is matched), or None."""
    for survivor in target.survivors:
        if survivor.covers(mutant, text):
            return survivor.reason
    return None


def reached(mutant: Mutant, texts: dict[str, str], executed: set[tuple[str, int]]) -> bool:
    """Whether the unmutated run ran the statement the mutant's line is in (a probe records a statement's own
    line: `linetrace.statement_of`)."""
    owner = _statements(mutant.file, texts.get(mutant.file, ""))
    return (mutant.file, mutant.line) in executed or (mutant.file, owner.get(mutant.line, mutant.line)) in executed


@functools.lru_cache(maxsize=16)
def _statements(file: str, text: str) -> dict[int, int]:
    return statement_of(text) if text else {}


def measure(target: Any, source: EngineSource, options: Options, count: int) -> MutationResult:
    started = time.perf_counter()
    out = MutationResult(target.name)
    table = descriptors()
    trace = LineTrace(files=[u.file for u in target.upstream])
    try:
        (base,) = run_targets([target], source, table, replace(options, trace=trace))
    except Interrupted:
        out.status, out.note = "incomplete", STOPPED
        out.seconds = round(time.perf_counter() - started, 3)
        return out
    executed = trace.executed
    if base.status in ("conforms", "diverges"):
        out.coverage = target_coverage(target, source, executed)
    if base.status != "conforms":
        out.status = {"diverges": "baseline diverges", "not present": "not present",
                      "skipped": "skipped"}.get(base.status, f"baseline {base.status}")
        out.note = base.note or (base.divergences[0].get("difference", "") if base.divergences else "")
        out.seconds = round(time.perf_counter() - started, 3)
        return out
    found = target_mutants(target, source)
    read = list(upstream_texts(target, source))
    texts = {upstream.file: text for upstream, text in read}
    unreached = {(upstream.file, line) for upstream, text in read
                 for lines in unreached_in(target, upstream, text, every_line=True).values() for line in lines}
    reachable = [m for m in found if (m.file, m.line) not in unreached]
    out.unreached = len(found) - len(reachable)
    chosen = sample(reachable, count) if count else reachable
    out.mutants = len(chosen)
    deadline = max(MUTANT_DEADLINE_FLOOR, 50 * base.slowest_call)
    deadline = min(deadline, options.call_timeout) if options.call_timeout else deadline
    quick = replace(options, call_timeout=deadline, shrink=False)
    progress = Progress(len(chosen), f"mutants of {target.name}")
    for i, mutant in enumerate(chosen):
        if options.until is not None and time.monotonic() >= options.until or asked():
            out.not_run = len(chosen) - i
            out.status = "incomplete"
            out.note = STOPPED if asked() else ""
            break
        progress.step(mutant.label)
        try:
            with mutated(mutant):
                (result,) = run_targets([target], source, table, quick)
        except Interrupted:  # the stop came while this mutant ran: it and the rest are not run
            out.not_run, out.status, out.note = len(chosen) - i, "incomplete", STOPPED
            break
        row = {**mutant.to_json(), "label": mutant.label, "reached": reached(mutant, texts, executed)}
        if result.status == "diverges":
            out.killed += 1
        elif result.status in ("error", "not present"):
            out.not_loadable += 1
        elif result.status in ("incomplete", "not run"):
            out.not_run += 1
        else:
            reason = documented(target, mutant, texts.get(mutant.file, ""))
            (out.documented if reason else out.survivors).append({**row, **({"reason": reason} if reason else {})})
    progress.close()
    out.seconds = round(time.perf_counter() - started, 3)
    return out


def format_mutation(source: EngineSource, results: Sequence[MutationResult]) -> str:
    lines = [f"kvsim conform {source.engine} --mutants: {source.label} from {source.origin}",
             f"  {'target':<40} {'mutants':>7} {'killed':>6} {'survived':>8} {'score':>6}  seconds"]
    for r in results:
        score = "-" if r.score is None else f"{r.score:g}%"
        lines.append(f"  {r.target:<40} {r.mutants:>7} {r.killed:>6} {len(r.survivors):>8} {score:>6}  "
                     f"{r.seconds:7.1f}" + ("" if r.status == "measured" else f"  {r.status}"))
        if r.note:
            lines.append(f"      {r.note}")
        for s in r.survivors:
            where = "reached" if s["reached"] else "not reached (no input runs this line)"
            lines.append(f"      survived: {s['label']} [{where}]")
        for s in r.documented:
            lines.append(f"      documented: {s['label']}: {s['reason']}")
        if r.not_loadable:
            lines.append(f"      {r.not_loadable} mutants could not be loaded (not counted)")
        if r.not_run:
            lines.append(f"      {r.not_run} mutants not run: {'a stop' if r.note == STOPPED else '--max-seconds'}")
    return "\n".join(lines)


def cmd_mutants(args: Any, source: EngineSource, chosen: Sequence[Any], options: Options) -> int:
    results = []
    with stopping_on_signals():  # the first Ctrl-C or SIGTERM asks a stop: what ran is reported
        for t in chosen:
            results.append(MutationResult(t.name, status="incomplete", note=STOPPED) if asked()
                           else measure(t, source, options, args.mutants))
    doc = {"engine": source.engine, "version": source.version, "origin": source.origin,
           "mutation": [r.to_json() for r in results]}
    if args.junit:
        junit.write(args.junit, "kvsim conform --mutants", [junit.mutation(doc)])
    print(json.dumps(doc, indent=1) if args.json else format_mutation(source, results))
    if any(r.status.startswith("baseline") for r in results):
        return 2
    if any(r.survivors for r in results):
        return 1
    return 3 if any(r.status == "incomplete" for r in results) else 0
