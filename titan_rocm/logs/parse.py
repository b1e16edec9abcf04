"""Find TorchTitan and Megatron-LM training-metric lines inside real, messy logs (docs/compare.md
lists what is read).

TorchTitan's lines are ``MetricsProcessor.log``'s (``torchtitan/components/metrics.py``: 0.2.2 lines
461-470 and 504-510, 0.3.0 lines 523-532 and 566-572). Never raises on any text."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan_rocm import audit_message
from titan_rocm.files import NotRegularFileError, open_regular
from titan_rocm.guard_message import NUMBER
from titan_rocm.guard_message import PATTERN as GUARD_PATTERN
from titan_rocm.logs.record import GUARD_FORMAT, MEGATRON, TORCHTITAN, Record
from titan_rocm.logs.record import json_value as json_value  # re-exported: its old home
from titan_rocm.logs.tables import Curve, Figures
from titan_rocm.serial import json_form

FORMATS: tuple[str, ...] = ("auto", "torchtitan", "megatron")
FORMAT_NAMES: dict[str, str] = {TORCHTITAN: "TorchTitan", MEGATRON: "Megatron-LM"}

MAX_LINE_BYTES = 1 << 20
"""A longer line is read as its head and its last :data:`TAIL_BYTES` (where a glued metric line
would be), so a log with no newline is never read whole; such a log is never ``ok``."""
TAIL_BYTES = 1 << 16
"""How much of the end of a cut line is read."""

# ANSI escape sequences: CSI (colours, cursor moves) and the two-character forms.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# torchrun's per-rank prefix: "[rank3]:" (torchrun --tee / -local-ranks-filter) or
# "[default3]:" (its log_line_prefix_template default "[{role_name}{local_rank}]:").
_RANK_PREFIX = re.compile(r"\[(?:rank|default)(\d{1,6})\]:")
# srun --label: "3: " at the start of a line.
_SRUN_LABEL = re.compile(r"^\s*(\d{1,6}): ")

# A number as Python, C printf or Java print it (bounded digits; see guard_message.NUMBER).
_NUM = NUMBER
# The same, allowing thousands separators (TorchTitan prints ``tps: 1,234``).
_NUM_GROUPED = (
    r"[-+]?(?:nan|inf(?:inity)?|(?:\d{1,3}(?:,\d{3}){1,12}|\d{1,40})(?:\.\d{0,40})?"
    r"(?:[eE][-+]?\d{1,4})?)"
)

_TT_STEP = re.compile(r"(?P<validate>validate\s+)?\bstep:\s*(?P<step>\d{1,18})(?!\d)")
# What may stand between two fields of a metric line: TorchTitan's two spaces (its colour
# codes are removed first), or the "|", "," and ";" some log shippers put there.
_SEP = r"[\s|,;]*"
# The loss right after "step: N" (matched at the start of the text after the step).
_TT_LOSS = re.compile(rf"{_SEP}loss:\s*(?P<v>{_NUM})(?![\w.])", re.IGNORECASE)
_TT_FIELDS: dict[str, re.Pattern[str]] = {
    "grad_norm": re.compile(rf"\bgrad_norm:\s*(?P<v>{_NUM})(?![\w.])", re.IGNORECASE),
    "memory": re.compile(rf"\bmemory:\s*(?P<v>{_NUM})\s*GiB", re.IGNORECASE),
    "tps": re.compile(rf"\btps:\s*(?P<v>{_NUM_GROUPED})(?![\w.])", re.IGNORECASE),
    "tflops": re.compile(rf"\btflops:\s*(?P<v>{_NUM_GROUPED})(?![\w.])", re.IGNORECASE),
    "mfu": re.compile(rf"\bmfu:\s*(?P<v>{_NUM})\s*%", re.IGNORECASE),
}

_MG_ITERATION = re.compile(r"\biteration\s+(?P<step>\d{1,18})\s*/\s*\d{1,18}\s*\|")
_MG_VALIDATION = re.compile(
    r"\b(?:validation|test) loss at iteration\s+(?P<step>\d{1,18})(?!\d)[^|]*\|"
)
_MG_MEMORY = re.compile(r"memory \((?P<unit>MB|GB)\)\s*\|")
_FIRST_NUM = re.compile(rf"(?<![\w.])(?P<v>{_NUM})(?![\w.])", re.IGNORECASE)
# Any "NAME: VALUE" that names a checked metric (TorchTitan's loss and grad_norm, Megatron's
# lm loss, load_balancing_loss, grad norm), to find values the metric patterns cannot read.
_NAMED_VALUE = re.compile(
    r"(?<![\w])(?P<name>[a-z][a-z_ ]{0,40}?loss|loss|grad[_ ]norm)\s*:[ \t]*(?P<v>[^\s|]*)",
    re.IGNORECASE)
_READABLE = re.compile(rf"{_NUM}[,;]?", re.IGNORECASE)
# TorchTitan's neighbours of a named loss or grad norm on its metric line: what comes right
# before it (the whole line) or right after its value (a piece of the line that another
# rank's output split off, which starts at the loss or the grad norm).
_TT_BEFORE: dict[str, re.Pattern[str]] = {
    "loss": re.compile(rf"\bstep:\s*\d{{1,18}}{_SEP}$", re.IGNORECASE),
    "grad_norm": re.compile(rf"\bloss:\s*[^\s|]+{_SEP}$", re.IGNORECASE),
}
_TT_AFTER: dict[str, re.Pattern[str]] = {
    "loss": re.compile(rf"{_SEP}(?:grad_norm|memory):", re.IGNORECASE),
    "grad_norm": re.compile(rf"{_SEP}memory:", re.IGNORECASE),
}
# The numerics audit's lines beside audit_message's: a part's header, logged just before its
# verdict line (titan_rocm/numerics/audit.py, Audit.finish: "numerics audit: part 1 of 3:
# 1 block(s), 64 tokens, reference float64, 3.7 s"; unspread: "numerics audit: 4 blocks, ..."),
# and the report's lines under a verdict (titan_rocm/numerics/report.py, format_report).
_AUDIT_HINTS: tuple[str, ...] = ("numerics audit", "first wrong in the ", "numerics_audit_spread")
_PART_HEADER = re.compile(
    r"numerics audit: (?:part (?P<part>\d{1,6}) of \d{1,6}: .{1,200}?|\d{1,6} blocks), "
    r"\d{1,18} tokens, "
    r"reference (?P<ref>[^,]{1,80}), \d{1,9}\.\d s\b")
_BEGUN = f"{audit_message.NAME} begun at step"
_VERDICT_REFERENCE = re.compile(r"; job [^,;]{1,40}, reference (?P<ref>[^;]{1,80});")
_FIRST_WRONG = re.compile(r"first wrong in the (?P<dir>forward|backward): "
                          r"(?P<seg>embedding|head|block [^\s:(),]{1,64})")
"""The segment only: a block's child named after it (``block 1, attention:``) is the report's."""
_REPORT_PART = re.compile(r"^\s{1,8}part (?P<part>\d{1,6}) of (?P<of>\d{1,6}) "
                          r"\(numerics_audit_spread\): (?P<what>.{1,200})")
_REPORT_LINES = 40
"""Lines after a flagged verdict line in which its report is looked for (ranks interleave)."""
_BEFORE_CHARS = 120
"""How far before a named value its neighbour is looked for (a step and separators)."""



def to_float(text: str) -> float:
    """Parse a number matched by the patterns above (``1,234``, ``-nan``, ``Infinity``)."""
    return float(text.replace(",", ""))


@dataclass(frozen=True)
class Crash:
    """A line that shows the process failing: a traceback, an OOM, a signal, a collective error."""

    line: int
    rank: int | None
    kind: str
    """What it is, for messages: ``Python traceback``, ``out of memory``, ..."""
    text: str
    """The marker line (shortened); for a traceback, its exception line once seen."""

    def to_dict(self) -> dict[str, Any]:
        """``{"line", "rank", "kind", "text"}``."""
        return {"line": self.line, "rank": self.rank, "kind": self.kind, "text": self.text}


# Markers of a process failing, each with the name messages use. A marker counts only when no
# training step follows it (TorchTitan logs some tracebacks and trains on: those are warnings).
_CRASH_KINDS: dict[str, tuple[str, str]] = {
    "traceback": ("Python traceback", r"Traceback \(most recent call last\):"),
    "child": ("torchrun child failure", r"\bChildFailedError\b"),
    "oom": ("out of memory", r"\b(?:CUDA|HIP) out of memory\b|\bOutOfMemoryError\b"),
    "segv": ("segmentation fault", r"Segmentation fault|\bSIGSEGV\b"),
    "abort": (
        "fatal error",
        r"Fatal Python error|terminate called after throwing|\(core dumped\)|\bSIGABRT\b",
    ),
    "killed": (
        "killed",
        r"^\s*Killed\s*$|^\S*: line \d+: +\d+ Killed\b|\bSignalException\b|\bSIGKILL\b",
    ),
    "collective": (
        "NCCL/RCCL error",
        r"\b[NR]CCL error\b|\b(?:nccl|rccl)(?:Internal|System|UnhandledCuda|InvalidUsage|"
        r"InvalidArgument|Remote)Error\b|\bDistBackendError\b|"
        r"Watchdog caught collective operation timeout",
    ),
    "gpu": (
        "GPU error",
        r"\b(?:CUDA|HIP) error\b|Memory access fault by GPU|\bhipError[A-Z]\w*|"
        r"illegal memory access",
    ),
}
_CRASH = re.compile("|".join(f"(?P<{key}>{rx})" for key, (_, rx) in _CRASH_KINDS.items()))
# The last line of a traceback: ``KeyError: ''``, ``torch.OutOfMemoryError: HIP out of ...``.
_EXCEPTION_LINE = re.compile(
    r"^\s*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure)\b(?::.*)?)$"
)
_EXCEPTION_LOOKAHEAD = 400
"""Lines after a traceback start within which its exception line is looked for."""
# The end of a finished run: TorchTitan's train() ("Training completed": rank 0 only on 0.2.2,
# train.py line 710; every rank on 0.3.0, trainer.py line 1073), its main() after a train()
# that returned ("Process group destroyed", every rank: 0.2.2 train.py line 777, 0.3.0 line
# 75), and Megatron-LM's pretrain().
_COMPLETED = re.compile(
    r"\bTraining completed\b|\bProcess group destroyed\b|\[after training is done\]")
_TEXT_MAX = 160

# Words without which a line can be neither a metric line nor a crash marker nor the end of
# training: the parser looks closer only at lines that hold one (each pattern above and
# below contains one of them; a test checks every crash sample).
_METRIC_HINTS: tuple[str, ...] = ("step:", "iteration", "memory (", "diverged at step")
_END_HINTS: tuple[str, ...] = (
    "rror", "Traceback", "of memory", "illegal memory", "Segmentation fault", "access fault",
    "Killed", "SIG", "Signal", "terminate called", "dumped", "Watchdog", "Training completed",
    "Process group destroyed", "after training is done",
)


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _TEXT_MAX else text[: _TEXT_MAX - 1] + "\u2026"


@dataclass
class ParsedLog:
    """What :func:`parse_text` found in one log."""

    source: str
    records: list[Record] = field(default_factory=list)
    memory_peaks_gib: list[float] = field(default_factory=list)
    """Megatron's ``memory (MB|GB)`` report lines (max reserved, else max allocated)."""
    truncated: list[int] = field(default_factory=list)
    """Line numbers of metric lines without any loss value (e.g. a truncated last line)."""
    lines: int = 0
    fmt: str = "auto"
    """The format asked for (``auto``: both)."""
    excluded: dict[str, int] = field(default_factory=dict)
    """Metric lines of a format that ``fmt`` left out, per format (to name it in messages)."""
    crash: Crash | None = None
    """The first crash marker after the last training step (None: none, or steps follow)."""
    completed_line: int | None = None
    """The last completion line after the last training step (None: none, or steps follow)."""
    binary: str | None = None
    """What the file's first bytes look like when not text (``binary data``); None: text."""
    skipped_bytes: int = 0
    """Bytes not read because a line ran past :data:`MAX_LINE_BYTES` without a line end."""
    cut_lines: list[int] = field(default_factory=list)
    """Line numbers of the lines cut so (their first and last bytes read)."""
    lean: bool = False
    """Keep finite training lines only in :attr:`curves`, so memory grows with steps, not lines."""
    figures: Figures | None = None
    """The throughput figures gathered while reading (:func:`parse_file` with ``warmup``)."""
    metric_lines: int = 0
    """Metric lines found in the asked-for format (kept or, when lean, counted only)."""
    trains_added: int = 0
    last_train_step: int | None = None
    curves: dict[int | None, Curve] = field(default_factory=dict)
    """Each rank's training curve (None: no rank prefix); the one source of the steps and ranks."""
    train_formats: set[str] = field(default_factory=set)
    audits_ok: int = 0
    """Audit verdict lines that say OK (one per audited step or part)."""
    audits_flagged: list[AuditMark] = field(default_factory=list)
    """Flagged audits (one per step) in log order, from whichever line showed the flag first."""
    audits_unread: list[AuditUnread] = field(default_factory=list)
    """Audit verdicts that could not be read (a cut or split line): never a pass."""
    ends_mid_line: bool = False
    """The log's last line has no line end (the writer stopped, or the file was cut, there)."""

    def add(self, record: Record) -> None:
        """Keep ``record`` if its format was asked for; else count it in :attr:`excluded`."""
        if not (self.fmt in ("auto", record.format) or record.format == GUARD_FORMAT):
            self.excluded[record.format] = self.excluded.get(record.format, 0) + 1
            return
        self.metric_lines += 1
        if self.figures is not None:
            self.figures.add(record)
        if record.kind == "train":
            self.trains_added += 1
            self.last_train_step = record.step
            self.train_formats.add(record.format)
            curve = self.curves.get(record.rank)
            if curve is None:
                curve = self.curves[record.rank] = Curve()
            curve.add(record.step, record.loss, record.grad_norm)
            if self.lean and record.finite:
                return
        self.records.append(record)

    def train_steps(self) -> set[int]:
        """The distinct training steps logged."""
        return {step for curve in self.curves.values() for step in curve.steps}

    @property
    def formats(self) -> list[str]:
        """The log formats of the metric lines found, sorted (guard messages not counted)."""
        found = {r.format for r in self.records
                 if r.format != GUARD_FORMAT and r.kind != "unreadable"}
        return sorted(found | ({TORCHTITAN, MEGATRON} & self.train_formats))

    @property
    def format(self) -> str | None:
        """``torchtitan``, ``megatron``, ``mixed`` or None when nothing was found."""
        formats = self.formats
        if not formats:
            return None
        return formats[0] if len(formats) == 1 else "mixed"

    @property
    def train_records(self) -> list[Record]:
        """The training-step records kept (a lean log keeps the non-finite ones only)."""
        return [r for r in self.records if r.kind == "train"]

    @property
    def ranks(self) -> list[int]:
        """The ranks named by the metric lines' prefixes, sorted."""
        return sorted({r.rank for r in self.records if r.rank is not None}
                      | {rank for rank in self.curves if rank is not None})


