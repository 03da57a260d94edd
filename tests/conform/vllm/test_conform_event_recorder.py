"""KV event streams recorded from vLLM 0.33.0's real `KVCacheManager` (`kvsim.conform.vllm.event_recorder`, in the
real-import child) checked by `kvsim events`: the recorded stream holds; the same stream with one event removed,
one duplicated, a BlockRemoved moved before its BlockStored, or a parent hash changed fails at exactly that event.
The streams are recorded at test time (one child for the module: the import takes ~20 s)."""

from __future__ import annotations

import json

import pytest

from kvsim.app import cli
from kvsim.conform.installed import prepare
from kvsim.conform.installed_child import shared
from kvsim.conform.vllm.event_recorder import DRIVER, workload

NUM_BLOCKS, BLOCK_SIZE = 16, 4


@pytest.fixture(scope="module")
def recorded():  # type: ignore[no-untyped-def]
    child = shared(prepare("vllm", "0.33.0"), DRIVER, timeout=600.0)  # the release's one child, closed at exit
    return {seed: child.call("record", num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, steps=workload(seed),
                             rank=None if seed < 2 else 1)
            for seed in range(3)}


def _check(tmp_path, lines, *flags):  # type: ignore[no-untyped-def]
    path = tmp_path / "stream.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return _run(str(path), *flags)


def _run(*argv):  # type: ignore[no-untyped-def]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["events", *argv, "--json"])
    return code, json.loads(out.getvalue())


def _events(lines):  # type: ignore[no-untyped-def]
    """The stream as a flat list of (batch, index, event object)."""
    return [(b, i, e) for b, line in enumerate(lines) for i, e in enumerate(json.loads(line)[1])]


def _rebuilt(lines, flat):  # type: ignore[no-untyped-def]
    """`lines` with their events replaced by `flat` (batch, index, event), in its order, each in its batch."""
    batches = [json.loads(line) for line in lines]
    for batch in batches:
        batch[1] = []
    for b, _, event in flat:
        batches[b][1].append(event)
    return [json.dumps(batch, separators=(",", ":")) for batch in batches if batch[1]]


def _at(lines, flat, position):  # type: ignore[no-untyped-def]
    """(line, index) in `_rebuilt(lines, flat)` of the event at `position` of `flat`."""
    kept = sorted({b for b, _, _ in flat})
    b = flat[position][0]
    return kept.index(b) + 1, sum(1 for f in flat[:position] if f[0] == b)


def _mentions(event, h):  # type: ignore[no-untyped-def]
    return h in event.get("block_hashes", ()) or event.get("parent_block_hash") == h


def test_the_recorded_streams_hold(recorded, tmp_path):  # type: ignore[no-untyped-def]
    for seed, record in recorded.items():
        kinds = {e["type"] for _, _, e in _events(record["lines"])}
        assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}, (seed, kinds)  # churn and resets
        code, doc = _check(tmp_path, record["lines"], "--num-blocks", str(NUM_BLOCKS), "--block-size",
                           str(BLOCK_SIZE))
        assert (code, doc["ok"], doc["batches"]) == (0, True, len(record["lines"])), doc.get("violation")
        assert doc["events"] == len(_events(record["lines"]))
    assert json.loads(recorded[2]["lines"][0])[2] == 1  # the rank, as the batch's third element
    # a pool that is too small for the recorded stream is the pool bound, at the first event past it
    code, doc = _check(tmp_path, recorded[0]["lines"], "--num-blocks", "4")
    assert code == 1 and doc["violation"]["check"] == "pool_bound"
    assert "blocks announced: expected at most num_blocks - 1 = 3" in doc["violation"]["message"]


