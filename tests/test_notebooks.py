"""Every notebook runs through a real Jupyter kernel (nbclient, this interpreter's ipykernel) and reproduces the
outputs committed with it: re-execution changes no output (execution counts aside). `python
scripts/execute_notebooks.py` re-executes and saves them after a change."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("execute_notebooks", ROOT / "scripts" / "execute_notebooks.py")
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)

NOTEBOOKS = runner.notebook_paths()
# one notebook per model of the catalog
EXPECTED = {"swa_budget_drift", "kv_zeroing_bytes", "mla_chunks_plans", "pd_staging_timeline", "pd_protocol_conclude",
            "mla_backends_selection", "pipelined_transfer_timeline", "kv_offload_policies"}
# what a notebook may import: kvsim's public layers, and the plotting and numeric libraries
ALLOWED = ("kvsim.models", "kvsim.app", "kvsim.engine", "numpy", "matplotlib", "random", "itertools", "math",
           "collections")


def test_every_model_has_a_notebook():
    assert {p.stem for p in NOTEBOOKS} == EXPECTED


def test_the_kernel_is_this_interpreter():
    """The `python3` kernel runs this virtual environment's Python, whatever kernelspecs the user has installed."""
    assert Path(runner.kernel_argv()[0]) == Path(sys.executable)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import sys\nprint(sys.executable)")]
    out = runner.execute(nb).cells[0].outputs
    assert [o.get("text", "").strip() for o in out] == [sys.executable]


def test_the_kernels_numpy_rounds_alike_on_every_cpu():
    """The kernel's numpy dispatches no SIMD target past its baseline: the float32 error plot of
    mla_backends_selection once changed with the machine (AVX-512 or not)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__\n"
        "print(len(__cpu_dispatch__), [f for f in __cpu_dispatch__ if __cpu_features__[f]])")]
    (out,) = runner.execute(nb).cells[0].outputs
    assert out["text"].split(" ", 1)[1].strip() == "[]", out["text"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_imports_only_the_public_layers(path):
    nb = nbformat.read(path, as_version=4)
    bad = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        code = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith("%"))
        for node in ast.walk(ast.parse(code)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            bad += [n for n in names if not n.startswith(ALLOWED)]
    assert bad == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_outputs_are_current(path):
    saved = nbformat.read(path, as_version=4)
    outputs = [o for c in saved.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/svg+xml" in o.get("data", {}) for o in outputs), f"{path.name} has no saved plot"
    assert not [o for o in outputs if o.output_type == "error" or o.get("name") == "stderr"], \
        f"{path.name} saved an error or a warning"
    fresh = runner.execute(saved)
    assert runner.differences(saved, fresh) == [], \
        f"{path.name}: outputs changed; run `python scripts/execute_notebooks.py {path.stem}` and review the diff"
