"""The liveness pass of a partitioned search (`kvsim.engine.explore.parallel`), spread over its workers.

`explore`'s pass (`cannot_finish`) marks every state from which a done state, an unexpanded one or a
violation can be reached, following predecessors backwards, and calls the rest hung. Here each worker
indexes the predecessors of its own states (from the reverse edges it recorded while absorbing) and
marks its own, round after round: a predecessor that another worker owns is sent to it, by the same
mail as the search's states (`kvsim.engine.pools`). The pass is over when a round sends nothing. The
coordinator passes on the outboxes and adds up the counts: it holds no edge.
"""

from __future__ import annotations

from array import array
from typing import Any, Sequence


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
        if self.alive is None:
            self._index_predecessors()
            wave = [lid for lid, live in enumerate(self.alive) if live]
        else:
            wave = []
        alive, count, preds = self.alive, self.pred_count, self.preds
        for payload in self.mail.fetch(inbox):
            for lid in array("q", payload or b""):
                if not alive[lid]:
                    alive[lid] = 1
                    wave.append(lid)
        boxes = [array("q") for _ in range(n)]
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
        self.alive = bytearray(1 if f & 1 or not f & 4 or f & 2 else 0 for f in self.flags)

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
