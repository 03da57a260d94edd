"""One worker's share of a partitioned search (`kvsim.engine.explore.parallel`): its states, and its side of a level.

The state space is partitioned: a state belongs to worker `fingerprint % W`, its fingerprint the one a
single process keeps (`fingerprint.fingerprint_function`: from its fields' codes, the same in any process and
under any PYTHONHASHSEED), taken from its parent's as a single process takes it. In *expand*, a worker takes
the successors of its frontier (a symmetric model's in their canonical form, taken once for each successor as
stepped that it met this level or lately, not once a transition) and sorts them into one outbox per owner
(each distinct successor is routed once, and its fingerprint travels with it: the owner keeps it, and takes
its successors' from it). Which worker owns a state picks which of several shortest paths is reported; as no
worker routes by `hash`, that is the same in every run, with either store. In
*absorb*, it takes its inbox (the outboxes addressed to it, in worker order), keeps the states it
has not seen (its own visited set, full states or fingerprints as in `kvsim.engine.explore.store`), checks
every invariant on them (and each reachability declaration not yet met) and makes them its next frontier. With the fingerprint store an outbox holds
keys and edges only: the owner asks for the states it finds new and did not reach itself (`absorb`), their
senders send them (`serve`), and the owner checks them (`receive`), so a state already known never travels. The
outbox a worker addresses to itself never leaves it (neither pickled nor sent); the others go by
its `mail` (`kvsim.engine.pools`). Automatic garbage collection is off in a worker
(`memory.YoungCollections`, a tick a level). A global state id is `local * W + worker`.
"""

from __future__ import annotations

import importlib
import pickle
from array import array
from collections import _count_elements as count  # the C loop of `Counter.update`
from itertools import chain, repeat
from typing import Any, Callable, Sequence

from ..memory import YoungCollections, machine, resident_bytes
from ..pools import Mail
from ..shared import sees
from ..system import sometimes
from .checkpoint import code_digest, dump, load
from .hangs import HangRounds
from .search import action_kind
from .fingerprint import fingerprint_function
from .store import FingerprintSet, Interner, Recent


# An outbox: its states (None: the fingerprint store's to another worker, whose owner asks for the new ones),
# their fingerprints, how many edges each has, and the edges' parent gids and action indices, in order. Flat
# arrays pickle as their bytes, where a list of tuples pickles (and unpickles) item by item.
Box = tuple["list[Any] | None", array, array, array, array]


