"""A bug report an engine team can act on, as Markdown: `kvsim repro ID --report [--out FILE]`.

The report is built from data only: the `BugReport` (its upstream metadata:
affected releases, upstream files and functions, harm and consequence, the
fix, per-release verdicts), the counterexample `reproduce` finds now, the
model's own words for each action (`describe(action)` in the model package's
`actions` module, where it has one), the violated invariant's or property's
doc, and a model run on the variant that has the fix. Nothing in it is timed,
so the same catalog gives the same text (docs/findings/ is generated from it
and checked by a test).
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import fields
from typing import Any, Callable

from ..engine.canon import to_jsonable
from ..engine.errors import ConfigError
from ..engine.explore import ExploreOptions, explore
from ..engine.params import param_args
from ..engine.registry import REGISTRY, BugReport
from ..engine.system import transition
from .counterexample import match_path
from .repro import FIXED_CHECK_EXAMPLES, BugRun, ReproResult, baseline_variant, reproduce

LIVENESS_DOC = "from every reachable state some run concludes every room on both sides (no hang)"


def describer(model: Any) -> tuple[Callable[[Any], str] | None, dict | None]:
    """The model package's `actions.describe` and `actions.ACTIONS`, where it has them."""
    if model.system is None:
        return None, None
    package = model.system.__module__.rsplit(".", 1)[0]
    try:
        actions = importlib.import_module(f"{package}.actions")
    except ImportError:
        return None, None
    return getattr(actions, "describe", None), getattr(actions, "ACTIONS", None)


def resolved(bug: BugReport, result: ReproResult | None = None) -> BugRun:
    """The bug report as `reproduce` resolved it (its result carries it), else resolved here (a library caller)."""
    if result is not None and result.run is not None:
        return result.run
    return BugRun.resolve(bug, REGISTRY)


def steps(bug: BugReport, trace: list, run: BugRun | None = None) -> list[tuple[str, list[str]]]:
    """The path as (action in words, [what it did in words]), replayed through the bug's system: each saved
    action is matched to the system's own enabled action (`counterexample.match_path`), whose nested records
    the step compares, not to the JSON form's lists."""
    from ..engine.actions import decode

    run = run or resolved(bug)
    model = run.model
    describe, types = describer(model)
    system = model.build_system(run.variant, dict(bug.params))
    say = describe or repr
    state, taken, failure = match_path(system, trace)
    if failure:
        return [(say(decode(a, types) if types else a), []) for a in trace]
    out = []
    for action in taken:
        state, effects = transition(system, state, action)
        said = [describe(e) for e in effects] if describe else []
        out.append((say(action), [s for s in said if s]))
    return out


def check_doc(bug: BugReport, run: BugRun | None = None) -> str:
    """The violated invariant (or property) in one sentence: its doc."""
    run = run or resolved(bug)
    if run.prop is not None:
        return run.prop.doc.strip()
    system = run.model.build_system(run.variant, dict(bug.params))
    if bug.invariant == getattr(system, "liveness", None):
        return getattr(system, "liveness_doc", LIVENESS_DOC)  # a model whose goal is not rooms names its own
    inv = next(i for i in system.invariants if i.name == bug.invariant)
    return inv.doc.strip() or bug.invariant


def fix_run(bug: BugReport, result: ReproResult, seed: int = 0) -> tuple[str | None, bool | None]:
    """(the fix variant, whether the bug's check holds on it); (None, None) where no fix is modelled."""
    variant = baseline_variant(bug)
    if variant is None:
        return None, None
    if result.fixed_passes is None:  # a result `reproduce` did not make: it runs the fix side wherever there is one
        result = reproduce(resolved(bug, result), seed)
    return variant, result.fixed_passes


def checked(result: ReproResult) -> str:
    """What the fix side checked, where `reproduce` ran it: `on 215 cases (...)`, `in the 3,427 states searched`."""
    n = result.fixed_examples
    if n is None:
        return ""
    if result.bug.property is None:
        return f" in the {n:,} states searched"
    return (f" on {n:,} cases (the {result.examples:,} the search tried, the shrunk counterexample among them, "
            f"then the pinned ones and {FIXED_CHECK_EXAMPLES} generated)")


def commands(bug: BugReport, run: BugRun | None = None) -> list[str]:
    """The exact commands that reproduce it: repro, then the search that saves the counterexample, and its replay."""
    file = f"{bug.id}.json"
    params = param_args(bug.params)
    lines = [f"kvsim repro {bug.id}"]
    if bug.property is not None:
        lines.append(f"kvsim check {bug.model} --variant {bug.variant} --property {bug.property} "
                     f"--max-examples {bug.max_examples} {params} --save {file}".replace("  ", " "))
    else:
        run = run or resolved(bug)
        system = run.model.build_system(run.variant, dict(bug.params))
        liveness = bug.invariant == getattr(system, "liveness", None)
        first = explore(system, ExploreOptions(check_liveness=liveness)).violations
        flag = "" if liveness else " --no-liveness"
        lines.append(f"kvsim explore {bug.model} --variant {bug.variant}{flag} {params} --save {file}".replace("  ", " "))
        if not first or first[0].property != bug.invariant:
            lines.append(f"# note: the first violation explore saves here is {first[0].property if first else 'none'}")
    lines.append(f"kvsim replay {file}")
    return lines


def _verdict_cell(v: Any) -> str:
    if v.state == "fixed":
        text = f"fixed in {v.fixed_in}" if v.fixed_in else "fixed"
    else:
        text = v.state
    return f"**{text}**" + (f": {v.reason}" if v.reason else "")


