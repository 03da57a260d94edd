"""vLLM's real `KVCacheManager` (imported from a release, `real_coordinator.CoordinatorDriver` in the child) in
lockstep with the `kv-cache-manager` model, one Hypothesis state machine driving both (`LOCKSTEP`).

A program starts from a configuration Hypothesis draws within the model's bounds (pool size, block size, the
requests' prompt families, prompt length, shared prefix, output tokens, resets, lookahead slots, and last the KV
cache groups: one full-attention group in about half the programs, else full attention with a sliding window
(2 to 4 tokens), Mamba, or both, or chunked local attention (chunks of one to three blocks, at most 8 tokens), each group taking
its own blocks from a pool as many times larger; Mamba in the release's prefix-caching mode, `all` before 0.33.0, the model on the matching variant) and then makes the model's own
actions, one a step among those the model enables (`step(schedule(req=0))`): `schedule(r)` (a waiting request: `get_computed_blocks`, then
`allocate_slots` of every token after the hit; the step samples one token), `decode(r)` (`allocate_slots` of the
sampled token), both with the configuration's `lookahead` (`num_lookahead_tokens`, 0 to 3: a drafter's slots,
allocated and never cached), `finish(r)` (`free`), `preempt(r)` (`free`, recomputed from token 0 when scheduled again),
`reset()` (`reset_prefix_cache`). A request that has sampled `max_tokens` tokens is freed in the same step.
After every step the two sides are compared:

* the call's answer: the hit blocks (ids, in order) and hit length, the new blocks (ids, in order) or the
  deferral when the pool cannot give them, whether the request finished; the blocks a `free` released; the reset's
  answer;
* every block's reference count (the null block's, block 0, is None on both sides: 0.26.0-0.31.0 decrement it each time a sliding-window
  group frees a block it replaced with the null block, to -1 and below; it never enters the free queue, which is
  compared) and whether it holds a hash, the free queue (ids, in eviction order), each
  request's block table, and `get_num_common_prefix_blocks` of each request holding blocks (cascade attention's
  count before 0.32.0, zeros from it: `COMMON_PREFIX_RELEASES`);
* the step's KV events, structurally: a hash is named by the order it first appeared in the events of the program
  on its side (`h0`, `h1`, ...), so the model's hashes (token tuples) and upstream's (sha256) compare equal exactly
  when one bijection maps the one onto the other, fixed at the `BlockStored` that first names each; with the parent,
  the token ids and the block size.

Four directed programs run on every release too (`PROBES`): a hash cached under two blocks at once (two requests
of one prompt, block size 1), then one copy evicted (the other must still hit) or both (the hash must miss); random
programs rarely reach the cached map's entry of two blocks; one request decoding across two chunk boundaries
of chunked local attention (a chunk boundary one token off is a search's luck to reach within a budget); and a
lookup of one token (`max_length` 1) in chunks of one one-token block, whose chunked-local hit is the null block
(random programs rarely draw that chunk, block size and prompt length together).

Conventions: the scheduler's part of a step (the sampled token, the request's computed count, a finished request
freed) is the harness's on both sides, so the lockstep checks the manager, not a scheduler; token ids are the
model's (`CacheManagerConfig.prompt`, `output_token`); the real manager is built with events on, caching on, no
watermark, `max_model_len` 64 (above every program's tokens), sha256 block hashes; every `allocate_slots` is one
scheduler step (`new_step_starts` first: Mamba defers a hit on a block cached in the same step, which the model's
one-action steps never make). A hybrid's answers, tables and freed blocks are per group (a list per group), its
events carry the group (`group_idx`; the model keys a hybrid's cached blocks (group, hash) and its events name
the hash).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import (Context, Lockstep, Operation, Probe, SystemSide,
                                              directed_probe)
from kvsim.engine.conformance.declare import variant_for
from kvsim.models.kv_cache_manager.actions import (Allocated, Decode, Deferred, Events, Finish, Freed, Preempt,
                                                   Reset, ResetDone, Schedule)
from kvsim.models.kv_cache_manager.kv_cache_manager import KVCacheManager
from kvsim.models.kv_cache_manager.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from kvsim.models.kv_cache_manager.system import GROUP_CHOICES, RUNNING, CacheManagerConfig, CacheManagerSystem
from kvsim.models.kv_cache_manager.variants import VARIANTS

from .connector_hit import MAMBA_RELEASES

DRIVER = "kvsim.conform.vllm.real_coordinator:CoordinatorDriver"
MAX_MODEL_LEN = 64
# `get_num_common_prefix_blocks` counted cascade attention's shared prefix until 0.32.0 removed cascade attention
# (every group 0 from then on, the method kept for out-of-tree schedulers)
COMMON_PREFIX_RELEASES: tuple[tuple[str | None, str], ...] = ((None, "counted"), ("0.32.0", "zero"))
# the hybrids drawn; the shrinker moves toward the first. The chunked-local one first, then the others as before
# (an order the derandomized planted searches of tests/conform shrink to their shortest programs with; with it
# last, the shared-block plant shrank to six steps on 0.33.0, not three)
HYBRIDS = ("full,local",) + tuple(g for g in GROUP_CHOICES[1:] if g != "full,local")
STEPS = 40  # calls per program: three requests of up to nine tokens each, preempted and rescheduled


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    """A configuration within the model's bounds (`CacheManagerConfig`), as the program's first line shows it. The
    pool holds at least one prompt and its lookahead slots but its last block (a pool one block short still
    defers), so most programs run rather than wait."""
    block_size, prompt_len, lookahead = draw(st.integers(1, 4)), draw(st.integers(1, 6)), draw(st.integers(0, 3))
    need = max(2, -(-(prompt_len + lookahead) // block_size))
    config = {"num_blocks": draw(st.integers(need, max(need, 8))),
              "block_size": block_size, "prompts": draw(st.lists(st.integers(0, 2), min_size=1, max_size=3)),
              "prompt_len": prompt_len, "shared": draw(st.integers(0, prompt_len)),
              "max_tokens": draw(st.integers(1, 3)), "resets": draw(st.integers(0, 2)), "lookahead": lookahead}
    # the groups last (each takes its own blocks: a hybrid's pool is as many times larger): one full-attention
    # group in about half the programs (most models' manager), a hybrid in the rest
    groups = draw(st.one_of(st.just(GROUP_CHOICES[0]), st.sampled_from(HYBRIDS)))
    kinds = len(groups.split(","))
    return {**config, "num_blocks": config["num_blocks"] * kinds, "groups": groups,
            "sliding_window": draw(st.integers(2, 4)) if "swa" in groups else 3,
            "attention_chunk_size": block_size * draw(st.integers(1, min(3, 8 // block_size))) if "local" in groups
            else 4}


def config_of(start: dict[str, Any]) -> CacheManagerConfig:
    return CacheManagerConfig(**{**start, "prompts": tuple(start["prompts"])})


class Names:
    """A block hash's name on one side: `h<k>`, k the order it first appeared in that side's events."""

    def __init__(self) -> None:
        self.names: dict[Any, str] = {}

    def __call__(self, block_hash: Any) -> str | None:
        if block_hash is None:
            return None
        key = tuple(block_hash) if isinstance(block_hash, list) else block_hash
        return self.names.setdefault(key, f"h{len(self.names)}")


def stored(names: Names, hashes: Any, parent: Any, token_ids: Any, block_size: int) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": [names(h) for h in hashes], "parent": names(parent),
            "token_ids": list(token_ids), "block_size": block_size}


class ModelSide(SystemSide):
    """The model's transition system, called with one of its actions; the view the operations draw from."""

    def __init__(self, config: CacheManagerConfig, common_counted: bool = False, variant: str = "fixed") -> None:
        self.system = CacheManagerSystem(VARIANTS[variant], config)
        self.common_counted = common_counted  # the release counts cascade attention's common prefix
        (self.state,) = self.system.initial_states()
        self.names = Names()
        self.events: list[dict[str, Any]] = []
        self.idle = False

    def call(self, op: str, action: Any) -> Any:
        effects = self.transition(op, action)
        self.events = []
        answer: dict[str, Any] = {}
        for fx in effects:
            if isinstance(fx, Allocated):
                if isinstance(action, Schedule):
                    answer.update(hit=self.ids(fx.hit_blocks), hit_tokens=fx.num_hit_tokens)
                answer["new"] = self.ids(fx.new_blocks)
            elif isinstance(fx, Deferred):
                answer["deferred"] = True
            elif isinstance(fx, Freed):
                answer["freed" if isinstance(action, (Finish, Preempt)) else "finished"] = self.ids(fx.blocks)
            elif isinstance(fx, ResetDone):
                answer["reset"] = fx.ok
            elif isinstance(fx, Events):
                self._events(fx.events)
        return answer.get("reset") if isinstance(action, Reset) else answer

    def _events(self, events: tuple) -> None:
        hybrid = len(self.system.cfg.kinds) > 1
        for e in events:
            if isinstance(e, AllBlocksCleared):
                self.events.append({"type": "AllBlocksCleared"})
                continue
            # a hybrid pool keys its cached blocks (group, hash): upstream's events name the hash and `group_idx`
            hashes = [h[1] for h in e.block_hashes] if hybrid else list(e.block_hashes)
            group = {"group": e.block_hashes[0][0]} if hybrid and e.block_hashes else {}
            if isinstance(e, BlockStored):
                self.events.append({**stored(self.names, hashes, e.parent_block_hash, e.token_ids, e.block_size),
                                    **group})
            else:
                self.events.append({"type": "BlockRemoved", "block_hashes": [self.names(h) for h in hashes], **group})

    def ids(self, blocks: tuple) -> list:
        """A step's block ids as the driver answers them: group 0's for one group, else a list per group."""
        return [list(g) for g in blocks] if len(self.system.cfg.kinds) > 1 else list(blocks)

    def observe(self) -> dict[str, Any]:
        pool = self.state.manager.pool
        n, kinds = len(self.state.requests), len(self.system.cfg.kinds)
        per_request = [[t[0] if t is not None else () for t in self.state.manager.tables[g * n:(g + 1) * n]]
                       for g in range(kinds)]
        tables = {str(r): self.ids(tuple(per_request[g][r] for g in range(kinds)) if kinds > 1
                                   else per_request[0][r])
                  for r in range(n) if any(per_request[g][r] for g in range(kinds))}
        running = [r for r, q in enumerate(self.state.requests) if q.status == RUNNING]
        cfg = self.system.cfg
        manager = KVCacheManager.thaw(self.state.manager, cfg.block_size, cfg.kinds, cfg.sliding_window,
                                      self.system.variant.mamba_cache_mode, cfg.attention_chunk_size)
        common = {r: manager.get_num_common_prefix_blocks(int(r), self.common_counted) for r in tables}
        return {"ref_cnt": [None, *pool.refs[1:]], "hashed": [h is not None for h in pool.hashes], "free": list(pool.free),
                "tables": tables, "common": common, "running": running, "events": self.events}


