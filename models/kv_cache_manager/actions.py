"""Actions and effects of the kv-cache-manager transition system (tagged records)."""

from __future__ import annotations

from kvsim.engine.actions import tagged, type_table

# The scheduler's calls for one request, and the prefix-cache reset.
Schedule = tagged("schedule", "req")  # a waiting request: get_computed_blocks, allocate_slots(its tokens)
Decode = tagged("decode", "req")  # a running request: allocate_slots(1) for its last sampled token
Finish = tagged("finish", "req")  # a running request stops (a stop token): free
Preempt = tagged("preempt", "req")  # a running request is preempted: free, recompute from token 0
Reset = tagged("reset")  # reset_prefix_cache
ACTIONS = type_table((Schedule, Decode, Finish, Preempt, Reset))

# What a step did (`transition`).
Allocated = tagged("allocated", "req", "hit_blocks", "num_hit_tokens", "new_blocks")  # hit: Schedule only
Deferred = tagged("deferred", "req")  # allocate_slots returned None: the pool cannot give the blocks
Freed = tagged("freed", "req", "blocks")  # the request's blocks, in its table's order
ResetDone = tagged("reset_done", "ok")  # reset_prefix_cache's answer
Events = tagged("events", "events")  # the KV events the step published (take_events)
EFFECTS = type_table((Allocated, Deferred, Freed, ResetDone, Events))
