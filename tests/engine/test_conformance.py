"""The conform frame itself (`kvsim.engine.conformance`), on a toy engine tree: every way the code under test
can go wrong is a divergence with its shrunk input, bounded in time, and the measures (coverage, mutants).
`kvsim conform`'s command line is tests/conform/test_conform_cli.py."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
from dataclasses import replace

import pytest

from conform_toys import TOY, TOY_SOURCE, target, write_toy_engine
from kvsim.conform.loader import mutated
from kvsim.conform.mutate import measure
from kvsim.conform.source import resolve_source
from kvsim.conform.targets import RunOptions, run_target
from kvsim.conform.triton_child import KernelChild
from kvsim.engine.conformance import deadline
from kvsim.engine.conformance.answers import Answered, DidNotReturn, Raised
from kvsim.engine.conformance.compare import Close, Exact
from kvsim.engine.conformance.declare import Survivor
from kvsim.engine.conformance.mutants import OPERATORS, Mutant, mutants, sample

OPTIONS = RunOptions(max_examples=60, call_timeout=5.0)


def _source(tmp_path, replace_text=None):
    return resolve_source("vllm", from_path=str(write_toy_engine(tmp_path / "tree", replace_text)))


def _run(tmp_path, adapter="DIFF", replace_text=None, options=OPTIONS, **kw):
    return run_target(target(adapter, **kw), _source(tmp_path, replace_text), options)


@pytest.mark.parametrize("adapter, names", [("DIFF", ("plan",)), ("SWEEP", ("plan",)), ("LOCKSTEP", ("Counter",))])
def test_the_toy_conforms_and_names_the_code_under_test(tmp_path, adapter, names):
    result = _run(tmp_path, adapter, names=names)
    assert (result.status, result.divergent, result.subject) == ("conforms", 0, "code under test"), result
    assert result.compared > 10 and result.files == [TOY]


def test_a_raise_is_a_divergence_with_its_shrunk_input_and_the_upstream_line(tmp_path):
    result = _run(tmp_path, replace_text=("    out = []\n", "    out = []\n    if n > 30:\n"
                                          "        raise ValueError('too many rows')\n"))
    assert result.status == "diverges"
    (d,) = result.divergences
    assert d["input"] == {"n": 31, "k": 1, "cap": 0}  # shrunk: the smallest n that raises, the rest minimal
    assert d["upstream"] == f"raised ValueError: too many rows ({TOY}:6)"
    assert d["difference"].startswith("the answer: model {")


def test_a_hang_is_a_divergence_bounded_by_the_per_call_deadline(tmp_path):
    result = _run(tmp_path, replace_text=("        start += size\n", "        start = size\n"),
                  options=replace(OPTIONS, call_timeout=0.5))
    assert result.status == "diverges"
    (d,) = result.divergences
    assert d["input"] == {"n": 2, "k": 1, "cap": 0}  # the smallest input that loops
    assert d["upstream"].startswith("did not return within ")
    assert "shrunk under" in d["note"] or "found under" in d["note"] or d["upstream"].endswith("0.5 s")


def _comparable(result):
    """A result as JSON, less what the clock decides (its seconds, its slowest call)."""
    doc = result.to_json()
    doc.pop("seconds"), doc.pop("slowest_call")
    return doc


def test_targets_on_workers_report_what_one_process_reports_in_the_targets_order(tmp_path, monkeypatch):
    """`--workers`: each target's result (a divergence with its shrunk input, a failing property, a conforming
    lockstep) is the one a single process gives, and the report keeps the targets' order whatever order the
    workers ran them in."""
    from kvsim.conform import run as conform_run
    from kvsim.conform.targets import descriptors

    source = _source(tmp_path, ("    out = []\n", "    out = []\n    if n > 8:\n        raise ValueError('too many')\n"))
    chosen = [target("LOCKSTEP", names=("Counter",)), target("DIFF"), target("SWEEP")]
    alone = conform_run.run_targets(chosen, source, descriptors(), OPTIONS)
    monkeypatch.setattr(conform_run, "batches", lambda targets: [[2], [1], [0]])  # run last first
    shared = conform_run.run_targets(chosen, source, descriptors(), OPTIONS, workers=2)
    assert [r.status for r in alone] == ["conforms", "diverges", "diverges"]
    assert [_comparable(r) for r in shared] == [_comparable(r) for r in alone]


def test_a_hang_on_a_worker_is_stopped_by_the_per_call_deadline(tmp_path):
    from kvsim.conform.run import run_targets
    from kvsim.conform.targets import descriptors

    source = _source(tmp_path, ("        start += size\n", "        start = size\n"))
    diff, lockstep = run_targets([target("DIFF"), target("LOCKSTEP", names=("Counter",))], source, descriptors(),
                                 replace(OPTIONS, call_timeout=0.5), workers=2)
    assert diff.status == "diverges" and diff.divergences[0]["upstream"].startswith("did not return within ")
    assert diff.divergences[0]["input"] == {"n": 2, "k": 1, "cap": 0}
    assert lockstep.status == "conforms"


def test_a_worker_still_busy_past_the_runs_budget_is_ended_and_its_target_incomplete(tmp_path):
    """`--max-seconds` with workers: a target stuck where no budget check comes (here a hang under a deadline far
    longer than the budget) does not hold the run; its worker is ended and the target reported `incomplete`."""
    from kvsim.conform.run import run_targets
    from kvsim.conform.targets import descriptors

    source = _source(tmp_path, ("        start += size\n", "        start = size\n"))
    # the budget leaves a loaded machine time to fork the workers and start the target (a target that starts past
    # it is "not run", not this test's case); the coordinator ends a worker 2 s past it
    options = replace(OPTIONS, call_timeout=600.0, until=time.monotonic() + 5.0)
    hung, lockstep = run_targets([target("DIFF"), target("LOCKSTEP", names=("Counter",))], source, descriptors(),
                                 options, workers=2)
    assert hung.status == "incomplete" and "worker was ended" in hung.note
    assert lockstep.status in ("conforms", "incomplete", "not run")


@pytest.mark.parametrize("late", [False, True])
def test_a_stop_asked_before_the_workers_start_ends_the_run_and_no_worker_prints_a_traceback(tmp_path, capfd,
                                                                                         monkeypatch, late):
    """`--workers`, a stop asked before the workers fork (Ctrl-C at the start): the coordinator passes it on to its
    workers (SIGINT), each stops at its next check and the run raises the stop, with no worker's traceback. The
    stop is the coordinator's already (its flag is copied with the fork), so the signal passed on must not
    escalate to KeyboardInterrupt in a worker; `late`: each worker is held back a second before its handlers, so
    the signal comes while it still has the coordinator's (held until its own are in place)."""
    from kvsim.conform import run as conform_run
    from kvsim.conform.targets import descriptors
    from kvsim.engine import interrupt

    if late:
        real = interrupt.asking_worker_signals
        monkeypatch.setattr(interrupt, "asking_worker_signals", lambda: (time.sleep(1.0), real()))
    source = _source(tmp_path)
    with interrupt.stopping_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)  # the first signal only asks a stop
        with pytest.raises(KeyboardInterrupt):
            conform_run.run_targets([target("DIFF"), target("SWEEP")], source, descriptors(), OPTIONS, workers=2)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_kernel_targets_share_one_child_until_another_source_asks_for_one(tmp_path):
    """One kernel child per process (torch and triton imported once a run): the next target gets the same one;
    after a hang (which ended it) the next call starts a fresh one; another source's target closes it."""
    from kvsim.conform import triton_child

    source, other = _source(tmp_path / "a"), _source(tmp_path / "b")
    runner = "kvsim.conform.triton_child:selftest"
    try:
        with triton_child.shared(source, timeout=2.0) as first:
            pid = first.process.pid
            assert first.call(runner, {"echo": 1}) == {"echo": 1}
        with triton_child.shared(source, timeout=2.0) as again:
            assert again is first and again.process.pid == pid and again.started == 1
            with pytest.raises(Answered) as hung:
                again.call(runner, {"do": "hang"})
            assert isinstance(hung.value.answer, DidNotReturn)
        with triton_child.shared(source, timeout=2.0) as after:
            assert after.process.pid != pid and after.call(runner, {"echo": 2}) == {"echo": 2}
            kept = after.process
        with triton_child.shared(other, timeout=2.0) as elsewhere:
            assert elsewhere is not after and kept.poll() is not None  # the first source's child was closed
    finally:
        triton_child.close_shared()


