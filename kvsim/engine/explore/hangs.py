"""The liveness pass of a partitioned search (`kvsim.engine.explore.parallel`), spread over its workers.

`explore`'s pass (`cannot_finish`) marks every state from which a done state, an unexpanded one or a
violation can be reached, following predecessors backwards, and calls the rest hung. Here each worker
indexes the predecessors of its own states (from the reverse edges it recorded while absorbing) and
marks its own, round after round: a predecessor that another worker owns is sent to it, by the same
mail as the search's states (`kvsim.engine.pools`). The pass is over when a round sends nothing. The
coordinator passes on the outboxes and adds up the counts: it holds no edge.

A worker's first round, where it marks from its own ends (most of the pass), runs as `backward.hung_states`
does: from `BULK` reverse edges up to `MOST`, its index and its marking are numpy's, a level at a
time, until `backward.SMALL` small levels in a row hand the rest to the walk in Python (the only way outside
those bounds, and in every later round: a few states each).
"""

from __future__ import annotations

from array import array
from typing import Any, Sequence

from .backward import FEW, SMALL, gather, predecessors
from .store import ENDS


# reverse edges of a worker from which its first round runs in numpy (`backward.BULK` is one process's): each worker
# imports numpy for it, about 0.17 s of CPU, and its pass walks about 0.4 us an edge where the levels take under 0.2;
# up to MOST, as the levels' arrays hold about 32 bytes an edge for a moment where the walk's index holds 8 (the
# reverse edges themselves hold 16, and the memory bound is checked between levels of the search, not in this pass)
BULK = 1 << 20
MOST = 1 << 24


class HangRounds:
    """A partition's side of the pass. Reads the partition's `n`, `w`, `flags` (bit 0 done, 1 a violation,
    2 expanded, 3 has a successor), `depth`, `rev_src`/`rev_dst` (global ids) and `mail`; keeps `alive`."""

    n: int
    w: int
    flags: bytearray
    depth: array
    rev_src: array
    rev_dst: array
    mail: Any
    alive: bytearray | None

    def hang_round(self, inbox: Sequence[Any]) -> tuple[list[Any], int]:
        """One round of the liveness pass (`cannot_finish`, spread over the workers): the states of ours in
        `inbox` (local ids, from other workers) can reach an alive state, and so can every predecessor of an
        alive state. Marks them and their predecessors of ours, and returns (one outbox per worker of its
        predecessors found here, as `mail.post` hands it on; how many were sent). The first round, with an
        empty inbox, starts from our states that are done, unexpanded or a violation. The pass is over
        when a round sends nothing."""
        n, w = self.n, self.w
        boxes = [array("q") for _ in range(n)]
        wave = self._start(boxes) if self.alive is None else []
        alive, count, preds = self.alive, self.pred_count, self.preds
        for payload in self.mail.fetch(inbox):
            for lid in array("q", payload or b""):
                if not alive[lid]:
                    alive[lid] = 1
                    wave.append(lid)
        while wave:
            lid = wave.pop()
            for k in range(count[lid], count[lid + 1]):
                p = preds[k]
                owner, plid = p % n, p // n
                if owner != w:
                    boxes[owner].append(plid)
                elif not alive[plid]:
                    alive[plid] = 1
                    wave.append(plid)
        post = self.mail.post
        return ([None if o == w else post(box.tobytes()) for o, box in enumerate(boxes)],
                sum(len(box) for box in boxes))

    def _start(self, boxes: list[array]) -> list[int]:
        """The first round's start: `alive` (our ends, where the pass starts), the predecessors' index, and the
        states marked whose predecessors the walk takes next; in numpy (module doc), the states of ours marked
        meanwhile, and the predecessors found of other workers' (their local ids, once each) put in `boxes`."""
        n, w, size = self.n, self.w, len(self.flags)
        self.alive = self.flags.translate(ENDS)
        if not BULK <= len(self.rev_dst) <= MOST:
            self._index_predecessors()
            return [lid for lid, live in enumerate(self.alive) if live]
        import numpy as np

        first, preds = predecessors(size, np.frombuffer(self.rev_src, dtype=np.int64),
                                    np.frombuffer(self.rev_dst, dtype=np.int64) // n)
        marked = np.frombuffer(self.alive, dtype=np.uint8)  # marked in place
        level, small, away = np.flatnonzero(marked), 0, []
        while len(level) and small < SMALL:
            small = small + 1 if len(level) < FEW else 0
            found = gather(first, preds, level)
            ours = found % n == w
            away.append(found[~ours])
            found = found[ours] // n
            level = np.unique(found[marked[found] == 0])
            marked[level] = 1
        if away:
            others = np.unique(np.concatenate(away))
            for owner, box in enumerate(boxes):
                if owner != w:
                    box.frombytes((others[others % n == owner] // n).tobytes())
        self.pred_count, self.preds = array("q"), array("q")  # (copied from the buffers: no bytes between)
        self.pred_count.frombytes(memoryview(first).cast("B"))
        self.preds.frombytes(memoryview(preds).cast("B"))
        return level.tolist()

    def _index_predecessors(self) -> None:
        """Our states' predecessors (global ids) as one compressed array, from the reverse edges."""
        n, size = self.n, len(self.flags)
        count = array("I", bytes(4 * (size + 1)))
        for d in self.rev_dst:
            count[d // n + 1] += 1
        for i in range(size):
            count[i + 1] += count[i]
        fill = array("I", count)
        preds = array("q", bytes(8 * count[size]))
        for src, d in zip(self.rev_src, self.rev_dst):
            lid = d // n
            preds[fill[lid]] = src
            fill[lid] += 1
        self.pred_count, self.preds = count, preds

    def hangs(self) -> tuple[int, tuple[int, int] | None, bool]:
        """After the liveness pass: (how many of our states cannot reach an alive one, (depth, global id) of
        the first by depth, whether it has a successor: a livelock rather than a deadlock)."""
        hung = [lid for lid, live in enumerate(self.alive) if not live]
        if not hung:
            return 0, None, False
        lid = min(hung, key=lambda i: self.depth[i])
        return len(hung), (self.depth[lid], lid * self.n + self.w), bool(self.flags[lid] & 8)


def spread_hangs(pool: Any, n: int) -> list[tuple[int, tuple[int, int] | None, bool]]:
    """Run the pass over the `n` partitions of `pool` until a round sends nothing: each one's `hangs()`."""
    inboxes: list[list[Any]] = [[] for _ in range(n)]
    while True:
        rounds = pool.call("hang_round", [(inboxes[w],) for w in range(n)])
        if not any(sent for _, sent in rounds):
            return pool.call("hangs", [()] * n)
        inboxes = [[rounds[src][0][dst] for src in range(n)] for dst in range(n)]
