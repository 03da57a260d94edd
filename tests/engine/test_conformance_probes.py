"""Line probes (`kvsim.engine.conformance.probes`): a loaded file's statements record themselves while a LineTrace
measures, the same statement lines the trace hook records, with no hook on the process, and the functions get
their own code back when it stops."""

from __future__ import annotations

import sys
import textwrap

from kvsim.conform.loader import load_definitions
from kvsim.engine.conformance import probes
from kvsim.engine.conformance.linetrace import LineTrace, statement_lines, statement_of

SOURCE = textwrap.dedent('''\
    from __future__ import annotations

    import functools


    def logged(fn):
        @functools.wraps(fn)
        def wrapper(*args):
            out = fn(*args)
            return out
        return wrapper


    class Base:
        def total(self, xs):
            return sum(xs)


    class Pool(Base):
        """A docstring."""

        size: int = 3

        def __init__(self, n):
            self.n = n

        def total(self, xs):
            """Kept as the function's doc."""
            got = super().total(xs)
            if got > 10:
                return -1
            elif (got
                  < 0):
                return 0
            return got

        @property
        def doubled(self):
            return self.n * 2

        @staticmethod
        def twice(x):
            return x + x

        @functools.lru_cache(maxsize=None)
        def cached(self, k):
            return k + 1


    @logged
    def plan(n, k):
        out = []
        for i in range(n):
            try:
                if i % k == 0:
                    out.append(i)
                else:
                    raise ValueError(i)
            except ValueError:
                continue
            finally:
                pass
        step = lambda x: x + 1  # noqa: E731
        gen = (step(x) for x in out)
        def inner(v):
            return v * 2
        total = sum(
            inner(x)
            for x in gen)
        while total > 100:
            total -= 100
        return total
    ''')


def _exercise(ns):
    pool = ns.Pool(4)
    return (pool.total([1, 2]), pool.total([20]), pool.doubled, ns.Pool.twice(3), pool.cached(5),
            ns.plan(7, 3), ns.plan(2, 5))


def _measure(ns, probes_on):
    trace = LineTrace(probes=probes_on)
    seen = []
    trace.start()
    try:
        seen.append(sys.gettrace())
        answer = _exercise(ns)
    finally:
        trace.stop()
    return trace.executed, answer, seen[0]


def test_probes_record_the_statement_lines_the_hook_records_without_a_hook(tmp_path):
    path = tmp_path / "pool.py"
    path.write_text(SOURCE)
    names = ["logged", "Base", "Pool", "plan"]
    ns = load_definitions(path, names, where="pool.py")
    counted = {("pool.py", n) for lines in statement_lines(SOURCE, names).values() for n in lines}
    hooked, plain_answer, _ = _measure(ns, False)
    before = {fn: fn.__code__ for fn in (ns.Pool.total, ns.plan.__wrapped__, ns.plan)}
    probed, answer, hook = _measure(ns, True)
    assert answer == plain_answer == _exercise(ns)
    assert hook is None  # nothing hooked the process while the probes measured
    assert probed & counted == hooked & counted and len(probed & counted) > 25
    assert {("pool.py", 56), ("pool.py", 58)} <= probed  # both branches ran; `return 0` and the `while` body not
    assert not {("pool.py", 34), ("pool.py", 71)} & probed
    assert all(fn.__code__ is code for fn, code in before.items())  # their own code back
    assert ns.Pool.total.__doc__ == "Kept as the function's doc."
    untraced = LineTrace()
    assert _exercise(ns) == answer and not untraced.executed


def test_a_module_loaded_while_the_trace_measures_is_probed_from_then_on(tmp_path):
    path = tmp_path / "late.py"
    path.write_text("def f(x):\n    if x:\n        return 1\n    return 2\n")
    trace = LineTrace()
    trace.start()
    try:
        ns = load_definitions(path, ["f"], where="late.py")
        assert sys.gettrace() is None and ns.f(0) == 2
    finally:
        trace.stop()
    assert trace.executed == {("late.py", 2), ("late.py", 4)}
    assert [m for _, m, _ in probes.modules() if vars(m).get("f") is ns.f]  # kept for the next trace


def test_a_mutant_on_a_continuation_line_is_reached_when_its_statement_ran():
    owner = statement_of(SOURCE)
    assert owner[33] == 32 and owner[32] == 32  # `elif (got\n < 0)`: the test's first line
    assert owner[68] == 67 and owner[69] == 67  # `total = sum(\n inner(x)\n for x in gen)`
    assert 5 not in owner  # module level: no function runs it


def test_a_trace_of_some_files_measures_those_only(tmp_path):
    """`files`: the modules of other upstream files (another target's, loaded before or while it measures) keep
    their own code and record nothing; without `files`, every registered file is measured."""
    loaded = {}
    for name in ("mine.py", "other.py", "late.py"):
        (tmp_path / name).write_text("def f(x):\n    if x:\n        return 1\n    return 2\n")
    for name in ("mine.py", "other.py"):
        loaded[name] = load_definitions(tmp_path / name, ["f"], where=name).f
    own = {name: f.__code__ for name, f in loaded.items()}
    trace = LineTrace(files=["mine.py", "late.py"])
    trace.start()
    try:
        loaded["late.py"] = load_definitions(tmp_path / "late.py", ["f"], where="late.py").f
        swapped = {name: f.__code__ is not own.get(name) for name, f in loaded.items()}
        answers = [f(0) for f in loaded.values()]
    finally:
        trace.stop()
    assert answers == [2, 2, 2] and swapped == {"mine.py": True, "other.py": False, "late.py": True}
    assert trace.executed == {("mine.py", 2), ("mine.py", 4), ("late.py", 2), ("late.py", 4)}
    every = LineTrace()
    every.start()
    try:
        assert [f(1) for f in loaded.values()] == [1, 1, 1]
    finally:
        every.stop()
    assert {path for path, _ in every.executed} == {"mine.py", "other.py", "late.py"}
