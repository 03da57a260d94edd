"""KV event streams recorded from vLLM's real `KVCacheManager` (the second load mode: a release imported in
`kvsim.conform.installed_child`), for `kvsim events` and its tests.

`EventRecorder` is `real_manager.ManagerDriver` with one more op, run in the child:

* `record(num_blocks, block_size, steps, rank=None)`: a new manager built with KV events enabled, then each step
  of `steps` in order, each `["schedule", request, tokens]` (`get_computed_blocks`, then `allocate_slots` of the
  rest of the prompt; a request the pool cannot take is dropped), `["decode", request, token]` (the token appended,
  `allocate_slots` of one; a request the pool cannot extend is preempted: freed and dropped), `["finish",
  request]` (`free`) or `["reset"]` (`reset_prefix_cache`). After each step, the events the manager hands over
  (`take_events`), where there are any, as the scheduler publishes them: a real `KVEventBatch(ts=step number,
  events, data_parallel_rank=rank)`, encoded by msgspec's JSON encoder, one line each. Answers `{"lines": [...],
  "steps": [what each step did: "scheduled", "refused", "decoded", "preempted", "finished", "reset",
  "not reset", or "absent" for a decode or finish of a request refused or preempted before]}`.

`workload(seed, ...)` writes such a step list in the parent: requests drawn from a few shared-prefix families
into a small pool (eviction churn), decodes, finishes, and a prefix-cache reset whenever no request is running.
"""

from __future__ import annotations

import random
from typing import Any, Mapping

from .real_manager import ManagerDriver

DRIVER = "kvsim.conform.vllm.event_recorder:EventRecorder"


class EventRecorder(ManagerDriver):
    """The real manager with events on, driven through a step list; each step's events a `KVEventBatch` line."""

    def handle(self, op: str, args: Mapping[str, Any]) -> Any:
        if op == "record" and self.manager is None:  # record builds its own manager: the driver's check is met
            self.op_build(num_blocks=2, block_size=1)
        return super().handle(op, args)

    def op_record(self, num_blocks: int, block_size: int, steps: list, rank: int | None = None) -> Any:
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        self.op_build(num_blocks=num_blocks, block_size=block_size, events=True, max_model_len=num_blocks * block_size)
        self.manager.take_events()
        encoder = msgspec.json.Encoder()
        lines, done = [], []
        for number, step in enumerate(steps):
            done.append(self._step(step[0], *step[1:]))
            events = self.manager.take_events()
            if events:
                batch = KVEventBatch(ts=float(number), events=events, data_parallel_rank=rank)
                lines.append(encoder.encode(batch).decode("utf-8"))
        return {"lines": lines, "steps": done}

    def _step(self, kind: str, *args: Any) -> str:
        if kind == "schedule":
            request, tokens = args
            hit = self.op_computed(request, tokens)["hit"]
            if self.op_allocate(request, len(tokens) - hit, computed_tokens=hit)["blocks"] is None:
                self._drop(request)
                return "refused"
            return "scheduled"
        if kind in ("decode", "finish") and args[0] not in self.requests:
            return "absent"  # refused or preempted before: the workload is written without knowing
        if kind == "decode":
            request, token = args
            req = self._request(request)
            req.append_output_token_ids(token)
            if self.op_allocate(request, 1)["blocks"] is None:  # the scheduler preempts it: freed, recomputed later
                self.op_free(request)
                return "preempted"
            return "decoded"
        if kind == "finish":
            self.op_free(args[0])
            return "finished"
        if kind == "reset":
            return "reset" if self.manager.reset_prefix_cache() else "not reset"
        raise ValueError(f"step {kind!r}: expected schedule, decode, finish or reset")

    def _drop(self, request: str) -> None:
        self.requests.pop(request, None)
        self.computed_blocks.pop(request, None)


def workload(seed: int, steps: int = 120, families: int = 3, block_size: int = 4) -> list[list[Any]]:
    """A deterministic step list for `record`: requests whose prompts start with one of `families` shared
    prefixes (one to three blocks long) and end with a few tokens of their own, a decode or a finish of a running
    request in between, and a `reset` once no request runs."""
    rng = random.Random(seed)
    prefixes = [[1000 * (f + 1) + t for t in range(block_size * rng.randint(1, 3))] for f in range(families)]
    running: list[str] = []
    out: list[list[Any]] = []
    made = 0
    for _ in range(steps):
        roll = rng.random()
        if not running and out and out[-1][0] != "reset" and roll < 0.5:
            out.append(["reset"])
        elif not running or (roll < 0.35 and len(running) < 3):
            name = f"r{made}"
            made += 1
            own = [rng.randint(1, 999) for _ in range(rng.randint(1, 2 * block_size))]
            out.append(["schedule", name, rng.choice(prefixes) + own])
            running.append(name)
        elif roll < 0.75:
            out.append(["decode", rng.choice(running), rng.randint(1, 999)])
        else:
            out.append(["finish", running.pop(rng.randrange(len(running)))])
    return out
