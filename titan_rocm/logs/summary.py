"""What a benchmark pipeline may publish from a training log (``titan-rocm bench-summary``).

Median, min and max of tokens/s, TFLOP/s and MFU (TorchTitan) or TFLOP/s, tokens/s and
iteration time (Megatron-LM) over the training steps after warm-up, the memory peak and the
number of steps parsed. A run with any non-finite loss or grad norm, or with nothing parsed,
is ``valid: false`` with the reason and gets no throughput figure at all.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from titan_rocm.logs.check import EXIT_ERROR, EXIT_NONFINITE, EXIT_OK, describe_values, record_json
from titan_rocm.logs.check import first_bad as find_first_bad
from titan_rocm.logs.parse import GUARD_FORMAT, ParsedLog, Record

DEFAULT_WARMUP = 1
"""Steps excluded from throughput: TorchTitan's step-1 line includes start-up and compile."""

THROUGHPUT_FIELDS: tuple[str, ...] = ("tps", "tflops", "mfu", "iteration_ms")


@dataclass(frozen=True)
class Stat:
    """Median, min and max of one metric over the measured steps."""

    median: float
    min: float
    max: float
    count: int

    @classmethod
    def of(cls, values: list[float]) -> Stat | None:
        """The statistics of ``values``, or None when there are none."""
        if not values:
            return None
        return cls(statistics.median(values), min(values), max(values), len(values))

    def to_json(self) -> dict[str, float | int]:
        """``{"median", "min", "max", "count"}``."""
        return {"median": self.median, "min": self.min, "max": self.max, "count": self.count}


@dataclass
class Summary:
    """The publishable summary of one run (possibly split over several log files)."""

    sources: list[str]
    warmup: int
    valid: bool
    reason: str | None
    exit_code: int
    format: str | None = None
    steps_parsed: int = 0
    steps_measured: int = 0
    last_step: int | None = None
    ranks: tuple[int, ...] = ()
    stats: dict[str, Stat | None] | None = None
    memory_peak_gib: float | None = None
    first_bad: Record | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object; throughput figures are null for an invalid run."""
        stats = self.stats or {}
        out: dict[str, Any] = {
            "valid": self.valid,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "files": self.sources,
            "format": self.format,
            "warmup": self.warmup,
            "steps_parsed": self.steps_parsed,
            "steps_measured": self.steps_measured,
            "last_step": self.last_step,
            "ranks": list(self.ranks),
            "memory_peak_gib": self.memory_peak_gib,
            "first_bad": record_json(self.first_bad) if self.first_bad else None,
        }
        for name in THROUGHPUT_FIELDS:
            stat = stats.get(name)
            out[name] = stat.to_json() if stat else None
        return out

    def lines(self) -> list[str]:
        """Human-readable report lines."""
        out = [f"valid: {'true' if self.valid else 'false'}"]
        if self.reason:
            out.append(f"reason: {self.reason}")
        out.append(f"files: {', '.join(self.sources)}")
        if self.format:
            out.append(f"format: {self.format}")
        out.append(f"steps parsed: {self.steps_parsed} (last step {self.last_step})")
        if self.valid:
            out.append(f"steps measured: {self.steps_measured} (after warm-up {self.warmup})")
            labels = {
                "tps": "tokens/s per device",
                "tflops": "TFLOP/s per device",
                "mfu": "MFU %",
                "iteration_ms": "iteration time ms",
            }
            for name, label in labels.items():
                stat = (self.stats or {}).get(name)
                if stat:
                    out.append(
                        f"{label}: median {stat.median:,.2f} "
                        f"(min {stat.min:,.2f}, max {stat.max:,.2f}, n={stat.count})"
                    )
            if self.memory_peak_gib is not None:
                out.append(f"memory peak: {self.memory_peak_gib:.2f} GiB")
        return out


def _invalid(sources: list[str], warmup: int, reason: str, code: int, **kw: Any) -> Summary:
    return Summary(sources, warmup, valid=False, reason=reason, exit_code=code, **kw)


def summarize(logs: list[ParsedLog], warmup: int = DEFAULT_WARMUP,
              errors: list[str] | None = None) -> Summary:
    """The summary of one run whose metric lines are spread over ``logs``.

    Args:
        logs: parsed logs of one run (several files are pooled, e.g. one file per rank).
        warmup: training steps ``<= warmup`` are left out of the throughput figures.
        errors: files that could not be read (the run is then invalid).

    Raises:
        ValueError: ``warmup`` is negative.
    """
    if warmup < 0:
        raise ValueError(f"--warmup {warmup} is not valid; accepted: an integer >= 0")
    sources = [log.source for log in logs] + list(errors or [])
    if errors:
        return _invalid(sources, warmup, f"cannot read: {'; '.join(errors)}", EXIT_ERROR)
    records = [r for log in logs for r in log.records]
    formats = sorted({r.format for r in records if r.format != GUARD_FORMAT})
    train = [r for r in records if r.kind == "train"]
    steps = sorted({r.step for r in train})
    common: dict[str, Any] = {
        "format": (formats[0] if len(formats) == 1 else "mixed") if formats else None,
        "steps_parsed": len(steps),
        "last_step": steps[-1] if steps else None,
        "ranks": tuple(sorted({r.rank for r in records if r.rank is not None})),
    }
    if not train:
        return _invalid(
            sources, warmup,
            "no TorchTitan or Megatron-LM training metric line found", EXIT_ERROR, **common,
        )
    bad = find_first_bad(records)
    if bad is not None:
        rank = f" on rank {bad.rank}" if bad.rank is not None else ""
        return _invalid(
            sources, warmup,
            f"non-finite value at {bad.kind} step {bad.step}{rank}: {describe_values(bad)}",
            EXIT_NONFINITE, first_bad=bad, **common,
        )
    measured = [r for r in train if r.step > warmup]
    if not measured:
        return _invalid(
            sources, warmup,
            f"no training step after warm-up (last step {steps[-1]} <= --warmup {warmup})",
            EXIT_ERROR, **common,
        )
    stats = {
        name: Stat.of([v for r in measured if (v := getattr(r, name)) is not None])
        for name in THROUGHPUT_FIELDS
    }
    if all(s is None for s in stats.values()):
        return _invalid(
            sources, warmup, "the measured steps log no throughput or timing figure",
            EXIT_ERROR, **common,
        )
    peaks = [r.memory_gib for r in records if r.memory_gib is not None]
    peaks += [p for log in logs for p in log.memory_peaks_gib]
    return Summary(
        sources, warmup, valid=True, reason=None, exit_code=EXIT_OK,
        steps_measured=len({r.step for r in measured}), stats=stats,
        memory_peak_gib=max(peaks) if peaks else None, **common,
    )
