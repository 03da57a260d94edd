"""vLLM #48195 on the real releases through `kvsim conform vllm` (target `connector_hit_48195`): the local computed
tokens the scheduler hands a KV connector for a hybrid (full attention + Mamba) request, on the release's own
coordinator imported in its child (`real_coordinator.CoordinatorDriver`: 0.27.0+ the release's
`get_computed_blocks_for_connector`; 0.26.0 the scheduler's branch, `max(per_group_hits)`, found in the release's
`scheduler.py`, run on the real coordinator's per-group hits).

The property `hybrid_hit_backed` (the model's step check): the connector's local tokens are no more than the
full-attention group's own hit, and its blocks cover them. It fails on 0.26.0 (the expected pre-fix verdict, read by
`kvsim.conform.releases`) and holds on 0.27.0 and later. The differential: the model (`Model`, the package's
`KVCacheManager` driven with the child's vocabulary) on the release's variant (`pre_48195` before 0.27.0) along the
same operations, compared on the property's verdict (the hits themselves are compared call by call in
tests/conform/vllm/test_conform_real_coordinator.py); the model's Mamba prefix-caching mode is the release's
(`MAMBA_RELEASES`: `all` before 0.33.0, as the child builds it, `align` from 0.33.0).
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.conformance.adapters import Check, Context, Sweep
from kvsim.engine.conformance.declare import variant_for
from kvsim.engine.errors import PropertyViolation
from kvsim.models.kv_cache_manager.kv_cache_manager import KVCacheManager, Request, connector_local_hit
from kvsim.models.kv_cache_manager.variants import VARIANTS

DRIVER = "kvsim.conform.vllm.real_coordinator:CoordinatorDriver"
PROPERTY = "hybrid_hit_backed"
# the model variant each release follows (#48195 / #48425 landed in 0.27.0)
RELEASES: tuple[tuple[str | None, str], ...] = ((None, "pre_48195"), ("0.27.0", "fixed"))
# the model variant of each release's Mamba prefix caching as the child builds it (`real_coordinator`: mode `all`
# where the release has it, the default of 0.26.0 and 0.27.0; else `align`): 0.33.0 is the first pinned release with `align` only
MAMBA_RELEASES: tuple[tuple[str | None, str], ...] = ((None, "mamba_all"), ("0.33.0", "fixed"))
BLOCK_SIZE, WINDOW = 2, 3
SCENARIOS = ("shared-first-block", "fill")


def fixed(release: str | None) -> bool:
    """The release carries the fix (the model's `fixed` variant; an unknown version counts as the newest)."""
    return variant_for(RELEASES, release) == "fixed"


def mamba_cache_mode(release: str | None) -> str:
    """The release's Mamba prefix-caching mode, as the model's variant flag reads it."""
    return VARIANTS[variant_for(MAMBA_RELEASES, release)].mamba_cache_mode


class Model:
    """The model's manager driven with the child's vocabulary (requests named, hits per group)."""

    def __init__(self, num_blocks: int, groups: list[str], release: str | None) -> None:
        self.m = KVCacheManager(num_blocks, BLOCK_SIZE, 4, tuple(groups), WINDOW, mamba_cache_mode(release))
        self.release = release
        self.ids: dict[str, int] = {}
        self.requests: dict[str, Request] = {}
        self.hit: dict[str, Any] = {}

    def request(self, name: str, tokens: list[int] | None = None) -> Request:
        if name not in self.requests:
            self.ids[name] = len(self.ids)
            self.requests[name] = Request(self.ids[name], list(tokens or ()), len(tokens or ()), 0, BLOCK_SIZE)
        return self.requests[name]

    @staticmethod
    def block_ids(blocks: Any) -> list[list[int]]:
        return [[b.block_id for b in group] for group in blocks]

    def computed(self, request: str, tokens: list[int]) -> dict:
        blocks, hit = self.m.get_computed_blocks(self.request(request, tokens))
        self.hit[request] = blocks
        return {"blocks": self.block_ids(blocks), "hit": hit}

    def allocate(self, request: str, new_tokens: int, computed_tokens: int = 0) -> dict:
        req = self.request(request)
        new = self.m.allocate_slots(req, new_tokens, computed_tokens, self.hit.pop(request, None))
        if new is not None:
            req.num_computed_tokens += computed_tokens + new_tokens
        return {"blocks": None if new is None else self.block_ids(new),
                "held": [list(g) for g in self.m.get_block_ids(req.request_id)]}

    def free(self, request: str) -> list[int]:
        """`free`, answering the first group's blocks it released, as the driver's `free` does."""
        req = self.requests.pop(request)
        held = list(self.m.get_block_ids(req.request_id)[0])
        self.m.free(req)
        return held

    def hits(self, request: str, tokens: list[int]) -> dict:
        req = Request(99, list(tokens), len(tokens), 0, BLOCK_SIZE)
        per_blocks, per_hits = self.m.coordinator.find_longest_cache_hit_per_group(req.block_hashes, len(tokens) - 1)
        blocks, hit = self.m.get_computed_blocks(req)
        cblocks, chit = connector_local_hit(self.m, req, fixed(self.release))
        return {"per_group": {"hits": list(per_hits), "blocks": self.block_ids(per_blocks)},
                "reconciled": {"hit": hit, "blocks": self.block_ids(blocks)},
                "connector": {"hit": chit, "blocks": self.block_ids(cblocks)}}

    def free_queue(self) -> list[int]:
        return [b.block_id for b in self.m.block_pool.free_block_queue.get_all_free_blocks()]


def connector_hit_backed(hits: dict, fa: int = 0) -> str | None:
    """The property on one `hits` answer: the connector's local tokens are no more than the full-attention group's
    own hit, and the full-attention blocks handed cover them."""
    connector, fa_hit = hits["connector"], hits["per_group"]["hits"][fa]
    if connector["hit"] > fa_hit:
        return f"connector handed {connector['hit']} local tokens, full attention backs {fa_hit}"
    if len(connector["blocks"][fa]) * BLOCK_SIZE < connector["hit"]:
        return f"connector handed {connector['hit']} local tokens with {len(connector['blocks'][fa])} full-attention " \
               "blocks"
    return None


def admit(side: Any, name: str, tokens: list[int]) -> dict:
    hit = side.computed(name, tokens) if isinstance(side, Model) else side.call("computed", request=name,
                                                                                 tokens=tokens)
    new_tokens, computed = len(tokens) - hit["hit"], hit["hit"]
    if isinstance(side, Model):
        return side.allocate(name, new_tokens, computed)
    return side.call("allocate", request=name, new_tokens=new_tokens, computed_tokens=computed)


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


def model(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    hits = run(Model(8, ["full", "mamba"], ctx.source.version), ["full", "mamba"], case["scenario"])[-1]
    return {"connector_hit_backed": connector_hit_backed(hits) is None}


def upstream(ctx: Context, case: dict[str, Any]) -> dict[str, Any]:
    hits = run(ctx.child, ["full", "mamba"], case["scenario"])[-1]
    problem = connector_hit_backed(hits)
    ctx.state.setdefault("problems", {})[case["scenario"]] = problem
    return {"connector_hit_backed": problem is None}


def check_backed(ctx: Context, case: dict[str, Any], answer: dict[str, Any]) -> None:
    problem = ctx.state["problems"][case["scenario"]]
    if problem is not None:
        raise PropertyViolation(f"{case['scenario']}: {problem}")


CONNECTOR_HIT = Sweep(
    installed=DRIVER,
    domain=lambda ctx: [{"scenario": s} for s in SCENARIOS],
    model=model, upstream=upstream,
    checks=(Check(PROPERTY, check_backed),),
    note=lambda ctx: f"model variant {variant_for(RELEASES, ctx.source.version)}; full attention + Mamba in mode "
                     f"{mamba_cache_mode(ctx.source.version)}, the scenarios shared-first-block and fill",
)
