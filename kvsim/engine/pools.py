"""Where the partitions of `kvsim.engine.parallel` run: forked worker processes, or Ray actors.

Both offer the coordinator the same three calls: `call(method, args)` runs `method` on every
partition (one argument tuple each) and returns their answers in worker order, `one(worker, method,
*args)` asks one partition, `close()` ends them. A worker's exception is raised in the coordinator.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .errors import ConfigError

HASH_SEED = "0"  # PYTHONHASHSEED asked of Ray workers: when they all have it, routing is by `hash(state)`


class ProcessPool:
    """Partitions in forked worker processes, one pipe each (the factory is inherited, not pickled)."""

    def __init__(self, partition: type, factory: Callable[[], Any], workers: int, **options: Any) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        self.pipes, self.procs = [], []
        for w in range(workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, partition, factory, w, workers, options), daemon=True)
            proc.start()
            child.close()
            self.pipes.append(parent)
            self.procs.append(proc)

    def call(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        for pipe, a in zip(self.pipes, args):
            pipe.send((method, a))
        out = []
        for pipe in self.pipes:
            ok, value = pipe.recv()
            if not ok:
                raise RuntimeError(f"explore worker failed: {value}")
            out.append(value)
        return out

    def one(self, worker: int, method: str, *args: Any) -> Any:
        self.pipes[worker].send((method, args))
        ok, value = self.pipes[worker].recv()
        if not ok:
            raise RuntimeError(f"explore worker failed: {value}")
        return value

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()


def _serve(pipe: Any, partition: type, factory: Callable[[], Any], worker: int, workers: int,
           options: dict[str, Any]) -> None:
    part = partition(factory, worker, workers, **options)
    while True:
        msg = pipe.recv()
        if msg is None:
            return
        method, args = msg
        try:
            pipe.send((True, getattr(part, method)(*args)))
        except Exception as exc:  # reported to the coordinator, which raises it there
            pipe.send((False, f"{type(exc).__name__}: {exc}"))


def connect_ray(address: str | None) -> Any:
    """The `ray` module, connected to the cluster at `address` (None or "local": start one on this machine)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray", "the ray package installed (pip install 'kvsim[ray]')", "not installed") from None
    if not ray.is_initialized():
        ray.init(address=None if address in (None, "", "local") else address, include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR", runtime_env={"env_vars": {"PYTHONHASHSEED": HASH_SEED}})
    return ray


class RayPool:
    """The same partitions as Ray actors (`ray.init(address)`; no address starts a local cluster)."""

    def __init__(self, partition: type, factory: Callable[[], Any], workers: int, address: str | None,
                 **options: Any) -> None:
        ray = connect_ray(address)
        actor = ray.remote(num_cpus=0)(partition)
        self.ray = ray
        self.actors = [actor.remote(factory, w, workers, **options) for w in range(workers)]

    def call(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        return self.ray.get([getattr(a, method).remote(*x) for a, x in zip(self.actors, args)])

    def one(self, worker: int, method: str, *args: Any) -> Any:
        return self.ray.get(getattr(self.actors[worker], method).remote(*args))

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
