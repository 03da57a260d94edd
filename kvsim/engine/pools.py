"""Where the partitions of `kvsim.engine.explore.parallel` run: forked worker processes, or Ray actors.

Both offer the coordinator the same three calls: `call(method, args)` runs `method` on every
partition (one argument tuple each) and returns their answers in worker order, `one(worker, method,
*args)` asks one partition, `close()` ends them. A worker's exception is raised in the coordinator.

Each gives its partitions a `mail` (`post`, `fetch`): how the states one worker addresses to another
reach it. Forked processes on one machine send them through the coordinator's pipes (`Mail`); Ray
actors put them in Ray's object store, and the coordinator passes on only references, so the
addressee reads them from the sender's node and no state goes through the coordinator (`RayMail`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from .errors import ConfigError
from .interrupt import worker_signals

HASH_SEED = "0"  # PYTHONHASHSEED asked of Ray workers (a search's workers route by fingerprint, whatever the seed)


class Mail:
    """A worker's outboxes go to the coordinator and on to their addressees as they are."""

    def post(self, payload: bytes) -> Any:
        """What the coordinator is handed for an outbox (the outbox itself)."""
        return payload

    def fetch(self, inbox: Sequence[Any]) -> list[Any]:
        """The outboxes an inbox of `post`ed handles stands for (None, the worker's own, stays None)."""
        return list(inbox)


class RayMail(Mail):
    """Outboxes in Ray's object store, owned by the worker that put them; the coordinator passes on the
    references, and each addressee gets its inbox from the senders' nodes at once (`ray.get`)."""

    def post(self, payload: bytes) -> Any:
        import ray

        return ray.put(payload)

    def fetch(self, inbox: Sequence[Any]) -> list[Any]:
        import ray

        refs = [k for k, p in enumerate(inbox) if isinstance(p, ray.ObjectRef)]
        out = list(inbox)
        for k, value in zip(refs, ray.get([inbox[k] for k in refs])):
            out[k] = value
        return out


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
    worker_signals()  # the coordinator decides, and ends its workers through their pipes
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


def connect_ray(address: str | None, workers: int) -> Any:
    """The `ray` module, connected to the cluster at `address` (None or "local": start one on this machine,
    with a CPU for each of `workers` at least), once the cluster is found to have a CPU for each worker."""
    try:
        import ray
    except ImportError:
        raise ConfigError("ray", "the ray package installed (pip install 'kvsim[ray]')", "not installed") from None
    if not ray.is_initialized():
        local = address in (None, "", "local")
        # "local": a cluster of its own, as asked (Ray's None joins the cluster last started on this machine, or
        # RAY_ADDRESS's, and then refuses the CPU count given: a ValueError)
        ray.init(address="local" if local else address, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR", runtime_env={"env_vars": {"PYTHONHASHSEED": HASH_SEED}},
                 **({"num_cpus": max(os.cpu_count() or 1, workers)} if local else {}))
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < workers:
        raise ConfigError("workers", f"at most the {cpus:g} CPUs of the Ray cluster (a worker takes one)", workers)
    return ray


# A worker is one busy thread: it takes a CPU, so the cluster never puts two workers on one of its CPUs, and
# the workers are spread over the nodes (each holds its share of the states in its node's memory).
WORKER = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
PLACE_SECONDS = 120.0  # how long the workers may wait for CPUs that other jobs on the cluster hold


class RayPool:
    """The same partitions as Ray actors (`ray.init(address)`; no address starts a local cluster)."""

    def __init__(self, partition: type, factory: Callable[[], Any], workers: int, address: str | None,
                 place_seconds: float = PLACE_SECONDS, **options: Any) -> None:
        ray = connect_ray(address, workers)
        actor = ray.remote(**WORKER)(partition)
        self.ray = ray
        self.actors = [actor.remote(factory, w, workers, mail=RayMail(), **options) for w in range(workers)]
        placed, waiting = ray.wait([a.__ray_ready__.remote() for a in self.actors], num_returns=workers,
                                   timeout=place_seconds)
        if waiting:  # other jobs hold the CPUs: refused, not left waiting with no word
            free = ray.available_resources().get("CPU", 0) + len(placed)
            self.close()
            raise ConfigError("workers", f"at most the {free:g} CPUs free on the Ray cluster (a worker takes one)",
                              workers, f"{len(waiting)} workers found no CPU in {place_seconds:g} s")

    def nodes(self) -> list[str]:
        """The Ray node each worker runs on."""
        return self.ray.get([a.__ray_call__.remote(_node_id) for a in self.actors])

    def call(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        return self.ray.get([getattr(a, method).remote(*x) for a, x in zip(self.actors, args)])

    def one(self, worker: int, method: str, *args: Any) -> Any:
        return self.ray.get(getattr(self.actors[worker], method).remote(*args))

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)


def _node_id(_actor: Any) -> str:
    import ray

    return ray.get_runtime_context().get_node_id()
