"""Read an aiter tuned-GEMM CSV table as bytes, one record per CSV row, losslessly, streaming:
a filtered table is the original minus whole lines, and memory stays flat."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from titan_rocm.files import NotRegularFileError, open_regular

REQUIRED_COLUMNS: tuple[str, ...] = ("cu_num", "libtype", "solidx", "kernelName")

OPTIONAL_ARCH_COLUMN = "gfx"
"""Current aiter tables have it; older ones only ``cu_num``."""

DECIDING_COLUMNS: tuple[str, ...] = (*REQUIRED_COLUMNS, OPTIONAL_ARCH_COLUMN, "splitK")

MAX_RECORD_BYTES = 1 << 20
"""aiter's rows are about 200 bytes, so a longer record is an unclosed quote or not a table."""

CHUNK_BYTES = 1 << 16

_BOM = b"\xef\xbb\xbf"


class GemmTableError(ValueError):
    """Not a tuned GEMM table this tool can process; the message says why."""

@dataclass(frozen=True)
class TableLine:
    """One CSV record: its original bytes and, for data rows, its parsed fields."""

    line: int
    raw: bytes
    fields: dict[str, str] | None
    """``None`` for a blank line (aiter's pandas reader skips those)."""


def physical_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Lines with their endings; an endless piece stops at :data:`MAX_RECORD_BYTES` to be refused.
    """
    pending = b""
    for chunk in chunks:
        pending += chunk
        lines = pending.splitlines(keepends=True)
        # The last piece may continue in the next chunk (no ending yet, or a "\r" whose "\n"
        # is still to come).
        last = lines.pop() if lines else b""
        if last.endswith(b"\n"):
            lines.append(last)
            last = b""
        yield from lines
        if len(last) > MAX_RECORD_BYTES:
            yield last
            last = b""
        pending = last
    if pending:
        yield pending


def iter_records(lines: Iterable[bytes], where: str = "line ") -> Iterator[tuple[int, bytes]]:
    """Join physical ``lines`` into CSV records (a quoted field may hold a line break);
    GemmTableError for an unclosed quote or an oversized record."""
    pending: list[bytes] = []
    size = start = quotes = 0
    number = 0
    for number, line in enumerate(lines, start=1):
        if not pending:
            start = number
        pending.append(line)
        size += len(line)
        quotes += line.count(b'"')
        if size > MAX_RECORD_BYTES:
            raise GemmTableError(
                f"{where}{start}: a record longer than {MAX_RECORD_BYTES} bytes (a quoted field "
                "never closed, or not a tuned GEMM table); aiter's rows are about 200 bytes"
            )
        if quotes % 2 == 0:
            yield start, b"".join(pending)
            pending, size, quotes = [], 0, 0
    if pending:
        raise GemmTableError(
            f"{where}{start}: a quoted field is never closed before the end of file"
        )


def split_records(data: bytes, where: str = "line ") -> list[tuple[int, bytes]]:
    """All records of ``data`` (see :func:`iter_records`)."""
    return list(iter_records(physical_lines([data]), where))


def _parse(text: str, where: str) -> list[str]:
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    except csv.Error as exc:
        raise GemmTableError(f"{where}: not valid CSV ({exc})") from None
    if len(rows) > 1:
        raise GemmTableError(f"{where}: one record parses as {len(rows)} CSV rows")
    return rows[0] if rows else []


def _chunks(handle: BinaryIO, path: Path) -> Iterator[bytes]:
    while True:
        try:
            chunk = handle.read(CHUNK_BYTES)
        except OSError as exc:
            raise GemmTableError(f"{path}: cannot read ({exc.strerror or exc})") from None
        if not chunk:
            return
        yield chunk


def repeated_column(columns: tuple[str, ...]) -> str | None:
    """Why the header cannot be judged when it names a deciding column twice; else None.

    aiter's ``pandas.read_csv`` renames repeats (``solidx.1``), so which value aiter uses is
    unknowable here; either guess could pass an unsafe row."""
    for name in DECIDING_COLUMNS:
        places = [str(i) for i, column in enumerate(columns, start=1) if column == name]
        if len(places) > 1:
            times = "twice" if len(places) == 2 else f"{len(places)} times"
            where = f"{', '.join(places[:-1])} and {places[-1]}"
            return (f"the header names column {name!r} {times} (columns {where}): aiter's "
                    f"pandas reader uses the first spelt exactly {name!r} and renames the "
                    f"next {name + '.1'!r}, so which one decides is not certain; keep one "
                    f"{name!r} column")
    return None


class Table:
    """An open tuned GEMM table: header, then records read once, one at a time (``with``)."""

    def __init__(self, path: Path, handle: BinaryIO) -> None:
        self.path = path
        self._handle = handle
        self._records = iter_records(physical_lines(_chunks(handle, path)), f"{path}:")
        first = next(self._records, None)
        if first is None:
            raise GemmTableError(f"{path}: empty file, expected a CSV header line")
        header_line, header_raw = first
        try:
            header_text = header_raw.removeprefix(_BOM).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GemmTableError(f"{path}:{header_line}: not UTF-8 text ({exc})") from None
        self.header = TableLine(header_line, header_raw, None)
        self.columns = tuple(c.strip() for c in _parse(header_text, f"{path}:{header_line}"))
        repeated = repeated_column(self.columns)
        if repeated is not None:
            raise GemmTableError(f"{path}:{header_line}: {repeated}")
        missing = [c for c in REQUIRED_COLUMNS if c not in self.columns]
        if missing:
            raise GemmTableError(
                f"{path}: not an aiter tuned BF16 GEMM table: missing column(s) "
                f"{', '.join(missing)}; a table needs {', '.join(REQUIRED_COLUMNS)} "
                f"(and optionally {OPTIONAL_ARCH_COLUMN}); its header has: "
                f"{', '.join(self.columns)}"
            )

    @property
    def has_gfx(self) -> bool:
        """Whether rows name their architecture in a ``gfx`` column."""
        return OPTIONAL_ARCH_COLUMN in self.columns

    def records(self) -> Iterator[TableLine]:
        """The records after the header (blank lines with ``fields`` None); GemmTableError for bad
        bytes, CSV or field counts."""
        columns = self.columns
        for line, raw in self._records:
            where = f"{self.path}:{line}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise GemmTableError(f"{where}: not UTF-8 text ({exc})") from None
            values = _parse(text, where)
            if not values:
                yield TableLine(line, raw, None)
                continue
            if len(values) != len(columns):
                raise GemmTableError(
                    f"{where}: {len(values)} fields but the header has {len(columns)} columns"
                )
            yield TableLine(line, raw, dict(zip(columns, values, strict=True)))

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> Table:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_table(path: str | Path) -> Table:
    """Open the table at ``path`` and read its header; raises GemmTableError if it is not one."""
    path = Path(path)
    try:
        handle = os.fdopen(open_regular(path), "rb")
    except NotRegularFileError as exc:
        raise GemmTableError(str(exc)) from None
    except OSError as exc:
        raise GemmTableError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return Table(path, handle)
    except BaseException:
        handle.close()
        raise
