"""The P/D life cycle of vLLM's scheduler around the KV cache manager, on the prefill (KV-producing) side
(`kvsim explore kv-cache-manager-pd`): vLLM `vllm/v1/core/sched/scheduler.py` (async scheduling) with a
producing KV connector, over this package's `KVCacheManager` (its public methods only).

Requests are of two kinds. A *producer* request (`do_remote_decode`) prefills here and samples one token; when it
finishes, the scheduler calls the connector's `request_finished(request, block_ids)` with the blocks of its
computed tokens, the connector keeps them (`delay_free_blocks`) until the decode side has read them, and
`finished_sending` (a later step's connector output) frees them. A *local* request decodes here, `max_tokens`
outputs, and frees its blocks when it finishes. Each request's prompt is its own (no shared prefix): the P/D
hand-off is what this system checks, the prefix cache is `CacheManagerSystem`'s.

Async scheduling: a step is scheduled before the previous one's output is processed, so a request's output is
*in flight* between its `schedule` / `decode` and its `output`. The actions, each for one request:

- `schedule` (waiting, no output in flight that it must wait for): `get_computed_blocks`, `allocate_slots` for
  every token after the hit (prefill in one step); `deferred` (nothing changes) when the pool cannot give them.
- `decode` (running, its output back, not finished): `allocate_slots` for its last sampled token.
- `output`: the oldest in-flight output returns (`update_from_output`): the sampled token is appended and the
  request stops after its output budget; a producer then goes to the connector, a local request is freed.
- `preempt` (running, under pressure: some request's next step needs more blocks than the free queue has; which
  request the scheduler picks is left free): its blocks are freed, it waits to be recomputed from token 0, and
  an output of it still in flight becomes *stale*.
- `deliver` (finished into the connector): `finished_sending`, the blocks are freed.

The race of #50297: a producer's final (prefill) step is in flight when it is preempted. Before the fix (0.26.0,
`pre_50297`) the stale output is processed like any other, so the request stops, finishes, and the connector's
`request_finished` gets the blocks of 0 computed tokens: none, the preemption freed them. Since the fix (0.27.0,
`Scheduler._preempt_request(..., drop_stale_output=self.requires_kv_delivery)`) a connector that requires KV
delivery (a producer, `KVConnectorBase_V1.requires_kv_delivery`) has the stale output dropped: the request stays
waiting, is recomputed, and finishes with its blocks. 0.26.0 has no notion of a stale output at all; the model
lets a preempted request resume only once its stale output has returned (0.27.0's rule for outputs that are
delivered, not dropped), an under-approximation of 0.26.0 that still reaches the race.

#55055 (0.31.0, `NixlConnectorScheduler._prefill_backoff` / `_truncate_request_for_prefill`): with a multi-module
MTP drafter of lookahead k (`num_prefill_lookahead_tokens`, param `mtp_lookahead`), MTP module i at prompt position
p reads token p + i, a draft past the prompt's end and its sampled token, so the MTP-layer KV of the last k - 1
prompt positions embeds unverified drafts; the decode side loads what the producer hands and never rebuilds it.
Since the fix the producer truncates its prompt by max(Mamba's 1, k - 1) (when the prompt is longer than that) and
the decode side recomputes those tokens; before it (0.30.0, `pre_55055`) only Mamba backed off. A prompt no
longer than the backoff is not truncated, before the fix or after.

Invariants: `finished_into_producer_owns_blocks` (#50297: a request finished into the producing connector still
owns the blocks handed to `request_finished`, those of its prompt, until delivery), `no_unverified_draft_kv_handed`
(#55055), the pool's reference counts, free queue and accounting (`CacheManagerSystem`'s own), and nothing held
once every request is done. Liveness: every request is done (delivered or freed). Block ids are names
(`symmetry`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Sequence

from kvsim.engine.actions import Rules, tagged, type_table
from kvsim.engine.errors import ConfigError
from kvsim.engine.params import param
from kvsim.engine.system import Invariant, Sometimes, Thawed

from . import symmetry
from .kv_cache_manager import KVCacheManager, ManagerState, Request, cdiv
from .system import CacheManagerSystem, all_free_when_done
from .variants import FIXED, CacheManagerVariant

WAITING, RUNNING, SENDING, DONE = "waiting", "running", "sending", "done"

Schedule = tagged("schedule", "req")  # a waiting request: get_computed_blocks, allocate_slots (its whole prefill)
Decode = tagged("decode", "req")  # a running request whose output is back: allocate_slots for its sampled token
Output = tagged("output", "req")  # the request's oldest in-flight output returns (update_from_output)
Preempt = tagged("preempt", "req")  # a running request is preempted under pressure: free, recompute later
Deliver = tagged("deliver", "req")  # finished_sending: the connector read the blocks; they are freed
ACTIONS = type_table((Schedule, Decode, Output, Preempt, Deliver))

Allocated = tagged("allocated", "req", "hit_blocks", "new_blocks")
Deferred = tagged("deferred", "req")  # allocate_slots returned None
Sampled = tagged("sampled", "req", "stale")  # an output was processed (stale: it predates a preemption)
Dropped = tagged("dropped", "req")  # a stale output was dropped (#50297's drop_stale_output)
Handed = tagged("handed", "req", "blocks")  # connector.request_finished(request, block_ids)
Freed = tagged("freed", "req", "blocks")
EFFECTS = type_table((Allocated, Deferred, Sampled, Dropped, Handed, Freed))

PIPELINE_DEPTH = 2  # async scheduling: a request's steps scheduled and not yet processed, at most
OUTPUT_TOKEN = 9  # every sampled token (the model never reads a token's value beyond its hash)
# CacheManagerSystem's invariants that read only the manager (`state.manager`): this system's state has it too
POOL_CHECKS = ("ref_count_is_holders", "free_queue_iff_unreferenced", "pool_accounting")


@dataclass(frozen=True)
class ProducerSchedulerConfig:
    """`kvsim explore kv-cache-manager-pd --param`: the pool, the requests of each kind, the prompt."""

    max_requests: ClassVar[int] = 3  # the explorer's bound; the timed workload (`scheduler_sim`) lifts it
    num_blocks: int = param(3, "blocks in the pool, the null block (block 0) included", minimum=2, maximum=6)
    block_size: int = param(2, "tokens per block", minimum=1, maximum=4)
    prompt_len: int = param(2, "tokens in each prompt", minimum=1, maximum=4)
    producers: int = param(1, "requests finished into the producing connector (do_remote_decode, one output)",
                           minimum=0, maximum=3)
    local: int = param(1, "requests that decode here and free their blocks when they finish", minimum=0, maximum=2)
    max_tokens: int = param(2, "output tokens a local request samples", minimum=1, maximum=3)
    mtp_lookahead: int = param(0, "num_prefill_lookahead_tokens: the multi-module MTP drafter's lookahead (0: no "
                                  "drafter; #55055)", minimum=0, maximum=3)
    prompt_logprobs: bool = param(False, "1: the producers ask for prompt logprobs (skip_reading_prefix_cache: no "
                                         "prefix-cache hit; not truncated from 0.32.0, the decode side recomputing "
                                         "the whole prompt)")

    def __post_init__(self) -> None:
        if not 1 <= self.producers + self.local <= self.max_requests:
            raise ConfigError("param producers", f"one to {self.max_requests} requests in all (producers + local)",
                              self.producers + self.local)

    @property
    def num_requests(self) -> int:
        return self.producers + self.local

    def is_producer(self, req: int) -> bool:
        return req < self.producers

    def skips_reading(self, req: int) -> bool:
        """Request req skips reading the prefix cache (upstream's `get_skip_reading_prefix_cache`)."""
        return self.prompt_logprobs and self.is_producer(req)

    def prompt(self, req: int, backoff: int = 0, spares_skip_reading: bool = True) -> tuple[int, ...]:
        """Request req's prompt; a producer's stops `backoff` tokens short (the P side's truncation,
        `_truncate_request_for_prefill`, when the prompt is longer than that: the decode side recomputes them),
        unless it skips reading the prefix cache and the release spares such a request (`spares_skip_reading`, the
        variant's `truncation_spares_skip_reading`: its decode side loads nothing)."""
        spared = spares_skip_reading and self.skips_reading(req)
        cut = backoff if self.is_producer(req) and self.prompt_len > backoff and not spared else 0
        return (1 + req,) * (self.prompt_len - cut)

    def output_budget(self, req: int) -> int:
        return 1 if self.is_producer(req) else self.max_tokens


class SchedRequest(NamedTuple):
    status: str  # WAITING, RUNNING, SENDING (finished into the connector, not delivered) or DONE
    token_ids: tuple[int, ...]  # prompt, then the sampled outputs
    num_computed_tokens: int
    in_flight: int  # 0 or 1: the output of its last scheduled step, not processed yet
    stale: int  # outputs in flight from steps before its last preemption
    drop_stale: bool  # 0.27.0's request.drop_stale_output: those outputs are dropped when they return
    handed: tuple[int, ...] | None  # the block ids request_finished got (None: not finished into the connector)


class SchedState(NamedTuple):
    manager: ManagerState
    requests: tuple[SchedRequest, ...]
    flags: tuple[tuple[str, str], ...] = ()


class ProducerSchedulerSystem:
    liveness = "every_request_finishes"

    def __init__(self, variant: CacheManagerVariant = FIXED,
                 config: ProducerSchedulerConfig = ProducerSchedulerConfig()) -> None:
        self.name, self.variant, self.cfg = "kv-cache-manager-pd", variant, config
        self.thawed: Thawed[KVCacheManager] = Thawed()  # the manager the last transition left
        # #55055 (0.31.0, NixlConnectorScheduler._prefill_backoff): the producer stops the drafter's lookahead
        # window minus one short; 0.30.0 backed off only for Mamba (not modelled: 0)
        self.backoff = max(0, config.mtp_lookahead - 1) if variant.prefill_backoff_covers_lookahead else 0
        self.prompts = tuple(config.prompt(r, self.backoff, variant.truncation_spares_skip_reading)
                             for r in range(config.num_requests))
        self.invariants = (
            Invariant("finished_into_producer_owns_blocks", self._owns_blocks,
                      "a request finished into a producing connector still owns the blocks request_finished got, "
                      "those of its prompt, until delivery"),
            *(i for i in CacheManagerSystem(variant).invariants if i.name in POOL_CHECKS),
            Invariant("no_unverified_draft_kv_handed", self._no_draft_kv,
                      "the KV a producer hands the connector holds no position whose MTP-layer KV was computed from "
                      "unverified draft tokens (the last lookahead - 1 prompt positions)"),
            all_free_when_done(DONE),
        )
        self.sometimes = (
            Sometimes("a_producer_hands_its_blocks", lambda s: any(r.status == SENDING and r.handed
                                                                    for r in s.requests),
                      "request_finished hands the connector a finished producer's blocks"),
            Sometimes("a_preemption_races_an_output", lambda s: any(r.stale for r in s.requests),
                      "a request is preempted with its output in flight (#50297's race)"),
            Sometimes("a_delivery_frees_the_blocks", lambda s, a, t: type(a) is Deliver,
                      "finished_sending: the decode side read the blocks, they are freed", step=True),
        )

    # -- the contract ----------------------------------------------------------------------------------------
    def initial_states(self) -> tuple[SchedState, ...]:
        cfg = self.cfg
        m = KVCacheManager(cfg.num_blocks, cfg.block_size, cfg.num_requests)
        requests = tuple(SchedRequest(WAITING, self.prompts[r], 0, 0, 0, False, None) for r in range(cfg.num_requests))
        return (SchedState(m.freeze(), requests),)

    def done(self, s: SchedState) -> bool:
        return not s.flags and all(r.status == DONE for r in s.requests)

    def enabled(self, s: SchedState) -> list[tuple]:
        if s.flags:
            return []
        steps = self._steps(s)
        pressure = any(self._next_need(s, r) > len(s.manager.pool.free) for r in steps)
        actions: list[tuple] = []
        for r, req in enumerate(s.requests):
            if r in steps:
                actions.append(Schedule(r) if req.status == WAITING else Decode(r))
            if req.in_flight or req.stale:
                actions.append(Output(r))
            if req.status == RUNNING and pressure:
                actions.append(Preempt(r))
            if req.status == SENDING:
                actions.append(Deliver(r))
        return actions

    def canonical(self, s: SchedState) -> SchedState:
        """One representative per renaming of the blocks (`symmetry`), the handed block ids renamed alike."""
        perm = symmetry.first_appearance(s)
        if s.flags:
            s = s._replace(flags=tuple((name, symmetry.FLAG_MESSAGE) for name, _ in s.flags))
        return s if all(old == new for old, new in perm.items()) else relabel(s, perm)

    def allows(self, s: SchedState, a: tuple) -> bool:
        return RULES.allows(self, s, a)

    def step(self, s: SchedState, action: tuple) -> SchedState:
        return self.transition(s, action)[0]

    def transition(self, s: SchedState, action: tuple) -> tuple[SchedState, tuple[tuple, ...]]:
        m = self.thawed.take(s.manager, lambda: KVCacheManager.thaw(s.manager, self.cfg.block_size))
        effect, action = RULES.effect(action)
        requests = list(s.requests)
        fx: list[tuple] = []
        effect(self, s, action, m, requests, fx)
        m.take_events()  # the events are CacheManagerSystem's to check
        after = SchedState(m.freeze(), tuple(requests), s.flags)
        self.thawed.keep(after.manager, m)
        return after, tuple(fx)

    # -- the scheduler's reading of a request ----------------------------------------------------------------
    def request(self, s: SchedState, r: int) -> Request:
        req = s.requests[r]
        return Request(r, list(req.token_ids), len(self.prompts[r]), req.num_computed_tokens, self.cfg.block_size,
                       self.cfg.skips_reading(r))

    def _finished(self, r: int, req: SchedRequest) -> bool:
        return len(req.token_ids) - len(self.prompts[r]) >= self.cfg.output_budget(r)

    def _next_need(self, s: SchedState, r: int) -> int:
        """Blocks request r's next step takes from the free queue at most (a prefill's hit ignored): when one
        needs more than the queue has, the scheduler is under pressure and preempts."""
        req, table = s.requests[r], s.manager.tables[r]
        held = 0 if table is None else len(table[0])
        return max(cdiv(len(req.token_ids), self.cfg.block_size) - held, 0)

    def _steps(self, s: SchedState) -> tuple[int, ...]:
        """The requests the scheduler may give a step: a waiting one its prefill (once the outputs it must wait
        for are back, and within the pipeline depth), a running one whose output is back, its decode (until it
        has finished)."""
        return tuple(r for r, req in enumerate(s.requests) if not req.in_flight and (
            (req.status == WAITING and (not req.stale or (req.drop_stale and req.stale < PIPELINE_DEPTH)))
            or (req.status == RUNNING and not req.stale and not self._finished(r, req))))

    def free(self, m: KVCacheManager, r: int, req: Request, fx: list) -> None:
        fx.append(Freed(r, tuple(m.get_block_ids(r)[0])))
        m.free(req)

    def finish(self, m: KVCacheManager, r: int, req: Request, fx: list) -> SchedRequest:
        """`_free_request`: a producer's blocks go to the connector (`request_finished`, which keeps them until
        delivery); a local request's are freed. The blocks handed are those of its computed tokens."""
        tokens = tuple(req.all_token_ids)
        if not self.cfg.is_producer(r):
            self.free(m, r, req, fx)
            return SchedRequest(DONE, tokens, 0, 0, 0, False, None)
        held = m.get_block_ids(r)[0]  # one full-attention group
        handed = tuple(held[:cdiv(req.num_computed_tokens, self.cfg.block_size)])
        fx.append(Handed(r, handed))
        return SchedRequest(SENDING, tokens, req.num_computed_tokens, 0, 0, False, handed)

    # -- invariants ------------------------------------------------------------------------------------------
    def _owns_blocks(self, s: SchedState) -> str | None:
        for r, req in enumerate(s.requests):
            table = s.manager.tables[r]
            problem = None if req.status != SENDING else \
                owns_blocks(req.handed, () if table is None else table[0], len(self.prompts[r]), self.cfg.block_size)
            if problem is not None:
                return f"request {r} {problem}"
        return None

    def decode_loads(self, r: int) -> bool:
        """The decode side loads what producer r hands: unless r skips reading the prefix cache and the release's
        scheduler discards a connector's hit for such a request (`connector_hit_skipped_when_skip_reading`)."""
        return not (self.cfg.skips_reading(r) and self.variant.connector_hit_skipped_when_skip_reading)

    def _no_draft_kv(self, s: SchedState) -> str | None:
        for r, req in enumerate(s.requests):
            problem = None if req.status != SENDING else \
                draft_kv_handed(req.num_computed_tokens, self.cfg.prompt_len, self.cfg.mtp_lookahead,
                                self.decode_loads(r))
            if problem is not None:
                return f"request {r} {problem}"
        return None


def owns_blocks(handed: Sequence[int] | None, held: Sequence[int], prompt_len: int, block_size: int) -> str | None:
    """A request finished into a producing connector: `request_finished` got the blocks of its prompt, and the
    request still holds exactly those (`held`, until delivery). The real scheduler's run is checked with it too
    (`kvsim.conform.vllm.real_scheduler`)."""
    want = cdiv(prompt_len, block_size)
    if handed is None or len(handed) < want or tuple(held) != tuple(handed):
        return f"finished into the producing connector: request_finished got {list(handed or ())}, expected the " \
               f"{want} block(s) of its {prompt_len} prompt tokens, still held (it holds {list(held)})"
    return None


def draft_kv_handed(num_computed_tokens: int, prompt_len: int, lookahead: int, loaded: bool = True) -> str | None:
    """A producer finished into the connector with the KV of `num_computed_tokens` of its `prompt_len` prompt tokens
    (the prompt as the user sent it). MTP module i at prompt position p reads token p + i: past the prompt's end (and
    its one sampled token) that is a draft, so with lookahead k the last k - 1 prompt positions' MTP KV is unverified.
    The decode side never rebuilds it (its first decode rejects nothing), so a producer hands at most N - (k - 1),
    unless the decode side loads nothing of it (`loaded` False: it recomputes the whole prompt).
    The real scheduler's hand-off is checked with it too (`kvsim.conform.vllm.real_scheduler`)."""
    limit = prompt_len - max(0, lookahead - 1)
    if loaded and num_computed_tokens > limit:
        return f"hands the KV of {num_computed_tokens} of its {prompt_len} prompt tokens: with lookahead {lookahead} " \
               f"positions {limit}..{prompt_len - 1} hold the MTP drafter's KV of unverified draft tokens"
    return None


def mamba_block_aligned_split(start: int, num_new_tokens: int, num_prompt_tokens: int, num_tokens: int,
                              block_size: int, junction: int = 0) -> int:
    """The tokens a prefill step computes from `start` (the computed tokens and the hit) when the scheduler would
    give it `num_new_tokens`, for a model with a Mamba group in mode `align` (vLLM 0.33.0
    `Scheduler._mamba_block_aligned_split`; hashed at the block size, no EAGLE, no hash lookahead, no prefill
    checkpoint blocks, the step's budget at least a block): a chunk that does not end the prefill ends on a block
    boundary, a chunk starting inside a block stops at its end, none runs past the last position whose state can
    be cached (the block boundary at or below `num_tokens - 1`), and a chunk stops at the shared-prefix junction
    (`request.shared_prefix_boundary`, the lookup's third count: 0 for none) floored to a block from `start`."""
    prefill_end = max(num_prompt_tokens, num_tokens - 1)
    if start >= prefill_end:
        return num_new_tokens
    end = start + num_new_tokens
    if end < prefill_end:
        end = end // block_size * block_size
    last_cache_position = (num_tokens - 1) // block_size * block_size
    junction_stop = start + (junction - start) // block_size * block_size
    stops = ((start // block_size + 1) * block_size if start % block_size else 0, last_cache_position,
             junction_stop if start < junction < end else 0)
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)


def relabel(s: SchedState, perm: dict[int, int]) -> SchedState:
    """`s` with every block id b renamed perm[b]: the manager (`symmetry.relabel`) and the handed block ids."""
    s = symmetry.relabel(s, perm)
    return s._replace(requests=tuple(
        req if req.handed is None else req._replace(handed=tuple(perm[b] for b in req.handed))
        for req in s.requests))


# -- the rules: each action's precondition beside its effect, by record type ----------------------------------
# An effect is `effect(system, state, action, manager, requests, effects)`: it acts on the live manager and the
# requests list and appends what it did to `effects`. An action is enabled when `enabled` lists it.
RULES = Rules()


def _listed(self: ProducerSchedulerSystem, s: SchedState, a: tuple) -> bool:
    return a in self.enabled(s)


def _allocate(s: SchedState, r: int, m: KVCacheManager, requests: list, fx: list, req: Request,
              hit: tuple[list, ...] | None, num_hit: int) -> None:
    """`allocate_slots` for every token of `req` not computed yet (after the hit): the step is scheduled, its
    output in flight; `deferred`, nothing changed, when the pool cannot give the blocks."""
    new = m.allocate_slots(req, req.num_tokens - req.num_computed_tokens - num_hit, num_hit, hit)
    if new is None:
        fx.append(Deferred(r))
        return
    fx.append(Allocated(r, tuple(b.block_id for b in hit[0]) if hit else (), tuple(b.block_id for b in new[0])))
    requests[r] = s.requests[r]._replace(status=RUNNING, num_computed_tokens=req.num_tokens, in_flight=1)


@RULES.rule(Schedule, when=_listed)
def _schedule(self: ProducerSchedulerSystem, s: SchedState, a: Schedule, m: KVCacheManager, requests: list,
              fx: list) -> None:
    req = self.request(s, a.req)
    hit, num_hit = m.get_computed_blocks(req)
    _allocate(s, a.req, m, requests, fx, req, hit, num_hit)


@RULES.rule(Decode, when=_listed)
def _decode(self: ProducerSchedulerSystem, s: SchedState, a: Decode, m: KVCacheManager, requests: list,
            fx: list) -> None:
    _allocate(s, a.req, m, requests, fx, self.request(s, a.req), None, 0)


@RULES.rule(Output, when=_listed)
def _output(self: ProducerSchedulerSystem, s: SchedState, a: Output, m: KVCacheManager, requests: list,
            fx: list) -> None:
    cur = s.requests[a.req]
    stale = cur.stale > 0  # outputs return in the order their steps were scheduled: the stale ones first
    if stale:
        cur = cur._replace(stale=cur.stale - 1)
        if cur.drop_stale:  # 0.27.0: update_from_output skips a drop-mode stale output
            fx.append(Dropped(a.req))
            requests[a.req] = cur
            return
    else:
        cur = cur._replace(in_flight=0)
    cur = cur._replace(token_ids=cur.token_ids + (OUTPUT_TOKEN,))
    fx.append(Sampled(a.req, stale))
    requests[a.req] = cur
    if self._finished(a.req, cur):  # check_stop: the output budget is reached, whatever the request's status
        req = Request(a.req, list(cur.token_ids), len(self.prompts[a.req]), cur.num_computed_tokens,
                      self.cfg.block_size)
        requests[a.req] = self.finish(m, a.req, req, fx)._replace(stale=cur.stale)


@RULES.rule(Preempt, when=_listed)
def _preempt(self: ProducerSchedulerSystem, s: SchedState, a: Preempt, m: KVCacheManager, requests: list,
             fx: list) -> None:
    cur = s.requests[a.req]
    self.free(m, a.req, self.request(s, a.req), fx)
    # #50297: `drop_stale_output=self.requires_kv_delivery` (the connector is a producer: it requires delivery);
    # 0.26.0 had no such argument, its in-flight output is processed when it returns
    drop = self.variant.requires_kv_delivery or (cur.drop_stale and cur.stale > 0)
    requests[a.req] = cur._replace(status=WAITING, num_computed_tokens=0, in_flight=0,
                                   stale=cur.stale + cur.in_flight, drop_stale=drop)


@RULES.rule(Deliver, when=_listed)
def _deliver(self: ProducerSchedulerSystem, s: SchedState, a: Deliver, m: KVCacheManager, requests: list,
             fx: list) -> None:
    self.free(m, a.req, self.request(s, a.req), fx)
    requests[a.req] = s.requests[a.req]._replace(status=DONE, num_computed_tokens=0, handed=None)