class RealSide:
    """The real manager in the child, driven as the model's actions are: the harness keeps each request's tokens
    and status (the scheduler's part), the child the manager."""

    def __init__(self, child: Any, config: CacheManagerConfig) -> None:
        self.child, self.cfg = child, config
        if len(config.kinds) > 1:
            child.call("build_hybrid", num_blocks=config.num_blocks, block_size=config.block_size,
                       groups=list(config.kinds), sliding_window=config.sliding_window, events=True,
                       max_model_len=MAX_MODEL_LEN, attention_chunk_size=config.attention_chunk_size)
        else:
            child.call("build", num_blocks=config.num_blocks, block_size=config.block_size, events=True,
                       max_model_len=MAX_MODEL_LEN)
        self.tokens = [list(config.prompt(r)) for r in range(len(config.prompts))]
        self.running: set[int] = set()
        self.names = Names()

    def call(self, op: str, action: Any) -> Any:
        if isinstance(action, Reset):
            return self.child.call("reset")
        r, req = str(action.req), action.req
        if isinstance(action, (Finish, Preempt)):
            self.running.discard(req)
            return {"freed": self.child.call("free" if isinstance(action, Finish) else "preempt", request=r)}
        if isinstance(action, Schedule):
            got = self.child.call("schedule", request=r, tokens=self.tokens[req], lookahead=self.cfg.lookahead)
            answer: dict[str, Any] = {"hit": got["hit"], "hit_tokens": got["hit_tokens"]}
        else:
            got = self.child.call("decode", request=r, lookahead=self.cfg.lookahead)
            answer = {}
        if got["new"] is None:
            return {"deferred": True}
        answer["new"] = got["new"]
        token = self.cfg.output_token(req)
        self.tokens[req].append(token)
        self.running.add(req)
        if len(self.tokens[req]) - self.cfg.prompt_len >= self.cfg.max_tokens:  # the step's stop: freed
            self.running.discard(req)
            answer["finished"] = self.child.call("free", request=r)
        else:
            self.child.call("sample", request=r, token=token)
        return answer

    def observe(self) -> dict[str, Any]:
        seen = self.child.call("observe")
        events = []
        hybrid = len(self.cfg.kinds) > 1
        for e in seen["events"]:
            group = {"group": e.get("group_idx")} if hybrid and e.get("block_hashes") else {}
            if e["type"] == "BlockStored":
                events.append({**stored(self.names, e["block_hashes"], e["parent_block_hash"], e["token_ids"],
                                        e["block_size"]), **group})
            elif e["type"] == "BlockRemoved":
                events.append({"type": "BlockRemoved", "block_hashes": [self.names(h) for h in e["block_hashes"]],
                               **group})
            else:
                events.append({"type": e["type"]})
        return {"ref_cnt": [None] + [b[1] for b in seen["blocks"][1:]], "hashed": [b[2] for b in seen["blocks"]],
                "free": seen["free"], "tables": seen["tables"], "common": seen["common"],
                "running": sorted(self.running), "events": events}


