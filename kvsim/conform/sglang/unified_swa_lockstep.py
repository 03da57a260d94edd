"""The radix-cache-swa model and SGLang's real `UnifiedRadixCache` (Full + SWA, `real_unified_swa.UnifiedSwaDriver`
in the installed child) in lockstep (target `unified_swa_lockstep`, one Hypothesis state machine of the engine,
`LOCKSTEP`): every tree and allocator call a model step makes is made on the real tree too, the step's answers
(each call's, in the model's slot names) compared, and after every step the two trees compared node by node with
the sizes; `verdicts_on_real` reads the model's lock invariants on the real tree's counts after a directed
program (the #28161 path).

The model's step records its calls (`Recording.watch`, the system's hook on each step's live tree and allocator):
the scheduler's own calls only (`match_prefix`, `insert`, `inc_lock_ref`, `dec_lock_ref`, `evict`, `alloc`,
`free`, and the early release `release_window`), not the calls they make inside. Slots and uuids are names: a
model full slot stands for the real slot the same `alloc` answered (`slots`), a model uuid for the real one the
same node carries (`uuids`); SWA slots are compared by presence and count only (a tombstone is `None` on both).

Each release runs against the variant of its code (`RELEASES`): 0.5.13 `pre_28161`, 0.5.14
`pre_locked_full_recovery`, 0.5.15 to 0.5.19 `fixed`, 0.5.20 on `tree_core`; on each the real answers and trees are
the model's, so `swa_lock_within_window`, read on the real tree, fails on 0.5.13 (the early release does not run)
and holds from 0.5.14 on. The full pool's free order is not the model's (the real allocator appends a freed slot,
the model takes the lowest): the slot names follow each allocation, a real slot handed out again dropping the
model name it had.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from hypothesis import strategies as st

from kvsim.engine.conformance.adapters import Context, Lockstep, Operation, SystemSide
from kvsim.engine.conformance.declare import release_tuple

from kvsim.models.radix_cache.swa_system import UnifiedSwaState, UnifiedSwaSystem
from kvsim.models.radix_cache.unified_swa import NodeState, SWATokenToKVPoolAllocator, UnifiedRadixCache

# #28161 first shipped in 0.5.14, the locked-Full tombstone recovery in 0.5.15, the TreeCore (segment locks, #38482)
# in 0.5.20; the unified cache's first release here is 0.5.13
RELEASES = ((None, "pre_28161"), ("0.5.14", "pre_locked_full_recovery"), ("0.5.15", "fixed"), ("0.5.20", "tree_core"))
FIRST = "0.5.13"
DRIVER = "kvsim.conform.sglang.real_unified_swa:UnifiedSwaDriver"
TREE_OPS = ("match_prefix", "insert", "inc_lock_ref", "dec_lock_ref", "evict")
ALLOC_OPS = ("alloc", "free")
MAMBA_OPS = {"alloc": "mamba_alloc", "free": "mamba_free"}  # the Mamba pool's allocator, under the names the driver has
NAMING = ("alloc", "mamba_alloc", "inc_lock_ref")  # calls whose answer names what later calls send (slots, a uuid)


STEPS = 24
SMALL = {"prompts": "0,1,0", "sliding_window_size": 1, "num_swa_slots": 4, "num_slots": 5, "max_tokens": 2}
# the model tests' default, tombstones, pressure, and two families in a window of 2 (a match crossing a tombstone
# into a node shorter than the window: the SWA validator's restart after a tombstone)
CONFIGS = ({}, SMALL, {**SMALL, "num_slots": 4}, {"prompts": "0,1", "num_swa_slots": 6, "num_slots": 6})
# with the Mamba component: two requests of one family (the early release and the final one on a shared node), the
# same with a Mamba pool of 3 (Mamba's own eviction), and two families under pressure (SWA tombstones cascading into
# Mamba states, retraction)
MAMBA_CONFIGS = ({"num_mamba_slots": 4}, {"num_mamba_slots": 3},
                 {"prompts": "0,1", "sliding_window_size": 1, "num_slots": 6, "num_swa_slots": 5, "max_tokens": 3,
                  "num_mamba_slots": 4})


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
        if tree.mamba is not None:
            for name, op in MAMBA_OPS.items():
                setattr(tree.mamba.allocator, name, self._recorded(op, getattr(tree.mamba.allocator, name)))

    def _recorded(self, name: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.depth += 1
            try:
                args += tuple(kwargs.values())  # dec_lock_ref's skip_swa, insert's mamba_value: keywords
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


def summary(op: str, args: tuple, answer: Any) -> Any:
    """What one call answered, as the two sides compare it (slots in the model's names; a lock's uuid by whether
    there is one; an unlock answers nothing)."""
    if op in ("alloc", "mamba_alloc"):
        return [op, None if answer is None else list(answer)]
    if op in ("free", "mamba_free"):
        return [op, list(args[0])]
    if op == "match_prefix":
        return [op, list(answer[0]), list(answer[1])]
    if op == "inc_lock_ref":
        return [op, answer is not None]
    if op == "dec_lock_ref":
        return [op, list(args[0])]
    if op == "insert":  # with a Mamba value: whether the node had a state too
        return [op, answer.prefix_len] + ([answer.mamba_exist] if len(args) > 3 else [])
    return [op, list(answer) if isinstance(answer, tuple) else answer]


class ModelSide(SystemSide):
    """The model's system (recording each step's calls), taking one of its actions a step."""

    def __init__(self, variant: str, values: dict) -> None:
        from kvsim.models.radix_cache import SWA_DESCRIPTOR

        base = SWA_DESCRIPTOR.build_system(variant, dict(values))
        self.system = Recording(base.variant, base.cfg)
        (self.state,) = self.system.initial_states()
        self.idle = False

    def call(self, op: str, action: Any) -> Any:
        self.transition(op, action)
        return [summary(*call) for call in self.system.calls]

    def observe(self) -> dict[str, Any]:
        t, a, mamba = self.state.tree, self.state.allocator, self.system.cfg.num_mamba_slots
        out = {"nodes": [{"path": list(n.path), "full_value": list(n.full_value), "full_lock_ref": n.full_lock_ref,
                          "swa_lock_ref": n.swa_lock_ref, "swa_len": None if n.swa_value is None else len(n.swa_value),
                          **({"mamba_value": None if n.mamba_value is None else list(n.mamba_value),
                              "mamba_lock_ref": n.mamba_lock_ref} if mamba else {})} for n in t.nodes],
               "sizes": {"full_available": len(a.full_free), "swa_available": len(a.swa_free),
                         "full_evictable": t.full_evictable_size, "full_protected": t.full_protected_size,
                         "swa_evictable": t.swa_evictable_size, "swa_protected": t.swa_protected_size}}
        if mamba:
            out["sizes"].update(mamba_available=len(self.state.mamba_free), mamba_evictable=t.mamba_evictable_size,
                                mamba_protected=t.mamba_protected_size)
        return out


class RealSide:
    """The real tree in the child, making each call the model's step made (`model.system.calls`, the step the
    engine has just taken on the model side) with the model's slots and uuids named as the real ones the same
    allocation and lock answered; its answers and tree read back in the model's names."""

    def __init__(self, child: Any, model: ModelSide) -> None:
        cfg = model.system.cfg
        self.child, self.model = child, model
        self.mamba = cfg.num_mamba_slots
        child.call("build", size=cfg.num_slots, size_swa=cfg.num_swa_slots, sliding_window_size=cfg.sliding_window_size,
                   mamba_size=self.mamba)
        self.slots: dict[int, int] = {}  # model full slot -> real full slot
        self.mamba_slots: dict[int, int] = {}  # model Mamba slot -> real Mamba slot
        self.uuids: dict[int, int] = {}  # model uuid (this step's numbering) -> real uuid
        self.real: dict = child.call("dump")

    def _named(self, real: Iterable[int], slots: dict[int, int] | None = None) -> list[Any]:
        names = {v: k for k, v in (self.slots if slots is None else slots).items()}
        return [names.get(x, f"real slot {x}") for x in real]

    @staticmethod
    def _follow(slots: dict[int, int], model: Any, real: Any) -> None:
        """The model's slots `model` are the real `real` the same allocation answered (a freed real slot handed
        out again drops the model name it had)."""
        if real is not None and model is not None and len(real) == len(model):
            for name in [k for k, v in slots.items() if v in real]:
                del slots[name]
            slots.update(zip(model, real))

    def call(self, op: str, action: Any) -> Any:
        """The model step's calls made on the real tree, each answer in the model's names, then the tree read
        back. The calls go to the child together (`calls`: the same calls in the same order) up to each whose
        answer names what later ones send (an allocation's slots, a lock's uuid), the read with the last."""
        out: list[Any] = []
        queued: list[tuple[tuple[str, dict[str, Any]], Callable[[Any], Any]]] = []  # a request, its answer's maker
        for call in self.model.system.calls:
            try:
                queued.append(self._request(*call))
            except KeyError as exc:  # a model slot no real allocation answered: the step's answers differ here
                self._made(queued, out)
                out.append([call[0], f"model slot {exc.args[0]} has no real slot"])
                break
            if call[0] in NAMING:
                self._made(queued, out)
        queued.append((("dump", {}), lambda real: real))
        self._made(queued, out)
        self.real = out.pop()
        # the model's next step numbers its uuids in path order: follow them to the real ones the nodes carry
        self.uuids = {n.swa_uuid: r["swa_uuid"] for n, r in zip(self.model.state.tree.nodes, self.real["nodes"])
                      if n.swa_uuid is not None and tuple(r["path"]) == n.path}
        return out

    def _made(self, queued: list[tuple[tuple[str, dict[str, Any]], Callable[[Any], Any]]], out: list[Any]) -> None:
        """The queued requests made in one round trip, each answer made the step's (in order: a naming one renames
        what the ones after it answer) onto `out`."""
        if queued:
            for (_, made), real in zip(queued, self.child.calls([request for request, _ in queued])):
                out.append(made(real))
            queued.clear()

    def _request(self, op: str, args: tuple, answer: Any) -> tuple[tuple[str, dict[str, Any]], Callable[[Any], Any]]:
        """The real request of the model's call `op` (a KeyError where it names a model slot no real one stands
        for), and what makes the step's answer of the real answer."""
        slot = self.slots
        if op in ("alloc", "mamba_alloc"):
            names = slot if op == "alloc" else self.mamba_slots

            def allocated(real: Any) -> Any:
                self._follow(names, answer, real)
                return [op, None if real is None else self._named(real, names)]
            return (op, {"n": args[0]}), allocated
        if op in ("free", "mamba_free"):
            names = slot if op == "free" else self.mamba_slots
            return (op, {"indices": [names[s] for s in args[0]]}), lambda real: [op, list(args[0])]
        if op == "match_prefix":
            return ("match", {"tokens": list(args[0])}), lambda real: [op, self._named(real["indices"]), real["node"]]
        if op == "insert":
            tokens, value, prev, *mamba = args
            extra = {"mamba_value": [self.mamba_slots[s] for s in mamba[0]]} if mamba else {}
            return (("insert", {"tokens": list(tokens), "indices": [slot[s] for s in value[:len(tokens)]],
                                "prev_prefix_len": prev, **extra}),
                    lambda real: [op, real["prefix_len"]] + ([real["mamba_exist"]] if mamba else []))
        if op == "inc_lock_ref":
            def locked(got: Any) -> Any:
                if answer is not None and got is not None:
                    self.uuids[answer] = got
                return [op, got is not None]
            return ("lock", {"node": list(args[0])}), locked
        if op == "dec_lock_ref":
            node, uuid, *skip = args
            return (("unlock", {"node": list(node), "swa_uuid_for_lock": self._uuid(uuid),
                                "skip_swa": bool(skip and skip[0])}), lambda real: [op, list(node)])
        if op == "evict":
            return (("evict", {"num_tokens": args[0], "swa_num_tokens": args[1], "mamba_num": (args[2:] or (0,))[0]}),
                    lambda real: [op, [real["full"], real["swa"]] + ([real["mamba"]] if self.mamba else [])])
        return (("release_window", {"node": list(args[0]), "swa_uuid_for_lock": self._uuid(args[1])}),
                lambda real: [op, real])

    def _uuid(self, uuid: Any) -> Any:
        return None if uuid is None else self.uuids.get(uuid, 0)

    def observe(self) -> dict[str, Any]:
        r = self.real
        mamba = ("mamba_available", "mamba_evictable", "mamba_protected") if self.mamba else ()
        return {"nodes": [{"path": n["path"], "full_value": self._named(n["full_value"]),
                           "full_lock_ref": n["full_lock_ref"], "swa_lock_ref": n["swa_lock_ref"],
                           "swa_len": None if n["swa_value"] is None else len(n["swa_value"]),
                           **({"mamba_value": None if n["mamba_value"] is None else
                               self._named(n["mamba_value"], self.mamba_slots),
                               "mamba_lock_ref": n["mamba_lock_ref"]} if self.mamba else {})} for n in r["nodes"]],
                "sizes": {k: r[k] for k in ("full_available", "swa_available", "full_evictable", "full_protected",
                                            "swa_evictable", "swa_protected") + mamba}}


