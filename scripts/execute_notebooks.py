"""Re-execute the notebooks under notebooks/ through a real Jupyter kernel and save them with their outputs.

    python scripts/execute_notebooks.py                  # every notebook, saved in place
    python scripts/execute_notebooks.py swa_budget_drift # some of them (file stems)
    python scripts/execute_notebooks.py --check          # execute, compare with the saved outputs, write nothing

The kernel is the native `python3` kernel of the interpreter that runs this script (ipykernel from the same
virtual environment; no `ipykernel install` beforehand). Outputs are deterministic: the notebooks seed
their simulations and draw SVG with a fixed `svg.hashsalt` and no date, so a re-execution reproduces the
saved outputs byte for byte; only execution counts and timing metadata are left out of the comparison.
tests/test_notebooks.py runs `--check`'s comparison for every notebook.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import matplotlib.font_manager  # noqa: F401  (builds the font cache here, so no kernel prints that it is building it)
import nbformat
from ipykernel.kernelspec import RESOURCES, get_kernel_dict
from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import NATIVE_KERNEL_NAME, KernelSpec, KernelSpecManager
from nbclient import NotebookClient
from traitlets import default

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT_S = 300
# what a saved notebook's metadata says, whatever the executing kernel reported (its Python patch version)
METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": NATIVE_KERNEL_NAME},
    "language_info": {"name": "python", "pygments_lexer": "ipython3"},
}


def baseline_simd_env() -> dict[str, str]:
    """numpy's runtime SIMD dispatch turned off in the kernel (`NPY_DISABLE_CPU_FEATURES`, every dispatched target
    this numpy has): float32 `exp`, `log` and reductions then round alike on every CPU of the architecture, with or
    without AVX-512, so a plot of float32 error (mla_backends_selection) reproduces on any machine. Its saved
    outputs once came from a machine whose numpy dispatched AVX-512 and failed the comparison on one that has AVX2."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_dispatch__  # type: ignore[no-redef]
    return {"NPY_DISABLE_CPU_FEATURES": " ".join(__cpu_dispatch__)}


class InterpreterKernelSpecs(KernelSpecManager):
    """`python3` is always this interpreter's ipykernel, even where a user-installed `python3` spec exists; its
    numpy runs without SIMD dispatch (`baseline_simd_env`)."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        if kernel_name == NATIVE_KERNEL_NAME:
            return KernelSpec(resource_dir=RESOURCES, **{**get_kernel_dict(), "env": baseline_simd_env()})
        return super().get_kernel_spec(kernel_name)


class InterpreterKernelManager(AsyncKernelManager):
    @default("kernel_spec_manager")
    def _interpreter_specs(self) -> KernelSpecManager:
        return InterpreterKernelSpecs(data_dir=self.data_dir)


def kernel_argv() -> list[str]:
    """The command the notebooks' kernel runs (its first entry is this interpreter)."""
    return list(InterpreterKernelSpecs().get_kernel_spec(NATIVE_KERNEL_NAME).argv)


def notebook_paths(names: Sequence[str] = ()) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if not names:
        return paths
    by_stem = {p.stem: p for p in paths}
    missing = [n for n in names if Path(n).stem not in by_stem]
    if missing:
        raise SystemExit(f"notebooks: expected one of {', '.join(sorted(by_stem))}, got {', '.join(missing)}")
    return [by_stem[Path(n).stem] for n in names]


def execute(nb: nbformat.NotebookNode, cwd: Path = NOTEBOOKS) -> nbformat.NotebookNode:
    """Run every code cell of `nb` (a copy) top to bottom in a fresh kernel; a cell that raises raises here."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
    client = NotebookClient(nb, kernel_name=NATIVE_KERNEL_NAME, kernel_manager_class=InterpreterKernelManager,
                            timeout=CELL_TIMEOUT_S, record_timing=False, allow_errors=False,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams(cell.outputs)
    nb.metadata = nbformat.from_dict(METADATA)
    return nb


def coalesce_streams(outputs: list) -> list:
    """Adjacent stdout (or stderr) outputs as one: where the kernel split a cell's printing depends on timing."""
    merged: list = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if out.output_type == "stream" and prev is not None and prev.output_type == "stream" \
                and prev.name == out.name:
            merged[-1] = nbformat.v4.new_output("stream", name=out.name, text=prev.text + out.text)
        else:
            merged.append(out)
    return merged


def comparable(nb: nbformat.NotebookNode) -> list[dict[str, Any]]:
    """What must not change on re-execution: every code cell's source and outputs (execution counts aside)."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = [{k: v for k, v in out.items() if k != "execution_count"}
                   for out in coalesce_streams(cell.outputs)]
        cells.append({"source": cell.source, "outputs": json.loads(json.dumps(outputs, sort_keys=True))})
    return cells


def differences(saved: nbformat.NotebookNode, fresh: nbformat.NotebookNode) -> list[str]:
    """One line per code cell whose fresh outputs differ from the saved ones (empty: the outputs are current)."""
    old, new = comparable(saved), comparable(fresh)
    if len(old) != len(new):
        return [f"{len(old)} code cells saved, {len(new)} executed"]
    out = []
    for i, (a, b) in enumerate(zip(old, new)):
        if a == b:
            continue
        kinds = [sorted(o.get("data", {})) or [o["output_type"]] for o in b["outputs"]]
        changed = [j for j, (x, y) in enumerate(zip(a["outputs"], b["outputs"])) if x != y]
        where = f"output {changed[0]}" if changed else f"{len(a['outputs'])} outputs saved, {len(b['outputs'])} now"
        out.append(f"code cell {i}: {where} differs (now {kinds})")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebook file stems (default: all)")
    parser.add_argument("--check", action="store_true", help="compare with the saved outputs; write nothing")
    args = parser.parse_args(argv)
    stale = 0
    for path in notebook_paths(args.names):
        saved = nbformat.read(path, as_version=4)
        fresh = execute(saved)
        diff = differences(saved, fresh)
        if args.check:
            stale += bool(diff)
            print(f"{path.name}: {'stale: ' + '; '.join(diff) if diff else 'current'}")
        else:
            nbformat.write(fresh, path)
            print(f"{path.name}: {'updated' if diff else 'unchanged'}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
