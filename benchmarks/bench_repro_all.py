"""`kvsim repro --all --json` of two trees (or commands), in alternated pairs: CPU and wall, and each report's seconds.

Each run is a child process; its CPU is the user + system time of the child and of every process it waited
for (its forked workers: `os.wait4` counts them), its wall the time until it exits. The runs alternate
(A B A B ...) so a load that comes and goes on a shared machine falls on both sides alike; the figures are
min / median / max per side and the ratios B/A of the medians and of each pair. The machine's load average is
printed before and after (the 1-minute figure), as the pairs are only comparable on a machine loaded alike.

Each report's seconds are its search on the variant plus its `fixed` side (`total_seconds`, where the tree's
JSON has it; an older tree's `seconds` leaves the fixed side out, and is shown as such). The verdict rows of
the two sides are compared too: every key but the timings and the searched-states count must be equal.

    python benchmarks/bench_repro_all.py --a /work/wt-repro-base/.venv/bin/kvsim --b .venv/bin/kvsim --pairs 3
    python benchmarks/bench_repro_all.py --b-args "--workers 1" ...   (extra arguments for one side)
    python benchmarks/bench_repro_all.py --a ... --b ... --sides   (each report's two sides, CPU, one process)
    python benchmarks/bench_repro_all.py --a ... --b ... --floor   (the pairs, then the least CPU B's checks allow)

`--floor` measures, in one process of B's tree, what the catalog's checks cost at the least: the imports, the
properties' own calls, the models' own calls in every search (timed again over the states each search found,
as `bench_explore_scale.py --ceiling` times them), and Hypothesis drawing the same number of inputs from the
same strategies with nothing checked and nothing shrunk (`shrink=False`). Their sum, over side A's median CPU,
is the least CPU ratio any kvsim could reach with these checks (the same example counts, strategies and
searches); over A's median wall, with the reports spread over the CPUs, the least wall ratio.

Not a test: the figures depend on the machine; report them as ratios of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

TIMINGS = {"seconds", "fixed_seconds", "total_seconds"}
# an explorer report that stops at its first violation searches fewer states, and a Hypothesis report's fixed side
# checks its search's inputs before its own (newer trees count what the fixed side checked): by design
SEARCHED = {"states", "fixed_examples", "fixed_states"}


def run_once(cmd: list[str]) -> dict[str, Any]:
    """One child: its document, CPU (user+sys, with its waited-for descendants) and wall."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        doc = json.loads(out.read() or b"null")
    return {"cpu": usage.ru_utime + usage.ru_stime, "wall": wall, "rc": proc.returncode, "doc": doc}


def spread(values: list[float]) -> str:
    return f"{min(values):7.2f} / {statistics.median(values):7.2f} / {max(values):7.2f}"


def report_seconds(doc: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    """Each report's seconds, and whether they include its fixed side."""
    return {b["id"]: (b["total_seconds"], True) if "total_seconds" in b else (b["seconds"], False)
            for b in doc["bugs"]}


def rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["id"]: {k: v for k, v in b.items() if k not in TIMINGS | SEARCHED} for b in doc["bugs"]}


# run by each tree's own interpreter (--sides; -P: not this folder's kvsim): every report's two sides timed apart (CPU of this process), by
# wrapping the two calls `reproduce` makes (a property run, a search); an older tree's JSON has no fixed side
SIDES = """
import json, sys, time
from kvsim.app import catalog
import kvsim.app.repro as R
reg, log = catalog.load(), []
def timed(call, kind, count):
    def wrapped(*a, **k):
        start = time.process_time()
        out = call(*a, **k)
        log.append((kind, time.process_time() - start, count(out)))
        return out
    return wrapped
R.run_property = timed(R.run_property, "hypothesis", lambda r: r.examples)
R.explore = timed(R.explore, "explore", lambda r: r.states)
for bug in reg.bugs.values():
    log.clear()
    R.reproduce(R.BugRun.resolve(bug, reg), seed=0)
    print(json.dumps({"id": bug.id, "sides": log}), flush=True)
"""