def sides(ctx: Context, start: dict[str, Any]) -> tuple[ModelSide, RealSide]:
    config = config_of(start)
    counted = variant_for(COMMON_PREFIX_RELEASES, ctx.source.version) == "counted"
    # Mamba's prefix-caching mode as the release builds it (`all` before 0.33.0): the model's variant of it
    variant = variant_for(MAMBA_RELEASES, ctx.source.version) if "mamba" in config.kinds else "fixed"
    return ModelSide(config, counted, variant), RealSide(ctx.child, config)


def directed(name: str, what: str, start: dict[str, Any], program: tuple) -> Probe:
    return directed_probe(sides, name, what, start, program)


# Two requests of one prompt cache its block in their own steps (block size 1: at their schedule), so one hash is
# cached under two blocks (upstream keeps both, the map's entry then a dict); the third request's allocations evict
# the first copy (the second still hits), or both (the hash misses).
def twice(num_blocks: int) -> dict[str, Any]:
    return {"num_blocks": num_blocks, "block_size": 1, "prompts": [0, 0, 1], "prompt_len": 1, "shared": 0,
            "max_tokens": 3, "resets": 0}


CACHED_TWICE = (Schedule(0), Schedule(1), Finish(0), Preempt(1), Schedule(2), Decode(2))
# One request decodes across chunk boundaries of chunked local attention (chunks of two one-token blocks): each
# boundary frees the last chunk's blocks for the null block.
CHUNKS = {"num_blocks": 10, "block_size": 1, "prompts": [0], "prompt_len": 3, "shared": 0, "max_tokens": 3,
          "resets": 0, "groups": "full,local", "attention_chunk_size": 2}
