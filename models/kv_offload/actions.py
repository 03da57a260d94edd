"""Actions and effects of the kv-offload transition system (tagged records)."""

from __future__ import annotations

from kvsim.engine.actions import tagged, type_table

# A request's scheduler-side calls, and the transfer completions (a failed store is a fault).
Store = tagged("store", "req")  # prepare_store(the request's keys)
CompleteStore = tagged("complete_store", "req", "success")  # complete_store(the job's keys, success)
Load = tagged("load", "req")  # prepare_load(the longest ready prefix of the request's keys)
CompleteLoad = tagged("complete_load", "req")
Touch = tagged("touch", "req")
Finish = tagged("finish", "req")  # on_request_finished
Reset = tagged("reset")  # reset_cache, with no transfer in flight
ACTIONS = type_table((Store, CompleteStore, Load, CompleteLoad, Touch, Finish, Reset))

# What a step did (`transition`): the store's outcome, the load's slots, the events and stats drained.
Stored = tagged("stored", "req", "keys", "chunk_ids", "evicted")  # a job started (keys write-pending)
StoreRefused = tagged("store_refused", "req", "keys")  # prepare_store returned None (no room)
NothingToStore = tagged("nothing_to_store", "req")  # every key present (or under the store threshold)
Loaded = tagged("loaded", "req", "keys", "chunk_ids")
Events = tagged("events", "events")  # take_events() after the step
Stats = tagged("stats", "usage", "allocation_sizes", "stores_skipped")  # get_stats() after the step
EFFECTS = type_table((Stored, StoreRefused, NothingToStore, Loaded, Events, Stats))
