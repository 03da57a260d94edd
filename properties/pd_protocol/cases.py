"""The pinned inputs of the pd-protocol properties (no Hypothesis).

A frame-traffic case is the tuple `(backend, rooms, messages)`: `rooms` maps a
room to its KVPoll, `messages` is a list of byte-frame tuples (or of rooms to
ABORT, for P4). A layout case is the model's `LayoutCase`.
"""

from __future__ import annotations

from kvsim.models.pd_protocol.mori_layout import LayoutCase

# The case: decode with one draft layer, prefill without; decode PP=1, a 4-layer MHA model.
DRAFT_CASE = LayoutCase(num_layers=4, pp_size=1, stage=0, draft_layers=1, same_pp=False, attention="mha")
