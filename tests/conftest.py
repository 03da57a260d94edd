"""Hypothesis profiles: `ci` (default; derandomized, no database, no deadline) and `dev` (longer, random).

Select with KVSIM_PROFILE=dev. The CI profile keeps the suite deterministic.
"""

import os

import kvsim
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


def pytest_configure(config):
    """kvsim's bytecode written once, by the controller, before any test runs. This machine (and CI on it) sets
    PYTHONDONTWRITEBYTECODE=1, so without it every process the suite starts (a `kvsim` command, a kernel or
    real-import child, an explorer or conform worker started afresh) compiled kvsim's source again: about 0.5 s
    of CPU for a `kvsim list`. Python reads the files whatever that setting says, and compiles a source newer
    than its file in memory as ever, so nothing a test sees changes."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        import compileall

        import kvsim.gpu_oracle
        import kvsim.models
        import kvsim.properties

        for package in (kvsim, kvsim.models, kvsim.properties, kvsim.gpu_oracle):
            for folder in package.__path__:
                compileall.compile_dir(folder, quiet=1, workers=1)


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


@pytest.fixture(autouse=True)
def _released_modules_after_each_test():
    """Every test starts from the releases as released. A test that runs a conformance target under a mutant
    (`loader.mutated`, `child.configure(mutant)`) leaves it loaded in the release's shared real-import child until
    the next target configures that child; a test that drives the child's ops directly (the real manager,
    coordinator, scheduler and radix tests) would then check the mutant, depending on which test ran before it on
    the same pytest worker. After each test, a shared child left with a mutant gets the released modules back."""
    yield
    import sys

    installed_child = sys.modules.get("kvsim.conform.installed_child")  # not imported: no child to put back
    for child in list(getattr(installed_child, "_SHARED", {}).values()):
        if child.process is not None and child.mutant is not None:
            child.configure(None)
