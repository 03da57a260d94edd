"""What the package's two transition systems share: a request's statuses, the three actions of the scheduler's
loop (admit a waiting request, decode a running one, retract one whose next decode does not fit), and the
contract methods over them. A system provides `_decode_short(state, r)` and `transition`; its state has
`requests` (each with a `status`) and `flags`."""

from __future__ import annotations

from typing import Any, ClassVar

from kvsim.engine.actions import tagged, type_table
from kvsim.engine.errors import ConfigError

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"

Admit = tagged("admit", "req")
Decode = tagged("decode", "req")
Retract = tagged("retract", "req")
ACTIONS = type_table((Admit, Decode, Retract))


class Prompts:
    """The requests of a config with fields `prompts` (each request's family), `prompt_len`, `shared` and
    `max_tokens`: request r's prompt is `shared` leading 1s, then `2 + prompts[r]` up to `prompt_len`; its outputs
    are `8 + prompts[r]` (greedy: equal prompts, equal outputs)."""

    max_requests: ClassVar[int] = 3

    def check_requests(self) -> None:
        if not 1 <= len(self.prompts) <= self.max_requests:
            raise ConfigError("param prompts", f"one to {self.max_requests} requests", len(self.prompts))
        if self.shared > self.prompt_len:
            raise ConfigError("param shared", f"at most prompt_len ({self.prompt_len})", self.shared)

    def prompt(self, req: int) -> tuple[int, ...]:
        return (1,) * self.shared + (2 + self.prompts[req],) * (self.prompt_len - self.shared)

    def output_token(self, req: int) -> int:
        return 8 + self.prompts[req]


class RequestLoop:
    liveness = "every_request_finishes"

    def done(self, s: Any) -> bool:
        return not s.flags and all(r.status == FINISHED for r in s.requests)

    def enabled(self, s: Any) -> list[tuple]:
        if s.flags:
            return []
        actions: list[tuple] = []
        for r, req in enumerate(s.requests):
            if req.status == WAITING:
                actions.append(Admit(r))
            elif req.status == RUNNING:
                actions.append(Decode(r))
                if self._decode_short(s, r):
                    actions.append(Retract(r))
        return actions

    def step(self, s: Any, action: tuple) -> Any:
        return self.transition(s, action)[0]

    def _decode_short(self, s: Any, r: int) -> bool:
        raise NotImplementedError

    def transition(self, s: Any, action: tuple) -> tuple[Any, tuple[tuple, ...]]:
        raise NotImplementedError
