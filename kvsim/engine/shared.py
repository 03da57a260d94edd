"""Whether a folder is one that processes elsewhere (Ray workers on other nodes) share with this one.

A checkpoint folder (`kvsim explore --checkpoint`) and a fuzz example database (`kvsim fuzz
--database DIR`) are written by every worker, wherever it runs. A worker on a machine that does not
share the folder would write to its own disk: its checkpoint part or its counterexamples lost to
the others. So this process writes a token in the folder (`Probe`), each worker must read it there
and write it back beside it (`sees`), and this process reads back what each wrote (`Probe.seen`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Sequence


class Probe:
    """A token written in `folder` for the workers to find (`sees`); `close` removes it and their replies."""

    def __init__(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self.token = secrets.token_hex(8)
        self.path = os.path.join(folder, f".kvsim-probe-{self.token}")
        self.asked: list[int] = []
        Path(self.path).write_text(self.token)

    def reply(self, worker: int) -> str:
        """Where worker `worker` writes the token back."""
        return f"{self.path}-{worker}"

    def ask(self, worker: int) -> tuple[str, str, str]:
        """What worker `worker` is given to check: (the probe's path, its token, where to write it back)."""
        self.asked.append(worker)
        return self.path, self.token, self.reply(worker)

    def seen(self, worker: int) -> bool:
        """Whether worker `worker` wrote the token back where this process reads it."""
        return holds(self.reply(worker), self.token)

    def close(self) -> None:
        for path in (self.path, *map(self.reply, self.asked)):
            try:
                os.remove(path)
            except OSError:
                pass


def sees(probe: str, token: str, reply: str) -> bool:
    """Worker side: whether this process reads `token` in `probe` and can write it to `reply`."""
    if not holds(probe, token):
        return False
    try:
        Path(reply).write_text(token)
    except OSError:
        return False
    return True


def named(workers: Sequence[int]) -> str:
    """`worker 1` or `workers 0, 2`: the workers an error names."""
    return f"{'workers' if len(workers) > 1 else 'worker'} {', '.join(map(str, workers))}"


def holds(path: str, token: str) -> bool:
    try:
        return Path(path).read_text() == token
    except OSError:
        return False
