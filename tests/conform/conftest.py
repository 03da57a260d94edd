"""What every conformance test starts from: the real-import children the session shares run the releases as released.

A test that runs a target under a mutant (`loader.mutated`, `child.configure(mutant)`) leaves that mutant loaded in
the release's shared child until the next target configures it; a test that drives the child directly (the real
manager, coordinator, scheduler and radix tests call its driver's ops) would then check the mutant, depending on
which test ran before it on the same pytest worker. After each test, a child left with a mutant gets the released
modules back."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _released_modules_after_each_test():  # type: ignore[no-untyped-def]
    yield
    from kvsim.conform import installed_child

    for child in list(installed_child._SHARED.values()):
        if child.process is not None and child.mutant is not None:
            child.configure(None)
