"""The bug catalog as data: `properties/<model>/bugs.toml`, checked against one schema on load (kvsim.engine.bugfile).

A file that does not match is one line naming the file, the key and the problem; the shipped files load into
the catalog in their own order, and their prose is wrapped (TOML multi-line strings), not one long line.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kvsim.app import catalog
from kvsim.engine.bugfile import BugFileError, bug_file, load_bugs
from kvsim.engine.errors import ConfigError
from kvsim.engine.registry import Registry
from kvsim.properties.swa_budget import resume

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "properties").glob("*/bugs.toml"))

GOOD = '''model = "swa-budget"

[[bug]]
id = "planted-resume-budget"
variant = "pre_af7c62e"
property = "resumed_requests_fit_physical_pages"
max_examples = 500
source = "planted"
summary = """\\
a summary \\
on two lines"""
fix_variant = "fixed"

[[bug.upstream_files]]
path = "python/sglang/srt/managers/scheduler.py"
functions = ["a", "b"]

[[bug.verdicts]]
release = "0.5.23"
state = "fixed"
fixed_in = "0.5.10"
'''


def _registry() -> Registry:
    registry = Registry()
    registry.add_model(catalog.models().model("swa-budget"))
    registry.add_from(resume)
    return registry


def _load(tmp_path: Path, text: str, registry: Registry | None = None) -> list:
    path = tmp_path / "bugs.toml"
    path.write_text(text)
    return load_bugs(registry or _registry(), str(path))


def _error(tmp_path: Path, text: str, registry: Registry | None = None) -> str:
    with pytest.raises(BugFileError) as info:
        _load(tmp_path, text, registry)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'bugs.toml'}: ")
    assert isinstance(info.value, ConfigError)
    return message[len(f"{tmp_path / 'bugs.toml'}: "):]


def test_every_model_with_reports_has_one_file_and_its_reports_are_the_catalogs_in_order():
    """A report names its model when it is another system of the file's package (kv-cache-manager-pd)."""
    bugs = catalog.load().bugs.values()
    models = {b.model for b in bugs}
    docs = [tomllib.loads(f.read_text()) for f in FILES]
    assert {b.get("model", doc["model"]) for doc in docs for b in doc["bug"]} == models
    assert len({doc["model"] for doc in docs}) == len(FILES)
    for f, doc in zip(FILES, docs):
        ids = [b["id"] for b in doc["bug"]]
        assert ids == [b.id for b in bugs if b.id in ids], f
        assert all(catalog.load().bugs[b["id"]].model == b.get("model", doc["model"]) for b in doc["bug"]), f
        assert bug_file(str(f.parent / "__init__.py")) == str(f)


def test_the_prose_is_wrapped_not_one_long_line():
    for f in FILES:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            assert len(line) <= 120, f"{f.relative_to(ROOT)}:{n}: {len(line)} characters"


def test_a_valid_file_gives_the_reports_it_says(tmp_path):
    (bug,) = _load(tmp_path, GOOD)
    assert bug.id == "planted-resume-budget" and bug.model == "swa-budget" and bug.max_examples == 500
    assert bug.summary == "a summary on two lines" and bug.fix_variant == "fixed"
    assert bug.upstream_files[0].functions == ("a", "b") and bug.verdicts[0].fixed_in == "0.5.10"


def test_a_missing_key_is_one_line(tmp_path):
    text = GOOD.replace('source = "planted"\n', "")
    assert _error(tmp_path, text) == "bug[0].source: missing (a string is required)"
    assert _error(tmp_path, GOOD.replace('release = "0.5.23"\n', "")) == \
        "bug[0].verdicts[0].release: missing (a string is required)"
    assert _error(tmp_path, GOOD.replace('model = "swa-budget"\n', "")) == "model: missing (a string is required)"


def test_a_wrong_type_is_one_line(tmp_path):
    assert _error(tmp_path, GOOD.replace("max_examples = 500", 'max_examples = "500"')) == \
        "bug[0].max_examples: expected an integer, got '500'"
    assert _error(tmp_path, GOOD.replace("max_examples = 500", "max_examples = true")) == \
        "bug[0].max_examples: expected an integer, got True"
    assert _error(tmp_path, GOOD.replace('functions = ["a", "b"]', 'functions = ["a", 2]')) == \
        "bug[0].upstream_files[0].functions[1]: expected a string, got 2"
    assert _error(tmp_path, GOOD.replace("max_examples = 500", "params = { ranks = 1.5 }")) == \
        "bug[0].params.ranks: expected a string, an integer or a boolean, got 1.5"
    assert _error(tmp_path, GOOD.replace('model = "swa-budget"', "model = 3")) == "model: expected a string, got 3"
    assert _error(tmp_path, 'model = "swa-budget"\nbug = 3\n') == "bug: expected an array, got 3"


