"""kvsim's pytest plugin (entry point `pytest11: kvsim`): catalog verdicts as test items, and a fixture that
runs a conform target's checks on the project's own code.

    pytest --kvsim-catalog            # every bug report and property of the catalog as a test item
    pytest --kvsim-catalog -k swa-budget
    pytest --kvsim-catalog -k kvsim_bug          # the bug reports only (kvsim_property, kvsim_kernel)
    pytest --kvsim-catalog --kvsim-use-profile   # the run's Hypothesis profile and database, not kvsim's CI

    def test_planner(kvsim_conform):              # in the project's tests
        kvsim_conform("vllm:plan_mla_context_chunks", my_engine.mla)

Item ids: `kvsim::<model>::<bug id>[<variant>]`, `kvsim::<model>::<property>[fixed]`, and for a kernel
property `kvsim::<model>::<property>[fixed-<backend>]` (what each verdict means: `kvsim.testing.verdicts`).

Inert unless asked: pytest loads this module in every run once kvsim is installed, so at import it reads
nothing but pytest and the standard library, prints nothing and collects nothing; the catalog, Hypothesis
and the adapters load only under `--kvsim-catalog` or when a test asks for `kvsim_conform`.
"""

from __future__ import annotations

import random
from typing import Any, Iterator

import pytest

ROOT_NAME = "kvsim"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvsim", "kvsim: KV-cache model verdicts and conformance")
    group.addoption("--kvsim-catalog", action="store_true", default=False,
                    help="collect every kvsim bug report and property as a test item (kvsim::MODEL::NAME[VARIANT])")
    group.addoption("--kvsim-max-examples", type=int, default=None, metavar="N",
                    help="Hypothesis examples per catalog property (default: kvsim's CI profile, 60)")
    group.addoption("--kvsim-use-profile", action="store_true", default=False,
                    help="run catalog properties under this run's Hypothesis profile and example database "
                         "(default: kvsim's CI settings: derandomized, no database)")


def pytest_configure(config: pytest.Config) -> None:
    examples = config.getoption("kvsim_max_examples")
    if examples is not None and examples < 1:
        raise pytest.UsageError(f"--kvsim-max-examples: expected an integer >= 1, got {examples}")
    if config.getoption("kvsim_catalog"):
        config.addinivalue_line("markers", "kvsim: a kvsim catalog verdict (pytest --kvsim-catalog)")


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("kvsim_catalog"):
        return
    root = KvsimCatalog.from_parent(session, name=ROOT_NAME, nodeid=ROOT_NAME)
    items.extend(session.genitems(root))


def catalog_settings(config: pytest.Config) -> Any:
    from .verdicts import Settings

    if config.getoption("kvsim_use_profile"):
        chosen = Settings.from_profile(seed=run_seed(config))
    else:
        chosen = Settings()
    examples = config.getoption("kvsim_max_examples")
    if examples is not None:
        chosen = type(chosen)(examples, chosen.derandomize, chosen.database, chosen.seed)
    return chosen


def run_seed(config: pytest.Config) -> int | None:
    """The Hypothesis plugin's --hypothesis-seed, when given."""
    try:
        seed = config.getoption("hypothesis_seed")
    except ValueError:
        return None
    return None if seed is None else int(seed)


class KvsimCatalog(pytest.Collector):
    """`kvsim`: one collector per model below it."""

    def collect(self) -> Iterator[pytest.Collector]:
        from .verdicts import checks

        per_model: dict[str, list[Any]] = {}
        for check in checks():
            per_model.setdefault(check.model, []).append(check)
        for model, found in per_model.items():
            yield KvsimModel.from_parent(self, name=model, checks=found)


class KvsimModel(pytest.Collector):
    def __init__(self, *, checks: list[Any], **kw: Any) -> None:
        super().__init__(**kw)
        self.checks = checks

    def collect(self) -> Iterator[pytest.Item]:
        for check in self.checks:
            item = KvsimItem.from_parent(self, name=check.test_name, check=check)
            item.add_marker(pytest.mark.kvsim)
            item.extra_keyword_matches.add(f"kvsim_{check.kind}")  # -k kvsim_bug / kvsim_property / kvsim_kernel
            yield item


class KvsimFailure(Exception):
    """A catalog verdict that is not what the catalog says (the text is the report)."""


class KvsimItem(pytest.Item):
    def __init__(self, *, check: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.check = check

    def runtest(self) -> None:
        from .verdicts import run

        verdict = run(self.check, catalog_settings(self.config))
        if verdict.status == "skipped":
            pytest.skip(verdict.text)
        if verdict.status == "xfailed":
            pytest.xfail(verdict.text)
        if verdict.status != "passed":
            raise KvsimFailure(verdict.text)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, KvsimFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"kvsim {self.check.kind} {self.check.model}::{self.check.test_name}"


@pytest.fixture
def kvsim_conform(request: pytest.FixtureRequest) -> Any:
    """`kvsim_conform(target, impl, **kw)`: run kvsim conform target `target` ("vllm:plan_mla_context_chunks")
    on `impl` (your function or class, a module, or a mapping of names) and fail the test with kvsim's report
    unless it conforms; returns the result record. Examples and randomness come from the Hypothesis profile
    this run loaded (derandomized there: the same inputs every run; else a seed the report names);
    `kvsim.testing.inprocess.conform` lists the keywords (release=, from_path=, engine=, max_examples=, seed=)."""
    from hypothesis import settings

    profile = settings.default

    def check(target: str, impl: Any, **kw: Any) -> Any:
        __tracebackhide__ = True
        from .inprocess import assert_conforms

        kw.setdefault("max_examples", profile.max_examples)
        if "seed" not in kw and not profile.derandomize:
            seed = run_seed(request.config)
            kw["seed"] = seed if seed is not None else random.getrandbits(32)
        return assert_conforms(target, impl, **kw)

    return check
