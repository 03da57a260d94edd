"""Saved counterexamples of `check` and `explore`, and replaying them to the same violation.

A counterexample file is one JSON document:

    {"kvsim_counterexample": 1, "command": "check" | "explore", "model": ..., "variant": ...,
     "params": {...only what the user set...}, "kvsim_version": ...,
     check:    "property", "seed", "max_examples", "counterexample": {"case" | "actions", "message", ...}
     explore:  "invariant", "kind": "invariant" | "hang", "trace": [action, ...], "message"}

`kvsim check --save FILE` and `kvsim explore --save FILE` write one; the
`--json` output of either command is accepted too (its first failure is
taken). Replaying an action path needs no Hypothesis: each saved action is
matched against the enabled actions of the rebuilt system by its JSON form,
so the path is checked to be a real path of the system, and the violation is
checked at its end (an invariant fails there; for a hang, no done state is
reachable from there). A data-property counterexample is replayed by running
the property again with the same seed and settings, which reproduces the same
shrunk case, and comparing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from .. import __version__
from ..engine.canon import canonical_json, to_jsonable
from ..engine.descriptor import RunSpec
from ..engine.errors import ConfigError, TraceError
from ..engine.explore import explore
from ..engine.registry import Registry

FORMAT = 1


@dataclass
class CounterexampleReplay:
    path: str
    command: str
    model: str
    variant: str
    check: str  # the property or invariant
    matches: bool
    message: str  # the violation the re-run found (or why it did not)
    steps: int = 0  # actions replayed (0 for a data case)
    program: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"counterexample": self.path, "command": self.command, "model": self.model, "variant": self.variant,
                "check": self.check, "matches": self.matches, "message": self.message, "steps": self.steps,
                "program": self.program}


def check_document(run: RunSpec, result: Any, seed: int | None, max_examples: int, backend: str | None) -> dict:
    return {"kvsim_counterexample": FORMAT, "command": "check", "model": run.model.name, "variant": run.variant.name,
            "params": to_jsonable(run.given), "kvsim_version": __version__, "property": result.property,
            "seed": seed, "max_examples": max_examples, "backend": backend,
            "counterexample": result.counterexample, "message": result.message}


def explore_document(run: RunSpec, violation: Any) -> dict:
    return {"kvsim_counterexample": FORMAT, "command": "explore", "model": run.model.name,
            "variant": run.variant.name, "params": to_jsonable(run.given), "kvsim_version": __version__,
            "invariant": violation.property, "kind": violation.kind, "trace": violation.trace,
            "message": violation.message}


def write(path: str, document: dict) -> None:
    try:
        with open(path, "w", encoding="ascii") as fh:
            fh.write(json.dumps(document, sort_keys=True, indent=1) + "\n")
    except OSError as exc:
        raise ConfigError("--save", "a writable file path", path, exc.strerror or "") from None


def sniff(path: str) -> dict | None:
    """The counterexample document in `path` (saved, or `--json` output of check/explore); None for a trace."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 20)
    except OSError as exc:
        raise TraceError(path, 0, f"cannot read the file: {exc.strerror}") from None
    stripped = head.lstrip()
    if not stripped.startswith(b"{"):
        return None
    try:
        doc = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None  # a JSON-lines trace (its header alone is one object per line) or a broken file
    if not isinstance(doc, dict):
        return None
    if "kvsim_counterexample" in doc:
        return doc
    if "results" in doc and "model" in doc:  # `kvsim check --json`
        failed = [r for r in doc["results"] if isinstance(r, dict) and r.get("status") == "failed"]
        if not failed:
            raise TraceError(path, 1, "this `kvsim check --json` output has no failed property to replay")
        r = failed[0]
        return {"kvsim_counterexample": FORMAT, "command": "check", "model": doc["model"], "variant": doc["variant"],
                "params": doc.get("params", {}), "property": r["property"], "seed": doc.get("seed"),
                "max_examples": doc.get("max_examples", r.get("examples")), "backend": doc.get("backend"),
                "counterexample": r["counterexample"], "message": r.get("message", "")}
    if "violations" in doc and "model" in doc:  # `kvsim explore --json`
        if not doc["violations"]:
            raise TraceError(path, 1, "this `kvsim explore --json` output has no violation to replay")
        v = doc["violations"][0]
        return {"kvsim_counterexample": FORMAT, "command": "explore", "model": doc["model"], "variant": doc["variant"],
                "params": doc.get("params", {}), "invariant": v["property"], "kind": v["kind"], "trace": v["trace"],
                "message": v.get("message", "")}
    return None


def _field(doc: dict, key: str, kind: type | tuple[type, ...], path: str) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise TraceError(path, 1, f"counterexample field {key!r}: expected {getattr(kind, '__name__', kind)}, "
                                  f"got {value!r}")
    return value


