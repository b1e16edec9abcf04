"""benchmarks/check_result_logs.py on the stored GPU results: every row as expected, and the
stored log-checks.txt tables are what the tools say today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "benchmarks" / "results"
BATCHES = sorted(p.name for p in RESULTS.iterdir() if (p / "log-checks.txt").is_file())


def test_every_batch_has_a_table() -> None:
    assert BATCHES == ["2026-11-30-h200", "2026-11-30-h200-b", "2026-11-30-h200-c",
                       "2026-11-30-h200-d", "2026-11-30-h200-e", "2026-12-01-h200"]


@pytest.mark.parametrize("batch", BATCHES)
def test_stored_table_holds(batch: str) -> None:
    stored = (RESULTS / batch / "log-checks.txt").read_text().splitlines()
    header, table = stored[0], stored[1:]
    dirs = sorted(p for p in (RESULTS / batch).iterdir() if (p / "logs.tar.gz").is_file())
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.check_result_logs", *map(str, dirs)],
        cwd=REPO, capture_output=True, text=True, check=False,
    )
    assert header.endswith(f"(exit {run.returncode})") and run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == table
