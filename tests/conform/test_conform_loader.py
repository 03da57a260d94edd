"""kvsim.conform.source and .loader: real wheels from the cache, definitions loaded without the engine."""

from __future__ import annotations

import os
import shutil
import textwrap
import threading
import time
import types
import zipfile
from pathlib import Path

import pytest

from kvsim.conform import source
from kvsim.conform import loader
from kvsim.conform.loader import Inert, answered_by, check_signature, load_definitions, names_in
from kvsim.conform.source import resolve_source
from kvsim.engine.errors import ConfigError

MLA = "vllm/model_executor/layers/attention/mla_attention.py"


@pytest.fixture(scope="module")
def vllm_src():
    return resolve_source("vllm", version="0.33.0")  # a failed download fails here with pip's reason


def test_definitions_load_without_the_engine(vllm_src):
    ns = load_definitions(vllm_src.file(MLA), ["plan_mla_context_chunks"])
    plans = ns.plan_mla_context_chunks([10, 0, 30], 16, 16, 4, lambda rows: rows)
    assert [(p.request_start, p.starts, p.seq_lens) for p in plans] == [(0, [0], [10]), (2, [0], [16]),
                                                                       (2, [16], [14])]
    # round_down came from upstream's own vllm/utils/math_utils.py, not a stub
    assert not isinstance(ns.plan_mla_context_chunks.__globals__["round_down"], Inert)
    assert str(vllm_src.root) not in str(os.path.dirname(__file__))


def test_missing_definition_is_one_line_error(vllm_src):
    with pytest.raises(ConfigError) as info:
        load_definitions(vllm_src.file(MLA), ["plan_mla_context_chunks_v2"], where=MLA, version="vllm 0.33.0")
    message = str(info.value)
    assert "\n" not in message
    assert f"{MLA}:plan_mla_context_chunks_v2" in message and "absent in vllm 0.33.0" in message


def test_missing_file_names_it(vllm_src):
    with pytest.raises(ConfigError, match="vllm/no/such.py"):
        vllm_src.file("vllm/no/such.py")


def test_changed_signature_names_what_changed(vllm_src):
    ns = load_definitions(vllm_src.file(MLA), ["plan_mla_context_chunks"])
    check_signature(ns.plan_mla_context_chunks,
                    ["context_lens", "row_budget", "max_context_chunk", "split_alignment", "padded_rows"], MLA)
    with pytest.raises(ConfigError, match="signature changed") as info:
        check_signature(ns.plan_mla_context_chunks, ["context_lens", "row_budget"], f"{MLA}:plan_mla_context_chunks")
    assert "split_alignment" in str(info.value)


