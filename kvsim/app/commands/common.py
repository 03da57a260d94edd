"""What the commands share: the exit codes, the options several take, the text helpers, and the budget
(`--max-seconds` held during a command's set-up, the work item by item until a stop).

A command's document is the JSON document `--json` prints; what only its text needs (an option as given, a
time not rounded, the terminal) rides under the key `VIEW`, which the dispatcher drops before printing JSON.
"""

from __future__ import annotations

import argparse
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Sequence

from ...engine.canon import canonical_json
from ...engine.descriptor import ModelDescriptor
from ...engine.errors import ConfigError
from ...engine.interrupt import INTERRUPT, BudgetExceeded, Interrupted, asked, stopped_by
from ...engine.progress import Progress
from ...engine.sim import DEFAULT_MAX_EVENTS, DEFAULT_MAX_SECONDS
from .. import catalog
from ..argtypes import positive_float, positive_int

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3
VARIANT_HELP = "the model variant: fixed (today's upstream) or a pre-fix variant (kvsim list MODEL) (default: fixed)"

# --max-seconds defaults: the long suites (check, repro, oracle) get an hour, a search or one run ten minutes
SUITE_MAX_SECONDS = 3600.0
RUN_MAX_SECONDS = DEFAULT_MAX_SECONDS
FUZZ_MAX_MINUTES = 10_080  # a week: the longest --minutes of kvsim fuzz

VIEW = "_text"  # the document's part only the text reads; never printed as JSON

# while a command sets its work up ("depth" > 0), an alarm is held ("held"): the work then stops at its first item
SETUP = {"depth": 0, "held": False}


def view(doc: dict[str, Any]) -> dict[str, Any]:
    """What the text of `doc` needs beyond its JSON keys."""
    return doc[VIEW]


