"""vLLM #48195 on the real releases through `kvsim conform vllm` (target `connector_hit_48195`): the local computed
tokens the real `Scheduler.schedule()` hands a KV connector for a hybrid (full attention + Mamba) request, on the
release's own scheduler imported in its child (`real_scheduler.SchedulerDriver`, built over the two groups with a
connector that records what its `get_num_new_matched_tokens` got and what the scheduler's block pool caches for the
request then). 0.26.0's `schedule` takes `max(per_group_hits)`; 0.27.0+ `get_computed_blocks_for_connector`
(from 0.30.0 only for a connector whose `supports_divergent_local_hybrid_hits` is True, as NIXL's is: the recording
connector says so, else 0.30.0+ would take `get_computed_blocks` and never run the fix).

The program (`through_scheduler`): request A (two full blocks) runs and finishes, B runs its prefill and `decodes`
decode steps, then C (A's prompt and `c_extra` tokens) is scheduled; the pool is small, so B's blocks evict A's, and
the groups' hits of C part (a Mamba state cached deeper than full attention's blocks, or the other way round) on
some of the swept cases (`cases()`: the groups, the pool, B's decodes, C's length).

The property `hybrid_hit_backed` (the model's `checks.connector_hit_backed`, its step check on the connector's hit)
on the real scheduler's record: the tokens handed are ones the full-attention group caches blocks for under the
request's hashes. It fails on 0.26.0 (the expected pre-fix verdict, read by `kvsim.conform.releases`) and holds on
0.27.0 and later. The differential: the model (`Model`, the package's `KVCacheManager` driven with the driver's
vocabulary) on the release's variant (`pre_48195` before 0.27.0) along the same requests, compared on the
property's verdict (the coordinator's hits themselves are compared call by call in
tests/conform/vllm/test_conform_real_coordinator.py, on `real_coordinator.CoordinatorDriver`) and on whether the
connector got full attention's hit where the record shows it the deepest (`full_attention_handed`), and on the local
tokens handed where the release's Mamba prefix caching is mode `all` or there is no Mamba group (`MAMBA_RELEASES`:
before 0.33.0; the model runs the release's mode, but on 0.33.0's `align` the real scheduler also splits prefills
at Mamba block boundaries, which the program on the model does not, so the two records may differ in shape).
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

from kvsim.engine.conformance.adapters import Check, Context, Sweep
from kvsim.engine.conformance.declare import variant_for
from kvsim.engine.errors import KvsimError, PropertyViolation
from kvsim.models.kv_cache_manager.checks import connector_hit_backed
from kvsim.models.kv_cache_manager.kv_cache_manager import KVCacheManager, Request, connector_local_hit
from kvsim.models.kv_cache_manager.scheduler import mamba_block_aligned_split
from kvsim.models.kv_cache_manager.variants import VARIANTS

from .real_scheduler import OUTPUT_TOKEN

DRIVER = "kvsim.conform.vllm.real_scheduler:SchedulerDriver"
COORDINATOR = "kvsim.conform.vllm.real_coordinator:CoordinatorDriver"  # the per-call comparison's driver
PROPERTY = "hybrid_hit_backed"
# the model variant each release follows (#48195 / #48425 landed in 0.27.0)
RELEASES: tuple[tuple[str | None, str], ...] = ((None, "pre_48195"), ("0.27.0", "fixed"))
# the model variant of each release's Mamba prefix caching as the child builds it (`real_coordinator`: mode `all`
# where the release has it, the default of 0.26.0 and 0.27.0; else `align`): 0.33.0 is the first pinned release with `align` only
MAMBA_RELEASES: tuple[tuple[str | None, str], ...] = ((None, "mamba_all"), ("0.33.0", "fixed"))
BLOCK_SIZE, WINDOW = 2, 3
SCENARIOS = ("shared-first-block", "fill")  # the coordinator's
GROUPS = ("full", "mamba")
NUM_BLOCKS = 8
DECODES = (0, 1, 2)  # B's decode steps before C arrives: the scheduler's cases
A, B, C_TOKEN = [1, 1, 2, 2], [5] * 5, 9
# the swept cases, smallest first: the bug's three (C one token past A, after 0, 1 or 2 of B's decode steps), then
# C of A's prompt alone (its hit stops a block short: the lookup's `num_tokens - 1`) with the groups' hits equal and
# with Mamba lagging full attention (upstream's `hit_diverged`: the connector is handed full attention's hit), full
# attention with a sliding window (no Mamba layers: the manager's reconciled hit, which the window cuts short of
# full attention's), a sliding window with Mamba (no full-attention group) and Mamba alone (one group: the
# manager's unitary coordinator), and blocks of one token in a pool of 12 (A's first step, on an empty pool, and
# before 0.33.0 C's, every group's hit 0 after B's evictions, start at 0, so a shared-prefix junction the lookup
# reported would lie inside the chunk: 0.33.0's Mamba split stops there). The CI profile runs these;
# KVSIM_PROFILE=dev adds `DEV_CASES`: the groups in the other order, a larger pool, B's third decode, C two past A.
CASES: tuple[dict[str, Any], ...] = (
    *({"groups": list(GROUPS), "num_blocks": NUM_BLOCKS, "decodes": k, "c_extra": 1} for k in DECODES),
    {"groups": list(GROUPS), "num_blocks": NUM_BLOCKS, "decodes": 0, "c_extra": 0},
    {"groups": list(GROUPS), "num_blocks": NUM_BLOCKS, "decodes": 1, "c_extra": 0},
    {"groups": ["full", "swa"], "num_blocks": 10, "decodes": 0, "c_extra": 0},
    {"groups": ["swa", "mamba"], "num_blocks": NUM_BLOCKS, "decodes": 0, "c_extra": 1},
    {"groups": ["mamba"], "num_blocks": NUM_BLOCKS, "decodes": 0, "c_extra": 1},
    {"groups": list(GROUPS), "num_blocks": 12, "decodes": 1, "c_extra": 0, "block_size": 1},
)
DEV_CASES: tuple[dict[str, Any], ...] = tuple(
    {"groups": groups, "num_blocks": n, "decodes": k, "c_extra": c}
    for groups in (["full", "mamba"], ["mamba", "full"], ["full", "swa"], ["swa", "mamba"])
    for n in (NUM_BLOCKS, 10) for k in (0, 1, 2, 3) for c in (0, 1, 2)
    if {"groups": groups, "num_blocks": n, "decodes": k, "c_extra": c} not in CASES)


def cases() -> tuple[dict[str, Any], ...]:
    return CASES + (DEV_CASES if os.environ.get("KVSIM_PROFILE") == "dev" else ())


def fixed(release: str | None) -> bool:
    """The release carries the fix (the model's `fixed` variant; an unknown version counts as the newest)."""
    return variant_for(RELEASES, release) == "fixed"


def model_mamba_mode(release: str | None) -> str:
    """The release's Mamba prefix-caching mode as the model's variant table has it (the child reads the loaded
    release's own, `real_manager.mamba_cache_mode`)."""
    return VARIANTS[variant_for(MAMBA_RELEASES, release)].mamba_cache_mode


class Model:
    """The model's manager driven with the child's vocabulary (requests named, hits per group)."""

    def __init__(self, num_blocks: int, groups: list[str], release: str | None, block_size: int = BLOCK_SIZE) -> None:
        self.m = KVCacheManager(num_blocks, block_size, 4, tuple(groups), WINDOW, model_mamba_mode(release))
        self.release, self.block_size = release, block_size
        self.ids: dict[str, int] = {}
        self.requests: dict[str, Request] = {}
        self.hit: dict[str, Any] = {}

    def request(self, name: str, tokens: list[int] | None = None) -> Request:
        if name not in self.requests:
            self.ids[name] = len(self.ids)
            self.requests[name] = Request(self.ids[name], list(tokens or ()), len(tokens or ()), 0, self.block_size)
        return self.requests[name]

    @staticmethod
    def block_ids(blocks: Any) -> list[list[int]]:
        return [[b.block_id for b in group] for group in blocks]

    def computed(self, request: str, tokens: list[int]) -> dict:
        blocks, hit = self.m.get_computed_blocks(self.request(request, tokens))
        self.hit[request] = blocks
        return {"blocks": self.block_ids(blocks), "hit": hit}

    def allocate(self, request: str, new_tokens: int, computed_tokens: int = 0, lookahead: int = 0) -> dict:
        req = self.request(request)
        new = self.m.allocate_slots(req, new_tokens, computed_tokens, self.hit.pop(request, None), lookahead)
        if new is not None:
            req.num_computed_tokens += computed_tokens + new_tokens
        return {"blocks": None if new is None else self.block_ids(new),
                "held": [list(g) for g in self.m.get_block_ids(req.request_id)]}

    def free(self, request: str) -> list[list[int]]:
        """`free`, answering every group's blocks it released, as the driver's `free` does after `build_hybrid`."""
        req = self.requests.pop(request)
        held = [list(g) for g in self.m.get_block_ids(req.request_id)]
        self.m.free(req)
        return held

    def finish(self, request: str) -> list[int]:
        """A request's end in a scheduler with a KV connector: the blocks its window skips freed before the
        hand-off (`remove_skipped_blocks` at its computed tokens), then `free`."""
        req = self.requests[request]
        self.m.remove_skipped_blocks(req.request_id, req.num_computed_tokens)
        return self.free(request)

    def hits(self, request: str, tokens: list[int]) -> dict:
        req = Request(99, list(tokens), len(tokens), 0, self.block_size)
        per_blocks, per_hits = self.m.coordinator.find_longest_cache_hit_per_group(req.block_hashes, len(tokens) - 1)
        blocks, hit = self.m.get_computed_blocks(req)
        answer = {"per_group": {"hits": list(per_hits), "blocks": self.block_ids(per_blocks)},
                  "reconciled": {"hit": hit, "blocks": self.block_ids(blocks)}, "connector": None}
        if fixed(self.release):  # the manager's get_computed_blocks_for_connector (before it, the scheduler's)
            cblocks, chit = connector_local_hit(self.m, req, True)
            answer["connector"] = {"hit": chit, "blocks": self.block_ids(cblocks)}
        return answer

    def free_queue(self) -> list[int]:
        return [b.block_id for b in self.m.block_pool.free_block_queue.get_all_free_blocks()]


def admit(side: Any, name: str, tokens: list[int], lookahead: int = 0) -> dict:
    """A new request: its hit, then slots for the rest of its tokens and `lookahead` more."""
    hit = side.computed(name, tokens) if isinstance(side, Model) else side.call("computed", request=name,
                                                                                 tokens=tokens)
    new_tokens, computed = len(tokens) - hit["hit"], hit["hit"]
    if isinstance(side, Model):
        return side.allocate(name, new_tokens, computed, lookahead)
    return side.call("allocate", request=name, new_tokens=new_tokens, computed_tokens=computed, lookahead=lookahead)


def decode(side: Any, name: str, token: int) -> dict:
    """One decode step of a running request: its sampled token appended, one slot for it."""
    if isinstance(side, Model):
        side.requests[name].all_token_ids.append(token)
        return side.allocate(name, 1)
    return side.call("decode", request=name, token=token)


def run(side: Any, groups: list[str], scenario: str) -> list:
    """The operations, on the real child or the model; every answer and the free queue after each, in order; the
    last entry is the lookup whose connector hit the property judges."""
    real = not isinstance(side, Model)
    call = (lambda op, **kw: side.call(op, **kw)) if real else (lambda op, **kw: getattr(side, op)(**kw))
    queue = (lambda: side.call("observe")["free"]) if real else side.free_queue
    log: list = []
    if real:
        side.call("build_hybrid", num_blocks=8, block_size=BLOCK_SIZE, groups=groups, sliding_window=WINDOW)
    if scenario == "shared-first-block":  # the explorer's path: A, A finishes, B shares A's first block, A again
        a = [1, 1, 2, 2, 2]
        log += [admit(side, "a", a), queue()]
        call("free", request="a")
        log += [queue(), admit(side, "b", [1, 1, 3, 3, 3]), queue(), call("hits", request="c", tokens=a)]
    elif scenario == "gap":  # B extends A's prompt by more than a block: its hit ends before a padded block (Mamba
        # `align`: a null gap between the hit's state and the new one), and B's next step frees the hit's state
        a = [1, 1, 2, 2]
        log += [admit(side, "a", a), queue()]
        call("free", request="a")
        log += [queue(), admit(side, "b", a + [3, 3, 3]), queue(), decode(side, "b", 6), queue(),
                call("hits", request="c", tokens=a + [3, 3, 3, 6, 9])]
    else:  # "fill": A (two full blocks) finishes; B decodes until a lookup of A's prompt sees the groups part
        a = [1, 1, 2, 2]
        log += [admit(side, "a", a), queue()]
        call("free", request="a")
        log += [queue(), admit(side, "b", [5] * 5), queue()]
        for _ in range(4):
            hits = call("hits", request="c", tokens=a + [9])
            log.append(hits)
            hit_per_group = hits["per_group"]["hits"]
            if any(h > hit_per_group[0] for h in hit_per_group):
                break
            log.append(decode(side, "b", 6))
    return log


# -- through the real scheduler --------------------------------------------------------------------------------

def through_scheduler(child: Any, decodes: int, groups: tuple[str, ...] = GROUPS, num_blocks: int = NUM_BLOCKS,
                      c_extra: int = 1, block_size: int = BLOCK_SIZE) -> dict[str, Any]:
    """The program on the real scheduler (`child` runs `SchedulerDriver`) over `groups` and `num_blocks` blocks: A
    runs to its end, B runs `decodes` + 1 steps (its prefill, then decodes), C (A's prompt and `c_extra` tokens) is
    scheduled. Answers C's record of `get_num_new_matched_tokens` (`local_tokens`, and per group the request's keys
    beside the pool's cached block hashes then), the tokens C's first step schedules, the statuses, the
    release's Mamba caching mode (null without a Mamba group) and `first_steps`: for A and C, the record of the
    request's first lookup and the tokens its first step computed (0: it did not fit and waits)."""
    built = child.call("build", num_blocks=num_blocks, block_size=block_size, groups=list(groups),
                       sliding_window=WINDOW)
    child.call("add", request="a", tokens=A, max_tokens=1)
    first = {"a": child.call("schedule")["scheduled"].get("a", 0)}
    child.call("output")
    child.call("add", request="b", tokens=B, max_tokens=16)
    for _ in range(decodes + 1):  # B's prefill, then its decodes
        child.call("schedule")
        child.call("output")
    child.call("add", request="c", tokens=c_prompt(c_extra), max_tokens=1)
    first["c"] = scheduled = child.call("schedule")["scheduled"].get("c", 0)
    state = child.call("output")
    asked = {m["request"]: m for m in reversed(state["matched"])}  # each request's first record
    if "c" not in asked:  # the program's premise, not the property: C reaches the connector in its first step
        raise KvsimError(f"decodes={decodes}: the scheduler never asked the connector about request c")
    return {"matched": asked["c"], "scheduled": scheduled, "status": state["status"],
            "mamba_cache_mode": built["mamba_cache_mode"],
            "first_steps": {r: (asked[r], first[r]) for r in ("a", "c")}}


def c_prompt(c_extra: int) -> list[int]:
    """C's prompt: A's and `c_extra` more tokens (none: A's own, whose last block the hit leaves to compute)."""
    return A + [C_TOKEN] * c_extra


def backed(matched: dict[str, Any], groups: tuple[str, ...] = GROUPS, block_size: int = BLOCK_SIZE) -> str | None:
    """The model's check on one record of the connector: the local tokens handed, against the blocks the pool
    caches at the call (for each group, under the request's hashes keyed for it, up to the first it lacks)."""
    records = matched["groups"]
    hit = [list(itertools.takewhile(lambda h: h is not None, g["cached"])) for g in records]
    return connector_hit_backed(groups, hit, [g["keys"] for g in records], matched["local_tokens"], block_size,
                                WINDOW)


def parted(matched: dict[str, Any]) -> bool:
    """The groups' hits part on the record: a Mamba state cached for a block full attention has none for."""
    full, mamba = (g for g in matched["groups"])
    return any(m is not None and f is None for f, m in zip(full["cached"], mamba["cached"]))


def on_model(release: str | None, decodes: int, groups: tuple[str, ...] = GROUPS, num_blocks: int = NUM_BLOCKS,
             c_extra: int = 1, block_size: int = BLOCK_SIZE) -> dict[str, Any]:
    """The program on the model's manager (the release's variant): the record's shape, from the model."""
    side = Model(num_blocks, list(groups), release, block_size)
    admit(side, "a", A)
    side.finish("a")
    admit(side, "b", B)
    for _ in range(decodes + 1):  # the step after each of B's steps allocates the slot of its sampled token
        decode(side, "b", OUTPUT_TOKEN)
    m = side.m
    prompt = c_prompt(c_extra)
    req = Request(99, prompt, len(prompt), 0, block_size)
    _, local = connector_local_hit(m, req, fixed(release))
    records = []
    for g in range(len(groups)):
        keys = [m.block_pool.key(h, g) for h in req.block_hashes]
        cached = [m.block_pool.get_cached_block(k) for k in keys]
        records.append({"keys": keys, "cached": [None if b is None else b.block_hash for b in cached]})
    return {"request": "c", "local_tokens": local, "groups": records}


def record_hits(matched: dict[str, Any], groups: tuple[str, ...], num_tokens: int, block_size: int = BLOCK_SIZE) \
        -> list[int | None]:
    """Each group's hit read off a connector record, in tokens, as its manager's `find_longest_cache_hit` finds it
    up to `num_tokens - 1` (the request's own lookup): full attention the cached blocks from the first, Mamba the
    deepest block cached (its state is the hit); None for a group whose hit needs more than the record (a sliding
    window's run of cached blocks in its window)."""
    max_blocks = (num_tokens - 1) // block_size
    hits: list[int | None] = []
    for kind, record in zip(groups, matched["groups"]):
        cached = [h is not None for h in record["cached"][:max_blocks]]
        if kind == "full":
            hits.append(len(list(itertools.takewhile(bool, cached))) * block_size)
        elif kind == "mamba":
            hits.append(max((i + 1 for i, c in enumerate(cached) if c), default=0) * block_size)
        else:
            hits.append(None)
    return hits


def full_attention_handed(matched: dict[str, Any], groups: tuple[str, ...], num_tokens: int,
                          block_size: int = BLOCK_SIZE) -> bool | None:
    """Where full attention's hit is the deepest (no group hit past it), the connector is handed exactly that hit
    (0.27.0+ `get_computed_blocks_for_connector`; 0.26.0's maximum over the groups is the same there); a lagging
    Mamba group is `hit_diverged`, left to the connector. None where the record does not tell (no full-attention
    group, a group whose hit it does not give, or a group past full attention's: the reconciled hit, which
    `hybrid_hit_backed` judges)."""
    hits = record_hits(matched, groups, num_tokens, block_size)
    if "full" not in groups or None in hits:
        return None
    fa = hits[groups.index("full")]
    if any(h > fa for h in hits):  # type: ignore[operator]
        return None
    return matched["local_tokens"] == fa


def first_step_as_stated(matched: dict[str, Any], scheduled: int, groups: tuple[str, ...], num_tokens: int,
                         block_size: int, mamba_cache_mode: str | None) -> bool | None:
    """Where every group's hit on a request's first record is the same (the connector's hit is then the one the
    scheduler takes, with no shared-prefix junction: `get_computed_blocks_for_connector`'s boundary 0, a single
    group's lookup, none), the request's first step computes what the model's scheduler states for that hit: the
    rest of its prompt, or in Mamba's mode `align` the split at Mamba blocks (`scheduler.mamba_block_aligned_split`,
    junction 0). None where the record does not tell (the hits part, a sliding window's hit, or the step did not
    fit: the model's program states no pool pressure here)."""
    hits = record_hits(matched, groups, num_tokens, block_size)
    if None in hits or len(set(hits)) != 1 or not scheduled:
        return None
    start = matched["local_tokens"]
    stated = mamba_block_aligned_split(start, num_tokens - start, num_tokens, num_tokens, block_size) \
        if mamba_cache_mode == "align" else num_tokens - start
    return scheduled == stated


def compared(matched: dict[str, Any], case: dict[str, Any], mamba_cache_mode: str | None,
             first_steps: dict[str, tuple[dict[str, Any], int]] | None = None) -> dict[str, Any]:
    """What the differential compares: the property's verdict and whether full attention's hit, where the record
    shows it the deepest, is what the connector got (`full_attention_handed`; the model's manager hands it by
    construction, so this holds wherever the two records differ in shape), and whether A's and C's first steps,
    where every group's hit is the same, compute what the model's scheduler states (`first_step_as_stated`;
    `first_steps` None: the model's own program, which schedules as stated), on every release; where the model states the release's
    Mamba caching (mode `all`, or no Mamba group), the local tokens handed too."""
    groups, block_size, num_tokens = tuple(case["groups"]), case_block_size(case), len(c_prompt(case["c_extra"]))
    handed = full_attention_handed(matched, groups, num_tokens, block_size)
    prompts = {"a": len(A), "c": num_tokens}
    splits = [first_step_as_stated(record, n, groups, prompts[r], block_size, mamba_cache_mode)
              for r, (record, n) in (first_steps or {}).items()]
    got: dict[str, Any] = {"connector_hit_backed": backed(matched, groups, block_size) is None,
                           "full_attention_hit_handed": handed is not False,
                           "first_steps_as_stated": False not in splits}
    if mamba_cache_mode in ("all", None):
        got["local_tokens"] = matched["local_tokens"]
    return got


def case_block_size(case: dict[str, Any]) -> int:
    return case.get("block_size", BLOCK_SIZE)


def program(case: dict[str, Any]) -> dict[str, Any]:
    return {"decodes": case["decodes"], "groups": tuple(case["groups"]), "num_blocks": case["num_blocks"],
            "c_extra": case["c_extra"], "block_size": case_block_size(case)}


def model(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    mode = model_mamba_mode(ctx.source.version) if "mamba" in case["groups"] else None
    return compared(on_model(ctx.source.version, **program(case)), case, mode)


def upstream(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    got = through_scheduler(ctx.child, **program(case))
    ctx.state.setdefault("problems", {})[json.dumps(case, sort_keys=True)] = backed(
        got["matched"], tuple(case["groups"]), case_block_size(case))
    return compared(got["matched"], case, got["mamba_cache_mode"], got["first_steps"])


def check_backed(ctx: Context, case: dict[str, Any], answer: dict[str, Any]) -> None:
    problem = ctx.state["problems"][json.dumps(case, sort_keys=True)]
    if problem is not None:
        raise PropertyViolation(f"{case_label(case)}: {problem}")


def case_label(case: dict[str, Any]) -> str:
    return (f"groups={','.join(case['groups'])} num_blocks={case['num_blocks']} decodes={case['decodes']} "
            f"c_extra={case['c_extra']}" + (f" block_size={case['block_size']}" if "block_size" in case else ""))


CONNECTOR_HIT = Sweep(
    installed=DRIVER,
    domain=lambda ctx: list(cases()),
    model=model, upstream=upstream,
    checks=(Check(PROPERTY, check_backed),),
    note=lambda ctx: f"model variant {variant_for(RELEASES, ctx.source.version)}; the real Scheduler over full "
                     f"attention + Mamba in mode {model_mamba_mode(ctx.source.version)} (and the other group "
                     f"pairs), {len(cases())} cases: C after B's decode steps, in a pool of 8 to 12 blocks",
)