@dataclass
class Quarantine:
    """A segment the numerics audit's quarantine policy took out of compilation."""

    step: int
    segment: str
    """``block 3``, ``embedding`` or ``head``."""
    line: int
    cost: str | None = None
    """The cost line's ratio of step times after to before (``1.27``), once it is logged."""

    def to_dict(self) -> dict[str, Any]:
        """``{"step", "segment", "line", "cost_ratio"}``."""
        return json_form(self, "step segment line cost_ratio=cost")


@dataclass
class AuditMark:
    """An in-training numerics audit the log shows flagged, with what its lines say of it."""

    step: int
    line: int
    rank: int | None
    seen_in: str = "verdict line"
    """The first line that showed it."""
    reference: str | None = None
    """The report's reference (``float64``, ``float32 (TF32 GEMMs)``); None: not read."""
    wrong: list[tuple[str, str]] = field(default_factory=list)
    """Where it was first wrong, per direction: (``forward`` | ``backward``, segment)."""
    part: str | None = None
    """``part 2 of 4: block 1`` for a spread audit."""
    stop_line: int | None = None
    """The stop policy's exception (the run ended there)."""
    quarantine: Quarantine | None = None

    def to_dict(self) -> dict[str, Any]:
        """The mark as strict JSON."""
        return json_form(self, "step line rank seen_in reference wrong part stop_line "
                         "quarantine", wrong=[{"direction": d, "segment": g}
                                              for d, g in self.wrong])


