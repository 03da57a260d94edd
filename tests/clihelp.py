"""Run the real `kvsim` command in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kvsim(*args: str, env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "kvsim", *args], capture_output=True, text=True, cwd=ROOT,
                          env=full_env, timeout=timeout)


def kvsim_json(*args: str, env: dict | None = None, expect: int = 0) -> dict:
    proc = kvsim(*args, "--json", env=env)
    assert proc.returncode == expect, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)
