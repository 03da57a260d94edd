"""Who acts in a radix-cache counterexample: the lifelines and arrows of its sequence chart (`kvsim show`).

The optional chart hook of a transition system (docs/architecture.md): `lifelines(system)` and
`arrows(system, state, action) -> ((sender, receiver, label, fault), ...)`.

Actors (SGLang `srt/managers/`, `srt/mem_cache/`): the scheduler, which calls the tree (`RadixCache`, or for
radix-cache-swa the `UnifiedRadixCache` with its Full and SWA components: match and lock, insert, the window lock's
early release past the sliding window, `dec_lock_ref`) and the KV allocator (slots for an extend or a decode).
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.actions import table

from .request_loop import Admit, Decode, Retract
from .swa_system import UnifiedSwaSystem

SCHEDULER, ALLOCATOR = "scheduler", "KV allocator"


def _tree(system: Any) -> str:
    return "UnifiedRadixCache" if isinstance(system, UnifiedSwaSystem) else "RadixCache"


def lifelines(system: Any) -> tuple[str, ...]:
    return (SCHEDULER, _tree(system), ALLOCATOR)


def _decode(a: tuple, system: Any) -> tuple[tuple[str, str, str, bool], ...]:
    arrows = ((SCHEDULER, ALLOCATOR, f"alloc a decode slot (req {a.req})", False),)
    if isinstance(system, UnifiedSwaSystem):  # past the window the scheduler releases the request's SWA lock
        arrows += ((SCHEDULER, _tree(system), f"maybe_evict_swa (req {a.req})", False),)
    return arrows


_arrows = table({  # an action on the chart, by record type
    Admit: lambda a, system: ((SCHEDULER, _tree(system), f"match_prefix + inc_lock_ref (req {a.req})", False),
                              (SCHEDULER, ALLOCATOR, f"alloc the extend (req {a.req})", False)),
    Decode: _decode,
    Retract: lambda a, system: ((SCHEDULER, _tree(system), f"release, dec_lock_ref (req {a.req}): retracted",
                                 False),),
}, lambda a, system: ((SCHEDULER, _tree(system), a[0], False),))


def arrows(system: Any, state: Any, action: tuple) -> tuple[tuple[str, str, str, bool], ...]:
    return _arrows(action, system)