# A prompt of two tokens in chunks of one one-token block, cached by a request that has finished, scheduled again: the
# lookup stops at one token (`max_length` 1), full attention hits its block, and chunked local attention's hit is
# the null block (its one token lies before the current chunk), not its cached block.
ONE_TOKEN_CHUNKS = {"num_blocks": 10, "block_size": 1, "prompts": [0, 1, 0], "prompt_len": 2, "shared": 0,
                    "max_tokens": 2, "resets": 0, "groups": "full,local", "attention_chunk_size": 1}
PROBES = (
    directed("hash_cached_twice_keeps_its_other_block",
             "a hash cached under two blocks still hits the second once the first is evicted", twice(5),
             CACHED_TWICE + (Decode(2), Schedule(1))),
    directed("hash_cached_twice_evicted_twice", "a hash cached under two blocks misses once both are evicted",
             twice(3), CACHED_TWICE + (Finish(2), Schedule(1))),
    directed("chunk_boundary_frees_the_last_chunk",
             "a chunked-local group frees the last chunk's blocks at each chunk boundary", CHUNKS,
             (Schedule(0), Decode(0), Decode(0))),
    directed("one_token_lookup_hits_the_null_chunk",
             "a one-token lookup in one-token chunks hits the null block for the chunked-local group", ONE_TOKEN_CHUNKS,
             (Schedule(0), Finish(0), Schedule(2))),
)


LOCKSTEP = Lockstep(
    installed=DRIVER,
    start=lambda ctx: configs(),
    sides=sides,
    operations=(Operation("step", lambda view: view.enabled()),),  # one of the actions the model enables
    steps=STEPS,
    probes=PROBES,
)
