"""Every conform target runs at least 95% of the statement lines of its checked upstream definitions (`kvsim conform
--coverage`), on the pinned releases; the lines no input can reach are declared in the target (`Unreached`, with
the reason) and left out of the count. The failure names the lines that did not run.

Under the CI profile the targets that run in the process are measured with 100 examples each (about two minutes in
all); the kernel targets (each example an interpreted Triton launch in a child, a minute or more each) are
measured under KVSIM_PROFILE=dev, with the rest at the command's default of 200 examples.
"""

from __future__ import annotations

import os

import pytest

from kvsim.conform.run import run_targets
from kvsim.conform.source import DEFAULT_VERSIONS, resolve_source
from kvsim.conform.targets import RunOptions, descriptors, targets

DEV = os.environ.get("KVSIM_PROFILE") == "dev"
FLOOR = 95.0


def _measured(engine: str, kernels: bool) -> list:
    chosen = [t for t in targets(engine) if DEV or t.resolve_adapter().kernel == kernels]
    if not chosen:
        pytest.skip(f"no {engine} {'kernel ' if kernels else ''}targets")
    source = resolve_source(engine, version=DEFAULT_VERSIONS[engine])
    return run_targets(chosen, source, descriptors(), RunOptions(max_examples=200 if DEV else 100), measure=True)


@pytest.mark.parametrize("kernels", [False, pytest.param(True, marks=pytest.mark.skipif(
    not DEV, reason="kernel targets' coverage under KVSIM_PROFILE=dev (interpreted launches: minutes)"))])
@pytest.mark.parametrize("engine", ["vllm", "sglang", "flashinfer"])
def test_every_target_runs_its_checked_upstream_lines(engine: str, kernels: bool) -> None:
    below = []
    measured = 0
    for result in _measured(engine, kernels):
        if result.status in ("not present", "skipped"):
            continue
        assert result.status == "conforms", result
        measured += 1
        cov = result.coverage
        if cov["percent"] < FLOOR:
            missed = "; ".join(f"{path}:{definition} lines {lines}" for path, f in cov["files"].items()
                               for definition, lines in f["missed"].items())
            below.append(f"{result.target}: {cov['percent']}% of {cov['lines']} lines (not run: {missed})")
    assert measured and not below, "\n".join(below)
