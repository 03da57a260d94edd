"""The explorer at scale: states/s and bytes a state, one process against workers and Ray, with and without symmetry.

    python benchmarks/bench_explore_scale.py [--max-states N] [--max-seconds S] [--workers N] [--ray]
                                             [--ray-nodes] [--full] [--only NAME]
    python benchmarks/bench_explore_scale.py --largest --max-states 60000000 [--only NAME]
    python benchmarks/bench_explore_scale.py --checkpoint [--only NAME]
    python benchmarks/bench_explore_scale.py --ceiling [--repeat N] [--store full|fingerprint] [--largest] [--only NAME]
    python benchmarks/bench_explore_scale.py --scaling PAIRS [--workers N] [--store full|fingerprint] [--symmetry]
                                             [--only NAME]

For each configuration (pd-staging 2 rooms x 2 writers, pd-protocol 2 rooms per backend, swa-budget
6 requests) it runs, in one process and one after another, with the fingerprint store:
  1 process, every state               (the peer every ratio is measured against)
  1 process, symmetry                  (one representative per orbit, where the model declares `canonical`)
  --workers N, every state / symmetry  (forked processes, state space partitioned by hash)
  Ray N actors, symmetry               (--ray: a local Ray cluster; its overhead against --workers N)
  Ray N actors, 1 node / N nodes       (--ray-nodes: local clusters started beforehand, one node with N CPUs,
                                        then N nodes with one each, so every outbox crosses between nodes)
  full store, 1 process                (--full: states kept as objects)
and prints states, transitions, seconds (and the CPU seconds of the process and its workers, with the load
average: on a machine other jobs share, CPU time over wall time says how much of a core each run got),
states/s (per worker too), the ratio to the first run,
bytes a state, and whether the run finished. Finished runs are checked against each other: the
same violated invariants, counterexample lengths and hang verdict (and, between runs that reduce
alike, the same state and transition counts). `--max-states` and `--max-seconds` bound every run
(defaults 300,000 states and 600 s) so a configuration that does not finish still gives a rate.

`--largest` runs instead the largest configurations that finish in 10 minutes on a 2-core machine
(pd-protocol 3 rooms per backend and on the sglang_0_5_23 variant, pd-staging 2 rooms, pd-staging
2 writers; each other model's binding caps: pd-protocol 32 chunks and 6 faults, mla-backends 32
plans, kv-offload 48 resets, pipelined-transfer 2 requests and 4 ranks), each in one process and with
`--workers N`, both with the model's symmetry: the "largest configuration each model finishes"
figures, several minutes a run.

`--ceiling` runs instead, for each configuration, the every-state search in one process (no hang search) and
then the model's own calls alone over the states it found (`ceiling`), both in CPU time: the share of the
search's time that is the model, the explorer's own time (the rest) as a multiple of the model's, and the rate
no complete search over the model can pass. Each pass runs `--repeat` times (default 3), each time in a fresh
process, the two passes alternating; the figures are medians, with the least and the spread of each. The search
keeps its states in `--store` (default full, `kvsim explore`'s own default; fingerprint: the compact store of
the largest searches). A bare breadth-first search over the same model (a dict of the states found and a queue:
no ids, paths, coverage or bounds) is timed too (`bare`): the least any explorer written in Python pays.

`--scaling PAIRS` runs instead, for each configuration, the every-state search (hang search included, as
`kvsim explore` runs it; with `--symmetry`, one state per orbit where the model declares a symmetry, as
`kvsim explore` runs by default) in one process and over `--workers N` forked processes, PAIRS times each, alternating,
each run in a fresh process, in the `--store` given (default fingerprint here, the faster of the two once
partitioned): the wall seconds of each (least / median / most), and the workers' rate over the one process's,
pair by pair and from the medians. Each round also runs N copies of the one-process search at once, in N fresh
processes: N times the one process's rate is what the partition would give if splitting the search cost nothing,
and their rate over one copy's is how much of N cores this machine gives N such searches. A shared machine's
speed drifts by a third from one minute to the next; only the alternated pairs compare (rates, where a
partitioned search bounded by its state count ends at the end of a level, past the bound).

`--checkpoint` adds, after the symmetric single process, the same search cut in three by the state
bound, each piece saved to a checkpoint and resumed by the next (`kvsim explore --checkpoint/--resume`):
its seconds against the uninterrupted run, the seconds spent saving and loading, and the checkpoint's
size per state (the frontier is most of it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import replace
from typing import Any
from pathlib import Path

from kvsim.app import catalog
from kvsim.engine.descriptor import RunSpec
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.explore.checkpoint import CheckpointDir
from kvsim.engine.explore.parallel import explore_parallel
from kvsim.engine.memory import collection_paused
from kvsim.engine.system import sometimes

CONFIGS = (
    ("swa-budget 6 requests", "swa-budget", "fixed",
     {"prompts": "1,3,2,2,1,3", "outputs": "3,2,2,1,2,1", "full_pages": 6, "swa_pages": 5}),
    ("pd-protocol mooncake 2 rooms", "pd-protocol", "fixed", {"backend": "mooncake", "rooms": 2}),
    ("pd-protocol nixl 2 rooms", "pd-protocol", "fixed", {"backend": "nixl", "rooms": 2}),
    ("pd-protocol mori 2 rooms", "pd-protocol", "fixed", {"backend": "mori", "rooms": 2}),
    ("pd-staging 2 rooms x 2 writers", "pd-staging", "fixed", {"rooms": 2, "writers": 2}),
)

# --largest: the largest configurations that finish in 10 minutes on a 2-core machine (issue 16's closing notes)
LARGEST = (
    ("pd-protocol mooncake 3 rooms", "pd-protocol", "fixed", {"backend": "mooncake", "rooms": 3}),
    ("pd-protocol nixl 3 rooms", "pd-protocol", "fixed", {"backend": "nixl", "rooms": 3}),
    ("pd-protocol mori 3 rooms", "pd-protocol", "fixed", {"backend": "mori", "rooms": 3}),
    ("pd-protocol mooncake 3 rooms, sglang_0_5_23", "pd-protocol", "sglang_0_5_23", {"backend": "mooncake", "rooms": 3}),
    ("pd-staging 2 rooms", "pd-staging", "fixed", {"rooms": 2}),
    ("pd-staging 2 writers", "pd-staging", "fixed", {"writers": 2}),
    # the other caps raised to what finishes (each alone, the rest at their defaults)
    ("pd-protocol 32 chunks", "pd-protocol", "fixed", {"chunks": 32}),
    ("pd-protocol 6 faults", "pd-protocol", "fixed", {"faults": 6}),
    ("mla-backends 32 plans", "mla-backends", "fixed", {"plans": 32}),
    ("kv-offload 48 resets", "kv-offload", "fixed", {"resets": 48}),
    ("pipelined-transfer 2 requests", "pipelined-transfer", "fixed", {"requests": 2}),
    ("pipelined-transfer 4 ranks", "pipelined-transfer", "fixed", {"ranks": 4}),
)


def cpu_seconds() -> float:
    """CPU time of this process and of its children that ended (the forked workers, once joined)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(label: str, fn, base: float | None, workers: int = 1) -> dict:
    start, cpu = time.perf_counter(), cpu_seconds()
    r = fn()
    seconds = time.perf_counter() - start
    cpu = cpu_seconds() - cpu
    rate = r.states / seconds
    row = {"run": label, "states": r.states, "transitions": r.transitions, "seconds": round(seconds, 2),
           "states_per_second": round(rate), "per_worker": round(rate / workers), "ratio": round(rate / base, 2)
           if base else 1.0, "bytes_per_state": r.bytes_per_state, "complete": r.bound_hit is None,
           "symmetry": r.symmetry, "depth": r.depth, "cpu_seconds": round(cpu, 2), "load": round(os.getloadavg()[0], 1),
           "verdicts": sorted((v.property, v.kind, len(v.trace)) for v in r.violations) + [("hang", r.hang_states > 0)]}
    print(f"  {label:30s} {r.states:>10,} states {r.transitions:>11,} transitions {seconds:8.1f} s ({cpu:.1f} s CPU, "
          f"load {row['load']}) "
          f"{rate:>8,.0f}/s ({rate / workers:>7,.0f}/worker) x{row['ratio']:<5} {r.bytes_per_state or '':>6} B/state "
          f"{'complete' if row['complete'] else 'bound: ' + str(r.bound_hit)}", flush=True)
    return row