def boxed(states: list[Any], keys: list[int], edges: list[list[int]]) -> Box:
    """An outbox of these states, their fingerprints and each one's edges ((parent gid, action index) pairs, flat)."""
    flat = list(chain.from_iterable(edges))
    return (states, array("Q", keys), array("I", [len(pairs) >> 1 for pairs in edges]), array("q", flat[::2]),
            array("I", flat[1::2]))


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
        self.fp = fingerprint_function(self.system)  # routes a state, and keys it in the fingerprint store
        # the fingerprints of the successors met at the last levels (a symmetric model's: the successors as stepped
        # -> their canonical form's fingerprint, and the form): most successors that are not new this level were
        # reached at one of the levels before (a state found already, which its owner is sent again)
        self.prints = Recent()
        self.max_depth = max_depth
        self.full = store == "full"
        self.ids: dict[Any, int] | FingerprintSet = {} if self.full else FingerprintSet()
        self.parent = array("q")
        self.index = array("I")
        self.depth = array("I")
        self.flags = bytearray()  # bit 0 done, bit 1 bad, bit 2 expanded, bit 3 has a successor
        self.rev_src = array("q")  # reverse edges: (source gid -> target gid) for every transition into ours
        self.rev_dst = array("q")
        self.frontier: list[tuple[int, Any, int]] = []  # (local id, state, fingerprint)
        self.intern = Interner()  # the states this worker holds share their equal fields
        self.fired: dict[str, int] = {}
        self.checked = [0] * len(self.system.invariants)
        goals = sometimes(self.system)  # the `Sometimes` no worker has met yet: of states, of steps
        self.pending = [k for k, goal in enumerate(goals) if not goal.step]
        self.moves = [k for k, goal in enumerate(goals) if goal.step]
        self.collector = YoungCollections()  # as in `explore`; a tick each level, closed by `finish`
        self.own: Box | None = None  # this level's successors that are our own
        self.alive: bytearray | None = None  # the liveness pass (`HangRounds`): can reach a done state
        # a level's exchange with the fingerprint store: the states sent for only as they turn out new
        self.held: list[list[Any]] = []  # per worker: the states of what `expand` addressed to it, by position
        self.arriving: list[Any] = []  # this level's new states, in id order (None: sent for, not here yet)
        self.keys: list[int] = []  # their fingerprints
        self.awaiting: list[list[int]] = []  # per worker: where in `arriving` the states it is asked for go

    def initial(self) -> list[bytes]:
        """The initial states, routed like successors (only worker 0 is asked)."""
        boxes: list[tuple[list[Any], list[int], list[list[int]]]] = [([], [], []) for _ in range(self.n)]
        seen: dict[Any, list[int]] = {}
        for k, state in enumerate(self.system.initial_states()):
            state = state if self.canon is None else self.canon(state)
            edges = seen.get(state)
            if edges is None:
                edges = seen[state] = []
                key = self.fp(state)
                states, keys, lists = boxes[key % self.n]
                states.append(state)
                keys.append(key)
                lists.append(edges)
            edges += (-1, k)
        return [pickle.dumps(boxed(*box), protocol=pickle.HIGHEST_PROTOCOL) for box in boxes]

    def expand(self) -> tuple[list[Any], int, int, dict[int, int]]:
        """(one pickled outbox per owner, as `mail.post` hands it on, transitions taken, states cut by the depth
        bound, the step `Sometimes` met: index -> the gid of the first source state here) for this level.

        A successor reached from several frontier states goes once, with every (parent, action index)
        that reaches it, in the order they were found: the first is its breadth-first parent (a symmetric
        model's successors as stepped go once each: two with one canonical form are two entries of that
        form, which its owner takes as one state, the first entry's first edge its parent). Its
        fingerprint is taken once, from its first parent's (`FieldFingerprint.successor`), and travels with
        it: its owner routes nothing again and keeps it. The outbox addressed to this worker stays here as
        it is (None in its place): `absorb` takes it back.
        """
        self.collector.tick()
        n = self.n
        states: list[list[Any]] = [[] for _ in range(n)]  # per owner: this level's successors it owns
        keys: list[list[int]] = [[] for _ in range(n)]  # their fingerprints
        lists: list[list[list[int]]] = [[] for _ in range(n)]  # their edges: (parent gid, action index), flat
        level: dict[Any, list[int]] = {}  # this level's successors, whoever owns them -> their edges
        transitions = cut = 0
        enabled, step, canon = self.system.enabled, self.system.step, self.canon
        expanding, successor, held, claim = self.fp.expanding, self.fp.successor, self.fp.held, level.setdefault
        # the fingerprint store: a successor is made of the fields its fingerprint holds, as they are at hand here
        # (the frontier then shares its equal parts; the full store interns what it keeps in `absorb`)
        intern, share = self.intern, not self.full
        prints = self.prints
        printed = prints.get
        taken: dict[Any, int] = {}  # transitions taken per action (`_tally` counts them by kind)
        goals, met = sometimes(self.system), {}
        spare: list[int] = []
        for lid, state, key in self.frontier:
            if self.max_depth is not None and self.depth[lid] >= self.max_depth:
                cut += 1
                continue
            gid = lid * n + self.w
            expanding(state, key)
            actions = enabled(state)
            for index, action in enumerate(actions):
                nxt = step(state, action)
                if self.moves:
                    hit = [k for k in self.moves if goals[k].check(state, action, nxt)]
                    if hit:
                        met.update((k, gid) for k in hit)
                        self.met(hit)
                edges = claim(nxt, spare)  # one hash of the successor as stepped, found or not
                if edges is spare:
                    spare = []
                    if canon is None:
                        fp = printed(nxt)
                        if fp is None:
                            fp = successor(nxt)
                            if share:  # (one met at a level before, `printed`, is known to its owner: never new)
                                nxt = held(nxt) or intern(nxt)
                            prints.put(nxt, fp)
                    else:  # its canonical form, and that form's fingerprint
                        known = printed(nxt)
                        if known is None:
                            rep = canon(nxt)
                            fp = successor(rep)
                            if share:
                                rep = held(rep) or intern(rep)
                            prints.put(nxt, (fp, rep))
                        else:
                            fp, rep = known
                        nxt = rep
                    dst = fp % n
                    states[dst].append(nxt)
                    keys[dst].append(fp)
                    lists[dst].append(edges)
                edges += (gid, index)
            transitions += len(actions)
            try:
                count(taken, actions)  # by action, in C
            except TypeError:  # an action with no hash
                _tally(self.fired, ((a, 1) for a in actions))
            self.flags[lid] |= 12 if actions else 4
        _tally(self.fired, taken.items())
        self.frontier = []
        level.clear()
        boxes = [boxed(*box) for box in zip(states, keys, lists)]
        self.own = boxes[self.w]
        if not self.full:  # only keys and edges go now: a state goes once its owner finds it new (`serve`)
            self.held = states
            boxes = [(None, *box[1:]) for box in boxes]
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
        arriving, new_keys, full, ids, n, w = self.arriving, self.keys, self.full, self.ids, self.n, self.w
        parents, indices, depths = self.parent, self.index, self.depth
        # the fingerprint store: a new state that came as a key from a worker before this one in the inbox, and
        # that this worker reached too, is taken from its own outbox, not asked for (it need not travel)
        mine = None if full or w == 0 or self.own is None else dict(zip(self.own[1], self.own[0]))
        for src, payload in enumerate(self.mail.fetch(inbox)):
            states, keys, counts, sources, actions = self.own if payload is None else pickle.loads(payload)
            gids = []
            at = 0  # where this entry's edges start
            for i, key in enumerate(keys):
                state = None if states is None else states[i]
                lid = ids.get(state if full else key)
                if lid is None:
                    lid = len(parents)
                    if full:  # kept: its equal parts shared (the fingerprint store's successors: `expand`)
                        state = self.intern(state)
                        ids[state] = lid
                    else:
                        if state is None and mine is not None:
                            state = mine.get(key)
                        elif state is not None and payload is not None:  # an initial state, sent whole
                            state = self.hold(state)
                        ids.put(key, lid)
                    parents.append(sources[at])
                    indices.append(actions[at])
                    depths.append(depth)
                    if state is None:
                        asked[src].append(i)
                        self.awaiting[src].append(len(arriving))
                    arriving.append(state)
                    new_keys.append(key)
                gids.append(lid * n + w)
                at += counts[i]
            if depth:  # every edge's reverse edge (the initial states' edges come from no state)
                self.rev_src.extend(sources)
                self.rev_dst.extend(chain.from_iterable(map(repeat, gids, counts)))
        self.own = None
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
                    self.arriving[at] = self.hold(state)
        found: list[tuple[str, str, int, int]] = []
        invariants, done = self.system.invariants, self.system.done
        checks = [inv.check for inv in invariants]
        stopped = [0] * len(checks)  # states where invariant k failed (the later ones were not asked)
        goals, met = sometimes(self.system), {}
        first = len(self.parent) - len(self.arriving)
        flags, frontier = self.flags, self.frontier
        for lid, state, key in zip(range(first, len(self.parent)), self.arriving, self.keys):
            flag = 1 if done(state) else 0
            for check in checks:
                message = check(state)
                if message is not None:  # rare: which invariant, only now
                    k = next(j for j, c in enumerate(checks) if c is check)
                    stopped[k] += 1
                    flag |= 2
                    found.append((invariants[k].name, message, lid * self.n + self.w, self.depth[lid]))
                    break
            flags.append(flag)
            if not flag & 2:
                frontier.append((lid, state, key))
            if self.pending:
                now = [k for k in self.pending if goals[k].check(state)]
                if now:
                    met.update((k, lid * self.n + self.w) for k in now)
                    self.met(now)
        total = len(self.arriving)
        for k, stops in enumerate(stopped):  # every state was asked invariant k but those an earlier one stopped
            self.checked[k] += total
            total -= stops
        new, self.arriving, self.keys, self.awaiting = len(self.arriving), [], [], []
        return new, found, resident_bytes(), met

    def hold(self, state: Any) -> Any:
        """A new state another worker sent (the fingerprint store), made of the equal field values this worker
        holds: its fingerprint's, as the successors `expand` makes are (`FieldFingerprint.held`), or interned."""
        self.fp(state)
        return self.fp.held(state) or self.intern(state)

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


def _tally(fired: dict[str, int], taken: Any) -> None:
    """Add (action, times taken) pairs to `fired`, by the action's kind (`action_kind`)."""
    for action, times in taken:
        kind = action_kind(action)
        fired[kind] = fired.get(kind, 0) + times
