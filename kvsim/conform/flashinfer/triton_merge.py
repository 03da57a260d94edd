"""FlashInfer 0.7.4's Triton merges (`flashinfer/triton/cascade.py`, `triton/kernels/cascade.py`) against the model.

The kernels and their Python launchers run in a child process under the Triton interpreter
(`TRITON_INTERPRET=1` must be set before triton is imported, so never in the `kvsim conform` process):

    python -m kvsim.conform.flashinfer.triton_merge ROOT    (JSON lines: a case in, the merged states out)

On random base-2 states (`MERGE_CASES`, rows empty on any side) `merge_state` and `merge_state_in_place`
(with and without a mask) are compared with the model's `merge_nan_4051` variant (no empty-state guard, NaN
for NaN) and `merge_states` (three states) with the model's guarded `merge_states` on every row that is not
empty in all three states. Conventions: the launchers' device checks (`check_device(..., major=[9])` and the
shape checks) are stand-ins that accept CPU tensors; `merge_states_kernel` starts from a phantom state
`(0, m=-5e4, d=1)`, so a row empty in every state ends as `(0, -50000)`: a finite LSE where the model says
-inf (reported with the empty-state property, as #4452-like; the output is 0). Findings (open upstream,
#4051): two empty states merge to NaN in `merge_state` and `merge_state_in_place`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from kvsim.models.mla_backends.merge import merge_state, merge_states
from kvsim.models.mla_backends.variants import VARIANTS

from ..source import EngineSource
from ..targets import RunOptions, Target, TargetResult, drive
from .common import FINDING

LAUNCHERS = "flashinfer/triton/cascade.py"
KERNELS = "flashinfer/triton/kernels/cascade.py"
KERNEL_NAMES = ("merge_state_kernel", "merge_state_in_place_kernel", "merge_states_kernel")
LAUNCHER_NAMES = ("merge_state", "merge_state_in_place", "merge_states")
RELEASE = VARIANTS["merge_nan_4051"]
RTOL, ATOL, LSE_ATOL = 1e-5, 1e-5, 1e-4
TRITON_EXAMPLES = 40  # interpreted launches are slow: a budget of their own


# --- child side -------------------------------------------------------------------------------------------
def _child(root: str) -> int:
    os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    from ..loader import load_definitions

    path = os.path.join(root, KERNELS)
    kernels = load_definitions(path, list(KERNEL_NAMES), where=KERNELS)
    checks = {name: (lambda *a, **k: None) for name in ("check_input", "check_device", "check_dim", "check_shape")}
    launch = load_definitions(os.path.join(root, LAUNCHERS), list(LAUNCHER_NAMES), where=LAUNCHERS,
                              extra_globals={**checks, **{n: getattr(kernels, n) for n in KERNEL_NAMES}})
    for line in sys.stdin:
        case = json.loads(line)
        a = [torch.from_numpy(unpack(x)) for x in case["a"]]
        b = [torch.from_numpy(unpack(x)) for x in case["b"]]
        c = [torch.from_numpy(unpack(x)) for x in case["c"]]
        two = launch.merge_state(a[0], a[1], b[0], b[1])
        v, s = a[0].clone(), a[1].clone()
        launch.merge_state_in_place(v, s, b[0], b[1])
        vm, sm = a[0].clone(), a[1].clone()
        mask = torch.from_numpy(np.arange(a[0].shape[0]) % 2 == 0)
        launch.merge_state_in_place(vm, sm, b[0], b[1], mask)
        many = launch.merge_states(torch.stack([a[0], b[0], c[0]], 1).contiguous(),
                                   torch.stack([a[1], b[1], c[1]], 1).contiguous())
        out = {"two": [pack(x.numpy()) for x in two], "in_place": [pack(v.numpy()), pack(s.numpy())],
               "masked": [pack(vm.numpy()), pack(sm.numpy())], "many": [pack(x.numpy()) for x in many]}
        print(json.dumps(out), flush=True)
    return 0


# --- parent side ------------------------------------------------------------------------------------------
def _close(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray], rows: np.ndarray) -> bool:
    (v, s), (wv, ws) = got, want
    v, s, wv, ws = v[rows], s[rows], wv[rows], ws[rows]
    same_s = (s == ws) | (np.isnan(s) & np.isnan(ws)) | np.isclose(s, ws, rtol=RTOL, atol=LSE_ATOL)
    same_v = (np.isnan(v) & np.isnan(wv)) | np.isclose(v, wv, rtol=RTOL, atol=ATOL)
    return bool(same_s.all() and same_v.all())


def run_triton_merge(source: EngineSource, options: RunOptions) -> TargetResult:
    from kvsim.gpu_oracle.runtime.asan import pack, unpack
    from kvsim.properties.mla_backends.cases import EMPTY_PAIR
    from kvsim.properties.mla_backends.strategies import MERGE_CASES

    started = time.perf_counter()
    result = TargetResult("triton-merges", source.version)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    child = subprocess.Popen([sys.executable, "-m", "kvsim.conform.flashinfer.triton_merge", str(source.root)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    findings: dict[str, str] = {}

    def call(case: Any) -> dict[str, list[np.ndarray]]:
        a, b, c = case.states()
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps({k: [pack(x) for x in st] for k, st in zip("abc", (a, b, c))}) + "\n")
        child.stdin.flush()
        line = child.stdout.readline()
        if not line:
            child.kill()
            raise RuntimeError(f"the Triton child died: {child.stderr.read()[-2000:] if child.stderr else ''}")
        return {k: [unpack(x) for x in v] for k, v in json.loads(line).items()}

    def check(case: Any) -> None:
        a, b, c = case.states()
        got = call(case)
        every = np.ones(a[1].shape, bool)
        mask = (np.arange(case.tokens) % 2 == 0)[:, None] & every
        two = merge_state(*a, *b, RELEASE)
        masked = (np.where(mask[..., None], two[0], a[0]), np.where(mask, two[1], a[1]))
        all_empty = np.isneginf(a[1]) & np.isneginf(b[1]) & np.isneginf(c[1])
        many = merge_states(np.stack([a[0], b[0], c[0]], 1), np.stack([a[1], b[1], c[1]], 1))
        for name, want, rows in (("merge_state", two, every), ("merge_state_in_place", two, every),
                                 ("merge_state_in_place (mask)", masked, every), ("merge_states", many, ~all_empty)):
            key = {"merge_state": "two", "merge_state_in_place": "in_place"}.get(name.split(" ")[0], "many") \
                if "mask" not in name else "masked"
            result.compared += 1
            if not _close(tuple(got[key]), want, rows):
                result.diverge({"launcher": name, "case": repr(case)}, want[1].tolist(), got[key][1].tolist())
        both = np.isneginf(a[1]) & np.isneginf(b[1])
        if both.any() and np.isnan(got["two"][1][both]).any():
            findings.setdefault("merge_state", f"{case!r}: (0, -inf) ⊕ (0, -inf) -> NaN in merge_state_kernel and "
                                "merge_state_in_place_kernel (#4051)")
        if all_empty.any():
            lse = got["many"][1][all_empty]
            findings.setdefault("merge_states", f"{case!r}: three empty states -> LSE {float(lse[0])} (finite: "
                                "the kernel's phantom initial state m=-5e4), output "
                                f"{float(got['many'][0][all_empty][0][0])}")

    try:
        check(EMPTY_PAIR)
        drive(MERGE_CASES, check, options, max_examples=min(options.max_examples, TRITON_EXAMPLES))
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=60)
    name = "empty_states_merge_to_empty"
    if findings:
        result.prop(name, FINDING, "open upstream: " + "; ".join(findings.values()))
    else:
        result.prop(name, "holds", "the empty-state findings did not reproduce on this release")
    result.note = (f"1 pinned and {min(options.max_examples, TRITON_EXAMPLES)} random state triples x 4 launches "
                   "under the Triton interpreter")
    return result.finish(started)


TARGETS = (
    Target("flashinfer", "triton-merges", KERNELS, KERNEL_NAMES, "mla-backends",
           "the Triton merge_state / merge_state_in_place / merge_states (interpreted) vs the model's merge",
           run_triton_merge),
)

if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
