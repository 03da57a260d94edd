"""The command modules (`kvsim.app.commands`): each command's text is its `render` of its document alone.

Every case runs a real command line in this process, keeps the document the command's `run` returned, saves it
as JSON and loads it again (so no object, option or global of the run can reach the renderer), and checks that
`render` of the loaded document is exactly what the command printed, that its `exit_code` is the command's, and
that `--json` prints that document without its text-only part.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from kvsim.app import cli, commands
from kvsim.app.commands.common import VIEW, public
from kvsim.engine.canon import to_jsonable

CASES = [
    ("list",),
    ("list", "swa-budget"),
    ("check", "swa-budget", "--max-examples", "5"),
    ("check", "swa-budget", "--variant", "pre_af7c62e", "--max-examples", "50", "--save", "{tmp}/check.json"),
    ("check", "kv-zeroing", "--backend", "torch-cpu", "--max-examples", "2", "--property",
     "zero_kv_blocks_differential", "--property", "zeroed_blocks_are_cleared"),
    ("replay", "{tmp}/check.json"),
    ("repro", "sglang-05c7ebf-staging-lost-req-success"),
    ("repro", "sglang-05c7ebf-staging-lost-req-success", "--wide"),
    ("repro", "flashinfer-4051-merge-empty-nan", "--report"),
    ("explore", "swa-budget"),
    ("explore", "pd-staging", "--max-states", "50", "--no-liveness"),
    ("explore", "pd-staging", "--variant", "pre_05c7ebf", "--store", "fingerprint", "--save", "{tmp}/explore.json"),
    ("replay", "{tmp}/explore.json"),
    ("show", "--from", "{tmp}/explore.json"),
    ("show", "--from", "{tmp}/check.json"),
    ("show", "sglang-05c7ebf-staging-skip-pop"),
    ("simulate", "pd-staging", "--param", "requests=20", "--self-check", "--trace", "{tmp}/sim.jsonl"),
    ("simulate", "pd-staging", "--param", "requests=200", "--max-events", "30"),
    ("replay", "{tmp}/sim.jsonl"),
    ("replay", "{tmp}/sim.jsonl", "--max-events", "5"),
    ("fuzz", "swa-budget", "--variant", "pre_af7c62e", "--max-examples", "30", "--workers", "1", "--database",
     "{tmp}/db", "--property", "budgets_stay_nonnegative"),
    ("oracle", "--max-examples", "1", "--max-seconds", "0.01"),
    ("report", "--out", "{tmp}/site", "--max-seconds", "0.01"),
]
MODULES = {m.NAME: m for m in commands.BEFORE_CONFORM + commands.AFTER_CONFORM}


# the files the replay and show cases read, each written by the command line that saves it (a case above too):
# made in every worker's folder first, so a case never depends on which worker ran another case, or in what order
SAVED = {
    "check.json": ("check", "swa-budget", "--variant", "pre_af7c62e", "--max-examples", "50", "--save",
                   "{tmp}/check.json"),
    "explore.json": ("explore", "pd-staging", "--variant", "pre_05c7ebf", "--store", "fingerprint", "--save",
                     "{tmp}/explore.json"),
    "sim.jsonl": ("simulate", "pd-staging", "--param", "requests=20", "--self-check", "--trace", "{tmp}/sim.jsonl"),
    "resolved.json": ("check", "swa-budget", "--variant", "pre_af7c62e", "--max-examples", "30", "--save",
                      "{tmp}/resolved.json"),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("commands")
    for name, argv in SAVED.items():
        with contextlib.redirect_stdout(io.StringIO()):
            cli.main([a.replace("{tmp}", str(path)) for a in argv])
        assert (path / name).is_file(), f"{' '.join(argv)} wrote no {name}"
    return path


def _saved(doc: dict) -> dict:
    """The document as a file holds it: JSON, written and read back."""
    return json.loads(json.dumps(to_jsonable(doc)))


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c[:2]) + f" #{i}" for i, c in enumerate(CASES)])
def test_the_text_is_the_render_of_the_saved_document(case, folder, capsys, monkeypatch):
    argv = [a.replace("{tmp}", str(folder)) for a in case]
    module = MODULES[argv[0]]
    documents = []
    real = module.run
    monkeypatch.setattr(module, "run", lambda args: documents.append(real(args)) or documents[-1])
    code = cli.main(argv)
    out = capsys.readouterr().out
    (doc,) = documents
    saved = _saved(doc)
    text = module.render(saved)
    if argv[-1] == "--report":  # the Markdown reports are the output, printed by the command itself
        assert text is None and out.startswith("# ")
    else:
        assert text + "\n" == out
    assert module.exit_code(saved) == code


def test_json_is_the_document_without_its_text_part(folder, capsys, monkeypatch):
    documents = []
    real = commands.check.run
    monkeypatch.setattr(commands.check, "run", lambda args: documents.append(real(args)) or documents[-1])
    assert cli.main(["check", "swa-budget", "--max-examples", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert VIEW in documents[0] and VIEW not in printed
    assert printed == json.loads(json.dumps(to_jsonable(public(documents[0]))))


def test_every_command_of_the_parser_has_a_module():
    import argparse

    subs = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(subs.choices) == [m.NAME for m in commands.BEFORE_CONFORM] + ["conform"] + \
        [m.NAME for m in commands.AFTER_CONFORM]
    assert set(cli.COMMANDS) == set(subs.choices)


class _NoRegistry:
    def __getattr__(self, name):
        raise AssertionError(f"REGISTRY.{name} consulted below the command layer")


@pytest.mark.parametrize("argv", [
    ["check", "swa-budget", "--variant", "pre_af7c62e", "--max-examples", "30", "--save", "{tmp}/resolved.json"],
    ["check", "kv-zeroing", "--backend", "torch-cpu", "--property", "zero_kv_blocks_differential", "--max-examples",
     "2"],
    ["replay", "{tmp}/resolved.json"],
    ["repro", "sglang-05c7ebf-staging-lost-req-success", "--report", "--json"],
    ["repro", "flashinfer-4051-merge-empty-nan", "--report", "--json"],
    ["show", "flashinfer-4051-merge-empty-nan"],
], ids=lambda a: " ".join(a[:2]))
def test_a_command_resolves_once_and_passes_the_record_down(argv, folder, capsys, monkeypatch):
    """Model, property and variants are resolved by the command; the runner, `reproduce` and the Markdown report
    never look them up again in the module-level registry (their look-up serves library callers only)."""
    from kvsim.app import catalog

    catalog.load()  # the catalog the command gets
    for module in ("kvsim.engine.runner", "kvsim.app.repro", "kvsim.app.report_md"):
        monkeypatch.setattr(f"{module}.REGISTRY", _NoRegistry())
    code = cli.main([a.replace("{tmp}", str(folder)) for a in argv])
    out, err = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in err, err