class TimedCheckpoint(CheckpointDir):
    """A checkpoint folder that adds up the seconds its saves and loads take."""

    def __init__(self, path: str, every: float | None = None) -> None:
        super().__init__(path, {"bench": "explore"}, every=every)
        self.saving = self.loading = 0.0

    def commit(self, gen: str, body) -> None:
        start = time.perf_counter()
        super().commit(gen, body)
        self.saving += time.perf_counter() - start

    def resume(self):
        start = time.perf_counter()
        out = super().resume()
        self.loading += time.perf_counter() - start
        return out


def checkpointed(spec: RunSpec, bound: ExploreOptions, peer: dict) -> dict:
    """`peer`'s search (one process, symmetry) in three pieces, each saved and resumed by the next."""
    folder = tempfile.mkdtemp(prefix="kvsim-bench-checkpoint-")
    try:
        third = -(-peer["states"] // 3)
        saving = loading = 0.0
        largest = 0
        start = time.perf_counter()
        for piece in (1, 2, 3):
            saves = TimedCheckpoint(folder)
            r = explore(spec.system(), replace(bound, max_states=min(bound.max_states, third * piece),
                                               checkpoint=saves, resume=piece > 1))
            saving, loading = saving + saves.saving, loading + saves.loading
            largest = max(largest, sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file()))
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    same = (r.states, r.transitions) == (peer["states"], peer["transitions"])
    row = {"run": "3 pieces, checkpointed", "states": r.states, "transitions": r.transitions,
           "seconds": round(seconds, 2), "ratio": round(peer["seconds"] / seconds, 2), "saving": round(saving, 2),
           "loading": round(loading, 2), "largest_checkpoint_bytes": largest, "same_counts": same,
           "complete": r.bound_hit is None, "symmetry": r.symmetry, "depth": r.depth,
           "verdicts": sorted((v.property, v.kind, len(v.trace)) for v in r.violations) + [("hang", r.hang_states > 0)]}
    print(f"  {row['run']:30s} {r.states:>10,} states {seconds:8.1f} s, x{row['ratio']} the uninterrupted rate; "
          f"saving {saving:.1f} s, loading {loading:.1f} s; largest checkpoint {largest / 2 ** 20:.1f} MiB "
          f"({largest / max(r.states, 1):.0f} B/state); same counts {same}", flush=True)
    return row


