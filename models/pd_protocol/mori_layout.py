"""Which destination KV entries a prefill stage writes: Mori's rule (SGLang PR #35281, area 4) and the common one.

Follows `MoriKVManager._get_mha_mem_desc_slices` / `_get_mla_mem_desc_slices` in
`python/sglang/srt/disaggregation/mori/conn.py` (before the PR at 17313cf4 and in the
releases 0.5.13-0.5.23) and `CommonKVManager.get_mha_kv_ptrs_with_pp` in
`common/conn.py` (unchanged from 0.5.13 to 0.5.23; Mooncake and NIXL use it for plain MHA).

The prefill sends `n` local layers starting at global layer `s` (its PP stage, from
`get_pp_indices`: an even split, the last `L % pp` stages one layer longer, or the
`SGLANG_PP_LAYER_PARTITION` list). The decode registered a flat list of destination entries:
`[K main, V main, K draft, V draft]` for MHA (one entry per layer and kind; the draft part exists
when the decode runs speculative decoding and the prefill does not), `[KV main, KV draft]` for MLA
and hybrid MLA. Positional rules see only counts, never labels; the model builds the labelled list
too, so a property can check that the chosen entries are the main-model K and V of global layers
`s .. s+n-1`. Pools that publish layer ids (`build_kv_layer_ids`: HybridLinear, MiniMax-M3; drafts
in a band above the target's layers) are paired by id instead; plain MHA pools publish none.

Variants (flags of `ProtocolVariant`, all read in `select_dst_descriptors`):
- `pre_35281`: `T = len(dst) / 2`; K = `dst[s : s+n]`, V = `dst[T+s : T+s+n]`;
  the global offset `s` is applied even when the decode lists are already
  stage-local (same PP); hybrid MLA falls through to the MHA split.
- `fixed`: the common V-offset rule (`n == T`, draft case `T % n != 0` with
  `vo = n * (T // n)`, else the PP case), no offset when both lists have the same length
  (same-PP peers), hybrid MLA sliced as MLA.
- `sglang_0_5_23`: as `fixed`, and Mori pairs by layer id when either peer publishes ids (0.5.22).
Both Mori rules refuse (`ValueError`) an MHA list shorter than 2 or a stage ending past `T`.
The common rule (`select_common_mha_ptrs`) is the same in every variant; it slices without a
check, so an index past the list is simply missing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from kvsim.engine.errors import ConfigError, check_int

from .variants import FIXED, ProtocolVariant

ATTENTION_KINDS = ("mha", "mla", "hybrid_mla")
RULES = ("mori", "common")  # MoriKVManager._get_*_mem_desc_slices; CommonKVManager.get_mha_kv_ptrs_with_pp
EXTRA_FIELDS = {"partition": (), "layer_ids": False, "rule": "mori"}  # shown in JSON only when not the default


class Descriptor(NamedTuple):
    kind: str  # "K", "V" or "KV"
    part: str  # "main" or "draft"
    layer: int  # global layer for main, draft index for draft


def get_pp_indices(num_layers: int, stage: int, pp_size: int, partition: tuple[int, ...] = ()) -> tuple[int, int]:
    """[start, end) of a PP stage's layers, as `sglang.srt.distributed.utils.get_pp_indices`."""
    if partition:
        start = sum(partition[:stage])
        return start, start + partition[stage]
    base, extra = divmod(num_layers, pp_size)
    if stage >= pp_size - extra:  # the last `extra` stages take one layer more
        start = stage * (base + 1) - (pp_size - extra)
        return start, start + base + 1
    return stage * base, (stage + 1) * base


