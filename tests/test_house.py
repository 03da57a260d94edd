"""The house rules: one installed namespace, layers that import one way, no Hypothesis where none is needed,
variants never compared as strings, no reach into another module's private names."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"kvsim": "kvsim", "models": "kvsim.models", "properties": "kvsim.properties",
           "gpu_oracle": "kvsim.gpu_oracle"}


def _modules() -> list[tuple[str, Path]]:
    """(installed dotted name, path) of every module of the four packages."""
    out = []
    for folder, dotted in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out.append((".".join([dotted, *parts]), path))
    return out


def _imports(path: Path, dotted: str) -> list[tuple[str, list[str], ast.AST]]:
    """(absolute module, imported names, node) for every import in a module, relative ones resolved."""
    tree = ast.parse(path.read_text())
    package = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((module, [a.name for a in node.names], node))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, [], node))
    return found


def _run(code: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                          env={**full, **(env or {})}, timeout=300)


NAMESPACE_PROBE = """
import importlib, sys
import kvsim.models.swa_budget.resume, kvsim.gpu_oracle.runtime.build, kvsim.properties.swa_budget
print(kvsim.models.swa_budget.resume.__file__)
import models
print(models.__file__)
"""


def test_the_root_folders_install_under_kvsim_only(tmp_path):
    """A project with its own `models/` package keeps it: kvsim installs no top-level `models`."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    proc = _run(NAMESPACE_PROBE, tmp_path)
    assert proc.returncode == 0, proc.stderr
    ours, theirs = proc.stdout.split()
    assert Path(theirs).parent == tmp_path / "models" and Path(ours).is_relative_to(ROOT)
    bare = tmp_path / "bare"
    bare.mkdir()
    proc = _run("import kvsim.models.swa_budget; import models", bare)
    assert "ModuleNotFoundError: No module named 'models'" in proc.stderr
    proc = _run("import properties", bare)
    assert "No module named 'properties'" in proc.stderr


@pytest.mark.slow
def test_the_wheel_installs_the_same_namespace(tmp_path):
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("kvsim-*.whl")
    target = tmp_path / "site"
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert inst.returncode == 0, inst.stderr[-2000:]
    assert not (target / "models").exists() and not (target / "properties").exists()
    assert (target / "kvsim" / "gpu_oracle" / "kernels" / "zero_kv_blocks" / "zero_kv_blocks.cu").exists()
    assert (target / "kvsim" / "gpu_oracle" / "runtime" / "cuda_cpu_shim.h").exists()
    shipped = {p.parent.name for p in (target / "kvsim" / "properties").glob("*/bugs.toml")}
    assert shipped == {p.parent.name for p in (ROOT / "properties").glob("*/bugs.toml")} and len(shipped) == 8
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    (work / "models" / "__init__.py").write_text("")
    proc = _run(NAMESPACE_PROBE, work, env={"PYTHONPATH": str(target)})
    assert proc.returncode == 0, proc.stderr
    ours, theirs = proc.stdout.split()
    assert Path(ours).is_relative_to(target) and Path(theirs).parent == work / "models"
    proc = _run("from kvsim.app import catalog; print(len(catalog.load().bugs))", work, env={"PYTHONPATH": str(target)})
    reports = sum(len(tomllib.loads(p.read_text())["bug"]) for p in (ROOT / "properties").glob("*/bugs.toml"))
    assert proc.returncode == 0 and proc.stdout.split() == [str(reports)], proc.stderr


def test_pyproject_lists_every_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {dotted for dotted, path in _modules() if path.name == "__init__.py"}
    assert set(config["packages"]) == packages
    assert config["package-dir"] == {v: k for k, v in FOLDERS.items()}


def test_layers_import_one_way():
    """engine -> nothing of ours above it; models -> engine; properties -> models, engine; app on top."""
    allowed = {
        "kvsim.engine": ("kvsim.engine",),
        "kvsim.models": ("kvsim.engine", "kvsim.models"),
        "kvsim.properties": ("kvsim.engine", "kvsim.models", "kvsim.properties", "kvsim.gpu_oracle"),
        "kvsim.gpu_oracle": ("kvsim.engine", "kvsim.models", "kvsim.properties", "kvsim.gpu_oracle"),
    }
    bad = []
    for dotted, path in _modules():
        layer = next((k for k in allowed if dotted == k or dotted.startswith(k + ".")), None)
        if layer is None:
            continue
        for module, _, node in _imports(path, dotted):
            if module.split(".")[0] == "kvsim" and module != "kvsim" and not module.startswith(allowed[layer]):
                bad.append(f"{dotted}:{node.lineno} imports {module}")
            if module == "kvsim" and layer != "kvsim.engine":
                bad.append(f"{dotted}:{node.lineno} imports the kvsim package itself")
    assert bad == []


def test_no_module_imports_a_private_name_of_another():
    bad = []
    for dotted, path in _modules():
        for module, names, node in _imports(path, dotted):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and module.startswith("kvsim") and module != dotted:
                bad.append(f"{dotted}:{node.lineno} imports {private} from {module}")
    assert bad == []


def test_imports_come_first():
    """No import below a definition (the old registration-order trick)."""
    bad = []
    for dotted, path in _modules():
        seen_code = False
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if seen_code:
                    bad.append(f"{dotted}:{node.lineno}")
            elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
                seen_code = True
    assert bad == []


# `variant == "fixed"`, `variant != 'pre_x'`, `variant in ("a", "b")`, `variant not in VARIANTS`, `check_variant(`
# (a loop `for variant in (...)` over records is fine)
VARIANT_STRING = re.compile(r"""(?<!for )\bvariant\s*(==|!=|\bin\b|\bnot in\b)\s*(["'(]|VARIANTS)|\bcheck_variant\(""")


def test_models_and_properties_never_compare_a_variant_as_a_string():
    bad = []
    for dotted, path in _modules():
        if dotted.startswith(("kvsim.models", "kvsim.properties", "kvsim.gpu_oracle")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if VARIANT_STRING.search(line):
                    bad.append(f"{dotted}:{n}: {line.strip()}")
    assert bad == []


NO_HYPOTHESIS = """
import sys, contextlib, io
from kvsim.app.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main({args!r})
print(code, "hypothesis" in sys.modules, sorted(m for m in sys.modules if m.endswith(".strategies")))
"""


@pytest.mark.parametrize("args", [
    ["list"],
    ["list", "pd-staging"],
    ["explore", "swa-budget"],
    ["explore", "pd-protocol", "--backend", "mori"],
    ["simulate", "pd-staging", "--param", "requests=20"],
    ["simulate", "swa-budget", "--param", "requests=20", "--trace", "{trace}"],
])
def test_list_explore_simulate_replay_import_no_hypothesis(tmp_path, args):
    trace = str(tmp_path / "t.jsonl")
    args = [a.replace("{trace}", trace) for a in args]
    proc = _run(NO_HYPOTHESIS.format(args=args), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[-2] in ("0 False []", "1 False []")
    if "--trace" in args:
        proc = _run(NO_HYPOTHESIS.format(args=["replay", trace]), tmp_path)
        assert proc.stdout.split("\n")[-2] == "0 False []", proc.stdout + proc.stderr
