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


# -- the test tree mirrors the packages -------------------------------------------------------------------

TESTS = ROOT / "tests"
# The house-wide checks: they test the repository as a whole, not one package, and stay at the top of tests/.
HOUSE_WIDE = {
    "test_house.py": "these house rules",
    "test_readme.py": "the README's set-up commands and .ci/run",
    "test_notebooks.py": "notebooks/ re-executed",
    "test_gpu_check.py": "scripts/gpu_check.sh",
    "test_docs.py": "README.md and docs/: length, links, the tour's transcripts",
    "test_package.py": "the sdist and wheel built and installed, and examples/ci's workflows run with them",
}
# The shared helpers, imported by basename from every folder: tests/ is on sys.path because pytest's prepend
# import mode puts the folder of tests/conftest.py there (and each test file's own folder).
HELPERS = {"conftest.py", "clihelp.py", "toys.py", "conform_toys.py", "oraclehelp.py"}
# tests/<area>/ -> the package folder it mirrors
AREAS = {"engine": "kvsim/engine", "app": "kvsim/app", "conform": "kvsim/conform", "testing": "kvsim/testing",
         "oracle": "gpu_oracle", "models": "models"}
WHERE = """where a test file goes (no __init__.py anywhere in tests/, so every basename is unique):
  tests/engine/            kvsim.engine: contracts, explore and its options, stores, workers, checkpoints,
                           the simulator, traces, the conformance frame (kvsim.engine.conformance)
  tests/app/               kvsim.app: the command line and its commands (cli, catalog, repro, simulate, fuzz,
                           junit, show, site, outputs), the catalog's loading whatever the model
  tests/conform/           kvsim.conform whatever the engine: source, loader, kernels, measures, releases, its CLI
  tests/conform/<engine>/  one engine's conform targets (a folder of kvsim/conform/: vllm, sglang, flashinfer),
                           named test_conform_*.py
  tests/models/<model>/    one package of models/ with its properties/<model>/ (and its catalog data),
                           named test_<model>_*.py
  tests/oracle/            gpu_oracle (kernels, runtime), named test_oracle_*.py
  tests/testing/           kvsim.testing: the pytest plugin
  tests/ (top level)       only the house-wide checks of the whole repository listed in HOUSE_WIDE
                           (house rules, README, docs, notebooks, scripts): add one there with its reason"""


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_test_tree_mirrors_the_packages():
    bad = []
    for path in _test_files():
        rel = path.relative_to(TESTS)
        name, folders = rel.name, rel.parts[:-1]
        if not name.startswith("test_"):
            if folders or name not in HELPERS:
                bad.append(f"{rel}: a helper other than {sorted(HELPERS)}, or not at the top")
            continue
        if not folders:
            if name not in HOUSE_WIDE:
                bad.append(f"{rel}: a test file at the top of tests/ that is not house-wide")
            continue
        area = folders[0]
        if area not in AREAS:
            bad.append(f"{rel}: tests/{area}/ mirrors no package")
        elif area in ("conform", "models") and len(folders) == 2:
            package = ROOT / AREAS[area] / folders[1]
            if not (package / "__init__.py").exists():
                bad.append(f"{rel}: {AREAS[area]}/{folders[1]} is no package")
            prefix = "test_conform_" if area == "conform" else f"test_{folders[1]}"
            if not name.startswith(prefix):
                bad.append(f"{rel}: not named {prefix}*")
        elif len(folders) != 1 or area == "models":
            bad.append(f"{rel}: too deep, or not in a model's folder")
        elif area == "oracle" and not name.startswith("test_oracle_"):
            bad.append(f"{rel}: not named test_oracle_*")
    assert bad == [], "\n".join(bad) + "\n" + WHERE


def test_every_model_and_engine_has_its_test_folder_and_basenames_are_unique():
    for area in ("models", "conform"):
        packages = {p.parent.name for p in (ROOT / AREAS[area]).glob("*/__init__.py")}
        folders = {p.name for p in (TESTS / area).iterdir() if p.is_dir() and p.name != "__pycache__"}
        assert packages == folders, (area, packages, folders)
        assert all(any((TESTS / area / f).glob("test_*.py")) for f in folders)
    assert not list(TESTS.rglob("__init__.py"))
    names = [p.name for p in _test_files()]
    assert sorted(n for n in set(names) if names.count(n) > 1) == [], WHERE


def test_every_test_file_the_code_and_docs_name_exists():
    # a hint, a docstring or a doc pointing at a test file that moved sends its reader nowhere (a path of an
    # engine's own tests, vLLM's tests/v1/..., is not ours)
    named = re.compile(r"(?<![\w/.-])tests/(?:(?:" + "|".join(AREAS) + r")/[\w/]*)?test_\w+\.py")
    tracked = subprocess.run(["git", "ls-files", "kvsim", "models", "properties", "docs", "README.md"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    missing = sorted({f"{f}: {m}" for f in tracked if f.endswith((".py", ".md", ".toml"))
                      for m in named.findall((ROOT / f).read_text(encoding="utf-8")) if not (ROOT / m).is_file()})
    assert missing == [], "\n".join(missing)
