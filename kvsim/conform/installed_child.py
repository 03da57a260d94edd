"""A released engine imported for real in a child process, driven over line-delimited JSON.

    python -m kvsim.conform.installed_child

The child's environment is the engine's, not kvsim's: the release tree goes first on `sys.path` and its
dependency folder (`installed.prepare`) last, so the parent never imports the engine and two releases never
share a process. As `triton_child`, the first line names what to load (`ImportEnvironment` fields and the
driver, "module:Class" under `kvsim.conform`); the child imports the checked module and answers one line
`{"ok": true, "result": {"import_s": ..., "version": ...}}` or `{"ok": false, "error": ..., "config": true}`
(the import failed: the last line of its traceback). Each later line is one request `{"op": NAME, "args":
{...}}` (with `"driver"`: to another driver than the first, made in the same child on its first request),
answered `{"ok": true, "result": ...}` or, when the engine raised, `{"ok": false, "error": ..., "raised":
{"type", "message", "where"}}`. `{"op": "__calls__", "args": {"calls": [[op, args], ...]}}` asks several in one
line (`InstalledChild.calls`): its result is their answers in turn, up to the first that is not ok, each what
the request alone answers. `PYTHONHASHSEED` is fixed in the child, so vLLM's `NONE_HASH` and
every block hash are the same in every run.

`InstalledChild` is the parent's handle: `with InstalledChild(prepare("vllm", "0.33.0"), DRIVER) as child:
child.call("build", num_blocks=10, block_size=4)`.

A changed module (a planted regression, a `--mutants` mutant) is loaded into the running child, not into a new
one: the request `{"op": "__configure__", "args": {"mutant": Mutant JSON or null, "trace": [files] or null}}`
(`InstalledChild.configure`) executes the release's file with the mutant applied into its module, every line
where it was, and points each name the release's other modules imported from it at the new definition
(`Swap`); `"mutant": null` puts the released module back the same way. The driver's next `build` makes its
objects from what is loaded then. `trace` names release files (relative to the tree) whose executed lines each
later answer carries under `"lines"` (`--coverage`, and which lines a mutant run reached). A child is kept per
release for the parent's life (`shared`), since an import costs about 20 s; every driver of the release runs in it
(`Driven`: the real scheduler's and the real coordinator's in one vLLM child, the radix cache's and the SWA
cache's in one SGLang child), each in its own process forked from the one that imported the release (`serve`,
`Worker`), so that no driver sees what another did to the release's globals.
"""

from __future__ import annotations

import atexit
import importlib
import inspect
import json
import os
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any, Sequence

from kvsim.engine.errors import ConfigError

from . import interpreter
from .child import LineChild, kill
from .installed import CHILD_ENVIRONMENT, ImportEnvironment, Stub, stubs
from .source import cache_root

CONFIGURE = "__configure__"  # the child's own request (a mutant, a line trace), never the driver's
CALLS = "__calls__"  # several of the driver's requests in one line, answered in one (`InstalledChild.calls`)
START_TIMEOUT_S = 900.0  # the first import of a release compiles its files (about 30 s on a busy 2-core machine)
CONFIGURE_TIMEOUT_S = 120.0  # loading a mutant re-executes a release module: never under a mutant run's short deadline
HASH_SEED = "0"


# --- child side ----------------------------------------------------------------------------------------

def _where(tb: Any) -> str:
    """The innermost frame of the traceback, as "path:line" (the engine's line when it raised there)."""
    frames = traceback.extract_tb(tb)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


class SelfTest:
    """A driver for checking the child itself (`kvsim.conform.installed_child:SelfTest`): op `echo` answers its
    `value`, `raise` raises ValueError(`message`), `exit` ends the process with `code`, `hang` never answers, `pid`
    answers the process the driver runs in, `import` imports `module` (as a driver's op imports on first use)."""

    def handle(self, op: str, args: dict[str, Any]) -> Any:
        if op == "pid":
            return os.getpid()
        if op == "import":
            return importlib.import_module(args["module"]).__name__
        if op == "raise":
            raise ValueError(args.get("message", "asked to raise"))
        if op == "exit":
            os._exit(int(args.get("code", 3)))
        while op == "hang":
            time.sleep(3600)
        if op != "echo":
            raise ConfigError("op", "one of echo, raise, exit, hang, pid, import", op)
        return args.get("value")