LEAKY = "SEEN = []\n\n\ndef value():\n    SEEN.append(1)\n    return len(SEEN) * 10 + 1\n"


def test_mutants_share_one_child_and_nothing_of_one_reaches_the_next(tmp_path):
    """A --mutants run's mutants share the kernel child: each change of the mutant in force loads the definitions
    afresh (module state included: `SEEN` restarts), from the mutated or the released text; a mutant whose call
    hangs gets a fresh child that loads with the same mutant."""
    from kvsim.conform import triton_child

    source = _source(tmp_path)
    (source.root / "vllm" / "leaky.py").write_text(LEAKY)
    plus, minus = sorted((m for m in mutants(LEAKY, "vllm/leaky.py", ("value",))
                          if m.line == 6 and m.original == "1"), key=lambda m: m.replacement)[::-1]
    load = {"do": "load", "file": "vllm/leaky.py", "name": "value"}
    seen = []
    try:
        for mutant in (None, None, plus, plus, None, minus, None):
            with triton_child.shared(source, timeout=60, mutant=mutant) as child:
                seen.append(child.call("kvsim.conform.triton_child:selftest", load)["value"])
        assert seen == [11, 21, 12, 22, 11, 10, 11] and child.started == 1
        with triton_child.shared(source, timeout=2, mutant=plus) as child:
            with pytest.raises(Answered) as hung:
                child.call("kvsim.conform.triton_child:selftest", {"do": "hang"})
            assert isinstance(hung.value.answer, DidNotReturn)
            assert child.call("kvsim.conform.triton_child:selftest", load)["value"] == 12 and child.started == 2
    finally:
        triton_child.close_shared()


