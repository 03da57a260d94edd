"""The package as a user gets it, and the CI files of examples/ci that install it.

`python -m build` makes an sdist and a wheel that `twine check` passes and that hold every module and data file of
the four shipped folders; the wheel, installed in a fresh virtual environment (kvsim from the wheel alone, the heavy
dependencies seen through a folder of links to this environment's, kvsim's own left out), runs `kvsim list`, a
`repro` and a `conform --from` a stand-in engine tree. The CI files, parsed, run their shell steps with that
environment against the tree: a push, a pull request that changes no target's file, a merge request that plants a
bug (the install step runs once per file). Steps that only a CI runner can do (checkout, cache, artifact upload)
are checked, not run.
"""

from __future__ import annotations

import ast
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import venv
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml  # the test extra brings pyyaml, build and twine

from kvsim.conform.targets import changed_targets, select_targets

pytestmark = pytest.mark.slow  # a build, a fresh environment and some twenty kvsim and pip runs: ~35 s of CPU

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = {"kvsim": "kvsim", "models": "kvsim/models", "properties": "kvsim/properties",
           "gpu_oracle": "kvsim/gpu_oracle"}  # folder -> where it installs (pyproject's package-dir)
VERSION = ast.literal_eval(re.search(r'^__version__ = (".*")$', (ROOT / "kvsim" / "__init__.py").read_text(),
                                     re.M).group(1))
BUG = "sglang-af7c62e-swa-resume-budget"

# The stand-in engine repository: vLLM's layout, with examples/engine_ci's planner (written for kvsim, not vLLM's)
# in the file the MLA conform targets read, and the engine's own test that hands it to the kvsim_conform fixture.
PLANNER = "vllm/model_executor/layers/attention/mla_attention.py"
ENGINE_TEST = '''\
from vllm.model_executor.layers.attention import mla_attention


def test_mla_planner_conforms_to_kvsim(kvsim_conform):
    kvsim_conform("vllm:plan_mla_context_chunks", mla_attention)
'''
FIT = "return used + cost <= row_budget"  # the planner's fit test: `<` splits a request that exactly fills it
MLA_TARGETS = {"plan_mla_context_chunks", "align_mla_chunked_context_workspace_size"}  # what the planner holds


def _run(argv, cwd: Path, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True)
    assert not check or done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@dataclass(frozen=True)
class Installed:
    wheel: Path
    sdist: Path
    venv: Path
    env: dict[str, str]  # PATH leads to the venv; pip finds every requirement installed and never downloads

    @property
    def site(self) -> Path:
        return self.venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _sources() -> list[str]:
    """The shipped folders' files as a clone has them (tracked, or new and not ignored)."""
    return _run(["git", "ls-files", "-co", "--exclude-standard", *SHIPPED], ROOT).stdout.split()


def _dependencies(into: Path) -> None:
    """Links to every entry of this environment's site-packages folders (CI's lies inside the clone, in .venv) but
    kvsim's own: its editable install, which would put the source tree on the path."""
    into.mkdir()
    for folder in [p for p in sys.path if p.endswith("site-packages")]:
        for entry in sorted(Path(folder).iterdir()):
            name = entry.name.lower()
            own = name.startswith(("kvsim", "__editable__")) or name.endswith(".pth")
            if not (own or (into / entry.name).exists()):
                (into / entry.name).symlink_to(entry)


def _install(root: Path) -> Installed:
    src, dist = root / "src", root / "dist"
    for rel in [*_sources(), "pyproject.toml", "README.md", "MANIFEST.in"]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, src], root)
    (wheel,), (sdist,) = dist.glob("*.whl"), dist.glob("*.tar.gz")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    _dependencies(root / "deps")
    installed = Installed(wheel, sdist, env_dir, _clean_env(env_dir))
    (installed.site / "_kvsim_test_dependencies.pth").write_text(f"{root / 'deps'}\n")
    _run([env_dir / "bin" / "python", "-m", "pip", "install", "-q", wheel], root, installed.env)
    return installed