# run by B's interpreter (--floor): the catalog's checks at their least (module doc), as one JSON line
FLOOR = """
import json, sys, time
clock = time.process_time
start = clock()
from kvsim.app import catalog
import kvsim.app.repro as R
from kvsim.engine import property as P, runner
reg = catalog.load()
runs = [R.BugRun.resolve(b, reg) for b in reg.bugs.values()]
out = {"imports": clock() - start, "reports": 0.0, "properties": 0.0, "checks": 0, "models": 0.0, "states": 0,
       "drawing": 0.0, "drawn": 0, "searches": 0, "property_runs": 0}
real_call, real_run, real_explore, real_pinned = P.KvProperty.__call__, R.run_property, R.explore, runner.run_pinned
pinned = [0]

def call(self, *a, **k):
    t = clock()
    try:
        return real_call(self, *a, **k)
    finally:
        out["properties"] += clock() - t
        out["checks"] += 1

def run_pinned(check, cases):
    pinned[0] += len(cases)
    return real_pinned(check, cases)

def run_property(prop, variant, **k):
    pinned[0] = 0
    result = real_run(prop, variant, **k)
    runs_of.append((prop, variant, k, result.examples - pinned[0]))
    return result

def explore(system, options):
    result = real_explore(system, options)
    searches.append((system, options, result._store))
    return result

def models(system, store):
    # the model's calls over the states the search found, in its order (bench_explore_scale's `model_calls`); not
    # the symmetry's canonical forms (the explorer takes one a state it has not met lately): a floor
    expanded = [state for state, actions in zip(store.states, store.actions) if actions is not None]
    calls = model_calls(system, store.states, expanded)
    return calls["checks"] + calls["expansions"], len(store.states)

P.KvProperty.__call__, runner.run_pinned = call, run_pinned
R.run_property, R.explore = run_property, explore
runs_of, searches = [], []
t = clock()
for run in runs:
    R.reproduce(run, seed=0)
out["reports"] = clock() - t
P.KvProperty.__call__, runner.run_pinned = real_call, real_pinned
sys.path.insert(0, sys.argv[1])  # this folder, after the catalog's run: bench_explore_scale's `model_calls`
from bench_explore_scale import model_calls
for system, options, store in searches:
    seconds, states = models(system, store)
    out["models"] += seconds
    out["states"] += states
    out["searches"] += 1
P.KvProperty.__call__ = lambda self, case, variant, backend=None: None
for prop, variant, k, drawn in runs_of:
    if drawn <= 0:
        continue
    k = dict(k, max_examples=drawn, shrink=False, cases=(), keep_tried=False, use_examples=False)
    t = clock()
    got = real_run(prop, variant, **k)
    out["drawing"] += clock() - t
    out["drawn"] += got.examples
    out["property_runs"] += 1
print(json.dumps(out))
"""


def floor(kvsim: str) -> dict[str, Any]:
    """The catalog's checks at their least in the tree of the `kvsim` executable (`FLOOR`): CPU seconds."""
    python = os.path.join(os.path.dirname(kvsim), "python")
    here = os.path.dirname(os.path.abspath(__file__))
    return json.loads(subprocess.run([python, "-P", "-c", FLOOR, here], capture_output=True, text=True,
                                     check=True).stdout)


def print_floor(b: str, runs: dict[str, list[dict[str, Any]]]) -> None:
    f = floor(b)
    least = f["imports"] + f["properties"] + f["models"] + f["drawing"]
    cpu_a = statistics.median(r["cpu"] for r in runs["A"])
    wall_a = statistics.median(r["wall"] for r in runs["A"])
    cpus = os.cpu_count() or 1
    print(f"B's checks at their least (one process, CPU s): imports {f['imports']:.2f}, the properties' calls "
          f"{f['properties']:.2f} ({f['checks']} checks), the models' calls {f['models']:.2f} ({f['searches']} "
          f"searches, {f['states']} states), Hypothesis drawing the same inputs {f['drawing']:.2f} "
          f"({f['drawn']} inputs, {f['property_runs']} runs, nothing checked or shrunk); sum {least:.2f}, "
          f"against the reports' {f['reports']:.2f} + imports")
    print(f"least B/A cpu: {least / cpu_a:.3f}; least B/A wall on {cpus} CPUs: "
          f"{(f['imports'] + (least - f['imports']) / cpus) / wall_a:.3f}")


def sides(kvsim: str) -> dict[str, list[tuple[str, float, int]]]:
    """Each report's sides in the tree of the `kvsim` executable: [(kind, CPU seconds, examples or states)]."""
    python = os.path.join(os.path.dirname(kvsim), "python")
    out = subprocess.run([python, "-P", "-c", SIDES], capture_output=True, text=True, check=True).stdout
    return {row["id"]: row["sides"] for row in map(json.loads, out.splitlines())}