def render(bug: BugReport, result: ReproResult, seed: int = 0) -> str:
    """The Markdown report of one bug report, from `reproduce(bug)`'s result."""
    run = resolved(bug, result)
    out: list[str] = [f"# {bug.id}", ""]
    out += [f"- **Status:** {bug.status}", f"- **Model:** `{bug.model}`, variant `{bug.variant}`"
            + (", parameters " + ", ".join(f"`{k}={v}`" for k, v in bug.params.items()) if bug.params else ""),
            f"- **Source:** {bug.source}", f"- **Reproduced now:** {'yes' if result.reproduced else 'NO'}", ""]
    out += ["## Summary", "", bug.summary, ""]
    out += ["## Affected releases", ""]
    if bug.affected:
        out += [bug.affected, ""]
    if bug.verdicts:
        out += ["| release | verdict |", "|---|---|"]
        out += [f"| {v.release} | {_verdict_cell(v)} |" for v in bug.verdicts] + [""]
    if not bug.affected and not bug.verdicts:
        out += ["Not recorded.", ""]
    out += ["## Upstream code", ""]
    if bug.upstream_files:
        for site in bug.upstream_files:
            fns = ", ".join(f"`{f}`" for f in site.functions)
            out.append(f"- `{site.path}`: {fns}" + (f": {site.role}" if site.role else ""))
        out.append("")
    else:
        out += [f"See the source: {bug.source}.", ""]
    out += ["## Minimal counterexample", ""]
    ce = result.counterexample
    if not result.reproduced or ce is None:
        out += ["The check did not fail: no counterexample.", ""]
    elif "trace" in ce:
        where = f"of `{bug.model}` on variant `{bug.variant}`"
        how = (f"exhaustive search {where} ({result.examples} states)" if ce.get("kind") == "hang" else
               f"a breadth-first search {where}, stopped at the first violating state ({result.examples} states "
               f"searched, so no shorter path exists)")
        out += [f"Found by {how}; {len(ce['trace'])} steps from the initial state:", ""]
        for n, (action, effects) in enumerate(steps(bug, ce["trace"], run), 1):
            out.append(f"{n}. {action}" + (f" — {'; '.join(effects)}" if effects else ""))
        what = "a hang: no done state is reachable from here" if ce.get("kind") == "hang" else "the invariant fails here"
        out += ["", f"After step {len(ce['trace'])}, {what}:", "", f"> {result.message}", ""]
    else:
        out += [f"Found by Hypothesis on `{bug.model}` variant `{bug.variant}` (shrunk case):", "", "```json",
                json.dumps(to_jsonable(ce.get("case", ce)), sort_keys=True, indent=1), "```", "",
                f"> {result.message}", ""]
    out += ["## Violated invariant", "", f"`{bug.check}`: {check_doc(bug, run)}", ""]
    out += ["## Consequence", ""]
    out += [(f"**{bug.harm}**. " if bug.harm else "") + (bug.consequence or bug.summary), ""]
    out += ["## Fix", ""]
    variant, holds = fix_run(bug, result, seed)
    if bug.fix:
        out += [bug.fix, ""]
    if variant is None:
        out += ["No fix variant is modelled: no model run shows a fix removing the violation.", ""]
    else:
        flags = _flag_diff(run.variant, run.baseline)
        if bug.fix_variant or bug.status != "open upstream":
            out += [f"Model run with the fix: variant `{variant}`" + (f" (flags {flags})" if flags else "") + ": "
                    + (f"`{bug.check}` holds{checked(result)}, the violation is gone." if holds
                       else f"`{bug.check}` STILL FAILS."), ""]
        else:  # a finding on a later release with no modelled fix: `fixed` is the older code, not a fix
            out += [f"No fix variant is modelled. On variant `{variant}` (without flags {flags}) the same search "
                    + (f"finds no violation of `{bug.check}`." if holds else f"also violates `{bug.check}`."), ""]
    out += ["## Reproduce", "", "```sh", *commands(bug, run), "```", ""]
    if bug.note:
        out += ["## Notes", "", bug.note, ""]
    out += ["---", "", f"Generated by `kvsim repro {bug.id} --report`; do not edit by hand."]
    return "\n".join(out) + "\n"


def _flag_diff(before: Any, after: Any) -> str:
    names = [f.name for f in fields(after) if f.name != "name" and getattr(before, f.name, None) != getattr(after, f.name)]
    return ", ".join(f"`{n}`" for n in names)


def report(bug: BugReport, seed: int = 0) -> tuple[ReproResult, str]:
    result = reproduce(bug, seed=seed)
    return result, render(bug, result, seed)


def to_folder(out: str, every: bool) -> bool:
    """Whether `repro --report --out OUT` writes a folder of reports (OUT/ID.md): with --all, or OUT a folder."""
    return every or os.path.isdir(out) or out.endswith(os.sep)


def write_reports(results: list[ReproResult], out: str | None, folder: bool = False, seed: int = 0) -> list[str]:
    """`repro --report`: one report per result, to stdout, to the file `out`, or (`folder`, or `out` a folder or
    ending in a separator) to `out`/ID.md. Returns the paths written."""
    texts = [(r.bug.id, render(r.bug, r, seed)) for r in results]
    if not out:
        print("\n".join(text for _, text in texts), end="")
        return []
    folder = to_folder(out, folder)
    paths = []
    try:
        if folder:
            os.makedirs(out, exist_ok=True)
        for bug_id, text in texts:
            path = os.path.join(out, f"{bug_id}.md") if folder else out
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            paths.append(path)
    except OSError as exc:
        raise ConfigError("--out", "a writable file or folder", out, exc.strerror or "") from None
    return paths
