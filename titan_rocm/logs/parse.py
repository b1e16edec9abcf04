"""Find training-metric lines of TorchTitan and Megatron-LM inside real, messy logs.

TorchTitan 0.2.2 (``MetricsProcessor.log``) prints, on log steps only::

    step: 12  loss:  7.12345  grad_norm:  1.2345  memory: 12.34GiB(8.80%)  tps: 1,234
    tflops: 56.78  mfu: 5.74%

(one line, coloured with ANSI codes unless ``[metrics] disable_color_printing``) and, for
validation, ``validate step: 10  loss:  7.1234  memory: ...  tps: ...``.

Megatron-LM (``training_log``) prints one ``|``-separated line per log interval::

     [2025-01-01 12:00:00] iteration       12/     100 | consumed samples: 384 |
     elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 456.7 |
     learning rate: 1.000000E-04 | global batch size: 32 | lm loss: 7.123456E+00 |
     loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations: 0 |
     number of nan iterations: 0 |

and ``validation loss at iteration 100 ... | lm loss value: 7.1E+00 | lm loss PPL: ...``.

Real logs wrap these in noise: ANSI colour codes, ``[rank0]:`` / ``[default0]:`` prefixes
from torchrun (or ``0: `` from ``srun --label``), logging timestamps, lines of several
ranks interleaved (even two ranks' output on one physical line), Windows line ends, a
truncated last line, and values such as ``nan``, ``NaN``, ``-nan``, ``inf``, ``-inf``,
``Infinity`` or ``1.0E+01`` followed by ``|`` or ``,``. :func:`parse_text` handles all of
these and never raises on any text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from titan_rocm.guard_message import NUMBER, fmt_value
from titan_rocm.guard_message import PATTERN as GUARD_PATTERN

FORMATS: tuple[str, ...] = ("auto", "torchtitan", "megatron")
TORCHTITAN = "torchtitan"
MEGATRON = "megatron"
GUARD_FORMAT = "titan-rocm"

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
_TT_FIELDS: dict[str, re.Pattern[str]] = {
    "loss": re.compile(rf"\bloss:\s*(?P<v>{_NUM})(?![\w.])", re.IGNORECASE),
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


def to_float(text: str) -> float:
    """Parse a number matched by the patterns above (``1,234``, ``-nan``, ``Infinity``)."""
    return float(text.replace(",", ""))


def json_value(value: float | None) -> float | str | None:
    """A metric value for strict JSON: non-finite values become the strings nan/inf/-inf."""
    if value is None or math.isfinite(value):
        return value
    return fmt_value(value)


@dataclass(frozen=True)
class Record:
    """One metric line: a training (or validation) step of one rank."""

    format: str
    """``torchtitan`` or ``megatron``."""
    kind: str
    """``train``, ``validation`` or ``guard`` (the runtime guard's stop message)."""
    step: int
    rank: int | None
    """From a ``[rankN]:`` / ``[defaultN]:`` / ``N: `` prefix; None when the log shows none."""
    line: int
    """1-based line number in the source."""
    losses: tuple[tuple[str, float], ...]
    """Every loss the line logs, main loss first (TorchTitan: ``loss``; Megatron: ``lm loss``,
    then e.g. ``load_balancing_loss``)."""
    grad_norm: float | None = None
    tps: float | None = None
    """Tokens per second per device."""
    tflops: float | None = None
    """TFLOP/s per device."""
    mfu: float | None = None
    """Percent."""
    memory_gib: float | None = None
    """TorchTitan: peak reserved memory since the previous log line."""
    iteration_ms: float | None = None
    """Megatron: elapsed time per iteration."""
    nan_iterations: int | None = None
    """Megatron: ``number of nan iterations`` in the interval."""
    guard_stop: bool = False
    """A ``titan-rocm divergence guard: training diverged at step N`` message (kind
    ``guard``): the run was stopped for a non-finite value, logged or not."""

    @property
    def loss(self) -> float | None:
        """The main loss."""
        return self.losses[0][1] if self.losses else None

    def checked_values(self) -> dict[str, float]:
        """The values that must be finite: every loss and the grad norm."""
        values = dict(self.losses)
        if self.grad_norm is not None:
            values["grad_norm"] = self.grad_norm
        return values

    def bad_values(self) -> dict[str, float]:
        """The non-finite checked values, plus Megatron's nan-iteration count when non-zero."""
        bad = {k: v for k, v in self.checked_values().items() if not math.isfinite(v)}
        if self.nan_iterations:
            bad["number of nan iterations"] = float(self.nan_iterations)
        if self.guard_stop:
            bad["divergence guard stop"] = float("nan")
        return bad

    @property
    def finite(self) -> bool:
        """Every loss and grad norm is finite (and Megatron counted no nan iteration)."""
        return not self.bad_values()


@dataclass
class ParsedLog:
    """What :func:`parse_text` found in one log."""

    source: str
    records: list[Record] = field(default_factory=list)
    memory_peaks_gib: list[float] = field(default_factory=list)
    """Megatron's ``memory (MB|GB)`` report lines (max reserved, else max allocated)."""
    incomplete: list[int] = field(default_factory=list)
    """Line numbers of metric lines without any loss value (e.g. a truncated last line)."""
    lines: int = 0

    @property
    def formats(self) -> list[str]:
        """The log formats of the metric lines found, sorted (guard messages not counted)."""
        return sorted({r.format for r in self.records if r.format != GUARD_FORMAT})

    @property
    def format(self) -> str | None:
        """``torchtitan``, ``megatron``, ``mixed`` or None when nothing was found."""
        formats = self.formats
        if not formats:
            return None
        return formats[0] if len(formats) == 1 else "mixed"

    @property
    def train_records(self) -> list[Record]:
        """The training-step records."""
        return [r for r in self.records if r.kind == "train"]

    @property
    def ranks(self) -> list[int]:
        """The ranks named by the records' prefixes, sorted."""
        return sorted({r.rank for r in self.records if r.rank is not None})


def _segments(line: str) -> Iterator[tuple[int | None, str]]:
    """Split a physical line at torchrun rank prefixes: (rank, text) pieces.

    Two ranks writing to one stream without a newline between them produce one physical
    line with two prefixes; each piece keeps its own rank.
    """
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
        loss = _field(_TT_FIELDS["loss"], body)
        if loss is None:
            # "step: N  loss:" cut short is a truncated metric line; "step: N" alone in some
            # other message is not a metric line at all.
            if re.match(r"\s*loss:", body):
                log.incomplete.append(line_no)
            continue
        log.records.append(
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
        log.records.append(
            Record(
                format=GUARD_FORMAT, kind="guard", step=int(m.group("step")),
                rank=int(named) if named else rank, line=line_no, losses=losses,
                grad_norm=to_float(m.group("gn")) if m.group("gn") else None, guard_stop=True,
            )
        )


def _megatron_fields(text: str) -> dict[str, str]:
    """``name: value`` pairs of a ``|``-separated Megatron line, names lower-cased."""
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
            if record is None:
                log.incomplete.append(line_no)
            else:
                log.records.append(record)
    memory = _MG_MEMORY.search(text)
    if memory:
        fields = _megatron_fields(text[memory.end():])
        peak = _first_number(fields.get("max reserved") or fields.get("max allocated"))
        if peak is not None:
            log.memory_peaks_gib.append(peak / 1024 if memory.group("unit") == "MB" else peak)


def parse_text(text: str, fmt: str = "auto", source: str = "<text>") -> ParsedLog:
    """Every metric line of ``text`` in format ``fmt`` (auto: both formats).

    Never raises on any text.

    Raises:
        ValueError: ``fmt`` is not one of :data:`FORMATS` (a programming error, not bad text).
    """
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not valid; accepted: {', '.join(FORMATS)}")
    log = ParsedLog(source=source)
    lines = _ANSI.sub("", text).splitlines()
    log.lines = len(lines)
    for line_no, line in enumerate(lines, start=1):
        if (
            "step:" not in line and "iteration" not in line and "memory (" not in line
            and "diverged at step" not in line
        ):
            continue  # fast path: most lines of a log are not metric lines
        for rank, segment in _segments(line):
            if "diverged at step" in segment:
                _guard(segment, rank, line_no, log)
            if fmt in ("auto", TORCHTITAN):
                _torchtitan(segment, rank, line_no, log)
            if fmt in ("auto", MEGATRON):
                _megatron(segment, rank, line_no, log)
    return log


def read_log(path: str | Path) -> str:
    """The text of a log file; undecodable bytes become U+FFFD instead of failing.

    Raises:
        OSError: the file cannot be read (missing, a directory, no permission).
    """
    return Path(path).read_bytes().decode("utf-8", errors="replace")


def parse_file(path: str | Path, fmt: str = "auto") -> ParsedLog:
    """:func:`parse_text` of a file (``-`` is not special).

    Raises:
        OSError: the file cannot be read.
    """
    return parse_text(read_log(path), fmt, source=str(path))
