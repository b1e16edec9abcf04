"""The one validator of numbers a user types: every numeric option of every command (their
argparse types) and every numeric setting.

``float("nan")``, ``float("inf")`` and ``int("1" + "0" * 20)`` all parse, and a comparison
with NaN is always false, so a check such as ``if value <= 0: refuse`` lets NaN through (a
``--fudge nan`` tolerance passed every kernel). :class:`Bounds` accepts a finite number
inside a stated range and names the range when it refuses.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Bounds:
    """A finite ``kind`` (int or float) with ``low <= value <= high`` (``low`` excluded when
    ``low_open``)."""

    kind: type
    low: float
    high: float
    low_open: bool = False
    unit: str = ""
    """Said after the range (``seconds``)."""
    high_open: bool = False

    def accepted(self) -> str:
        """``a number > 0 and <= 86400 (seconds)``: the accepted values, for messages."""
        what = "an integer" if self.kind is int else "a number"
        low = f"> {_fmt(self.low)}" if self.low_open else f">= {_fmt(self.low)}"
        high = f"< {_fmt(self.high)}" if self.high_open else f"<= {_fmt(self.high)}"
        unit = f" ({self.unit})" if self.unit else ""
        return f"{what} {low} and {high}{unit}"

    def parse(self, text: str | float | int, name: str) -> float | int:
        """``text`` as a number in range.

        Raises:
            ValueError: ``{name} {text!r} is not valid; accepted: ...``, for NaN, infinities,
                a non-number or a number out of range.
        """
        value: float | int
        try:
            if isinstance(text, bool):
                raise ValueError
            if self.kind is int:
                value = text if isinstance(text, int) else int(str(text).strip(), 10)
            else:
                value = float(text)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{name} {text!r} is not valid; accepted: {self.accepted()}") from None
        ok = math.isfinite(value) and (
            value < self.high if self.high_open else value <= self.high) and (
            value > self.low if self.low_open else value >= self.low)
        if not ok:
            raise ValueError(f"{name} {text!r} is not valid; accepted: {self.accepted()}")
        return value

    def arg(self, name: str) -> Callable[[str], float | int]:
        """An argparse ``type=`` for option ``name``: its error names the accepted range."""

        def parse(text: str) -> float | int:
            try:
                return self.parse(text, name)
            except ValueError:
                # argparse prefixes "argument NAME: "; the message says the rest.
                raise argparse.ArgumentTypeError(
                    f"{text!r} is not valid; accepted: {self.accepted()}") from None

        parse.__name__ = self.kind.__name__  # argparse names the type in its fallback message
        parse.bounds = self  # type: ignore[attr-defined]  # tests find every numeric option
        return parse


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else f"{value:g}"


MAX_RANKS = 1 << 20
"""The most ranks (world size, nodes, processes per node, any parallel degree) a plan
accepts: ten times the largest GPU cluster built so far; a bigger number is a typo."""
RANKS = Bounds(int, 1, MAX_RANKS)
STEPS = Bounds(int, 0, 10**18)
"""A step count (``--warmup``): the log parser reads steps of up to 18 digits."""
