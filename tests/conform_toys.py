"""A toy engine and its conform adapters, for the tests of the conform frame itself (no KV cache in sight).

`write_toy_engine(root)` writes a package `vllm/toy.py` (so the source resolves as a vllm tree) whose `plan`
splits `n` rows into chunks of at most `k`; `DIFF` compares it with `model_plan`, the same rule in kvsim's
own words; `SWEEP` does so exhaustively; `LOCKSTEP` drives `Counter` (a class upstream) beside `ModelCounter`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Check, Context, Differential, Lockstep, Operation, Sweep
from kvsim.engine.conformance.compare import Exact
from kvsim.engine.conformance.declare import ConformTarget, Upstream
from kvsim.engine.errors import ConfigError, PropertyViolation

TOY = "vllm/toy.py"
TOY_SOURCE = '''\
def plan(n, k, cap):
    """Chunk sizes of n rows in chunks of at most k, the first `cap` of them; full chunks; starts."""
    assert k > 0 and cap >= 0
    out = []
    start = 0
    while start < n:
        size = min(k, n - start)
        out.append(size)
        start += size
    full = n // k
    starts = list(range(0, n, k))
    return {"sizes": out[:cap], "full": full, "starts": starts[:3], "odd": n % 2 == 1 or k == 1}


class Counter:
    def __init__(self, limit):
        self.limit, self.value = limit, 0

    def add(self, amount):
        if self.value + amount > self.limit:
            return False
        self.value += amount
        return True
'''


def write_toy_engine(root: Path, replace: tuple[str, str] | None = None) -> Path:
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    (root / "vllm" / "__init__.py").write_text("")
    text = TOY_SOURCE if replace is None else TOY_SOURCE.replace(*replace)
    assert replace is None or text != TOY_SOURCE, f"{replace[0]!r} is not in the toy"
    (root / TOY).write_text(text)
    return root


def model_plan(n: int, k: int, cap: int) -> dict[str, Any]:
    if k <= 0 or cap < 0:
        raise ConfigError("k", "> 0 (and cap >= 0)", (k, cap))
    sizes = [min(k, n - s) for s in range(0, n, k)]
    return {"sizes": sizes[:cap], "full": n // k, "starts": list(range(0, n, k))[:3], "odd": n % 2 == 1 or k == 1}


def sizes_sum_to_n(ctx: Context, case: Any, answer: Any) -> None:
    n, _, cap = case
    if cap >= n and sum(answer["sizes"]) != n:
        raise PropertyViolation(f"sizes of {n} rows: expected sum {n}, got {sum(answer['sizes'])}")


CASES = st.tuples(st.integers(0, 40), st.integers(-1, 8), st.integers(-1, 12))

DIFF = Differential(
    inputs=lambda ctx: CASES,
    model=lambda ctx, case: model_plan(*case),
    upstream=lambda ctx, case: ctx.up.plan(*case),
    compare=Exact(refusals=("AssertionError",)),
    describe=lambda ctx, case: {"n": case[0], "k": case[1], "cap": case[2]},
    checks=(Check("sizes_sum_to_n", sizes_sum_to_n),))

SWEEP = Sweep(
    domain=lambda ctx: ((n, k, cap) for n in range(0, 12) for k in range(0, 5) for cap in range(0, 6)),
    model=DIFF.model, upstream=DIFF.upstream, compare=DIFF.compare, describe=DIFF.describe)


class ModelCounter:
    def __init__(self, limit: int) -> None:
        self.limit, self.value = limit, 0

    def call(self, op: str, amount: int) -> bool:
        if self.value + amount > self.limit:
            return False
        self.value += amount
        return True

    def observe(self) -> dict[str, Any]:
        return {"value": self.value}


class UpstreamCounter:
    def __init__(self, ctx: Context, limit: int) -> None:
        self.counter = ctx.up.Counter(limit)

    def call(self, op: str, amount: int) -> Any:
        return self.counter.add(amount)

    def observe(self) -> dict[str, Any]:
        return {"value": self.counter.value}


LOCKSTEP = Lockstep(
    start=lambda ctx: st.fixed_dictionaries({"limit": st.integers(0, 10)}),
    sides=lambda ctx, config: (ModelCounter(config["limit"]), UpstreamCounter(ctx, config["limit"])),
    operations=(Operation("add", st.integers(0, 6)),), steps=12)


def target(adapter: str, names: tuple[str, ...] = ("plan",), **kw: Any) -> ConformTarget:
    return ConformTarget("vllm", f"toy-{adapter.lower()}", upstream=(Upstream(TOY, names),),
                         adapter=f"conform_toys:{adapter}", doc="the toy engine", model="mla-chunks", **kw)
