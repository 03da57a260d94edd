"""A released engine imported for real in a child process, driven over line-delimited JSON.

    python -m kvsim.conform.installed_child

The child's environment is the engine's, not kvsim's: the release tree goes first on `sys.path` and its
dependency folder (`installed.prepare`) last, so the parent never imports the engine and two releases never
share a process. As `triton_child`, the first line names what to load (`ImportEnvironment` fields and the
driver, "module:Class" under `kvsim.conform`); the child imports the checked module and answers one line
`{"ok": true, "result": {"import_s": ..., "version": ...}}` or `{"ok": false, "error": ..., "config": true}`
(the import failed: the last line of its traceback). Each later line is one request `{"op": NAME, "args":
{...}}`, answered `{"ok": true, "result": ...}` or, when the engine raised, `{"ok": false, "error": ...,
"raised": {"type", "message", "where"}}`. `PYTHONHASHSEED` is fixed in the child, so vLLM's `NONE_HASH` and
every block hash are the same in every run.

`InstalledChild` is the parent's handle: `with InstalledChild(prepare("vllm", "0.33.0"), DRIVER) as child:
child.call("build", num_blocks=10, block_size=4)`.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from typing import Any, Sequence

from kvsim.engine.errors import ConfigError

from .child import LineChild, kill
from .installed import ImportEnvironment

START_TIMEOUT_S = 900.0  # the first import of a release compiles its files (about 30 s on a busy 2-core machine)
HASH_SEED = "0"


# --- child side ----------------------------------------------------------------------------------------

def _where(tb: Any) -> str:
    """The innermost frame of the traceback, as "path:line" (the engine's line when it raised there)."""
    frames = traceback.extract_tb(tb)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


class SelfTest:
    """A driver for checking the child itself (`kvsim.conform.installed_child:SelfTest`): op `echo` answers its
    `value`, `raise` raises ValueError(`message`), `exit` ends the process with `code`, `hang` never answers."""

    def handle(self, op: str, args: dict[str, Any]) -> Any:
        if op == "raise":
            raise ValueError(args.get("message", "asked to raise"))
        if op == "exit":
            os._exit(int(args.get("code", 3)))
        while op == "hang":
            time.sleep(3600)
        if op != "echo":
            raise ConfigError("op", "one of echo, raise, exit, hang", op)
        return args.get("value")


def _driver(name: str) -> Any:
    module, _, attribute = name.partition(":")
    if not (attribute and module.startswith("kvsim.conform.")):
        raise ConfigError("driver", "a 'kvsim.conform.<module>:<Class>' name", name)
    return getattr(importlib.import_module(module), attribute)


def serve(lines: Any, out: Any) -> int:
    """Import the engine the header names, then answer requests until stdin closes (the child's main loop)."""
    header = json.loads(next(lines))
    sys.path.insert(0, header["root"])
    sys.path.append(header["deps"])
    started = time.perf_counter()
    try:
        importlib.import_module(header["module"])
        driver = _driver(header["driver"])()
    except Exception as exc:  # the release does not import here: one line, the traceback's last
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        out.write(json.dumps({"ok": False, "config": True, "error": f"{last} (at {_where(exc.__traceback__)})"}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"ok": True, "result": {"import_s": time.perf_counter() - started,
                                                 "version": header["version"]}}) + "\n")
    out.flush()
    for line in lines:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            answer = {"ok": True, "result": driver.handle(request["op"], request.get("args") or {})}
        except ConfigError as exc:
            answer = {"ok": False, "error": str(exc), "config": True}
        except Exception as exc:  # the engine raised: an answer, with where
            message = " ".join(str(exc).split())[:300]
            answer = {"ok": False, "error": f"{type(exc).__name__}: {message}", "config": False,
                      "raised": {"type": type(exc).__name__, "message": message,
                                 "where": _where(exc.__traceback__)}}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Answers go to a private copy of stdout; file descriptor 1 itself becomes stderr, so whatever the engine
    prints or logs there (vLLM 0.26.0 logs to stdout) never reaches the protocol."""
    del argv
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return serve(iter(sys.stdin.readline, ""), answers)


# --- parent side ---------------------------------------------------------------------------------------

class InstalledChild(LineChild):
    """A running child with one engine release imported; `call(op, **args)` sends one request, returns its result.

    `start_timeout`: seconds the import may take; `timeout`: seconds one call may take. A child that does not
    start is a ConfigError with the import's last line; a request the driver refuses is a ConfigError; the
    engine raising is `Answered(Raised(...))` with the engine's line, as a kernel's raise in `triton_child`,
    and a child that dies or hangs is `Answered(Raised("ChildDied", ...))`: the child is ended and the next
    call starts a new one (its manager gone: a caller rebuilds it).
    """

    def __init__(self, env: ImportEnvironment, driver: str, *, timeout: float | None = 600.0,
                 start_timeout: float = START_TIMEOUT_S) -> None:
        super().__init__()
        self.env, self.driver, self.timeout, self.start_timeout = env, driver, timeout, start_timeout
        self.import_s: float | None = None

    def __enter__(self) -> "InstalledChild":
        self.start()
        return self

    def start(self) -> None:
        env = dict(os.environ, PYTHONHASHSEED=HASH_SEED)
        env.setdefault("PYTHONWARNINGS", "ignore")
        self.spawn(["-m", "kvsim.conform.installed_child"], env)
        s = self.env.source
        self.send({"engine": s.engine, "version": s.version, "root": str(s.root), "origin": s.origin,
                   "deps": str(self.env.deps), "module": self.env.module, "driver": self.driver})
        answer = self._answer(self.start_timeout)
        if answer is None or not answer.get("ok"):
            why = answer["error"] if answer else f"no answer ({' '.join(self.stderr_tail(400).split())})"
            self.close()
            raise ConfigError(f"{s.label} (real import)", f"{self.env.module} importable", why,
                              hint=f"dependencies in {self.env.deps}")
        self.import_s = answer["result"]["import_s"]

    def _answer(self, timeout: float | None) -> dict[str, Any] | None:
        """The child's next answer; None when it ended or did not answer within `timeout` (then it is ended)."""
        assert self.process is not None
        line = self.readline(timeout)
        if line is None:
            kill(self.process)
        return json.loads(line) if line else None

    def call(self, op: str, **args: Any) -> Any:
        """The driver's answer to `op`; see the class for what a refusal, a raise, a death or a hang become."""
        from kvsim.engine.conformance.answers import Answered, Raised

        if self.process is None:
            self.start()
        try:
            self.send({"op": op, "args": args})
            answer = self._answer(self.timeout)
        except OSError as exc:
            answer, tail = None, str(exc)
        else:
            tail = ""
        if answer is None:
            tail = " ".join((tail or self.stderr_tail(600)).split())
            self.close()
            raise Answered(Raised("ChildDied", f"the {self.env.source.label} child ended or did not answer "
                                  f"within {self.timeout} s: {tail}", op))
        if answer["ok"]:
            return answer["result"]
        if answer.get("config"):
            raise ConfigError(op, "a request the driver knows", answer["error"])
        raised = answer["raised"]
        raise Answered(Raised(raised["type"], raised["message"], raised["where"]))


if __name__ == "__main__":
    sys.exit(main())
