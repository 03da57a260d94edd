"""Where the upstream engine code under test comes from.

An `EngineSource` is a directory that contains the engine's top-level package
folder (`root/"vllm"`, `root/"sglang"`). It is made from a release on the
package index (`pip download --no-deps` into the user cache, then only the
package's Python files are unpacked next to it), from a wheel file, or from a
directory the user points at (an installed package, an unpacked tree, or
SGLang's repository layout `python/sglang`). Nothing is ever written into the
repository: upstream code lives in the user's cache, like any library under test.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from kvsim.engine.errors import ConfigError, KvsimError

ENGINES = ("vllm", "sglang", "flashinfer")
DEFAULT_VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23", "flashinfer": "0.7.4"}
# the name pip knows an engine by, where it differs from the package folder (`flashinfer/`)
DISTRIBUTIONS = {"flashinfer": "flashinfer-python"}
DOWNLOAD_TIMEOUT_S = 900
T = TypeVar("T")


@dataclass(frozen=True)
class EngineSource:
    """The engine's Python source: `root/<engine>/...`, and where it came from."""

    engine: str
    version: str | None
    root: Path
    origin: str

    def file(self, relpath: str) -> Path:
        """`relpath` ("vllm/v1/worker/utils.py") under the root; ConfigError naming it if absent."""
        path = self.root / relpath
        if not path.is_file():
            raise ConfigError(relpath, "a file of the engine's package",
                              f"absent in {self.label}", hint=self.origin)
        return path

    def has(self, relpath: str) -> bool:
        return (self.root / relpath).is_file()

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version}" if self.version else f"{self.engine} ({self.origin})"


def cache_root() -> Path:
    """$KVSIM_CACHE_DIR, $XDG_CACHE_HOME/kvsim, or ~/.cache/kvsim (the gpu_oracle build cache's rule)."""
    root = os.environ.get("KVSIM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kvsim")
    return Path(root)


def _check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ConfigError("engine", f"one of {', '.join(ENGINES)}", engine)
    return engine


def check_version(version: str, field: str = "--version") -> str:
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+!_-]{0,39}", version or ""):
        raise ConfigError(field, "a release number such as 0.33.0", version)
    return version


def distribution(engine: str) -> str:
    """The engine's name on the package index (`flashinfer-python` for the `flashinfer` package)."""
    return DISTRIBUTIONS.get(engine, engine)


def download_wheel(engine: str, version: str) -> Path:
    """The release's wheel, fetched once with `pip download --no-deps` into the cache.

    Processes that ask for the same release at once (test workers on an empty cache) take turns on a lock
    file; pip downloads into a private folder and the finished wheel is renamed into place, so no process
    ever sees half a wheel.
    """
    dist = distribution(engine)
    stem = dist.replace("-", "_")  # a wheel's file name spells the distribution with underscores
    wheel_dir = cache_root() / "wheels" / f"{engine}-{version}"

    def found() -> Path | None:
        wheels = sorted(wheel_dir.glob(f"{stem}-{version}-*.whl"))
        return wheels[0] if wheels else None

    def fetch(scratch: Path) -> Path:
        wheel = _pip_download(dist, version, scratch, stem)
        target = wheel_dir / wheel.name
        os.replace(wheel, target)
        return target

    return made_once(wheel_dir, ".lock", found, fetch, prefix=".download.")


def made_once(folder: Path, lock_name: str, found: Callable[[], T | None], make: Callable[[Path], T], *,
              prefix: str) -> T:
    """What `found()` finds in the cache, else what `make(scratch)` makes there, once: processes that ask at once
    (test workers on an empty cache) take turns on the lock file `folder/lock_name` and look again once they
    hold it; `make` works in a private scratch folder under `folder` (removed afterwards) and renames what it
    made into place itself, so no process ever sees half of it."""
    done = found()
    if done is not None:
        return done
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / lock_name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = found()
        if done is not None:  # another process made it while this one waited
            return done
        scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=folder))
        try:
            return make(scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _pip_download(dist: str, version: str, into: Path, stem: str) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "-q", "-d", str(into), f"{dist}=={version}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KvsimError(f"downloading {dist}=={version} failed: {exc}") from exc
    found = sorted(into.glob(f"{stem}-{version}-*.whl"))
    if done.returncode != 0 or not found:
        reason = " ".join((done.stderr or done.stdout).split()[-60:])
        raise KvsimError(f"downloading {dist}=={version} with pip failed "
                         f"(exit {done.returncode}): {reason or 'no wheel was produced'}")
    return found[0]


def unpack_wheel(engine: str, wheel: Path, dest: Path) -> Path:
    """Unpack only `<engine>/**.py` of `wheel` into `dest` (atomically); return dest."""
    if (dest / engine / "__init__.py").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist()
                       if m.startswith(engine + "/") and m.endswith(".py")]
            if not members:
                raise ConfigError(str(wheel), f"a wheel containing the {engine}/ package", "no such folder")
            archive.extractall(tmp, members)
        try:
            tmp.rename(dest)
        except OSError:  # another process unpacked it first
            shutil.rmtree(tmp, ignore_errors=True)
    except zipfile.BadZipFile as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(str(wheel), "a wheel (zip) file", f"unreadable: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def read_version(engine: str, root: Path) -> str | None:
    """`__version__` from `<engine>/_version.py` or `<engine>/version.py`, if the tree has one."""
    for name in ("_version.py", "version.py"):
        path = root / engine / name
        if path.is_file():
            match = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
                              path.read_text(errors="replace"))
            if match:
                return match.group(1)
    return None


def _from_path(engine: str, from_path: str) -> EngineSource:
    path = Path(from_path).expanduser().resolve()
    if path.is_file() and path.suffix == ".whl":
        digest = hashlib.sha256(f"{path}:{path.stat().st_size}:{path.stat().st_mtime_ns}".encode()).hexdigest()[:16]
        root = unpack_wheel(engine, path, cache_root() / "src" / f"{engine}-wheel-{digest}")
        return EngineSource(engine, read_version(engine, root), root, f"wheel {path}")
    if not path.is_dir():
        raise ConfigError("--from", f"a {engine} wheel, an unpacked tree or the {engine} package directory",
                          from_path, hint="no such file or directory" if not path.exists() else "not a wheel")
    for root in (path.parent if path.name == engine else None, path, path / "python"):
        if root is not None and (root / engine / "__init__.py").is_file():
            kind = "installed" if "site-packages" in root.parts else "directory"
            return EngineSource(engine, read_version(engine, root), root, f"{kind} {path}")
    raise ConfigError("--from", f"a directory with {engine}/__init__.py (or python/{engine}/)", from_path)


def resolve_source(engine: str, *, version: str | None = None, from_path: str | None = None) -> EngineSource:
    """The engine's source: a release (downloaded and unpacked once, cached) or a path the user gave."""
    _check_engine(engine)
    if from_path is not None and version is not None:
        raise ConfigError("--from", "either --from or --version, not both", f"{from_path} and {version}")
    if from_path is not None:
        return _from_path(engine, from_path)
    version = check_version(DEFAULT_VERSIONS[engine] if version is None else version)
    src = cache_root() / "src" / f"{engine}-{version}"
    if not (src / engine / "__init__.py").is_file():
        unpack_wheel(engine, download_wheel(engine, version), src)
    return EngineSource(engine, version, src, f"wheel {distribution(engine)}=={version} (cache {src})")
