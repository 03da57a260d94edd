"""Every path a command writes to is tried before its work (`kvsim.app.outputs`): one line and exit 2, never a
search lost at its end to a path it cannot write; and the trying leaves nothing behind."""

from __future__ import annotations

import json
import os

import pytest

from kvsim.app import cli

BUG = "sglang-05c7ebf-staging-dup-ready"


def _unwritable(tmp_path):
    """Paths no one can create, root included: under a file, and (Linux) in /proc."""
    (tmp_path / "plain").write_text("x")
    yield str(tmp_path / "plain" / "x")
    if os.path.isdir("/proc/self"):
        yield "/proc/kvsim-x"


CASES = [  # (argv with {} for the path, option)
    (["check", "swa-budget", "--save", "{}.json"], "--save"),
    (["check", "swa-budget", "--junit", "{}.xml"], "--junit"),
    (["explore", "swa-budget", "--save", "{}.json"], "--save"),
    (["explore", "swa-budget", "--graph", "{}.graphml"], "--graph"),
    (["explore", "swa-budget", "--checkpoint", "{}"], "--checkpoint"),
    (["explore", "swa-budget", "--resume", "{}"], "--resume"),
    (["simulate", "swa-budget", "--trace", "{}.jsonl"], "--trace"),
    (["repro", BUG, "--report", "--out", "{}.md"], "--out"),
    (["repro", "--all", "--report", "--out", "{}"], "--out"),
    (["show", BUG, "--out", "{}.svg"], "--out"),
    (["report", "--out", "{}"], "--out"),
    (["oracle", "--junit", "{}.xml"], "--junit"),
    (["conform", "sglang", "--junit", "{}.xml"], "--junit"),
]


@pytest.mark.parametrize("argv, option", CASES, ids=[" ".join(a[:1] + a[-2:-1]) for a, _ in CASES])
def test_a_path_that_cannot_be_written_is_refused_before_the_work(tmp_path, capsys, monkeypatch, argv, option):
    command = argv[0]
    monkeypatch.setitem(cli.COMMANDS, command, lambda args: pytest.fail(f"{command} ran"))
    if command == "conform":  # kvsim conform checks its own options inside its command
        monkeypatch.setattr("kvsim.conform.cli.select_targets", lambda *a: pytest.fail("conform ran"))
        monkeypatch.setitem(cli.COMMANDS, command, cli.cmd_conform)
    for bad in _unwritable(tmp_path):
        path = [a.format(bad) for a in argv]
        assert cli.main(path + ["--json"]) == 2
        error = json.loads(capsys.readouterr().out)["error"]
        assert error["field"] == option and error["received"] == next(a for a in path if a.startswith(bad))


def test_out_without_report_is_refused_before_the_work(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(cli.COMMANDS, "repro", lambda args: pytest.fail("repro ran"))
    assert cli.main(["repro", BUG, "--out", str(tmp_path / "r.md"), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["expected"] == "--report as well"


def test_trying_a_path_leaves_nothing_behind(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setitem(cli.COMMANDS, "explore", lambda args: ran.append(args) or 0)
    kept = tmp_path / "kept.json"
    kept.write_text("as it was")
    stamp = os.stat(kept).st_mtime_ns
    new = tmp_path / "new.graphml"
    assert cli.main(["explore", "swa-budget", "--save", str(kept), "--graph", str(new),
                     "--checkpoint", str(tmp_path / "a" / "b")]) == 0
    assert ran and kept.read_text() == "as it was" and os.stat(kept).st_mtime_ns == stamp
    assert sorted(os.listdir(tmp_path)) == ["kept.json"]  # no new file, no folder, no probe
