"""The KV events vLLM publishes, as the stream a consumer reads, and what that stream alone allows.

vLLM 0.33.0 `vllm/distributed/kv_events.py`: the scheduler wraps each step's events in a `KVEventBatch` (an
`EventBatch` msgspec struct, `array_like`: `[ts, events, data_parallel_rank]`, the rank null when unset; `[ts,
events]` is read too) whose events are tagged structs (`{"type": "BlockStored", field: value, ...}`: `BlockStored`,
`BlockRemoved`, `AllBlocksCleared`; the fields whose default is None omitted when None). A block hash is
`ExternalBlockHash`: an int by default (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`: the low 64 bits of the block's
sha256), else bytes (msgspec's JSON writes them base64); here a hash is an opaque key, an int or a string.

`decode_batch` reads one batch's JSON value (the array form msgspec writes, or the field-named object form) into
records, or raises a `ConfigError` naming the field; `EventStreamSystem` is the transition system of the stream:

* the state, `View`, is the announced view of the cache: per (data-parallel rank, medium, group, hash) how many
  blocks the events say hold it (stored and not removed since the last clear), with the content the hash was
  stored with (its parent hash, a digest of its token ids, the block size, the LoRA name);
* an action is one event (`Stored`, `Removed`, `Cleared`: one upstream event each, with the batch's rank);
* `refusal` is what a state allows: a `BlockStored` whose hashes, token ids and block size agree, whose parent is
  None or announced (in the same rank, medium and group: upstream's parent is the request's previous block, which
  the request holds, so it cannot have been evicted: checked where the event's `kv_cache_spec_kind`, which 0.33.0's
  `KVCacheManager.take_events` sets from the group's spec, is a kind whose manager holds every block of a request,
  `HOLDING_KINDS`, or unset (older releases); a sliding-window, chunked-local or Mamba group may free and evict a
  block before its successor is stored; `parent_groups` names the groups instead), and whose hashes,
  where already announced, come with the content they were announced with (a hash names its chain and tokens);
  a `BlockRemoved` of announced hashes only; `AllBlocksCleared` always (it empties the block pool's media, `GPU`
  and unset, of its rank; an offloading tier's other media keep theirs);
* the invariant, given the pool size `num_blocks`: at most `num_blocks - 1` blocks announced on the block pool's
  media per rank (the null block is never cached; one hash per block, as when the hash block size is the block
  size, upstream's default).

Conventions: the counts assume the default `kv_cache_report_mode` "incremental"; under "full" a request's reused
prefix is announced again on each hit (one more count per hit, no removal for it), which this view would take as
more blocks holding the hash. The view is a persistent map (`_put`: a path of three small tuples and one bucket
copied per change), so a step costs about the same with ten blocks or a hundred thousand announced.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

from kvsim.engine.actions import tagged, type_table
from kvsim.engine.errors import ConfigError
from kvsim.engine.system import Invariant

from .variants import FIXED

# One upstream event each, with the rank of the batch that carried it.
Stored = tagged("stored", "rank", "medium", "group", "block_hashes", "parent_block_hash", "token_ids",
                "block_size", "lora_name", "kind")  # BlockStored (kind: its kv_cache_spec_kind)
Removed = tagged("removed", "rank", "medium", "group", "block_hashes")  # BlockRemoved
Cleared = tagged("cleared", "rank")  # AllBlocksCleared
STREAM_EVENTS = type_table((Stored, Removed, Cleared))
UPSTREAM_NAMES = {Stored: "BlockStored", Removed: "BlockRemoved", Cleared: "AllBlocksCleared"}

# the kinds (vllm/v1/kv_cache_interface.py KVCacheSpecKind) of groups whose manager holds all of a running request's
# blocks (FullAttentionManager and its sink variant), and None: no kind named
HOLDING_KINDS = frozenset({None, "full_attention", "mla_attention", "sink_full_attention"})
POOL_MEDIA = (None, "GPU")  # the block pool's medium (upstream's MEDIUM_GPU, its default), or none named

# ---------------------------------------------------------------------------------------------- the view's map
# Three levels of 64 slots, then a bucket: a frozenset of (key, entry) pairs (one pair, mostly: 262,144 buckets).
# A key's slot is a function of the key alone (crc32 of a string hash: the same in every process), so equal views
# are equal values, whatever their order of events.
_FAN = 64
_EMPTY_ROOT: tuple = (None,) * _FAN
_BITS = 6


def _slot(key: tuple) -> int:
    h = key[-1]
    n = h if type(h) is int else zlib.crc32(h.encode("utf-8", "surrogatepass"))
    return (n ^ (key[2] or 0) * 0x9E3779B1) & ((1 << 3 * _BITS) - 1)


def _get(root: tuple, key: tuple) -> Any:
    i = _slot(key)
    node = root[i >> 2 * _BITS]
    if node is None:
        return None
    node = node[(i >> _BITS) & (_FAN - 1)]
    if node is None:
        return None
    bucket = node[i & (_FAN - 1)]
    if bucket is not None:
        for k, entry in bucket:
            if k == key:
                return entry
    return None


def _replaced(node: tuple | None, at: int, child: Any) -> tuple | None:
    node = node or _EMPTY_ROOT
    node = node[:at] + (child,) + node[at + 1:]
    return None if child is None and node == _EMPTY_ROOT else node


def _put(root: tuple, key: tuple, entry: Any) -> tuple:
    """`root` with `key` mapped to `entry` (None: removed)."""
    i = _slot(key)
    a, b, c = i >> 2 * _BITS, (i >> _BITS) & (_FAN - 1), i & (_FAN - 1)
    top = root[a]
    middle = top[b] if top is not None else None
    bucket = middle[c] if middle is not None else None
    kept = frozenset(pair for pair in bucket if pair[0] != key) if bucket else frozenset()
    if entry is not None:
        kept = kept | {(key, entry)}
    return _replaced(root, a, _replaced(top, b, _replaced(middle, c, kept or None))) or _EMPTY_ROOT


def _built(pairs: list) -> tuple:
    """The map of `pairs` (distinct keys), built at once."""
    slots: dict[int, list] = {}
    for pair in pairs:
        slots.setdefault(_slot(pair[0]), []).append(pair)

    wanted = {i >> _BITS * k for i in slots for k in (1, 2)}  # the inner nodes on a path to a pair

    def node(prefix: int, level: int) -> Any:
        if level == 3:
            return frozenset(slots[prefix]) if prefix in slots else None
        if level and prefix not in wanted:
            return None
        made = tuple(node(prefix << _BITS | j, level + 1) for j in range(_FAN))
        return None if made == _EMPTY_ROOT else made

    return node(0, 0) or _EMPTY_ROOT


def _items(root: tuple) -> Iterator[tuple[tuple, Any]]:
    for top in root:
        if top is not None:
            for middle in top:
                if middle is not None:
                    for bucket in middle:
                        if bucket is not None:
                            yield from bucket


class Entry(NamedTuple):
    """One announced hash: how many blocks hold it, and the content it was announced with."""

    count: int
    parent: Any
    tokens: int  # hash() of the token ids' tuple: ints hash alike in every process
    block_size: int
    lora_name: str | None


class View(NamedTuple):
    """The announced view: `root` maps (rank, medium, group, hash) to its `Entry`; `pool` holds, per rank, the
    number of blocks announced on the block pool's media, `(rank, count)` sorted by rank."""

    root: tuple
    pool: tuple

    def entries(self) -> list[tuple[tuple, Entry]]:
        """Every announced (key, entry), in a stable order (keys as text)."""
        return sorted(_items(self.root), key=lambda pair: repr(pair[0]))

    def announced(self) -> int:
        """The number of blocks the view holds announced, over every key."""
        return sum(entry.count for _, entry in _items(self.root))


