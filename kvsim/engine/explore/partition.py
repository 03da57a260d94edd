"""One worker's share of a partitioned search (`kvsim.engine.explore.parallel`): its states, and its side of a level.

The state space is partitioned: a state belongs to worker `hash(state) % W` when every worker
hashes alike (forked processes do: same string secret, same addresses for None and the other
objects hashed by identity; the coordinator checks), else to worker
`fingerprint(state) % W` (BLAKE2b of its `repr`: `fingerprint.text_fingerprint_function`, the same in any process).
In *expand*, a worker takes the successors of its frontier and sorts them into one outbox per owner
(each distinct successor is routed once, and a fingerprint taken to route it travels with it). In
*absorb*, it takes its inbox (the outboxes addressed to it, in worker order), keeps the states it
has not seen (its own visited set, full states or fingerprints as in `kvsim.engine.explore.store`), checks
every invariant on them (and each reachability declaration not yet met) and makes them its next frontier. With the fingerprint store an outbox holds
keys and edges only: the owner asks for the states it finds new (`absorb`), their senders send them
(`serve`), and the owner checks them (`receive`), so a state already known never travels. The
outbox a worker addresses to itself never leaves it (neither pickled nor sent); the others go by
its `mail` (`kvsim.engine.pools`). Automatic garbage collection is off in a worker
(`memory.YoungCollections`, a tick a level). A global state id is `local * W + worker`.
"""

from __future__ import annotations

import importlib
import pickle
from array import array
from typing import Any, Callable, Sequence

from ..memory import YoungCollections, machine, resident_bytes
from ..pools import Mail
from ..shared import sees
from ..system import sometimes
from .checkpoint import code_digest, dump, load
from .hangs import HangRounds
from .search import action_kind
from .fingerprint import text_fingerprint_function
from .store import FingerprintSet, Interner


Entry = tuple[Any, "int | None", list[tuple[int, int]]]  # an outbox's state, its fingerprint if taken, its edges


