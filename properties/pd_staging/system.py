"""pd-staging transition system: invariants on data (S7, S9-S11, S13-S15, S17, L4), liveness, the stateful property.

Research note ../shared/research/sglang.md, sections 2.4-2.9 (SGLang 05c7ebf,
PR #30545). The model is `models.pd_staging` (system), `data`
(who holds which (request, token, head)) and `checks` (the
invariants). Liveness `every_room_concludes` is L1-L3 without the clock:
from every reachable state some run concludes every room on both sides; the
completion deadline (L2) is the `deadline` action of `fixed`.

The bug reports (explore-driven, with their verdicts per release) are data, in `bugs.toml`
beside this module.
"""

from __future__ import annotations

from kvsim.engine.property import stateful_property

MODEL = "pd-staging"

STAGING_INVARIANTS = stateful_property(model=MODEL, name="staging_invariants", home=__name__,
                                       doc="S7, S9-S11, S13-S15, S17 and L4 hold on every step of Hypothesis-chosen "
                                           "interleavings of prefill batches, transfer workers, deliveries, scatter "
                                           "completions, timeouts and faults.")

