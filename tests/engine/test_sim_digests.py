"""The digests, event counts and outcomes of every simulated model, pinned (issue 16).

The simulator, the trace recorder and pd-staging's step were made faster; none of that may change a
recorded step, the digest over them, the trace file, the summary or the state a run ends in. Each row
is one seeded run through `simulate_model` (the `kvsim simulate` path): the trace digest, the events
run, the steps recorded, a SHA-256 prefix of the trace file less its header (the header carries the
kvsim version), and digest prefixes of the summary and of the driver's final state (pd-staging's, whose
step was made faster; None: not pinned, as another model's state may change shape without its trace
changing). A change to a model's behaviour changes these on purpose: re-pin them then, and say why.

Re-pinned: swa-budget's two rows when its state's `fault` field became the engine's `flags` (issue 28): every
step's state fingerprint changed with the field's name, so the digests and file bodies did; the events, the
steps, each step's action and values, and the summaries did not (compared with the fingerprints blanked).
Re-pinned (2026-12-05): pd-staging's seven summaries when the summary gained `named` (each violating room's
mechanism, issue 30; the traces, bodies and states did not change); kv-cache-manager's two digests and bodies when
its simulation gained the `attention_chunk_size` parameter (chunked local attention, issue 33): the header's params
changed, so the digest did, and with it the end line that holds it; every step line is byte-identical to 6cb66ce's
(compared), and so are the events, the steps and the summaries.
Added (2026-12-05): radix-cache's three rows, its simulation's first pins (issue 29); the speculative row's summary
re-pinned the same day when a deferred verify stopped counting toward `accepted_per_verify` (the trace and body are
unchanged: the draws are the same).
Re-pinned (2026-12-07): three pd-staging summaries (fixed seeds 0 and 3, proposed_per_dst_retry seed 4) when a room
whose rows hold another room's KV that no stale write explains, with a CHUNK_READY of its own duplicated, was named
the duplicated CHUNK_READY where it was named no mechanism: five `named` entries changed their mechanism and
evidence, nothing else (the traces, bodies, events and states are the same, compared).
"""

import enum
import hashlib
from dataclasses import dataclass
from typing import NamedTuple

import pytest

from kvsim.app import catalog
from kvsim.app.simulate import replay_file, simulate_model
from kvsim.engine.canon import canonical_json, digest, to_jsonable
from kvsim.engine.trace import TraceRecorder
from kvsim.models.pd_common.rooms import Rooms
from kvsim.models.pd_staging.actions import Deliver

SPECS = catalog.load()

