"""The variants of kv-cache-manager. This slice models vLLM 0.33.0's block pool and full-attention manager as
released; the seed bugs of issue 33 (#48195, #50297, #55055) live in the hybrid coordinator and the scheduler,
and come with their flags as those are modelled.

* `pre_50297`: the scheduler before vLLM #50297 (0.26.0): a request preempted while its last step's output is
  in flight takes that output when it returns, so a producing connector's request can finish after the
  preemption freed its blocks. Read by the P/D life cycle (`scheduler.py`) where the fix changed
  `Scheduler._preempt_request`'s call (`drop_stale_output=self.requires_kv_delivery`).
* `pre_55055`: before vLLM #55055 (0.30.0): a producer (NIXL's P side) truncated its prompt only for Mamba, so
  with a multi-module MTP drafter it computed, and handed, the last positions whose MTP-layer KV embeds
  unverified draft tokens. Read by `scheduler.py` where the fix changed `_prefill_backoff`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.variants import Variant, VariantTable


@dataclass(frozen=True)
class CacheManagerVariant(Variant):
    # #50297 (0.27.0): a preempted request's in-flight output is dropped when the connector requires delivery
    requires_kv_delivery: bool = True
    # #55055 (0.31.0): the producer's prefill backoff covers the MTP drafter's lookahead (num_prefill_lookahead - 1)
    prefill_backoff_covers_lookahead: bool = True


VARIANTS = VariantTable(CacheManagerVariant("fixed"),
                        CacheManagerVariant("pre_50297", requires_kv_delivery=False),
                        CacheManagerVariant("pre_55055", prefill_backoff_covers_lookahead=False))
FIXED = VARIANTS.fixed
