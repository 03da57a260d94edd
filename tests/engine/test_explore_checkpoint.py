"""A search saved to a checkpoint goes on to the result one uninterrupted search gives (`--checkpoint`, `--resume`)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from clihelp import kvsim, kvsim_json
from kvsim.engine.errors import ConfigError
from kvsim.engine.explore import ExploreOptions, checkpoint, explore
from kvsim.engine.explore.checkpoint import CURRENT, LOCK, CheckpointDir, code_digest
from kvsim.engine.explore.parallel import explore_parallel
from kvsim.engine.explore.partition import Partition
from kvsim.engine.interrupt import INTERRUPT, stopping_on_signals
from test_explore_scale import REAL, outcome, run_of
from toys import Counter


def resumed_in_thirds(search, whole, folder):
    """`search(max_states=..., checkpoint=..., resume=...)` cut by the state bound at a third of the states, saved,
    and resumed from the folder (a fresh `CheckpointDir` each time, as a new process has) until it finishes."""
    step = max(1, whole.states // 3)
    result, runs = search(max_states=step, checkpoint=CheckpointDir(folder, {"what": "test"}), resume=False), 1
    while result.bound_hit == "states":
        assert result.checkpoint == str(folder) and result.states < whole.states
        result = search(max_states=result.states + step, checkpoint=CheckpointDir(folder, {"what": "test"}),
                        resume=True)
        runs += 1
    assert result.resumed and runs >= 3
    return result


@pytest.mark.parametrize("store", ["full", "fingerprint"])
@pytest.mark.parametrize("model,variant", REAL)
def test_a_resumed_search_ends_as_one_uninterrupted_search(model, variant, store, tmp_path):
    system = run_of(model, variant).system()
    whole = explore(system, ExploreOptions(store=store))
    result = resumed_in_thirds(lambda **kw: explore(system, ExploreOptions(store=store, **kw)), whole, tmp_path)
    assert outcome(result) == outcome(whole)
    assert [v.state for v in result.violations] == [v.state for v in whole.violations]
    assert result.checkpoint is None  # it finished: nothing was saved by the last run


@pytest.mark.parametrize("store", ["full", "fingerprint"])
def test_a_resumed_partitioned_search_ends_as_one_uninterrupted_one(store, tmp_path):
    run = run_of("pd-staging", "pre_05c7ebf")
    plain = explore_parallel(run.system, 2, ExploreOptions(store=store))
    # a search that may be resumed routes states by fingerprint (the same in every process), not by hash: with a
    # checkpoint that never saves, the uninterrupted search splits the states as the resumed one does
    whole = explore_parallel(run.system, 2,
                             ExploreOptions(store=store, checkpoint=CheckpointDir(tmp_path / "never", {}, every=None)))
    assert whole.checkpoint is None and outcome(whole, with_paths=False) == outcome(plain, with_paths=False)
    result = resumed_in_thirds(lambda **kw: explore_parallel(run.system, 2, ExploreOptions(store=store, **kw)), whole,
                               tmp_path / "search")
    assert outcome(result) == outcome(whole)  # the same worker split: even the same paths
    assert result.violations and [v.trace for v in result.violations] == [v.trace for v in whole.violations]


def test_a_search_saved_by_ray_actors_goes_on_in_worker_processes(tmp_path):
    # each partition writes and reads its own part, whichever pool runs it: Ray actors here, forked processes after
    pytest.importorskip("ray", reason="ray is in the test extra; CI installs it")
    run = run_of("pd-staging", "pre_05c7ebf")
    whole = explore_parallel(run.system, 2,
                             ExploreOptions(checkpoint=CheckpointDir(tmp_path / "never", {}, every=None)))
    cut = explore_parallel(run.system, 2, ExploreOptions(max_states=whole.states // 2,
                                                         checkpoint=CheckpointDir(tmp_path / "search", {})),
                           use_ray=True)
    assert cut.bound_hit == "states" and sorted(os.listdir(checkpoint.CheckpointDir(tmp_path / "search", {}).current())) \
        == ["partition-0.pkl", "partition-1.pkl", "search.pkl"]
    result = explore_parallel(run.system, 2, ExploreOptions(checkpoint=CheckpointDir(tmp_path / "search", {}),
                                                            resume=True))
    assert outcome(result) == outcome(whole)


def test_a_folder_a_worker_does_not_see_is_refused_before_the_search(tmp_path, monkeypatch):
    # worker 1 runs where the folder is not (another machine's disk): refused with one line before any work,
    # and the probe leaves nothing behind
    real = Partition.sees
    monkeypatch.setattr(Partition, "sees", staticmethod(lambda probe, token, reply: not reply.endswith("-1")
                                                        and real(probe, token, reply)))
    run = run_of("pd-staging", "pre_05c7ebf")
    with pytest.raises(ConfigError, match=r"^checkpoint: expected a folder every worker sees .* \(worker 1 cannot"):
        explore_parallel(run.system, 2, ExploreOptions(checkpoint=CheckpointDir(tmp_path / "search", {})))
    assert os.listdir(tmp_path / "search") == [LOCK]  # the search held the folder; the probe left nothing


def test_a_save_that_fails_ends_with_one_line_and_leaves_the_last_save_in_force(tmp_path, monkeypatch):
    # a worker's disk is full at the second save: one line, not a traceback; the first save is resumed as if
    # the failed run had never been
    run = run_of("pd-staging", "pre_05c7ebf")
    whole = explore_parallel(run.system, 2,
                             ExploreOptions(checkpoint=CheckpointDir(tmp_path / "never", {}, every=None)))
    explore_parallel(run.system, 2, ExploreOptions(max_states=whole.states // 3,
                                                   checkpoint=CheckpointDir(tmp_path / "search", {})))
    first = CheckpointDir(tmp_path / "search", {}).current()

    def full(self, path, key):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Partition, "save", full)  # the forked workers inherit it
    with pytest.raises(ConfigError, match=r"^resume: expected a folder the search can save to, .* \(saving failed: "
                                          r".*No space left on device; the last complete save stays in force\)$"):
        explore_parallel(run.system, 2, ExploreOptions(max_states=2 * whole.states // 3,
                                                       checkpoint=CheckpointDir(tmp_path / "search", {}), resume=True))
    monkeypatch.undo()
    assert CheckpointDir(tmp_path / "search", {}).current() == first
    result = explore_parallel(run.system, 2, ExploreOptions(checkpoint=CheckpointDir(tmp_path / "search", {}),
                                                            resume=True))
    assert outcome(result) == outcome(whole)
    monkeypatch.setattr(checkpoint, "dump", lambda path, key, *objects: full(None, path, key))  # a first save
    with pytest.raises(ConfigError, match=r"^checkpoint: .*No space left on device; nothing was saved\)$"):
        explore(run.system(), ExploreOptions(max_states=whole.states // 3,
                                             checkpoint=CheckpointDir(tmp_path / "other", {})))


def test_a_depth_bound_stays_the_searchs_own_across_a_resume(tmp_path):
    system = run_of("pd-protocol", "pre_35281").system()
    whole = explore(system, ExploreOptions(max_depth=9))
    assert whole.bound_hit == "depth"
    result = resumed_in_thirds(lambda **kw: explore(system, ExploreOptions(max_depth=9, **kw)), whole, tmp_path)
    assert outcome(result) == outcome(whole)


class Killed(Exception):
    """Stands for the process being killed while the search runs."""


def test_a_search_killed_after_a_periodic_save_goes_on_from_it(tmp_path):
    # every=0: a save at each check (every 4,096 states); the third check kills the search after two saves
    system = Counter(limit=20_000, bad=None)
    whole = explore(system, ExploreOptions(store="fingerprint"))
    calls = []

    def progress(states, depth):
        calls.append(states)
        if len(calls) == 3:
            raise Killed

    with pytest.raises(Killed):
        explore(system, ExploreOptions(store="fingerprint", progress=progress,
                                       checkpoint=CheckpointDir(tmp_path, {}, every=0)))
    result = explore(system, ExploreOptions(store="fingerprint", checkpoint=CheckpointDir(tmp_path, {}, every=None),
                                            resume=True))
    assert outcome(result) == outcome(whole) and result.resumed
    assert len(list(tmp_path.glob("gen-*"))) == 1  # older generations are dropped once a newer one is in force


def test_a_partitioned_search_killed_after_a_periodic_save_goes_on_from_it(tmp_path):
    run = run_of("pd-staging", "pre_05c7ebf")
    whole = explore_parallel(run.system, 2, ExploreOptions(store="fingerprint",
                             checkpoint=CheckpointDir(tmp_path / "never", {}, every=None)))  # routed alike
    levels = []

    def progress(states, level):
        levels.append(level)
        if level == 6:
            raise Killed

    with pytest.raises(Killed):
        explore_parallel(run.system, 2, ExploreOptions(store="fingerprint", progress=progress,
                         checkpoint=CheckpointDir(tmp_path / "search", {}, every=0)))
    result = explore_parallel(run.system, 2, ExploreOptions(store="fingerprint", resume=True,
                              checkpoint=CheckpointDir(tmp_path / "search", {}, every=None)))
    assert outcome(result) == outcome(whole)


def test_periodic_saves_come_every_interval_but_not_just_before_the_deadline(tmp_path):
    saves = CheckpointDir(tmp_path, {}, every=10)
    saves.schedule(100.0)
    assert not saves.due(105.0, None) and saves.due(110.0, None) and saves.due(110.0, 115.5)
    assert not saves.due(110.0, 115.0)  # the save at the --max-seconds bound comes within half an interval
    assert not CheckpointDir(tmp_path, {}, every=None).due(1e9, None)


def test_a_half_written_save_leaves_the_last_complete_one_in_force(tmp_path):
    system = Counter(limit=30, bad=None)
    whole = explore(system)
    cut = explore(system, ExploreOptions(max_states=10, checkpoint=CheckpointDir(tmp_path, {})))
    assert cut.bound_hit == "states"
    torn = CheckpointDir(tmp_path, {}).begin()  # a newer generation the process died writing
    (tmp_path / os.path.basename(torn) / "search.pkl").write_bytes(b"\x80\x05 half")
    result = explore(system, ExploreOptions(checkpoint=CheckpointDir(tmp_path, {}), resume=True))
    assert outcome(result) == outcome(whole)


def test_a_checkpoint_of_another_search_is_refused(tmp_path):
    explore(Counter(limit=30, bad=None), ExploreOptions(max_states=10,
                                                        checkpoint=CheckpointDir(tmp_path, {"model": "counter"})))
    with pytest.raises(ConfigError, match=r"^resume: .*\(model counter\).*model pair"):
        CheckpointDir(tmp_path, {"model": "pair"}).resume()
    with pytest.raises(ConfigError, match="^checkpoint: expected a new or empty folder"):
        CheckpointDir(tmp_path, {"model": "counter"}).fresh()
    with pytest.raises(ConfigError, match="over 2 workers"):  # a single-process save is no partitioned one
        explore_parallel(lambda: Counter(limit=30, bad=None), 2,
                                         ExploreOptions(checkpoint=CheckpointDir(tmp_path, {"model": "counter"}),
                         resume=True))


def test_a_folder_another_search_is_using_is_refused_before_it_starts(tmp_path):
    """Two searches named to one folder would write their generations over each other (the second's `begin` even
    removes the first's half-written one): while a search holds the folder, a second one, new or resumed, in
    one process or over workers, is refused with one line naming the process that holds it, and writes nothing."""
    folder = tmp_path / "search"

    def search(workers: int = 1, **kw):
        options = ExploreOptions(**{"max_states": 10, **kw}, checkpoint=CheckpointDir(folder, {"model": "counter"}))
        system = lambda: Counter(limit=30, bad=None)  # noqa: E731
        return explore(system(), options) if workers == 1 else explore_parallel(system, workers, options)

    with CheckpointDir(folder, {"model": "counter"}).held("checkpoint"):
        for workers in (1, 2):
            with pytest.raises(ConfigError, match=rf"^checkpoint: expected a folder no other search is saving to, "
                                                  rf".*\(the search of process {os.getpid()} holds it"):
                search(workers)
        assert os.listdir(folder) == [LOCK]
    cut = search()  # let go: the folder is the next search's
    assert cut.bound_hit == "states" and cut.checkpoint == str(folder)
    with CheckpointDir(folder, {"model": "counter"}).held("resume"):
        for workers in (1, 2):
            with pytest.raises(ConfigError, match=r"^resume: expected a folder no other search is saving to"):
                search(workers, resume=True)
    assert search(resume=True, max_states=1000).bound_hit is None  # saved before, goes on as ever


@pytest.mark.parametrize("error", ["ENOLCK", "EIO"])
def test_a_folder_that_keeps_no_locks_is_searched_unguarded_and_a_failed_lock_is_one_line(error, tmp_path, monkeypatch):
    """Some network mounts keep no locks (`flock` answers ENOLCK): the search goes on as before there was a lock.
    Any other failure to lock is refused with one line, not a traceback."""
    import errno

    def flock(fd, op):
        raise OSError(getattr(errno, error), os.strerror(getattr(errno, error)))

    monkeypatch.setattr(checkpoint.fcntl, "flock", flock)
    options = ExploreOptions(max_states=10, checkpoint=CheckpointDir(tmp_path / "search", {"model": "counter"}))
    if error == "ENOLCK":
        assert explore(Counter(limit=30, bad=None), options).checkpoint == str(tmp_path / "search")
    else:
        with pytest.raises(ConfigError, match=r"^checkpoint: expected a folder the search can save to, .*\(locking "
                                              r"it failed: Input/output error\)$"):
            explore(Counter(limit=30, bad=None), options)


def test_the_code_digest_follows_every_source_file(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text("X = 1\n")

    class Module:
        __file__ = str(pkg / "model.py")

    before = code_digest(Module)
    assert code_digest(Module) == before
    (pkg / "model.py").write_text("X = 2\n")
    assert code_digest(Module) != before
    (pkg / "model.py").write_text("X = 1\n")
    (pkg / "more.py").write_text("")
    assert code_digest(Module) != before
    assert code_digest(checkpoint) != code_digest(Module)


# -- the command line --------------------------------------------------------------------------------------------

def test_cli_checkpoint_then_resume_gives_the_uninterrupted_result(tmp_path):
    args = ("explore", "pd-staging", "--variant", "pre_05c7ebf", "--store", "fingerprint")
    whole = kvsim_json(*args, expect=1)
    folder = str(tmp_path / "search")
    cut = kvsim_json(*args, "--max-states", "300", "--checkpoint", folder, expect=1)
    assert cut["bound_hit"] == "states" and cut["checkpoint"] == folder and cut["resumed"] is False
    done = kvsim_json(*args, "--resume", folder, expect=1)
    assert done["resumed"] is True and done["checkpoint"] is None and done["complete"] is True
    for key in ("states", "transitions", "depth", "hang_states", "coverage", "states_per_depth", "violations"):
        assert done[key] == whole[key], key
    text = kvsim(*args, "--max-states", "300", "--checkpoint", str(tmp_path / "again"))
    assert f"--resume {tmp_path / 'again'}" in text.stdout


def test_cli_checkpoint_minutes_alone_is_refused():
    proc = kvsim("explore", "swa-budget", "--checkpoint-minutes", "5", "--json")
    error = json.loads(proc.stdout)["error"]
    assert proc.returncode == 2 and error["field"] == "--checkpoint-minutes" and "--resume DIR" in error["expected"]


@pytest.mark.parametrize("case", ["other params", "no checkpoint", "corrupt", "corrupt part", "occupied", "both"])
def test_cli_refuses_a_checkpoint_it_cannot_go_on_from(case, tmp_path):
    folder = tmp_path / "search"
    base = ("explore", "swa-budget", "--max-states", "20") + (("--workers", "2") if case == "corrupt part" else ())
    if case != "no checkpoint":
        assert kvsim(*base, "--checkpoint", str(folder)).returncode == 3
    args = {"other params": (*base, "--param", "full_pages=5", "--resume", str(folder)),
            "occupied": (*base, "--checkpoint", str(folder)),
            "both": (*base, "--checkpoint", str(folder), "--resume", str(folder))}.get(case, (*base, "--resume",
                                                                                          str(folder)))
    if case.startswith("corrupt"):
        gen = folder / (folder / CURRENT).read_text().strip()
        (gen / ("partition-1.pkl" if case == "corrupt part" else "search.pkl")).write_bytes(b"not a pickle")
    proc = kvsim(*args, "--json")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0
    error = json.loads(proc.stdout)["error"]
    assert "--resume" in error["message"] or "--checkpoint" in error["message"]
    if case == "other params":
        assert error["field"] == "--resume" and "full_pages" in error["message"]


def test_cli_refuses_a_folder_another_search_holds_with_one_line(tmp_path):
    folder = tmp_path / "search"
    base = ("explore", "swa-budget", "--max-states", "20")
    assert kvsim(*base, "--checkpoint", str(folder)).returncode == 3  # saved: a checkpoint to resume
    for args, flag in (((*base, "--resume", str(folder)), "--resume"),
                       ((*base, "--workers", "2", "--checkpoint", str(tmp_path / "new")), "--checkpoint")):
        held = CheckpointDir(folder if flag == "--resume" else tmp_path / "new", {})
        with held.held(flag.strip("-")):  # another search, here in the test's process
            proc = kvsim(*args, "--json")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
        error = json.loads(proc.stdout)["error"]
        assert error["field"] == flag and error["expected"] == "a folder no other search is saving to"
        assert f"process {os.getpid()}" in error["message"]
    assert kvsim("explore", "swa-budget", "--resume", str(folder)).returncode == 0  # let go: it goes on, to the end


# -- Ctrl-C and SIGTERM --------------------------------------------------------------------------------------------

class Interrupting(Counter):
    """A counter whose step from `at` sends SIGINT to `pid` (the search's own process) and to the process it runs
    in (a forked worker ignores it: the search's process decides)."""

    def __init__(self, pid: int, at: int = 5000) -> None:
        super().__init__(limit=30_000, bad=None)
        self.pid, self.at = pid, at

    def step(self, state, action):
        if state == self.at and action[0] == "inc":
            for pid in {self.pid, os.getpid()}:
                os.kill(pid, signal.SIGINT)
        return super().step(state, action)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_interrupted_search_saves_itself_and_goes_on_to_the_uninterrupted_result(tmp_path, workers):
    def search(system, **kw):
        options = ExploreOptions(**kw)
        return explore(system(), options) if workers == 1 else explore_parallel(system, workers, options)

    whole = search(lambda: Counter(limit=30_000, bad=None), store="fingerprint")
    pid, before = os.getpid(), signal.getsignal(signal.SIGINT)
    with stopping_on_signals():
        stopped = search(lambda: Interrupting(pid), store="fingerprint",
                         checkpoint=CheckpointDir(tmp_path, {"model": "counter"}))
    assert stopped.bound_hit == INTERRUPT and 0 < stopped.states < whole.states
    assert stopped.checkpoint == str(tmp_path)
    done = search(lambda: Counter(limit=30_000, bad=None), store="fingerprint", resume=True,
                  checkpoint=CheckpointDir(tmp_path, {"model": "counter"}))
    assert (done.states, done.transitions, done.depth, done.bound_hit) == (whole.states, whole.transitions,
                                                                           whole.depth, None)
    assert signal.getsignal(signal.SIGINT) is before  # as it was
    # outside the context, Ctrl-C interrupts as it always did: under Python's own handler (in a CI worker an earlier
    # test's library had left one that does not raise, and the search ran to its end)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            search(lambda: Interrupting(pid), store="fingerprint")
    finally:
        signal.signal(signal.SIGINT, before)


def test_cli_an_interrupted_search_says_so_and_saves(tmp_path, capsys, monkeypatch):
    from kvsim.app import cli
    from kvsim.app.commands import explore as explore_command

    def interrupted(*args, **kwargs):  # Ctrl-C as the search starts
        os.kill(os.getpid(), signal.SIGINT)
        return explore(*args, **kwargs)

    monkeypatch.setattr(explore_command, "explore", interrupted)
    folder = str(tmp_path / "search")
    argv = ["explore", "pd-staging", "--param", "rooms=2", "--store", "fingerprint", "--checkpoint", folder]
    assert cli.main(argv + ["--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["bound_hit"] == INTERRUPT and doc["checkpoint"] == folder and doc["complete"] is False
    assert cli.main(argv[:-2] + ["--checkpoint", folder + "2"]) == 3
    text = capsys.readouterr().out
    assert "INCOMPLETE: an interrupt (Ctrl-C or SIGTERM) stopped the search" in text
    assert f"go on with this command with --resume {folder}2 for --checkpoint\n" in text


def _sleeping_worker(ready) -> None:
    from kvsim.engine.interrupt import worker_signals

    worker_signals()
    ready.set()
    time.sleep(60)


def test_a_forked_worker_ignores_ctrl_c_and_dies_of_sigterm():
    # forked inside the context, a worker inherits its handler, which would only ask for a stop: a pool that ends
    # its workers with SIGTERM (multiprocessing's) then waited for ever
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    with stopping_on_signals():
        ready = ctx.Event()
        worker = ctx.Process(target=_sleeping_worker, args=(ready,))
        worker.start()
        assert ready.wait(30)
        os.kill(worker.pid, signal.SIGINT)
        worker.join(0.5)
        assert worker.exitcode is None  # Ctrl-C ignored
        worker.terminate()
        worker.join(30)
    assert worker.exitcode == -signal.SIGTERM
