"""A line longer than MAX_LINE_BYTES without a line end: every log reader (check-log,
bench-summary, compare) reads its first MAX_LINE_BYTES and its last TAIL_BYTES, skips and counts
the bytes between, reads on after it, and says how many steps it read
(docs/divergence-detection.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from titan_rocm.cli import main
from titan_rocm.logs import parse
from titan_rocm.logs.parse import MAX_LINE_BYTES, TAIL_BYTES, parse_file, parse_text


def tt(step: int, loss: str = "5.0") -> str:
    return (f"[titan] - root - INFO - step: {step:2d}  loss: {loss}  grad_norm: 1.0  memory: "
            "3.00GiB(2.00%)  tps: 1,000  tflops: 10.00  mfu: 1.00%\n")


FIVE = "".join(tt(s) for s in range(1, 6)).encode()
LONG = b"x" * (2 * MAX_LINE_BYTES)


def _tools(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, int, dict, int,
                                                                     dict]:
    """Each tool's exit code and --json (compare: the log against a clean baseline)."""
    check = main(["check-log", "--json", str(path)])
    checked = json.loads(capsys.readouterr().out)["files"][0]
    bench = main(["bench-summary", "--json", "--warmup", "0", str(path)])
    summary = json.loads(capsys.readouterr().out)
    base = path.with_name("base.log")
    base.write_bytes(FIVE)
    compared = main(["compare", "--json", str(base), str(path)])
    comparison = json.loads(capsys.readouterr().out)
    return check, checked, bench, summary, compared, comparison


def test_steps_read_before_a_long_unended_line_are_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Five steps, then 2 MiB without a line end to the end of the file: not "no training
    step to check" but the five steps read, and the bytes that were not."""
    path = tmp_path / "run.log"
    path.write_bytes(FIVE + LONG)
    check, checked, bench, summary, compared, comparison = _tools(path, capsys)
    assert check == 2 and checked["steps_parsed"] == 5, checked
    assert checked["verdict"]["status"] == "incomplete"
    assert checked["verdict"]["unread_bytes"] == 2 * MAX_LINE_BYTES - MAX_LINE_BYTES - TAIL_BYTES
    assert "line 6" in checked["verdict"]["reason"]
    assert (bench, summary["steps_parsed"]) == (1, 5)
    assert "did not finish" not in summary["reason"]  # it finished; bytes were not read
    assert compared == 1 and comparison["runs"][0]["compare_verdict"] == "incomplete"
    main(["check-log", str(path)])
    out = capsys.readouterr().out
    assert "No training step" not in out and "5 training step(s) parsed" in out, out


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_lines_after_a_long_line_are_read(tmp_path: Path, end: bytes,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A NaN two lines after a long line is found by all three tools, at its own line."""
    path = tmp_path / "run.log"
    path.write_bytes(FIVE + LONG + end + tt(6, "nan").encode() + tt(7).encode())
    check, checked, bench, summary, compared, comparison = _tools(path, capsys)
    assert check == 1 and checked["first_bad"]["step"] == 6, checked
    assert checked["first_bad"]["line"] == 7 and checked["steps_parsed"] == 7
    assert bench == 1 and compared == 1
    assert comparison["runs"][0]["compare_verdict"] == "diverged at step 6"


def test_a_metric_line_at_the_end_of_a_long_line_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Output without a newline before a metric line glues them: the metric is in the
    line's tail, which is read."""
    path = tmp_path / "run.log"
    path.write_bytes(FIVE + LONG + tt(6, "nan").encode() + tt(7).encode())
    check, checked, bench, _, compared, _ = _tools(path, capsys)
    assert check == 1 and checked["first_bad"]["step"] == 6 and checked["first_bad"]["line"] == 6
    assert (bench, compared) == (1, 1)


def test_head_and_tail_do_not_make_a_metric_line_of_their_own(tmp_path: Path) -> None:
    """The head ends in "step: 9" and the tail starts with "  loss: 7.5": read together
    they would be a metric line of step 9 that is not in the log. The mark between them (the
    bytes skipped) keeps them apart."""
    head = b"y" * (MAX_LINE_BYTES - 7) + b"step: 9"
    tail = b"  loss: 7.5 " + b"z" * (TAIL_BYTES - 13) + b"\n"
    path = tmp_path / "run.log"
    path.write_bytes(FIVE + head + LONG + tail + tt(6).encode())
    log = parse_file(path)
    assert [r.step for r in log.records] == [1, 2, 3, 4, 5, 6]
    assert log.skipped_bytes == len(LONG) and log.cut_lines == [6]


# -- the reader block by block against the rule, on any bytes ---------------------------------

LINE = re.compile(rb"([^\r\n]*)(\r\n|\r|\n)?")


def _reference(data: bytes, max_line: int, tail: int) -> tuple[str, int]:
    """The text the rule says a reader sees (each line of ``max_line`` bytes or more without
    its end: its head, the mark, its last ``tail`` bytes with the end) and the bytes skipped."""
    data = data.replace(b"\x00", b"")
    pieces, skipped, pos = [], 0, 0
    while pos < len(data):
        m = LINE.match(data, pos)
        pos = m.end()
        content, end = m.group(1), m.group(2) or b""
        if len(content) < max_line:
            pieces.append((content + end).decode("utf-8", errors="replace"))
            continue
        rest = content[max_line:] + end
        kept = rest[-tail:] if len(rest) > tail else rest
        skip = len(rest) - len(kept)
        skipped += skip
        while kept[:1] and 0x80 <= kept[0] < 0xC0:
            kept = kept[1:]
        mark = f" [titan-rocm: {skip} bytes not read] " if skip else ""
        pieces.append(content[:max_line].decode("utf-8", errors="replace") + mark
                      + kept.decode("utf-8", errors="replace"))
    return "".join(pieces), skipped


PIECES = st.sampled_from([
    tt(1).encode(), tt(2, "nan").encode(), b"\r\n", b"\n", b"\r", b"x" * 23, b"y" * 7,
    "é".encode(), b"\xe2\x82", b"\x00", b"step: 3", b"  loss: inf",
])


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.lists(PIECES, max_size=25).map(b"".join))
@example(data=b"x" * 40 + b"\r" + tt(2, "nan").encode())  # a lone \r ends a long line
@example(data=b"x" * 40 + b"\r\n" + tt(2, "nan").encode())
@example(data=b"x" * 40 + b"\r\x00\n")  # a block of NULs only between \r and \n
@example(data=b"x" * 40)
def test_streamed_long_lines_follow_the_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             data: bytes) -> None:
    """Blocks of one byte (every state of the reader: a line end split across blocks, a
    long line's end, its tail), lines cut at 32 bytes with a tail of 12: the reader finds
    exactly what parsing the rule's text finds, and counts the bytes it skips."""
    monkeypatch.setattr(parse, "_BLOCK_BYTES", 1)
    monkeypatch.setattr(parse, "MAX_LINE_BYTES", 32)
    monkeypatch.setattr(parse, "TAIL_BYTES", 12)
    path = tmp_path / "x.log"
    path.write_bytes(data)
    streamed = parse_file(path)
    text, skipped = _reference(data, 32, 12)
    whole = parse_text(text, source=str(path))
    assert repr((streamed.records, streamed.lines, streamed.truncated)) == repr(
        (whole.records, whole.lines, whole.truncated))
    assert streamed.skipped_bytes == skipped