@dataclass(frozen=True)
class AuditUnread:
    """An audit verdict that cannot be read (cut or split line, or a header with no verdict)."""

    line: int
    rank: int | None
    why: str
    """One clause for messages."""

    def to_dict(self) -> dict[str, Any]:
        """``{"line", "rank", "why"}``."""
        return json_form(self, "line rank why")


def _segments(line: str) -> Iterator[tuple[int | None, str]]:
    """Split a physical line at torchrun rank prefixes: two ranks can share one physical line."""
    matches = list(_RANK_PREFIX.finditer(line))
    if not matches:
        label = _SRUN_LABEL.match(line)
        if label:
            yield int(label.group(1)), line[label.end():]
        else:
            yield None, line
        return
    if matches[0].start() > 0:
        yield None, line[: matches[0].start()]
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        yield int(m.group(1)), line[m.end():end]


def _field(pattern: re.Pattern[str], text: str) -> float | None:
    m = pattern.search(text)
    return to_float(m.group("v")) if m else None


def _torchtitan(text: str, rank: int | None, line_no: int, log: ParsedLog) -> None:
    steps = list(_TT_STEP.finditer(text))
    for i, m in enumerate(steps):
        body = text[m.end(): steps[i + 1].start() if i + 1 < len(steps) else len(text)]
        loss_match = _TT_LOSS.match(body)
        if loss_match is None:
            # "step: N  loss:" cut short is a truncated metric line; "step: N" without the
            # loss right after it (some other message) is not a metric line at all.
            if re.match(rf"{_SEP}loss:", body) and log.fmt in ("auto", TORCHTITAN):
                log.truncated.append(line_no)
            continue
        loss = to_float(loss_match.group("v"))
        log.add(
            Record(
                format=TORCHTITAN,
                kind="validation" if m.group("validate") else "train",
                step=int(m.group("step")),
                rank=rank,
                line=line_no,
                losses=(("loss", loss),),
                grad_norm=_field(_TT_FIELDS["grad_norm"], body),
                tps=_field(_TT_FIELDS["tps"], body),
                tflops=_field(_TT_FIELDS["tflops"], body),
                mfu=_field(_TT_FIELDS["mfu"], body),
                memory_gib=_field(_TT_FIELDS["memory"], body),
            )
        )