def _clean_env(env_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON", "VIRTUAL_ENV", "PIP_"))}
    return env | {"PATH": f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}", "VIRTUAL_ENV": str(env_dir),
                  "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "GIT_AUTHOR_NAME": "ci",
                  "GIT_AUTHOR_EMAIL": "ci@example.com", "GIT_COMMITTER_NAME": "ci",
                  "GIT_COMMITTER_EMAIL": "ci@example.com"}


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> Installed:
    """Built and installed once per run: the workers of a parallel run share it (the first builds, under a lock)."""
    base = tmp_path_factory.getbasetemp()
    base = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = base / "kvsim-package"
    with open(base / "kvsim-package.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "installed.json").exists():
            shutil.rmtree(root, ignore_errors=True)
            found = _install(root)
            (root / "installed.json").write_text(json.dumps([str(found.wheel), str(found.sdist), str(found.venv)]))
    wheel, sdist, env_dir = map(Path, json.loads((root / "installed.json").read_text()))
    return Installed(wheel, sdist, env_dir, _clean_env(env_dir))


def _engine_tree(root: Path) -> Path:
    for rel, text in (("vllm/__init__.py", ""), (PLANNER, (ROOT / "examples/engine_ci/toyengine/mla.py").read_text()),
                      ("tests/kvsim/conftest.py", (ROOT / "examples/engine_ci/tests/conftest.py").read_text()),
                      ("tests/kvsim/test_mla_conforms.py", ENGINE_TEST), ("README.md", "an engine\n")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


# -- the package --------------------------------------------------------------------------------------------------

def _installed_name(rel: str) -> str:
    folder, rest = rel.split("/", 1)
    return f"{SHIPPED[folder]}/{rest}"


def test_the_wheel_holds_every_file_and_runs_from_a_fresh_environment(installed, tmp_path):
    sources = _sources()
    data = sorted(_installed_name(r) for r in sources if not r.endswith(".py"))
    assert any(d.endswith(".cu") for d in data) and any(d.endswith("bugs.toml") for d in data)
    with zipfile.ZipFile(installed.wheel) as whl:
        files = {n for n in whl.namelist() if ".dist-info/" not in n}
        (info,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = whl.read(info).decode()
    assert files == {_installed_name(r) for r in sources}  # every module and data file, nothing else
    assert f"\nVersion: {VERSION}\n" in metadata and installed.wheel.name == f"kvsim-{VERSION}-py3-none-any.whl"
    with tarfile.open(installed.sdist) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert set(sources) | {"pyproject.toml", "README.md"} <= names and not any(n.startswith("tests") for n in names)
    _run([sys.executable, "-m", "twine", "check", "--strict", installed.wheel, installed.sdist], tmp_path)

    def kvsim(*argv: str) -> subprocess.CompletedProcess:
        return _run(["kvsim", *argv], tmp_path, installed.env)

    (tmp_path / "models").mkdir()  # a user's own top-level `models` beside the installed kvsim.models
    (tmp_path / "models" / "__init__.py").write_text("")
    where = _run(["python", "-c", "import kvsim, kvsim.models.swa_budget, kvsim.gpu_oracle.runtime.build as b, models; "
                  "print(kvsim.__file__); print(models.__file__); "
                  "print(*sorted(p.name for p in b.KERNEL_DIR.glob('*/*.cu')))"],
                 tmp_path, installed.env).stdout.splitlines()
    assert Path(where[0]).is_relative_to(installed.site)  # kvsim comes from the wheel, not the source tree
    assert where[1] == str(tmp_path / "models" / "__init__.py")  # the root folders install under kvsim only
    assert where[2].split() == sorted(Path(d).name for d in data if d.endswith(".cu"))  # the kernels ship
    assert kvsim("--version").stdout.strip() == f"kvsim {VERSION}"
    # every bugs.toml: the wheel lists what the source tree lists, each in a process of its own (in this one, other
    # tests may have registered toy models in the shared registry)
    tree = subprocess.run([sys.executable, "-m", "kvsim", "list", "--json"], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    assert json.loads(kvsim("list", "--json").stdout) == json.loads(tree.stdout)
    (bug,) = json.loads(kvsim("repro", BUG, "--json").stdout)["bugs"]
    assert (bug["id"], bug["status"], bug["fixed_passes"]) == (BUG, "reproducible", True)
    tree = _engine_tree(tmp_path / "engine")
    doc = json.loads(kvsim("conform", "vllm", "--from", tree, "--target", "align_mla_chunked_context_workspace_size",
                           "--json").stdout)
    assert [(r["target"], r["status"]) for r in doc["results"]] == [("align_mla_chunked_context_workspace_size",
                                                                     "conforms")]
    assert doc["origin"] == f"directory {tree}"


# -- the CI files -------------------------------------------------------------------------------------------------

def _git(tree: Path, env: dict[str, str], *argv: str) -> str:
    return _run(["git", *argv], tree, env).stdout.strip()


def _repository(tmp_path: Path, env: dict[str, str]) -> tuple[Path, str]:
    """The engine tree as a git repository, its default branch committed; (tree, the commit)."""
    tree = _engine_tree(tmp_path / "engine")
    _git(tree, env, "init", "-q", "-b", "main")
    _git(tree, env, "add", "-A")
    _git(tree, env, "commit", "-q", "-m", "engine")
    return tree, _git(tree, env, "rev-parse", "HEAD")


def _change(tree: Path, env: dict[str, str], rel: str, old: str, new: str) -> None:
    """A pull request's commit on a branch: `old` made `new` in `rel`."""
    text = (tree / rel).read_text()
    assert text.count(old) == 1, (rel, old)
    _git(tree, env, "checkout", "-q", "-b", "change")
    (tree / rel).write_text(text.replace(old, new))
    _git(tree, env, "commit", "-q", "-am", "change")


def _cases(path: Path) -> dict[str, str]:
    """A JUnit file's test cases: name -> passed, failure, error or skipped."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = [k for k in ("failure", "error", "skipped") if case.find(k) is not None]
        out[case.get("name")] = kinds[0] if kinds else "passed"
    return out


EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def _github_run(workflow: dict, context: dict[str, str], tree: Path, env: dict[str, str],
                start: int = 0) -> tuple[list[int], str]:
    """The `run` steps of the workflow's job from the `start`th on, in order, as a runner does: bash -e, the workflow's,
    job's and step's `env`, `${{ }}` from `context` (one the test does not know fails it); stops at the first that
    fails. Their exit codes, and the last one's output."""
    def resolve(text: str) -> str:
        unknown = {e for e in EXPRESSION.findall(text) if e not in context}
        assert not unknown, f"an expression this test does not know: {unknown}"
        return EXPRESSION.sub(lambda m: context[m.group(1)], text)

    (job,) = workflow["jobs"].values()
    base = env | {k: resolve(str(v)) for k, v in {**workflow.get("env", {}), **job.get("env", {})}.items()}
    codes, output = [], ""
    for step in [s for s in job["steps"] if "run" in s][start:]:
        assert "if" not in step and "shell" not in step, step  # run as written, whatever the event
        step_env = base | {k: resolve(str(v)) for k, v in step.get("env", {}).items()}
        done = _run(["bash", "--noprofile", "--norc", "-e", "-c", resolve(step["run"])], tree, step_env, check=False)
        codes.append(done.returncode)
        output = done.stdout + done.stderr
        if done.returncode:
            break
    return codes, output


def test_github_actions_workflow_runs_on_a_push_and_a_pull_request(installed, tmp_path):
    workflow = yaml.safe_load((ROOT / "examples/ci/github-actions.yml").read_text())
    assert set(workflow.get("on", workflow.get(True))) == {"push", "pull_request"}  # YAML 1.1 reads `on` as True
    (job,) = workflow["jobs"].values()
    uses = {s["uses"].split("@")[0]: s for s in job["steps"] if "uses" in s}
    assert uses["actions/checkout"]["with"]["fetch-depth"] == 0  # the base commit is there for --diff-base
    assert uses["actions/setup-python"]["with"]["python-version"] == "3.11"
    assert uses["actions/cache"]["with"]["path"] == "~/.cache/kvsim"
    upload = uses["actions/upload-artifact"]
    assert upload["if"] == "always()" and upload["with"]["path"].split() == ["kvsim-conform.xml", "kvsim-pytest.xml"]
    assert "torch==2.13.0" in next(s["run"] for s in job["steps"] if "pip install" in s.get("run", ""))

    tree, main_commit = _repository(tmp_path, installed.env)
    push = {"vars.KVSIM_PIP || 'kvsim'": str(installed.wheel), "github.event_name": "push",
            "github.event.pull_request.base.sha": ""}
    codes, output = _github_run(workflow, push, tree, installed.env)
    assert codes == [0, 0, 0], output
    conform = _cases(tree / "kvsim-conform.xml")
    assert set(conform) == {t.name for t in select_targets("vllm")}  # every target; those the tree lacks skipped
    assert {n for n, s in conform.items() if s != "skipped"} == MLA_TARGETS and set(conform.values()) == {
        "passed", "skipped"}
    assert _cases(tree / "kvsim-pytest.xml") == {"test_mla_planner_conforms_to_kvsim": "passed"}

    for name in ("kvsim-conform.xml", "kvsim-pytest.xml"):
        (tree / name).unlink()
    _change(tree, installed.env, "README.md", "an engine", "an engine, documented")
    pull = push | {"github.event_name": "pull_request", "github.event.pull_request.base.sha": main_commit}
    codes, output = _github_run(workflow, pull, tree, installed.env, start=1)  # installed by the push's run
    assert codes == [0, 0], output
    assert _cases(tree / "kvsim-conform.xml") == {}  # no target reads the README: nothing to check, a pass


def _gitlab_job(config: dict, name: str, part: str, variables: dict[str, str], tree: Path,
                env: dict[str, str]) -> subprocess.CompletedProcess:
    """A job's `part` (before_script, script) as a runner runs it, in bash -e: the job's template's keys under its
    own, the file's variables expanded (`$NAME` from the predefined and project variables, which win over them)."""
    job = {**config[config[name]["extends"]], **config[name]} if "extends" in config[name] else config[name]
    declared = {k: (v["value"] if isinstance(v, dict) else v) for k, v in config.get("variables", {}).items()}

    def expand(text: str) -> str:
        return re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: variables[m.group(1) or m.group(2)], text)

    defined = {k: expand(str(v)) for k, v in declared.items()} | variables
    script = "\n".join(job[part])
    return _run(["bash", "--noprofile", "--norc", "-e", "-c", script], tree, env | defined, check=False)


def test_gitlab_ci_jobs_run_on_a_merge_request_with_a_planted_bug(installed, tmp_path):
    config = yaml.safe_load((ROOT / "examples/ci/gitlab-ci.yml").read_text())
    template = config[".kvsim"]
    assert template["cache"]["paths"] == [".cache/kvsim"]
    assert config["variables"]["KVSIM_CACHE_DIR"] == "$CI_PROJECT_DIR/.cache/kvsim"  # the folder GitLab caches
    assert config["variables"]["GIT_DEPTH"] == "0"  # the base commit is there for --diff-base
    assert any("merge_request_event" in r["if"] for r in template["rules"])
    assert "torch==2.13.0" in " ".join(template["before_script"])
    reports = {name: config[name]["artifacts"] for name in ("kvsim-conform", "kvsim-pytest")}
    assert all(a["when"] == "always" for a in reports.values())

    tree, main_commit = _repository(tmp_path, installed.env)
    _change(tree, installed.env, PLANNER, FIT, FIT.replace("<=", "<"))
    variables = {"CI_PROJECT_DIR": str(tree), "CI_PIPELINE_SOURCE": "merge_request_event",
                 "CI_MERGE_REQUEST_DIFF_BASE_SHA": main_commit, "KVSIM_PIP": str(installed.wheel)}
    assert all(config[name]["extends"] == ".kvsim" for name in reports)  # one before_script: run it once
    done = _gitlab_job(config, "kvsim-conform", "before_script", variables, tree, installed.env)
    assert done.returncode == 0, done.stdout + done.stderr
    for name, failed in (("kvsim-conform", "plan_mla_context_chunks"),
                         ("kvsim-pytest", "test_mla_planner_conforms_to_kvsim")):
        done = _gitlab_job(config, name, "script", variables, tree, installed.env)
        assert done.returncode == 1, done.stdout + done.stderr
        cases = _cases(tree / reports[name]["reports"]["junit"])
        assert cases[failed] == "failure"
        if name == "kvsim-conform":  # only the targets that read the changed file
            assert set(cases) == {t.name for t in changed_targets(select_targets("vllm"), [PLANNER], "vllm")}