# (model, variant, seed, params, faults, trace digest, events, steps, file body, summary, final state)
PINS = [
    ('pd-staging', 'fixed', 0, {'requests': 1000}, None,
     '5cce04b9d65ea4bbdd3f8f743714d2260c9a38553bb570faaa832abd05681c67', 48830, 49820,
     '4e4dc002b7a92944061453f2ecbd972e', 'a180b3efdea435504a7838a84e8603b1', '3b71d3f310719b2f9416bf6fc508df65'),
    ('pd-staging', 'fixed', 0, {'requests': 300}, 'delay=0.05:0.2,duplicate=0.01',
     '691070e0cc4ac24983c8217642ef5a0dbc8e39dd2ee9a2e87c3071eebb98bbe9', 56833, 57859,
     '1fe63f26c077a99888ddaec3024cc681', 'bbbebd2bdf4a9dc8823ebe093fec15ea', 'd8a2315721d23364273b45a59a5d3ba9'),
    ('pd-staging', 'fixed', 3, {'requests': 100}, 'drop=0.02,delay=0.1:0.5,duplicate=0.02,reorder=0.05',
     '0c53dd90ce4db7587e6c83c53770a9f565bc2cec5d011f51daff5cdc23bedf61', 23101, 23708,
     'ea1395164b5f94d28a5c975aceb6d315', 'b3341e8c7d4dd3fd1ede25aec3b7eccd', '6c4be6de0baaa8a609b44b2cbb3fbb28'),
    ('pd-staging', 'pre_05c7ebf', 1, {'requests': 100}, 'drop=0.05,reorder=0.1',
     '364bcb3455ff9c04bc4958e6c85f330e89722947a19708906948213784e85caa', 18267, 18736,
     'da1ea5b5a22f33cc083d211f2b0790be', '854b1da85eaa785ff691be2fc5e700c9', 'd499b79edd7225c1397dea894617c627'),
    ('pd-staging', 'sglang_0_5_23', 3, {'requests': 100}, 'drop=0.02,delay=0.1:0.5,duplicate=0.02',
     '8c35d867646c01da10870970694048472cf45afc0d0c984bfe416c72e8f209aa', 22464, 22891,
     '6e327c739a36af9dd54ebcd4add987fd', 'f07cb90665f2be16094f0e6aba1d41a4', 'd0f9b081fa64761293e22df996200ee2'),
    ('pd-staging', 'fixed', 2, {'requests': 100}, 'duplicate=0.05,crash=prefill@1.5',
     '3de6b4fa2afe8f6878c3d3e2db388b24a5de3d1b2dddd8c46bf1bab7c50679d5', 1810, 1499,
     '913f9281f10fac2d8d1c8fbb89cd1063', '92ae660e967e07661fe2af6c2afc3956', '09fea568af224305dcba2fa12fb6845a'),
    ('pd-staging', 'proposed_per_dst_retry', 4, {'requests': 60, 'writers': 4}, 'drop=0.01,duplicate=0.02',
     'ac5f384a41c5c8b1e410c24981133315edaebb66bae11f8cfcd95f02537688ca', 21848, 22083,
     '8a59f1bd6f5e379ac7f8d76bb5766e7e', '1a99b195bbf5831a4473610b0403defc', '4228430b86dae47a3db3d3ddf1bb8687'),
    ('pd-protocol', 'fixed', 0, {'requests': 100}, None,
     '4e5fa824bd69e66837e356f3eae4610cf17494a617da9dacae1677164128f249', 1311, 1304,
     '0d9a366d1980df7275f6e97a6e7a172e', 'f9bcf37a2ac997deb6f393ec7c70b9df', None),
    ('pd-protocol', 'pre_35281', 1, {'requests': 100, 'backend': 'nixl'}, 'drop=0.02,duplicate=0.02,reorder=0.05,garble=0.02',
     'd2afbf1fb90f39bf44ae81d2c0f878b81ed244f1c0629cab27f7817a3a802b6b', 710, 611,
     'e7e78d896cd6bc3cec327b87cd91d9fb', '03d549bd54cde7953676ab55330c1b6e', None),
    ('pd-protocol', 'sglang_0_5_23', 0, {'requests': 100, 'staging': 1}, 'drop=0.01,garble=0.01,crash=prefill@3',
     '66b064da9993e863acc6360077e11ada3087faacce98abedddd62069f639ccb7', 309, 265,
     '4980df5fbd7499e8f36b0ac2b9b814da', 'a715042beceb7ec87a000abe4e560410', None),
    ('kv-offload', 'fixed', 0, {'requests': 100}, None,
     'c2136657368ec99d4fd65e9b2b0988521d0b28ffc54d370e42ad66f55480a13a', 206, 435,
     '5df54530956a5b85bd3b648d8e5a08c1', '4e4393465d096243cb8d4a76f93490f6', None),
    ('kv-offload', 'pre_already_stored_fix', 1, {'requests': 100, 'cache_policy': 'arc'}, None,
     'a6f5f7ac6a149e8cfa11fdc66bd93a2967e92ba733ccf3857434f236bb130fad', 210, 448,
     'e67aab43a381257be18b814dca53c4b3', 'e8d5bb4b1442f0603c28860f26a4ed25', None),
    ('pipelined-transfer', 'fixed', 0, {}, None,
     '09edb8d94958882540b513b8e81861723fc6b86104f6064400347fc26c842a51', 152, 128,
     'c850b26b67ef73a049e7e2ab4f3a6d41', '64b1ddc9380697c4ebb37adab360be63', None),
    ('pipelined-transfer', 'pre_15519', 1, {'requests': 6}, 'drop=0.05,duplicate=0.05',
     'da95776d4af420e1481b25cdf4637e8be618557678278e4097b8397c77150e2c', 117, 102,
     '1f7f096fb0946668e28a7c1c7ec4c15d', 'c4d6b501a2649e510f2f4842ec09c0f2', None),
    ('pipelined-transfer', 'fixed', 2, {'requests': 6}, 'crash=receiver@0.5',
     'ba55d48cc9b101bc3b46fd10512f5bda59d2042966b590afa40fa8acbb953666', 97, 48,
     'ae5a2eaebf00ef20da7b1a573fe95512', 'dff994d0c12a37de50ba3a82ae2d6c3a', None),
    ('swa-budget', 'fixed', 0, {'requests': 100}, None,
     '48b77714055c212577d384b28b5ebaff5b1aec834eb668e8ff5038338c336ab2', 821, 1341,
     '5c684502d704f038da5856f58626c017', '7cb8608e59bbbf28dc53995a4f842248', None),
    ('swa-budget', 'pre_af7c62e', 1, {'requests': 100}, None,
     'f54ae631cc542868caf22595ffb01bb5f4db849b8753d0e763045a48de771e95', 902, 1360,
     '1ddea6be15b3688467eb0723ba1b1e88', '17430cd772a05e7927c2da8f7b6590d4', None),
    ('kv-cache-manager', 'fixed', 0, {'requests': 200}, None,
     '72bfcff5bcdae9689cb7e96179580f975778e1d2e03b446dab099b0540d1549b', 746, 3170,
     '78cd90642a81a53ae7de32591eff8ded', '0115ba0b847e115e2e9b9a37b91d8bf9', None),
    ('kv-cache-manager', 'pre_48195', 0, {'groups': 'full,swa,mamba', 'num_blocks': 80}, None,
     '48a57d4ff4c8fb7f4fdb1d0fb5d9c4973e5d0f11903975d792891b81b4da0fd2', 170, 664,
     '5f08372c26f93a5ca7517cf3b2c1eada', 'd6cd39572645dc1801cab046322b4d3f', None),
    ('kv-cache-manager-pd', 'fixed', 0, {'requests': 100}, None,
     '2cc75fdd61ea82cf533986c27f8a63ab402517f25ce2224ae031b8d2735ffa05', 457, 1600,
     '02f14095c16be3b53818f026cc7f1fca', 'c1cf777b9763398091cb63c4ce76e9ee', None),
    ('kv-cache-manager-pd', 'pre_50297', 0, {}, None,  # the race: a producer finished with no blocks at 2.86 s
     '8240c16aedb20d1e9ef4e7913aaa4780a15a87090253c6f33e779acb86b52b58', 273, 820,
     '44a05d0a59e46e6ee03fbc781dc47a48', '4287df42700d36590bdf88739b5ce58b', None),
    ('radix-cache', 'fixed', 0, {'requests': 100}, None,
     '08659e0cc1fc2be12afaae7b5ba1c03c7a82d7ae7d2939a5f662a6a0c8d610b2', 358, 1780,
     '3f76b7119765413d139299165cb81a87', '565aec112fad635f7c15f14a89833fbe', None),
    ('radix-cache', 'fixed', 1, {'requests': 100, 'page_size': 1, 'num_pages': 60, 'need_sort': 1, 'families': 2}, None,
     'd758dcb1956af880965d1361ded2ee6b8b854440e5475119a7530a1c65fa7cc8', 750, 3341,
     '527bd143f4be0f393d27fc696847ebf2', '92b3b66fdd23caf049f59dc871787d95', None),
    ('radix-cache', 'fixed', 2, {'requests': 100, 'num_draft_tokens': 3}, None,  # EAGLE speculative decoding
     'e9eb13745dbe26c4e8e2384ad50ccdaf6b555ea97d8ee87e6b6334b8e97498d2', 350, 950,
     '193b5bcd0fc5434a7efa9402a6d6e499', 'c38ade8b006140085289b042c0c2f2f0', None),
]


