"""Is every logged loss and grad norm of a training log finite? (``titan-rocm check-log``;
docs/divergence-detection.md gives the exit codes.) An unchecked log is never a pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan_rocm.logs.parse import ParsedLog, Record, UnreadableLog, parse_file
from titan_rocm.logs.verdict import (
    DIVERGED,
    FLAGGED,
    INCOMPLETE,
    OK,
    UNREADABLE,
    Verdict,
    first_bad,
    verdict_of,
)

EXIT_OK = 0
EXIT_NONFINITE = 1
EXIT_ERROR = 2
EXIT_INCOMPLETE = 3
"""``--require-complete``: every value finite, but the log does not show the run finished."""
EXIT_FLAGGED = 4
"""Every value finite, but the in-training numerics audit flagged a step."""


def first_bad_per_rank(records: list[Record]) -> dict[int | None, Record]:
    """:func:`~titan_rocm.logs.verdict.first_bad` of each rank (None: no rank prefix)."""
    by_rank: dict[int | None, list[Record]] = {}
    for r in records:
        by_rank.setdefault(r.rank, []).append(r)
    result = {rank: first_bad(rs) for rank, rs in by_rank.items()}
    return {rank: r for rank, r in result.items() if r is not None}


def exit_code_of(verdict: Verdict) -> int:
    """check-log's exit code for a verdict (see the module docstring)."""
    if verdict.status == DIVERGED:
        return EXIT_NONFINITE
    if verdict.status == FLAGGED:
        return EXIT_FLAGGED
    if verdict.unread_bytes or verdict.status == UNREADABLE:
        return EXIT_ERROR
    if verdict.status == OK or (verdict.status == INCOMPLETE and verdict.train_steps):
        return EXIT_OK
    return EXIT_ERROR


@dataclass
class CheckResult:
    """The verdict on one log file."""

    path: str
    exit_code: int
    error: str | None = None
    """Why the file could not be checked (exit 2)."""
    log: ParsedLog | None = None
    verdict: Verdict | None = None
    bad: list[Record] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``ok``, ``nonfinite``, ``flagged`` or ``error``: what the exit code means."""
        return {EXIT_OK: "ok", EXIT_NONFINITE: "nonfinite", EXIT_FLAGGED: "flagged"}.get(
            self.exit_code, "error")

    def _found(self) -> str:
        assert self.log is not None and self.verdict is not None
        steps = self.verdict.train_steps
        if not steps:
            return "no training-step metric line was parsed"
        return f"{steps} training step(s) parsed ({self.log.format})"

    def lines(self) -> list[str]:
        """Human-readable report lines, each a sentence or more."""
        if self.log is None or self.verdict is None:
            return [f"{self.path}: error: {self.error}"]
        v = self.verdict
        stop = [f"  stop: {v.stop.sentence()}."] if v.stop is not None else []
        if v.status == FLAGGED:
            return [f"{self.path}: NUMERICS AUDIT FLAGGED: {v.reason}", *stop]
        if v.status == UNREADABLE:
            return [f"{self.path}: NUMERICS AUDIT VERDICT UNREADABLE: {v.reason}",
                    "  This log does not pass until the audit's verdict is read."]
        if v.status == OK:
            out = [f"{self.path}: ok: {v.reason[:-1]} ({self.log.format})."]
            if v.note:
                out.append(f"  note: {v.note}")
            return out
        if v.status != DIVERGED:
            out = [f"{self.path}: {v.status}: {v.reason}"]
            if self.exit_code == EXIT_OK:
                out.append(
                    f"  Every loss and grad norm logged before it is finite; {self._found()}."
                )
            elif v.train_steps:
                out.append(f"  Every loss and grad norm read is finite; {self._found()}; "
                           "the bytes not read leave the log unchecked, so it does not pass.")
            else:
                out.append("  No training step to check, so this log does not pass.")
            return out
        steps = len({(r.kind, r.step) for r in self.bad})
        out = [
            f"{self.path}: DIVERGED: {v.reason} {len(self.bad)} line(s) with a non-finite value "
            f"over {steps} step(s); {self._found()}."
        ]
        per_rank = first_bad_per_rank(self.bad)
        if len(per_rank) > 1 or (per_rank and None not in per_rank):
            for r in sorted(per_rank, key=lambda k: -1 if k is None else k):
                rec = per_rank[r]
                label = "lines without a rank prefix" if r is None else f"rank {r}"
                out.append(
                    f"  {label}: first non-finite step {rec.step} (line {rec.line}): "
                    f"{rec.describe()}."
                )
        return out + stop

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object for this log (strict JSON: non-finite values as strings)."""
        out: dict[str, Any] = {
            "path": self.path,
            "status": self.status,
            "exit_code": self.exit_code,
            "error": self.error,
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "format": self.log.format if self.log else None,
            "steps_parsed": self.verdict.train_steps if self.verdict else 0,
            "metric_lines": self.log.metric_lines if self.log else 0,
            "ranks": self.log.ranks if self.log else [],
            "truncated_lines": self.log.truncated if self.log else [],
            "nonfinite_count": len(self.bad),
            "nonfinite_steps": sorted({r.step for r in self.bad}),
            "first_bad": None,
            "first_bad_per_rank": {},
        }
        first = first_bad(self.bad)
        if first is not None:
            out["first_bad"] = first.to_dict()
            out["first_bad_per_rank"] = {
                "none" if rank is None else str(rank): rec.to_dict()
                for rank, rec in first_bad_per_rank(self.bad).items()
            }
        return out


def check_parsed(log: ParsedLog) -> CheckResult:
    """The verdict on an already parsed log."""
    verdict = verdict_of([log])
    code = exit_code_of(verdict)
    return CheckResult(
        log.source, code, log=log, verdict=verdict,
        error=verdict.reason if code == EXIT_ERROR else None,
        bad=[r for r in log.records if not r.finite],
    )


def check_file(path: str | Path, fmt: str = "auto") -> CheckResult:
    """Parse and check one log file; an unreadable one gives an ``error`` result, not raise."""
    try:
        log = parse_file(path, fmt, lean=True)  # memory: steps, not every record
    except UnreadableLog as exc:
        return CheckResult(str(path), EXIT_ERROR, error=f"{exc}")
    return check_parsed(log)


def combined_exit_code(results: list[CheckResult], require_complete: bool = False) -> int:
    """1 diverged, else 4 audit flagged, else 2 not checked, else (``require_complete``) 3
    unfinished, else 0."""
    codes = {r.exit_code for r in results}
    if EXIT_NONFINITE in codes:
        return EXIT_NONFINITE
    if EXIT_FLAGGED in codes:
        return EXIT_FLAGGED
    if EXIT_ERROR in codes or not results:
        return EXIT_ERROR
    if require_complete and any(r.verdict is not None and (
            r.verdict.status == INCOMPLETE or not r.verdict.completed) for r in results):
        return EXIT_INCOMPLETE
    return EXIT_OK