def _guard(text: str, rank: int | None, line_no: int, log: ParsedLog) -> None:
    for m in GUARD_PATTERN.finditer(text):
        losses = (("loss", to_float(m.group("loss"))),) if m.group("loss") else ()
        # The rank that saw it first is named in the message (rank 0 prints it).
        named = m.group("rank") or m.group("seen")
        log.add(
            Record(
                format=GUARD_FORMAT, kind="guard", step=int(m.group("step")),
                rank=int(named) if named else rank, line=line_no, losses=losses,
                grad_norm=to_float(m.group("gn")) if m.group("gn") else None, guard_stop=True,
            )
        )


def _megatron_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in text.split("|"):
        name, sep, value = part.partition(":")
        if sep:
            fields.setdefault(" ".join(name.split()).lower(), value.strip())
    return fields


def _first_number(value: str | None) -> float | None:
    if value is None:
        return None
    m = _FIRST_NUM.search(value)
    return to_float(m.group("v")) if m else None


def _is_loss_name(name: str, validation: bool) -> bool:
    if validation:
        return name.endswith("loss value") or name.endswith("loss")
    return name.endswith("loss")  # excludes "loss scale"


def _megatron_record(
    fields: dict[str, str], step: int, rank: int | None, line_no: int, kind: str
) -> Record | None:
    losses: list[tuple[str, float]] = []
    for name, value in fields.items():
        if _is_loss_name(name, kind == "validation"):
            number = _first_number(value)
            if number is not None:
                losses.append((name, number))
    losses.sort(key=lambda item: not item[0].startswith("lm loss"))  # main loss first
    grad_norm = _first_number(fields.get("grad norm"))
    if not losses and grad_norm is None:
        return None
    tflops = tps = None
    for name, value in fields.items():
        if "tflop/s/gpu" in name and tflops is None:
            tflops = _first_number(value)
        elif ("tokens" in name or "tok/s" in name) and ("/s" in name or "per second" in name):
            tps = tps if tps is not None else _first_number(value)
    nan_iterations = _first_number(fields.get("number of nan iterations"))
    return Record(
        format=MEGATRON,
        kind=kind,
        step=step,
        rank=rank,
        line=line_no,
        losses=tuple(losses),
        grad_norm=grad_norm,
        tps=tps,
        tflops=tflops,
        iteration_ms=_first_number(fields.get("elapsed time per iteration (ms)")),
        nan_iterations=(
            int(nan_iterations)
            if nan_iterations is not None and math.isfinite(nan_iterations)
            else None
        ),
    )


