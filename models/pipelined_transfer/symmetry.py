"""The requests of pipelined-transfer are interchangeable: relabelling and one representative per orbit.

Nothing in the system depends on a request's number except which entry of
each per-request tuple it reads: a request's context view (`reqs`), its
sessions (`tx`), writes and result frames in flight (`flight`, `frames`) and
its receiver (`rx`). Pages: with a shared pool (`rx_pages`) they keep their
numbers and only their owner is relabelled (the pool hands out the lowest
free pages whoever asks, and every request starts unposted); otherwise each
request holds its own block of `page_block` pages for life (request r: pages
r * page_block ...), and the block moves with the request. The fault budget
is shared. The only request numbers
inside a record are the `rid` of actions and effects and the text of a
transition's flag ("request N: ..."), and `relabel` rewrites both.
`canonical` sorts the requests by their whole per-request component, so any
two states that differ by a permutation of the requests get the same
representative (the explorer's symmetry reduction; docs/architecture.md).
The sender ranks are interchangeable too: every rank sends the same slices
(the same source blocks) into its own segment of the receiver's destination
cells, the receiver counts results per rank only to compare the sum with
`expected_transfers`, and the collective poll takes intersections and unions.
`relabel_ranks` renames a rank everywhere its number lives: the per-rank
tuples (`Req.peer_info`, `tx`, `flight`, `frames`, `Rx.finals`, `auxes`,
`cancel_to`, `acks`), the receiver's destination segments (`Rx.dest`), each
result frame's `peer_rank`, the `rank` of actions and "rank N" in flag text
(the E2 flag counts ranks rather than listing them). `Canonical` takes the
least, by `repr`, of the request-sorted forms of the rank relabellings that
put the ranks in the order of a signature no relabelling of the requests
changes: the same set for every member of an orbit of requests x ranks.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from kvsim.engine.symmetry import Relabellings

from .state import PtState, put

_REQUEST = re.compile(r"request (\d+)")
_RANK = re.compile(r"rank (\d+)")


def _tx_key(tx: Any) -> tuple:
    if tx is None:
        return (-1,)
    return (tx.in_map, tx.tasks, tx.final, -1 if tx.aux is None else int(tx.aux),
            -1 if tx.terminal is None else int(tx.terminal), tx.sealed, tx.credits, tx.ready, tx.aux_frees)


def request_key(s: PtState, r: int, page_block: int = 0) -> tuple:
    """Everything of request r that a relabelling keeps, comparable: the sort key of `canonical`."""
    rx = s.rx[r]
    if page_block:  # the block's number is the request's: only the offsets are its own
        rx = rx._replace(pages=tuple(p % page_block for p in rx.pages))
    return (s.reqs[r], tuple(_tx_key(t) for t in s.tx[r]), s.flight[r], s.frames[r], rx)


def _rename(text: str, perm: Sequence[int]) -> str:
    return _REQUEST.sub(lambda m: f"request {perm[int(m.group(1))]}", text)


def relabel(s: PtState, perm: Sequence[int], page_block: int = 0) -> PtState:
    """The state with request r renamed `perm[r]` everywhere (perm: a permutation of the request numbers), its
    block of pages too when each request owns one (`page_block` pages each)."""
    n = len(s.reqs)
    src = [0] * n
    for r, p in enumerate(perm):
        src[p] = r

    def move(seq: tuple) -> tuple:
        return tuple(seq[src[i]] for i in range(n))

    flags = tuple(sorted((name, _rename(msg, perm)) for name, msg in s.flags))
    rxs = move(s.rx)
    if page_block:
        rxs = tuple(rx._replace(pages=tuple(perm[p // page_block] * page_block + p % page_block for p in rx.pages))
                    for rx in rxs)
    return s._replace(reqs=move(s.reqs), tx=move(s.tx), flight=move(s.flight), frames=move(s.frames), rx=rxs,
                      flags=flags)


def relabel_action(action: Any, perm: Sequence[int]) -> Any:
    """An action (or effect) with its request renamed; one without a request unchanged."""
    fields = getattr(action, "fields", ())
    if fields and fields[0] == "rid":
        return type(action)(*put(tuple(action[1:]), 0, perm[action[1]]))
    return action


def relabel_ranks(s: PtState, perm: Sequence[int]) -> PtState:
    """The state with sender rank k renamed `perm[k]` everywhere (perm: a permutation of the rank numbers)."""
    k = len(perm)
    src = [0] * k
    for j, p in enumerate(perm):
        src[p] = j

    def move(seq: tuple) -> tuple:
        return tuple(seq[src[i]] for i in range(k))

    def frames(row: tuple) -> tuple:
        return move(tuple(tuple(f._replace(peer_rank=perm[f.peer_rank]) for f in q) for q in row))

    rxs = []
    for rx in s.rx:
        per = len(rx.dest) // k
        dest = tuple(v for j in range(k) for v in rx.dest[src[j] * per:(src[j] + 1) * per])
        rxs.append(rx._replace(finals=move(rx.finals), auxes=move(rx.auxes), cancel_to=move(rx.cancel_to),
                               acks=move(rx.acks), dest=dest))
    flags = tuple(sorted((name, _RANK.sub(lambda m: f"rank {perm[int(m.group(1))]}", msg)) for name, msg in s.flags))
    return s._replace(reqs=tuple(q._replace(peer_info=move(q.peer_info)) for q in s.reqs),
                      tx=tuple(move(row) for row in s.tx), flight=tuple(move(row) for row in s.flight),
                      frames=tuple(frames(row) for row in s.frames), rx=tuple(rxs), flags=flags)


def relabel_rank_action(action: Any, perm: Sequence[int]) -> Any:
    """An action (or effect) with its sender rank renamed; one without a rank unchanged."""
    fields = getattr(action, "fields", ())
    if "rank" not in fields:
        return action
    i = fields.index("rank")
    return type(action)(*put(tuple(action[1:]), i, perm[action[1 + i]]))


class Canonical:
    """`canonical(state)`: the representative of a state's orbit under the requests x the sender ranks.

    The requests are put in `request_key` order. With several ranks, the least by `repr` of the request-sorted
    forms of the rank relabellings that put the ranks in `rank_signature` order, and of ranks with one
    signature and one `rank_slice` (identical), one order only (`Relabellings`): a state whose ranks all
    moved alike costs one relabelling, not `ranks`! of them.
    """

    def __init__(self, page_block: int = 0, ranks: int = 1) -> None:
        self.page_block = page_block
        self.order = Relabellings(ranks, self.relabel_ranks, rank_signature, rank_twin) if ranks > 1 else None

    def relabel_ranks(self, s: PtState, perm: Sequence[int]) -> PtState:
        return _sort_requests(relabel_ranks(s, perm), self.page_block)

    def __call__(self, s: PtState) -> PtState:
        s = _sort_requests(s, self.page_block)
        return s if self.order is None else self.order.canonical(s)


def canonical(s: PtState, page_block: int = 0, ranks: int = 1) -> PtState:
    """The representative of s's orbit (`Canonical`), for one state."""
    return Canonical(page_block, ranks)(s)


