"""Benchmark of `kvsim events`, the KV event-stream check (figures for the closing note, not a test).

    python benchmarks/bench_kv_events.py [--quick] [--no-real]

Prints: the size of streams recorded from vLLM 0.33.0's real `KVCacheManager` (`kvsim.conform.vllm.event_recorder`;
the release is fetched once into ~/.cache/kvsim) and the check's events per second on them; then events per second
on a large synthetic stream the model allows (chained BlockStored over a pool of many blocks, LRU eviction as
BlockRemoved, a few AllBlocksCleared), through the whole command (reading, JSON, decoding, the replay) and through
the replay alone (a prefix of the events decoded beforehand), with the command's peak resident memory against the
file's size.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections import deque

from kvsim.app import cli
from kvsim.engine.memory import YoungCollections
from kvsim.engine.system import replay_actions
from kvsim.models.kv_cache_manager.event_stream import EventStreamConfig, EventStreamSystem, decode_batch

BLOCK_SIZE = 16


def synthetic(path: str, events: int, num_blocks: int, seed: int = 0) -> int:
    """Write a stream of about `events` events the model allows; returns the number written."""
    rng = random.Random(seed)
    live: deque = deque()
    written = step = 0
    with open(path, "w") as fh:
        while written < events:
            batch = []
            for _ in range(rng.randint(1, 8)):
                if rng.random() < 0.00005:
                    batch.append({"type": "AllBlocksCleared"})
                    live.clear()
                    continue
                k = rng.randint(1, 4)
                while len(live) + k > num_blocks - 1:
                    batch.append({"type": "BlockRemoved", "block_hashes": [live.popleft()], "medium": "GPU",
                                  "group_idx": 0})
                parent = live[-1] if live and rng.random() < 0.7 else None
                hashes = [rng.getrandbits(64) for _ in range(k)]
                batch.append({"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                              "token_ids": [rng.randrange(150_000) for _ in range(k * BLOCK_SIZE)],
                              "block_size": BLOCK_SIZE, "lora_id": None, "medium": "GPU", "lora_name": None,
                              "extra_keys": [None] * k, "group_idx": 0, "kv_cache_spec_kind": "full_attention"})
                live.extend(hashes)
            fh.write(json.dumps([float(step), batch, None], separators=(",", ":")) + "\n")
            written += len(batch)
            step += 1
    return written


def command(path: str, *flags: str) -> tuple[dict, float, float]:
    """The command's document, its wall seconds and its CPU seconds (the figure a shared machine leaves steady)."""
    out = io.StringIO()
    start, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(out):
        code = cli.main(["events", path, "--json", *flags])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    doc = json.loads(out.getvalue())
    assert code == 0, doc
    return doc, seconds, cpu


def replay_only(path: str, num_blocks: int, limit: int) -> tuple[int, float]:
    """The replay alone over the stream's first `limit` events, decoded beforehand (a prefix of a stream the model
    allows is one too), with the collector's passes off as `kvsim events` has them."""
    events: list = []
    with open(path) as fh:
        for line in fh:
            events.extend(decode_batch(json.loads(line)).events)
            if len(events) >= limit:
                break
    system = EventStreamSystem(EventStreamConfig(num_blocks=num_blocks, block_size=BLOCK_SIZE))
    collector = YoungCollections()
    try:
        start = time.perf_counter()
        _, taken, stop = replay_actions(system, events)
        seconds = time.perf_counter() - start
    finally:
        collector.close()
    assert stop is None, stop
    return taken, seconds


def peak_rss_mib(path: str, *flags: str) -> float:
    """The peak resident memory of `kvsim events` on `path` in a process of its own (VmHWM: the process's own
    high-water mark; `ru_maxrss` would carry the forking parent's over the exec)."""
    code = ("import sys; from kvsim.app import cli; import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()): cli.main(['events', sys.argv[1], *sys.argv[2:]])\n"
            "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))")
    out = subprocess.run([sys.executable, "-c", code, path, *flags], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1]) / 1024


def real_streams(quick: bool) -> None:
    from kvsim.conform.installed import prepare
    from kvsim.conform.installed_child import InstalledChild
    from kvsim.conform.vllm.event_recorder import DRIVER, workload

    print("\n== streams recorded from vLLM 0.33.0's real KVCacheManager (block size 4)")
    sizes = [(16, 120)] + ([] if quick else [(32, 2000), (64, 10000)])
    with InstalledChild(prepare("vllm", "0.33.0"), DRIVER) as child, tempfile.TemporaryDirectory() as tmp:
        for num_blocks, steps in sizes:
            start = time.perf_counter()
            record = child.call("record", num_blocks=num_blocks, block_size=4, steps=workload(0, steps=steps))
            recorded_s = time.perf_counter() - start
            path = os.path.join(tmp, "real.jsonl")
            with open(path, "w") as fh:
                fh.write("".join(line + "\n" for line in record["lines"]))
            doc, seconds, cpu = command(path, "--num-blocks", str(num_blocks), "--block-size", "4")
            print(f"{num_blocks:4d} blocks, {steps:6d} steps: {len(record['lines']):6d} batches, {doc['events']:7d} "
                  f"events, {os.path.getsize(path):10,d} bytes (recorded in {recorded_s:.1f} s); checked at "
                  f"{doc['events'] / seconds:9,.0f} events/s ({doc['events'] / cpu:,.0f} per CPU second), "
                  f"{doc['announced']} blocks announced at the end")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a smaller synthetic stream, one real stream")
    ap.add_argument("--no-real", action="store_true", help="skip the streams recorded from the real manager")
    args = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}")
    if not args.no_real:
        real_streams(args.quick)

    n, num_blocks = (50_000, 4096) if args.quick else (1_000_000, 65_536)
    print(f"\n== a synthetic stream of {n:,} events over {num_blocks:,} blocks (block size {BLOCK_SIZE})")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "synthetic.jsonl")
        written = synthetic(path, n, num_blocks)
        flags = ("--num-blocks", str(num_blocks), "--block-size", str(BLOCK_SIZE))
        doc, seconds, cpu = command(path, *flags)
        assert doc["events"] == written
        print(f"file: {os.path.getsize(path) / 2**20:,.1f} MiB, {doc['batches']:,} batches, {doc['announced']:,} "
              "blocks announced at the end")
        print(f"kvsim events (read, parse, decode, replay): {written / seconds:10,.0f} events/s ({seconds:.1f} s; "
              f"{written / cpu:,.0f} per CPU second)")
        taken, seconds = replay_only(path, num_blocks, min(written, 200_000))
        print(f"the replay alone (its first {taken:,} events decoded beforehand): {taken / seconds:10,.0f} events/s "
              f"({seconds:.1f} s)")
        print(f"peak resident memory of kvsim events: {peak_rss_mib(path, *flags):,.0f} MiB "
              f"(this process, which held {min(written, 200_000):,} decoded events: "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB)")


if __name__ == "__main__":
    main()
