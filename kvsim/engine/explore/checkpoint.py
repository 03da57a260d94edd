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
written, so a search killed while saving leaves the previous generation in force. While a search saves to the
folder or goes on from it, it holds the folder's `LOCK` file (an exclusive `flock`, let go when the search ends
or its process dies): a second search named to the same folder, new or resumed, is refused with one line before
it starts, instead of the two writing generations over each other (`CheckpointDir.held`).

The header says what made the checkpoint: the model, variant, parameters and search options, the
kvsim version and a digest of the engine's and the model's source. A resume with any of them
different is refused with one line naming the field: the saved states and fingerprints mean nothing
to other code.

Every file of a checkpoint is authenticated. The files are pickles, and unpickling runs code: on a cluster
the folder is shared, and anyone who could write there could otherwise run code as the user who resumes.
So each file starts with an HMAC-SHA256 of the rest, under a key kept private in the user's cache folder
(`$KVSIM_CACHE_DIR`, else `~/.cache/kvsim`: `checkpoint.key`, 32 random bytes, made mode 0600 on first use;
workers on other machines are handed it with the files they write). A file that does not verify (changed,
or written with another key: someone else's) is refused with one line before anything of it is unpickled.
It is read through one open file, which must be the user's own and writable by no one else, so what was
verified is what is read.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import os
import pickle
import secrets
import shutil
import stat
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..errors import ConfigError, KvsimError
from ..interrupt import INTERRUPT
from ..memory import collection_paused
from ..shared import Probe

FORMAT = 4  # 2: every file authenticated (an HMAC before the pickles); 3: fingerprints of field codes, kept in the
# queue; 4: a partitioned search's workers route and keep states by those fingerprints, each with its frontier's
CURRENT = "CURRENT"
LOCK = "LOCK"  # held by the search using the folder (`CheckpointDir.held`); left in place when it ends
KEY_FILE = "checkpoint.key"
KEY_BYTES = 32
MAGIC = b"kvsim checkpoint hmac-sha256\n"  # then the tag, then the pickled objects it covers
SEARCH = "search.pkl"
RESUMABLE = ("states", "seconds", "memory", INTERRUPT)  # the bounds a search goes on from (not its depth bound)


def held_by(options: Any) -> Any:
    """What a search with these `ExploreOptions` holds while it runs: its checkpoint folder (`CheckpointDir.held`,
    named by the option the folder came with), or nothing where it has none."""
    if options.checkpoint is None:
        return nullcontext()
    return options.checkpoint.held("resume" if options.resume else "checkpoint")


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


def cache_root() -> str:
    """The user's kvsim cache folder: $KVSIM_CACHE_DIR, else ~/.cache/kvsim."""
    return os.environ.get("KVSIM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kvsim")


def private_key() -> bytes:
    """This user's checkpoint key (`KEY_FILE` in the cache folder), made on first use: 32 random bytes in a file
    of mode 0600, linked into place whole (two first uses at once agree on one key). A key file that is not the
    user's own, or that others may read or write, is refused: what it signs could be anyone's."""
    root = cache_root()
    path = os.path.join(root, KEY_FILE)
    expected = f"a key file only its owner can read and write (mode 0600, {KEY_BYTES} bytes)"
    try:
        if not os.path.lexists(path):
            os.makedirs(root, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=root, prefix=".checkpoint-key-")  # mode 0600
            try:
                os.write(fd, secrets.token_bytes(KEY_BYTES))
                os.fsync(fd)
                os.close(fd)
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process made it first: its key is the key
            finally:
                os.unlink(tmp)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            info = os.fstat(fd)
            key = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ConfigError("the checkpoint key", expected, path, exc.strerror or type(exc).__name__) from None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077 or len(key) != KEY_BYTES:
        raise ConfigError("the checkpoint key", expected, path, f"mode {stat.filemode(info.st_mode)}, owner uid "
                                                            f"{info.st_uid}, {len(key)} bytes")
    return key


class Unverified(ValueError):
    """A checkpoint file that does not verify under this user's key (or cannot be read as verified)."""


class _Signed:
    """A binary file that the pickles are written to, with an HMAC of what went through."""

    def __init__(self, f: Any, key: bytes) -> None:
        self.f, self.mac = f, hmac.new(key, digestmod=hashlib.sha256)

    def write(self, data: bytes) -> int:
        self.mac.update(data)
        return self.f.write(data)


def dump(path: str, key: bytes, *objects: Any) -> None:
    """Write `objects`, pickled, to the new file `path`, authenticated under `key` (`MAGIC`, the tag, the pickles)."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "wb") as f, collection_paused():
        f.write(MAGIC + bytes(hashlib.sha256().digest_size))
        signed = _Signed(f, key)
        for obj in objects:
            pickle.dump(obj, signed, protocol=pickle.HIGHEST_PROTOCOL)
        f.seek(len(MAGIC))
        f.write(signed.mac.digest())


def load(path: str, key: bytes, count: int) -> list[Any]:
    """The first `count` objects of a file `dump` wrote with `key`. The whole file is verified before anything of
    it is unpickled (`Unverified` otherwise), through the one open file, which must be the user's own and
    writable by no one else: nobody can change it between the check and the read."""
    with open(path, "rb") as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise Unverified(f"{os.path.basename(path)} is not this user's own file, writable by no one else "
                             f"(mode {stat.filemode(info.st_mode)}, owner uid {info.st_uid})")
        head = f.read(len(MAGIC) + hashlib.sha256().digest_size)
        mac = hmac.new(key, digestmod=hashlib.sha256)
        for chunk in iter(lambda: f.read(1 << 20), b""):
            mac.update(chunk)
        if not head.startswith(MAGIC) or not hmac.compare_digest(head[len(MAGIC):], mac.digest()):
            raise Unverified(f"{os.path.basename(path)} does not verify: changed since it was written, or written "
                             f"with another key than this user's ({os.path.join(cache_root(), KEY_FILE)})")
        f.seek(len(head))
        with collection_paused():
            return [pickle.load(f) for _ in range(count)]


@dataclass
class Snapshot:
    """What a stopped single-process search (`explore`) needs to go on: `search.pkl` after its header."""

    store: Any
    queue: list[tuple[int, Any, Any]]  # the states found and not yet expanded (id, state, key), breadth-first
    violations: dict[str, "Violation"]  # the invariant violations found so far (the hang search comes at the end)
    transitions: int
    depth: int
    checked: list[int]
    fired: dict[str, int]
    depth_cut: bool  # the depth bound left some state unexpanded
    seconds: float  # spent on this search so far, every run of it
    reached: dict[int, int] = field(default_factory=dict)  # a `Sometimes`'s index -> the state that first met it


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
    reached: dict[int, tuple[int, int]] = field(default_factory=dict)  # a `Sometimes`'s index -> (depth, gid)


class CheckpointDir:
    """The checkpoint folder of one search: `header` describes the search saving to it or resuming from it."""

    def __init__(self, path: str, header: Mapping[str, Any], every: float | None = 600.0,
                 on_stop: Callable[[], None] | None = None) -> None:
        self.path, self.header, self.every = str(path), dict(header, format=FORMAT), every
        self.root = os.path.abspath(self.path)  # a worker elsewhere (a Ray node) has a working folder of its own
        self.on_stop = on_stop  # called once a bound stopped the search, before its last save
        self.saves = 0
        self.next_save: float | None = None
        self._key: bytes | None = None

    @property
    def key(self) -> bytes:
        """The key every file of this checkpoint is authenticated with: this user's (`private_key`)."""
        if self._key is None:
            self._key = private_key()
        return self._key

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
            raise ConfigError("resume", "a readable checkpoint folder", self.path, exc.strerror or "") from None
        gen = os.path.join(self.root, name)
        if not name.startswith("gen-") or not os.path.isfile(os.path.join(gen, SEARCH)):
            raise ConfigError("resume", "a checkpoint folder written by kvsim explore --checkpoint", self.path,
                              f"{CURRENT} names {name!r}, which holds no {SEARCH}")
        return gen

    def fresh(self) -> None:
        """Refuse to start a new search over a checkpoint (its saves would replace it), in a folder that holds
        other files (the saves would mix with them), or under a folder that does not exist (a mistyped path)."""
        if os.path.exists(os.path.join(self.root, CURRENT)):
            raise ConfigError("checkpoint", "a new or empty folder", self.path,
                              "it holds a checkpoint: go on from it with --resume, or name another folder")
        entries = [name for name in os.listdir(self.root) if name != LOCK] if os.path.isdir(self.root) else []
        if entries:  # (a `LOCK` alone: left by a search that ended before its first save)
            raise ConfigError("checkpoint", "a new or empty folder", self.path,
                              f"it holds {len(entries)} entries and no checkpoint")
        if not os.path.isdir(os.path.dirname(self.root)):
            raise ConfigError("checkpoint", "a new or empty folder in a folder that exists", self.path,
                              f"{os.path.dirname(self.root)} does not exist")

    def check(self) -> str:
        """The current generation's folder, once its header matches this search's (the saved search unread)."""
        gen = self.current()
        if gen is None:
            raise ConfigError("resume", "a folder holding a checkpoint (kvsim explore --checkpoint DIR)",
                              self.path, f"no {CURRENT} file")
        saved = self._read(gen, 1)[0]
        if not isinstance(saved, dict):
            raise ConfigError("resume", "a checkpoint written by kvsim explore --checkpoint", self.path,
                              "no header")
        for field, value in self.header.items():
            if saved.get(field) != value:
                raise ConfigError("resume", f"the search the checkpoint was made by ({field} "
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
            raise ConfigError("resume", expected, self.path, f"it holds a {type(body).__name__}"
                              + (f" over {body.workers} workers" if isinstance(body, Level) else ""))
        return gen, body

    def _read(self, gen: str, count: int) -> list[Any]:
        try:
            return load(os.path.join(gen, SEARCH), self.key, count)
        except Unverified as exc:  # changed, or someone else's: refused before anything of it is unpickled
            raise ConfigError("resume", "a checkpoint written by this user's kvsim explore --checkpoint", self.path,
                              str(exc)) from None
        except Exception as exc:  # truncated or corrupt: one line, never a traceback
            raise ConfigError("resume", "a checkpoint written by kvsim explore --checkpoint", self.path,
                              f"{type(exc).__name__}: {exc}") from None

    # -- writing ---------------------------------------------------------------------------------------
    @contextmanager
    def held(self, option: str) -> Iterator[None]:
        """The folder for this search alone while it runs: an exclusive, non-blocking `flock` on its `LOCK` file
        (the folder made if need be), let go when the block ends or this process dies. Held by another search (in
        any process, or this one), it is refused with one line naming `option` and the process that holds it. On
        a file system that keeps no locks (some network mounts answer `flock` with ENOLCK), the search goes on
        unguarded, as before there was a lock."""
        try:
            os.makedirs(self.root, exist_ok=True)
            fd = os.open(os.path.join(self.root, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise ConfigError(option, "a folder the search can save to", self.path,
                              exc.strerror or type(exc).__name__) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
                raise ConfigError(option, "a folder no other search is saving to", self.path,
                                  f"the search of process {holder} holds it: name another folder, or wait for it "
                                  "to end") from None
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    raise ConfigError(option, "a folder the search can save to", self.path,
                                      f"locking it failed: {exc.strerror or type(exc).__name__}") from None
            else:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            os.close(fd)  # the lock goes with the last descriptor (a forked worker's copy: when it ends)

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
        dump(os.path.join(gen, SEARCH), self.key, self.header, body)
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
