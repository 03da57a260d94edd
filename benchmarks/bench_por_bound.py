"""How much could partial-order reduction save on pd-staging? An optimistic bound, not a search mode.

    python benchmarks/bench_por_bound.py [--param NAME=VALUE ...] [--max-states N]

Breadth-first over pd-staging's states (one representative per orbit of its rooms, as `explore`), twice:
every enabled action, then a singleton "ample set" wherever one exists: the first enabled action that
commutes with every other enabled action here (the two orders reach one state and neither disables the
other), leaves the done flag and every invariant's verdict as they were, and reaches a state not seen yet
(the cycle proviso). A sound ample set must also be independent of every action that could run before it
on any path, which this does not ask, so the reduced count is a floor for singleton ample sets: what a
real reduction of this kind could at best leave. The scale issue's closing note quotes it: 566,020 ->
412,040 states (1.37x) for --param writers=2 with its default faults and timeouts.
"""

from __future__ import annotations

import argparse
import time
from collections import deque

from kvsim.app import catalog
from kvsim.engine.descriptor import RunSpec


def reachable(system, reduce: bool, limit: int) -> tuple[int, int, bool]:
    """(states seen, states expanded through a singleton ample set, finished) for one breadth-first pass."""
    canon = getattr(system, "canonical", None) or (lambda s: s)

    def verdict(s):
        return (system.done(s),) + tuple(inv.check(s) is None for inv in system.invariants)

    first = canon(next(iter(system.initial_states())))
    seen, queue, reduced = {first}, deque([first]), 0
    while queue and len(seen) < limit:
        state = queue.popleft()
        here = verdict(state)
        if not all(here[1:]):
            continue  # a violation is not expanded, as in explore
        actions = system.enabled(state)
        succ = [system.step(state, a) for a in actions]
        if reduce and len(actions) > 1:
            for i, a in enumerate(actions):
                if verdict(succ[i]) != here or canon(succ[i]) in seen:
                    continue
                if all(system.is_enabled(succ[i], b) and system.is_enabled(succ[j], a)
                       and system.step(succ[i], b) == system.step(succ[j], a)
                       for j, b in enumerate(actions) if j != i):
                    succ, reduced = [succ[i]], reduced + 1
                    break
        for nxt in succ:
            rep = canon(nxt)
            if rep not in seen:
                seen.add(rep)
                queue.append(rep)
    return len(seen), reduced, not queue


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--max-states", type=int, default=3_000_000)
    args = ap.parse_args()
    run = RunSpec.resolve(catalog.models().model("pd-staging"), "fixed", args.param)
    print(f"pd-staging {' '.join(args.param) or '(defaults)'}", flush=True)
    rows = []
    for reduce in (False, True):
        start = time.perf_counter()
        states, reduced, finished = reachable(run.system(), reduce, args.max_states)
        rows.append(states)
        print(f"  {'singleton ample sets' if reduce else 'every action':22s} {states:>10,} states "
              f"({reduced:,} expanded through one action) {time.perf_counter() - start:7.1f} s "
              f"{'complete' if finished else 'bound: states'}", flush=True)
    print(f"  at best {rows[0] / rows[1]:.2f}x fewer states")


if __name__ == "__main__":
    main()
