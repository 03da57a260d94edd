"""The radix-cache-swa model and SGLang's real `UnifiedRadixCache` (Full + SWA, `real_unified_swa.UnifiedSwaDriver`
in the installed child) in lockstep: every tree and allocator call a model step makes is made on the real tree
too, each answer compared, and after every step the two trees compared node by node; the model's lock
invariants are then checked on the real tree's counts.

The model's step records its calls (`Recording.watch`, the system's hook on each step's live tree and allocator):
the scheduler's own calls only (`match_prefix`, `insert`, `inc_lock_ref`, `dec_lock_ref`, `evict`, `alloc`,
`free`, and the early release `release_window`), not the calls they make inside. Slots and uuids are names: a
model full slot stands for the real slot the same `alloc` answered (`slots`), a model uuid for the real one the
same node carries (`uuids`); SWA slots are compared by presence and count only (a tombstone is `None` on both).

Release 0.5.13 runs against variant `pre_28161`, 0.5.14 against `fixed`: on each the real answers and trees are
the model's, so `swa_lock_within_window`, read on the real tree, fails on 0.5.13 (the early release does not run)
and holds on 0.5.14.
"""

from __future__ import annotations

from typing import Any, Iterable

from kvsim.models.radix_cache.swa_system import UnifiedSwaState, UnifiedSwaSystem
from kvsim.models.radix_cache.unified_swa import NodeState, SWATokenToKVPoolAllocator, UnifiedRadixCache

RELEASES = {"0.5.13": "pre_28161", "0.5.14": "fixed"}
DRIVER = "kvsim.conform.sglang.real_unified_swa:UnifiedSwaDriver"
TREE_OPS = ("match_prefix", "insert", "inc_lock_ref", "dec_lock_ref", "evict")
ALLOC_OPS = ("alloc", "free")


class Diverged(AssertionError):
    """The real cache answered or holds otherwise than the model: the step, the call and both sides."""


