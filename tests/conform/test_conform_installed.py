"""kvsim.conform.installed and installed_child without a release: the dependency table, a failed install, a
release that does not import (each a one-line error), and the child's protocol (tests/conform/vllm/
test_conform_real_manager.py drives the real vLLM manager)."""

from __future__ import annotations

import os

import pytest

from kvsim.conform import installed
from kvsim.conform.installed_child import InstalledChild
from kvsim.conform.source import EngineSource
from kvsim.engine.errors import ConfigError, KvsimError


def test_the_tables_pin_every_distribution_and_never_torch_or_cuda():
    for engine, table in installed.DEPENDENCIES.items():
        assert "default" in table and engine in installed.CHECKED_MODULES
        for pinned in table.values():
            assert len(set(pinned)) == len(pinned)
            for pin in pinned:
                name, sep, version = pin.partition("==")
                assert sep and version and name, pin
                assert not name.lower().startswith(installed.FORBIDDEN), pin


def test_an_engine_without_a_table_is_a_config_error():
    with pytest.raises(ConfigError, match="real-import table"):
        installed.pins("flashinfer", "0.7.4")


def test_a_failed_install_is_one_line_with_pips_reason_and_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(installed.DEPENDENCIES["vllm"], "0.0.1", ("regex==not a version",))  # refused by pip itself
    with pytest.raises(KvsimError) as raised:
        installed.install_dependencies("vllm", "0.0.1")
    message = str(raised.value)
    assert message.startswith("installing the import dependencies with pip failed (exit ")
    assert "\n" not in message and "regex" in message, message
    assert [p.name for p in (tmp_path / "deps").iterdir() if not p.name.endswith(".lock")] == []


