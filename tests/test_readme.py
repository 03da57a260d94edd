"""The README's two set-up commands are the ones CI runs and the ones that work."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set up and run", 1)[1].split("## ", 1)[0]
    return re.findall(r"```\n(python3 -m venv .*)\n```", section)


def test_readme_has_exactly_two_setup_commands():
    main_job, tests = _commands()
    assert main_job.endswith("kvsim repro --all")
    assert "pytest" in tests and "torch==2.13.0" in tests


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert _commands()[1] in ci.splitlines()
