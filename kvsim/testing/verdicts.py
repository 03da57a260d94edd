"""The catalog as a list of checks with a verdict each: what `pytest --kvsim-catalog` turns into test items.

* A bug report (`kvsim repro ID`, the same `reproduce` call and seed) passes when the report holds: a seed
  bug fails on its variant and passes on the fix, an open finding still reproduces.
* A property runs on the model's `fixed` variant and passes when it holds there. Where the catalog holds a
  finding on `fixed` that the failure is (the report's property, or for a state-machine property the
  report's invariant), the verdict is "xfailed" naming the report: a known open upstream bug, which the
  bug report's own item checks.
* A kernel property runs on each backend it lists ("skipped" where this machine lacks it, with why), as
  `kvsim oracle` does.

Settings: kvsim's CI profile (derandomized, no database, 60 examples) unless `Settings.from_profile()`: the
Hypothesis profile the caller loaded, its example database (each property keyed by model, property and
variant) and its randomness.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator

CI_MAX_EXAMPLES = 60  # tests/conftest.py's `ci` profile
REPRO_SEED = 0  # kvsim repro's default


@dataclass(frozen=True)
class Settings:
    max_examples: int = CI_MAX_EXAMPLES
    derandomize: bool = True
    database: Any = None
    seed: int | None = None

    @classmethod
    def from_profile(cls, seed: int | None = None) -> "Settings":
        from hypothesis import settings

        profile = settings.default
        return cls(profile.max_examples, profile.derandomize, profile.database, seed)


@dataclass(frozen=True)
class Check:
    kind: str  # "bug", "property" or "kernel"
    model: str
    name: str  # the bug id or the property name
    variant: str
    backend: str | None = None

    @property
    def param(self) -> str:
        return self.variant if self.backend is None else f"{self.variant}-{self.backend}"

    @property
    def test_name(self) -> str:
        return f"{self.name}[{self.param}]"


@dataclass(frozen=True)
class Verdict:
    status: str  # "passed", "failed", "xfailed" or "skipped"
    text: str = ""


def checks() -> Iterator[Check]:
    """Per model, in catalog order: its bug reports, then its properties (kernel ones once per backend)."""
    from ..app import catalog

    registry = catalog.load()
    for model in registry.models.values():
        for bug in registry.bugs.values():
            if bug.model == model.name:
                yield Check("bug", model.name, bug.id, bug.variant)
        fixed = model.variants.fixed.name
        for prop in registry.properties_of(model.name):
            if prop.is_kernel:
                for backend in prop.backends:
                    yield Check("kernel", model.name, prop.name, fixed, backend)
            else:
                yield Check("property", model.name, prop.name, fixed)


def run(check: Check, settings: Settings = Settings()) -> Verdict:
    from ..app import catalog

    registry = catalog.load()
    if check.kind == "bug":
        return bug_verdict(registry.bug(check.name))
    prop = registry.property(check.model, check.name)
    if check.kind == "kernel":
        from ..app.oracle import run_kernel_property

        result = run_kernel_property(prop, check.backend, variant=check.variant,
                                     max_examples=settings.max_examples, seed=settings.seed or 0)
    else:
        from ..engine.runner import run_property

        database = None if settings.derandomize else settings.database  # Hypothesis: derandomize has none
        result = run_property(prop, check.variant, max_examples=settings.max_examples, seed=settings.seed,
                              derandomize=settings.derandomize, database=database,
                              database_key=None if database is None else
                              f"kvsim:{check.model}:{check.name}:{check.variant}")
    if result.status == "passed":
        never = [g for g in result.reachability if g["status"] == "unreached"]  # `kvsim check` fails these too
        if never:
            return Verdict("failed", f"{check.name} holds, but no case of the {never[0]['drawn']} drawn met "
                                     f"{', '.join(g['name'] for g in never)}: it may hold vacuously")
        return Verdict("passed")
    if result.status == "skipped":
        return Verdict("skipped", result.message)
    text = property_failure(result)
    known = known_finding(registry, check, result.message) if result.status == "failed" else None
    if known is not None:
        return Verdict("xfailed", f"catalogued finding {known.id} ({known.status}): {result.message}")
    return Verdict("failed", text)


def known_finding(registry: Any, check: Check, message: str) -> Any:
    """The catalog's bug report on this model and variant that a property failure is, if any."""
    for bug in registry.bugs.values():
        if bug.model != check.model or bug.variant != check.variant or bug.status == "not reproducible":
            continue
        if bug.property == check.name or (bug.invariant and message.startswith(f"{bug.invariant}:")):
            return bug
    return None


def short(value: Any, width: int = 400) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= width else text[:width - 3] + "..."


def property_failure(result: Any) -> str:
    lines = [f"{result.model}::{result.property} on {result.variant}: {result.status} after {result.examples} "
             f"examples", f"  {result.message}"]
    counterexample = result.counterexample
    program = counterexample.get("program") if isinstance(counterexample, dict) else None
    if program:
        lines += ["  steps:"] + [f"    {step}" for step in program]
    elif counterexample is not None:
        lines.append(f"  counterexample: {short(counterexample)}")
    if result.replay:
        lines.append(f"  replay: {result.replay}")
    return "\n".join(lines)


def bug_verdict(bug: Any) -> Verdict:
    from ..app import catalog
    from ..app.repro import BugRun, baseline_variant, reproduce

    # resolved against the catalog loaded here (a bare report alone did not load it: it failed on "property:
    # expected one of , ..." unless another test had loaded the catalog before it)
    result = reproduce(BugRun.resolve(bug, catalog.load()), seed=REPRO_SEED)
    if result.ok:
        return Verdict("passed")
    searched = "examples" if bug.property else "states"
    check = f"property {bug.property}" if bug.property else f"invariant {bug.invariant}"
    lines = [f"bug report {bug.id} ({bug.status}) does not hold: {check} on {bug.variant}",
             f"  reproduced: {'yes' if result.reproduced else 'no'} ({result.examples} {searched})"]
    if result.fixed_passes is not None:
        lines.append(f"  passes on {baseline_variant(bug)}: {'yes' if result.fixed_passes else 'no'}")
    if result.message:
        lines.append(f"  {result.message}")
    if result.counterexample is not None:
        lines.append(f"  counterexample: {short(result.counterexample)}")
    lines.append(f"  replay: kvsim repro {bug.id} --seed {REPRO_SEED}")
    return Verdict("failed", "\n".join(lines))
