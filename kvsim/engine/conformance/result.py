"""The result of one conform target on one release or tree, as `kvsim conform` prints and writes it.

`status`: conforms / diverges (a divergence, or a model property failing on the code under test) / not present
(the release has no such code) / skipped (it cannot run here: no CUDA, another shape of the code, said in the
note) / error (the code cannot be used: a file or definition missing, a signature changed) / incomplete
(`--max-seconds` stopped it) / not run (the run's budget was spent before it started).
A divergence is one record: the (shrunk) input or call program, both answers, the first field where they
differ and the adapter's note. `properties`: the model's properties run on the code under test's answers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..canon import to_jsonable

STATUSES = ("conforms", "diverges", "not present", "skipped", "error", "incomplete", "not run")
FINDING = "finding confirmed"  # a property that fails where the catalog holds an open-upstream finding
MAX_REPORTED = 5


@dataclass
class TargetResult:
    target: str
    version: str | None
    status: str = "conforms"
    compared: int = 0
    seconds: float = 0.0
    divergences: list[dict[str, Any]] = field(default_factory=list)
    divergent: int = 0  # inputs that diverged (divergences keeps the first MAX_REPORTED)
    properties: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    engine: str = ""
    files: list[str] = field(default_factory=list)
    coverage: dict[str, Any] | None = None
    subject: str = "upstream"  # how reports name the code checked: "upstream", or "code under test" (--from)
    logged: list[str] = field(default_factory=list)  # what the code under test logged or warned (shown on a failure)
    slowest_call: float = 0.0  # seconds, the slowest call of the code under test that returned

    def diverge(self, input: Any, model: Any, upstream: Any, note: str = "", **more: Any) -> None:
        self.divergent += 1
        if len(self.divergences) < MAX_REPORTED:
            self.divergences.append({"input": to_jsonable(input), "model": to_jsonable(model),
                                     "upstream": to_jsonable(upstream), "note": note,
                                     **{k: to_jsonable(v) for k, v in more.items()}})

    def prop(self, name: str, status: str, message: str = "", **more: Any) -> None:
        self.properties.append({"property": name, "status": status, "message": message,
                                **{k: to_jsonable(v) for k, v in more.items()}})

    def add_note(self, text: str) -> None:
        self.note = f"{self.note}; {text}" if self.note and text else self.note or text

    def finish(self, started: float) -> "TargetResult":
        self.seconds = round(time.perf_counter() - started, 3)
        if self.status == "conforms" and (self.divergent or any(p["status"] == "fails" for p in self.properties)):
            self.status = "diverges"
        return self

    def to_json(self) -> dict[str, Any]:
        return to_jsonable(dict(self.__dict__))