def test_the_kernel_child_ends_without_the_interpreters_teardown(tmp_path):
    """Closed, the kernel child ends at once: no interpreter teardown (torch and triton loaded, about half a second
    the parent waited for), seen here as an exit handler the code it loaded registered and that never runs."""
    from kvsim.conform import triton_child

    source = _source(tmp_path)
    marker = tmp_path / "torn-down"
    (source.root / "vllm" / "atexit_probe.py").write_text(
        f"def value():\n    import atexit\n    atexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
        f"    return 1\n")
    with triton_child.KernelChild(source, timeout=60) as child:
        assert child.call("kvsim.conform.triton_child:selftest",
                          {"do": "load", "file": "vllm/atexit_probe.py", "name": "value"})["value"] == 1
        process = child.process
    assert process.returncode == 0 and not marker.exists()


def test_the_real_import_targets_of_a_release_share_a_worker_and_the_longest_batches_go_first():
    from kvsim.conform.run import batches
    from kvsim.conform.targets import select_targets

    from kvsim.engine.conformance.adapters import Lockstep

    chosen = select_targets("vllm")
    kinds = [("installed" if a.installed else "kernel" if a.kernel else "lockstep" if isinstance(a, Lockstep) else "")
             for a in (t.resolve_adapter() for t in chosen)]
    assert "lockstep" in kinds and kinds.index("lockstep") > kinds.index("")  # declared after a one-shot target
    found = batches(chosen)
    assert sorted(i for b in found for i in b) == list(range(len(chosen)))  # each target once
    drivers = [{chosen[i].resolve_adapter().installed for i in b} for b in found]
    installed = [d for d in drivers if d != {""}]
    assert len(installed) == 1 and len(installed[0]) >= 2  # one batch: the release's one child runs every driver
    order = [kinds[b[0]] for b in found]
    assert order == sorted(order, key=("installed", "kernel", "lockstep", "").index)


@pytest.mark.parametrize("new", ["    return None\n", "    return [full]\n", "    return {'full': full}\n"])
def test_a_wrong_type_or_shape_is_a_divergence(tmp_path, new):
    old = TOY_SOURCE[TOY_SOURCE.index("    return {"):TOY_SOURCE.index("\n\n\nclass")] + "\n"
    result = _run(tmp_path, replace_text=(old, new))
    assert result.status == "diverges" and result.divergent == 1, result
    assert result.divergences[0]["input"]["n"] == 0  # shrunk to the empty plan


def test_a_failing_model_property_is_shrunk_beside_the_conforming_answers(tmp_path):
    # sizes[:cap] kept, but the sizes themselves shrink by one row: a divergence and a failing property
    result = _run(tmp_path, replace_text=("        out.append(size)\n", "        out.append(size - (size > 2))\n"))
    assert result.status == "diverges"
    prop = next(p for p in result.properties if p["property"] == "sizes_sum_to_n")
    assert prop["status"] == "fails" and prop["input"] == {"n": 3, "k": 3, "cap": 3}


def test_the_model_refusing_where_upstream_asserts_is_agreement(tmp_path):
    result = _run(tmp_path)
    assert result.status == "conforms"  # k <= 0 and cap < 0 are drawn: the model refuses, upstream asserts
    loose = _run(tmp_path, replace_text=("    assert k > 0 and cap >= 0\n", "    assert k > 0\n"))
    assert loose.status == "diverges" and loose.divergences[0]["input"]["cap"] == -1


