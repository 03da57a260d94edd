"""Where a command will write, checked before its work: a search of ten minutes is not lost to a path it
cannot write at the end (`--save`, `--graph`, `--junit`, `--trace`, `--out`, `--checkpoint`).

A permission check (`os.access`) is not enough: as root it says yes for `/proc/x`, which no one can create.
So each check tries what the command will do, and leaves nothing behind: a new file is created and removed,
an existing one is opened for appending and left as it was, and a folder is written in (a probe file,
removed) or, where it does not exist yet, its nearest existing parent is.
"""

from __future__ import annotations

import os
import stat
import tempfile

from ..engine.errors import ConfigError

FILE = "a writable file path"
FOLDER = "a folder that can be created or written in"


def _named(option: str, path: str, expected: str) -> None:
    if not path.strip() or "\0" in path:
        raise ConfigError(option, expected, path)


def writable_file(option: str, path: str) -> None:
    """`path` can be written as a new file or replace the file there (a ConfigError on `option` otherwise)."""
    _named(option, path, FILE)
    if os.path.isdir(path):
        raise ConfigError(option, FILE, path, "a folder")
    try:
        if os.path.exists(path):
            with open(path, "ab") as fh:  # writable; nothing written to a file, the file as it was
                mode = os.fstat(fh.fileno()).st_mode
                if stat.S_ISCHR(mode) and not os.isatty(fh.fileno()):
                    os.write(fh.fileno(), b"\n")  # a device: /dev/null takes it, /dev/full refuses it
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(path)
    except OSError as exc:
        raise ConfigError(option, FILE, path, exc.strerror or type(exc).__name__) from None


def writable_folder(option: str, path: str) -> None:
    """`path` is a folder this process can write in, or one it can create (a ConfigError on `option`)."""
    _named(option, path, FOLDER)
    at = os.path.abspath(path)
    while not os.path.lexists(at):
        at = os.path.dirname(at)
    if not os.path.isdir(at):
        raise ConfigError(option, FOLDER, path, f"{at} is a file")
    try:
        fd, probe = tempfile.mkstemp(dir=at, prefix=".kvsim-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(option, FOLDER, path, f"{at}: {exc.strerror or type(exc).__name__}") from None
