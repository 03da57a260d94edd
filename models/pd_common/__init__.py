"""The PD vocabulary both PD models share (not a model): `KVPoll`, the `update_status` rules, the timers."""