def test_a_sweep_reports_its_smallest_divergence(tmp_path):
    result = _run(tmp_path, "SWEEP", replace_text=("    full = n // k\n", "    full = n // k if n < 7 else 0\n"))
    assert result.status == "diverges"
    assert result.divergences[0]["input"] == {"n": 7, "k": 1, "cap": 0}
    assert result.divergences[0]["difference"] == "full: model 7, upstream 0"


@pytest.mark.parametrize("replace_text, first, upstream", [
    (("    out = []\n", "    out = []\n    if n > 6:\n        raise ValueError('too many rows')\n"),
     {"n": 7, "k": 1, "cap": 0}, f"raised ValueError: too many rows ({TOY}:6)"),
    (("        start += size\n", "        start = size\n"), {"n": 2, "k": 1, "cap": 0}, "did not return within 2 s")])
def test_a_raise_or_a_hang_of_a_sweeps_upstream_call_is_its_divergence(tmp_path, replace_text, first, upstream):
    """The shape of the Sweep targets on a real release (pd_preemption_race, connector_hit_48195): the code under
    test raising or looping is the sweep's first divergence, with its input, and the sweep stops there."""
    result = _run(tmp_path, "SWEEP", replace_text=replace_text, options=replace(OPTIONS, call_timeout=2.0))
    assert result.status == "diverges", result
    (d,) = result.divergences
    assert d["input"] == first and d["upstream"] == upstream and d["difference"].startswith("the answer: model {")
    assert result.compared == 1 + 5 * 6 * first["n"] + 6 * first["k"]  # every smaller input, then this one


def test_a_property_the_code_under_test_never_answered_is_not_run_not_holds(tmp_path):
    """Where every call of the code under test raises (or hangs), the model's properties had no answer to check:
    they are "not run", never "holds" (a release whose call raises must not show its bug's property as holding)."""
    broken = _run(tmp_path, replace_text=("    assert k > 0 and cap >= 0\n", "    raise RuntimeError('broken')\n"))
    assert broken.status == "diverges"
    assert [(p["property"], p["status"]) for p in broken.properties] == [("sizes_sum_to_n", "not run")]
    healthy = _run(tmp_path / "healthy")
    assert [(p["property"], p["status"]) for p in healthy.properties] == [("sizes_sum_to_n", "holds")]


def test_a_lockstep_divergence_is_a_short_program(tmp_path):
    result = _run(tmp_path, "LOCKSTEP", names=("Counter",),
                  replace_text=("        if self.value + amount > self.limit:", "        if self.value + amount >= self.limit:"))
    assert result.status == "diverges"
    d = result.divergences[0]
    assert d["program"] == ["start(limit=0)", "add(0)"] and d["difference"] == "returned: model true, upstream false"


def test_the_run_budget_stops_a_target_between_two_calls(tmp_path):
    slow = ("    out = []\n", "    out = []\n    import time; time.sleep(0.05)\n")
    result = _run(tmp_path, replace_text=slow, options=replace(OPTIONS, until=time.monotonic() + 0.3))
    assert result.status == "incomplete" and "--max-seconds" in result.note
    spent = _run(tmp_path, options=replace(OPTIONS, until=time.monotonic() - 1))
    assert spent.status == "not run"


def test_coverage_counts_the_checked_definitions_only(tmp_path):
    from kvsim.conform.run import run_targets
    from kvsim.conform.targets import descriptors

    (result,) = run_targets([target("DIFF")], _source(tmp_path), descriptors(), OPTIONS, measure=True)
    cov = result.coverage
    assert cov["percent"] == 100.0 and cov["lines"] == 10 and list(cov["files"]) == [TOY]
    narrow = replace(OPTIONS, max_examples=1)
    (one,) = run_targets([target("DIFF")], _source(tmp_path), descriptors(), narrow, measure=True)
    assert one.coverage["percent"] < 100 and one.coverage["files"][TOY]["missed"]["plan"]


def test_a_measured_run_probes_only_its_targets_files(tmp_path, monkeypatch):
    """A process that loaded other files before (another target's, another release's: the loader's modules stay)
    measures a target by probing its own files only, with the same coverage."""
    from kvsim.conform.loader import load_definitions
    from kvsim.conform.run import run_targets
    from kvsim.conform.targets import descriptors
    from kvsim.engine.conformance import probes

    other = tmp_path / "other.py"
    other.write_text("def g(x):\n    return x + 1\n")
    kept = load_definitions(other, ["g"], where="vllm/other.py")  # alive, as the loader's modules stay
    probed = []
    made = probes.Probed.__init__
    monkeypatch.setattr(probes.Probed, "__init__", lambda self, filename, *a: (probed.append(filename),
                                                                                made(self, filename, *a))[1])
    (result,) = run_targets([target("DIFF")], _source(tmp_path), descriptors(), OPTIONS, measure=True)
    assert result.coverage["percent"] == 100.0 and result.coverage["lines"] == 10
    assert probed and kept.g.__code__.co_filename not in probed  # the toy's file only