def _id(row):
    return f"{row[0]}/{row[1]}/{row[2]}/{','.join(f'{k}={v}' for k, v in row[3].items())}/{row[4]}"


@pytest.mark.parametrize("row", PINS, ids=[_id(r) for r in PINS])
def test_simulation_is_pinned(row):
    model, variant, seed, params, faults, trace, events, steps, body, summary, state = row
    r = simulate_model(SPECS.model(model), variant, seed, params, faults)
    lines = r.recorder.lines()
    assert (r.digest, r.events, len(lines) - 2) == (trace, events, steps)
    assert hashlib.sha256("\n".join(lines[1:]).encode()).hexdigest()[:32] == body
    assert digest(r.summary, 32) == summary
    if state is not None:
        assert digest(r.driver.state, 32) == state


STREAMED = [row for row in PINS if row[0] == "pd-staging" and row[4] is not None][:2]


@pytest.mark.parametrize("row", STREAMED, ids=[_id(r) for r in STREAMED])
def test_streamed_steps_are_the_kept_ones(row, tmp_path):
    """`on_step` (what `kvsim replay` compares) sees the lines the file holds; a run keeping no step has the digest."""
    model, variant, seed, params, faults, trace = row[:6]
    spec = SPECS.model(model)
    seen = []
    lean = simulate_model(spec, variant, seed, params, faults, keep_steps=False,
                          on_step=lambda line, sim: seen.append(dict(line)))
    assert lean.digest == trace and len(seen) == row[7]
    kept = simulate_model(spec, variant, seed, params, faults)
    assert kept.recorder.steps == seen
    path = tmp_path / "run.jsonl"
    kept.recorder.write(str(path))
    replay = replay_file(str(path), {spec.name: spec})
    assert replay.matches and replay.digest == trace and replay.steps == row[7]


