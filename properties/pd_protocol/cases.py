"""The pinned inputs of the pd-protocol properties (no Hypothesis).

A frame-traffic case is the tuple `(backend, rooms, messages)`: `rooms` maps a
room to its KVPoll, `messages` is a list of byte-frame tuples (or of rooms to
ABORT, for P4). A layout case is the model's `LayoutCase`.
"""

from __future__ import annotations

from kvsim.models.pd_protocol.mori_layout import LayoutCase

# The case: decode with one draft layer, prefill without; decode PP=1, a 4-layer MHA model.
DRAFT_CASE = LayoutCase(num_layers=4, pp_size=1, stage=0, draft_layers=1, same_pp=False, attention="mha")

# The research note's case: Llama 32 layers, prefill PP 3 (stages 10/11/11), decode with one EAGLE layer and
# PP 1, plain MHA (no layer ids). Both the Mori and the common rule pick a wrong V on every stage.
EAGLE_UNEVEN_CASES = tuple(LayoutCase(32, 3, stage, 1, False, "mha", rule=rule)
                           for rule in ("mori", "common") for stage in range(3))