def compare(spec: RunSpec, bound: ExploreOptions, symmetric: bool, n: int, args: argparse.Namespace) -> list[dict]:
    """Every state and symmetry, one process and workers (and Ray, the full store where asked)."""
    base = run("1 process, every state", lambda: explore(spec.system(), replace(bound, symmetry=False)), None)
    rows = [base]
    rate = base["states_per_second"]
    if symmetric:
        rows.append(run("1 process, symmetry", lambda: explore(spec.system(), bound), rate))
    if args.checkpoint:
        rows.append(checkpointed(spec, bound, rows[-1]))
    rows.append(run(f"{n} workers, every state",
                    lambda: explore_parallel(spec.system, n, replace(bound, symmetry=False)), rate, n))
    if symmetric:
        rows.append(run(f"{n} workers, symmetry", lambda: explore_parallel(spec.system, n, bound), rate, n))
    if args.ray:
        ray_row = run(f"Ray {n} actors{', symmetry' if symmetric else ''}",
                      lambda: explore_parallel(spec.system, n, bound, use_ray=True), rate, n)
        rows.append(ray_row)
        peer = rows[-2]
        print(f"  Ray overhead against {n} workers: x{peer['seconds'] / max(ray_row['seconds'], 1e-9):.2f} "
              f"the rate ({ray_row['seconds'] - peer['seconds']:+.1f} s)")
    if args.ray_nodes:
        rows += across_nodes(spec, bound, symmetric, n, rate)
    if args.full:
        rows.append(run("full store, 1 process, every state",
                        lambda: explore(spec.system(), replace(bound, symmetry=False, store="full")), rate))
    return rows