EMPTY = View(_EMPTY_ROOT, ())


def _pool_count(view: View, rank: Any) -> int:
    return next((n for r, n in view.pool if r == rank), 0)


def _with_pool(view: View, rank: Any, delta: int) -> tuple:
    pool = view.pool
    if len(pool) == 1 and pool[0][0] == rank and pool[0][1] + delta:  # one rank, as most streams
        return ((rank, pool[0][1] + delta),)
    n = _pool_count(view, rank) + delta
    rest = tuple(p for p in view.pool if p[0] != rank)
    return tuple(sorted(rest + (((rank, n),) if n else ()), key=lambda p: (p[0] is not None, p[0] or 0)))


@dataclass(frozen=True)
class EventStreamConfig:
    """What the stream alone does not say: the pool size (None: unbounded), the block size every `BlockStored`
    must carry (None: any, as long as it is consistent), the groups whose parent hash must be announced (None: those
    whose events name a kind in `HOLDING_KINDS`, or none)."""

    num_blocks: int | None = None
    block_size: int | None = None
    parent_groups: frozenset | None = None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:21] + "..."


class EventStreamSystem:
    """The stream as a transition system: states `View`, actions the events, `refusal` the precondition (a stream
    is data from outside: there is no list of enabled actions, and every state may end it)."""

    name = "kv-cache-manager-events"
    variant = FIXED
    liveness = "liveness"

    def __init__(self, config: EventStreamConfig = EventStreamConfig()) -> None:
        self.config = config
        self.invariants: Sequence[Invariant[View]] = (
            (Invariant("pool_bound", self._pool_bound,
                       f"at most num_blocks - 1 = {config.num_blocks - 1} blocks announced per rank on the block "
                       "pool's media"),) if config.num_blocks is not None else ())

    def initial_states(self) -> Iterable[View]:
        return (EMPTY,)

    def enabled(self, state: View) -> Sequence[Any]:
        return ()

    def done(self, state: View) -> bool:
        return True

    def _pool_bound(self, state: View) -> str | None:
        limit = self.config.num_blocks - 1  # type: ignore[operator]
        for rank, n in state.pool:
            if n > limit:
                where = "" if rank is None else f" on rank {rank}"
                return f"{n} blocks announced{where}: expected at most num_blocks - 1 = {limit} (the null block " \
                       "is never cached)"
        return None

    # ------------------------------------------------------------------------------------------ preconditions
    def refusal(self, state: View, event: Any) -> str | None:
        """Why `state` does not allow `event` (None: it does)."""
        kind = type(event)
        if kind is Stored:
            return self._stored_refusal(state, event)
        if kind is Removed:
            return self._removed_refusal(state, event)
        if kind is Cleared:
            return None
        return f"not an event of the stream: {event!r}"

    def _stored_refusal(self, state: View, e: Any) -> str | None:
        _, rank, medium, group, hashes, parent, tokens, size, lora, spec_kind = e
        cfg, root = self.config, state.root
        if not hashes:
            return "block_hashes: expected at least one hash, got none"
        if size < 1:
            return f"block_size: expected at least 1, got {size}"
        if cfg.block_size is not None and size != cfg.block_size:
            return f"block_size: expected {cfg.block_size} (--block-size), got {size}"
        if len(tokens) != len(hashes) * size:
            return f"token_ids: expected {len(hashes)} blocks x block_size {size} = {len(hashes) * size} tokens, " \
                   f"got {len(tokens)}"
        if (len(hashes) > 1 and len(set(hashes)) != len(hashes)) or parent in hashes:
            return "block_hashes: expected a chain of distinct hashes (and not its own parent), got " \
                   f"{[_show(h) for h in hashes]} after parent {_show(parent)}"
        if parent is not None and (spec_kind in HOLDING_KINDS if cfg.parent_groups is None
                                   else group in cfg.parent_groups):
            if _get(root, (rank, medium, group, parent)) is None:
                return f"parent_block_hash {_show(parent)}: expected None or a hash announced in group {group} " \
                       f"(medium {medium}) and not removed since, got one no live BlockStored named"
        for i, block_hash in enumerate(hashes):
            known = _get(root, (rank, medium, group, block_hash))
            if known is None:
                continue
            for field, was, now in zip(("parent", "token ids", "block size", "lora_name"), known[1:],
                                       self._content(e, i)):
                if was != now:
                    change = "other token ids" if field == "token ids" else f"{field} {_show(was)}, now {_show(now)}"
                    return f"block_hashes[{i}] {_show(block_hash)}: announced before with {change} (a hash names " \
                           "its parent, tokens and LoRA)"
        return None

    def _removed_refusal(self, state: View, e: Any) -> str | None:
        _, rank, medium, group, hashes = e
        if not hashes:
            return "block_hashes: expected at least one hash, got none"
        seen: dict[Any, int] = {}
        for block_hash in hashes:
            seen[block_hash] = seen.get(block_hash, 0) + 1
            known = _get(state.root, (rank, medium, group, block_hash))
            if known is None or known.count < seen[block_hash]:
                return f"BlockRemoved({_show(block_hash)}): expected a hash a BlockStored announced in group " \
                       f"{group} (medium {medium}) and not removed since, got " + \
                       ("none live" if known is None else f"{known.count} block(s) holding it, removed once more")
        return None

    @staticmethod
    def _content(e: Any, i: int) -> tuple:
        """What block `i` of a `Stored` announces with its hash: the hash before it, its tokens, the size, LoRA
        (as `step` writes it into the `Entry`)."""
        size = e.block_size
        parent = e.parent_block_hash if i == 0 else e.block_hashes[i - 1]
        return (parent, hash(e.token_ids[i * size:(i + 1) * size]), size, e.lora_name)

    # ------------------------------------------------------------------------------------------------- effects
    def step(self, state: View, event: Any) -> View:
        kind = type(event)
        root = state.root
        if kind is Stored:
            _, rank, medium, group, hashes, parent, tokens, size, lora, _ = event
            for i, block_hash in enumerate(hashes):
                key = (rank, medium, group, block_hash)
                known = _get(root, key)
                root = _put(root, key, Entry(1, parent if i == 0 else hashes[i - 1],
                                             hash(tokens[i * size:(i + 1) * size]), size, lora) if known is None
                            else known._replace(count=known.count + 1))
            delta = len(hashes)
        elif kind is Removed:
            _, rank, medium, group, hashes = event
            for block_hash in hashes:
                key = (rank, medium, group, block_hash)
                known = _get(root, key)
                root = _put(root, key, None if known.count <= 1 else known._replace(count=known.count - 1))
            delta = -len(hashes)
        else:  # Cleared: the kept entries in a map built at once (a clear of many blocks costs one pass)
            rank = event.rank
            root = _built([(k, e) for k, e in _items(root) if k[0] != rank or k[1] not in POOL_MEDIA])
            return View(root, _with_pool(state, rank, -_pool_count(state, rank)))
        if medium in POOL_MEDIA:
            return View(root, _with_pool(state, rank, delta))
        return View(root, state.pool)