def print_sides(a: str, b: str) -> None:
    got = {"A": sides(a), "B": sides(b)}
    print(f"{'report (CPU s in one process: variant + fixed)':<52} {'A':>15} {'B':>15}  searched A -> B")
    totals: dict[str, dict[str, float]] = {"A": {}, "B": {}}
    for bug, a_sides in got["A"].items():
        cells = []
        for name in ("A", "B"):
            rows = got[name].get(bug, [])
            for k, (kind, secs, _) in enumerate(rows):
                key = f"{kind} {'variant' if k == 0 else 'fixed'}"
                totals[name][key] = totals[name].get(key, 0.0) + secs
            cells.append(" + ".join(f"{secs:.2f}" for _, secs, _ in rows))
        counts = f"{a_sides[0][2]} -> {got['B'][bug][0][2]}" if bug in got["B"] else ""
        print(f"{bug[:52]:<52} {cells[0]:>15} {cells[1]:>15}  {counts}")
    for name in ("A", "B"):
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(totals[name].items()))
        print(f"{name} total {sum(totals[name].values()):.2f} s: {parts}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", required=True, help="side A: the kvsim executable (the baseline tree's)")
    p.add_argument("--b", required=True, help="side B: the kvsim executable (this tree's)")
    p.add_argument("--a-args", default="", help="extra arguments for side A")
    p.add_argument("--b-args", default="", help="extra arguments for side B")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--per-report", action="store_true", help="print each report's seconds (medians)")
    p.add_argument("--floor", action="store_true", help="after the pairs: the least CPU and wall B's checks "
                   "allow, as ratios to A's medians (module doc)")
    p.add_argument("--sides", action="store_true", help="only: each report's variant and fixed side timed apart "
                   "in one process of each tree (CPU), with the totals per kind of side")
    args = p.parse_args()
    if args.sides:
        print_sides(args.a, args.b)
        return
    sides = {"A": [args.a, "repro", "--all", "--json", *shlex.split(args.a_args)],
             "B": [args.b, "repro", "--all", "--json", *shlex.split(args.b_args)]}
    print(f"cpus {os.cpu_count()}  load before {os.getloadavg()[0]:.2f}")
    for name, cmd in sides.items():
        print(f"{name}: {' '.join(cmd)}")
    runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    for i in range(args.pairs):
        for name in ("A", "B") if i % 2 == 0 else ("B", "A"):  # alternated: A B, B A, ...
            r = run_once(sides[name])
            runs[name].append(r)
            print(f"  pair {i + 1} {name}: cpu {r['cpu']:6.2f} s  wall {r['wall']:6.2f} s  rc {r['rc']}  "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"load after {os.getloadavg()[0]:.2f}")
    print("               min / median / max")
    for name in ("A", "B"):
        print(f"{name} cpu  s  {spread([r['cpu'] for r in runs[name]])}")
        print(f"{name} wall s  {spread([r['wall'] for r in runs[name]])}")
    for what in ("cpu", "wall"):
        pairs = [b[what] / a[what] for a, b in zip(runs["A"], runs["B"])]
        med = statistics.median(r[what] for r in runs["B"]) / statistics.median(r[what] for r in runs["A"])
        print(f"B/A {what}: medians {med:.3f}, pairs {spread(pairs)}")
    a_rows, b_rows = rows(runs["A"][0]["doc"]), rows(runs["B"][0]["doc"])
    differ = sorted(k for k in a_rows.keys() | b_rows.keys() if a_rows.get(k) != b_rows.get(k))
    same_b = all(rows(r["doc"]) == b_rows for r in runs["B"])
    print(f"verdict rows (all but timings and searched states): {len(a_rows)} vs {len(b_rows)}, "
          f"{'equal' if not differ else 'DIFFER: ' + ', '.join(differ)}; B's runs alike: {same_b}")
    if args.floor:
        print_floor(args.b, runs)
    if args.per_report:
        print(f"{'report':<52} {'A s':>7} {'B s':>7}   (A: + where the fixed side is left out of A's JSON)")
        seconds = {n: [report_seconds(r["doc"]) for r in runs[n]] for n in ("A", "B")}
        for bug in runs["A"][0]["doc"]["bugs"]:
            a = statistics.median(s[bug["id"]][0] for s in seconds["A"])
            b = statistics.median(s[bug["id"]][0] for s in seconds["B"])
            mark = "" if seconds["A"][0][bug["id"]][1] else "+"
            print(f"{bug['id'][:52]:<52} {a:7.3f}{mark:1} {b:7.3f}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