def replay(path: str, doc: dict, registry: Registry) -> CounterexampleReplay:
    model = registry.model(_field(doc, "model", str, path))
    params = _field(doc, "params", dict, path) if doc.get("params") is not None else {}
    try:
        run = RunSpec.resolve(model, _field(doc, "variant", str, path), params)
    except ConfigError as exc:
        raise TraceError(path, 1, f"counterexample does not describe a run: {exc}") from None
    command = doc.get("command")
    if command == "explore":
        return _replay_path(path, run, _field(doc, "invariant", str, path), doc.get("kind", "invariant"),
                            _field(doc, "trace", list, path), None)
    if command == "check":
        prop = registry.property(model.name, _field(doc, "property", str, path))
        found = doc.get("counterexample") or {}
        if prop.kind == "stateful":
            return _replay_path(path, run, found.get("invariant", ""), "invariant", found.get("actions") or [],
                                found.get("initial"), command="check", name=prop.name)
        return _replay_case(path, run, prop, doc)
    raise TraceError(path, 1, f"counterexample field 'command': expected check or explore, got {command!r}")


def _replay_case(path: str, run: RunSpec, prop: Any, doc: dict) -> CounterexampleReplay:
    from ..engine.runner import run_property  # Hypothesis: only for a data property's case

    backend = doc.get("backend")
    result = run_property(prop, run.variant, max_examples=int(doc.get("max_examples") or 100), seed=doc.get("seed"),
                          params=dict(run.given) or None, backend=backend)
    saved = (doc.get("counterexample") or {}).get("case")
    got = (result.counterexample or {}).get("case")
    matches = result.status == "failed" and canonical_json(saved) == canonical_json(got)
    message = result.message if result.status == "failed" else "the property passed on the re-run"
    if result.status == "failed" and not matches:
        message = f"the re-run failed on another case: {canonical_json(got)[:300]}"
    return CounterexampleReplay(path, "check", run.model.name, run.variant.name, prop.name, matches, message)


class _From:
    """The system with one chosen initial state (to search onwards from a path's last state)."""

    def __init__(self, system: Any, state: Any) -> None:
        self.system, self.state = system, state
        self.name, self.variant, self.invariants = system.name, system.variant, system.invariants
        self.enabled, self.step, self.done = system.enabled, system.step, system.done
        self.liveness = getattr(system, "liveness", "liveness")

    def initial_states(self) -> tuple[Any, ...]:
        return (self.state,)


def match_path(system: Any, trace: Sequence[Any], initial: Any = None) -> tuple[Any, list[Any], str]:
    """`(initial state, the system's own actions, "")` for a path given as actions or their JSON form, each
    matched against the enabled actions by its canonical JSON (from `initial`, else from each initial state in
    turn); where no start admits the whole path, the actions matched from the last one and the step that is not
    enabled."""
    starts = list(system.initial_states())
    if initial is not None:
        starts = [s for s in starts if canonical_json(s) == canonical_json(initial)] or starts
    start, taken, failure = None, [], "no initial state"
    for start in starts:
        state, taken, failure = start, [], ""
        for i, saved in enumerate(trace):
            key = canonical_json(saved)
            action = next((a for a in system.enabled(state) if canonical_json(a) == key), None)
            if action is None:
                failure = f"step {i + 1}: action {key[:200]} is not enabled there"
                break
            taken.append(action)
            state = system.step(state, action)
        if not failure:
            break
    return start, taken, failure


def _replay_path(path: str, run: RunSpec, check: str, kind: str, trace: list, initial: Any,
                 command: str = "explore", name: str | None = None) -> CounterexampleReplay:
    system = run.system()
    state, taken, failure = match_path(system, trace, initial)
    for action in taken:
        state = system.step(state, action)
    program = ["state = initial_state()"] + [f"state = step(state, {a!r})" for a in taken]
    result = CounterexampleReplay(path, command, run.model.name, run.variant.name, name or check, False, failure,
                                  len(taken), program)
    if failure:
        return result
    if kind == "hang":
        found = explore(_From(system, state))
        hang = next((v for v in found.violations if v.kind == "hang"), None)
        complete = found.bound_hit is None
        result.matches = hang is not None and hang.trace == [] and complete
        result.message = (f"{check}: no done state is reachable from the path's last state ({found.states} states "
                          "searched)" if result.matches else "a done state is reachable from the path's last state")
        return result
    inv = next((i for i in system.invariants if i.name == check), None)
    if inv is None:
        result.message = f"the system has no invariant {check!r}"
        return result
    message = inv.check(state)
    result.matches = message is not None
    result.message = f"{check}: {message}" if message is not None else f"{check} holds at the path's last state"
    result.program.append(f"check(state)  # {check} {'fails' if result.matches else 'holds'} here")
    return result