# -------------------------------------------------------------------------------------------- the wire format
_KINDS = {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _received(value: Any) -> str:
    text = _type_name(value)
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        shown = repr(value)
        text += " " + (shown if len(shown) <= 40 else shown[:37] + "...")
    return text


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_hash(value: Any) -> bool:
    return type(value) is int or type(value) is str


def _need(ok: bool, field: str, expected: str, value: Any) -> None:
    if not ok:
        raise ConfigError(field, expected, _Shown(_received(value)))


class _Shown(str):
    """A received value already written as text (its repr is itself)."""

    def __repr__(self) -> str:
        return str(self)


def _hashes(value: Any, field: str) -> tuple:
    _need(type(value) is list, field, "a list of block hashes (strings or integers)", value)
    if not all(type(h) is int or type(h) is str for h in value):
        i, h = next((i, h) for i, h in enumerate(value) if not _is_hash(h))
        _need(False, f"{field}[{i}]", "a block hash (a string or an integer)", h)
    return tuple(value)


# the optional fields of each event (upstream's defaults are None): name -> the type a value must have, in words
_OPTIONAL = {
    "BlockRemoved": {"medium": (str, "a string"), "group_idx": (int, "an integer >= 0"),
                     "locality": (str, "a string"), "ownership": (str, "a string")},
}
_OPTIONAL["BlockStored"] = {**_OPTIONAL["BlockRemoved"], "lora_id": (int, "an integer"),
                            "lora_name": (str, "a string"), "kv_cache_spec_kind": (str, "a string"),
                            "session_id": (str, "a string"), "kv_cache_spec_sliding_window": (int, "an integer"),
                            "extra_keys": (list, "a list (one entry per block hash)"),
                            "lookahead_token_ids": (list, "a list of token id lists")}


def _optionals(obj: dict, kind: str, field: str) -> None:
    for name, (kind_of, expected) in _OPTIONAL[kind].items():
        value = obj.get(name)
        if value is not None and type(value) is not kind_of:
            _need(False, f"{field}.{name}", f"{expected} or null", value)
    group = obj.get("group_idx")
    _need(group is None or group >= 0, f"{field}.group_idx", "an integer >= 0 or null", group)


def _int_list(value: Any, field: str) -> tuple:
    _need(type(value) is list, field, "a list of integers", value)
    if not all(type(t) is int for t in value):
        i, t = next((i, t) for i, t in enumerate(value) if type(t) is not int)
        _need(False, f"{field}[{i}]", "an integer", t)
    return tuple(value)


def _event(obj: Any, field: str, rank: Any) -> Any:
    _need(type(obj) is dict, field, "an event object ({\"type\": \"BlockStored\", ...})", obj)
    kind = obj.get("type")
    _need(kind in _KINDS, f"{field}.type", "BlockStored, BlockRemoved or AllBlocksCleared", kind)
    if kind == "AllBlocksCleared":
        return Cleared(rank)
    for name in ("block_hashes",) + (("parent_block_hash", "token_ids", "block_size") if kind == "BlockStored"
                                     else ()):
        if name not in obj:
            raise ConfigError(f"{field}.{name}", f"a field of {kind}", _Shown("nothing (missing)"))
    hashes = _hashes(obj["block_hashes"], f"{field}.block_hashes")
    _optionals(obj, kind, field)
    medium, group = obj.get("medium"), obj.get("group_idx")
    if kind == "BlockRemoved":
        return Removed(rank, medium, group, hashes)
    parent = obj["parent_block_hash"]
    _need(parent is None or _is_hash(parent), f"{field}.parent_block_hash", "a block hash or null", parent)
    tokens = _int_list(obj["token_ids"], f"{field}.token_ids")
    size = obj["block_size"]
    _need(_is_int(size), f"{field}.block_size", "an integer", size)
    for i, ids in enumerate(obj.get("lookahead_token_ids") or ()):
        _int_list(ids, f"{field}.lookahead_token_ids[{i}]")
    return Stored(rank, medium, group, hashes, parent, tokens, size, obj.get("lora_name"),
                  obj.get("kv_cache_spec_kind"))


class Batch(NamedTuple):
    ts: float
    rank: int | None
    events: tuple


def decode_batch(doc: Any) -> Batch:
    """One `KVEventBatch` from its JSON value: `[ts, events]`, `[ts, events, data_parallel_rank]` (msgspec's
    `array_like` form) or `{"ts": ..., "events": [...], "data_parallel_rank": ...}`. Unknown event fields are
    ignored (msgspec's default: a newer release's additions); a wrong or missing one is a `ConfigError`."""
    if type(doc) is list:
        _need(len(doc) in (2, 3), "batch", "[ts, events] or [ts, events, data_parallel_rank]",
              _Shown(f"a list of {len(doc)}"))
        ts, events, rank = doc[0], doc[1], doc[2] if len(doc) == 3 else None
    elif type(doc) is dict:
        for name in ("ts", "events"):
            if name not in doc:
                raise ConfigError(name, "a field of KVEventBatch", _Shown("nothing (missing)"))
        ts, events, rank = doc["ts"], doc["events"], doc.get("data_parallel_rank")
    else:
        raise ConfigError("batch", "a KVEventBatch ([ts, events, data_parallel_rank?] or an object)",
                          _Shown(_received(doc)))
    _need(type(ts) in (int, float), "ts", "a number", ts)
    _need(rank is None or (_is_int(rank) and rank >= 0), "data_parallel_rank", "an integer >= 0 or null", rank)
    _need(type(events) is list, "events", "a list of events", events)
    return Batch(float(ts), rank, tuple(_event(e, f"events[{i}]", rank) for i, e in enumerate(events)))


def upstream_form(event: Any) -> dict[str, Any]:
    """An event as the consumer read it (the upstream class's name and fields; the rank is the batch's)."""
    kind = type(event)
    out: dict[str, Any] = {"type": UPSTREAM_NAMES[kind]}
    if kind is not Cleared:
        out.update(block_hashes=list(event.block_hashes), medium=event.medium, group_idx=event.group)
    if kind is Stored:
        out.update(parent_block_hash=event.parent_block_hash, token_ids=list(event.token_ids),
                   block_size=event.block_size, lora_name=event.lora_name, kv_cache_spec_kind=event.kind)
    return out