def _megatron(text: str, rank: int | None, line_no: int, log: ParsedLog) -> None:
    for pattern, kind in ((_MG_ITERATION, "train"), (_MG_VALIDATION, "validation")):
        for m in pattern.finditer(text):
            record = _megatron_record(
                _megatron_fields(text[m.end():]), int(m.group("step")), rank, line_no, kind
            )
            if record is not None:
                log.add(record)
            elif log.fmt in ("auto", MEGATRON):
                log.truncated.append(line_no)
    memory = _MG_MEMORY.search(text)
    if memory and log.fmt in ("auto", MEGATRON):
        fields = _megatron_fields(text[memory.end():])
        peak = _first_number(fields.get("max reserved") or fields.get("max allocated"))
        if peak is not None:
            log.memory_peaks_gib.append(peak / 1024 if memory.group("unit") == "MB" else peak)


class _Parser:
    """Feeds physical lines to the metric parsers and follows how the log ends."""

    def __init__(self, fmt: str, source: str, lean: bool = False) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"log format {fmt!r} is not valid; accepted: {', '.join(FORMATS)}")
        self.log = ParsedLog(source=source, fmt=fmt, lean=lean)
        self._crash_line = 0  # where the current traceback started (its exception line follows)
        # Per rank: the audit part headers whose verdict line has not come yet (several
        # where ranks print without a prefix: each rank's header, then each rank's verdict),
        # whether the last audit line was a header, and the last flagged verdict (its
        # report's "first wrong in the" lines follow it).
        # A header without a part number ("numerics audit: 4 blocks, ...") is logged by
        # audits outside training too (titan-rocm audit, the audit matrix), which print no
        # verdict line into the log: it is kept apart and claims a verdict only where the
        # log stops mid-line right after it.
        self._audit_pending: dict[int | None, list[tuple[int, str, int | None]]] = {}
        self._audit_loose: dict[int | None, tuple[int, str, int | None]] = {}
        self._after_header: dict[int | None, bool] = {}
        self._audit_report: dict[int | None, AuditMark] = {}
        # Reports whose verdict line was lost, by rank and part number: an end-of-audit line
        # that names a flagged step takes its part's report from here.
        self._orphans: list[tuple[int | None, int | None, AuditMark]] = []

    def feed(self, chunk: str) -> None:
        """One or more whole lines (line ends optional)."""
        if "\x00" in chunk:  # copytruncate's NUL head (and stray NULs) carry no text
            chunk = chunk.replace("\x00", "")
        if "\x1b" in chunk:
            chunk = _ANSI.sub("", chunk)
        log = self.log
        first = log.lines + 1
        lines = chunk.splitlines()
        log.lines += len(lines)
        # 1. Metric lines. Only the hints this chunk holds are tested line by line.
        hints = [h for h in _METRIC_HINTS if h in chunk]
        named = _NAMED_VALUE.search(chunk) is not None
        last_train = -1
        for i, line in enumerate(lines):
            count, trains = len(log.records), log.trains_added
            if hints and any(h in line for h in hints):
                self._metrics(first + i, line)
                if log.trains_added > trains:
                    last_train = i
            if named:
                self._unreadable(first + i, line, log.records[count:])
        if any(h in chunk for h in _AUDIT_HINTS):
            for i, line in enumerate(lines):
                if any(h in line for h in _AUDIT_HINTS):
                    self._audit_line(first + i, line)
        if chunk:
            log.ends_mid_line = not chunk.endswith(("\n", "\r"))
        # 2. How the log ends: only lines after the chunk's last training step can hold it
        # (a crash marker followed by a step was a warning the run survived).
        if last_train >= 0:
            log.crash, log.completed_line, self._crash_line = None, None, 0
        for i in range(last_train + 1, len(lines)):
            line = lines[i]
            if self._crash_line or any(h in line for h in _END_HINTS):
                self._end_line(first + i, line)

    def _metrics(self, line_no: int, line: str) -> None:
        log = self.log
        for rank, segment in _segments(line):
            if "diverged at step" in segment:
                _guard(segment, rank, line_no, log)
            _torchtitan(segment, rank, line_no, log)
            _megatron(segment, rank, line_no, log)

    def _unreadable(self, line_no: int, line: str, found: list[Record]) -> None:
        """A named value that cannot be read becomes an ``unreadable`` record (counted as NaN),
        never dropped."""
        if self.log.fmt not in ("auto", TORCHTITAN, MEGATRON):
            return
        for rank, segment in _segments(line):
            for m in _NAMED_VALUE.finditer(segment):
                raw = m.group("v")
                if not raw:
                    continue  # "loss:" at the end of a cut line: a truncated line
                if _READABLE.fullmatch(raw) and math.isfinite(to_float(raw.rstrip(",;"))):
                    continue
                if not _anchored(segment, m):
                    continue  # not on a metric line: some other message naming a loss
                name = " ".join(m.group("name").lower().split())
                name = "grad_norm" if name == "grad norm" else name
                if any(not math.isfinite(r.checked_values().get(name, 0.0)) for r in found):
                    continue  # read already, as the non-finite value it is
                step = _TT_STEP.search(segment) or _MG_ITERATION.search(segment)
                at = int(step.group("step")) if step else (self.log.last_train_step or 0)
                nan, is_grad = float("nan"), name == "grad_norm"
                self.log.metric_lines += 1
                self.log.records.append(Record(
                    format=TORCHTITAN, kind="unreadable", step=at, rank=rank, line=line_no,
                    losses=() if is_grad else ((name, nan),),
                    grad_norm=nan if is_grad else None, raw=raw[:_TEXT_MAX]))

    def _audit_line(self, line_no: int, line: str) -> None:
        """Follow the in-training numerics audit (wordings: :mod:`titan_rocm.audit_message`); a cut
        verdict, or a header with none after it, is unreadable, never a pass."""
        for rank, segment in _segments(line):
            self._audit_segment(line_no, rank, segment)

    def _audit_segment(self, line_no: int, rank: int | None, segment: str) -> None:
        log = self.log
        report = self._audit_report.get(rank)
        wrong = _FIRST_WRONG.search(segment)
        if "numerics audit" not in segment:
            if self._after_header.get(rank) and (wrong or _REPORT_PART.search(segment)):
                header = self._waiting(rank)[0]
                self._lost(rank, header, f"the verdict line after the audit part's header at "
                           f"line {header} is missing: its report follows at line {line_no} "
                           "(the verdict line was cut or split by other output)")
                report = self._audit_report.get(rank)
            if report is None or line_no - report.line > _REPORT_LINES:
                return
            if wrong and all(d != wrong.group("dir") for d, _ in report.wrong):
                report.wrong.append((wrong.group("dir"), wrong.group("seg")))
            part = _REPORT_PART.search(segment)
            if part and report.part is None:
                report.part = f"part {part.group('part')} of {part.group('of')}: " \
                    f"{part.group('what').strip()}"
            return
        header = _PART_HEADER.search(segment)
        self._after_header[rank] = header is not None
        if header:
            part = header.group("part")
            entry = (line_no, header.group("ref"), int(part) if part else None)
            if part:
                self._audit_pending.setdefault(rank, []).append(entry)
            else:
                self._audit_loose[rank] = entry
            return
        stop = audit_message.STOP.search(segment)
        if stop:
            mark = self._flagged(int(stop.group("step")), line_no, rank, "stop")
            mark.stop_line = mark.stop_line or line_no
            if wrong and not mark.wrong:
                mark.wrong.append((wrong.group("dir"), wrong.group("seg")))
            return
        quarantined = audit_message.QUARANTINED.search(segment)
        if quarantined:
            step, seg = int(quarantined.group("step")), quarantined.group("segment")
            mark = self._flagged(step, line_no, rank, "quarantine line")
            if mark.quarantine is None:
                mark.quarantine = Quarantine(step, seg, line_no)
            if wrong and not mark.wrong:  # its "why" is the flag's first line
                mark.wrong.append((wrong.group("dir"), wrong.group("seg")))
            return
        cost = audit_message.QUARANTINE_COST.search(segment)
        if cost:
            for mark in reversed(log.audits_flagged):
                if mark.quarantine and mark.quarantine.segment == cost.group("segment"):
                    mark.quarantine.cost = cost.group("ratio")
                    break
            return
        verdict = audit_message.VERDICT.search(segment)
        if verdict:
            pending = self._answer(rank)
            if verdict.group("verdict") == "OK":
                log.audits_ok += 1
                self._audit_report.pop(rank, None)
                return
            mark = self._flagged(int(verdict.group("step")), line_no, rank, "verdict line")
            reference = _VERDICT_REFERENCE.search(segment, verdict.end())
            mark.reference = mark.reference or (
                reference.group("ref") if reference else pending[1] if pending else None)
            self._audit_report[rank] = mark
            return
        complete = audit_message.COMPLETE.search(segment)
        if complete:
            said = complete.group("said").rstrip()
            whole = audit_message.COMPLETE_SAID.fullmatch(said)
            flagged = whole.group("flagged") if whole else None
            if whole is None:
                cut = re.match(r"flagged at step\(s\) (\d{1,18})", said)
                flagged = cut.group(0) if cut else None
                if flagged is None:
                    log.audits_unread.append(AuditUnread(
                        line_no, rank, f"the end-of-audit line is cut or split: "
                        f"{_shorten(segment[complete.start():])!r}"))
            begun = int(complete.group("begun"))
            for step in re.findall(r"\d{1,18}", flagged or ""):
                mark = self._flagged(int(step), line_no, rank, "end-of-audit line")
                orphan = next((o for r, part, o in self._orphans
                               if r == rank and part == int(step) - begun + 1), None)
                if mark.seen_in == "end-of-audit line" and orphan is not None:
                    mark.reference, mark.wrong = orphan.reference, orphan.wrong
                    mark.part = orphan.part
            self._orphans = [o for o in self._orphans if o[0] != rank]
            return
        begun = segment.find(_BEGUN)
        if begun >= 0:
            log.audits_unread.append(AuditUnread(
                line_no, rank, "the end-of-audit line is cut or split: "
                f"{_shorten(segment[begun:])!r}"))
            return
        at = audit_message.AT_STEP.search(segment)
        if at and not audit_message.AT_STEP_OUTCOME.match(at.group("rest")):
            self._lost(rank, line_no, f"the verdict line of step {at.group('step')} is cut or "
                       f"split by other output: {_shorten(segment[at.start():])!r}")
            return
        if at:  # a skip: the part's outcome, with nothing to judge
            self._answer(rank)

    def _waiting(self, rank: int | None) -> tuple[int, str, int | None]:
        """The header of ``rank`` just logged (a report follows it with no verdict)."""
        pending = self._audit_pending.get(rank)
        return pending[-1] if pending else self._audit_loose[rank]

    def _answer(self, rank: int | None) -> tuple[int, str, int | None] | None:
        """The oldest part header of ``rank`` still waiting for its verdict, now answered."""
        pending = self._audit_pending.get(rank)
        loose = self._audit_loose.pop(rank, None)
        return pending.pop(0) if pending else loose

    def _lost(self, rank: int | None, line_no: int, why: str) -> None:
        """An unreadable verdict of ``rank``; its report lines wait for an end-of-audit line."""
        pending = self._answer(rank)
        self._after_header[rank] = False
        self.log.audits_unread.append(AuditUnread(line_no, rank, why))
        orphan = AuditMark(0, line_no, rank, reference=pending[1] if pending else None)
        self._orphans.append((rank, pending[2] if pending else None, orphan))
        self._audit_report[rank] = orphan

    def finish(self) -> None:
        """The end of the log: a part header still waiting has lost its verdict."""
        waiting = [(rank, entry) for rank, pending in self._audit_pending.items()
                   for entry in pending]
        if self.log.ends_mid_line:
            waiting += [(rank, entry) for rank, entry in self._audit_loose.items()
                        if self._after_header.get(rank)]
        for rank, (line_no, _, _) in sorted(waiting, key=lambda w: w[1][0]):
            self.log.audits_unread.append(AuditUnread(
                line_no, rank, f"the audit's header at line {line_no} has no verdict line "
                "after it (lost, cut or split by other output)"))

    def _flagged(self, step: int, line_no: int, rank: int | None, seen_in: str) -> AuditMark:
        for mark in self.log.audits_flagged:
            if mark.step == step:
                return mark
        mark = AuditMark(step, line_no, rank, seen_in)
        self.log.audits_flagged.append(mark)
        return mark

    def _end_line(self, line_no: int, line: str) -> None:
        if self._crash_line and line_no - self._crash_line > _EXCEPTION_LOOKAHEAD:
            self._crash_line = 0  # no exception line came: the marker line stays the text
        for rank, segment in _segments(line):
            self._ending(segment, rank, line_no)

    def _ending(self, segment: str, rank: int | None, line_no: int) -> None:
        log = self.log
        if _COMPLETED.search(segment):
            log.completed_line = line_no
        if log.crash is not None and self._crash_line:
            exception = _EXCEPTION_LINE.match(segment)
            if exception and line_no > self._crash_line:
                log.crash = Crash(log.crash.line, log.crash.rank, log.crash.kind,
                                  _shorten(exception.group(1)))
                self._crash_line = 0
            return
        if log.crash is not None:
            return  # the first marker after the last step is the cause; the rest follow it
        m = _CRASH.search(segment)
        if m and m.lastgroup:
            kind = _CRASH_KINDS[m.lastgroup][0]
            log.crash = Crash(line_no, rank, kind, _shorten(segment))
            self._crash_line = line_no if m.lastgroup == "traceback" else 0