def _next_use(flat, p):  # type: ignore[no-untyped-def]
    """The position of the first event after `p` that needs a hash the BlockStored at `p` announced (a BlockRemoved
    of it, a BlockStored with it as parent), or None where a clear or a new BlockStored of it comes first."""
    hashes = set(flat[p][2]["block_hashes"])
    for q in range(p + 1, len(flat)):
        event = flat[q][2]
        if event["type"] == "AllBlocksCleared" or (event["type"] == "BlockStored" and
                                                   hashes & set(event["block_hashes"])):
            return None
        if hashes & set(event["block_hashes"]) or event.get("parent_block_hash") in hashes:
            return q
    return None


def test_one_event_removed_fails_where_its_hash_is_next_used(recorded, tmp_path):  # type: ignore[no-untyped-def]
    lines = recorded[0]["lines"]
    flat = _events(lines)
    first = [p for p, (_, _, e) in enumerate(flat) if e["type"] == "BlockStored" and
             not any(_mentions(f[2], h) for f in flat[:p] for h in e["block_hashes"])]
    p, q = next((p, _next_use(flat, p)) for p in first if _next_use(flat, p) is not None)
    cut = flat[:p] + flat[p + 1:]
    code, doc = _check(tmp_path, _rebuilt(lines, cut))
    bad = doc["violation"]
    assert code == 1 and (bad["line"], bad["index"]) == _at(lines, cut, q - 1), bad
    assert bad["event"]["type"] == flat[q][2]["type"] and bad["event"]["block_hashes"] == flat[q][2]["block_hashes"]
    assert bad["before"][-1]["event"]["block_hashes"] == cut[q - 2][2]["block_hashes"]


def test_one_block_removed_duplicated_fails_at_the_copy(recorded, tmp_path):  # type: ignore[no-untyped-def]
    lines = recorded[1]["lines"]
    flat = _events(lines)
    p = next(p for p, (_, _, e) in enumerate(flat) if e["type"] == "BlockRemoved")
    twice = flat[:p + 1] + [flat[p]] + flat[p + 1:]
    code, doc = _check(tmp_path, _rebuilt(lines, twice))
    bad = doc["violation"]
    assert code == 1 and (bad["line"], bad["index"]) == _at(lines, twice, p + 1)
    assert "none live" in bad["message"] and bad["before"][-1]["event"]["block_hashes"] == bad["event"]["block_hashes"]


def test_a_block_removed_before_its_block_stored_fails_there(recorded, tmp_path):  # type: ignore[no-untyped-def]
    lines = recorded[0]["lines"]
    flat = _events(lines)
    p = next(p for p, (_, _, e) in enumerate(flat) if e["type"] == "BlockRemoved")
    h = flat[p][2]["block_hashes"][0]
    s = max(q for q in range(p) if flat[q][2]["type"] == "BlockStored" and h in flat[q][2]["block_hashes"])
    moved = flat[:s] + [(flat[s][0], 0, flat[p][2])] + flat[s:p] + flat[p + 1:]
    code, doc = _check(tmp_path, _rebuilt(lines, moved))
    bad = doc["violation"]
    assert code == 1 and (bad["line"], bad["index"]) == _at(lines, moved, s), bad
    assert bad["event"]["type"] == "BlockRemoved" and f"BlockRemoved({h})" in bad["message"]


def test_a_wrong_parent_fails_at_that_block_stored(recorded, tmp_path):  # type: ignore[no-untyped-def]
    lines = recorded[2]["lines"]
    flat = _events(lines)
    p = next(p for p, (_, _, e) in enumerate(flat) if e["type"] == "BlockStored" and e["parent_block_hash"])
    b, i, event = flat[p]
    wrong = flat[:p] + [(b, i, dict(event, parent_block_hash=event["parent_block_hash"] ^ 1))] + flat[p + 1:]
    code, doc = _check(tmp_path, _rebuilt(lines, wrong))
    bad = doc["violation"]
    assert code == 1 and (bad["line"], bad["index"]) == _at(lines, wrong, p)
    assert bad["message"].startswith(f"parent_block_hash {event['parent_block_hash'] ^ 1}: expected None or a hash")