def test_declared_unreached_lines_are_left_out_of_the_count_and_listed(tmp_path):
    """An Unreached names a statement by its text: it and its body leave the count (an `if`'s `else` does not)."""
    from kvsim.conform.run import run_targets
    from kvsim.conform.targets import descriptors
    from kvsim.engine.conformance.declare import Unreached
    from kvsim.engine.conformance.linetrace import statement_lines

    source = _source(tmp_path, ("    while start < n:\n", "    if cap > 99:\n        out.append(-1)\n"
                                                         "    else:\n        cap = cap\n    while start < n:\n"))
    narrow = replace(OPTIONS, max_examples=20)  # cap stays below 100: the `if` body never runs
    (plain,) = run_targets([target("DIFF")], source, descriptors(), narrow, measure=True)
    assert plain.coverage["files"][TOY]["missed"] == {"plan": [7]}
    declared = target("DIFF", unreached=(Unreached("plan", "if cap > 99:", "a cap past 99: the toy's inputs stop"),))
    (one,) = run_targets([declared], source, descriptors(), narrow, measure=True)
    cov = one.coverage["files"][TOY]
    assert cov["missed"] == {} and cov["documented"] == {"plan": [6, 7]} and one.coverage["percent"] == 100.0
    lines = statement_lines(source.file(TOY).read_text(), ["plan"])["plan"]
    assert one.coverage["lines"] == len(lines) - 2 and 9 in lines  # the `else` body (line 9) is still counted


def test_every_mutation_operator_makes_a_mutant_the_toy_kills(tmp_path):
    source = _source(tmp_path)
    found = mutants(TOY_SOURCE, TOY, ("plan", "Counter"))
    assert {m.operator for m in found} == set(OPERATORS)
    for m in found:  # every mutant compiles and keeps every line where it was
        text = m.apply(TOY_SOURCE)
        compile(text, TOY, "exec")
        assert text.count("\n") == TOY_SOURCE.count("\n")
    quick = replace(OPTIONS, shrink=False, call_timeout=1.0)
    killed = set()
    for m in found:
        if m.operator in killed:
            continue
        adapter, names = ("LOCKSTEP", ("Counter",)) if m.definition == "Counter" else ("DIFF", ("plan",))
        with mutated(m):
            result = run_target(target(adapter, names=names), source, quick)
        if result.status == "diverges":
            killed.add(m.operator)
    assert killed == set(OPERATORS)


KERNEL_SOURCE = """\
import triton


@triton.jit
def kernel(n, W):
    words = n // W
    return words


def host(n, W):
    return n // W
"""


def test_ceiling_division_in_a_triton_kernel_is_written_so_that_truncating_division_computes_it():
    """Triton's integer division truncates toward zero, so -(-a // b) is a // b there for a >= 0 (an equivalent
    mutant, not a regression): inside a jit function the ceiling is (a + b - 1) // b; outside, -(-a // b)."""
    ceil = {m.definition: m.replacement for m in mutants(KERNEL_SOURCE, "k.py", ("kernel", "host"))
            if m.operator == "division"}
    assert ceil == {"kernel": "(((n ) + ( W) - 1) // ( W))", "host": "(-(-(n )//( W)))"}
    trunc = lambda a, b: int(a / b)  # noqa: E731  (C's and Triton's integer division)
    a, b = 5, 4
    assert trunc(a + b - 1, b) == 2 and -trunc(-a, b) == 1 == a // b  # the old form is floor again there


def test_the_mutation_score_leaves_documented_equivalent_mutants_out(tmp_path):
    source = _source(tmp_path)
    plain = measure(target("DIFF"), source, OPTIONS, 0)
    swap = [s for s in plain.survivors if s["operator"] == "arguments" and s["original"].startswith("k, n - start")]
    assert swap and swap[0]["reached"]  # min(k, n - start) == min(n - start, k): survives, and ran
    documented = measure(target("DIFF", survivors=(Survivor("plan", "arguments", swap[0]["original"],
                                                            "min is symmetric"),)), source, OPTIONS, 0)
    assert [s["reason"] for s in documented.documented] == ["min is symmetric"]
    assert documented.score > plain.score and documented.killed == plain.killed


TWIN_LINES = """\
class Picker:
    def pick(self, a, b):
        size = a
        if size >= b:
            size -= 1
        if a is None:
            size -= 1
        return size
"""


