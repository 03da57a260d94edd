"""Every notebook's code cells run top to bottom against the current code (so they cannot rot)."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_code_cells_run(path, capsys):
    cells = json.loads(path.read_text())["cells"]
    code = [("".join(c["source"])) for c in cells if c["cell_type"] == "code"]
    assert code, f"{path.name} has no code cells"
    namespace: dict = {}
    for source in code:
        exec(compile(source, str(path), "exec"), namespace)
    assert capsys.readouterr().out.strip(), f"{path.name} printed nothing"
