"""The two measures of `kvsim conform` on the pinned releases: coverage and mutants.

- Coverage (`--coverage`): every target runs at least 95% of the statement lines of its checked upstream
  definitions; the lines no input can reach are declared in the target (`Unreached`, with the reason) and left
  out of the count. A failure names the lines that did not run.
- Mutants (`--mutants`): the checks kill the mutants of the engines' own code. Under the CI profile, a
  derandomized sample of one mutant per target (the same every run: `mutants.sample` spreads a sample over the
  code in source order) must be killed or be a documented equivalent (`ConformTarget.survivors`); under
  KVSIM_PROFILE=dev every mutant of every target runs, and each target's score must reach 95%. A failure lists
  the surviving mutants by file, line and operator.

One `measure` per target gives both (its unmutated run is traced), one test per target (so that the two workers
share an engine's targets). Under the CI profile the in-process targets run with `CI_EXAMPLES` (about two
minutes in all, on two workers); the kernel targets (each example an
interpreted Triton launch in a child) run under KVSIM_PROFILE=dev, with 200 examples for every target.
"""

from __future__ import annotations

import os

import pytest

from kvsim.conform.mutate import measure
from kvsim.conform.source import DEFAULT_VERSIONS, resolve_source
from kvsim.conform.targets import RunOptions, targets

DEV = os.environ.get("KVSIM_PROFILE") == "dev"
FLOOR = 95.0
# examples per target under the CI profile, a fixed budget per engine (the outcome never depends on speed): the
# FlashInfer targets are cheap and get the command's default, which their selection loops need to try the CuTe
# DSL family with sinks and with rejections (100 examples reach 81% of their lines)
CI_EXAMPLES = {"vllm": 100, "sglang": 100, "flashinfer": 200}


def measured_targets() -> list[tuple[str, str]]:
    """(engine, target) for each target measured under this profile, in catalog order: one test each, so that
    the workers share an engine's targets (the kernel targets only under KVSIM_PROFILE=dev)."""
    return [(engine, t.name) for engine in ("vllm", "sglang", "flashinfer") for t in targets(engine)
            if DEV or not t.resolve_adapter().kernel]


@pytest.mark.parametrize("engine,name", measured_targets(), ids=lambda v: v)
def test_every_target_covers_its_upstream_lines_and_kills_its_mutants(engine: str, name: str) -> None:
    source = resolve_source(engine, version=DEFAULT_VERSIONS[engine])
    (target,) = [t for t in targets(engine) if t.name == name]
    options = RunOptions(max_examples=200 if DEV else CI_EXAMPLES[engine])
    result = measure(target, source, options, 0 if DEV else 1)
    if result.status in ("not present", "skipped"):
        pytest.skip(f"{engine} {DEFAULT_VERSIONS[engine]}: {name} {result.status} ({result.note})")
    assert result.status == "measured", (target.name, result.status, result.note)
    cov = result.coverage
    missed = "; ".join(f"{path}:{definition} lines {lines}" for path, f in cov["files"].items()
                       for definition, lines in f["missed"].items())
    assert cov["percent"] >= FLOOR, f"{name}: {cov['percent']}% of {cov['lines']} lines (not run: {missed})"
    weak = [f"{name} {result.score}%: {s['label']}" for s in result.survivors]
    assert not (weak and (not DEV or (result.score or 0) < FLOOR)), "\n".join(weak)


def test_every_engine_has_a_measured_target() -> None:
    """The per-target tests above measure something for each engine (a table emptied by mistake fails here)."""
    assert {engine for engine, _ in measured_targets()} == {"vllm", "sglang", "flashinfer"}