class Recording(UnifiedSwaSystem):
    """The model's system, recording the scheduler's calls of each step as (op, arguments, model answer)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, tuple, Any]] = []
        self.depth = 0

    def watch(self, tree: UnifiedRadixCache, alloc: SWATokenToKVPoolAllocator) -> None:
        self.calls = []
        for obj, names in ((tree, TREE_OPS), (alloc, ALLOC_OPS)):
            for name in names:
                setattr(obj, name, self._recorded(name, getattr(obj, name)))

    def _recorded(self, name: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.depth += 1
            try:
                args += tuple(kwargs.values())  # dec_lock_ref's skip_swa: the one keyword the system passes
                # a node by its path and a list (a request's row, rewritten later in the step) as they are now
                shown = tuple(a.path() if hasattr(a, "path") else tuple(a) if isinstance(a, list) else a for a in args)
                answer = method(*args)
            finally:
                self.depth -= 1
            if self.depth == 0:  # a match's node by its path too
                self.calls.append((name, shown, (answer[0], answer[1].path()) if name == "match_prefix" else answer))
            return answer
        return call

    def release_window(self, tree: UnifiedRadixCache, node: Any, swa_uuid_for_lock: int) -> bool:
        path = node.path()
        ran = super().release_window(tree, node, swa_uuid_for_lock)
        self.calls.append(("release_window", (path, swa_uuid_for_lock), ran))
        return ran


class Lockstep:
    """One model system and one real tree, built alike; `run(actions)` steps both."""

    def __init__(self, child: Any, variant: str, values: dict | None = None) -> None:
        from kvsim.models.radix_cache import SWA_DESCRIPTOR

        base = SWA_DESCRIPTOR.build_system(variant, dict(values or {}))
        self.system = Recording(base.variant, base.cfg)
        self.child = child
        cfg = self.system.cfg
        child.call("build", size=cfg.num_slots, size_swa=cfg.num_swa_slots,
                   sliding_window_size=cfg.sliding_window_size)
        self.state: UnifiedSwaState = self.system.initial_states()[0]
        self.slots: dict[int, int] = {}  # model full slot -> real full slot
        self.uuids: dict[int, int] = {}  # model uuid (this step's numbering) -> real uuid
        self.real: dict = child.call("dump")

    def run(self, actions: Iterable[tuple]) -> list[dict[str, str | None]]:
        """Step both through `actions`; after each, the model's lock invariants read on the real tree."""
        verdicts = []
        for i, action in enumerate(actions):
            self.state = self.system.step(self.state, action)
            for call in self.system.calls:
                self._replay(i, action, *call)
            self.real = self.child.call("dump")
            self._compare(i, action)
            verdicts.append(self.verdicts())
        return verdicts

    def _uuid(self, uuid: Any) -> Any:
        return None if uuid is None else self.uuids.get(uuid, 0)

    def _replay(self, i: int, action: tuple, op: str, args: tuple, answer: Any) -> None:
        c, slot = self.child, self.slots
        if op == "alloc":
            real = c.call("alloc", n=args[0])
            if (real is None) != (answer is None) or (real and len(real) != len(answer)):
                raise Diverged(f"step {i} {action}: alloc({args[0]}): model {answer}, real {real}")
            slot.update(zip(answer or (), real or ()))
            return
        if op == "free":
            c.call("free", indices=[slot[s] for s in args[0]])
            return
        if op == "match_prefix":
            real = c.call("match", tokens=list(args[0]))
            got, want = (real["indices"], real["node"]), ([slot[s] for s in answer[0]], list(answer[1]))
        elif op == "insert":
            tokens, value, prev = args
            got = c.call("insert", tokens=list(tokens), indices=[slot[s] for s in value[:len(tokens)]],
                         prev_prefix_len=prev)["prefix_len"]
            want = answer
        elif op == "inc_lock_ref":
            got = c.call("lock", node=list(args[0]))
            if answer is not None and got is not None:
                self.uuids[answer] = got
            want = got if (answer is None) == (got is None) else answer
        elif op == "dec_lock_ref":
            node, uuid, *skip = args
            got = want = c.call("unlock", node=list(node), swa_uuid_for_lock=self._uuid(uuid),
                                skip_swa=bool(skip and skip[0]))
        elif op == "evict":
            real = c.call("evict", num_tokens=args[0], swa_num_tokens=args[1])
            got, want = (real["full"], real["swa"]), tuple(answer)
        else:  # release_window
            got, want = c.call("release_window", node=list(args[0]), swa_uuid_for_lock=self._uuid(args[1])), answer
        if got != want:
            raise Diverged(f"step {i} {action}: {op}{args}: model {want}, real {got}")

    def _compare(self, i: int, action: tuple) -> None:
        model = [self._node_view(n) for n in self.state.tree.nodes]
        real = [{k: r[k] for k in ("path", "full_value", "full_lock_ref", "swa_lock_ref")} |
                {"swa_len": None if r["swa_value"] is None else len(r["swa_value"])} for r in self.real["nodes"]]
        t, a = self.state.tree, self.state.allocator
        sizes = {"full_available": len(a.full_free), "swa_available": len(a.swa_free),
                 "full_evictable": t.full_evictable_size, "full_protected": t.full_protected_size,
                 "swa_evictable": t.swa_evictable_size, "swa_protected": t.swa_protected_size}
        real_sizes = {k: self.real[k] for k in sizes}
        if model != real or sizes != real_sizes:
            raise Diverged(f"step {i} {action}: model {model} {sizes}, real {real} {real_sizes}")
        # the model's next step numbers its uuids in path order: follow them to the real ones the nodes carry
        self.uuids = {n.swa_uuid: r["swa_uuid"] for n, r in zip(self.state.tree.nodes, self.real["nodes"])
                      if n.swa_uuid is not None}

    def _node_view(self, n: NodeState) -> dict:
        return {"path": list(n.path), "full_value": [self.slots[s] for s in n.full_value],
                "full_lock_ref": n.full_lock_ref, "swa_lock_ref": n.swa_lock_ref,
                "swa_len": None if n.swa_value is None else len(n.swa_value)}

    def verdicts(self) -> dict[str, str | None]:
        """The model's lock invariants on the model's state with the real tree's lock counts in its nodes."""
        real = {tuple(r["path"]): r for r in self.real["nodes"]}
        nodes = tuple(n._replace(full_lock_ref=real[n.path]["full_lock_ref"],
                                 swa_lock_ref=real[n.path]["swa_lock_ref"]) for n in self.state.tree.nodes)
        state = self.state._replace(tree=self.state.tree._replace(
            nodes=nodes, full_protected_size=self.real["full_protected"],
            full_evictable_size=self.real["full_evictable"]))
        names = ("lock_order", "full_lock_refs", "swa_lock_within_window")
        return {i.name: i.check(state) for i in self.system.invariants if i.name in names}
