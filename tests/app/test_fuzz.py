"""`kvsim fuzz`: workers share one example database; a counterexample found once is replayed by every later run."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import threading

import pytest

from clihelp import kvsim, kvsim_json
from kvsim.app import fuzz
from kvsim.engine.errors import ConfigError
from kvsim.engine.interrupt import stopping_on_signals
from kvsim.engine.progress import Progress

BUGGY = ("swa-budget", "pre_af7c62e", "resumed_requests_fit_physical_pages")


def test_two_workers_find_the_bug_and_report_their_rates(tmp_path):
    # bounded in examples, not minutes: each worker's own seeds find the bug within its 500, on any machine
    doc = kvsim_json("fuzz", "swa-budget", "--variant", "pre_af7c62e", "--property", BUGGY[2],
                     "--property", "budgets_stay_nonnegative", "--workers", "2", "--minutes", "30",
                     "--max-examples", "500", "--database", str(tmp_path / "db"), expect=1)
    found, clean = doc["results"]
    assert found["property"] == BUGGY[2] and found["status"] == "failed" and found["found_by"]
    assert found["counterexample"]["case"]["page_size"] > 1
    assert clean["status"] == "passed" and clean["examples"] >= 2 * fuzz.ROUND
    assert [w["worker"] for w in doc["workers"]] == [0, 1]
    assert all(w["examples"] > 0 and w["examples_per_second"] > 0 for w in doc["workers"])
    # the replay line replays the saved example from the database at once
    replay = found["replay"].split()[1:]
    again = kvsim_json(*replay, expect=1)
    assert again["results"][0]["status"] == "failed"


def test_a_saved_counterexample_is_replayed_by_a_later_worker(tmp_path):
    model, variant, prop = BUGGY
    db = str(tmp_path / "db")
    # one example a round, one round: this seed alone does not find the bug ...
    alone = fuzz.work(model, variant, [prop], {}, str(tmp_path / "empty"), 0, 7, 0.0, round_examples=1)
    assert alone["results"][prop]["failure"] is None
    # ... but after any worker saved the bug in the shared database, the same worker replays it first
    first = fuzz.work(model, variant, [prop], {}, db, 1, 0, 120.0)  # searches until it finds the bug
    assert first["results"][prop]["failure"] is not None
    later = fuzz.work(model, variant, [prop], {}, db, 0, 7, 0.0, round_examples=1)
    assert later["results"][prop]["failure"] is not None
    assert later["results"][prop]["failure"]["counterexample"] == first["results"][prop]["failure"]["counterexample"]


def test_each_property_keeps_its_own_examples(tmp_path):
    # two properties over the same strategy that both fail on the variant: were the examples shared, the second
    # would replay the first's saved failure (the same case fails it too) on its first example
    model, variant, prop = BUGGY
    other = "alloc_calls_match_resumed"
    assert fuzz.work(model, variant, [other], {}, str(tmp_path / "fresh"), 0, 7, 0.0,
                     round_examples=1)["results"][other]["failure"] is None
    db = str(tmp_path / "db")
    found = fuzz.work(model, variant, [prop], {}, db, 0, 0, 120.0)["results"][prop]["failure"]
    assert "fills" in found["counterexample"]["case"]
    assert fuzz.work(model, variant, [other], {}, db, 0, 7, 0.0, round_examples=1)["results"][other]["failure"] is None
    assert fuzz.work(model, variant, [prop], {}, db, 0, 7, 0.0, round_examples=1)["results"][prop]["failure"]


def test_a_database_that_cannot_be_made_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = kvsim("fuzz", "swa-budget", "--minutes", "0.01", "--database", str(blocker / "db"), "--json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["error"]["field"] == "--database"


def test_a_database_a_worker_does_not_see_is_refused(tmp_path, monkeypatch):
    # worker 1 runs where the folder is not (another machine's disk): its examples would never reach the others
    real = fuzz.sees
    monkeypatch.setattr(fuzz, "sees", lambda probe, token, reply: not reply.endswith("-1")
                        and real(probe, token, reply))
    model, variant, prop = BUGGY
    with pytest.raises(ConfigError, match=r"^--database: expected a directory every worker sees .*\(worker 1 cannot"):
        fuzz.fuzz(model, variant, [prop], {}, str(tmp_path / "db"), 2, 0, 1.0)
    assert [p.name for p in (tmp_path / "db").iterdir() if p.name.startswith(".kvsim-probe")] == []


def test_fuzz_on_a_local_ray_cluster(tmp_path):
    pytest.importorskip("ray", reason="ray is in the test extra; CI installs it")
    model, variant, prop = BUGGY
    doc = fuzz.fuzz(model, variant, [prop], {}, str(tmp_path / "db"), 2, 0, 120.0, ray_address="local")
    assert doc["results"][0]["status"] == "failed" and len(doc["workers"]) == 2


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("workers", [1, 2])
def test_a_terminal_sees_the_examples_run_so_far(tmp_path, workers):
    screen = Terminal()
    doc = fuzz.fuzz("swa-budget", "fixed", ["budgets_stay_nonnegative"], {}, str(tmp_path / "db"), workers, 0, 2.0,
                    progress=Progress(None, "fuzz", screen))
    counts = [int(n.replace(",", "")) for n in re.findall(r"fuzz: ([\d,]+) examples so far", screen.getvalue())]
    assert counts and counts == sorted(counts) and 0 < counts[-1] <= doc["results"][0]["examples"]
    assert f"{workers} worker" in screen.getvalue() and "2 s budget" in screen.getvalue()
    quiet = io.StringIO()  # not a terminal: no line, no ticker
    fuzz.fuzz("swa-budget", "fixed", ["budgets_stay_nonnegative"], {}, str(tmp_path / "db"), workers, 0, 0.5,
              progress=Progress(None, "fuzz", quiet))
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_ends_the_workers_early_with_what_they_ran(tmp_path, workers):
    # SIGTERM reaches this process only: forked workers hear of it through shared memory
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        with stopping_on_signals():
            doc = fuzz.fuzz("swa-budget", "fixed", ["budgets_stay_nonnegative"], {}, str(tmp_path / "db"), workers,
                            0, 120.0)
    finally:
        timer.cancel()
    assert doc["interrupted"] is True and doc["results"][0]["examples"] > 0
    assert all(w["seconds"] < 60 for w in doc["workers"]) and len(doc["workers"]) == workers
    assert signal.getsignal(signal.SIGTERM) is before  # the handler as it was


def test_cli_fuzz_stopped_early_says_so_and_exits_3(tmp_path, capsys, monkeypatch):
    from kvsim.app import cli

    real = fuzz.fuzz

    def stopped(*args, **kwargs):  # SIGTERM as the workers start
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(fuzz, "fuzz", stopped)
    argv = ["fuzz", "swa-budget", "--property", "budgets_stay_nonnegative", "--workers", "1", "--minutes", "2",
            "--database", str(tmp_path / "db")]
    assert cli.main(argv) == 3
    assert "stopped early: an interrupt (Ctrl-C or SIGTERM) ended the workers" in capsys.readouterr().out


def test_each_sometimes_is_met_by_any_round_of_any_worker(tmp_path):
    # three examples a round: the budget first cuts the queue in the second round, which the record says
    doc = fuzz.fuzz("swa-budget", "fixed", ["budgets_stay_nonnegative"], {}, str(tmp_path / "db"), 1, 0, 120.0,
                    round_examples=3, max_examples=30)
    (result,) = doc["results"]
    met = {g["name"]: (g["status"], g["worker"], g["round"], g["drawn"]) for g in result["reachability"]}
    assert met == {"a_request_resumes": ("reached", 0, 0, 30), "the_budget_stops_the_queue": ("reached", 0, 1, 30),
                   "a_fill_ends_mid_page": ("reached", 0, 0, 30)}
    first = next(g for g in result["reachability"] if g["name"] == "the_budget_stops_the_queue")
    assert first["case"]["fills"] and 1 <= first["example"] <= 3


def test_fuzz_fails_a_property_that_holds_but_never_draws_what_it_declares(tmp_path, capsys, monkeypatch):
    from dataclasses import replace

    from kvsim.app import catalog, cli
    from kvsim.engine.system import Sometimes

    reg, key = catalog.load(), ("swa-budget", "budgets_stay_nonnegative")
    never = Sometimes("a_thousand_requests", lambda case: len(case.fills) >= 1000, "1,000 retracted requests")
    monkeypatch.setitem(reg.properties, key, replace(reg.properties[key], sometimes=(never,)))
    argv = ["fuzz", key[0], "--property", key[1], "--workers", "1", "--minutes", "30", "--database",
            str(tmp_path / "db")]
    assert cli.main([*argv, "--max-examples", "250", "--json"]) == 1
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["status"] == "passed" and result["examples"] == 250
    assert [(g["name"], g["status"], g["drawn"]) for g in result["reachability"]] == [
        ("a_thousand_requests", "unreached", 250)]
    assert cli.main([*argv, "--max-examples", "250"]) == 1
    text = capsys.readouterr().out
    assert "UNREACHED sometimes a_thousand_requests (budgets_stay_nonnegative): no case of 250 drawn" in text
    assert "every property holds, but budgets_stay_nonnegative never draws a_thousand_requests" in text
    assert cli.main([*argv, "--max-examples", "100"]) == 0  # fewer than 200 examples: a bound, named, not failed
    assert "(a bound, not a failure): a_thousand_requests (budgets_stay_nonnegative)" in capsys.readouterr().out
