"""A stopped search saved to a directory, to go on later from where it stopped (`kvsim explore --checkpoint`).

A search that a bound stops (`--max-seconds`, `--max-memory`, `--max-states`), that is asked to stop
(Ctrl-C, SIGTERM: `kvsim.engine.interrupt`) or that is killed loses nothing it had done: it saves its
store, frontier and counters here when it stops and every few minutes while it runs (killed, it has its
last periodic save), and `--resume DIR` goes on from the last save. A resumed search ends exactly as one
uninterrupted search would: the same states, transitions, depths, violations and liveness verdict.

Layout: each save is a new generation folder (`gen-000001`, ...) holding `search.pkl` (a header, then
the coordinator's part) and, for a partitioned search, one `partition-W.pkl` per worker, written by the
worker itself, at the folder's absolute path (on a Ray cluster the folder must be on storage every
node sees, which a partitioned search checks before it starts: `unshared`). The file `CURRENT`
names the last complete generation; it is replaced atomically once every file of a generation is
written, so a search killed while saving leaves the previous generation in force.

The header says what made the checkpoint: the model, variant, parameters and search options, the
kvsim version and a digest of the engine's and the model's source. A resume with any of them
different is refused with one line naming the field: the saved states and fingerprints mean nothing
to other code. A checkpoint is pickled: resume only checkpoints you made.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .errors import ConfigError, KvsimError
from .interrupt import INTERRUPT
from .memory import collection_paused
from .shared import Probe

FORMAT = 1
CURRENT = "CURRENT"
SEARCH = "search.pkl"
RESUMABLE = ("states", "seconds", "memory", INTERRUPT)  # the bounds a search goes on from (not its depth bound)


def partition_file(gen: str, worker: int) -> str:
    return os.path.join(gen, f"partition-{worker}.pkl")


def code_digest(*modules: Any) -> str:
    """SHA-256 over the Python sources of the packages these modules live in (paths and contents, sorted)."""
    h = hashlib.sha256()
    roots = sorted({Path(m.__file__).resolve().parent for m in modules})
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root.parent)).encode())
            h.update(b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()[:16]


def dump(path: str, *objects: Any) -> None:
    with open(path, "wb") as f, collection_paused():
        for obj in objects:
            pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


def load(path: str, count: int) -> list[Any]:
    with open(path, "rb") as f, collection_paused():
        return [pickle.load(f) for _ in range(count)]


@dataclass
class Snapshot:
    """What a stopped single-process search (`explore`) needs to go on: `search.pkl` after its header."""

    store: Any
    queue: list[tuple[int, Any]]  # the states found and not yet expanded, in breadth-first order
    violations: dict[str, "Violation"]  # the invariant violations found so far (the hang search comes at the end)
    transitions: int
    depth: int
    checked: list[int]
    fired: dict[str, int]
    depth_cut: bool  # the depth bound left some state unexpanded
    seconds: float  # spent on this search so far, every run of it


@dataclass
class Level:
    """The coordinator's part of a partitioned search (`explore_parallel`) between two levels; each worker
    saves its own partition beside it."""

    level: int = 0  # the depth last absorbed
    states: int = 0
    transitions: int = 0
    depth: int = 0
    levels: list[int] = field(default_factory=list)
    first: dict[str, tuple[int, int, str, int]] = field(default_factory=dict)  # invariant -> (depth, gid, message, 0)
    depth_cut: bool = False
    seconds: float = 0.0
    workers: int = 0


class CheckpointDir:
    """The checkpoint folder of one search: `header` describes the search saving to it or resuming from it."""

    def __init__(self, path: str, header: Mapping[str, Any], every: float | None = 600.0,
                 on_stop: Callable[[], None] | None = None) -> None:
        self.path, self.header, self.every = str(path), dict(header, format=FORMAT), every
        self.root = os.path.abspath(self.path)  # a worker elsewhere (a Ray node) has a working folder of its own
        self.on_stop = on_stop  # called once a bound stopped the search, before its last save
        self.saves = 0
        self.next_save: float | None = None

    def schedule(self, now: float) -> None:
        """The search started or saved at `now`: the next periodic save is `every` seconds on."""
        self.next_save = None if self.every is None else now + self.every

    def stopped(self, bound: str | None) -> bool:
        """The search ended at `bound`: whether it saves itself now (a bound it can go on from). Before that
        save, `on_stop` is called (the CLI disarms its time limit: a large save is not cut short)."""
        if bound not in RESUMABLE:
            return False
        if self.on_stop is not None:
            self.on_stop()
        return True

    def due(self, now: float, deadline: float | None) -> bool:
        """A periodic save is due, unless `deadline` (the search's --max-seconds) is within half an interval:
        the save made when that bound stops the search comes soon enough (and a save must not run into the
        command's own time limit)."""
        if self.next_save is None or now < self.next_save:
            return False
        return deadline is None or deadline - now > self.every / 2

    # -- reading ---------------------------------------------------------------------------------------
    def current(self) -> str | None:
        """The folder of the last complete generation, or None where nothing was saved."""
        try:
            name = Path(self.root, CURRENT).read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError("--resume", "a readable checkpoint folder", self.path, exc.strerror or "") from None
        gen = os.path.join(self.root, name)
        if not name.startswith("gen-") or not os.path.isfile(os.path.join(gen, SEARCH)):
            raise ConfigError("--resume", "a checkpoint folder written by kvsim explore --checkpoint", self.path,
                              f"{CURRENT} names {name!r}, which holds no {SEARCH}")
        return gen

    def fresh(self) -> None:
        """Refuse to start a new search over a checkpoint (its saves would replace it)."""
        if os.path.exists(os.path.join(self.root, CURRENT)):
            raise ConfigError("--checkpoint", "a new or empty folder", self.path,
                              "it holds a checkpoint: go on from it with --resume, or name another folder")

    def check(self) -> str:
        """The current generation's folder, once its header matches this search's (the saved search unread)."""
        gen = self.current()
        if gen is None:
            raise ConfigError("--resume", "a folder holding a checkpoint (kvsim explore --checkpoint DIR)",
                              self.path, f"no {CURRENT} file")
        saved = self._read(gen, 1)[0]
        if not isinstance(saved, dict):
            raise ConfigError("--resume", "a checkpoint written by kvsim explore --checkpoint", self.path,
                              "no header")
        for field, value in self.header.items():
            if saved.get(field) != value:
                raise ConfigError("--resume", f"the search the checkpoint was made by ({field} "
                                              f"{_show(saved.get(field))})", f"{field} {_show(value)}",
                                  "repeat its command with --resume DIR")
        return gen

    def resume(self) -> tuple[str, Any]:
        """(the generation folder, the coordinator's saved part) after checking that the header matches."""
        gen = self.check()
        return gen, self._read(gen, 2)[1]

    def resume_as(self, kind: type, expected: str, fits: Callable[[Any], bool] = lambda body: True) -> tuple[str, Any]:
        """`resume()`, refused unless the saved part is a `kind` that `fits` this search (`expected` says what)."""
        gen, body = self.resume()
        if not isinstance(body, kind) or not fits(body):
            raise ConfigError("--resume", expected, self.path, f"it holds a {type(body).__name__}"
                              + (f" over {body.workers} workers" if isinstance(body, Level) else ""))
        return gen, body

    def _read(self, gen: str, count: int) -> list[Any]:
        try:
            return load(os.path.join(gen, SEARCH), count)
        except Exception as exc:  # truncated, foreign or corrupt: one line, never a traceback
            raise ConfigError("--resume", "a checkpoint written by kvsim explore --checkpoint", self.path,
                              f"{type(exc).__name__}: {exc}") from None

    # -- writing ---------------------------------------------------------------------------------------
    @contextmanager
    def saving(self, option: str) -> Iterator[None]:
        """A save that fails (a full disk, a worker that cannot write) ends the search with one line naming
        `option`, not a traceback: the save `CURRENT` names, if any, is untouched and stays the one to resume."""
        try:
            yield
        except KvsimError:
            raise
        except Exception as exc:  # from this process or, through its pool, from a worker
            last = (str(exc).strip().splitlines() or [""])[-1]
            kept = "the last complete save stays in force" if self.current() else "nothing was saved"
            raise ConfigError(option, "a folder the search can save to", self.path,
                              f"saving failed: {type(exc).__name__}: {last}; {kept}") from None

    def begin(self) -> str:
        """A new, empty generation folder: fill it, then `commit` it."""
        os.makedirs(self.root, exist_ok=True)
        gens = [int(p.name[4:]) for p in Path(self.root).glob("gen-*") if p.name[4:].isdigit()]
        gen = os.path.join(self.root, f"gen-{max(gens, default=0) + 1:06d}")
        shutil.rmtree(gen, ignore_errors=True)
        os.makedirs(gen)
        return gen

    def commit(self, gen: str, body: Any) -> None:
        """Write the coordinator's part, make `gen` the current generation, and drop the older ones."""
        dump(os.path.join(gen, SEARCH), self.header, body)
        tmp = os.path.join(self.root, CURRENT + ".tmp")
        Path(tmp).write_text(os.path.basename(gen) + "\n")
        os.replace(tmp, os.path.join(self.root, CURRENT))
        for old in Path(self.root).glob("gen-*"):
            if str(old) != gen:
                shutil.rmtree(old, ignore_errors=True)
        self.saves += 1
        self.schedule(time.perf_counter())


    def unshared(self, ask: Callable[[list[tuple[str, str, str]]], list[bool]], workers: int) -> list[int]:
        """The workers that do not share this folder with this process (another machine's disk, or none):
        `ask` has each worker check a `kvsim.engine.shared.Probe` written there (`shared.sees`)."""
        probe = Probe(self.root)
        try:
            seen = ask([probe.ask(w) for w in range(workers)])
            return [w for w in range(workers) if not (seen[w] and probe.seen(w))]
        finally:
            probe.close()


def _show(value: Any) -> str:
    return "none" if value is None else str(value)