def sides(ctx: Context, start: dict[str, Any]) -> tuple[ModelSide, RealSide]:
    model = ModelSide(ctx.variant.name, start)
    return model, RealSide(ctx.child, model)


def verdicts_on_real(child: Any, variant: str, program: Iterable[tuple], values: dict | None = None) \
        -> list[dict[str, str | None]]:
    """The model's lock invariants after each action of `program`, read on the model's state with the real tree's
    lock counts and sizes in it (both sides stepped as the lockstep steps them; a divergence raises)."""
    model = ModelSide(variant, dict(values or {}))
    real = RealSide(child, model)
    verdicts = []
    for i, action in enumerate(program):
        seen = [model.call("step", action), real.call("step", action)]
        if seen[0] != seen[1] or model.observe() != real.observe():
            raise AssertionError(f"step {i} {action}: model {seen[0]} {model.observe()}, real {seen[1]} "
                                 f"{real.observe()}")
        nodes = {tuple(r["path"]): r for r in real.real["nodes"]}
        tree = model.state.tree
        state = model.state._replace(tree=tree._replace(
            nodes=tuple(n._replace(full_lock_ref=nodes[n.path]["full_lock_ref"],
                                   swa_lock_ref=nodes[n.path]["swa_lock_ref"],
                                   mamba_lock_ref=nodes[n.path].get("mamba_lock_ref", 0)) for n in tree.nodes),
            full_protected_size=real.real["full_protected"], full_evictable_size=real.real["full_evictable"],
            mamba_protected_size=real.real.get("mamba_protected", 0),
            mamba_evictable_size=real.real.get("mamba_evictable", 0)))
        names = ("lock_order", "full_lock_refs", "swa_lock_within_window", "mamba_lock_refs")
        verdicts.append({i.name: i.check(state) for i in model.system.invariants if i.name in names})
    return verdicts


def skip(ctx: Context) -> tuple[str, str] | None:
    version = release_tuple(ctx.source.version)
    if version is None or version < release_tuple(FIRST):  # type: ignore[operator]
        return ("skipped", f"{ctx.source.label}: the driver's unified cache is that of {FIRST} and later releases")
    return None


LOCKSTEP = Lockstep(
    installed=DRIVER,
    skip=skip,
    start=lambda ctx: st.sampled_from(CONFIGS + MAMBA_CONFIGS),
    sides=sides,
    operations=(Operation("step", lambda view: view.enabled()),),  # one of the actions the model enables
    steps=STEPS,
)
