"""swa-budget: resume of retracted requests against a paged full + SWA page budget (SGLang af7c62e, PR #33794).

* `variants`: the variant record `SwaVariant` (one flag, the page rounding af7c62e added) and `VARIANTS`.
* `resume`: `_prealloc_required_tokens` and `resume_retracted_reqs` over a two-pool allocator.
* `scheduler`: the decode scheduler as a transition system (arrive, decode, retract, resume).
* `sim`: the timed workload, a timing policy over that system.
"""

from kvsim.engine.descriptor import ModelDescriptor

from . import sim
from .conform import CONFORM
from .scheduler import SchedulerConfig, SwaScheduler
from .variants import VARIANTS

DESCRIPTOR = ModelDescriptor(
    name="swa-budget",
    summary="paged-SWA retract/resume admission budget over a two-pool page allocator",
    source="sglang af7c62e (PR #33794)",
    variants=VARIANTS,
    config=SchedulerConfig,
    system=SwaScheduler,
    sim_config=sim.SimConfig,
    simulate=sim.simulate,
    conform=CONFORM,
)