class SelfTestPeer(SelfTest):
    """A second driver for checking the child itself: one release's child serves several drivers."""


class Swap:
    """One module of the release re-executed from a changed text, and undone.

    `apply(module, text, path)` runs `text` (compiled as `path`, so tracebacks and traced lines name the release's
    file) in a fresh namespace that becomes the module's, then replaces, in every loaded module of the engine's
    package, each global that was one of the module's own definitions by the new one of that name; `undo()`
    restores the namespace as it was and the references the same way."""

    def __init__(self) -> None:
        self.module: Any = None
        self.saved: dict[str, Any] = {}

    def apply(self, module: Any, text: str, path: str) -> None:
        self.module, self.saved = module, dict(vars(module))
        fresh: dict[str, Any] = {k: v for k, v in self.saved.items() if k.startswith("__")}
        exec(compile(text, path, "exec", dont_inherit=True), fresh)  # noqa: S102 - the release's own text, mutated
        self._rebind(fresh)

    def undo(self) -> None:
        if self.module is not None:
            self._rebind(self.saved)
            self.module, self.saved = None, {}

    def _rebind(self, namespace: dict[str, Any]) -> None:
        module = self.module
        name = module.__name__
        old = vars(module)
        moved = {id(v): namespace[k] for k, v in old.items() if k in namespace and v is not namespace[k]
                 and getattr(v, "__module__", None) == name}
        old.clear()
        old.update(namespace)
        package = name.partition(".")[0]
        for other in list(sys.modules.values()):
            if other is None or other is module or not getattr(other, "__name__", "").startswith(package):
                continue
            space = getattr(other, "__dict__", None)
            if isinstance(space, dict):
                _rebind_in(space, moved, package)


