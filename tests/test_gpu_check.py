"""scripts/gpu_check.sh on this machine: one JSON report; without CUDA every GPU path is skipped with its reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("environment", "oracle", "sdpa_low_precision", "triton_native", "zeroing_bandwidth")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.fixture(scope="module")
def report(tmp_path_factory):  # type: ignore[no-untyped-def]
    if _has_cuda():
        pytest.skip("this machine has CUDA: run scripts/gpu_check.sh itself (minutes, not a unit test)")
    out = tmp_path_factory.mktemp("gpu")
    env = {k: v for k, v in os.environ.items() if k != "KVSIM_GPU_CHECK_INSTALL"}
    env.update(OUT=str(out), PYTHON=sys.executable, GPU_CHECK_EXAMPLES="2")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((out / "gpu_check.json").read_text()), done.stdout


def test_the_report_has_every_section(report) -> None:  # type: ignore[no-untyped-def]
    doc, stdout = report
    assert tuple(doc["sections"]) == SECTIONS
    assert doc["status"] == "skipped"
    assert "report:" in stdout


def test_every_gpu_path_is_skipped_with_its_reason(report) -> None:  # type: ignore[no-untyped-def]
    doc, _ = report
    for name in SECTIONS[1:]:
        section = doc["sections"][name]
        assert section["status"] == "skipped", (name, section)
        assert section.get("reason"), name
    checks = doc["sections"]["oracle"]["checks"]
    assert {c["backend"] for c in checks} == {"torch-cuda", "cupy-cuda"}
    assert all(c["status"] == "skipped" and c["message"] for c in checks)
    assert {t.split(":")[1] for t in doc["sections"]["triton_native"]["targets"]} >= {
        "zero-kv-blocks-kernel", "merge-attn-states-triton", "staging-gather-triton", "staging-scatter-torch"}


def test_environment_names_what_is_missing(report) -> None:  # type: ignore[no-untyped-def]
    env = report[0]["sections"]["environment"]
    assert env["status"] == "passed" and env["cuda_reason"]


def test_the_script_installs_only_behind_its_flag() -> None:
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert installs == ["  \"$py\" -m pip install -q -e '.[test,torch,gpu]'"]
    assert 'KVSIM_GPU_CHECK_INSTALL:-0}" == 1' in text
