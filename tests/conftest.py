"""Hypothesis profiles: `ci` (default; derandomized, no database, no deadline) and `dev` (longer, random).

Select with KVSIM_PROFILE=dev. The CI profile keeps the suite deterministic.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

# the shared helpers assert for the tests that call them: pytest explains their failures as it does a test's
pytest.register_assert_rewrite("toys", "conform_toys")

settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                          print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=1000,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile(os.environ.get("KVSIM_PROFILE", "ci"))


# A conformance run in the suite is judged by its examples, never by the machine's speed: the per-call deadline
# (30 s by default, `kvsim.engine.conformance.runner.CALL_TIMEOUT`) was reached on a busy machine by a kernel
# target's first call (the child starting, the interpreter's first launch), and a clean release then "diverged".
# Tests of the deadline itself pass `call_timeout` explicitly; `kvsim conform` on the command line keeps its
# own default (`--call-timeout`).
from kvsim.engine.conformance import runner as conformance_runner  # noqa: E402

conformance_runner.CALL_TIMEOUT = 600.0


# The suite's own Hypothesis tests draw what their seed names, not what the worker happened to import before them
# (Hypothesis' "local constants": the literals of every module of ours, of the upstream files and mutants a
# conformance test loaded); kvsim's runs do the same themselves (`kvsim.engine.draws`).
from kvsim.engine.draws import own_draws  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _own_draws():
    with own_draws():
        yield


# Tests sharing expensive per-process setup run in one xdist worker, so that setup is paid once, not once in each
# worker: a real-import child (`kvsim.conform.installed_child.shared`, one per release and driver in a process,
# 10-30 s of import each: under xdist's `load` both workers started most of the same ones), and a module or
# session fixture that is a long build (the GPU check's script, the report site, the wheel and its environment).
# Keys: a test file (all its tests) or one test's id; the rest of the suite is spread test by test as under
# `load`, so the other worker keeps busy while one runs a group. (xdist's own `--dist loadgroup` reads
# `xdist_group` marks by renaming test ids, which pytest 9 no longer lets it do: the groups are given here.)
XDIST_GROUPS = {
    **{f"tests/conform/vllm/test_conform_{name}.py": "vllm-children" for name in (
        "aba", "event_recorder", "manager_lockstep", "real_coordinator", "real_manager", "real_scheduler",
        "seed_targets")},
    **{f"tests/conform/sglang/test_conform_{name}.py": "sglang-children" for name in (
        "radix_lockstep", "real_radix", "real_unified_swa")},
    **{f"tests/conform/test_conform_measures.py::test_every_target_covers_its_upstream_lines_and_kills_its_mutants"
       f"[{engine}]": f"{engine}-children" for engine in ("vllm", "sglang")},  # their lockstep targets' children
    "tests/test_gpu_check.py": "gpu-check",
    "tests/app/test_report_html.py": "report-site",
    "tests/test_package.py": "package-wheel",
}


def xdist_group(nodeid: str) -> str | None:
    return XDIST_GROUPS.get(nodeid) or XDIST_GROUPS.get(nodeid.split("::", 1)[0])


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown where xdist is not loaded
def pytest_xdist_make_scheduler(config, log):
    """Under `-n` with the default `--dist load`: each group one unit of work, every other test its own."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return Grouped(config, log)