def test_a_release_that_does_not_import_is_a_config_error_with_the_last_line(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("import kvsim_no_such_module_here\n")
    env = installed.ImportEnvironment(EngineSource("vllm", "0.0.1", tmp_path, "test tree"), tmp_path / "deps", ())
    with pytest.raises(ConfigError) as raised:
        with InstalledChild(env, "kvsim.conform.vllm.real_manager:ManagerDriver", start_timeout=300):
            pass
    assert "No module named 'kvsim_no_such_module_here'" in str(raised.value)
    assert "\n" not in str(raised.value)


def _fake_release(tmp_path):  # type: ignore[no-untyped-def]
    """A tree whose checked module imports at once (nothing of vLLM in it), for the child's own protocol."""
    package = tmp_path / "vllm" / "v1" / "core"
    package.mkdir(parents=True)
    for folder in (tmp_path / "vllm", tmp_path / "vllm" / "v1", package):
        (folder / "__init__.py").write_text("")
    (package / "kv_cache_manager.py").write_text("print('engine output on stdout')\n")
    return installed.ImportEnvironment(EngineSource("vllm", "0.0.1", tmp_path, "test tree"), tmp_path / "deps", ())


def test_the_child_answers_refusals_raises_deaths_and_hangs_and_leaves_no_process(tmp_path):
    from kvsim.engine.conformance.answers import Answered

    driver = "kvsim.conform.installed_child:SelfTest"
    with InstalledChild(_fake_release(tmp_path), driver, timeout=2.0, start_timeout=300) as child:
        # what the engine prints at import goes to stderr, never into the protocol
        assert child.call("echo", value=[1, "a"]) == [1, "a"] and child.import_s >= 0
        assert "engine output on stdout" in child.stderr_tail()
        with pytest.raises(ConfigError, match="one of echo, raise"):
            child.call("evict")
        with pytest.raises(Answered) as raised:
            child.call("raise", message="boom")
        assert (raised.value.answer.type, raised.value.answer.message) == ("ValueError", "boom")
        assert "installed_child.py:" in raised.value.answer.where
        pid = child.process.pid
        with pytest.raises(Answered) as hung:
            child.call("hang")
        assert hung.value.answer.type == "ChildDied" and "within 2.0 s" in hung.value.answer.message
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the hung child (and its process group) is gone
        with pytest.raises(Answered) as died:
            child.call("exit", code=5)  # a fresh child, which then dies
        assert died.value.answer.type == "ChildDied"
        assert child.call("echo", value="again") == "again"
    assert child.process is None


def test_calls_in_one_line_answer_as_each_in_turn_up_to_the_first_that_fails(tmp_path):
    """`calls`: several requests in one round trip give what calling each in turn gives; the first refused or
    raised one is raised as it would be, and the requests after it are not made (an `exit` after it would end
    the child)."""
    from kvsim.engine.conformance.answers import Answered

    driver = "kvsim.conform.installed_child:SelfTest"
    with InstalledChild(_fake_release(tmp_path), driver, timeout=30.0, start_timeout=300) as child:
        pid = child.call("pid")
        assert child.calls([("echo", {"value": 1}), ("pid", {}), ("echo", {"value": [2]})]) == [1, pid, [2]]
        assert child.calls([]) == []
        with pytest.raises(Answered) as raised:
            child.calls([("echo", {"value": 1}), ("raise", {"message": "second"}), ("exit", {"code": 4})])
        assert (raised.value.answer.type, raised.value.answer.message) == ("ValueError", "second")
        with pytest.raises(ConfigError, match="^evict: expected a request the driver knows.*one of echo"):
            child.calls([("evict", {}), ("exit", {"code": 4})])
        assert child.call("pid") == pid  # neither exit was made: the same driver's process answers
        with pytest.raises(Answered) as died:
            child.calls([("echo", {"value": 1}), ("exit", {"code": 4})])
        assert died.value.answer.type == "ChildDied" and "echo then exit" in died.value.answer.where


def test_the_child_ends_without_the_interpreters_teardown(tmp_path):
    """Closed, the child ends at once: no interpreter teardown of the thousands of modules a release loads (about
    1.5 s the parent waited for, at the end of every run), seen here as an exit handler the release registered at
    import, which never runs; its exit status is kept."""
    env = _fake_release(tmp_path)
    marker = tmp_path / "torn-down"
    module = tmp_path / "vllm" / "v1" / "core" / "kv_cache_manager.py"
    module.write_text(module.read_text() + f"import atexit\natexit.register(lambda: open({str(marker)!r}, 'w'))\n")
    with InstalledChild(env, "kvsim.conform.installed_child:SelfTest", timeout=30.0, start_timeout=300) as child:
        assert child.call("echo", value=1) == 1
        process = child.process
    assert process.returncode == 0 and not marker.exists()


def test_the_child_imports_what_several_drivers_use_before_it_forks_them(tmp_path, monkeypatch):
    """`PRELOADED`: imported in the process that imported the release, before a driver's process is forked from it
    (each driver would import it again in its own); one not in the release is left to the driver that asks."""
    env = _fake_release(tmp_path)
    (tmp_path / "vllm" / "shared_by_drivers.py").write_text(
        f"import os\nopen({str(tmp_path / 'imported-by')!r}, 'w').write(str(os.getpid()))\n")
    monkeypatch.setitem(installed.PRELOADED, "vllm", ("vllm.not_in_this_release", "vllm.shared_by_drivers"))
    with InstalledChild(env, "kvsim.conform.installed_child:SelfTest", timeout=30.0, start_timeout=300) as child:
        assert child.call("import", module="vllm.shared_by_drivers") == "vllm.shared_by_drivers"
        importer = int((tmp_path / "imported-by").read_text())
        assert importer == child.process.pid != child.call("pid")  # the zygote's import, not the driver's


def test_a_driver_answers_the_parent_itself_and_the_zygote_only_switches_drivers(tmp_path):
    """One round trip is parent -> driver's process -> parent: with the process that imported the release stopped
    (SIGSTOP), the driver reading the requests still answers them; a request for another driver waits for it (it
    hands the requests over), and is answered once it runs again."""
    import signal
    import threading

    from kvsim.conform.installed_child import close_shared, shared

    env = _fake_release(tmp_path)
    try:
        selftest = shared(env, "kvsim.conform.installed_child:SelfTest", timeout=30.0)
        peer = shared(env, "kvsim.conform.installed_child:SelfTestPeer", timeout=30.0)
        assert selftest.call("echo", value=1) == 1 and peer.call("echo", value=2) == 2
        zygote = selftest.process.pid
        os.kill(zygote, signal.SIGSTOP)
        try:
            assert peer.call("echo", value=3) == 3 and peer.calls([("echo", {"value": 4})]) == [4]
            threading.Timer(1.0, os.kill, (zygote, signal.SIGCONT)).start()
            assert selftest.call("echo", value=5) == 5  # handed over by the zygote, once it runs again
        finally:
            os.kill(zygote, signal.SIGCONT)
        assert peer.call("echo", value=6) == 6
    finally:
        close_shared()


def test_one_child_serves_every_driver_of_a_release(tmp_path):
    """`shared` keeps one child per release: a second driver is made in it on its first request (one import), each
    driver in a process of its own forked from the import."""
    from kvsim.conform.installed_child import close_shared, shared

    env = _fake_release(tmp_path)
    try:
        selftest = shared(env, "kvsim.conform.installed_child:SelfTest", timeout=30.0)
        assert selftest.call("echo", value=1) == 1
        manager = shared(env, "kvsim.conform.vllm.real_manager:ManagerDriver", timeout=30.0)
        assert manager.child is selftest.child
        with pytest.raises(ConfigError, match="ManagerDriver.*vllm.utils"):  # its own driver answers, not echo
            manager.call("echo", value=2)
        assert selftest.call("echo", value=3) == 3 and manager.process.pid == selftest.process.pid
        # the driver answers from its own process, forked from the one that imported the release
        assert selftest.call("pid") not in (selftest.process.pid, os.getpid())
    finally:
        close_shared()


def test_the_child_caches_the_bytecode_of_what_it_imported_from_the_cache_only(tmp_path, monkeypatch):
    import importlib
    import sys
    from importlib.util import cache_from_source

    from kvsim.conform.installed_child import cache_bytecode

    for folder, name in (("cache", "kvsim_planted_in_cache"), ("cache-sibling", "kvsim_planted_beside")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{name}.py").write_text("VALUE = 1\n")
        monkeypatch.syspath_prepend(str(tmp_path / folder))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # as under PYTHONDONTWRITEBYTECODE=1
    for name in ("kvsim_planted_in_cache", "kvsim_planted_beside"):
        monkeypatch.delitem(sys.modules, name, raising=False)
        importlib.import_module(name)
    inside = cache_from_source(str(tmp_path / "cache" / "kvsim_planted_in_cache.py"))
    beside = cache_from_source(str(tmp_path / "cache-sibling" / "kvsim_planted_beside.py"))
    assert not os.path.exists(inside) and not os.path.exists(beside)
    assert cache_bytecode((str(tmp_path / "cache"),)) == 1
    assert os.path.exists(inside) and not os.path.exists(beside)  # a folder sharing the root's prefix is not it
    assert cache_bytecode((str(tmp_path / "cache"),)) == 0  # written once
    assert cache_bytecode(()) == 0  # a user's tree: no root given, nothing written


def test_a_drivers_process_caches_the_bytecode_of_what_its_ops_imported(tmp_path, monkeypatch):
    """A module a driver's op imports on first use (after the release's import, in the driver's own process) gets
    its bytecode written into the cache when that process ends, for the next child to read."""
    from importlib.util import cache_from_source

    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # no import writes bytecode by itself
    env = _fake_release(tmp_path / "src" / "vllm-0.0.1")
    lazy = env.source.root / "vllm" / "lazy_planted.py"
    lazy.write_text("VALUE = 1\n")
    with InstalledChild(env, "kvsim.conform.installed_child:SelfTest", timeout=30.0, start_timeout=300) as child:
        assert child.call("import", module="vllm.lazy_planted") == "vllm.lazy_planted"
        assert not os.path.exists(cache_from_source(str(lazy)))  # the driver's process still runs
        imported = cache_from_source(str(env.source.root / "vllm" / "v1" / "core" / "kv_cache_manager.py"))
        assert os.path.exists(imported)  # the import's own, written by the process that imported the release
    assert os.path.exists(cache_from_source(str(lazy)))


def test_a_mutant_that_did_not_load_is_not_loaded_into_a_driver_made_later(tmp_path):
    """The child keeps what was last loaded for the drivers it makes later; a mutant that did not load is not that
    (the release is: the drivers' processes put it back), so a later driver is made and answers as its own."""
    from kvsim.conform.installed_child import close_shared, shared
    from kvsim.engine.conformance.mutants import Mutant

    env = _fake_release(tmp_path)
    raises = Mutant("vllm/v1/core/kv_cache_manager.py", "<module>", "planted", 1, 0, 5, "print",
                    "raise ValueError('planted')\nprint")
    try:
        selftest = shared(env, "kvsim.conform.installed_child:SelfTest", timeout=30.0)
        assert selftest.call("echo", value=1) == 1
        with pytest.raises(ConfigError, match="ValueError: planted"):
            selftest.configure(raises)
        assert selftest.call("echo", value=2) == 2
        peer = shared(env, "kvsim.conform.installed_child:SelfTestPeer", timeout=30.0)
        assert peer.call("echo", value=3) == 3  # made on the release, not refused for the mutant's sake
        assert peer.call("pid") != selftest.call("pid")
    finally:
        close_shared()
