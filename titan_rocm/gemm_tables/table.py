"""Read an aiter tuned-GEMM CSV table as bytes, one record per CSV row, losslessly.

The table is never rewritten through a CSV writer: each record keeps the exact
bytes it had in the file (line ending, quoting, spacing), so a filtered table is
the original file with whole lines taken out. The ``csv`` module only *parses* a
record to decide about it.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from titan_rocm.files import NotRegularFileError, read_regular

REQUIRED_COLUMNS: tuple[str, ...] = ("cu_num", "libtype", "solidx", "kernelName")
"""Columns a tuned BF16 GEMM table must have for the capture-safety decision."""

OPTIONAL_ARCH_COLUMN = "gfx"
"""The architecture column of current aiter tables; older tables only have ``cu_num``."""

_BOM = b"\xef\xbb\xbf"


class GemmTableError(ValueError):
    """The file is not a tuned GEMM table this tool can process (message says why)."""


@dataclass(frozen=True)
class TableLine:
    """One CSV record: its original bytes and, for data rows, its parsed fields."""

    line: int
    """1-based number of the record's first physical line in the file."""
    raw: bytes
    """The record's exact bytes, line ending(s) included."""
    fields: dict[str, str] | None
    """Column name → value; ``None`` for a blank line (aiter's pandas reader skips those)."""


@dataclass
class Table:
    """A tuned GEMM table: header bytes, column names, and records in file order."""

    path: Path
    header: TableLine
    columns: tuple[str, ...]
    records: list[TableLine] = field(default_factory=list)

    @property
    def has_gfx(self) -> bool:
        """Whether rows name their architecture in a ``gfx`` column."""
        return OPTIONAL_ARCH_COLUMN in self.columns

    def rows(self) -> list[TableLine]:
        """The data rows (blank lines left out)."""
        return [r for r in self.records if r.fields is not None]


def split_records(data: bytes, where: str = "line ") -> list[tuple[int, bytes]]:
    """Split ``data`` into CSV records, each as (first line number, exact bytes).

    Physical lines keep their endings (``\\r\\n``, ``\\n``, ``\\r``, or none on the
    last line). A quoted field may contain a line break, so physical lines are
    joined until the record's double quotes balance (an escaped quote ``""`` counts
    twice and so never unbalances).

    Raises:
        GemmTableError: if the data ends inside a quoted field (``where`` prefixes its line
            number: ``"table.csv:"`` names the file).
    """
    records: list[tuple[int, bytes]] = []
    pending: list[bytes] = []
    start = 0
    quotes = 0
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        if not pending:
            start = number
        pending.append(line)
        quotes += line.count(b'"')
        if quotes % 2 == 0:
            records.append((start, b"".join(pending)))
            pending, quotes = [], 0
    if pending:
        raise GemmTableError(
            f"{where}{start}: a quoted field is never closed before the end of file"
        )
    return records


def _parse(text: str, where: str) -> list[str]:
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    except csv.Error as exc:
        raise GemmTableError(f"{where}: not valid CSV ({exc})") from None
    if len(rows) > 1:
        raise GemmTableError(f"{where}: one record parses as {len(rows)} CSV rows")
    return rows[0] if rows else []


def parse_table(data: bytes, path: Path) -> Table:
    """Parse the bytes of a tuned GEMM table read from ``path`` (used in messages).

    Raises:
        GemmTableError: empty file, non-UTF-8 bytes, malformed CSV, a row whose field
            count differs from the header's, or missing required columns.
    """
    records = split_records(data, f"{path}:")
    if not records:
        raise GemmTableError(f"{path}: empty file, expected a CSV header line")
    header_line, header_raw = records[0]
    try:
        header_text = header_raw.removeprefix(_BOM).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GemmTableError(f"{path}:{header_line}: not UTF-8 text ({exc})") from None
    columns = tuple(c.strip() for c in _parse(header_text, f"{path}:{header_line}"))
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise GemmTableError(
            f"{path}: not an aiter tuned BF16 GEMM table: missing column(s) "
            f"{', '.join(missing)}; a table needs {', '.join(REQUIRED_COLUMNS)} "
            f"(and optionally {OPTIONAL_ARCH_COLUMN}); its header has: {', '.join(columns)}"
        )
    table = Table(path=path, header=TableLine(header_line, header_raw, None), columns=columns)
    for line, raw in records[1:]:
        where = f"{path}:{line}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GemmTableError(f"{where}: not UTF-8 text ({exc})") from None
        values = _parse(text, where)
        if not values:
            table.records.append(TableLine(line, raw, None))
            continue
        if len(values) != len(columns):
            raise GemmTableError(
                f"{where}: {len(values)} fields but the header has {len(columns)} columns"
            )
        table.records.append(TableLine(line, raw, dict(zip(columns, values, strict=True))))
    return table


def read_table(path: str | Path) -> Table:
    """Read and parse the tuned GEMM table at ``path``.

    Raises:
        GemmTableError: the file cannot be read or is not such a table.
    """
    path = Path(path)
    try:
        data = read_regular(path)
    except NotRegularFileError as exc:
        raise GemmTableError(str(exc)) from None
    except OSError as exc:
        raise GemmTableError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse_table(data, path)
