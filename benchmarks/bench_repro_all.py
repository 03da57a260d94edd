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
# an explorer report that stops at its first violation searches fewer states: its count differs by design
SEARCHED = {"states"}


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", required=True, help="side A: the kvsim executable (the baseline tree's)")
    p.add_argument("--b", required=True, help="side B: the kvsim executable (this tree's)")
    p.add_argument("--a-args", default="", help="extra arguments for side A")
    p.add_argument("--b-args", default="", help="extra arguments for side B")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--per-report", action="store_true", help="print each report's seconds (medians)")
    args = p.parse_args()
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