def test_planted_change_in_a_copied_tree_is_picked_up(vllm_src, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(vllm_src.root, tree, copy_function=os.link)
    target = tree / MLA
    text = target.read_text()
    assert text.count("if rows + request_rows > row_budget:") == 1
    target.unlink()  # the copy is a hard link: replace, never write through
    target.write_text(text.replace("if rows + request_rows > row_budget:", "if rows + request_rows >= row_budget:"))
    planted = resolve_source("vllm", from_path=str(tree))
    assert planted.origin.startswith("directory") and planted.version == "0.33.0"
    ns = load_definitions(planted.file(MLA), ["plan_mla_context_chunks"])
    good = load_definitions(vllm_src.file(MLA), ["plan_mla_context_chunks"]).plan_mla_context_chunks
    assert [p.seq_lens for p in good([16], 16, 16, 4, lambda r: r)] == [[16]]
    assert [p.seq_lens for p in ns.plan_mla_context_chunks([16], 16, 16, 4, lambda r: r)] == [[12], [4]]


def test_unknown_imports_are_inert_and_decorators_pass_through(tmp_path):
    pkg = tmp_path / "eng"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("def double(x):\n    return 2 * x\n")
    (pkg / "mod.py").write_text(textwrap.dedent("""
        import math
        import transformers
        from eng.helpers import double
        from some_cuda_thing import custom_op, Base
        UNUSED = transformers.AutoModel.from_pretrained("x")

        def helper(n):
            return math.isqrt(n)

        @custom_op("eng::f")
        class Thing(Base):
            def f(self, n):
                return double(helper(n))
    """))
    ns = load_definitions(pkg / "mod.py", ["Thing"])
    assert ns.Thing().f(17) == 8
    assert "UNUSED" not in ns.Thing.f.__globals__


def test_a_text_is_parsed_once_and_a_changed_file_is_read_again(tmp_path, monkeypatch):
    """Definitions of one file loaded again (and `names_in` of it) parse it once; the file changed (a planted edit, a
    mutant's text) is parsed anew, and no more than `PARSED_KEPT` texts are kept."""
    monkeypatch.setattr(loader, "_PARSED", type(loader._PARSED)())
    parses: list[str] = []
    real = loader.Parsed.of.__func__
    monkeypatch.setattr(loader.Parsed, "of", classmethod(lambda cls, text, filename: parses.append(filename)
                                                         or real(cls, text, filename)))
    pkg = tmp_path / "eng"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("import os\nSCALE = 2\ndef double(x):\n    return SCALE * x\n"
                                    "def triple(x):\n    return 3 * x\n")
    mod = pkg / "mod.py"
    mod.write_text("from eng.helpers import double, triple\ndef f(n):\n    return double(n) + triple(n)\n"
                   "def g(n):\n    return -n\n")
    assert load_definitions(mod, ["f"]).f(1) == 5
    assert load_definitions(mod, ["f", "g"]).g(4) == -4
    assert names_in(pkg / "helpers.py") == {"os", "SCALE", "double", "triple"}
    assert names_in(pkg / "helpers.py", imports=False) == {"SCALE", "double", "triple"}
    assert sorted(parses) == [str(pkg / "helpers.py"), str(mod)]  # each text once: helpers' for two names and names_in
    mod.write_text("from eng.helpers import double\ndef f(n):\n    return double(n) + 1\n")
    assert load_definitions(mod, ["f"]).f(1) == 3
    assert parses.count(str(mod)) == 2
    for i in range(loader.PARSED_KEPT + 5):
        loader.parse(f"X = {i}\n", f"t{i}.py")
    assert len(loader._PARSED) == loader.PARSED_KEPT and ("t0.py", "X = 0\n") not in loader._PARSED


def test_wheel_and_package_dir_sources(vllm_src):
    sglang = resolve_source("sglang", version="0.5.23")
    assert sglang.file("sglang/srt/disaggregation/decode.py").is_file()
    assert resolve_source("vllm", from_path=str(vllm_src.root / "vllm")).root == vllm_src.root
    with pytest.raises(ConfigError, match="--from"):
        resolve_source("vllm", from_path="/nonexistent/vllm")
    with pytest.raises(ConfigError, match="engine"):
        resolve_source("tgi")


def test_an_answer_stands_in_for_the_file_in_this_thread_only(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    return 1\n\n\ndef g():\n    return 10\n")

    def answer(p, names, **kw):  # f from the caller, the rest from the file (the answer runs unset)
        loaded = vars(load_definitions(p, [n for n in names if n != "f"], **kw)) if names != ["f"] else {}
        return types.SimpleNamespace(**loaded, **({"f": lambda: 2} if "f" in names else {}))

    with answered_by(answer):
        both = load_definitions(path, ["f", "g"])
        assert (both.f(), both.g()) == (2, 10)
        elsewhere: list[int] = []
        thread = threading.Thread(target=lambda: elsewhere.append(load_definitions(path, ["f"]).f()))
        thread.start()
        thread.join()
        assert elsewhere == [1]
    assert load_definitions(path, ["f"]).f() == 1


def test_processes_fetching_one_release_at_once_see_one_whole_wheel(tmp_path, monkeypatch):
    """Two fetches of the same release on an empty cache: one download, and neither sees half a wheel."""
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path))
    calls = []

    def slow_pip(dist, version, into, stem):  # writes the wheel in two steps, as a download does
        calls.append(dist)
        wheel = into / f"{stem}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("vllm/__init__.py", "")
            time.sleep(0.3)
            archive.writestr("vllm/x.py", "A = 1\n")
        return wheel

    monkeypatch.setattr(source, "_pip_download", slow_pip)
    got: list = []

    def fetch():
        wheel = source.download_wheel("vllm", "9.9.9")
        got.append(sorted(zipfile.ZipFile(wheel).namelist()))

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [["vllm/__init__.py", "vllm/x.py"]] * 2 and calls == ["vllm"]


def test_an_optional_upstream_file_absent_from_a_release_loads_nothing(tmp_path):
    """A file a later release split out (`Upstream.optional`): absent, the target still runs with nothing of it;
    a required file absent is "not present"; an optional one loads no names."""
    from types import SimpleNamespace

    from kvsim.conform.run import load_upstream
    from kvsim.conform.source import EngineSource
    from kvsim.engine.conformance.declare import Upstream
    from kvsim.engine.conformance.runner import NotPresent

    source = EngineSource("sglang", "0.0.1", tmp_path, "test tree")
    assert load_upstream(source, Upstream("sglang/later/package.py", (), optional=True)) == SimpleNamespace()
    with pytest.raises(NotPresent, match="sglang/later/package.py: absent in"):
        load_upstream(source, Upstream("sglang/later/package.py", ()))
    with pytest.raises(ValueError, match="an optional file loads no names"):
        Upstream("sglang/later/package.py", ("f",), optional=True)


def test_processes_forked_at_once_write_a_loaded_file_under_names_of_their_own(tmp_path):
    """Two workers forked from one process and loading one file into an empty cache at once each write it under a
    scratch name of its own before renaming it into place (a name both made from an object's id was the same in
    both: one's rename took the other's file away, FileNotFoundError, seen in CI)."""
    from kvsim.conform.loader import scratch

    out = tmp_path / "loaded" / "toy_0123456789abcdef.py"
    names = []
    for _ in range(2):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: what it would write to, sent back
            os.close(read)
            os.write(write, str(scratch(Path(str(out)))).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as got:
            names.append(got.read())
        os.waitpid(pid, 0)
    assert len(set(names)) == 2 and all(n.endswith(".tmp") and Path(n).parent == out.parent for n in names)