def _rebind_in(space: dict[str, Any], moved: dict[int, Any], package: str) -> None:
    """A module's globals: each moved definition replaced, and one level inside: in a dict or list it holds (a
    registry: vLLM 0.33.0's `KVCacheSpecRegistry` keeps the manager classes that way, in frozen records), on the
    records such a container holds, and among the class attributes of the package's own classes."""
    def attributes(obj: Any) -> None:
        fields = getattr(obj, "__dict__", None)
        if isinstance(fields, dict) and not isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            for k, v in list(fields.items()):
                if id(v) in moved:
                    object.__setattr__(obj, k, moved[id(v)])  # a frozen dataclass's field too

    for key, value in list(space.items()):
        if id(value) in moved:
            space[key] = moved[id(value)]
        elif isinstance(value, dict):
            for k, v in list(value.items()):
                if id(v) in moved:
                    value[k] = moved[id(v)]
                else:
                    attributes(v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if id(v) in moved:
                    value[i] = moved[id(v)]
                else:
                    attributes(v)
        elif isinstance(value, type) and str(getattr(value, "__module__", "")).startswith(package):
            for k, v in list(vars(value).items()):
                if id(v) in moved:
                    setattr(value, k, moved[id(v)])
            if any(id(b) in moved for b in value.__bases__):  # a subclass in another module (vLLM's
                # AsyncScheduler of Scheduler, NIXL's scheduler of its base): it inherits the new definitions
                value.__bases__ = tuple(moved.get(id(b), b) for b in value.__bases__)


def module_name(relpath: str) -> str:
    """"vllm/v1/core/block_pool.py" -> "vllm.v1.core.block_pool"."""
    return relpath[: -len(".py")].replace("/", ".").removesuffix(".__init__")


class Configured:
    """The child's loaded mutant and line trace (`__configure__`)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.swap = Swap()
        self.mutant: Any = None
        self.trace: Any = None
        self.sent: set[tuple[str, int]] = set()

    def configure(self, mutant: Any = None, trace: Any = None) -> dict[str, Any]:
        from kvsim.engine.conformance.answers import register_lines
        from kvsim.engine.conformance.linetrace import LineTrace
        from kvsim.engine.conformance.mutants import Mutant
        from kvsim.engine.conformance.probes import loaded

        self.swap.undo()
        self.mutant = None
        changed: tuple[str, str] | None = None  # the mutant's file and its text, what that module now runs
        if mutant is not None:
            m = Mutant.from_json(mutant)
            path = os.path.join(self.root, m.file)
            try:
                with open(path, encoding="utf-8") as f:
                    text = m.apply(f.read())
                self.swap.apply(importlib.import_module(module_name(m.file)), text, path)
                changed = (m.file, text)
            except Exception as exc:  # a mutant that does not load: not counted, as the loader's
                self.swap.undo()
                last = traceback.format_exception_only(type(exc), exc)[-1].strip()
                raise ConfigError("mutant", "a mutant that loads", m.label, hint=last) from None
            self.mutant = m
        self.trace, self.sent = None, set()
        if trace:
            unimported = []
            for relpath in trace:
                path = os.path.join(self.root, relpath)
                register_lines(path, relpath)
                try:  # the driver imports it sooner or later; imported now, its functions take probes
                    module = importlib.import_module(module_name(relpath))
                except Exception:  # noqa: BLE001 - one that does not import here is traced by the hook
                    unimported.append(path)
                    continue
                if changed is not None and changed[0] == relpath:
                    text = changed[1]
                else:
                    with open(path, encoding="utf-8") as f:
                        text = f.read()
                loaded(path, module, text)
            self.trace = LineTrace(hooked=unimported, files=trace)
        return {"mutant": None if self.mutant is None else self.mutant.label, "trace": bool(self.trace)}

    def new_lines(self) -> list[tuple[str, int]]:
        assert self.trace is not None
        new = sorted(self.trace.executed - self.sent)
        self.sent |= self.trace.executed
        return new


class _Empty(type):
    """An empty class whose every public attribute is another (`InterpolationMode.NEAREST_EXACT`)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Empty(name, (), {})


class _Placeholder(types.ModuleType):
    """A stubbed-out module: each public attribute an `_Empty` class (a base, a decorator target, an enum)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Empty(name, (), {})


class _Absent:
    """A meta path finder answering every import of `package` (and below) with a `_Placeholder`."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        import importlib.machinery

        if name == self.package or name.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        return _Placeholder(spec.name)

    def exec_module(self, module: Any) -> None:
        module.__path__ = []
        module.__version__ = "0.0"  # a version a check can parse (transformers 5.12 reads it), that no release has


def install_stubs(engine: str, version: str, root: str) -> list[str]:
    """The release's `installed.stubs`, in place before its import; answers their module names."""
    for stub in stubs(engine, version):
        _install_stub(stub, root)
    return [stub.module for stub in stubs(engine, version)]


def _install_stub(stub: Stub, root: str) -> None:
    from pathlib import Path

    if stub.kind == "jit-paths":
        module = types.ModuleType(stub.module)
        module.KERNEL_PATH = Path(root, *stub.module.split(".")[:-3])  # type: ignore[attr-defined]
        module.DEFAULT_INCLUDE = [str(module.KERNEL_PATH / "include")]  # type: ignore[attr-defined]
        module.DEFAULT_CFLAGS, module.DEFAULT_LDFLAGS = [], []  # type: ignore[attr-defined]
        sys.modules[stub.module] = module
    elif stub.kind == "jit-dirs":
        for name in ("include", "csrc"):
            Path(root, *stub.module.split("."), name).mkdir(exist_ok=True)
    elif stub.kind in ("absent", "placeholder"):
        if stub.kind == "absent":  # transformers caches whether it is installed: asked first, it answers no
            from transformers.utils import import_utils

            for check in (f"is_{stub.module}_available", f"is_{stub.module}_v2_available"):
                getattr(import_utils, check, lambda: None)()
        sys.meta_path.insert(0, _Absent(stub.module))
    else:
        raise ConfigError("stub", "jit-paths, jit-dirs, absent or placeholder", stub.kind)


_SIGNATURES: dict[Any, inspect.Signature] = {}  # an op's method (its function) -> its signature as bound


def _signature(method: Any) -> inspect.Signature:
    """`inspect.signature(method)` of a driver's bound op, worked out once a function (about 45 us a call, and a
    lockstep makes thousands of calls)."""
    function = getattr(method, "__func__", method)
    signature = _SIGNATURES.get(function)
    if signature is None:
        signature = _SIGNATURES[function] = inspect.signature(method)
    return signature


def dispatch(driver: Any, op: str, args: Any, ops: Sequence[str], built: bool, what: str, state: str) -> Any:
    """A driver's request: `driver.op_<op>(**args)`, refused (a ConfigError) when unknown (naming `ops`), before
    `build` made `what` or with arguments the op does not take. `observe=True` among the args answers `{"answer": ...,
    "state": driver.op_<state>()}` (the op answering the driver's whole state) in the same round trip."""
    method = getattr(driver, "op_" + op, None)
    if method is None:
        raise ConfigError("op", "one of " + ", ".join(ops), op)
    args = dict(args)
    observe = bool(args.pop("observe", False))
    if op != "build" and not built:
        raise ConfigError(op, f"a {what} built first (op build)", "none")
    try:
        _signature(method).bind(**args)
    except TypeError as exc:
        raise ConfigError(op, "the arguments the op takes", sorted(args), hint=str(exc)) from None
    answer = method(**args)
    return {"answer": answer, "state": getattr(driver, "op_" + state)()} if observe and op != state else answer


def cache_roots(header: dict[str, Any]) -> tuple[str, ...]:
    """The header's release tree and dependency folder, where they are kvsim's cache (never a user's tree)."""
    return tuple(r for r in (header["root"], header["deps"]) if Path(r).is_relative_to(cache_root()))


def cache_bytecode(roots: Sequence[str]) -> int:
    """Write the bytecode of each module imported from `roots` that has none; how many were written.

    The roots are kvsim's cache (a release unpacked there, its dependency folder), never a user's tree. Where
    PYTHONDONTWRITEBYTECODE is set an import writes no bytecode, so each child would compile the release's import
    chain from source again (about 2 s of a vLLM child's start); the next child reads what this one wrote.
    Python checks each file against its source's time and size as for any `__pycache__`; mutants and line probes
    compile from the text, as before."""
    import py_compile

    roots = tuple(os.path.join(r, "") for r in roots)  # a folder's own files, not a sibling's sharing its prefix
    written = 0
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        origin, cached = getattr(spec, "origin", None), getattr(spec, "cached", None)
        if not (roots and isinstance(origin, str) and origin.endswith(".py") and isinstance(cached, str)
                and origin.startswith(roots)) or os.path.exists(cached):
            continue
        try:
            py_compile.compile(origin, cfile=cached, doraise=True)
            written += 1
        except (py_compile.PyCompileError, OSError):  # unwritable or unreadable: the next child compiles it again
            pass
    return written


def _driver(name: str) -> Any:
    module, _, attribute = name.partition(":")
    if not (attribute and module.startswith("kvsim.conform.")):
        raise ConfigError("driver", "a 'kvsim.conform.<module>:<Class>' name", name)
    return getattr(importlib.import_module(module), attribute)


def _send(out: Any, answer: dict[str, Any] | str) -> None:
    """One line of the protocol (an answer, or one already written as JSON), at once."""
    text = answer if isinstance(answer, str) else json.dumps(answer)
    out.write(text if text.endswith("\n") else text + "\n")
    out.flush()


def _failed(exc: BaseException) -> dict[str, Any]:
    """What could not be made (the release's import, a driver): the traceback's last line, and where."""
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return {"ok": False, "config": True, "error": f"{last} (at {_where(exc.__traceback__)})"}


def serve(lines: Any, out: Any) -> int:
    """Import the engine the header names, then hand the requests to the drivers until stdin closes (the child's
    main loop).

    The process that imported the release (the zygote) never makes a driver: each driver runs in a process forked
    from it on its first request (`Worker`: the first at start, so that a driver that cannot be made is the start's
    error), which keeps the import and nothing another driver did to the release's globals (SGLang's radix driver
    publishes server arguments in `runtime_context`, its SWA driver replaces them). One driver's process at a time
    reads the parent's requests and answers them itself (`work`); a request for another driver, or a
    `__configure__`, it hands to the zygote, which gives it to that driver's process (forked if need be), or sends
    the configure to every driver's and keeps it for the next one, and answers. A worker that dies ends the child,
    as one process would."""
    header = json.loads(next(lines))
    sys.path.insert(0, header["root"])
    sys.path.append(header["deps"])
    started = time.perf_counter()
    try:
        install_stubs(header["engine"], header["version"], header["root"])
        importlib.import_module(header["module"])
        for name in header.get("preloaded", ()):  # what several drivers import on first use (`PRELOADED`)
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - not in this release, or not importable here: the driver's to say
                pass
        _driver(header["driver"])  # a name that is no driver is the start's error, before any fork
        interpreter.install()  # where the release runs Triton kernels interpreted: the language patched once a launch
    except Exception as exc:  # the release does not import here: one line, the traceback's last
        _send(out, _failed(exc))
        return 1
    first = Worker.fork(header, header["driver"], None, out, [])
    ready = first.ready()
    if ready is None or not ready.get("ok"):
        _send(out, ready or {"ok": False, "config": True, "error": "the driver's process ended"})
        return 1
    workers = {header["driver"]: first}
    _send(out, {"ok": True, "result": {"import_s": time.perf_counter() - started, "version": header["version"]}})
    cache_bytecode(cache_roots(header))
    configure: Any = None
    active = first
    resume: dict[str, Any] | None = {"resume": True}
    while True:
        if resume is not None and not active.send(resume):
            return 1
        handed = active.handed()  # what the driver reading the requests gives back: another's request, or the end
        if handed is None:
            return 1
        if handed.get("eof"):
            break
        line, resume = handed["line"], {"resume": True}
        request = json.loads(line)
        if request["op"] == CONFIGURE:
            answers = [w.ask(line) for w in workers.values()]
            if any(a is None for a in answers):
                return 1
            failed = next((a for a in answers if not json.loads(a)["ok"]), None)
            # what a driver made later loads: this request's, or, where its mutant did not load, the release
            # with the trace kept (what each worker's `Configured.configure` went back to; never the failed mutant)
            configure = (request.get("args") or {}) if failed is None else \
                {"mutant": None, "trace": (configure or {}).get("trace")}
            _send(out, failed or answers[0])
            continue
        name = request.get("driver") or header["driver"]
        worker = workers.get(name)
        if worker is None:
            worker = Worker.fork(header, name, configure, out, list(workers.values()))
            made = worker.ready()
            if made is None or not made.get("ok"):
                worker.close()
                why = (made or {}).get("error", "its process ended")
                error = ConfigError("driver", "a driver this release's child can make", name, hint=why)
                _send(out, {"ok": False, "error": str(error), "config": True})
                continue
            workers[name] = worker
        active, resume = worker, {"take": line}  # it answers this one, then reads the requests itself
    for worker in workers.values():
        worker.close()
    return 0


class Worker:
    """One driver's process, forked from the zygote after the import: the zygote's commands to it and its hand-offs
    back go over two pipes; the parent's requests and their answers go straight between it and the parent."""

    def __init__(self, pid: int, to: Any, back: Any) -> None:
        self.pid, self.to, self.back = pid, to, back

    @classmethod
    def fork(cls, header: dict[str, Any], name: str, configure: Any, out: Any, others: Sequence["Worker"]) -> "Worker":
        """`out`: the child's answers to the parent; `others`: the other workers, whose pipes this one must not keep
        open, so that an end of one is seen at once by the zygote."""
        down, up = os.pipe(), os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                for other in others:
                    for stream in (other.to, other.back):
                        os.close(stream.fileno())
                os.close(down[1])
                os.close(up[0])
                with os.fdopen(down[0]) as control, os.fdopen(up[1], "w", buffering=1) as reply, \
                        open(0, closefd=False) as requests:
                    code = work(header, name, configure, control, reply, requests, out)
            finally:
                os._exit(code)
        os.close(down[0])
        os.close(up[1])
        return cls(pid, os.fdopen(down[1], "w", buffering=1), os.fdopen(up[0]))

    def ready(self) -> dict[str, Any] | None:
        line = self.back.readline()
        return json.loads(line) if line else None

    handed = ready  # what the worker hands back: `{"line": ...}` (a request not its own) or `{"eof": true}`

    def send(self, command: dict[str, Any]) -> bool:
        """`{"resume": true}` (read the requests again), `{"take": line}` (answer it, then read them); False when
        the worker ended."""
        try:
            _send(self.to, json.dumps(command))
        except OSError:
            return False
        return True

    def ask(self, line: str) -> str | None:
        """The worker's answer line to one request line (a configure), to the zygote; None when it ended."""
        return self.back.readline() or None if self.send({"ask": line}) else None

    def close(self) -> None:
        for stream in (self.to, self.back):
            try:
                stream.close()
            except OSError:
                pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _answer_of(call: Any) -> dict[str, Any]:
    """`call()`'s answer line: its result, a refusal (ConfigError), or the engine's raise with where."""
    try:
        return {"ok": True, "result": call()}
    except ConfigError as exc:
        return {"ok": False, "error": str(exc), "config": True}
    except Exception as exc:  # the engine raised: an answer, with where
        message = " ".join(str(exc).split())[:300]
        return {"ok": False, "error": f"{type(exc).__name__}: {message}", "config": False,
                "raised": {"type": type(exc).__name__, "message": message, "where": _where(exc.__traceback__)}}


def work(header: dict[str, Any], name: str, configure: Any, control: Any, reply: Any, requests: Any, out: Any) -> int:
    """A worker's loop: make the driver (its first line to the zygote, on `reply`, says whether it could), load what
    the zygote was last asked to load; then, while the zygote lets it, read the parent's requests (`requests`, the
    child's stdin) and answer each on `out` as the child's one process did. A request for another driver, or a
    `__configure__` (every driver's), it hands to the zygote and waits on `control` for what the zygote says: answer
    a request and read on (`take`), answer a configure to the zygote (`ask`), or read on (`resume`). The parent
    sends a request only once it has the answer to the one before, so one process reads at a time."""
    try:
        driver = _driver(name)()
        configured = Configured(header["root"])
        if configure:
            configured.configure(**configure)
    except Exception as exc:  # noqa: BLE001 - one line, the traceback's last, as the start's
        _send(reply, _failed(exc))
        return 1
    _send(reply, {"ok": True})
    reading = False
    while True:
        if not reading:
            message = control.readline()
            if not message:  # the zygote closed it: the child ends
                break
            command = json.loads(message)
            if "ask" in command:
                _send(reply, _answer_line(json.loads(command["ask"]), driver, configured))
                continue
            if "take" in command:
                _send(out, _answer_line(json.loads(command["take"]), driver, configured))
            reading = True
            continue
        line = requests.readline()
        if not line:  # the parent closed its end: the zygote ends every worker
            _send(reply, {"eof": True})
            reading = False
            continue
        if not line.strip():
            continue
        request = json.loads(line)
        if request["op"] == CONFIGURE or (request.get("driver") or header["driver"]) != name:
            _send(reply, {"line": line})
            reading = False
            continue
        _send(out, _answer_line(request, driver, configured))
    # what the driver's ops imported on first use (SGLang's radix driver: the scheduler's request type, about 580
    # files), cached as the zygote caches the import's: the next child reads it instead of compiling it again
    cache_bytecode(cache_roots(header))
    return 0


def _answer_line(request: dict[str, Any], driver: Any, configured: "Configured") -> str:
    """A request's answer line: the driver's answer (a batch's answers), or the configure's, with the traced lines
    it ran."""
    op, args = request["op"], request.get("args") or {}
    trace = configured.trace if op != CONFIGURE else None  # a mutant loads into unprobed code
    if trace is not None:
        trace.start()
    try:
        if op == CONFIGURE:
            answer = _answer_of(lambda: configured.configure(**args))
        elif op == CALLS:  # each call answered as if asked alone, up to the first that is not ok
            answers: list[dict[str, Any]] = []
            for each_op, each_args in args["calls"]:
                answers.append(_answer_of(lambda: driver.handle(each_op, each_args or {})))
                if not answers[-1]["ok"]:
                    break
            answer = {"ok": True, "result": answers}
        else:
            answer = _answer_of(lambda: driver.handle(op, args))
    finally:
        if trace is not None:
            trace.stop()
    if trace is not None and configured.trace is trace:
        answer["lines"] = configured.new_lines()
    try:
        return json.dumps(answer)
    except (TypeError, ValueError) as exc:  # the driver's answer is not JSON: its bug, said in one line
        return json.dumps({"ok": False, "config": True, "error": f"the driver's answer is not JSON: {exc}"})


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
        self.mutant: Any = None  # what the child has loaded (`configure`), sent again to a restarted child
        self.traced: tuple[str, ...] = ()
        self.trace: Any = None  # the parent's LineTrace the child's executed lines are added to

    def configure(self, mutant: Any = None, trace: Any = None, files: Sequence[str] = ()) -> None:
        """Load `mutant` (a `mutants.Mutant`; None: the release as it is) into the child, and add the lines of
        `files` it executes to `trace` (a LineTrace; None: no trace). Sent only when it changes what is loaded."""
        traced = tuple(files) if trace is not None else ()
        self.trace = trace
        if self.process is not None and (mutant, traced) == (self.mutant, self.traced):
            return
        self.mutant, self.traced = mutant, traced
        if self.process is None:
            self.start()  # it configures itself
        else:
            self._configure()

    def _configure(self) -> None:
        """Send what is to be loaded; a mutant that does not load, or kills the child, is a ConfigError (the
        target cannot be run on it: a mutation run's "not loadable")."""
        from kvsim.engine.conformance.answers import Answered

        try:
            self._call(CONFIGURE, {"mutant": None if self.mutant is None else self.mutant.to_json(),
                                   "trace": list(self.traced) or None}, max(self.timeout or 0, CONFIGURE_TIMEOUT_S))
        except (ConfigError, Answered) as exc:
            self.mutant = None  # the child put the released module back, or a new one starts without it
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError("mutant", "a module the child loads", str(exc.answer)) from None

    def __enter__(self) -> "InstalledChild":
        self.start()
        return self

    def start(self) -> None:
        env = dict(os.environ, PYTHONHASHSEED=HASH_SEED)
        env.setdefault("PYTHONWARNINGS", "ignore")
        env.setdefault("HF_HUB_OFFLINE", "1")  # nothing a child loads may reach for the Hub (a lookup would wait)
        env.update(CHILD_ENVIRONMENT.get(self.env.engine, {}))
        self.spawn(["-m", "kvsim.conform.installed_child"], env)
        s = self.env.source
        self.send({"engine": s.engine, "version": s.version, "root": str(s.root), "origin": s.origin,
                   "deps": str(self.env.deps), "module": self.env.module, "preloaded": list(self.env.preloaded),
                   "driver": self.driver})
        answer = self._answer(self.start_timeout)
        if answer is None or not answer.get("ok"):
            why = answer["error"] if answer else f"no answer ({' '.join(self.stderr_tail(400).split())})"
            self.close()
            raise ConfigError(f"{s.label} (real import)", f"{self.env.module} importable", why,
                              hint=f"dependencies in {self.env.deps}")
        self.import_s = answer["result"]["import_s"]
        if self.mutant is not None or self.traced:
            self._configure()

    def _answer(self, timeout: float | None) -> dict[str, Any] | None:
        """The child's next answer; None when it ended or did not answer within `timeout` (then it is ended)."""
        assert self.process is not None
        line = self.readline(timeout)
        if line is None:
            kill(self.process)
        return json.loads(line) if line else None

    def call(self, op: str, **args: Any) -> Any:
        """The driver's answer to `op`; see the class for what a refusal, a raise, a death or a hang become."""
        return self._call(op, args, self.timeout)

    def call_driver(self, driver: str, op: str, args: dict[str, Any]) -> Any:
        """`call` answered by another driver of the same release in this child (made on its first request)."""
        return self._call(op, args, self.timeout, driver)

    def calls(self, calls: Sequence[tuple[str, dict[str, Any]]], driver: str | None = None) -> list[Any]:
        """The driver's answers to several requests `(op, args)` sent as one line: what calling each in turn
        gives (the first refused or raised one ends them, as it would end that sequence), in one round trip to
        the child. The timeout is the calls' together (`timeout` each)."""
        timeout = None if self.timeout is None else self.timeout * max(1, len(calls))
        answers = self._call(CALLS, {"calls": [[op, args] for op, args in calls]}, timeout, driver,
                             " then ".join(op for op, _ in calls))
        return [_result(answer, op) for answer, (op, _) in zip(answers, calls)]

    def _call(self, op: str, args: dict[str, Any], timeout: float | None, driver: str | None = None,
              label: str | None = None) -> Any:
        """`op` sent, its answer's result; `label`: what an error names as the request (`op` itself)."""
        from kvsim.engine.conformance.answers import Answered, Raised

        if self.process is None:
            self.start()
        try:
            self.send({"op": op, "args": args, **({"driver": driver} if driver else {})})
            answer = self._answer(timeout)
        except OSError as exc:
            answer, tail = None, str(exc)
        except BaseException:  # interrupted waiting (a caller's deadline, Ctrl-C): its answer would come late
            self.close()
            raise
        else:
            tail = ""
        if answer is None:
            tail = " ".join((tail or self.stderr_tail(600)).split())
            self.close()
            raise Answered(Raised("ChildDied", f"the {self.env.source.label} child ended or did not answer "
                                  f"within {timeout} s: {tail}", label or op))
        if self.trace is not None and answer.get("lines"):
            self.trace.add(tuple(x) for x in answer["lines"])
        return _result(answer, label or op)


def _result(answer: dict[str, Any], op: str) -> Any:
    """An answer line's result; a refusal is a ConfigError, the engine's raise `Answered(Raised(...))`."""
    from kvsim.engine.conformance.answers import Answered, Raised

    if answer["ok"]:
        return answer["result"]
    if answer.get("config"):
        raise ConfigError(op, "a request the driver knows", answer["error"])
    raised = answer["raised"]
    raise Answered(Raised(raised["type"], raised["message"], raised["where"]))


class Driven:
    """One driver's handle on the shared child of its release (`shared`): its requests go to that driver; what is
    loaded (`configure`), the line trace, the deadline and the process are the child's, which every driver of the
    release shares."""

    def __init__(self, child: InstalledChild, driver: str) -> None:
        self.child, self.driver = child, driver

    def call(self, op: str, **args: Any) -> Any:
        return self.child.call_driver(self.driver, op, args)

    def calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> list[Any]:
        return self.child.calls(calls, self.driver)

    def configure(self, mutant: Any = None, trace: Any = None, files: Sequence[str] = ()) -> None:
        self.child.configure(mutant, trace, files)

    @property
    def trace(self) -> Any:
        return self.child.trace

    @trace.setter
    def trace(self, value: Any) -> None:
        self.child.trace = value

    def __getattr__(self, name: str) -> Any:  # import_s, process, timeout, env
        return getattr(self.child, name)


_SHARED: dict[tuple[str, str], InstalledChild] = {}


def shared(env: ImportEnvironment, driver: str, timeout: float | None = None) -> Driven:
    """`driver`'s handle on the child of this release, kept for the process's life (started on first use; closed
    at exit): every target run of a `kvsim conform` or a test session reuses its import, whichever driver the
    target names (a second driver is made in the same child on its first request)."""
    key = (str(env.source.root), str(env.deps))
    child = _SHARED.get(key)
    if child is None:
        if not _SHARED:
            atexit.register(close_shared)
        child = _SHARED[key] = InstalledChild(env, driver)
    child.timeout = timeout
    return Driven(child, driver)


def close_shared() -> None:
    while _SHARED:
        _SHARED.popitem()[1].close()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (thousands of modules: about 1.5 s the parent waited for at close)
