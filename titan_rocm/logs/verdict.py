"""The one verdict on a training run that every log tool reports (check-log, bench-summary,
compare): did it train, finitely, to the end?

``ok``          at least one training step, every loss and grad norm finite, and the log does
                not end in a crash;
``diverged``    a non-finite loss or grad norm (or Megatron's nan-iteration count, or the
                titan-rocm divergence guard's stop message) at step N;
``flagged``     every value finite, but the in-training numerics audit
                (``[rocm] numerics_audit``) flagged step N: its compiled gradients disagree
                with eager and float64 (the audit's report, or the stop policy's exception,
                is in the log; docs/numerics-audit.md);
``incomplete``  the log ends in a crash (traceback, OOM, signal, collective error) after its
                last training step, or has metric lines but no training step at all, or
                bytes of it were not read (the middle of a line longer than 1 MiB without a
                line end: a metric line in it could be missed, so such a log is never
                ``ok``);
``empty``       no metric line and no crash: nothing a training log would show.

A crash marker followed by more training steps is a warning the run survived, not an end;
one after TorchTitan's ``Training completed`` (Megatron: ``[after training is done]``) came
after training finished and is reported as a note on an ``ok`` run. A log that simply stops,
with no marker (a scheduler's SIGKILL that printed nothing), cannot be told from a finished
one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from titan_rocm.logs.parse import (
    FORMAT_NAMES,
    FORMATS,
    MAX_LINE_BYTES,
    TAIL_BYTES,
    AuditMark,
    Crash,
    ParsedLog,
    Record,
)
from titan_rocm.logs.tables import distinct_count
from titan_rocm.serial import json_form

OK = "ok"
DIVERGED = "diverged"
FLAGGED = "flagged"
INCOMPLETE = "incomplete"
EMPTY = "empty"
STATUSES: tuple[str, ...] = (OK, DIVERGED, FLAGGED, INCOMPLETE, EMPTY)


def first_bad(records: Sequence[Record]) -> Record | None:
    """The non-finite record of the lowest step (the earliest line among equal steps)."""
    bad = [r for r in records if not r.finite]
    return min(bad, key=lambda r: (r.step, r.line)) if bad else None


@dataclass(frozen=True)
class Verdict:
    """How a run (one log, or several files of one run) ended."""

    status: str
    """One of :data:`STATUSES`."""
    reason: str
    """One sentence that says why, for people."""
    train_steps: int
    """Distinct training steps with a metric line."""
    last_step: int | None
    """The last training step logged (None: none)."""
    first_bad: Record | None = None
    """``diverged``: the first non-finite record."""
    crash: Crash | None = None
    """The crash that ended the run (``incomplete``), or one after training completed
    (``ok``, see :attr:`note`)."""
    source: str | None = None
    """The file the crash is in, when the run spans several files."""
    note: str | None = None
    """Something a reader should know about an ``ok`` run (a crash after completion)."""
    unread_bytes: int = 0
    """Bytes of the logs not read (over-long lines): the verdict cannot be ``ok``."""
    audit: AuditMark | None = None
    """``flagged``: the first step the in-training numerics audit flagged."""

    @property
    def step(self) -> int | None:
        """``diverged``: the first non-finite step; ``flagged``: the step the audit flagged;
        otherwise the last training step."""
        if self.first_bad is not None:
            return self.first_bad.step
        return self.audit.step if self.audit is not None else self.last_step

    @property
    def label(self) -> str:
        """``ok``, ``diverged at step 7``, ``numerics audit flagged at step 1``,
        ``incomplete`` or ``empty``."""
        if self.status == DIVERGED:
            return f"diverged at step {self.step}"
        if self.status == FLAGGED:
            return f"numerics audit flagged at step {self.step}"
        return self.status

    def to_dict(self) -> dict[str, Any]:
        """The verdict as strict JSON."""
        return json_form(
            self, "status label reason step train_steps last_step first_bad crash crash_file "
            "note unread_bytes audit_flagged=audit",
            crash_file=self.source if self.crash else None)


def _diverged(bad: Record) -> str:
    rank = f" on rank {bad.rank}" if bad.rank is not None else ""
    kind = "validation " if bad.kind == "validation" else ""
    if bad.raw is not None:
        return (
            f"the run diverged at or after step {bad.step}{rank} (line {bad.line}): "
            f"{bad.describe()}; such a value counts as non-finite."
        )
    if bad.guard_stop:
        values = bad.describe()
        values = "no value in the message" if values.startswith("no ") else values
        return (
            f"the run diverged at {kind}step {bad.step}{rank}: the titan-rocm divergence "
            f"guard stopped it (line {bad.line}: {values})."
        )
    return (
        f"the run diverged at {kind}step {bad.step}{rank} (line {bad.line}): "
        f"{bad.describe()}."
    )


def _first_flagged(logs: Sequence[ParsedLog]) -> tuple[ParsedLog, AuditMark] | None:
    marks = [(mark.step, i, mark) for i, log in enumerate(logs) for mark in log.audits_flagged]
    if not marks:
        return None
    _, i, mark = min(marks, key=lambda m: m[:2])
    return logs[i], mark


def _ending_crash(log: ParsedLog) -> Crash | None:
    """The crash the log ends in (None: none, or one after training completed)."""
    crash = log.crash
    if crash is not None and (log.completed_line is None or log.completed_line > crash.line):
        return crash
    return None


def _flagged(log: ParsedLog, mark: AuditMark, crash: Crash | None, several: bool, steps: int,
             unread: int) -> str:
    where = f"line {mark.line} of {log.source}" if several else f"line {mark.line}"
    rank = f", rank {mark.rank}" if mark.rank is not None else ""
    after = (f"; every loss and grad norm logged is finite over {steps} training step(s)"
             if steps else "; no training step was logged")
    ended = f", and the log ends in a crash ({_crash_text(log, crash, several)})" if crash else ""
    unread_note = f" ({unread} byte(s) of the log were not read)" if unread else ""
    return (f"the in-training numerics audit flagged step {mark.step} ({where}{rank}): the "
            f"compiled gradients disagree with eager and float64 there{after}{ended}"
            f"{unread_note}.")


def _unread(logs: Sequence[ParsedLog], unread: int) -> str:
    cut = [(log, line) for log in logs for line in log.cut_lines]
    several = len(logs) > 1
    where = ", ".join(f"line {line} of {log.source}" if several else f"line {line}"
                      for log, line in cut[:3]) + (" ..." if len(cut) > 3 else "")
    return (f"{unread} byte(s) of the log were not read: {len(cut)} line(s) ran past "
            f"{MAX_LINE_BYTES} bytes without a line end ({where}); the first "
            f"{MAX_LINE_BYTES} and the last {TAIL_BYTES} bytes of each, and every line after, "
            "were read, but a loss or grad norm in the bytes between would be missed, so this "
            "log is not a pass.")


def _nothing_found(log: ParsedLog) -> str:
    """Why a log without any metric line has none, in one sentence."""
    if log.binary:
        return f"{log.source} is {log.binary}: no training metric line in it."
    if log.lines == 0:
        return f"{log.source} is empty: no training metric line in it."
    wanted = (
        "TorchTitan or Megatron-LM" if log.fmt == "auto" else FORMAT_NAMES.get(log.fmt, log.fmt)
    )
    found = f"no {wanted} metric line in {log.lines} line(s)"
    if log.excluded:
        other = ", ".join(
            f"{n} {FORMAT_NAMES.get(f, f)} metric line(s)" for f, n in sorted(log.excluded.items())
        )
        formats = " or ".join(f"--format {f}" for f in sorted(log.excluded))
        return (
            f"{found}, but {other}: it is a {'/'.join(sorted(log.excluded))} log; use {formats} "
            f"or --format auto (accepted: {', '.join(FORMATS)})."
        )
    return f"{found}."


def _crash_text(log: ParsedLog, crash: Crash, several: bool) -> str:
    """``out of memory at line 812, rank 3: "torch.OutOfMemoryError: ..."``."""
    where = f"line {crash.line} of {log.source}" if several else f"line {crash.line}"
    rank = f", rank {crash.rank}" if crash.rank is not None else ""
    return f'{crash.kind} at {where}{rank}: "{crash.text}"'


def verdict_of(logs: Sequence[ParsedLog]) -> Verdict:
    """The verdict on one run whose lines are spread over ``logs`` (one file per rank, or one)."""
    records = [r for log in logs for r in log.records]
    count, last = distinct_count(c.steps for log in logs for c in log.curves.values())
    common: dict[str, Any] = {"train_steps": count, "last_step": last}
    unread = sum(log.skipped_bytes for log in logs)
    bad = first_bad(records)
    if bad is not None:
        return Verdict(DIVERGED, _diverged(bad), first_bad=bad, unread_bytes=unread, **common)
    flagged = _first_flagged(logs)
    if flagged is not None:
        log, mark = flagged
        crash = _ending_crash(log)
        return Verdict(FLAGGED, _flagged(log, mark, crash, len(logs) > 1, count, unread),
                       audit=mark, crash=crash, source=log.source, unread_bytes=unread,
                       **common)
    if unread:
        return Verdict(INCOMPLETE, _unread(logs, unread), unread_bytes=unread, **common)
    ending = [(log, crash) for log in logs if (crash := _ending_crash(log)) is not None]
    if ending:
        log, crash = ending[0]
        crash_text = _crash_text(log, crash, len(logs) > 1)
        if count:
            reason = (
                f"the run did not finish: after its last logged training step "
                f"{last} the log ends in a crash ({crash_text})."
            )
        else:
            reason = f"the run crashed before its first training step ({crash_text})."
        return Verdict(INCOMPLETE, reason, crash=crash, source=log.source, **common)
    if not count:
        validation = sum(1 for r in records if r.kind == "validation")
        truncated = sum(len(log.truncated) for log in logs)
        if validation or truncated:
            found = " and ".join(
                part for part in (
                    f"{validation} validation metric line(s)" if validation else "",
                    f"{truncated} truncated metric line(s) without a value" if truncated else "",
                ) if part
            )
            return Verdict(
                INCOMPLETE, f"no training step: the log holds {found} but no training step.",
                **common,
            )
        reasons = [_nothing_found(log) for log in logs] or ["no log was given."]
        return Verdict(EMPTY, " ".join(reasons), **common)
    after = [(log, log.crash) for log in logs if log.crash is not None]
    note = None
    if after:
        log, crash = after[0]
        note = (
            f"training completed (line {log.completed_line}), then the process failed "
            f"({_crash_text(log, crash, len(logs) > 1)}); the training steps are complete."
        )
    return Verdict(
        OK,
        f"every loss and grad norm is finite over {count} training step(s), "
        f"the last step {last}.",
        crash=after[0][1] if after else None,
        source=after[0][0].source if after else None,
        note=note,
        **common,
    )