def rank_slice(s: PtState, k: int) -> tuple:
    """Everything of sender rank k, request by request, none of it naming a rank (a result frame's
    `peer_rank` is the rank whose queue holds it): two ranks with one slice are identical."""
    out = []
    for r, q in enumerate(s.reqs):
        rx = s.rx[r]
        per = len(rx.dest) // len(q.peer_info)
        out.append((q.peer_info[k], _tx_key(s.tx[r][k]), s.flight[r][k], tuple(f[2:] for f in s.frames[r][k]),
                    rx.finals[k], rx.auxes[k], rx.cancel_to[k], rx.acks[k], rx.dest[k * per:(k + 1) * per]))
    return tuple(out)


def rank_signature(s: PtState, k: int) -> tuple:
    """Rank k's slice with the requests in a fixed order: the same whatever the requests' numbers, and carried
    with the rank by `relabel_ranks`."""
    return tuple(sorted(rank_slice(s, k)))


def rank_twin(s: PtState, k: int) -> tuple:
    """Rank k's slice, and its number where a flag's text names it: two ranks with one of these are identical."""
    named = any(int(n) == k for _, text in s.flags for n in _RANK.findall(text))
    return rank_slice(s, k), k if named else -1


def _sort_requests(s: PtState, page_block: int) -> PtState:
    n = len(s.reqs)
    if n == 1:
        return s
    order = sorted(range(n), key=lambda r: request_key(s, r, page_block))
    if order == list(range(n)):
        return s
    perm = [0] * n
    for i, r in enumerate(order):
        perm[r] = i
    return relabel(s, perm, page_block)