def _anchored(segment: str, m: re.Match[str]) -> bool:
    """Whether ``m`` stands where a metric line puts that value, so an audit report's ``loss:`` is
    never a metric."""
    name = m.group("name").lower()
    if name in _TT_BEFORE:
        before = segment[max(0, m.start() - _BEFORE_CHARS):m.start()]
        if _TT_BEFORE[name].search(before) or _TT_AFTER[name].match(segment, m.end()):
            return True
    return any(p.search(segment, 0, m.start()) for p in (_MG_ITERATION, _MG_VALIDATION))


def parse_lines(chunks: Iterable[str], fmt: str = "auto", source: str = "<text>") -> ParsedLog:
    """Every metric line in ``chunks`` (pieces that end at line ends); never raises on any text,
    only ValueError for an unknown ``fmt``."""
    parser = _Parser(fmt, source)
    for chunk in chunks:
        parser.feed(chunk)
    parser.finish()
    return parser.log


def parse_text(text: str, fmt: str = "auto", source: str = "<text>") -> ParsedLog:
    """:func:`parse_lines` of one string."""
    return parse_lines((text,), fmt, source)


class UnreadableLog(Exception):
    """A log path that cannot be read as a file: ``str()`` is one sentence for the user."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        """Why, without the path: ``No such file or directory``."""
        super().__init__(f"cannot read {self.path}: {reason}.")


_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip-compressed data (decompress it first, e.g. with zcat)"),
    (b"BZh", "bzip2-compressed data (decompress it first, e.g. with bzcat)"),
    (b"\xfd7zXZ\x00", "xz-compressed data (decompress it first, e.g. with xzcat)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data (decompress it first, e.g. with zstdcat)"),
    (b"PK\x03\x04", "a zip archive (extract the log first)"),
    (b"\x7fELF", "an executable (ELF), not a log"),
)


def sniff_binary(head: bytes) -> str | None:
    """What ``head`` is when it is not text, else None (over 10 % NUL, control or undecodable
    bytes)."""
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return what
    if not head:
        return None
    text = head.decode("utf-8", errors="replace")
    odd = sum(1 for c in text if c == "\ufffd" or (c < " " and c not in "\t\n\r\x0b\x0c\x1b"))
    return "binary data, not text" if odd > len(text) / 10 else None


def _open_regular(path: str | Path) -> int:
    """An fd of a regular file only: opening a FIFO would block."""
    name = str(path)
    try:
        return open_regular(name)
    except NotRegularFileError as exc:
        raise UnreadableLog(
            name, f"it is {exc.kind}; titan-rocm reads regular log files only "
            "(copy a stream to a file first)"
        ) from None
    except OSError as exc:
        raise UnreadableLog(name, str(exc.strerror or exc)) from exc


_BLOCK_BYTES = 1 << 18


def _cut(data: bytes) -> int:
    """Where ``data`` may be cut between lines (a trailing CR may be half of a CRLF: it waits)."""
    return max(data.rfind(b"\n"), data.rfind(b"\r", 0, len(data) - 1)) + 1


def _first_end(data: bytes) -> int:
    """Just after the first line end in ``data``; 0: none; -1: only a trailing CR (undecided)."""
    n, r = data.find(b"\n"), data.find(b"\r")
    if r != -1 and (n == -1 or r < n):
        if r + 1 == len(data):
            return -1
        return r + 2 if data[r + 1] == 0x0A else r + 1
    return n + 1


class _LongLine:
    """A line past :data:`MAX_LINE_BYTES`: its head, its tail so far, and the bytes skipped."""

    def __init__(self, head: bytes, rest: bytes) -> None:
        self.head = head
        self.tail = bytearray()
        self.after_head = 0
        self.cr_last = False  # the bytes so far end in a "\r" that may end the line
        self.extend(rest)

    def extend(self, data: bytes) -> None:
        self.after_head += len(data)
        self.tail += data
        if len(self.tail) > TAIL_BYTES:
            del self.tail[: len(self.tail) - TAIL_BYTES]
        self.cr_last = self.tail.endswith(b"\r")

    def text(self) -> tuple[str, int]:
        """The line as read and the bytes skipped; the mark between head and tail keeps the head's
        last field from reading as the tail's neighbour."""
        skipped = self.after_head - len(self.tail)
        tail = bytes(self.tail)
        while tail[:1] and 0x80 <= tail[0] < 0xC0:  # a UTF-8 sequence cut at its start
            tail = tail[1:]
        mark = f" [titan-rocm: {skipped} bytes not read] " if skipped else ""
        return (self.head.decode("utf-8", errors="replace") + mark
                + tail.decode("utf-8", errors="replace")), skipped


