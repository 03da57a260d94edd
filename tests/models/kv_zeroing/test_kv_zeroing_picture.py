"""The data of the kv-zeroing memory picture (`models/kv_zeroing/picture.py`), on the pinned last-block case.

The packed view starts 12 bytes into a 192-byte allocation; each of its 4 blocks is 4 float32 (16 bytes) every
12 elements (48 bytes), so block 3 is bytes 156..172. Before d6af803 the page is the stride: the kernel clears
48 bytes from 156, to 204, 12 bytes past the allocation's end.
"""

from __future__ import annotations

from kvsim.engine.canon import to_jsonable
from kvsim.models.kv_zeroing.picture import memory
from kvsim.models.kv_zeroing.variants import VARIANTS
from kvsim.properties.kv_zeroing.cases import LAST_BLOCK_PAGE

OWNERS = [(0, 12, None), (12, 28, "packed"), (28, 60, None), (60, 76, "packed"), (76, 108, None),
          (108, 124, "packed"), (124, 156, None), (156, 172, "packed"), (172, 192, None)]


def test_the_pre_fix_plan_writes_past_the_block_and_the_allocation():
    (bar,) = memory(to_jsonable(LAST_BLOCK_PAGE), VARIANTS["pre_d6af803"])
    assert (bar["size"], bar["shown"], bar["owners"]) == (192, 204, OWNERS)
    assert bar["asked"] == [(156, 172)] and bar["touched"] == [(156, 204)]
    assert bar["first_outside"] == (172, "allocation 0 + 172 (padding, owned by no view)")


def test_the_fixed_plan_writes_the_block_only():
    (bar,) = memory(to_jsonable(LAST_BLOCK_PAGE), VARIANTS.fixed)
    assert (bar["shown"], bar["owners"], bar["touched"], bar["first_outside"]) == (192, OWNERS, [(156, 172)], None)