def across_nodes(spec: RunSpec, bound: ExploreOptions, symmetric: bool, n: int, rate: float) -> list[dict]:
    """The Ray search on a local cluster of one node with n CPUs, then of n nodes with a CPU each (every
    outbox then crosses between object stores, as between machines); each cluster started before the clock."""
    import ray
    from ray.cluster_utils import Cluster

    from kvsim.engine.pools import connect_ray

    rows = []
    for nodes in (1, n):
        if ray.is_initialized():
            ray.shutdown()
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": n // nodes, "include_dashboard": False})
        try:
            for _ in range(nodes - 1):
                cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            connect_ray(cluster.address, n)
            rows.append(run(f"Ray {n} actors, {nodes} node{'s' if nodes > 1 else ''}"
                            f"{', symmetry' if symmetric else ''}",
                            lambda: explore_parallel(spec.system, n, bound, use_ray=True,
                                                     ray_address=cluster.address), rate, n))
        finally:
            ray.shutdown()
            cluster.shutdown()
    one, many = rows
    print(f"  {n} nodes against 1: x{one['seconds'] / max(many['seconds'], 1e-9):.2f} the rate "
          f"({many['seconds'] - one['seconds']:+.1f} s)")
    return rows


def explorer_pass(spec: RunSpec, bound: ExploreOptions) -> dict:
    """The search `ceiling` measures: every state, no hang search, in the store `bound` names, in CPU time of this
    process (a machine other jobs share moves wall time, not CPU time, much)."""
    start = time.process_time()
    r = explore(spec.system(), replace(bound, symmetry=False, check_liveness=False))
    return {"seconds": time.process_time() - start, "states": r.states, "complete": r.bound_hit is None,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def breadth_first(system: Any, states: int, complete: bool, found: list | None = None,
                  expanded: list | None = None) -> int:
    """The barest breadth-first search over `system`: its first `states` states, every one expanded where the
    search was `complete` (else those before the bound); a dict of the states found and a queue, the model's
    calls as the explorer makes them (`done`, the invariants until one fails, the reachability declarations until
    one says True; no state that violates an invariant is expanded), nothing else: no ids, parents, successor
    lists, coverage, interning, bounds but the state count. The states found and those expanded, in order, go
    into `found` and `expanded` where given. Returns the count of states found."""
    enabled, step, done, checks = system.enabled, system.step, system.done, [inv.check for inv in system.invariants]
    pending = [g.check for g in sometimes(system) if not g.step]
    moves = [g.check for g in sometimes(system) if g.step]
    seen: dict = {}
    queue: deque = deque()

    def reach(state: Any) -> None:
        seen[state] = None
        if found is not None:
            found.append(state)
        done(state)
        for check in checks:
            if check(state) is not None:
                break
        else:
            queue.append(state)
        if pending:
            pending[:] = [check for check in pending if not check(state)]

    for state in system.initial_states():
        if state not in seen:
            reach(state)
    while queue and (complete or len(seen) < states):
        state = queue.popleft()
        if expanded is not None:
            expanded.append(state)
        for action in enabled(state):
            nxt = step(state, action)
            if moves:
                moves[:] = [check for check in moves if not check(state, action, nxt)]
            if nxt not in seen and len(seen) < states:
                reach(nxt)
    return len(seen)


def bare_pass(spec: RunSpec, states: int, complete: bool) -> dict:
    """`breadth_first` timed whole (the collector paused, as in `model_pass`): what it spends beyond the model's
    own calls (`model_pass`) is what any explorer in Python pays, hashing and comparing the states it finds."""
    system = spec.system()
    with collection_paused():
        start = time.process_time()
        found = breadth_first(system, states, complete)
        seconds = time.process_time() - start
    return {"seconds": seconds, "states": found}


def model_pass(spec: RunSpec, states: int, complete: bool = False) -> dict:
    """The model's own calls alone over the first `states` states of a breadth-first search.

    `breadth_first` finds the states the explorer found, in its order, untimed; over them, the model's calls alone
    are timed: `done` and every invariant on each state found, `enabled` and every `step` on each state expanded,
    as the search expands them: every state found where it was `complete` (else those before the bound), but those
    that violate an invariant. The model's reachability declarations (`Sometimes`) are asked as the explorer asks
    them: of each state found (a step one: of each transition) until one says True. The collector is paused while
    they run, as the explorer pauses it for its search (`YoungCollections`): the model's calls are timed as they
    run inside the explorer, and the collector's passes over the states held do not add to one pass and not to
    another."""
    system = spec.system()
    found: list = []
    expanded: list = []
    breadth_first(system, states, complete, found, expanded)
    return {"found": len(found), "expanded": len(expanded), **model_calls(system, found, expanded)}


def model_calls(system: Any, found: list, expanded: list) -> dict:
    """The model's own calls over `found` and `expanded` (`model_pass`), CPU seconds: `checks` (`done`, the
    invariants and the state declarations on each state found) and `expansions` (`enabled`, each `step` and the
    step declarations on each state expanded), with the count of `steps`."""
    enabled, step, done, invariants = system.enabled, system.step, system.done, list(system.invariants)
    clock = time.process_time
    pending = [g.check for g in sometimes(system) if not g.step]
    moves = [g.check for g in sometimes(system) if g.step]
    with collection_paused():
        start = clock()
        for state in found:
            done(state)
            for inv in invariants:
                if inv.check(state) is not None:
                    break
            if pending:
                pending[:] = [check for check in pending if not check(state)]
        checks = clock() - start
        start, steps = clock(), 0
        for state in expanded:
            for action in enabled(state):
                nxt = step(state, action)
                if moves:
                    moves[:] = [check for check in moves if not check(state, action, nxt)]
                steps += 1
        expansions = clock() - start
    return {"steps": steps, "checks": checks, "expansions": expansions}


def pass_command(kind: str, label: str, args: argparse.Namespace, states: int = 0, complete: bool = False) -> list:
    """The command of one pass in a fresh process (this script, `--ceiling-pass`)."""
    command = [sys.executable, __file__, "--ceiling-pass", kind, "--config", label, "--states", str(states),
               "--max-states", str(args.max_states), "--max-seconds", str(args.max_seconds), "--store", args.store,
               "--workers", str(args.workers)]
    return command + ["--complete"] * complete + ["--symmetry"] * args.symmetry


def fresh_pass(kind: str, label: str, args: argparse.Namespace, states: int = 0, complete: bool = False) -> dict:
    """One pass of `ceiling` or `scaling` in a fresh process: every pass starts from the same heap, and the one
    before it leaves nothing behind for it to collect."""
    out = subprocess.run(pass_command(kind, label, args, states, complete), check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.splitlines()[-1])


def twin_passes(label: str, args: argparse.Namespace) -> dict:
    """`--workers` one-process searches at once, each in its own fresh process: how much of N cores the machine
    gives N independent copies of the search (the most any partition of it could get). Their time: the slowest
    copy's search, as each timed it (their start-up, which overlaps, left out as it is from every pass)."""
    procs = [subprocess.Popen(pass_command("one", label, args), stdout=subprocess.PIPE, text=True)
             for _ in range(args.workers)]
    outs = [json.loads(p.communicate()[0].splitlines()[-1]) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a twin pass failed: {[p.returncode for p in procs]}")
    return {"seconds": max(o["seconds"] for o in outs), "states": outs[0]["states"],
            "each": [round(o["seconds"], 2) for o in outs]}


def spread(values: list[float]) -> str:
    """median, least and spread ((most - least) / median) of one pass's repeats"""
    mid = statistics.median(values)
    return f"{mid:.2f} s CPU (least {min(values):.2f}, spread {(max(values) - min(values)) / mid:.0%})"


def ceiling(label: str, args: argparse.Namespace) -> dict:
    """The model's own calls against the explorer that makes them: how fast any explorer over this model can go.

    `--repeat` times each, alternating, each in a fresh process: the explorer's search (`explorer_pass`), then
    the model's calls alone over the states it found (`model_pass`). A complete search expands every state it
    finds, so its rate can never pass one state per (expansion + checks) of the model, whatever the explorer
    does. The figures are medians; the multiple is also given from the least times and over each pair."""
    searches, models, bares = [], [], []
    for _ in range(args.repeat):
        searches.append(fresh_pass("explorer", label, args))
        models.append(fresh_pass("model", label, args, searches[0]["states"], searches[0]["complete"]))
        bares.append(fresh_pass("bare", label, args, searches[0]["states"], searches[0]["complete"]))
    if len({r["states"] for r in searches}) > 1:  # a --max-seconds bound stopped some and not others
        print(f"  note: the searches found {sorted({r['states'] for r in searches})} states")
    m = models[0]
    search_s = [r["seconds"] for r in searches]
    model_s = [r["checks"] + r["expansions"] for r in models]
    search, model = statistics.median(search_s), statistics.median(model_s)
    bare = statistics.median(r["seconds"] for r in bares)
    overhead = (search - model) / model
    pairs = [(s - t) / t for s, t in zip(search_s, model_s)]
    checks = statistics.median(r["checks"] for r in models)
    expansions = statistics.median(r["expansions"] for r in models)
    per_state = checks / m["found"] + expansions / m["expanded"]  # a complete search: each state found, expanded
    states = searches[0]["states"]
    row = {"states": states, "expanded": m["expanded"], "transitions": m["steps"],
           "explorer_seconds": round(search, 2), "model_seconds": round(model, 2),
           "model_share": round(model / search, 2), "overhead": round(overhead, 2),
           "overhead_least": round((min(search_s) - min(model_s)) / min(model_s), 2),
           "overhead_pairs": [round(p, 2) for p in pairs], "repeat": args.repeat,
           "explorer_seconds_each": [round(x, 2) for x in search_s],
           "model_seconds_each": [round(x, 2) for x in model_s],
           "explorer_states_per_second": round(states / search), "free_explorer": round(m["found"] / model),
           "complete_search_at_most": round(1 / per_state), "steps_per_state": round(m["steps"] / m["expanded"], 2),
           "complete": searches[0]["complete"], "store": args.store, "bare_seconds": round(bare, 2),
           "explorer_peak_mb": statistics.median(r["peak_mb"] for r in searches),
           "bare_overhead": round((bare - model) / model, 2)}
    bounded = "" if row["complete"] else ", bounded"
    print(f"  explorer ({args.store} store): {states:,} states ({m['expanded']:,} expanded, {m['steps']:,} steps"
          f"{bounded}, peak {statistics.median(r['peak_mb'] for r in searches):,.0f} MB), "
          f"x{args.repeat}: {spread(search_s)}, {row['explorer_states_per_second']:,}/s")
    print(f"  the model's calls alone, x{args.repeat}: {spread(model_s)}, "
          f"{row['model_share']:.0%} of the explorer's time")
    print(f"  the explorer's own: {search - model:.2f} s, {overhead:.2f}x the model's (least times: "
          f"{row['overhead_least']:.2f}x; pass by pass {min(pairs):.2f}x to {max(pairs):.2f}x)")
    print(f"  a bare breadth-first search (a dict and a queue), x{args.repeat}: "
          f"{spread([r['seconds'] for r in bares])}: its own {row['bare_overhead']:.2f}x the model's")
    print(f"  the model alone runs {row['free_explorer']:,} of these states/s; a complete search (every state "
          f"expanded, {row['steps_per_state']} steps each) at most {row['complete_search_at_most']:,}/s", flush=True)
    return row


def scaling(label: str, args: argparse.Namespace) -> dict:
    """`--scaling`: one process against `--workers`, alternated pairs, each run in a fresh process (`fresh_pass`)."""
    ones: list[dict] = []
    manys: list[dict] = []
    twins: list[dict] = []
    for k in range(args.scaling):
        for kind in ("one", "workers", "twins") if k % 2 == 0 else ("twins", "workers", "one"):
            if kind == "twins":
                twins.append(twin_passes(label, args))
            else:
                (ones if kind == "one" else manys).append(fresh_pass(kind, label, args))
    if len({r["states"] for r in ones + manys}) > 1:  # a partitioned search stops at the end of a level
        print(f"  note: the searches found {sorted({r['states'] for r in ones + manys})} states: rates compare, "
              "not seconds")
    one_s, many_s = [r["seconds"] for r in ones], [r["seconds"] for r in manys]
    one_rate, many_rate = [r["states"] / r["seconds"] for r in ones], [r["states"] / r["seconds"] for r in manys]
    pairs = [b / a for a, b in zip(one_rate, many_rate)]
    row = {"store": args.store, "symmetry": args.symmetry, "workers": args.workers, "states": ones[0]["states"],
           "one_seconds": [round(x, 2) for x in one_s], "workers_seconds": [round(x, 2) for x in many_s],
           "one_cpu": [round(r["cpu"], 2) for r in ones], "workers_cpu": [round(r["cpu"], 2) for r in manys],
           "scaling": round(statistics.median(many_rate) / statistics.median(one_rate), 2),
           "scaling_pairs": [round(p, 2) for p in pairs],
           "twins_seconds": [round(r["seconds"], 2) for r in twins]}
    # N copies of the one-process search at once: N times its states in the slowest copy's wall time
    twin_s = [r["seconds"] for r in twins]
    row["machine_scaling"] = round(args.workers * statistics.median(one_s) / statistics.median(twin_s), 2)
    for name, runs in (("1 process", ones), (f"{args.workers} workers", manys)):
        wall = [r["seconds"] for r in runs]
        kind = f"{args.store} store{', symmetry' if args.symmetry else ''}"
        print(f"  {name:10s} ({kind}) {runs[0]['states']:,} states, x{len(runs)}: {min(wall):.2f} / "
              f"{statistics.median(wall):.2f} / {max(wall):.2f} s wall (least / median / most), CPU "
              f"{statistics.median(r['cpu'] for r in runs):.2f} s (median, the workers' and this process's)")
    print(f"  {args.workers} workers' rate (states/s) over 1 process's: {row['scaling']:.2f}x from the medians; "
          f"pair by pair {min(pairs):.2f} / {statistics.median(pairs):.2f} / {max(pairs):.2f}x")
    print(f"  {args.workers} one-process searches at once (the machine's own scaling of this search): "
          f"{min(twin_s):.2f} / {statistics.median(twin_s):.2f} / {max(twin_s):.2f} s wall, "
          f"{row['machine_scaling']:.2f}x the one process's rate", flush=True)
    return row


def one_pass(args: argparse.Namespace) -> None:
    """`--ceiling-pass`: one pass of `ceiling` or `scaling` in this process, printed as a line of JSON."""
    label, model, variant, params = next(c for c in LARGEST + CONFIGS if c[0] == args.config)
    spec = RunSpec.resolve(catalog.models().model(model), variant, [f"{k}={v}" for k, v in params.items()])
    if args.ceiling_pass in ("one", "workers"):
        bound = ExploreOptions(max_states=args.max_states, max_seconds=args.max_seconds, store=args.store,
                               symmetry=args.symmetry)
        start, cpu = time.perf_counter(), cpu_seconds()
        r = explore(spec.system(), bound) if args.ceiling_pass == "one" else \
            explore_parallel(spec.system, args.workers, bound)
        out = {"seconds": time.perf_counter() - start, "cpu": cpu_seconds() - cpu, "states": r.states}
    elif args.ceiling_pass == "explorer":
        out = explorer_pass(spec, ExploreOptions(max_states=args.max_states, max_seconds=args.max_seconds,
                                                 store=args.store))
    elif args.ceiling_pass == "bare":
        out = bare_pass(spec, args.states, args.complete)
    else:
        out = model_pass(spec, args.states, args.complete)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-states", type=int, default=300_000)
    ap.add_argument("--max-seconds", type=float, default=600.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ray", action="store_true", help="also run on a local Ray cluster")
    ap.add_argument("--ray-nodes", action="store_true",
                    help="also run on a local Ray cluster of one node, then of --workers nodes (a worker a node)")
    ap.add_argument("--full", action="store_true", help="also run the full store in one process")
    ap.add_argument("--only", help="run only configurations whose label contains this")
    ap.add_argument("--largest", action="store_true",
                    help="instead: the largest configurations that finish here, one process and --workers N, each "
                         "with the model's symmetry (use --max-states 60000000; several minutes each)")
    ap.add_argument("--checkpoint", action="store_true",
                    help="also run the single-process search in three pieces, saved and resumed")
    ap.add_argument("--ceiling", action="store_true",
                    help="instead: the model's own calls timed against the explorer making them (every state, one "
                         "process), and the rate no explorer over the model can pass")
    ap.add_argument("--store", choices=("full", "fingerprint"),
                    help="with --ceiling or --scaling: the explorer's store (default: full with --ceiling, kvsim "
                         "explore's default; fingerprint with --scaling)")
    ap.add_argument("--scaling", type=int, metavar="PAIRS",
                    help="instead: one process against --workers N, PAIRS alternated pairs (1 to 20), each run in a "
                         "fresh process")
    ap.add_argument("--symmetry", action="store_true",
                    help="with --scaling: the search with the model's symmetry, where it declares one (kvsim "
                         "explore's default; without it: every state)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="with --ceiling: how many times each pass runs, each in a fresh process (1 to 20, default 3)")
    ap.add_argument("--json", metavar="FILE")
    # `fresh_pass`'s child
    ap.add_argument("--ceiling-pass", choices=("explorer", "model", "bare", "one", "workers"), help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--states", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--complete", action="store_true", help=argparse.SUPPRESS)  # the search expanded every state
    args = ap.parse_args()
    if args.store is None:
        args.store = "fingerprint" if args.scaling else "full"
    if args.ceiling_pass:
        one_pass(args)
        return
    if not 1 <= args.repeat <= 20:  # each repeat is a whole search and a whole model pass
        ap.error(f"--repeat: expected a count from 1 to 20, got {args.repeat}")
    if args.scaling is not None and not 1 <= args.scaling <= 20:
        ap.error(f"--scaling: expected a count of pairs from 1 to 20, got {args.scaling}")
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, max states {args.max_states:,}, "
          f"max seconds {args.max_seconds:,.0f}, kvsim from {Path(catalog.__file__).parents[2]}")
    reg = catalog.models()
    report = []
    n = args.workers
    for label, model, variant, params in LARGEST if args.largest else CONFIGS:
        if args.only and args.only not in label:
            continue
        spec = RunSpec.resolve(reg.model(model), variant, [f"{k}={v}" for k, v in params.items()])
        symmetric = getattr(spec.system(), "canonical", None) is not None
        print(f"{label} (symmetry {'declared' if symmetric else 'not declared'})", flush=True)
        bound = ExploreOptions(max_states=args.max_states, max_seconds=args.max_seconds, check_liveness=True,
                               store="fingerprint")
        if args.ceiling:
            report.append({"config": label, "params": params, "ceiling": ceiling(label, args)})
            continue
        if args.scaling:
            report.append({"config": label, "params": params, "scaling": scaling(label, args)})
            continue
        if args.largest:  # one process against workers, both reduced as the model declares
            rows = [run("1 process", lambda: explore(spec.system(), bound), None)]
            rows.append(run(f"{n} workers", lambda: explore_parallel(spec.system, n, bound),
                            rows[0]["states_per_second"], n))
        else:
            rows = compare(spec, bound, symmetric, n, args)
        done = [r for r in rows if r["complete"]]
        if len(done) > 1:
            same = len({tuple(map(tuple, r["verdicts"])) for r in done}) == 1
            counts = all(len({(r["states"], r["transitions"]) for r in done if r["symmetry"] == sym}) <= 1
                         for sym in (False, True))
            print(f"  finished runs agree: verdicts {same}, counts {counts}")
        report.append({"config": label, "params": params, "runs": rows})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
