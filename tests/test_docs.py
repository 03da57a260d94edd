"""The README stays short and true, and the docs' links lead somewhere.

- README.md is at most 300 lines: a newcomer's page; the reference is docs/cli.md, docs/conform.md, ...
- every relative link in README.md and docs/*.md names a file that exists and, with `#anchor`, a heading
  of that file (GitHub's anchors);
- every kvsim command has its section in docs/cli.md;
- the README's five-minute tour runs as shown: each `$ kvsim ...` line is run in this process and its output
  compared with the transcript's lines (timings and rates masked, runs of spaces as one; a line ending in
  `...` is a prefix, a line `...` skips lines).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import unicodedata
from pathlib import Path

import pytest

from kvsim.app import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _without_fences(text: str) -> str:
    """The text outside ``` blocks (a link-looking string inside a transcript is no link)."""
    return "".join(part for i, part in enumerate(re.split(r"^```.*$", text, flags=re.M)) if i % 2 == 0)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than - and _ dropped, spaces as -."""
    text = unicodedata.normalize("NFC", heading.strip().lower())
    text = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _without_fences(path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            base = _anchor(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_readme_is_at_most_300_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 300, f"README.md has {n} lines: move reference material to docs/"


def test_anchor_slugs_follow_github():
    assert _anchor("Exit codes and errors") == "exit-codes-and-errors"
    assert _anchor("`kvsim list [MODEL]`: models, variants") == "kvsim-list-model-models-variants"
    assert _anchor("`kvsim explore MODEL [--param NAME=VALUE]`") == "kvsim-explore-model---param-namevalue"


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    links = LINK.findall(_without_fences(doc.read_text(encoding="utf-8")))
    assert doc != README or links, "README.md links nowhere"
    bad = []
    for link in links:
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto: ...
            continue
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            bad.append(f"{link}: no file {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        elif anchor and (path.suffix != ".md" or anchor not in _anchors(path)):
            bad.append(f"{link}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not bad, f"{doc.name}: broken links:\n" + "\n".join(bad)


def test_every_command_has_its_section_in_cli_md():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main(["--help"])
    commands = re.search(r"\{([a-z,]+)\}", out.getvalue()).group(1).split(",")
    assert len(commands) >= 11, commands
    headings = [line for line in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").splitlines()
                if line.startswith("### ")]
    missing = [c for c in commands if not any(f"`kvsim {c}" in h for h in headings)]
    assert not missing, f"docs/cli.md has no section for: {missing}"


def test_conform_md_keeps_the_mutation_scores_place():
    assert "\n## Mutation scores\n" in (ROOT / "docs" / "conform.md").read_text(encoding="utf-8")


# -- the tour -------------------------------------------------------------------------------------------------

def _tour() -> list[tuple[str, list[str]]]:
    """(command, expected output lines) for each `$ kvsim` line in the README's five-minute tour."""
    text = README.read_text(encoding="utf-8")
    assert "\n## A five-minute tour\n" in text, "the README has no five-minute tour"
    section = text.split("\n## A five-minute tour\n", 1)[1].split("\n## ", 1)[0]
    runs: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```\n(.*?)^```$", section, flags=re.M | re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                runs.append((line[2:], []))
            elif runs:
                runs[-1][1].append(line)
    return runs


def _norm(line: str) -> str:
    line = re.sub(r"[\d,]+ states/s", "# states/s", line)
    line = re.sub(r"\d+\.\d+", "#", line)
    return " ".join(line.split())


def _matches(expected: list[str], actual: list[str]) -> str | None:
    """None when the output fits the transcript, else what differs."""
    i = 0
    for k, want in enumerate(expected):
        if want.strip() == "...":
            nxt = expected[k + 1] if k + 1 < len(expected) else None
            if nxt is None:
                return None
            while i < len(actual) and not _fits(nxt, actual[i]):
                i += 1
            continue
        if i >= len(actual):
            return f"missing line {want!r}"
        if not _fits(want, actual[i]):
            return f"line {i + 1}: expected {want!r}, got {actual[i]!r}"
        i += 1
    return None if i == len(actual) else f"unexpected line {actual[i]!r}"


def _fits(want: str, got: str) -> bool:
    if want.endswith("..."):
        return _norm(got).startswith(_norm(want[:-3]))
    return _norm(got) == _norm(want)


def test_tour_transcript_check_can_fail():
    assert _matches(["a 1.5 s", "b"], ["a 2.25 s", "b"]) is None
    assert _matches(["a", "..."], ["a", "x", "y"]) is None
    assert _matches(["a long li..."], ["a long line"]) is None
    assert _matches(["a", "b"], ["a", "c"]) is not None
    assert _matches(["a"], ["a", "b"]) is not None
    assert _matches(["a", "b"], ["a"]) is not None


def test_readme_tour_has_the_four_steps():
    commands = [c for c, _ in _tour()]
    for verb in ("repro", "explore", "conform", "show"):
        assert any(c.startswith(f"kvsim {verb} ") for c in commands), f"the tour has no kvsim {verb}"


@pytest.mark.parametrize("command,expected", _tour(), ids=[c for c, _ in _tour()])
def test_readme_tour_runs_as_shown(command, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(shlex.split(command)[1:])
    assert code in (0, 1), code
    problem = _matches(expected, out.getvalue().splitlines())
    assert problem is None, f"{command}: {problem}\n--- output:\n{out.getvalue()}"
