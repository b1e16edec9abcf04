"""Compact tables the log readers keep instead of a :class:`~titan_rocm.logs.record.Record` (about
400 bytes) per metric line, so memory grows with the distinct steps and values, not the lines."""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import ItemsView, Iterable, Iterator, Mapping
from typing import Any

from titan_rocm.guard_message import fmt_value
from titan_rocm.logs.record import Record

THROUGHPUT_FIELDS: tuple[str, ...] = ("tps", "tflops", "mfu", "iteration_ms")
FIGURE_FIELDS: tuple[str, ...] = (*THROUGHPUT_FIELDS, "memory_gib")
"""Every figure bench-summary publishes from a record: each must be finite and >= 0."""


class _Items(ItemsView):  # type: ignore[type-arg]
    """``(step, value)`` pairs straight from the arrays (no lookup per step)."""

    def __iter__(self) -> Iterator[tuple[int, float]]:
        table = self._mapping
        return zip(table.steps, table.values, strict=True)


class StepValues(Mapping[int, float]):
    """step -> value in ascending order, as two arrays (8 bytes a step each) instead of a dict."""

    __slots__ = ("steps", "values")

    def __init__(self, steps: array | None = None, values: array | None = None) -> None:
        self.steps = steps if steps is not None else array("q")
        """Ascending, distinct."""
        self.values = values if values is not None else array("d")

    @classmethod
    def of(cls, mapping: Mapping[int, float]) -> StepValues:
        """``mapping`` itself when it is one, else its items sorted by step."""
        if isinstance(mapping, StepValues):
            return mapping
        items = sorted(mapping.items())
        return cls(array("q", [s for s, _ in items]), array("d", [v for _, v in items]))

    def _index(self, step: object) -> int:
        if not isinstance(step, int):
            return -1
        i = bisect_left(self.steps, step)
        return i if i < len(self.steps) and self.steps[i] == step else -1

    def __getitem__(self, step: int) -> float:
        i = self._index(step)
        if i < 0:
            raise KeyError(step)
        return self.values[i]

    def __contains__(self, step: object) -> bool:
        return self._index(step) >= 0

    def __iter__(self) -> Iterator[int]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def items(self) -> _Items:
        """``(step, value)`` in ascending step order."""
        return _Items(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepValues):
            return self.steps == other.steps and self.values == other.values
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(f"{s}: {v!r}" for s, v in list(self.items())[:6])
        return f"StepValues({{{shown}{', ...' if len(self) > 6 else ''}}}, {len(self)} steps)"


_LOSS, _GRAD = 1, 2
_PENDING_MAX = 4096
"""Out-of-order steps held in a dict before they are merged into the sorted arrays."""


