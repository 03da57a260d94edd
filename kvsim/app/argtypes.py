"""The types of the command line's numeric options: each refuses with `FIELD: expected ..., got '...'`.

Only ASCII digits are numbers here (`float("０.１")` would take full-width digits), and no count or time
reaches a size that cannot finish or print (at most 1e9 seconds; counts as Python integers, bounded where
the option is).
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

MAX_SECONDS = 1e9


def integer(field: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            if not text.strip().isascii():
                raise ValueError(text)
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{field}: expected an integer, got {text!r}") from None
    return parse


def positive_int(field: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = integer(field)(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"{field}: expected an integer >= 1, got {text!r}")
        return value
    return parse


def non_negative_int(field: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = integer(field)(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"{field}: expected an integer >= 0, got {text!r}")
        return value
    return parse


def positive_float(field: str, maximum: float = MAX_SECONDS) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text) if text.strip().isascii() else math.nan
        except ValueError:
            value = math.nan
        if not 0 < value < math.inf:
            raise argparse.ArgumentTypeError(f"{field}: expected a finite number > 0, got {text!r}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{field}: expected a number <= {maximum:g}, got {text!r}")
        return value
    return parse