class Partition(HangRounds):
    """One worker's share of the search: its visited set, flags, reverse edges and frontier."""

    def __init__(self, factory: Callable[[], Any], worker: int, workers: int, store: str, symmetry: bool,
                 max_depth: int | None, mail: Mail | None = None, lines: Any = None) -> None:
        self.system = factory()
        self.lines = lines  # line coverage of the search (not of building the system), measured here, if asked
        if lines is not None:
            lines.start()
        self.mail = Mail() if mail is None else mail
        self.w, self.n = worker, workers
        self.canon = getattr(self.system, "canonical", None) if symmetry else None
        self.fp = text_fingerprint_function(self.system)
        self.max_depth = max_depth
        self.full = store == "full"
        self.ids: dict[Any, int] | FingerprintSet = {} if self.full else FingerprintSet()
        self.parent = array("q")
        self.index = array("I")
        self.depth = array("I")
        self.flags = bytearray()  # bit 0 done, bit 1 bad, bit 2 expanded, bit 3 has a successor
        self.rev_src = array("q")  # reverse edges: (source gid -> target gid) for every transition into ours
        self.rev_dst = array("q")
        self.frontier: list[tuple[int, Any]] = []
        self.intern = Interner()  # the states this worker holds share their equal fields
        self.fired: dict[str, int] = {}
        self.checked = [0] * len(self.system.invariants)
        goals = sometimes(self.system)  # the `Sometimes` no worker has met yet: of states, of steps
        self.pending = [k for k, goal in enumerate(goals) if not goal.step]
        self.moves = [k for k, goal in enumerate(goals) if goal.step]
        self.collector = YoungCollections()  # as in `explore`; a tick each level, closed by `finish`
        self.own: list[Entry] = []  # this level's successors that are our own
        self.alive: bytearray | None = None  # the liveness pass (`HangRounds`): can reach a done state
        # a level's exchange with the fingerprint store: the states sent for only as they turn out new
        self.held: list[list[Any]] = []  # per worker: the states of what `expand` addressed to it, by position
        self.arriving: list[Any] = []  # this level's new states, in id order (None: sent for, not here yet)
        self.awaiting: list[list[int]] = []  # per worker: where in `arriving` the states it is asked for go
        if not self.full:  # the fingerprint is the key the owner needs: taken once, by the sender
            self.route_by_fingerprint()

    def owner(self, state: Any) -> tuple[int, int | None]:
        """(the worker a state belongs to, its fingerprint where that was taken to route it)."""
        return hash(state) % self.n, None

    def secret(self) -> int:
        """Equal in every worker iff they hash alike: the string secret, and None's hash (its address in 3.11)."""
        return hash((None, "kvsim partition"))

    def route_by_fingerprint(self) -> None:
        fp, n = self.fp, self.n

        def owner(state: Any) -> tuple[int, int]:
            key = fp(state)
            return key % n, key

        self.owner = owner  # type: ignore[method-assign]

    def _step(self, state: Any, action: Any) -> Any:
        nxt = self.system.step(state, action)
        return nxt if self.canon is None else self.canon(nxt)

    def initial(self) -> list[bytes]:
        """The initial states, routed like successors (only worker 0 is asked)."""
        boxes: list[list[Entry]] = [[] for _ in range(self.n)]
        seen: dict[Any, list[tuple[int, int]]] = {}
        for k, state in enumerate(self.system.initial_states()):
            state = state if self.canon is None else self.canon(state)
            edges = seen.get(state)
            if edges is None:
                edges = seen[state] = []
                dst, key = self.owner(state)
                boxes[dst].append((state, key, edges))
            edges.append((-1, k))
        return [pickle.dumps(box, protocol=pickle.HIGHEST_PROTOCOL) for box in boxes]

    def expand(self) -> tuple[list[Any], int, int, dict[int, int]]:
        """(one pickled outbox per owner, as `mail.post` hands it on, transitions taken, states cut by the depth
        bound, the step `Sometimes` met: index -> the gid of the first source state here) for this level.

        A successor reached from several frontier states goes once, with every (parent, action index)
        that reaches it, in the order they were found: the first is its breadth-first parent. Its owner
        is found once (and its fingerprint, when that routes it, travels with it: the owner does not
        take it again). The outbox addressed to this worker stays here as it is (None in its place):
        `absorb` takes it back.
        """
        self.collector.tick()
        boxes: list[list[Entry]] = [[] for _ in range(self.n)]
        level: dict[Any, list[tuple[int, int]]] = {}  # this level's successors, whoever owns them
        transitions = cut = 0
        fired, enabled, owner, step, canon = self.fired, self.system.enabled, self.owner, self.system.step, self.canon
        goals, met = sometimes(self.system), {}
        for lid, state in self.frontier:
            if self.max_depth is not None and self.depth[lid] >= self.max_depth:
                cut += 1
                continue
            gid = lid * self.n + self.w
            actions = enabled(state)
            for index, action in enumerate(actions):
                nxt = step(state, action)
                if self.moves:
                    hit = [k for k in self.moves if goals[k].check(state, action, nxt)]
                    if hit:
                        met.update((k, gid) for k in hit)
                        self.met(hit)
                if canon is not None:
                    nxt = canon(nxt)
                edges = level.get(nxt)
                if edges is None:
                    edges = level[nxt] = []
                    dst, key = owner(nxt)
                    boxes[dst].append((nxt, key, edges))
                edges.append((gid, index))
                kind = action_kind(action)
                fired[kind] = fired.get(kind, 0) + 1
                transitions += 1
            self.flags[lid] |= 12 if actions else 4
        self.frontier = []
        self.own = boxes[self.w]
        if not self.full:  # only keys and edges go now: a state goes once its owner finds it new (`serve`)
            own = self.w
            self.held = [[] if dst == own else [e[0] for e in box] for dst, box in enumerate(boxes)]
            boxes = [[] if dst == own else [(None, key, edges) for _, key, edges in box]
                     for dst, box in enumerate(boxes)]
        post = self.mail.post
        return ([None if dst == self.w else post(pickle.dumps(box, protocol=pickle.HIGHEST_PROTOCOL))
                 for dst, box in enumerate(boxes)], transitions, cut, met)

    def absorb(self, inbox: Sequence[Any], depth: int) -> list[list[int]]:
        """Take in this level's inbox (outboxes in worker order): a state not seen before gets the next id,
        every edge its reverse edge. Returns, per worker, the positions in the outbox it sent of the new
        states that came without their state (the fingerprint store sends keys first): `serve` sends
        those, `receive` checks them all."""
        asked: list[list[int]] = [[] for _ in range(self.n)]
        self.awaiting = [[] for _ in range(self.n)]
        self.arriving = []
        for src, payload in enumerate(self.mail.fetch(inbox)):
            for i, (state, key, edges) in enumerate(self.own if payload is None else pickle.loads(payload)):
                key = state if self.full else key  # the fingerprint store routes by it (`route_by_fingerprint`)
                lid = self.ids.get(key)
                if lid is None:
                    lid = len(self.parent)
                    if state is not None:
                        state = self.intern(state)  # held until the next level: its equal parts shared
                    if self.full:
                        self.ids[state] = lid
                    else:
                        self.ids.put(key, lid)
                    parent, index = edges[0]
                    self.parent.append(parent)
                    self.index.append(index)
                    self.depth.append(depth)
                    if state is None:
                        asked[src].append(i)
                        self.awaiting[src].append(len(self.arriving))
                    self.arriving.append(state)
                gid = lid * self.n + self.w
                for parent, _ in edges:
                    if parent >= 0:
                        self.rev_src.append(parent)
                        self.rev_dst.append(gid)
        self.own = []
        return asked

    def serve(self, asked: Sequence[Sequence[int]]) -> list[Any]:
        """Per worker, the states it asked for (positions in the outbox sent to it), as `mail.post` hands
        them on; None where it asked for none."""
        post = self.mail.post
        out = [None if not positions else post(pickle.dumps([self.held[dst][i] for i in positions],
                                                            protocol=pickle.HIGHEST_PROTOCOL))
               for dst, positions in enumerate(asked)]
        self.held = []
        return out

    def receive(self, inbox: Sequence[Any]) -> tuple[int, list[tuple[str, str, int, int]], int, dict[int, int]]:
        """Put the states served in their places, then check this level's new states in id order: (how
        many, violations as (invariant, message, gid, depth), this worker's resident bytes (the
        coordinator's memory bound reads them), and the reachability declarations met: index -> the gid
        of the first state here that met it)."""
        for src, payload in enumerate(self.mail.fetch(inbox)):
            if payload is not None:
                for at, state in zip(self.awaiting[src], pickle.loads(payload)):
                    self.arriving[at] = self.intern(state)
        found: list[tuple[str, str, int, int]] = []
        invariants, done = self.system.invariants, self.system.done
        goals, met = sometimes(self.system), {}
        first = len(self.parent) - len(self.arriving)
        for lid, state in enumerate(self.arriving, start=first):
            flag = 1 if done(state) else 0
            for k, inv in enumerate(invariants):
                self.checked[k] += 1
                message = inv.check(state)
                if message is not None:
                    flag |= 2
                    found.append((inv.name, message, lid * self.n + self.w, self.depth[lid]))
                    break
            self.flags.append(flag)
            if not flag & 2:
                self.frontier.append((lid, state))
            if self.pending:
                now = [k for k in self.pending if goals[k].check(state)]
                if now:
                    met.update((k, lid * self.n + self.w) for k in now)
                    self.met(now)
        new, self.arriving, self.awaiting = len(self.arriving), [], []
        return new, found, resident_bytes(), met

    def met(self, indices: Sequence[int]) -> None:
        """Ask no more of these reachability declarations (a worker met them)."""
        self.pending = [k for k in self.pending if k not in indices]
        self.moves = [k for k in self.moves if k not in indices]

    SAVED = ("ids", "parent", "index", "depth", "flags", "rev_src", "rev_dst", "frontier", "fired", "checked",
             "pending", "moves")

    def save(self, path: str, key: bytes) -> None:
        """Write this partition (between two levels) to `path`, authenticated with the checkpoint's `key` (the
        coordinator's, which a worker on another machine has no copy of), for `load` in a resumed search."""
        dump(path, key, {name: getattr(self, name) for name in self.SAVED})

    def load(self, path: str, key: bytes) -> None:
        saved = load(path, key, 1)[0]
        for name in self.SAVED:
            setattr(self, name, saved[name])

    @staticmethod
    def memory() -> int:
        """This worker's resident bytes (the coordinator's memory bound, when a resumed search starts)."""
        return resident_bytes()

    @staticmethod
    def sees(probe: str, token: str, reply: str) -> bool:
        """Whether this worker shares the coordinator's checkpoint folder (`CheckpointDir.unshared`)."""
        return sees(probe, token, reply)

    @staticmethod
    def code() -> str:
        """A digest of the kvsim this worker runs (the engine's and every model's sources): on a cluster, each
        node's installed kvsim must be the coordinator's, or the workers would search another system."""
        return code_digest(importlib.import_module("kvsim.engine"), importlib.import_module("kvsim.models"))

    @staticmethod
    def machine() -> tuple[str, int]:
        """The machine this worker runs on, and its memory: the memory bound holds on each machine."""
        return machine()

    def trail(self, gid: int) -> tuple[int, int, int]:
        """(parent gid, enabled-action index, depth) of one of this worker's states."""
        lid = gid // self.n
        return self.parent[lid], self.index[lid], self.depth[lid]

    def finish(self) -> dict[str, Any]:
        """Counters and memory; the collector back as it was."""
        self.collector.close()
        store_bytes = (self.ids.nbytes() if not self.full else 0) + len(self.flags) + sum(
            a.itemsize * len(a) for a in (self.parent, self.index, self.depth))
        return {"fired": self.fired, "checked": self.checked, "store_bytes": store_bytes, "states": len(self.parent),
                "lines": None if self.lines is None else self.lines.stop()}