class Curve:
    """One rank's curve while a log is read: per step its first logged loss and grad norm (each
    separately: a later line may log the one the first lacked), non-finite values kept."""

    __slots__ = ("_steps", "_loss", "_grad", "_has", "_pending", "_frozen")

    def __init__(self) -> None:
        self._steps = array("q")
        self._loss = array("d")
        self._grad = array("d")
        self._has = bytearray()
        self._pending: dict[int, list[Any]] = {}
        self._frozen: tuple[StepValues, StepValues] | None = None

    def add(self, step: int, loss: float | None, grad_norm: float | None) -> None:
        """One training line of this rank (first per step and metric wins)."""
        self._frozen = None
        steps = self._steps
        if not steps or step > steps[-1]:
            steps.append(step)
            self._loss.append(loss if loss is not None else 0.0)
            self._grad.append(grad_norm if grad_norm is not None else 0.0)
            self._has.append((_LOSS if loss is not None else 0)
                             | (_GRAD if grad_norm is not None else 0))
            return
        i = bisect_left(steps, step)
        if steps[i] == step:
            has = self._has[i]
            if loss is not None and not has & _LOSS:
                self._loss[i], has = loss, has | _LOSS
            if grad_norm is not None and not has & _GRAD:
                self._grad[i], has = grad_norm, has | _GRAD
            self._has[i] = has
            return
        held = self._pending.setdefault(step, [None, None])
        held[0] = held[0] if held[0] is not None else loss
        held[1] = held[1] if held[1] is not None else grad_norm
        if len(self._pending) > _PENDING_MAX:
            self._merge()

    def _merge(self) -> None:
        """Fold the held out-of-order steps into the sorted arrays (one linear pass)."""
        if not self._pending:
            return
        late = sorted(self._pending.items())
        self._pending = {}
        old = zip(self._steps, self._loss, self._grad, self._has, strict=True)
        new = ((s, 0.0 if lo is None else lo, 0.0 if g is None else g,
                (_LOSS if lo is not None else 0) | (_GRAD if g is not None else 0))
               for s, (lo, g) in late)
        steps, loss, grad, has = array("q"), array("d"), array("d"), bytearray()
        for s, lo, g, h in heapq.merge(old, new):
            steps.append(s)
            loss.append(lo)
            grad.append(g)
            has.append(h)
        self._steps, self._loss, self._grad, self._has = steps, loss, grad, has

    @property
    def steps(self) -> array:
        """The distinct steps logged, ascending."""
        self._merge()
        return self._steps

    def series(self) -> tuple[StepValues, StepValues]:
        """(loss, grad norm) per step, each over the steps that logged it."""
        if self._frozen is None:
            self._merge()
            self._frozen = (self._column(self._loss, _LOSS), self._column(self._grad, _GRAD))
        return self._frozen

    def _column(self, values: array, bit: int) -> StepValues:
        if self._has.count(bit) + self._has.count(_LOSS | _GRAD) == len(self._has):
            return StepValues(self._steps, values)  # every step has it: the arrays as they are
        keep = [i for i, h in enumerate(self._has) if h & bit]
        return StepValues(array("q", (self._steps[i] for i in keep)),
                          array("d", (values[i] for i in keep)))


def distinct_count(step_arrays: Iterable[array],
                   above: int | None = None) -> tuple[int, int | None]:
    """(how many distinct steps, the largest) over sorted step arrays, streamed; ``above``: count
    only steps greater."""
    count, last, previous = 0, None, None
    for step in heapq.merge(*step_arrays):
        if step == previous:
            continue
        previous = step
        if above is None or step > above:
            count += 1
        last = step
    return count, last


def median(counts: Counter[float]) -> float:
    """``statistics.median`` of ``counts`` with multiplicities, without listing them."""
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no values")
    wanted = (n - 1) // 2, n // 2
    found: list[float] = []
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        while len(found) < 2 and seen > wanted[len(found)]:
            found.append(value)
        if len(found) == 2:
            break
    return found[0] if n % 2 else (found[0] + found[1]) / 2


class Figures:
    """What bench-summary publishes, gathered as lines are read."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.counts: dict[str, Counter[float]] = {name: Counter() for name in THROUGHPUT_FIELDS}
        self.memory_peak: float | None = None
        self.bad: str | None = None

    @classmethod
    def of(cls, records: Iterable[Record], warmup: int) -> Figures:
        """The figures of ``records`` (every metric line of a log kept whole)."""
        figures = cls(warmup)
        for record in records:
            figures.add(record)
        return figures

    def add(self, r: Record) -> None:
        """One metric line (any kind)."""
        if self.bad is None:
            self.bad = _bad_figure(r)
        if r.memory_gib is not None and (self.memory_peak is None
                                         or r.memory_gib > self.memory_peak):
            self.memory_peak = r.memory_gib
        if r.kind == "train" and r.step > self.warmup:
            for name in THROUGHPUT_FIELDS:
                value = getattr(r, name)
                if value is not None:
                    self.counts[name][value] += 1


def _bad_figure(r: Record) -> str | None:
    for name in FIGURE_FIELDS:
        value = getattr(r, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            rank = f" on rank {r.rank}" if r.rank is not None else ""
            return (
                f"{name} is {fmt_value(value)} at {r.kind} step {r.step}{rank} "
                f"(line {r.line}): a non-finite or negative figure cannot be published."
            )
    return None