class _Point(NamedTuple):
    x: int
    y: float


@dataclass(frozen=True)
class _Box:
    name: str
    sizes: frozenset


class _Level(enum.IntEnum):
    LOW = 1


class _Mode(enum.Enum):
    ON = "on"


@pytest.mark.parametrize("data", [
    None, 3, "é\n", [1, (2, 3)], Deliver(0, 1, ("REQ", 0, 0, 1, 0)), {2: "b", 10: "a", "k": [None, True]},
    {True: 1, None: 2}, [float("nan"), float("inf"), -0.0, 1e-300], _Point(1, 2.5), _Box("b", frozenset({3, 1})),
    [_Level.LOW, _Mode.ON], Rooms.of(range(40)), {"nested": {"z": [{"b": 1, "a": 2}]}},
])
def test_a_recorded_step_is_its_canonical_json(data):
    """The recorder encodes a step once, with its own prebuilt encoder: the same text as `canonical_json`."""
    rec = TraceRecorder({"model": "m", "seed": 0})
    rec.record(0.25, "e", data)
    rec.record(1.0, "f", data)
    ref = hashlib.sha256(canonical_json({"kvsim_trace": 1, "model": "m", "seed": 0}).encode())
    for i, t, event in ((0, 0.25, "e"), (1, 1.0, "f")):
        line = {"i": i, "t": t, "event": event, "data": to_jsonable(data)}
        ref.update(b"\n" + canonical_json(line).encode())
        assert rec.lines()[1 + i] == canonical_json(line)
        assert canonical_json(rec.steps[i]) == canonical_json(line)
    assert rec.digest() == ref.hexdigest() and len(rec.steps) == 2
