"""The timing model of section 1.10: one request's transfers on a free FIFO link, and its max-plus closed form.

Per emitted slice j (compute end `C_j`, submit `C_j + h`, transfer time `t_j = L + b_j / B`), on one FIFO link:
`S_j = max(C_j + h, F_{j-1})`, `F_j = S_j + t_j`. The exposed transfer time of the final slice is

    F_N - (C_N + h) = max over k of [ sum_{j >= k} t_j - (C_N - C_k) ]

(with every chunk emitted, `C_N - C_k = sum_{j > k} p_j`: the research note's form). The bounds:
`t_N <= exposed <= sum t_j`, and pipelined minus the one-transfer baseline is at most `(N - 1) L` plus the
bytes revision B sends twice, over B.
"""

from __future__ import annotations

from typing import Sequence


def fifo_finish_times(submits: Sequence[float], durations: Sequence[float], free_at: float = 0.0) -> list[float]:
    """`F_j` of writes submitted at `submits` (non-decreasing) on one FIFO server free from `free_at`."""
    out, f = [], free_at
    for s, t in zip(submits, durations):
        f = max(s, f) + t
        out.append(f)
    return out


def exposed_closed_form(compute_ends: Sequence[float], durations: Sequence[float]) -> float:
    """`max_k [sum_{j>=k} t_j - (C_N - C_k)]` over the emitted slices (`compute_ends` = their `C_j`)."""
    if not durations:
        raise ValueError("a request emits at least its final slice")
    c_n = compute_ends[-1]
    best, tail = float("-inf"), 0.0
    for c_k, t_k in zip(reversed(compute_ends), reversed(durations)):
        tail += t_k
        best = max(best, tail - (c_n - c_k))
    return best


def exposed_by_recursion(compute_ends: Sequence[float], durations: Sequence[float], handoff: float) -> float:
    """`F_N - (C_N + h)` from the recursion, on a link free from the start."""
    submits = [c + handoff for c in compute_ends]
    return fifo_finish_times(submits, durations, float("-inf"))[-1] - submits[-1]
