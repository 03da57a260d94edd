"""`kvsim events FILE`: check a recorded stream of vLLM KV event batches against the block-pool model.

The file holds one `KVEventBatch` per line as msgspec's JSON encoder writes it (`[ts, [events...], rank]`, or the
field-named object form); `-` reads standard input. It is read a line at a time (memory: one line and the announced
view), each event taken by `kvsim.engine.system.replay_actions` through the model's event-stream system
(`kvsim.models.kv_cache_manager.event_stream`) to the first event that no state the events before it reach
allows. A line that is not a batch is one error line naming the line and the field (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from typing import Any, BinaryIO, Iterator

from ...engine.errors import ConfigError, TraceError
from ..argtypes import non_negative_int, positive_int
from .common import EXIT_OK, EXIT_VIOLATION, VIEW, view

NAME = "events"
HELP = "check a recorded stream of vLLM KV event batches (JSON Lines) against the block-pool model"
MAX_LINE = 64 << 20  # bytes: the longest batch line read (a step's events; a long prompt's tokens run to MBs)
MAX_WINDOW = 1000
PROGRESS_EVERY = 4096  # events between two looks at the progress line


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="the recorded stream: one KVEventBatch JSON document per line "
                                                "(msgspec's array form or the field-named form); - for stdin")
    p.add_argument("--num-blocks", type=positive_int("--num-blocks"), metavar="N",
                   help="the pool's size (num_gpu_blocks): at most N - 1 blocks may be announced at once")
    p.add_argument("--block-size", type=positive_int("--block-size"), metavar="N",
                   help="the block size every BlockStored must carry (default: any, if consistent)")
    p.add_argument("--parent-groups", metavar="LIST",
                   help="the KV cache groups (group_idx, comma separated) whose parent hash must be announced "
                        "(default: the groups whose BlockStored names a kind whose manager holds every block, "
                        "full_attention, mla_attention or sink_full_attention, or names none)")
    p.add_argument("--window", type=non_negative_int("--window"), default=8, metavar="N",
                   help="events shown before the first one refused (default: 8)")


def _config(args: argparse.Namespace) -> Any:
    from ...models.kv_cache_manager.event_stream import EventStreamConfig

    if args.num_blocks is not None and args.num_blocks < 2:
        raise ConfigError("--num-blocks", "an integer >= 2 (the null block and one more)", args.num_blocks)
    if args.window > MAX_WINDOW:
        raise ConfigError("--window", f"an integer <= {MAX_WINDOW}", args.window)
    groups = None
    if args.parent_groups is not None:
        try:
            groups = frozenset(int(g) for g in args.parent_groups.split(",") if g.strip())
        except ValueError:
            raise ConfigError("--parent-groups", "group indices separated by commas (0,2)",
                              args.parent_groups) from None
    return EventStreamConfig(num_blocks=args.num_blocks, block_size=args.block_size, parent_groups=groups)


class _Stream:
    """The file's events one at a time, with where each came from (`recent`: the last `window` + 1 of them), and
    the counts of those taken (an event counts once the next one is asked for, or the stream ends)."""

    def __init__(self, path: str, window: int) -> None:
        self.path = path
        self.line = 0
        self.batches = 0
        self.recent: deque = deque(maxlen=window + 1)
        self.counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}
        self.hashes = {"stored": 0, "removed": 0}

    def _lines(self, fh: BinaryIO) -> Iterator[bytes]:
        while True:
            data = fh.readline(MAX_LINE + 1)
            if not data:
                return
            self.line += 1
            if len(data) > MAX_LINE and not data.endswith(b"\n"):
                raise TraceError(self.path, self.line, f"line longer than {MAX_LINE} bytes: not a KV event batch")
            yield data

    def _batch(self, data: bytes) -> Any:
        from ...models.kv_cache_manager.event_stream import decode_batch

        ended = not data.endswith(b"\n")
        try:
            doc = json.loads(data)
        except json.JSONDecodeError as exc:
            cut = " (the file ends inside this line: truncated?)" if ended else ""
            raise TraceError(self.path, self.line, f"not valid JSON ({exc.msg}, column {exc.colno}){cut}",
                             key="batch", expected="a JSON document", received=exc.msg) from None
        except UnicodeDecodeError:
            raise TraceError(self.path, self.line, "not UTF-8 text", key="batch", expected="UTF-8 JSON",
                             received="other bytes") from None
        except (RecursionError, ValueError) as exc:
            raise TraceError(self.path, self.line, f"not usable JSON ({str(exc)[:60]})", key="batch",
                             expected="a JSON document", received=str(exc)[:60]) from None
        try:
            return decode_batch(doc)
        except ConfigError as exc:
            raise TraceError(self.path, self.line, str(exc), key=exc.field, expected=exc.expected,
                             received=str(exc.received)) from None

    def events(self, progress: Any, collector: Any) -> Iterator[Any]:
        from ...models.kv_cache_manager.event_stream import UPSTREAM_NAMES, Removed, Stored

        fh = sys.stdin.buffer if self.path == "-" else None
        try:
            if fh is None:
                fh = open(self.path, "rb")
        except OSError as exc:
            raise TraceError(self.path, 0, f"cannot read the file: {exc.strerror or exc}") from None
        taken = 0
        try:
            for data in self._lines(fh):
                batch = self._batch(data)
                self.batches += 1
                for index, event in enumerate(batch.events):
                    self.recent.append((self.line, self.batches - 1, index, event))
                    yield event
                    kind = type(event)  # taken: the replay asked for the next one
                    self.counts[UPSTREAM_NAMES[kind]] += 1
                    if kind is Stored or kind is Removed:
                        self.hashes["stored" if kind is Stored else "removed"] += len(event.block_hashes)
                    taken += 1
                    if taken % PROGRESS_EVERY == 0:
                        progress.note(f"line {self.line}, {taken} events")
                        collector.tick()
        finally:
            if fh is not sys.stdin.buffer:
                fh.close()


def _where(entry: tuple) -> dict[str, Any]:
    from ...models.kv_cache_manager.event_stream import upstream_form

    line, batch, index, event = entry
    return {"line": line, "batch": batch, "index": index, "event": upstream_form(event)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ...engine.memory import YoungCollections
    from ...engine.progress import Progress
    from ...engine.system import replay_actions
    from ...models.kv_cache_manager.event_stream import EventStreamSystem

    config = _config(args)
    system = EventStreamSystem(config)
    stream = _Stream(args.file, args.window)
    progress = Progress(None, "kvsim events")
    # the view's nodes are long-lived and acyclic: the collector's passes over them cost a third of the time
    collector = YoungCollections()
    try:
        state, taken, stopped = replay_actions(system, stream.events(progress, collector))
    finally:
        collector.close()
        progress.close()
    doc: dict[str, Any] = {
        "file": args.file, "ok": stopped is None, "batches": stream.batches, "events": taken,
        "event_counts": dict(stream.counts), "hashes": dict(stream.hashes), "announced": state.announced(),
        "config": {"num_blocks": config.num_blocks, "block_size": config.block_size,
                   "parent_groups": None if config.parent_groups is None else sorted(config.parent_groups)},
        VIEW: {},
    }
    if stopped is not None:
        *before, at = stream.recent
        doc["violation"] = {**_where(at), "check": stopped.check, "message": stopped.message,
                            "before": [_where(entry) for entry in before]}
    return doc


def _hash(value: Any) -> str:
    text = str(value)  # a 64-bit int hash in full (20 digits); a base64 one (44 characters) cut
    return text if len(text) <= 20 else text[:17] + "..."


def _event_text(event: dict[str, Any]) -> str:
    kind = event["type"]
    if kind == "AllBlocksCleared":
        return kind
    hashes = ", ".join(_hash(h) for h in event["block_hashes"])
    where = f"group {event['group_idx']}, {event['medium']}"
    if kind == "BlockRemoved":
        return f"BlockRemoved [{hashes}] ({where})"
    parent = "None" if event["parent_block_hash"] is None else _hash(event["parent_block_hash"])
    return f"BlockStored [{hashes}] parent {parent}, {len(event['token_ids'])} tokens of block_size " \
           f"{event['block_size']} ({where})"


def render(doc: dict[str, Any]) -> str:
    view(doc)
    counts = doc["event_counts"]
    summary = (f"{doc['batches']} batches, {doc['events']} events ({counts['BlockStored']} BlockStored of "
               f"{doc['hashes']['stored']} hashes, {counts['BlockRemoved']} BlockRemoved of "
               f"{doc['hashes']['removed']}, {counts['AllBlocksCleared']} AllBlocksCleared)")
    if doc["ok"]:
        return f"{doc['file']}: {summary} hold against the block-pool model; {doc['announced']} blocks announced " \
               "at the end"
    bad = doc["violation"]
    check = "" if bad["check"] == "enabled" else f" [{bad['check']}]"
    lines = [f"{doc['file']}:{bad['line']}: batch {bad['batch']} event {bad['index']}: no state of the block-pool "
             f"model allows it{check}",
             f"  {_event_text(bad['event'])}",
             f"  why: {bad['message']}",
             f"  after {summary}; the events before it:" if bad["before"] else f"  after {summary}"]
    lines += [f"    line {b['line']} batch {b['batch']} event {b['index']}: {_event_text(b['event'])}"
              for b in bad["before"]]
    return "\n".join(lines)


def exit_code(doc: dict[str, Any]) -> int:
    return EXIT_OK if doc["ok"] else EXIT_VIOLATION
