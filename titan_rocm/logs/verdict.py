"""The one verdict on a training run that every log tool reports (check-log, bench-summary,
compare); docs/divergence-detection.md defines each.

A verdict not read is never a pass, and a log with unread bytes is never ``ok``."""

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
    AuditUnread,
    Crash,
    ParsedLog,
    Quarantine,
    Record,
)
from titan_rocm.logs.tables import distinct_count
from titan_rocm.serial import json_form

OK = "ok"
DIVERGED = "diverged"
FLAGGED = "flagged"
INCOMPLETE = "incomplete"
EMPTY = "empty"
UNREADABLE = "unreadable"
STATUSES: tuple[str, ...] = (OK, DIVERGED, FLAGGED, UNREADABLE, INCOMPLETE, EMPTY)


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
    """The crash that ended the run (``incomplete``), or one after training completed (a note)."""
    source: str | None = None
    """The file the crash is in, when the run spans several files."""
    note: str | None = None
    """Something a reader should know about an ``ok`` run (a crash after completion)."""
    unread_bytes: int = 0
    """Bytes of the logs not read (over-long lines): the verdict cannot be ``ok``."""
    audit: AuditMark | None = None
    """``flagged``: the first step the in-training numerics audit flagged."""
    audits_flagged: tuple[AuditMark, ...] = ()
    """Every step the audit flagged, in step order."""
    audits_unread: tuple[AuditUnread, ...] = ()
    """Audit verdicts that could not be read (``unreadable``, or beside a flag)."""
    completed: bool = False
    """The log shows the run finished after its last training step."""
    stop: Stop | None = None
    """What stopped the run: the audit's stop policy or the divergence guard."""

    @property
    def step(self) -> int | None:
        """The first non-finite step, the audit's flagged step, or else the last training step."""
        if self.first_bad is not None:
            return self.first_bad.step
        return self.audit.step if self.audit is not None else self.last_step

    @property
    def quarantines(self) -> list[Quarantine]:
        """The segments the audit's quarantine took out of compilation, in step order."""
        return [m.quarantine for m in self.audits_flagged if m.quarantine is not None]

    @property
    def label(self) -> str:
        """The verdict as printed, e.g. ``diverged at step 7``."""
        if self.status == DIVERGED:
            return f"diverged at step {self.step}"
        if self.status == FLAGGED:
            quarantined = ", ".join(f"{q.segment} quarantined at step {q.step}"
                                    if q.step != self.step else f"{q.segment} quarantined"
                                    for q in self.quarantines)
            return f"numerics audit flagged at step {self.step}" + (
                f", {quarantined}" if quarantined else "")
        if self.status == UNREADABLE:
            return "numerics audit verdict unreadable"
        return self.status

    def to_dict(self) -> dict[str, Any]:
        """The verdict as strict JSON."""
        return json_form(
            self, "status label reason step train_steps last_step completed first_bad crash "
            "crash_file note unread_bytes stop audit_flagged=audit flagged_steps quarantined "
            "audit_unreadable",
            crash_file=self.source if self.crash else None,
            flagged_steps=[m.step for m in self.audits_flagged],
            quarantined=[q.to_dict() for q in self.quarantines],
            audit_unreadable=[u.to_dict() for u in self.audits_unread])


@dataclass(frozen=True)
class Stop:
    """A stop the log shows: the audit's stop policy or the divergence guard ended the run."""

    by: str
    """``numerics audit`` or ``divergence guard``."""
    step: int
    line: int

    def sentence(self) -> str:
        """``the numerics audit's stop policy stopped the run at step 1 (line 67)``."""
        who = ("the numerics audit's stop policy" if self.by == "numerics audit"
               else "the divergence guard")
        return f"{who} stopped the run at step {self.step} (line {self.line})"

    def to_dict(self) -> dict[str, Any]:
        """``{"by", "step", "line"}``."""
        return json_form(self, "by step line")


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


def _flag_marks(logs: Sequence[ParsedLog]) -> list[tuple[ParsedLog, AuditMark]]:
    """Every flagged step over ``logs`` (the first mark of each step), in step order."""
    marks: dict[int, tuple[ParsedLog, AuditMark]] = {}
    for log in logs:
        for mark in log.audits_flagged:
            marks.setdefault(mark.step, (log, mark))
    return [marks[step] for step in sorted(marks)]


def _ending_crash(log: ParsedLog) -> Crash | None:
    """The crash the log ends in (None: none, or one after training completed)."""
    crash = log.crash
    if crash is not None and (log.completed_line is None or log.completed_line > crash.line):
        return crash
    return None


def _owner(segment: str) -> str:
    return segment if segment.startswith("block ") else f"the {segment}"


def what_was_wrong(mark: AuditMark) -> str:
    """What the audit found wrong at ``mark``, against which reference, from its report lines."""
    reference = (f"the {mark.reference} reference" if mark.reference
                 else "its reference (no line naming it was read)")
    said = [f"{_owner(seg)}'s output (forward)" if direction == "forward"
            else f"{_owner(seg)}'s gradients (backward)" for direction, seg in mark.wrong]
    if said:
        verb = "is" if len(said) == 1 and said[0].endswith("(forward)") else "are"
        return (f"{' and '.join(said)}, compiled, {verb} further from {reference} than "
                "eager's, beyond the audit's threshold")
    part = f" of {mark.part}" if mark.part else ""
    return (f"the compiled code{part} is further from {reference} than eager, beyond the "
            "audit's threshold (which segment and direction: no report line naming them was "
            "read)")


def _where(log: ParsedLog, line: int, rank: int | None, several: bool) -> str:
    where = f"line {line} of {log.source}" if several else f"line {line}"
    return where + (f", rank {rank}" if rank is not None else "")


