"""zero-kv-blocks-kernel's arena on the way to the kernel child and back (`kvsim.conform.vllm.kernels`): a tiled
arena sent as its tile, the launch's changes sent back as runs, rebuilt bit for bit."""

from __future__ import annotations

import json

import numpy as np

from kvsim.conform.vllm.kernels import PATTERN, arena_document, arena_of, writes, written


def test_the_changed_bytes_come_back_as_runs_and_rebuild_the_arena():
    before = np.arange(16, dtype=np.uint8) + 1
    after = before.copy()
    after[[2, 3, 4, 9, 15]] = [0, 0, 7, 0, 255]
    runs = json.loads(json.dumps(writes(before, after)))  # as the child's answer travels
    assert arena_of(runs["starts"]).tolist() == [2, 9, 15] and arena_of(runs["ends"]).tolist() == [5, 10, 16]
    assert arena_of(runs["bytes"]).tolist() == [0, 0, 7, 0, 255]
    assert np.array_equal(written(before, runs), after)
    assert np.array_equal(written(before, writes(before, before.copy())), before)  # nothing written
    rng = np.random.default_rng(5)
    for size in (1, 2, 63, 4096):
        for _ in range(20):
            before = rng.integers(0, 256, size, dtype=np.uint8)
            after = before.copy()
            at = rng.choice(size, size=int(rng.integers(0, size + 1)), replace=False)
            after[at] = rng.integers(0, 256, at.size, dtype=np.uint8)
            assert np.array_equal(written(before, writes(before, after)), after)


def test_a_tiled_arena_is_sent_as_its_tile():
    arena = np.resize(PATTERN, 15_275_520)  # the DeepSeek-V4 arena's size
    document = arena_document(arena, PATTERN)
    assert len(json.dumps(document)) < 1000
    assert np.array_equal(arena_of(json.loads(json.dumps(document))), arena)
    sentinel = arena_document(np.full(70, 0xAB, np.uint8), np.full(1, 0xAB, np.uint8))
    assert arena_of(sentinel).tolist() == [0xAB] * 70
    drawn = np.random.default_rng(1).integers(0, 256, 99, dtype=np.uint8)
    assert np.array_equal(arena_of(arena_document(drawn)), drawn)  # no tile: every byte
    assert 0 not in PATTERN  # the frame probe's bytes: a zeroed one always shows