def test_a_survivor_naming_its_replacement_and_line_covers_those_mutants_only():
    """A class holds siblings of one operator and text (`1` -> `0` and -> `2`, on two lines of the same text):
    `replacement` and `line` (a piece of the mutant's line or of a statement around it) narrow a declaration to the
    ones it names; the mutation score reads them (`documented`)."""
    from kvsim.conform.mutate import documented

    found = mutants(TWIN_LINES, "vllm/picker.py", ("Picker",))
    ones = {(m.line, m.replacement): m for m in found if (m.operator, m.original) == ("constant", "1")}
    assert sorted(ones) == [(5, "0"), (5, "2"), (7, "0"), (7, "2")]

    def covered(**narrow):
        survivor = Survivor("Picker", "constant", "1", "why", **narrow)
        return sorted(key for key, m in ones.items() if survivor.covers(m, TWIN_LINES))

    assert covered() == sorted(ones)  # as before: every sibling
    assert covered(replacement="2") == [(5, "2"), (7, "2")]
    assert covered(line="size -= 1") == sorted(ones)  # both lines hold that text
    assert covered(line="if a is None:") == [(7, "0"), (7, "2")]  # the statement around line 7 tells them apart
    assert covered(line="if a is None:", replacement="0") == [(7, "0")]
    assert covered(line="if size >= b:", replacement="2") == [(5, "2")]
    assert covered(line="return size") == [] and covered(replacement="3") == []
    assert not Survivor("Picker", "constant", "1", "why", line="size").covers(ones[(5, "0")])  # no text: no line
    narrow = Survivor("Picker", "assignment", "-=", "equivalent", replacement="=", line="if a is None:")
    toy = target("DIFF", survivors=(Survivor("Picker", "constant", "1", "the first", line="if size >= b:"), narrow))
    reasons = {(m.line, m.operator, m.replacement): documented(toy, m, TWIN_LINES) for m in found}
    assert {key: why for key, why in reasons.items() if why} == {
        (5, "constant", "0"): "the first", (5, "constant", "2"): "the first", (7, "assignment", "="): "equivalent"}


def test_a_mutant_of_another_file_changes_nothing(tmp_path):
    m = Mutant("vllm/other.py", "plan", "constant", 1, 0, 1, "x", "y")
    with mutated(m):
        assert _run(tmp_path).status == "conforms"


def test_sample_is_spread_and_stable():
    found = mutants(TOY_SOURCE, TOY, ("plan",))
    assert sample(found, 5) == sample(found, 5) and len(sample(found, 5)) == 5
    assert sample(found, 5)[0].start < sample(found, 5)[-1].start and sample(found, 999) == found


# -- the parts ----------------------------------------------------------------------------------------

def test_compare_names_the_first_differing_field():
    import numpy as np

    assert Exact().difference({"a": [1, 2]}, {"a": [1, 3]}).line() == "a[1]: model 2, upstream 3"
    assert Exact().difference({"a": [1, 2]}, {"a": [1]}).path == "a (length)"
    assert Exact().difference(3, 3.0) is not None and Exact().difference(True, 1) is not None
    arrays = Exact().difference({"m": np.zeros(4, np.uint8)}, {"m": np.array([0, 0, 7, 7], np.uint8)})
    assert arrays.line() == "m[2]: model 0, upstream 7 (2 of 4 elements differ)"
    assert Close(rtol=1e-3, atol=0).difference(np.array([1.0, np.nan]), np.array([1.0005, np.nan])) is None
    assert Close(rtol=1e-3, atol=0).difference(np.array([np.inf]), np.array([1e300])) is not None


