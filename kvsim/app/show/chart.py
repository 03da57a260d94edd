"""The drawable forms of a counterexample: a sequence chart of a path, or a table of a data case."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Sequence

from ...engine.canon import canonical_json, to_jsonable
from ..counterexample import match_path


@dataclass(frozen=True)
class Arrow:
    """One message or call at a step; `sender == receiver` is a step on one lifeline (a local action)."""

    step: int  # 1-based: the action's position on the path
    sender: str
    receiver: str
    label: str
    fault: bool = False

    @property
    def local(self) -> bool:
        return self.sender == self.receiver

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "sender": self.sender, "receiver": self.receiver, "label": self.label,
                "fault": self.fault}


@dataclass
class SequenceChart:
    title: str
    lifelines: tuple[str, ...]
    arrows: tuple[Arrow, ...]
    steps: int  # actions on the drawn path
    marked_step: int | None  # the step after which the check fails (0: in the initial state), None: it never does
    check: str  # the invariant (or liveness goal) that fails
    verdict: str  # the failure in words
    actors: str = "model"  # "model": the model's chart hook named the actors; "action kinds": the fallback
    first_step: int = 1  # the number of the first drawn step (a window of a long trace)
    replay: str = ""  # the command that re-runs it
    notes: list[str] = field(default_factory=list)

    @property
    def faults(self) -> tuple[Arrow, ...]:
        return tuple(a for a in self.arrows if a.fault)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "sequence", "title": self.title, "lifelines": list(self.lifelines),
                "arrows": [a.to_json() for a in self.arrows], "steps": self.steps, "first_step": self.first_step,
                "marked_step": self.marked_step, "check": self.check, "verdict": self.verdict, "actors": self.actors,
                "replay": self.replay, "notes": list(self.notes)}


@dataclass
class CaseTable:
    """A data property's shrunk input: one row per field (nested fields as dotted names)."""

    title: str
    check: str
    verdict: str
    rows: list[tuple[str, str]]
    replay: str = ""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "table", "title": self.title, "check": self.check, "verdict": self.verdict,
                "rows": [list(r) for r in self.rows], "replay": self.replay, "notes": list(self.notes)}


def from_json(doc: dict[str, Any]) -> SequenceChart | CaseTable:
    """The drawing again from its `to_json` document (a saved `kvsim show --json`, say)."""
    if doc["kind"] == "sequence":
        return SequenceChart(doc["title"], tuple(doc["lifelines"]), tuple(Arrow(**a) for a in doc["arrows"]),
                             doc["steps"], doc["marked_step"], doc["check"], doc["verdict"], doc["actors"],
                             doc["first_step"], doc["replay"], list(doc["notes"]))
    return CaseTable(doc["title"], doc["check"], doc["verdict"], [tuple(r) for r in doc["rows"]], doc["replay"],
                     list(doc["notes"]))


def chart_hook(system: Any) -> ModuleType | None:
    """The model's chart module (`<the system's package>.chart` with `lifelines` and `arrows`), or None."""
    package = type(system).__module__.rpartition(".")[0]
    if not package:
        return None
    name = f"{package}.chart"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise
    return module if hasattr(module, "lifelines") and hasattr(module, "arrows") else None


def realize(system: Any, trace: Sequence[Any], initial: Any = None) -> tuple[Any, list[Any]]:
    """(initial state, the system's own actions) for a path given as actions or their JSON form, matched as
    `kvsim replay` matches it (`counterexample.match_path`); a step that is not enabled is a ValueError naming it.
    """
    start, taken, failure = match_path(system, trace, initial)
    if failure:
        raise ValueError(failure)
    return start, taken


def _short(action: Any, limit: int = 48) -> str:
    text = canonical_json(to_jsonable(action))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sequence_chart(system: Any, initial: Any, actions: Sequence[Any], *, title: str, check: str, kind: str,
                   verdict: str, replay: str = "", window: tuple[int, int] | None = None) -> SequenceChart:
    """The chart of `actions` from `initial`: lifelines and arrows from the model's hook (else one lifeline per
    action kind); the step marked is the first state where the invariant `check` fails (for a hang, or a
    check that is not an invariant, the path's end). `window` = (first, last) 1-based steps to draw."""
    hook = chart_hook(system)
    invariant = next((i for i in system.invariants if i.name == check), None)
    first, last = window or (1, len(actions))
    state, arrows, kinds = initial, [], []
    marked = 0 if invariant is not None and invariant.check(state) is not None else None
    for n, action in enumerate(actions, start=1):
        if n > last:
            break
        if first <= n:
            if hook is not None:
                for sender, receiver, label, fault in hook.arrows(system, state, action):
                    arrows.append(Arrow(n, sender, receiver, label, bool(fault)))
            else:
                lane = str(action[0]) if isinstance(action, tuple) and action else type(action).__name__
                if lane not in kinds:
                    kinds.append(lane)
                arrows.append(Arrow(n, lane, lane, _short(action)))
        state = system.step(state, action)
        if marked is None and invariant is not None and invariant.check(state) is not None:
            marked = n
            if window is None:
                break  # the chart ends where the check fails
    if invariant is None or kind == "hang":
        marked = last  # the hang (or the failed check) is at the end of the path
    steps = marked if window is None and marked is not None else last
    lifelines = tuple(hook.lifelines(system)) if hook is not None else tuple(kinds)
    unknown = sorted({x for a in arrows for x in (a.sender, a.receiver)} - set(lifelines))
    return SequenceChart(title, lifelines + tuple(unknown), tuple(arrows), steps, marked, check, verdict,
                         "model" if hook is not None else "action kinds", first, replay)


def case_table(case: Any, *, title: str, check: str, verdict: str, replay: str = "") -> CaseTable:
    rows: list[tuple[str, str]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k in value:
                walk(f"{prefix}.{k}" if prefix else str(k), value[k])
        else:
            rows.append((prefix or "case", canonical_json(to_jsonable(value))))

    walk("", case)
    return CaseTable(title, check, verdict, rows, replay)