def _blocks(handle: Any, name: str, log: ParsedLog | None = None) -> Iterator[str]:
    """The file in line-end-aligned blocks of about 256 KiB; cutting at line ends keeps decoding
    identical to whole-file decoding."""
    carry = b""
    long: _LongLine | None = None
    try:
        while data := handle.read(_BLOCK_BYTES):
            if b"\x00" in data:
                data = data.replace(b"\x00", b"")
                if not data:  # a block of NULs only: it says nothing about a pending "\r"
                    continue
            if long is not None:
                end = 0 if long.cr_last and data[:1] != b"\n" else _first_end(data)
                if end <= 0 and not long.cr_last:
                    long.extend(data)  # the line goes on
                    continue
                long.extend(data[:max(end, 0)])
                yield from _end_long(long, log)
                long, data = None, data[max(end, 0):]
            data = carry + data
            end = _cut(data)
            carry = data[end:]
            if end:
                yield data[:end].decode("utf-8", errors="replace")
            # A "\r" at the end of carry may end its line: it is no part of the line's length.
            if len(carry) - carry.endswith(b"\r") >= MAX_LINE_BYTES:
                long = _LongLine(carry[:MAX_LINE_BYTES], carry[MAX_LINE_BYTES:])
                carry = b""
        if long is not None:
            yield from _end_long(long, log)
        elif carry:
            yield carry.decode("utf-8", errors="replace")
    except OSError as exc:
        raise UnreadableLog(name, str(exc.strerror or exc)) from exc


def _end_long(long: _LongLine, log: ParsedLog | None) -> Iterator[str]:
    text, skipped = long.text()
    yield text
    if log is not None and skipped:  # the consumer has read the line: log.lines is its number
        log.skipped_bytes += skipped
        log.cut_lines.append(log.lines)


def parse_file(path: str | Path, fmt: str = "auto", lean: bool = False,
               warmup: int | None = None) -> ParsedLog:
    """:func:`parse_lines` of a file, streamed; undecodable bytes become U+FFFD. ``warmup`` gathers
    :attr:`ParsedLog.figures` while reading (a lean log has no other source).

    Raises UnreadableLog for a missing, irregular or unreadable path, ValueError for a bad ``fmt``.
    """
    parser = _Parser(fmt, str(path), lean)
    if warmup is not None:
        parser.log.figures = Figures(warmup)
    with os.fdopen(_open_regular(path), "rb", buffering=1 << 16) as handle:
        try:
            parser.log.binary = sniff_binary(handle.peek(1 << 16)[: 1 << 16])
        except OSError as exc:
            raise UnreadableLog(path, str(exc.strerror or exc)) from exc
        for block in _blocks(handle, str(path), parser.log):
            parser.feed(block)
    parser.finish()
    return parser.log
