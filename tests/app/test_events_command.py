"""`kvsim events FILE`: exit 0 with a summary for a stream the block-pool model allows, 1 with the first event it
does not (and the events before it), 2 with one line naming the line and field for a file that is not a stream of
`KVEventBatch` documents; the text is the render of the saved document alone."""

from __future__ import annotations

import io
import json
import sys

import pytest

from kvsim.app import cli, commands


def _stored(hashes, parent=None, size=2):  # type: ignore[no-untyped-def]
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": list(range(len(hashes) * size)), "block_size": size, "lora_id": None, "medium": "GPU",
            "lora_name": None, "group_idx": 0}


def _removed(h):  # type: ignore[no-untyped-def]
    return {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0}


CLEAN = [[0.0, [_stored([1, 2])], None], [1.0, [_stored([3], parent=2), _removed(3)]],
         {"ts": 2.0, "events": [_removed(2), _removed(1), {"type": "AllBlocksCleared"}]}, [3.0, [_stored([1])]]]
BAD = CLEAN[:2] + [[2.0, [_removed(2), _removed(2)]]]


def _write(tmp_path, rows, tail=""):  # type: ignore[no-untyped-def]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return str(path)


def _main(capsys, *argv):  # type: ignore[no-untyped-def]
    code = cli.main(["events", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_clean_stream_exits_0_with_its_summary(tmp_path, capsys):  # type: ignore[no-untyped-def]
    path = _write(tmp_path, CLEAN)
    code, out, err = _main(capsys, path, "--num-blocks", "4", "--block-size", "2")
    assert (code, err) == (0, "")
    assert out == f"{path}: 4 batches, 7 events (3 BlockStored of 4 hashes, 3 BlockRemoved of 3, 1 AllBlocksCleared) " \
                  "hold against the block-pool model; 1 blocks announced at the end\n"
    code, out, _ = _main(capsys, path, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and (doc["batches"], doc["events"], doc["announced"]) == (4, 7, 1)


def test_a_violating_stream_exits_1_at_its_first_refused_event(tmp_path, capsys):  # type: ignore[no-untyped-def]
    path = _write(tmp_path, BAD)
    code, out, _ = _main(capsys, path, "--window", "2")
    assert code == 1
    assert out.splitlines() == [
        f"{path}:3: batch 2 event 1: no state of the block-pool model allows it",
        "  BlockRemoved [2] (group 0, GPU)",
        "  why: BlockRemoved(2): expected a hash a BlockStored announced in group 0 (medium GPU) and not removed "
        "since, got none live",
        "  after 3 batches, 4 events (2 BlockStored of 3 hashes, 2 BlockRemoved of 2, 0 AllBlocksCleared); the "
        "events before it:",
        "    line 2 batch 1 event 1: BlockRemoved [3] (group 0, GPU)",
        "    line 3 batch 2 event 0: BlockRemoved [2] (group 0, GPU)"]
    code, out, _ = _main(capsys, path, "--json", "--window", "0")
    bad = json.loads(out)["violation"]
    assert (code, bad["line"], bad["batch"], bad["index"], bad["check"], bad["before"]) == (1, 3, 2, 1, "enabled", [])
    assert bad["event"] == _removed(2)
    code, out, _ = _main(capsys, _write(tmp_path, CLEAN), "--num-blocks", "2")
    assert code == 1 and out.startswith(f"{tmp_path}/events.jsonl:1: batch 0 event 0: no state of the block-pool "
                                        "model allows it [pool_bound]")


@pytest.mark.parametrize("rows, tail, where, field", [
    (CLEAN, '[4.0, [{"type": "BlockRem', ":5: not valid JSON (Unterminated string", "batch"),
    (CLEAN[:1] + [{"events": []}], "", ":2: ts: expected a field of KVEventBatch", "ts"),
    (CLEAN[:1] + ["a batch"], "", ":2: batch: expected a KVEventBatch", "batch"),
    (CLEAN[:1] + [[1.0, [{"type": "BlockRemoved", "block_hashes": 5}]]], "",
     ":2: events[0].block_hashes: expected a list of block hashes (strings or integers), got an integer 5",
     "events[0].block_hashes"),
    (CLEAN, "\n", ":5: not valid JSON (Expecting value, column 1)", "batch"),
])
def test_a_malformed_stream_is_one_error_line_exit_2(tmp_path, capsys, rows, tail, where, field):
    # type: ignore[no-untyped-def]
    path = _write(tmp_path, rows, tail)
    code, out, err = _main(capsys, path)
    assert (code, out) == (2, "") and err.startswith(f"kvsim: error: {path}{where}") and err.count("\n") == 1, err
    assert "truncated?" in err if tail.startswith("[4.0") else "truncated?" not in err
    code, out, err = _main(capsys, path, "--json")
    error = json.loads(out)["error"]
    assert code == 2 and error["field"] == field and error["message"] == err[len("kvsim: error: "):-1]


@pytest.mark.parametrize("argv, message", [
    (["--num-blocks", "1"], "--num-blocks: expected an integer >= 2"),
    (["--parent-groups", "0,x"], "--parent-groups: expected group indices"),
    (["--window", "5000"], "--window: expected an integer <= 1000"),
])
def test_bad_options_are_refused(tmp_path, capsys, argv, message):  # type: ignore[no-untyped-def]
    code, _, err = _main(capsys, _write(tmp_path, CLEAN), *argv)
    assert code == 2 and message in err


def test_a_missing_file_and_stdin(tmp_path, capsys, monkeypatch):  # type: ignore[no-untyped-def]
    code, _, err = _main(capsys, str(tmp_path / "none.jsonl"))
    assert code == 2 and "cannot read the file" in err
    data = "".join(json.dumps(r) + "\n" for r in BAD).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, _ = _main(capsys, "-")
    assert code == 1 and out.startswith("-:3: batch 2 event 1")


@pytest.mark.parametrize("rows", [CLEAN, BAD], ids=["clean", "violation"])
def test_the_text_is_the_render_of_the_saved_document(tmp_path, capsys, monkeypatch, rows):
    # type: ignore[no-untyped-def]
    module = commands.events
    documents = []
    real = module.run
    monkeypatch.setattr(module, "run", lambda args: documents.append(real(args)) or documents[-1])
    code, out, _ = _main(capsys, _write(tmp_path, rows))
    saved = json.loads(json.dumps(documents[0]))
    assert module.render(saved) + "\n" == out and module.exit_code(saved) == code
