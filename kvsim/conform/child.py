"""The parent's side of a child process that answers line-delimited JSON (the kernel child, the real-import child).

`LineChild` holds the process plumbing both share: start `python -m MODULE` in its own session (so ending it
ends everything it started), send one JSON document a line, read the next line within a timeout, keep its
stderr in a temporary file for the tail an error quotes, and close it (stdin closed, then waited for; killed
when it does not end). What a request and an answer mean is the subclass's.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from typing import Any, Mapping, Sequence


class LineChild:
    """A child process spoken to in JSON lines; `process` is None until `spawn` and after `close`."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None
        self._stderr: Any = None

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        """Start `python argv...` with `env`, its stdin and stdout pipes, its stderr kept."""
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._stderr, text=True, env=dict(env), start_new_session=True)

    def close(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            if process.stdin:
                try:
                    process.stdin.close()
                except OSError:
                    pass
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill(process)
            except BaseException:
                kill(process)
                raise
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def send(self, document: Mapping[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(json.dumps(document) + "\n")
        self.process.stdin.flush()

    def stderr_tail(self, limit: int = 2000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read()[-limit:]

    def readline(self, timeout: float | None) -> str | None:
        """The child's next line ("" when its output ended), or None when it did not answer within `timeout`."""
        assert self.process is not None and self.process.stdout is not None
        if timeout:
            ready, _, _ = select.select([self.process.stdout], [], [], timeout)
            if not ready:
                return None
        return self.process.stdout.readline()


def kill(process: subprocess.Popen[str]) -> None:
    """End the child and everything it started (its own process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
