"""Progress lines on stderr, only when stderr is a terminal (CI logs stay clean)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int | None, label: str, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.total, self.label, self.done = total, label, 0
        self.start = time.perf_counter()
        self._last = 0.0

    def step(self, what: str) -> None:
        self.done += 1
        if self.enabled:
            of = f"/{self.total}" if self.total else ""
            self._write(f"{self.label} [{self.done}{of}] {what}")

    def note(self, what: str) -> None:
        now = time.perf_counter()
        if self.enabled and now - self._last >= 0.2:
            self._last = now
            self._write(f"{self.label}: {what}")

    def _write(self, text: str) -> None:
        elapsed = time.perf_counter() - self.start
        self.stream.write(f"\r\033[K{text} ({elapsed:.1f} s)")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()
