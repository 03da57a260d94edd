"""`kvsim repro` fast: a report's search stops at its first violation with the verdict and counterexample of the
complete search (pinned: the rows of commit 0f8f59c, before the stop), and `--workers` hands the reports back
in catalog order, a failed one as a one-line error with nothing else lost."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvsim.app import catalog, cli
from kvsim.app.forked import ordered
from kvsim.app.repro import BugRun, reproduce
from kvsim.engine.explore import ExploreOptions, explore

# the rows `reproduce` gave at 0f8f59c (complete searches), every key but the seconds, for a cheap subset: safety
# invariants (one not reproducible: a complete search finds nothing), hangs, and two Hypothesis reports
PINNED = json.loads((Path(__file__).parent / "data" / "repro_0f8f59c.json").read_text())
# the seconds, and what the fixed side checked (not in those rows: it is counted since the fixed side replays the
# search's inputs; `test_the_fixed_side_checks_every_input_the_search_tried` checks it)
SEARCHED = {"seconds", "fixed_seconds", "total_seconds", "states", "fixed_examples", "fixed_states"}


def _row(result) -> dict:
    return {k: v for k, v in result.to_json().items() if k not in SEARCHED}


@pytest.mark.parametrize("pinned", PINNED, ids=[p["id"] for p in PINNED])
def test_rows_equal_the_complete_searches(pinned):
    reg = catalog.load()
    run = BugRun.resolve(reg.bugs[pinned["id"]], reg)
    result = reproduce(run, seed=0)
    assert _row(result) == {k: v for k, v in pinned.items() if k not in SEARCHED}
    if run.prop is not None:
        return
    # the complete search of today's tree reports the same path, and the stopped one searched no more than it
    complete = explore(run.model.build_system(run.variant, dict(run.bug.params)))
    hit = next(v for v in complete.violations if v.property == run.bug.invariant) if result.reproduced else None
    assert result.counterexample == (None if hit is None else {"trace": hit.trace, "kind": hit.kind})
    assert complete.states == pinned["states"]
    stops = result.reproduced and result.counterexample["kind"] == "invariant"
    assert (result.examples < complete.states) if stops else (result.examples == complete.states)


def test_the_fixed_side_checks_every_input_the_search_tried(monkeypatch):
    """A Hypothesis report's fixed side checks the inputs its search tried, in their order (the one that first
    failed and the shrunk counterexample among them), then the pinned and generated ones; a search report's
    fixed side counts the states of its complete search."""
    from kvsim.app.repro import FIXED_CHECK_EXAMPLES
    from kvsim.engine import property as prop_module
    from kvsim.engine.canon import to_jsonable

    checked: list[tuple[str, str]] = []
    real = prop_module.KvProperty.__call__

    def spy(self, case, variant, backend=None):
        checked.append((variant.name, json.dumps(to_jsonable(case), sort_keys=True)))
        return real(self, case, variant, backend)

    monkeypatch.setattr(prop_module.KvProperty, "__call__", spy)
    reg = catalog.load()
    run = BugRun.resolve(reg.bugs["sglang-pr35281-mori-abort-dropped"], reg)
    result = reproduce(run, seed=0)
    assert result.reproduced and result.fixed_passes
    searched = [case for variant, case in checked if variant == run.variant.name]
    fixed = [case for variant, case in checked if variant == run.baseline.name]
    assert len(searched) == result.examples and len(fixed) == result.fixed_examples
    assert fixed[:len(searched)] == searched and json.dumps(result.counterexample["case"], sort_keys=True) in fixed
    assert result.fixed_examples >= len(searched) + len(run.prop.examples) + FIXED_CHECK_EXAMPLES
    # the generated ones come from the next seed: few repeat the search's (Hypothesis's simplest cases; 7 of 100
    # here, 19 with the search's own seed, which generates its first inputs again)
    generated = fixed[len(searched) + len(run.prop.examples):]
    assert len(generated) == FIXED_CHECK_EXAMPLES and sum(case in set(searched) for case in generated) <= 10
    assert result.to_json()["fixed_examples"] == result.fixed_examples
    search = BugRun.resolve(reg.bugs["trtllm-17526-early-completion"], reg)
    found = reproduce(search, seed=0)
    complete = explore(search.model.build_system(search.baseline, dict(search.bug.params)))
    assert found.to_json()["fixed_states"] == complete.states and found.to_json()["fixed_examples"] is None


def _work(gate):
    def work(i):
        if i == 0:  # the first item finishes last: it waits until item 4 is done
            assert gate.wait(60)
        if i == 2:
            raise ValueError("item 2\nis bad")
        if i == 3:
            os._exit(7)  # the worker process dies running it
        if i == 4:
            gate.set()
        return {"item": i}
    return work


def test_ordered_keeps_the_order_and_reports_each_failure():
    gate = mp.get_context("fork").Event()
    out = list(ordered(7, _work(gate), 2))
    assert [i for i, _, _ in out] == list(range(7))
    assert out[2] == (2, False, "ValueError: item 2 is bad")
    assert out[3] == (3, False, "the worker process running it died (exit code 7)")
    assert [value for _, ok, value in out if ok] == [{"item": i} for i in (0, 1, 4, 5, 6)]


def test_a_stop_asked_before_the_workers_start_is_the_coordinators_and_no_worker_prints_a_traceback(capfd):
    """A signal that lands before the fork (the flag is copied with the coordinator's memory) must not make each
    worker raise `Interrupted` out of its loop, which multiprocessing prints as a traceback (a CI failure seen
    when `repro --all` was signalled right after it installed its handlers)."""
    err = _stopped_before_the_workers_start(capfd)
    assert "Traceback" not in err and "Interrupted" not in err, err


def _stopped_before_the_workers_start(capfd) -> str:  # type: ignore[no-untyped-def]
    """`ordered` asked to stop before it forks (its `Interrupted` expected); what the processes wrote to stderr."""
    import signal

    from kvsim.engine.interrupt import Interrupted, raise_if_asked, stopping_on_signals

    def work(i):
        raise_if_asked()
        return i

    with stopping_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)  # the first signal only asks a stop
        with pytest.raises(Interrupted):
            list(ordered(4, work, 2))
    return capfd.readouterr().err


def test_a_worker_ended_before_it_has_its_own_handlers_prints_no_traceback(capfd, monkeypatch):
    """The coordinator, asked to stop, ends its workers (SIGTERM) at once; a worker that has not yet put its own
    handlers in place still has the coordinator's, which raise KeyboardInterrupt on a stop already asked (the
    traceback the CI saw, from a worker still in multiprocessing's bootstrap). Here each worker is held back before
    its handlers for a second: the signal waits for them, and the worker ends without a word."""
    import time

    from kvsim.app import forked

    real = forked.worker_signals
    monkeypatch.setattr(forked, "worker_signals", lambda: (time.sleep(1.0), real()))
    err = _stopped_before_the_workers_start(capfd)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


SUBSET = ["trtllm-17526-early-completion", "sglang-common-mha-pp-v-offset", "vllm-50297-pd-preemption-race",
          "trtllm-15727-final-chunk-clock", "vllm-55055-short-prompt-draft-kv"]


def _repro_all(monkeypatch, capsys, workers, *extra):
    reg = catalog.load()
    monkeypatch.setattr(reg, "bugs", {k: reg.bugs[k] for k in SUBSET})
    code = cli.main(["repro", "--all", "--json", "--workers", str(workers), *extra])
    doc = json.loads(capsys.readouterr().out)
    for row in doc["bugs"]:
        for k in ("seconds", "fixed_seconds", "total_seconds"):
            row.pop(k)
    return code, doc


def test_workers_give_the_rows_of_one_process_in_catalog_order(monkeypatch, capsys):
    one = _repro_all(monkeypatch, capsys, 1)
    assert [b["id"] for b in one[1]["bugs"]] == SUBSET
    assert _repro_all(monkeypatch, capsys, 3) == one
    assert one[0] == 0


class _StopOnSecond:
    """A progress line whose second step is a stop asked (Ctrl-C) while the workers run."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    def step(self, name: str) -> None:
        from kvsim.engine.interrupt import Interrupted

        self.steps.append(name)
        if len(self.steps) == 2:
            raise Interrupted()


def test_the_dearer_items_are_handed_out_first_and_every_list_keeps_the_items_order(tmp_path):
    """`each_forked(first=...)` hands the items out by that key (the generated reports before the searches in
    `repro --all`), and hands back the results, errors and names not run in the items' order, a stop included."""
    from kvsim.app.commands.common import each_forked

    log = tmp_path / "handed"
    items = ["search a", "generated b", "search c", "generated d", "search e"]

    def run(item: str) -> str:
        with open(log, "a") as f:  # one worker: the order it is handed the items in
            f.write(item + "\n")
        if item == "search e":
            raise ValueError("bad")
        return item.upper()

    class Quiet:
        def step(self, name: str) -> None:
            pass

    made, not_run, stop, errors = each_forked(items, str, run, Quiet(), 1, lambda item, value: (item, value),
                                              first=lambda item: not item.startswith("generated"))
    assert log.read_text().split("\n")[:-1] == ["generated b", "generated d", "search a", "search c", "search e"]
    assert made == [(item, item.upper()) for item in items[:4]] and not_run == [] and stop is None
    assert errors == [{"id": "search e", "error": "ValueError: bad"}]
    made, not_run, stop, errors = each_forked(items, str, run, _StopOnSecond(), 1, lambda item, value: value,
                                              first=lambda item: not item.startswith("generated"))
    assert (made, stop, errors) == (["GENERATED B"], "interrupt", [])
    assert not_run == ["search a", "search c", "generated d", "search e"]  # the items' order, not the handed one


def test_repro_all_hands_the_generated_reports_out_first():
    from kvsim.app.repro import generated_first

    reg = catalog.load()
    runs = sorted((BugRun.resolve(reg.bug(b), reg) for b in SUBSET), key=generated_first)
    assert [r.bug.id for r in runs] == [SUBSET[1]] + SUBSET[:1] + SUBSET[2:]


def test_a_failed_report_is_one_error_line_and_the_others_are_kept(monkeypatch, capsys, tmp_path):
    from kvsim.app import repro

    real = repro.reproduce

    def failing(run, seed=0):
        if run.bug.id == SUBSET[1]:
            raise RuntimeError("model\ncrashed")
        return real(run, seed=seed)

    monkeypatch.setattr(repro, "reproduce", failing)
    code, doc = _repro_all(monkeypatch, capsys, 2, "--junit", str(tmp_path / "r.xml"))
    assert code == 1
    assert doc["errors"] == [{"id": SUBSET[1], "error": "RuntimeError: model crashed"}]
    assert [b["id"] for b in doc["bugs"]] == SUBSET[:1] + SUBSET[2:]
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "r.xml").getroot().iter("testcase")}
    assert sorted(cases) == sorted(SUBSET)
    assert cases[SUBSET[1]].find("error").get("message") == "RuntimeError: model crashed"


def test_stop_on_is_checked_and_a_partitioned_search_refuses_it():
    from kvsim.engine.errors import ConfigError
    from kvsim.engine.explore.parallel import explore_parallel

    with pytest.raises(ConfigError, match="stop_on"):
        ExploreOptions(stop_on=["suffix_rows_match_prefill"])
    with pytest.raises(ConfigError, match="stop_on"):
        explore_parallel(lambda: None, 2, ExploreOptions(stop_on=frozenset({"x"})))


def test_a_stopped_search_says_so():
    reg = catalog.load()
    run = BugRun.resolve(reg.bugs["trtllm-17526-early-completion"], reg)
    system = run.model.build_system(run.variant, dict(run.bug.params))
    result = explore(system, ExploreOptions(stop_on=frozenset({run.bug.invariant}), check_liveness=False))
    assert result.bound_hit == "violation" and [v.property for v in result.violations] == [run.bug.invariant]