def test_an_unknown_key_is_one_line(tmp_path):
    message = _error(tmp_path, GOOD.replace("source =", "sauce ="))
    assert message.startswith("bug[0].sauce: unknown key (expected one of id, variant, source, summary, ")
    assert _error(tmp_path, GOOD.replace('fixed_in = "0.5.10"', 'fixed = "0.5.10"')) == \
        "bug[0].verdicts[0].fixed: unknown key (expected one of release, state, reason, fixed_in)"
    assert _error(tmp_path, "title = 'x'\n" + GOOD) == "title: unknown key (expected one of model, bug)"


def test_a_duplicate_id_is_one_line(tmp_path):
    twice = GOOD + GOOD[GOOD.index("[[bug]]"):]
    assert _error(tmp_path, twice) == "bug[1].id: duplicate id 'planted-resume-budget' (bug[0] has it)"
    registry = _registry()
    _load(tmp_path, GOOD, registry)
    assert _error(tmp_path, GOOD, registry) == "bug[0].id: expected a unique id, got 'planted-resume-budget'"


def test_a_name_that_does_not_resolve_is_one_line(tmp_path):
    assert _error(tmp_path, GOOD.replace('property = "resumed_requests_fit_physical_pages"', 'property = "nope"')) == \
        "bug[0].property: expected a property of model swa-budget, got 'nope'"
    assert _error(tmp_path, GOOD.replace('fix_variant = "fixed"', 'fix_variant = "nope"'))\
        .startswith("bug[0].fix_variant: expected ")
    assert _error(tmp_path, GOOD.replace('variant = "pre_af7c62e"', 'variant = "nope"')).startswith("bug[0].variant: ")
    assert _error(tmp_path, GOOD.replace('model = "swa-budget"', 'model = "nope"')) == \
        "model: expected one of swa-budget, got 'nope'"
    assert _error(tmp_path, GOOD.replace('property = "resumed_requests_fit_physical_pages"', 'invariant = "x"'))\
        .startswith("bug[0].invariant: expected one of no_failed_allocation, ")
    invariant = GOOD.replace('property = "resumed_requests_fit_physical_pages"', 'invariant = "pool_conservation"')
    assert _load(tmp_path, invariant)[0].invariant == "pool_conservation"
    assert _error(tmp_path, invariant.replace("max_examples = 500", "params = { nope = 1 }")) == \
        "bug[0].params: expected one of page_size, sliding_window, full_pages, swa_pages, prompts, outputs, " \
        "reserved_decode_tokens, got 'nope'"


def test_a_value_outside_its_choices_is_one_line(tmp_path):
    assert _error(tmp_path, GOOD.replace('state = "fixed"', 'state = "gone"')).startswith(
        "bug[0].verdicts[0].state: expected one of ('present', 'fixed', 'not reachable'), got 'gone'")
    assert _error(tmp_path, GOOD.replace("max_examples = 500", 'status = "maybe"')).startswith(
        "bug[0].status: expected one of (")
    both = GOOD.replace("max_examples = 500", 'invariant = "scheduler_invariants"')
    assert _error(tmp_path, both).startswith("bug[0].property: expected exactly one of property and invariant")


def test_a_file_that_is_not_toml_or_not_there_is_one_line(tmp_path):
    assert _error(tmp_path, GOOD.replace('id = "planted', 'id = planted')).startswith("not valid TOML (")
    with pytest.raises(BugFileError, match=r"^/nonexistent/bugs\.toml: cannot be read \("):
        load_bugs(_registry(), "/nonexistent/bugs.toml")


def test_a_mechanism_the_models_simulation_does_not_name_is_one_line(tmp_path):
    assert _error(tmp_path, GOOD.replace('fix_variant = "fixed"', 'fix_variant = "fixed"\nmechanism = "nope"'))\
        .startswith("bug[0].mechanism: expected a mechanism model ")
