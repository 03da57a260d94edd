"""Mori's choice of destination KV descriptors for a prefill stage (SGLang PR #35281, area 4).

Follows the note on `_get_mha_mem_desc_slices` in
`python/sglang/srt/disaggregation/mori/conn.py` before the PR (at 17313cf4)
and the rule the PR adopts from the common `get_mha_kv_ptrs_with_pp()`.

The prefill sends `n` local layers starting at global layer `s` (its PP
stage). The decode registered a flat list of destination descriptors:
`[K main, V main, K draft, V draft]` for MHA (one descriptor per layer and
kind; the draft part exists when the decode runs speculative decoding and the
prefill does not), `[KV main, KV draft]` for MLA and hybrid MLA. The
selection sees only counts, never labels; the model builds the labelled list
too, so a property can check that the chosen descriptors are the main-model
K and V of global layers `s .. s+n-1`.

Variants (three flags of `ProtocolVariant`, all read in `select_dst_descriptors`):
- `pre_35281`: `T = len(dst) / 2`; K = `dst[s : s+n]`, V = `dst[T+s : T+s+n]`;
  the global offset `s` is applied even when the decode lists are already
  stage-local (same PP); hybrid MLA falls through to the MHA split.
- `fixed`: the common V-offset rule (`n == T`, draft case `T % n != 0` with
  `vo = n * (T // n)`, else the PP case), no offset for same-PP peers, hybrid
  MLA sliced as MLA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvsim.engine.errors import ConfigError, check_int

from .variants import FIXED, ProtocolVariant

ATTENTION_KINDS = ("mha", "mla", "hybrid_mla")


class Descriptor(NamedTuple):
    kind: str  # "K", "V" or "KV"
    part: str  # "main" or "draft"
    layer: int  # global layer for main, draft index for draft


@dataclass(frozen=True)
class LayoutCase:
    """A decode/prefill pairing: model depth, PP split, draft layers on decode, attention kind."""

    num_layers: int
    pp_size: int
    stage: int
    draft_layers: int
    same_pp: bool
    attention: str

    def __post_init__(self) -> None:
        check_int(self.num_layers, "num_layers", minimum=1)
        check_int(self.pp_size, "pp_size", minimum=1)
        check_int(self.stage, "stage", minimum=0, maximum=self.pp_size - 1)
        check_int(self.draft_layers, "draft_layers", minimum=0)
        if self.num_layers % self.pp_size:
            raise ConfigError("pp_size", f"a divisor of num_layers ({self.num_layers})", self.pp_size)
        if self.attention not in ATTENTION_KINDS:
            raise ConfigError("attention", f"one of {', '.join(ATTENTION_KINDS)}", self.attention)

    @property
    def local_layers(self) -> int:
        return self.num_layers // self.pp_size

    @property
    def start_layer(self) -> int:
        return self.stage * self.local_layers

    def destination(self) -> list[Descriptor]:
        """The decode's registered list, as the decode lays it out (stage-local when same PP)."""
        first = self.start_layer if self.same_pp else 0
        count = self.local_layers if self.same_pp else self.num_layers
        main = range(first, first + count)
        draft = range(self.draft_layers)
        if self.attention == "mha":
            return ([Descriptor("K", "main", i) for i in main] + [Descriptor("V", "main", i) for i in main]
                    + [Descriptor("K", "draft", i) for i in draft] + [Descriptor("V", "draft", i) for i in draft])
        return [Descriptor("KV", "main", i) for i in main] + [Descriptor("KV", "draft", i) for i in draft]


class Selection(NamedTuple):
    k: tuple[int, ...]  # destination indices for the K (or KV) of local layers 0..n-1
    v: tuple[int, ...] | None  # None for MLA slicing


def select_dst_descriptors(n: int, dst_len: int, start_layer: int, *, attention: str, same_pp: bool,
                           variant: ProtocolVariant = FIXED) -> Selection:
    """Indices into the destination list for K and V of the prefill's `n` local layers."""
    mla_slicing = attention == "mla" or (attention == "hybrid_mla" and variant.mori_hybrid_mla_sliced)
    # same-PP peers registered stage-local lists: the global offset is already applied (fixed)
    s = 0 if same_pp and variant.mori_same_pp_local_start else start_layer
    if mla_slicing:
        return Selection(tuple(range(s, s + n)), None)
    pairs = dst_len // 2  # K and V halves; before the fix hybrid MLA lands here with its MLA list
    k = tuple(range(s, s + n))
    if not variant.mori_common_v_offset:
        return Selection(k, tuple(range(pairs + s, pairs + s + n)))
    if n == pairs:
        return Selection(tuple(range(n)), tuple(range(n, 2 * n)))
    if n < pairs and pairs % n:
        v_offset = n * (pairs // n)  # the draft case: V main starts after the main K block
        return Selection(k, tuple(range(v_offset + s, v_offset + s + n)))
    return Selection(k, tuple(range(pairs + s, pairs + s + n)))


def chosen_descriptors(case: LayoutCase, variant: ProtocolVariant = FIXED) -> list[tuple[Descriptor | None, Descriptor | None]]:
    """(K, V) descriptors chosen for each local layer; None where an index falls outside the list."""
    dst = case.destination()
    sel = select_dst_descriptors(case.local_layers, len(dst), case.start_layer, attention=case.attention,
                                 same_pp=case.same_pp, variant=variant)

    def at(i: int) -> Descriptor | None:
        return dst[i] if 0 <= i < len(dst) else None

    v = sel.v if sel.v is not None else (None,) * len(sel.k)
    return [(at(k), at(vi) if vi is not None else None) for k, vi in zip(sel.k, v)]