@dataclass(frozen=True)
class LayoutCase:
    """A decode/prefill pairing: model depth, PP split, draft layers on decode, attention kind, rule."""

    num_layers: int
    pp_size: int
    stage: int
    draft_layers: int
    same_pp: bool
    attention: str
    partition: tuple[int, ...] = ()  # SGLANG_PP_LAYER_PARTITION; () is get_pp_indices' own split
    layer_ids: bool = False  # the pools publish layer ids (HybridLinear, MiniMax-M3); plain MHA does not
    rule: str = "mori"  # which upstream function selects: "mori" or "common" (MHA only)

    def __post_init__(self) -> None:
        check_int(self.num_layers, "num_layers", minimum=1)
        check_int(self.pp_size, "pp_size", minimum=1, maximum=self.num_layers)
        check_int(self.stage, "stage", minimum=0, maximum=self.pp_size - 1)
        check_int(self.draft_layers, "draft_layers", minimum=0)
        if self.attention not in ATTENTION_KINDS:
            raise ConfigError("attention", f"one of {', '.join(ATTENTION_KINDS)}", self.attention)
        if self.rule not in RULES or (self.rule == "common" and self.attention != "mha"):
            raise ConfigError("rule", "mori, or common with attention mha", self.rule)
        if self.partition and (len(self.partition) != self.pp_size or sum(self.partition) != self.num_layers
                               or min(self.partition) < 1):
            raise ConfigError("partition", f"{self.pp_size} stage sizes >= 1 summing to {self.num_layers}",
                              list(self.partition))

    def __canon__(self) -> dict[str, Any]:
        """JSON form: the new fields only where they differ from their defaults (older cases read as before)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, default in EXTRA_FIELDS.items():
            if out[name] == default:
                del out[name]
        return out

    @property
    def bounds(self) -> tuple[int, int]:
        return get_pp_indices(self.num_layers, self.stage, self.pp_size, self.partition)

    @property
    def local_layers(self) -> int:
        start, end = self.bounds
        return end - start

    @property
    def start_layer(self) -> int:
        return self.bounds[0]

    def destination(self) -> list[Descriptor]:
        """The decode's registered list, as the decode lays it out (stage-local when same PP)."""
        first, end = self.bounds if self.same_pp else (0, self.num_layers)
        main = range(first, end)
        draft = range(self.draft_layers)
        if self.attention == "mha":
            return ([Descriptor("K", "main", i) for i in main] + [Descriptor("V", "main", i) for i in main]
                    + [Descriptor("K", "draft", i) for i in draft] + [Descriptor("V", "draft", i) for i in draft])
        return [Descriptor("KV", "main", i) for i in main] + [Descriptor("KV", "draft", i) for i in draft]

    def source(self) -> list[Descriptor]:
        """The prefill stage's own list (no draft: the prefill runs no speculative decoding)."""
        start, end = self.bounds
        kinds = ("K", "V") if self.attention == "mha" else ("KV",)
        return [Descriptor(kind, "main", i) for kind in kinds for i in range(start, end)]


def layer_id(d: Descriptor, num_layers: int) -> int:
    """The id `build_kv_layer_ids` publishes for an entry: the global layer, drafts in a band above the target's."""
    return d.layer if d.part == "main" else num_layers + d.layer


class Selection(NamedTuple):
    k: tuple[int, ...]  # destination indices for the K (or KV) of local layers 0..n-1
    v: tuple[int, ...] | None  # None for MLA slicing
    refused: str = ""  # why upstream raises instead of selecting ("" when it selects)


def pair_by_layer_id(src_ids: list[int], dst_ids: list[int]) -> tuple[int, ...]:
    """`build_transfer_entry_pairs`: each source entry's destination, occurrences of an id paired in order."""
    queues: dict[int, list[int]] = {}
    for j, lid in enumerate(dst_ids):
        queues.setdefault(lid, []).append(j)
    return tuple(queues[lid].pop(0) if queues.get(lid) else -1 for lid in src_ids)