def test_the_deadline_nests_inside_the_commands_alarm():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *a: fired.append(time.monotonic()))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.6)
        started = time.monotonic()
        with pytest.raises(deadline.CallTimeout):
            with deadline.within(0.2):
                while True:
                    pass
        assert not fired  # the inner deadline fired first, and the outer alarm is still armed
        while not fired and time.monotonic() - started < 30:
            time.sleep(0.01)
        assert fired and fired[0] - started >= 0.5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_tick_that_lands_in_the_clean_up_leaves_no_alarm_behind(monkeypatch):
    """The call returned just as its deadline came: the tick lands in `within`'s clean-up. It must not raise there
    (the handler would stay installed, the timer re-armed, and CallTimeout would hit whatever runs next: it took
    down a pytest-xdist worker idling between tests)."""
    from types import SimpleNamespace

    clock = [0.0]
    landed: list[int] = []
    real = signal.setitimer

    def setitimer(which, seconds, interval=0.0):  # type: ignore[no-untyped-def]
        if seconds == 0 and not landed:
            landed.append(1)
            clock[0] = 10.0  # past the call's deadline
            signal.getsignal(signal.SIGALRM)(signal.SIGALRM, None)  # the tick, inside the clean-up
        return real(which, seconds, interval)

    before = signal.getsignal(signal.SIGALRM)
    monkeypatch.setattr(deadline, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(signal, "setitimer", setitimer)
    with deadline.within(1.0, memory=None):
        pass
    assert landed and signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_deadline_left_behind_by_its_with_statement_disarms_itself():
    """A raise that lands in the `with` statement's own exit (before `within`'s clean-up can run) leaves the
    deadline's handler installed and its timer ticking; it took down an idle pytest-xdist worker on a busy machine
    (CallTimeout raised in execnet's wait). A tick that lands outside the with statement's frame puts back what
    was there and raises nothing."""
    before = signal.getsignal(signal.SIGALRM)

    def left_behind():
        manager = deadline.within(0.05, memory=None)
        manager.__enter__()  # never exited, as when a raise lands between the body and __exit__
        return manager

    kept = left_behind()  # held, so nothing closes it
    started = time.monotonic()
    # the deadline passes here, and its ticks land here: nothing is raised, and the first tick puts things back
    while signal.getsignal(signal.SIGALRM) is not before and time.monotonic() - started < 60:
        sum(range(1000))
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    del kept


def test_ticks_that_land_all_along_the_way_out_of_a_hung_call_do_not_escape_its_capture():
    """After the first raise the ticks go on (to raise again should it be swallowed). On a busy machine one landed
    as `within`'s clean-up began and the next in the caller's `except CallTimeout`: CallTimeout escaped `capture`
    and failed a CI run. Here a tick lands at every line and call on the way out, from the first raise until
    `capture` returns: its answer is DidNotReturn, and the alarm is put back."""
    from kvsim.engine.conformance.answers import DidNotReturn, capture

    before = signal.getsignal(signal.SIGALRM)
    raised: list[int] = []
    ticks: list[str] = []
    raised_again: list[str] = []

    def hang():
        while True:
            pass

    def tick(frame, event, arg):  # type: ignore[no-untyped-def]
        if frame.f_code.co_name in ("hang", "expire", "arm", "_under", "_leaving"):
            return None  # the hung call runs untraced (the deadline's signal lands in it, not in this tracer)
        if event == "exception" and frame.f_code is capture.__code__ and issubclass(arg[0], deadline.CallTimeout):
            raised.append(1)  # the deadline's first raise, come out of the hung call
        elif raised and event in ("call", "line", "return"):
            handler = signal.getsignal(signal.SIGALRM)
            if handler is not before and callable(handler):
                ticks.append(frame.f_code.co_name)
                try:
                    handler(signal.SIGALRM, frame)
                except deadline.CallTimeout:
                    raised_again.append(frame.f_code.co_name)  # (a raise here also ends the tracing)
                    raise
        return tick

    sys.settrace(tick)
    try:
        answer = capture(hang, seconds=0.05)
    finally:
        sys.settrace(None)
    assert isinstance(answer, DidNotReturn), answer
    assert not raised_again, raised_again
    assert {"__exit__", "within", "close"} <= set(ticks), ticks  # the ticks did land along the way out
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_call_that_spends_its_time_collecting_garbage_is_stopped():
    """A signal that comes while the garbage collector runs is handled in a collector callback (Hypothesis installs
    one), where a raise is only printed. A call that allocated as it looped, in a large process, spent nearly all
    its time collecting: the deadline's raises were swallowed one after another and the call grew to 10 GB (a
    mutant of SGLang's grid segments, run after the vLLM targets). Here every allocation collects and each
    collection sleeps in its callback, so nearly every tick lands there: the call is still stopped, well before it
    has collected 2,000 times (2 s of sleep), and the collector is as it was. (After the first raise, a tick that
    lands in the call raises again: one fix had taken every frame of the call for the way out of it.)"""
    collections: list[int] = []

    def slow_callback(phase, info):  # type: ignore[no-untyped-def]
        collections.append(1)
        time.sleep(0.001)  # a signal that comes now is handled here, in the callback

    def allocating():
        junk = []
        while len(collections) < 2000 and len(junk) < 10 ** 7:  # (10 ** 7: the collector is off, not a raise)
            junk.append([])
        return "ran to the end: every raise was swallowed"

    threshold = gc.get_threshold()
    gc.callbacks.append(slow_callback)
    gc.set_threshold(1)
    try:
        with pytest.raises(deadline.CallTimeout):
            with deadline.within(0.2, memory=None):
                allocating()
    finally:
        gc.callbacks.remove(slow_callback)
        gc.set_threshold(*threshold)
    assert gc.isenabled() and len(collections) < 2000


def test_a_call_growing_past_its_memory_bound_is_stopped():
    with pytest.raises(deadline.CallTimeout, match="GiB of memory"):
        with deadline.within(60, memory=64 * 2 ** 20):
            hoard = []
            while True:
                hoard.append(bytearray(2 ** 20))


def test_the_kernel_child_answers_raises_deaths_and_hangs_and_leaves_no_process(tmp_path):
    source = _source(tmp_path)
    runner = "kvsim.conform.triton_child:selftest"
    with KernelChild(source, "cpu", timeout=2.0) as child:
        assert child.call(runner, {"echo": 7}) == {"echo": 7}
        with pytest.raises(Answered) as raised:
            child.call(runner, {"do": "raise", "message": "boom"})
        assert isinstance(raised.value.answer, Raised) and raised.value.answer.message == "boom"
        pid = child.process.pid
        with pytest.raises(Answered) as hung:
            child.call(runner, {"do": "hang"})
        assert isinstance(hung.value.answer, DidNotReturn)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the hung child (and its process group) is gone
        with pytest.raises(Answered) as died:
            child.call(runner, {"do": "exit", "code": 5})  # a fresh child, which then dies
        assert died.value.answer.type == "ChildDied" and "(5" in died.value.answer.message
        assert child.call(runner, {"echo": "again"}) == {"echo": "again"} and child.started == 3



@pytest.mark.parametrize("inside", [False, True])
def test_a_stop_during_a_mutation_run_reports_what_ran_and_ends_incomplete(tmp_path, capsys, monkeypatch, inside):
    """`--mutants` under Ctrl-C or SIGTERM (a CI job cancelled): the mutant running when the stop came counts as not
    run, the rest are named as not run, the report of what ran is printed and the exit is 3, or 1 with a survivor
    among them (before, SIGTERM ended the process at once: no report, and the kernel child left running in its own
    session). `inside`: the stop lands as the second mutant starts (its run raises at its first example); else as
    it ends (its result counts)."""
    import argparse
    import json

    from kvsim.conform import mutate

    real, calls, before = mutate.run_targets, [], signal.getsignal(signal.SIGTERM)

    def run_and_stop(*args, **kw):
        calls.append(1)
        if inside and len(calls) == 3:  # the unmutated run, one mutant, then the stop as the second starts
            os.kill(os.getpid(), signal.SIGTERM)
        out = real(*args, **kw)
        if not inside and len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(mutate, "run_targets", run_and_stop)
    args = argparse.Namespace(junit=None, json=True, mutants=0)
    code = mutate.cmd_mutants(args, _source(tmp_path), [target("DIFF"), target("LOCKSTEP", names=("Counter",))],
                              replace(OPTIONS, max_examples=20))
    first, second = json.loads(capsys.readouterr().out)["mutation"]
    assert code == (1 if first["survived"] else 3)  # a survivor among what ran is still exit 1
    assert first["status"] == "incomplete" and first["note"] == mutate.STOPPED
    ran = first["killed"] + first["not_loadable"] + first["survived"] + len(first["documented"])
    assert ran == (1 if inside else 2) and first["not_run"] == first["mutants"] - ran > 0
    assert (second["status"], second["mutants"], second["note"]) == ("incomplete", 0, mutate.STOPPED)
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler is gone with it


def test_a_lockstep_strategy_is_made_once_for_equal_arguments():
    """`strategy_of` / `sampled`: the strategy a lockstep builds each step from what is enabled is made (and
    validated) once for equal arguments, and draws what a fresh one draws; an argument with no hash builds anew."""
    from hypothesis import given, settings, strategies as st

    from kvsim.engine.conformance.adapters import sampled, strategy_of

    assert sampled([("a", 1), ("b", 2)]) is sampled((("a", 1), ("b", 2)))
    assert sampled([("a", 1)]) is not sampled([("a", 2)])
    built = []
    make = lambda xs: built.append(1) or st.sampled_from(xs)  # noqa: E731
    strategy_of(make, [1, 2]), strategy_of(make, [1, 2])
    assert len(built) == 2  # a list: no hash, made each time

    def draws(strategy):
        seen = []

        def keep(value):
            seen.append(value)

        settings(max_examples=30, derandomize=True, database=None)(given(strategy)(keep))()
        return seen

    cached = sampled(range(7))
    draws(cached)  # drawn once already: the second run draws from a validated, used strategy
    assert draws(cached) == draws(st.sampled_from(tuple(range(7))))
