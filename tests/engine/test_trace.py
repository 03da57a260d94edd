import json

import pytest

from kvsim.app import catalog
from kvsim.engine.errors import TraceError
from kvsim.app.simulate import replay_trace, simulate_model
from kvsim.engine.trace import read_trace
from clihelp import kvsim, kvsim_json

SMALL = ["requests=30"]


def _record(tmp_path, seed=1, variant="fixed"):
    spec = catalog.load().model("swa-budget")
    result = simulate_model(spec, variant, seed, SMALL)
    path = tmp_path / "run.jsonl"
    result.recorder.write(str(path))
    return spec, result, path


def test_same_seed_same_digest_and_different_seed_differs(tmp_path):
    spec = catalog.load().model("swa-budget")
    a = simulate_model(spec, "fixed", 1, SMALL)
    b = simulate_model(spec, "fixed", 1, SMALL)
    c = simulate_model(spec, "fixed", 2, SMALL)
    assert a.digest == b.digest != c.digest
    assert a.recorder.lines() == b.recorder.lines()


def test_digest_is_the_same_in_subprocesses_under_any_hash_seed():
    digests = {kvsim_json("simulate", "swa-budget", "--seed", "4", "--param", "requests=30",
                          env={"PYTHONHASHSEED": h})["digest"] for h in ("0", "1", "12345")}
    spec = catalog.load().model("swa-budget")
    assert digests == {simulate_model(spec, "fixed", 4, SMALL).digest}


def test_replay_of_recorded_trace_matches(tmp_path):
    spec, result, path = _record(tmp_path)
    replay = replay_trace(read_trace(str(path)), spec)
    assert replay.matches and replay.steps == len(result.recorder.steps) and replay.digest == result.digest


def test_replay_of_edited_trace_fails_at_the_edited_line(tmp_path):
    spec, result, path = _record(tmp_path)
    lines = path.read_text().splitlines()
    edited = 7  # 1-based file line of a step
    row = json.loads(lines[edited - 1])
    row["t"] += 1.0
    lines[edited - 1] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    replay = replay_trace(read_trace(str(path)), spec)
    assert not replay.matches and replay.line == edited
    proc = kvsim("replay", str(path))
    assert proc.returncode == 1 and f":{edited}: diverged" in proc.stdout


