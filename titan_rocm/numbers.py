"""The one validator of numbers a user types: options, ``[rocm]`` settings, ranged checks.

A comparison with NaN is always false, so ``if value <= 0: refuse`` lets NaN through (a
``--fudge nan`` tolerance passed every kernel): :class:`Bounds` accepts only finite numbers."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def refusal(name: str, value: object, accepted: str) -> str:
    """``{name} {value!r} is not valid; accepted: {accepted}``."""
    return f"{name} {value!r} is not valid; accepted: {accepted}"


@dataclass(frozen=True)
class Bounds:
    """A finite ``kind`` within ``low``..``high`` (ends excluded when ``*_open``), or one of
    ``also``."""

    kind: type
    low: float
    high: float
    low_open: bool = False
    unit: str = ""
    high_open: bool = False
    also: tuple[int, ...] = ()

    def accepted(self) -> str:
        """``a number > 0 and <= 86400 (seconds)``: the accepted values, for messages."""
        what = "an integer" if self.kind is int else "a number"
        low = f"> {_fmt(self.low)}" if self.low_open else f">= {_fmt(self.low)}"
        high = f"< {_fmt(self.high)}" if self.high_open else f"<= {_fmt(self.high)}"
        unit = f" ({self.unit})" if self.unit else ""
        extra = "".join(f"{_fmt(v)} or " for v in self.also)
        return f"{extra}{what} {low} and {high}{unit}"

    def _in_range(self, value: float) -> bool:
        if value in self.also:
            return True
        return math.isfinite(value) and (
            value < self.high if self.high_open else value <= self.high) and (
            value > self.low if self.low_open else value >= self.low)

    def parse(self, text: str | float | int, name: str) -> float | int:
        """``text`` as a number in range; ValueError with :func:`refusal`'s sentence."""
        value: float | int
        try:
            if isinstance(text, bool):
                raise ValueError
            if self.kind is int:
                value = text if isinstance(text, int) else int(str(text).strip(), 10)
            else:
                value = float(text)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(refusal(name, text, self.accepted())) from None
        if not self._in_range(value):
            raise ValueError(refusal(name, text, self.accepted()))
        return value

    def check(self, value: Any, name: str) -> float | int:
        """A value a parser already typed, in range: never a bool, a string, or a float for an
        int."""
        numeric = (int,) if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, numeric):
            raise ValueError(refusal(name, value, self.accepted()))
        return self.parse(value, name)

    def parse_many(self, text: str, name: str, *, sep: str, form: str,
                   count: int | None = None, distinct: bool = False,
                   words: tuple[str, ...] = ()) -> tuple[float | int, ...] | str:
        """``text`` as ``sep``-separated numbers in range, or one of ``words``; ValueError naming
        ``text``."""
        if text.strip() in words:
            return text.strip()
        parts = re.split(re.escape(sep), text, flags=re.IGNORECASE)
        try:
            values = tuple(self.parse(part, name) for part in parts)
        except ValueError:
            values = ()
        if not values or (count is not None and len(values) != count) or (
                distinct and len(set(values)) != len(values)):
            raise ValueError(refusal(name, text, f"{form}, each {self.accepted()}"))
        return values

    def arg(self, name: str) -> Callable[[str], float | int]:
        """An argparse ``type=`` for option ``name``: its error names the accepted range."""
        return argparse_type(lambda text: self.parse(text, name), name, self)

    def arg_many(self, name: str, *, sep: str, form: str, count: int | None = None,
                 distinct: bool = False, words: tuple[str, ...] = (),
                 ) -> Callable[[str], tuple[float | int, ...] | str]:
        """An argparse ``type=`` for an option of several numbers (:meth:`parse_many`)."""
        return argparse_type(lambda text: self.parse_many(
            text, name, sep=sep, form=form, count=count, distinct=distinct, words=words),
            name, self)


def argparse_type(parse: Callable[[str], Any], name: str, bounds: Bounds) -> Callable[[str], Any]:
    """An argparse ``type=`` for ``name`` from ``parse`` (text -> value), checked by ``bounds``."""

    def parse_option(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            # argparse prefixes "argument NAME: "; the message says the rest.
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{name} ")) from None

    parse_option.__name__ = bounds.kind.__name__  # argparse names it in its fallback message
    parse_option.bounds = bounds  # type: ignore[attr-defined]  # tests find every numeric option
    return parse_option


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else f"{value:g}"


MAX_RANKS = 1 << 20
"""Ten times the largest GPU cluster built; more is a typo."""
RANKS = Bounds(int, 1, MAX_RANKS)
DEVICES = Bounds(int, 0, MAX_RANKS - 1)
STEPS = Bounds(int, 0, 10**18)
"""The log parser reads steps of up to 18 digits."""
