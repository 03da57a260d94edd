"""The fingerprint of the explorer's visited set (`kvsim.engine.explore.fingerprint`): a successor's, taken from its
parent's, is the one of its value; it tells apart what equality tells apart; no hash seed changes it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque, namedtuple

import pytest

from kvsim.app import catalog
from kvsim.engine.descriptor import RunSpec
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.explore.checkpoint import CheckpointDir
from kvsim.engine.explore.fingerprint import FieldFingerprint, fingerprint
from kvsim.engine.explore.store import Interner
from kvsim.engine.errors import ConfigError
from toys import Counter

Two = namedtuple("Two", "a b")


def walk(system, limit: int):
    """Breadth-first, as a search walks: (each state expanded, its key, its successors' keys taken from it, and the
    same keys taken whole by another fingerprint), the states interned as the search interns them."""
    fp, whole = FieldFingerprint(), FieldFingerprint()
    intern = Interner(text=fp)
    queue, seen = deque(), {}
    for state in system.initial_states():
        key = fp(state)
        if state not in seen:
            state = intern(state)
            seen[state] = key
            queue.append((state, key))
    while queue and len(seen) < limit:
        state, key = queue.popleft()
        fp.expanding(state, key)
        for action in system.enabled(state):
            nxt = system.step(state, action)
            k = fp.successor(nxt)
            yield nxt, k, whole(nxt)
            if nxt not in seen:
                held = intern(nxt, state)
                assert held == nxt
                seen[held] = k
                queue.append((held, k))
    keys = set(seen.values())
    assert len(keys) == len(seen)  # distinct states, distinct fingerprints


@pytest.mark.parametrize("model", ["pd-staging", "pd-protocol", "swa-budget", "kv-cache-manager"])
def test_a_successors_fingerprint_taken_from_its_parents_is_its_own(model):
    system = RunSpec.resolve(catalog.models().model(model), "fixed", {}).system()
    count = 0
    for nxt, from_parent, alone in walk(system, 1500):
        assert from_parent == alone, nxt
        count += 1
    assert count >= 300


def test_a_field_fingerprint_tells_apart_positions_types_and_values():
    Other = namedtuple("Other", "a b")
    fp = FieldFingerprint()
    one = fp(Two((1, 2), "p"))
    assert fp(Two(tuple([1, 2]), "p")) == one  # an equal value, another object
    assert len({one, fp(Two("p", (1, 2))), fp(Other((1, 2), "p")), fp(Two((1, 2), "q")), fp(Two((1, 2), None))}) == 5
    assert fp((1, 2)) == fingerprint(repr((1, 2)).encode())  # not a named tuple: its repr
    fp.expanding(Two((1, 2), "p"), one)
    assert fp.successor(Two("p", (1, 2))) == fp(Two("p", (1, 2)))  # a field moved to another position


def test_a_successor_is_held_from_the_values_met_before():
    fp = FieldFingerprint()
    first = Two((1, 2), "p")
    key = fp(first)
    fp.expanding(first, key)
    nxt = Two(first.a, tuple([1, 2]))  # (1, 2) is new at position b: held as it is
    fp.successor(nxt)
    assert fp.held(nxt) is nxt
    again = Two(tuple([1, 2]), tuple([1, 2]))
    fp.successor(again)
    held = fp.held(again)
    assert held == again and held.a is first.a and held.b is nxt.b  # the first equal values met, at each position
    assert fp.held(nxt) is None  # only the state fingerprinted last


def test_fingerprints_are_the_same_under_any_hash_seed():
    # the states of pd-protocol hold strings (whose hash the seed changes) and are fingerprinted as a search does
    code = ("import sys; from kvsim.app import catalog; from kvsim.engine.descriptor import RunSpec; "
            "from test_explore_fingerprint import walk; "
            "s = RunSpec.resolve(catalog.models().model('pd-protocol'), 'fixed', {}).system(); "
            "print([k for _, k, _ in walk(s, 300)])")
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join([here, os.path.dirname(here)])  # this module, and `toys`
    outs = [subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, check=True,
                           env=dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=path)).stdout for seed in ("0", "4242")]
    assert outs[0] == outs[1] and len(outs[0]) > 1000


def test_a_checkpoint_of_an_older_format_is_refused(tmp_path, monkeypatch):
    from kvsim.engine.explore import checkpoint

    with monkeypatch.context() as m:
        m.setattr(checkpoint, "FORMAT", checkpoint.FORMAT - 1)
        explore(Counter(limit=30, bad=None),
                ExploreOptions(max_states=10, store="fingerprint", checkpoint=CheckpointDir(tmp_path, {"model": "c"})))
    with pytest.raises(ConfigError, match=rf"^resume: .*\(format {checkpoint.FORMAT - 1}\).*format "
                                          rf"{checkpoint.FORMAT}"):
        CheckpointDir(tmp_path, {"model": "c"}).resume()


def test_a_system_that_encodes_its_states_is_fingerprinted_from_that_text():
    """`encode_state(state) -> bytes` (no model declares one now): the fingerprint store takes the BLAKE2b of that
    text, and finds what the full store finds."""
    from kvsim.engine.explore.fingerprint import TextFingerprint, fingerprint_function

    system, encoded = Counter(limit=40, bad=None), []

    def encode_state(state):
        encoded.append(state)
        return f"counter {state}".encode()

    system.encode_state = encode_state
    key = fingerprint_function(system)
    assert isinstance(key, TextFingerprint) and key(7) == fingerprint(b"counter 7")
    full = explore(system, ExploreOptions(store="full", check_liveness=False))
    fp = explore(system, ExploreOptions(store="fingerprint", check_liveness=False))
    assert (fp.states, fp.transitions, fp.depth) == (full.states, full.transitions, full.depth) == (41, 60, 9)
    assert set(encoded) >= set(range(41))  # every state's key came from its text