@pytest.mark.parametrize("damage, line, reason", [
    (lambda ls: ls[:-1], None, "truncated"),
    (lambda ls: ls[:3] + ["{not json"] + ls[4:], 4, "not valid JSON"),
    (lambda ls: ['{"hello": "world"}'] + ls[1:], 1, "not a kvsim trace"),
    (lambda ls: [], 1, "empty file"),
    (lambda ls: ls[:2] + ls[3:], 3, "step number: expected 1, got 2"),
])
def test_damaged_traces_raise_trace_error_naming_the_line(tmp_path, damage, line, reason):
    _, result, path = _record(tmp_path)
    lines = damage(path.read_text().splitlines())
    path.write_text("\n".join(lines) + ("\n" if lines else ""))
    with pytest.raises(TraceError, match=reason) as info:
        read_trace(str(path))
    expected_line = line if line is not None else len(lines) + 1
    assert info.value.line == expected_line
    proc = kvsim("replay", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and f":{expected_line}:" in proc.stderr


def test_binary_and_missing_files(tmp_path):
    _, _, recorded = _record(tmp_path)
    path = tmp_path / "bin.jsonl"
    path.write_bytes(recorded.read_bytes().splitlines()[0] + b'\n\xff\xfe')
    with pytest.raises(TraceError, match="not ASCII") as info:
        read_trace(str(path))
    assert info.value.line == 2
    proc = kvsim("replay", str(tmp_path / "missing.jsonl"))
    assert proc.returncode == 2 and "cannot read the file" in proc.stderr and "Traceback" not in proc.stderr


def test_a_step_line_is_the_canonical_json_of_the_step_it_records():
    """`record` writes a step line's text itself (keys in order, a finite time as its repr): the text, the digest
    and what `on_step` sees are those of `dumps` over the step, for every kind of time, event and data."""
    import enum
    import hashlib
    from typing import NamedTuple

    from kvsim.engine.canon import canonical_json, dumps, to_jsonable
    from kvsim.engine.trace import TraceRecorder
    from kvsim.models.pd_staging.actions import Deliver, ReqMsg

    class Pair(NamedTuple):
        a: int
        b: float

    class Colour(enum.Enum):
        RED = 1

    steps = [(0.0, "arrive", 3), (0.1, "arrive", 4), (1e-300, "deliver", Deliver(0, 1, ReqMsg(2, 0, 1, 0))[1:]),
             (2.5, "deliver", (0, 1, ReqMsg(3, 1, 2, 1))), (3, "int_time", None), (float("inf"), "inf", [1]),
             (float("nan"), "arrive", (float("nan"), True, None, "x\u00e9\n")), (4.0, "named", Pair(1, 2.5)),
             (5.0, "mixed", {2: Colour.RED, "k": frozenset({3, 1})}), (6.0, "caf\u00e9 \"q\"", ("t", 1.5)),
             (7.0, "deliver", (1, 0, ReqMsg(4, 0, 1, 0))),
             # a seen event with a tuple of fields is encoded as it is only where each field is plain or a record
             # of plain values: a record holding a named tuple, a float or another record is converted first
             (8.0, "deliver", (0, Deliver(1, 0, Pair(1, 2.5)))), (9.0, "deliver", (0, ReqMsg(1, 2.5, 0, 0))),
             (10.0, "deliver", (1, Deliver(0, 1, ReqMsg(5, 0, 1, 0)))), (11.0, "deliver", (Pair(3, 0.5),)),
             (12.0, "deliver", (1, ReqMsg(6, float("inf"), None, True)))]
    seen = []
    recorder = TraceRecorder({"model": "toy"}, on_step=seen.append)
    for t, event, data in steps:
        recorder.record(t, event, data)
    lines = [{"i": i, "t": t, "event": event, "data": to_jsonable(data)} for i, (t, event, data) in enumerate(steps)]
    assert recorder.lines()[1:-1] == [dumps(line) for line in lines]
    assert [dumps(line) for line in seen] == [dumps(line) for line in lines]
    expected = hashlib.sha256(canonical_json({"kvsim_trace": 1, "model": "toy"}).encode("ascii"))
    for line in lines:
        expected.update(("\n" + dumps(line)).encode("ascii"))
    assert recorder.digest() == expected.hexdigest()

    # kept without `on_step`, the steps are hashed when the digest is asked for (here half-way, then at the end);
    # kept none, each as it comes: the same lines, the same digests
    half = hashlib.sha256(canonical_json({"kvsim_trace": 1, "model": "toy"}).encode("ascii"))
    for line in lines[:5]:
        half.update(("\n" + dumps(line)).encode("ascii"))
    kept, unkept = TraceRecorder({"model": "toy"}), TraceRecorder({"model": "toy"}, keep=False)
    for n, (t, event, data) in enumerate(steps):
        if n == 5:
            assert kept.digest() == unkept.digest() == half.hexdigest()
        kept.record(t, event, data)
        unkept.record(t, event, data)
    assert kept.lines() == recorder.lines() and kept.steps == recorder.steps
    assert kept.digest() == unkept.digest() == expected.hexdigest()


def test_steps_of_one_time_share_its_text_and_each_line_keeps_its_own_time():
    """`record` writes a time's text once for the steps at that time (an instant's events, an event's steps): each
    line is still `dumps` of its own step, for equal times made apart, a zero after a zero of the other sign (0.0
    and -0.0 are equal, their texts are not) and an integer time equal to the float before it."""
    import hashlib

    from kvsim.engine.canon import canonical_json, dumps
    from kvsim.engine.trace import TraceRecorder

    times = [1.5, 1.5, 0.1 + 0.2, 0.30000000000000004, 0.0, -0.0, -0.0, 0.0, 3.0, 3, 3.0, 1e-300, 1e-300, 2.5]
    steps = [(0.25, "work", (0,))] + [(t, "work", (i,)) for i, t in enumerate(times)]
    recorder = TraceRecorder({"model": "toy"})
    for t, event, data in steps:
        recorder.record(t, event, data)
    lines = [dumps({"i": i, "t": t, "event": event, "data": list(data)}) for i, (t, event, data) in enumerate(steps)]
    assert recorder.lines()[1:-1] == lines
    assert '"t":-0.0}' in lines[7] and '"t":0.0}' in lines[8] and '"t":3}' in lines[10]
    expected = hashlib.sha256(canonical_json({"kvsim_trace": 1, "model": "toy"}).encode("ascii"))
    for line in lines:
        expected.update(("\n" + line).encode("ascii"))
    assert recorder.digest() == expected.hexdigest()


def test_write_gives_the_lines_and_the_digest_whenever_the_digest_was_asked(tmp_path):
    """`write` joins the step lines once, for the file and (none hashed yet) the digest: the file is `lines()` a
    line each, and the digest is the one of a recorder asked for it before, half-way or never, empty or not."""
    from kvsim.engine.trace import TraceRecorder

    steps = [(0.5 * (i // 3), "work", (i,)) for i in range(10)]
    for n in (0, 1, len(steps)):
        recorders = [TraceRecorder({"model": "toy"}) for _ in range(3)]
        for k, (t, event, data) in enumerate(steps[:n]):
            if k == n // 2:
                recorders[1].digest()  # hashed half-way
            for recorder in recorders:
                recorder.record(t, event, data)
        expected = recorders[2].digest()  # asked before writing
        texts = []
        for j, recorder in enumerate(recorders):
            path = tmp_path / f"{n}-{j}.jsonl"
            recorder.write(str(path))
            texts.append(path.read_text(encoding="ascii"))
            assert recorder.digest() == expected
            assert texts[-1] == "\n".join(recorder.lines()) + "\n"
        assert texts[0] == texts[1] == texts[2] and texts[0].count("\n") == n + 2
