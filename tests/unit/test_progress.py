"""titan_rocm.progress: a fixed total and an ETA; a tqdm bar on a terminal, a plain line every
interval otherwise (never ``\\r`` noise in a log), and nothing at all for a short quiet run."""

from __future__ import annotations

import io

from titan_rocm.progress import Progress


def test_off_a_terminal_it_writes_whole_lines_with_the_total_and_an_eta() -> None:
    out = io.StringIO()
    with Progress(40, "problem", "titan-rocm tune", stream=out, interval=0) as progress:
        for _ in range(3):
            progress.update(detail="pass 5")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 4  # three updates and the last line
    assert lines[0].startswith("titan-rocm tune: 1/40 problems [")
    assert lines[-1].startswith("titan-rocm tune: 3/40 problems [") and "<" in lines[-1]
    assert lines[-1].endswith("(pass 5)")


def test_a_short_run_off_a_terminal_stays_quiet() -> None:
    out = io.StringIO()
    with Progress(5, "file", "titan-rocm scan", stream=out) as progress:  # 30 s interval
        progress.update(5)
    assert out.getvalue() == ""
    assert progress.line().startswith("titan-rocm scan: 5/5 files [")


def test_on_a_terminal_it_is_a_bar_with_a_fixed_total() -> None:
    out = io.StringIO()
    with Progress(8, "problem", "titan-rocm tune", stream=out, tty=True) as progress:
        progress.update(2, detail="pass 3")
    text = out.getvalue()
    assert "2/8" in text and "pass 3" in text and "titan-rocm tune" in text
