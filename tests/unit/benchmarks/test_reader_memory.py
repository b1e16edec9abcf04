"""benchmarks/reader_memory.py on CPU at tiny sizes: every reader runs in its own process,
the figures and ratios come out (compare on two logs: exit 0, no run left behind), and the
refused inputs are refused (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import reader_memory as bench


@pytest.mark.slow
def test_reader_memory_measures_every_reader(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "CASES", (
        ("check-log distinct steps", 1 << 16, 1 << 18),
        ("compare 1,000 steps", 1 << 16, 1 << 18),
        ("scan", 1 << 16, 1 << 18),
        ("plan TOML", 1 << 12, 1 << 14),
        ("plan TOML (past 16 MiB: refused)", 1 << 12, (16 << 20) + 1),
    ))
    rows = bench.measure(1.0, tmp_path)
    assert [r.reader for r in rows][0] == "check-log distinct steps"
    assert all(r.small_rss_mib > 10 and r.ratio > 0 for r in rows)
    assert [(r.small_exit, r.large_exit) for r in rows] == [(0, 0), (0, 0), (0, 0), (0, 0),
                                                            (0, 2)]
    assert "| reader" in bench.table(rows) and list(tmp_path.iterdir()) == []
