"""Kernel properties of FlashInfer's base-2 `merge_state` against model `mla-backends`.

* `merge_state_differential`: fp32 base-2 states (rows empty on either or both sides, LSEs of scale 1 to 60)
  merged by the backend agree with `kvsim.models.mla_backends.merge.merge_state` on the variant: within
  float32 rounding (output |d| <= 1e-5 (|v_a| + |v_b|) + 1e-6, LSE |d| <= 1e-5 (1 + |s|)), -inf exactly
  where the model's is, and NaN nowhere. On `merge_nan_4051` the model gives NaN for two empty states and
  the guarded kernel does not: the differential catches the variant.
* `merge_state_matches_merge_attn_states`: the same states merged by `mla_context`'s natural-log
  `merge_attn_states` on the same backend (LSE converted: natural = base 2 * ln 2, layout [H, T]) give the
  same outputs, and LSEs equal after converting back, within the same bounds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kernel_property
from kvsim.models.mla_backends.merge import merge_state as merge_reference

from ...runtime.discovery import BACKEND_NAMES
from ..mla_context.backends import merge_attn_states
from .backends import merge_state

MODEL = "mla-backends"
OUT_RTOL, OUT_ATOL, LSE_RTOL = 1e-5, 1e-6, 1e-5


def state_violation(what: str, got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray],
                    scale: np.ndarray) -> str | None:
    (v, s), (wv, ws) = got, want
    if np.isnan(wv).any() or np.isnan(ws).any():
        at = np.argwhere(np.isnan(ws))[0].tolist() if np.isnan(ws).any() else np.argwhere(np.isnan(wv))[0][:2].tolist()
        return f"{what} at (token, head) {at}: expected the model's state, got the model's NaN against " \
               f"({v[tuple(at)][:2].tolist()}, {float(s[tuple(at)])}) from the kernel"
    if np.isnan(v).any() or np.isnan(s).any():
        return f"{what}: expected no NaN, got NaN at {np.argwhere(np.isnan(s))[:1].tolist()}"
    if not np.array_equal(np.isneginf(s), np.isneginf(ws)):
        return f"{what}: expected -inf LSEs exactly at {np.argwhere(np.isneginf(ws)).tolist()}, got " \
               f"{np.argwhere(np.isneginf(s)).tolist()}"
    finite = np.isfinite(ws)
    bad_s = np.abs(s[finite].astype(np.float64) - ws[finite]) > LSE_RTOL * (1 + np.abs(ws[finite]))
    bad_v = np.abs(v.astype(np.float64) - wv) > OUT_RTOL * scale + OUT_ATOL
    if bad_s.any():
        i = int(np.argmax(bad_s))
        return f"{what} LSE: expected {float(ws[finite][i])}, got {float(s[finite][i])}"
    if bad_v.any():
        at = tuple(np.argwhere(bad_v)[0])
        return f"{what} output at {list(at)}: expected {float(wv[at])}, got {float(v[at])}"
    return None


@kernel_property(model=MODEL, strategy="KERNEL_MERGE_CASES", backends=BACKEND_NAMES)
def merge_state_differential(pair: Any, variant: Any, backend: str) -> None:
    """fp32 base-2 states with rows empty on either or both sides: the backend's merge_state equals the model's
    merge_state on the variant (float32 rounding; -inf exactly; no NaN on either side)."""
    case, threads = pair
    a, b, _ = case.states()
    got = merge_state(backend, *a, *b, threads=threads)
    want = merge_reference(*a, *b, variant)
    message = state_violation(f"merge_state on {backend}", got, want, np.abs(a[0]) + np.abs(b[0]))
    if message:
        raise PropertyViolation(message)


@kernel_property(model=MODEL, strategy="KERNEL_MERGE_CASES", backends=BACKEND_NAMES)
def merge_state_matches_merge_attn_states(pair: Any, variant: Any, backend: str) -> None:
    """The base-2 merge_state and the natural-log merge_attn_states kernels agree on the same states once the LSE
    base (natural = base 2 * ln 2) and layout ([T, H] vs [H, T]) are converted."""
    case, threads = pair
    a, b, _ = case.states()
    v2, s2 = merge_state(backend, *a, *b, threads=threads)
    ln2 = math.log(2.0)
    natural = merge_attn_states(backend, a[0], (a[1].astype(np.float64) * ln2).astype(np.float32).T, b[0],
                                (b[1].astype(np.float64) * ln2).astype(np.float32).T, threads=threads)
    assert natural.lse is not None
    back = (natural.lse.T.astype(np.float64) / ln2).astype(np.float32)
    message = state_violation(f"merge_state vs merge_attn_states on {backend}", (v2, s2), (natural.output, back),
                              np.abs(a[0]) + np.abs(b[0]))
    if message:
        raise PropertyViolation(message)