def select_dst_descriptors(n: int, dst_len: int, start_layer: int, *, attention: str, same_pp: bool | None = None,
                           variant: ProtocolVariant = FIXED,
                           ids: tuple[list[int], list[int]] | None = None) -> Selection:
    """Mori: indices into the destination list for K and V of the prefill's `n` local layers.

    Sees what upstream sees: counts, the stage's start layer and (when published) the layer ids of both
    lists. `same_pp` is accepted for older callers and not read: same-PP peers are recognised, as upstream
    does, by lists of equal length.
    """
    mla_slicing = attention == "mla" or (attention == "hybrid_mla" and variant.mori_hybrid_mla_sliced)
    src_len = n if mla_slicing else 2 * n
    # same-PP peers registered stage-local lists of the prefill's length: no global offset (fixed)
    local = variant.mori_same_pp_local_start and src_len == dst_len
    s = 0 if local else start_layer
    if mla_slicing:
        return Selection(tuple(range(s, s + n)), None)
    if local:
        return Selection(tuple(range(n)), tuple(range(n, 2 * n)))
    if ids is not None and variant.mori_layer_id_pairing and (ids[0] or ids[1]):
        pairs = pair_by_layer_id(*ids)
        return Selection(pairs[:n], pairs[n:])
    pairs = dst_len // 2  # K and V halves; before the fix hybrid MLA lands here with its MLA list
    if attention == "mha" and (dst_len < 2 or s + n > pairs):  # (hybrid MLA's old fall-through: not modelled)
        return Selection((), (), "Destination KV descriptors do not match prefill pp configuration")
    k = tuple(range(s, s + n))
    v_offset = pairs
    if variant.mori_common_v_offset and n < pairs and pairs % n:
        v_offset = n * (pairs // n)  # the draft case: V main assumed to start after n * (T // n) K entries
    return Selection(k, tuple(range(v_offset + s, v_offset + s + n)))


def select_common_mha_ptrs(n: int, dst_len: int, start_layer: int) -> Selection:
    """`CommonKVManager.get_mha_kv_ptrs_with_pp`: K and V destination indices (slices past the list come back short)."""
    total = dst_len // 2

    def span(first: int, count: int) -> tuple[int, ...]:
        return tuple(i for i in range(first, first + count) if i < dst_len)

    if n == total:
        return Selection(span(0, total), span(total, dst_len - total))
    if n < total and total % n:
        v_offset = n * (total // n)  # "Decode has draft model KV while Prefill is deployed without speculative decoding"
        return Selection(span(start_layer, n), span(v_offset + start_layer, n))
    return Selection(span(start_layer, n), span(total + start_layer, n))  # decode PP equal to prefill PP, or 1


def select(case: LayoutCase, variant: ProtocolVariant = FIXED) -> Selection:
    """The selection of the case's rule for its stage (layer ids paired where the pools publish them)."""
    dst, src = case.destination(), case.source()
    ids = ([layer_id(d, case.num_layers) for d in src], [layer_id(d, case.num_layers) for d in dst]) \
        if case.layer_ids else None
    if case.rule == "common":
        if ids is not None:  # Mooncake and NIXL pair by id (build_transfer_entry_pairs) and skip the rule
            pairs = pair_by_layer_id(*ids)
            return Selection(pairs[:case.local_layers], pairs[case.local_layers:])
        return select_common_mha_ptrs(case.local_layers, len(dst), case.start_layer)
    return select_dst_descriptors(case.local_layers, len(dst), case.start_layer, attention=case.attention,
                                  variant=variant, ids=ids)


def chosen_descriptors(case: LayoutCase, variant: ProtocolVariant = FIXED,
                       selection: Selection | None = None) -> list[tuple[Descriptor | None, Descriptor | None]]:
    """(K, V) descriptors chosen for each local layer; None where an index is missing or outside the list.

    `selection` replaces the model's (a conform target passes upstream's); a refusal chooses nothing.
    """
    dst = case.destination()
    sel = selection if selection is not None else select(case, variant)

    def at(seq: tuple[int, ...], l: int) -> Descriptor | None:
        i = seq[l] if l < len(seq) else -1
        return dst[i] if 0 <= i < len(dst) else None

    if sel.refused:
        return [(None, None)] * case.local_layers
    return [(at(sel.k, l), at(sel.v, l) if sel.v is not None else None) for l in range(case.local_layers)]
