"""Is every logged loss and grad norm of a training log finite? (``titan-rocm check-log``).

Exit codes: 0 at least one step parsed and every value finite; 1 a non-finite value;
2 unreadable file or no metric line found (an unparseable log is not a pass).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan_rocm.guard_message import fmt_value
from titan_rocm.logs.parse import ParsedLog, Record, json_value, parse_file

EXIT_OK = 0
EXIT_NONFINITE = 1
EXIT_ERROR = 2


def first_bad(records: list[Record]) -> Record | None:
    """The non-finite record of the lowest step (the earliest line among equal steps)."""
    bad = [r for r in records if not r.finite]
    return min(bad, key=lambda r: (r.step, r.line)) if bad else None


def first_bad_per_rank(records: list[Record]) -> dict[int | None, Record]:
    """:func:`first_bad` of each rank (None: lines without a rank prefix)."""
    by_rank: dict[int | None, list[Record]] = {}
    for r in records:
        by_rank.setdefault(r.rank, []).append(r)
    result = {rank: first_bad(rs) for rank, rs in by_rank.items()}
    return {rank: r for rank, r in result.items() if r is not None}


def describe_values(record: Record) -> str:
    """``loss=nan grad_norm=1.23`` for messages (every checked value of the record)."""
    values = record.checked_values()
    if record.nan_iterations:
        values["nan iterations"] = float(record.nan_iterations)
    return " ".join(f"{k.replace(' ', '_')}={fmt_value(v)}" for k, v in values.items())


def record_json(record: Record) -> dict[str, Any]:
    """A record's position and values as strict JSON (non-finite values as strings)."""
    return {
        "step": record.step,
        "rank": record.rank,
        "line": record.line,
        "kind": record.kind,
        "values": {k: json_value(v) for k, v in record.checked_values().items()},
        "bad": {k: json_value(v) for k, v in record.bad_values().items()},
    }


@dataclass
class CheckResult:
    """The verdict on one log."""

    path: str
    exit_code: int
    error: str | None = None
    log: ParsedLog | None = None
    bad: list[Record] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``ok``, ``nonfinite`` or ``error``."""
        return {EXIT_OK: "ok", EXIT_NONFINITE: "nonfinite"}.get(self.exit_code, "error")

    @property
    def steps_parsed(self) -> int:
        """Distinct training steps with a metric line."""
        return len({r.step for r in self.log.train_records}) if self.log else 0

    def lines(self) -> list[str]:
        """Human-readable report lines."""
        if self.error:
            return [f"{self.path}: error: {self.error}"]
        assert self.log is not None
        where = f"{self.log.format}, {self.steps_parsed} steps parsed"
        if not self.bad:
            return [f"{self.path}: ok: every loss and grad norm finite ({where})"]
        first = first_bad(self.bad)
        assert first is not None
        rank = f"rank {first.rank}, " if first.rank is not None else ""
        kind = "validation " if first.kind == "validation" else ""
        said = " [the titan-rocm divergence guard's stop message]" if first.guard_stop else ""
        steps = len({(r.kind, r.step) for r in self.bad})
        out = [
            f"{self.path}: DIVERGED: first non-finite {kind}step {first.step} "
            f"({rank}line {first.line}){said}: {describe_values(first)}; "
            f"{len(self.bad)} non-finite metric line(s) over {steps} step(s) ({where})"
        ]
        per_rank = first_bad_per_rank(self.bad)
        if len(per_rank) > 1 or (per_rank and None not in per_rank):
            for r in sorted(per_rank, key=lambda k: -1 if k is None else k):
                rec = per_rank[r]
                label = "no rank prefix" if r is None else f"rank {r}"
                out.append(
                    f"  {label}: first non-finite step {rec.step} (line {rec.line}): "
                    f"{describe_values(rec)}"
                )
        return out

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object for this log."""
        out: dict[str, Any] = {
            "path": self.path,
            "status": self.status,
            "exit_code": self.exit_code,
            "error": self.error,
            "format": self.log.format if self.log else None,
            "steps_parsed": self.steps_parsed,
            "metric_lines": len(self.log.records) if self.log else 0,
            "ranks": self.log.ranks if self.log else [],
            "incomplete_lines": self.log.incomplete if self.log else [],
            "nonfinite_count": len(self.bad),
            "nonfinite_steps": sorted({r.step for r in self.bad}),
            "first_bad": None,
            "first_bad_per_rank": {},
        }
        first = first_bad(self.bad)
        if first is not None:
            out["first_bad"] = record_json(first)
            out["first_bad_per_rank"] = {
                "none" if rank is None else str(rank): record_json(rec)
                for rank, rec in first_bad_per_rank(self.bad).items()
            }
        return out


def check_parsed(log: ParsedLog) -> CheckResult:
    """The verdict on an already parsed log."""
    if not log.records:
        found = f"{log.lines} lines read"
        if log.incomplete:
            found += f", {len(log.incomplete)} truncated metric line(s) without a loss value"
        return CheckResult(
            log.source,
            EXIT_ERROR,
            error=(
                f"no TorchTitan or Megatron-LM metric line found ({found}); "
                "an unparseable log is not a pass"
            ),
            log=log,
        )
    bad = [r for r in log.records if not r.finite]
    return CheckResult(log.source, EXIT_NONFINITE if bad else EXIT_OK, log=log, bad=bad)


def check_file(path: str | Path, fmt: str = "auto") -> CheckResult:
    """Parse and check one log file; unreadable files give an ``error`` result, not raise."""
    try:
        log = parse_file(path, fmt)
    except OSError as exc:
        return CheckResult(str(path), EXIT_ERROR, error=f"cannot read: {exc.strerror or exc}")
    return check_parsed(log)


def combined_exit_code(results: list[CheckResult]) -> int:
    """1 if any log diverged (a definite finding), else 2 if any failed to parse, else 0."""
    codes = {r.exit_code for r in results}
    if EXIT_NONFINITE in codes:
        return EXIT_NONFINITE
    if EXIT_ERROR in codes or not results:
        return EXIT_ERROR
    return EXIT_OK