def _flagged(marks: list[tuple[ParsedLog, AuditMark]], crash: tuple[ParsedLog, Crash] | None,
             several: bool, steps: int, unread: int,
             unread_audits: Sequence[AuditUnread]) -> str:
    log, mark = marks[0]
    seen = {"verdict line": "", "stop": ", the stop policy's exception",
            "quarantine line": ", a quarantine line",
            "end-of-audit line": ", the end-of-audit line: its own verdict line was not read"}
    out = (f"the in-training numerics audit flagged step {mark.step} "
           f"({_where(log, mark.line, mark.rank, several)}{seen[mark.seen_in]}): "
           f"{what_was_wrong(mark)}")
    more = [m.step for _, m in marks[1:]]
    if more:
        out += f"; it flagged step(s) {', '.join(map(str, more))} too"
    if mark.stop_line is not None:
        out += f"; the stop policy ended the run there (line {mark.stop_line})"
    for _, m in marks:
        q = m.quarantine
        if q is not None:
            cost = f", at {q.cost} x the step time" if q.cost else ""
            out += (f"; {q.segment} was quarantined at step {q.step} (line {q.line}): that "
                    f"step was redone with it eager and it stayed eager{cost}, so the "
                    f"training after it is protected, but the compiled {q.segment} is wrong")
    out += (f"; every loss and grad norm logged is finite over {steps} training step(s)"
            if steps else "; no training step was logged")
    if crash is not None:
        out += f", and the log ends in a crash ({_crash_text(*crash, several)})"
    if unread_audits:
        out += f"; {_audits_unread(unread_audits, logs_named=None)}"
    if unread:
        out += f" ({unread} byte(s) of the log were not read)"
    return out + "."


def _audits_unread(unread: Sequence[AuditUnread], logs_named: str | None) -> str:
    first = unread[0]
    rank = f", rank {first.rank}" if first.rank is not None else ""
    more = f" (and {len(unread) - 1} more)" if len(unread) > 1 else ""
    where = f" of {logs_named}" if logs_named else ""
    return (f"{len(unread)} numerics audit verdict(s) could not be read: line {first.line}"
            f"{where}{rank}: {first.why}{more}")


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


def _stop(records: Sequence[Record], marks: list[tuple[ParsedLog, AuditMark]]) -> Stop | None:
    guard = min((r for r in records if r.guard_stop), key=lambda r: (r.step, r.line),
                default=None)
    if guard is not None:
        return Stop("divergence guard", guard.step, guard.line)
    stopped = [m for _, m in marks if m.stop_line is not None]
    if stopped:
        return Stop("numerics audit", stopped[0].step, stopped[0].stop_line or stopped[0].line)
    return None


def _not_completed(logs: Sequence[ParsedLog], last: int | None) -> str:
    mid = [log for log in logs if log.ends_mid_line]
    cut = ""
    if mid:
        cut = (f"; it stops mid-line (line {mid[0].lines}"
               + (f" of {mid[0].source}" if len(logs) > 1 else "") + ", no line end)")
    return (f"the log shows no end of training after its last training step {last} "
            "(TorchTitan's 'Training completed' or 'Process group destroyed', Megatron-LM's "
            f"'[after training is done]') and no crash marker{cut}: whether the run finished "
            "cannot be told from it, and --require-complete fails it.")


def verdict_of(logs: Sequence[ParsedLog]) -> Verdict:
    """The verdict on one run whose lines are spread over ``logs`` (one file per rank, or one)."""
    records = [r for log in logs for r in log.records]
    count, last = distinct_count(c.steps for log in logs for c in log.curves.values())
    marks = _flag_marks(logs)
    unread_audits = tuple(u for log in logs for u in log.audits_unread)
    common: dict[str, Any] = {
        "train_steps": count, "last_step": last,
        "completed": any(log.completed_line is not None for log in logs),
        "stop": _stop(records, marks), "audits_flagged": tuple(m for _, m in marks),
        "audits_unread": unread_audits}
    unread = sum(log.skipped_bytes for log in logs)
    bad = first_bad(records)
    if bad is not None:
        return Verdict(DIVERGED, _diverged(bad), first_bad=bad, unread_bytes=unread, **common)
    several = len(logs) > 1
    if marks:
        log, mark = marks[0]
        crash = _ending_crash(log)
        return Verdict(FLAGGED, _flagged(marks, (log, crash) if crash else None, several, count,
                                         unread, unread_audits),
                       audit=mark, crash=crash, source=log.source, unread_bytes=unread,
                       **common)
    if unread_audits:
        holder = next(log for log in logs if log.audits_unread)
        steps = (f"every loss and grad norm logged is finite over {count} training step(s)"
                 if count else "no training step was logged")
        return Verdict(
            UNREADABLE,
            f"{_audits_unread(unread_audits, holder.source if several else None)}; {steps}, "
            "but an audit verdict not read is no pass: read the audit's report in the log "
            "(docs/numerics-audit.md) or run the audit again.",
            unread_bytes=unread, **common)
    if unread:
        return Verdict(INCOMPLETE, _unread(logs, unread), unread_bytes=unread, **common)
    ending = [(log, crash) for log in logs if (crash := _ending_crash(log)) is not None]
    if ending:
        log, crash = ending[0]
        crash_text = _crash_text(log, crash, several)
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
            f"({_crash_text(log, crash, several)}); the training steps are complete."
        )
    elif not common["completed"]:
        note = _not_completed(logs, last)
    return Verdict(
        OK,
        f"every loss and grad norm is finite over {count} training step(s), "
        f"the last step {last}.",
        crash=after[0][1] if after else None,
        source=after[0][0].source if after else None,
        note=note,
        **common,
    )
