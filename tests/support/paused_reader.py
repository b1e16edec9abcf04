"""``titan-rocm`` whose tuned GEMM table reader stops midway and says so, for a real Ctrl-C.

``python -m tests.support.paused_reader MARKER ROW ARGS...`` runs ``titan-rocm ARGS...``
(:func:`titan_rocm.cli.console_main`, as the executable does). Once the command has read row
ROW of a table it creates the file MARKER and waits there, up to :data:`WAIT_S`, for a
signal. A test that sends SIGINT once MARKER exists interrupts the command in the middle of
its read on a machine of any speed or load, instead of sleeping and hoping the child got
that far. Nothing else changes: the rows, the command, its output and its exit code are the
real ones (after :data:`WAIT_S` without a signal the read goes on to its normal end).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from titan_rocm.cli import console_main
from titan_rocm.gemm_tables import table as table_module

WAIT_S = 120.0
"""How long the paused read waits for a signal before it goes on."""


def pause_after(row: int, marker: Path) -> None:
    """Make every table's ``records()`` create ``marker`` and wait after row ``row``."""
    records = table_module.Table.records

    def paused(self: table_module.Table) -> Iterator[table_module.TableLine]:
        for n, record in enumerate(records(self), start=1):
            yield record
            if n == row:
                marker.touch()
                until = time.monotonic() + WAIT_S
                while time.monotonic() < until:  # the signal lands here, mid-read
                    time.sleep(0.01)

    table_module.Table.records = paused  # type: ignore[method-assign]


if __name__ == "__main__":
    # A shell's background job starts with SIGINT ignored (bash without job control, as
    # scripts/test_suites.sh runs the suites), and Python then keeps it ignored: the test's
    # Ctrl-C must reach the command as a terminal's does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    marker, row, *argv = sys.argv[1:]
    pause_after(int(row), Path(marker))
    sys.argv = ["titan-rocm", *argv]
    console_main()