def public(doc: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: `doc` without its view."""
    return {k: v for k, v in doc.items() if k != VIEW}


# -- options ---------------------------------------------------------------------------------------

def model_option(p: argparse.ArgumentParser, meaning: str) -> None:
    """The model named (`meaning`: what kind) and its `--variant`."""
    p.add_argument("model", help=meaning)
    p.add_argument("--variant", default="fixed", help=VARIANT_HELP)


def suite_options(p: argparse.ArgumentParser) -> None:
    """The last options of the long suites (check, repro, oracle): `--junit` and their hour of `--max-seconds`."""
    junit_option(p)
    max_seconds_option(p, SUITE_MAX_SECONDS)


def max_seconds_option(p: argparse.ArgumentParser, default: float) -> None:
    p.add_argument("--max-seconds", type=positive_float("--max-seconds"), default=default, metavar="S",
                   help="wall-clock work budget: stop cleanly at it with what was found so far, and say so "
                        "(exit 3 if nothing was found) (default: %(default)s)")


def max_events_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-events", type=positive_int("--max-events"), default=DEFAULT_MAX_EVENTS, metavar="N",
                   help="simulated events budget: the run stops cleanly after N events, incomplete "
                        "(exit 3 if nothing was found) (default: %(default)s)")


def junit_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML to FILE for CI: one "
                   "testcase per check, a violation as a failure with its counterexample and the kvsim line "
                   "that replays it (stdout is unchanged) (default: none)")


def model_params_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="model parameter (repeatable); `kvsim list --json` and a wrong name list them")
    p.add_argument("--backend", help="a model with a `backend` parameter (pd-protocol): shorthand for "
                                     "--param backend=NAME; otherwise the kernel backend of the model's kernel "
                                     "properties (torch-cpu, cpu-shim, cpu-shim-asan, torch-cuda, cupy-cuda)")


def param_values(args: argparse.Namespace, model: ModelDescriptor | None = None) -> list[str]:
    """`--param` values, with `--backend` as `backend=` where the model has such a parameter (`check` takes it as
    the kernel backend of the others, `check.kernel_backend`; elsewhere it is refused for them, never ignored)."""
    takes_backend = model is None or any(s.name == "backend" for s in model.params + model.sim_params)
    if args.backend is not None and not takes_backend and args.command != "check":
        with_backend = ", ".join(m.name for m in catalog.models().models.values()
                                 if any(s.name == "backend" for s in m.params + m.sim_params))
        raise ConfigError("--backend", f"a model with a backend parameter ({with_backend}); model {model.name} has "
                                       "none", args.backend)
    backend = [f"backend={args.backend}"] if args.backend is not None and takes_backend else []
    return list(args.param) + backend


# -- text --------------------------------------------------------------------------------------------

def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def short(value: Any, limit: int = 90) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str) -> str:
    """`text` with every unprintable character (newline, U+001E, U+2028 ... from user input) escaped: one line."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def stopped_early(stopped: str, seconds: float) -> str:
    """What cut a command short, in words (`seconds`: its --max-seconds)."""
    return f"--max-seconds {seconds:g} ran out" if stopped == "max-seconds" else \
        f"{stopped_by(stopped)} stopped it"


# -- the budget ----------------------------------------------------------------------------------------

def disarm() -> None:
    """The work is done: the output that follows is not cut short by --max-seconds."""
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        signal.setitimer(signal.ITIMER_REAL, 0)


@contextmanager
def setup():
    """The command's set-up (its catalog, its list of work): a --max-seconds alarm in it is held until it is done,
    and then cuts the work short at its first item (`each`), which reports what did not run in the command's
    own document."""
    SETUP["depth"] += 1
    try:
        yield
    finally:
        SETUP["depth"] -= 1


def each(items: Sequence[Any], name: Callable[[Any], str], run: Callable[[Any], Any],
         progress: Progress) -> tuple[list[Any], list[str], str | None]:
    """`run(item)` for each item until --max-seconds or an interrupt stops the command: (the results, the names
    of the items not run, "max-seconds" / "interrupt" / None). An item the stop came in is not run: a run that
    saw it may be cut short (a Hypothesis run ends at its next example, a search at its next check)."""
    results: list[Any] = []
    for i, item in enumerate(items):
        try:
            if SETUP["held"]:
                raise BudgetExceeded()
            if asked():
                raise Interrupted()
            progress.step(name(item))
            result = run(item)
            if asked():
                raise Interrupted()
            results.append(result)
        except (BudgetExceeded, Interrupted) as exc:  # what ran so far is reported, the rest is named as not run
            disarm()
            return results, [name(x) for x in items[i:]], "max-seconds" if isinstance(exc, BudgetExceeded) \
                else INTERRUPT
    return results, [], None


def each_forked(items: Sequence[Any], name: Callable[[Any], str], run: Callable[[Any], Any], progress: Progress,
                workers: int, rebuild: Callable[[Any, Any], Any],
                first: Callable[[Any], Any] | None = None) -> tuple[list[Any], list[str], str | None,
                                                                    list[dict[str, str]]]:
    """`each` on `workers` forked processes (`kvsim.app.forked`): `run(item)` there, `rebuild(item, value)` here
    (a result crosses as plain values), in the items' order. An item whose run raised, or whose worker died,
    is an error (`{"id": name, "error": one line}`), and the others still run; a stop keeps the results handed
    back so far, in order, and names the rest as not run. `first`, where given, is a sort key of the order the
    items are handed out in (the least first: the dearer ones, so that the items the workers end on are short
    and neither waits long for the other); the results, errors and names not run keep the items' order."""
    from ..forked import ordered

    order = sorted(range(len(items)), key=lambda i: first(items[i])) if first is not None else range(len(items))
    results: dict[int, Any] = {}
    errors: dict[int, dict[str, str]] = {}
    finished = 0

    def in_order() -> tuple[list[Any], list[dict[str, str]]]:
        return [results[i] for i in sorted(results)], [errors[i] for i in sorted(errors)]

    try:
        if SETUP["held"]:
            raise BudgetExceeded()
        for j, ok, value in ordered(len(items), lambda j: run(items[order[j]]), workers):
            i = order[j]
            progress.step(name(items[i]))
            if ok:
                results[i] = rebuild(items[i], value)
            else:
                errors[i] = {"id": name(items[i]), "error": value}
            finished = j + 1
    except (BudgetExceeded, Interrupted) as exc:
        disarm()
        stop = "max-seconds" if isinstance(exc, BudgetExceeded) else INTERRUPT
        made, failed = in_order()
        return made, [name(items[i]) for i in sorted(order[finished:])], stop, failed
    made, failed = in_order()
    return made, [], None, failed
