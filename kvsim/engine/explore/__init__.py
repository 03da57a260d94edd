"""The explorer: exhaustive bounded search of a transition system, and what takes it to scale.

- `search`: the breadth-first search in one process (`explore`), its result, coverage, reachability
  (`Reach`: each `Sometimes` reached, with its depth and path, or not) and counterexamples (`realize` maps a path through symmetry representatives back to the real system);
- `options`: `ExploreOptions`, the one record of a search's bounds, store, reductions and checkpoint;
- `store`: the visited states, kept whole or as 64-bit fingerprints, and the caches a search keeps;
- `backward`: the liveness pass of the search in one process (the states that cannot reach a done one);
- `parallel` (the coordinator), `partition` (one worker's share) and `hangs` (the liveness pass in
  the workers): the search over forked processes or Ray actors;
- `checkpoint`: a search saved to a folder and resumed from it.

Where the workers run (`kvsim.engine.pools`), memory (`kvsim.engine.memory`), folders every worker
must share (`kvsim.engine.shared`) and Ctrl-C (`kvsim.engine.interrupt`) serve `kvsim fuzz` and the
other drivers as well, so they stay in the engine's top level.
"""

from .backward import cannot_finish
from .options import DEFAULT_MAX_STATES, ExploreOptions
from .search import (NOT_WITHIN_BOUND, REACHED, UNREACHED, Coverage, ExploreResult, Reach, Violation, action_kind,
                     explore, real_message, realize, states_per_depth)

__all__ = ["DEFAULT_MAX_STATES", "NOT_WITHIN_BOUND", "REACHED", "UNREACHED", "Coverage", "ExploreOptions",
           "ExploreResult", "Reach", "Violation", "action_kind", "cannot_finish", "explore", "real_message", "realize",
           "states_per_depth"]
