"""The one verdict on a training run that every log tool reports (check-log, bench-summary,
compare): did it train, finitely, to the end?

``ok``          at least one training step, every loss and grad norm finite, and the log does
                not end in a crash;
``diverged``    a non-finite loss or grad norm (or Megatron's nan-iteration count, or the
                titan-rocm divergence guard's stop message) at step N;
``incomplete``  the log ends in a crash (traceback, OOM, signal, collective error) after its
                last training step, or has metric lines but no training step at all, or
                bytes of it were not read (a line longer than 1 MiB without a line end:
                a metric line in it could be missed, so such a log is never ``ok``);
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
    Crash,
    ParsedLog,
    Record,
)

OK = "ok"
DIVERGED = "diverged"
INCOMPLETE = "incomplete"
EMPTY = "empty"
STATUSES: tuple[str, ...] = (OK, DIVERGED, INCOMPLETE, EMPTY)


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

    @property
    def step(self) -> int | None:
        """``diverged``: the first non-finite step; otherwise the last training step."""
        return self.first_bad.step if self.first_bad is not None else self.last_step

    @property
    def label(self) -> str:
        """``ok``, ``diverged at step 7``, ``incomplete`` or ``empty``."""
        if self.status == DIVERGED:
            return f"diverged at step {self.step}"
        return self.status

    def to_dict(self) -> dict[str, Any]:
        """The verdict as strict JSON."""
        return {
            "status": self.status,
            "label": self.label,
            "reason": self.reason,
            "step": self.step,
            "train_steps": self.train_steps,
            "last_step": self.last_step,
            "first_bad": self.first_bad.to_dict() if self.first_bad else None,
            "crash": self.crash.to_dict() if self.crash else None,
            "crash_file": self.source if self.crash else None,
            "note": self.note,
            "unread_bytes": self.unread_bytes,
        }


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
    train_steps = sorted(set().union(*(log.train_steps() for log in logs)))
    common: dict[str, Any] = {
        "train_steps": len(train_steps),
        "last_step": train_steps[-1] if train_steps else None,
    }
    unread = sum(log.skipped_bytes for log in logs)
    bad = first_bad(records)
    if bad is not None:
        return Verdict(DIVERGED, _diverged(bad), first_bad=bad, unread_bytes=unread, **common)
    if unread:
        return Verdict(
            INCOMPLETE,
            f"{unread} byte(s) of the log were not read (a line ran past "
            f"{MAX_LINE_BYTES} bytes without a line end): a loss or grad norm in them would "
            "be missed, so this log is not a pass.", unread_bytes=unread, **common)
    ending = [
        (log, log.crash) for log in logs
        if log.crash is not None
        and (log.completed_line is None or log.completed_line > log.crash.line)
    ]
    if ending:
        log, crash = ending[0]
        crash_text = _crash_text(log, crash, len(logs) > 1)
        if train_steps:
            reason = (
                f"the run did not finish: after its last logged training step "
                f"{train_steps[-1]} the log ends in a crash ({crash_text})."
            )
        else:
            reason = f"the run crashed before its first training step ({crash_text})."
        return Verdict(INCOMPLETE, reason, crash=crash, source=log.source, **common)
    if not train_steps:
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
        f"every loss and grad norm is finite over {len(train_steps)} training step(s), "
        f"the last step {train_steps[-1]}.",
        crash=after[0][1] if after else None,
        source=after[0][0].source if after else None,
        note=note,
        **common,
    )
