"""No false "ok" from the log readers: a metric line hidden after a long run without a line
end is read (``\\r`` progress output, a NUL head) or the verdict says bytes were skipped; a
line that names a loss or grad norm the parser cannot read as a finite number is a finding.
check-log, bench-summary and compare all follow (docs/divergence-detection.md)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from titan_rocm.cli import main
from titan_rocm.logs.check import check_parsed
from titan_rocm.logs.parse import MAX_LINE_BYTES, TAIL_BYTES, parse_text


def tt(step: int, loss: str = "5.0", grad_norm: str = "1.0", rank: int | None = None) -> str:
    prefix = f"[rank{rank}]:" if rank is not None else ""
    return (f"{prefix}[titan] - root - INFO - step: {step:2d}  loss: {loss}  grad_norm: "
            f"{grad_norm}  memory: 3.00GiB(2.00%)  tps: 1,000  tflops: 10.00  mfu: 1.00%")


GOOD = "\n".join(tt(s) for s in range(1, 11)) + "\n"


def _three_tools(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, int, int]:
    """check-log's exit code and JSON, bench-summary's and compare's exit codes."""
    code = main(["check-log", str(path), "--json"])
    checked = json.loads(capsys.readouterr().out)["files"][0]
    summary = main(["bench-summary", str(path), "--json", "--warmup", "0"])
    assert json.loads(capsys.readouterr().out)["valid"] is False
    good = path.with_name("good.log")
    good.write_text(GOOD)
    compared = main(["compare", str(good), str(path), "--json"])
    capsys.readouterr()
    return code, checked, summary, compared


@pytest.mark.parametrize("head", [b"\x00" * (3 << 20), b"\r".join([b"[####    ] 50%"] * 250_000)])
def test_a_metric_line_after_megabytes_without_a_newline_is_read(
        tmp_path: Path, head: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    """A copytruncate NUL head and 3 MB of progress-bar output: the nan line behind is seen."""
    assert len(head) > MAX_LINE_BYTES
    path = tmp_path / "run.log"
    path.write_bytes(GOOD.encode() + head + tt(11, "nan").encode() + b"\n")
    code, checked, summary, compared = _three_tools(path, capsys)
    assert code == 1 and checked["verdict"]["status"] == "diverged", checked
    assert checked["first_bad"]["step"] == 11
    assert (summary, compared) == (1, 1)


def test_bytes_skipped_in_an_overlong_line_are_never_ok(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(GOOD.encode() + b"x" * (2 * MAX_LINE_BYTES) + tt(11).encode()
                     + b"\n" + tt(12).encode() + b"\n")
    code, checked, summary, compared = _three_tools(path, capsys)
    verdict = checked["verdict"]
    assert code == 2 and verdict["status"] == "incomplete", checked
    assert verdict["unread_bytes"] == MAX_LINE_BYTES + len(tt(11)) + 1 - TAIL_BYTES
    assert "not read" in verdict["reason"] and checked["steps_parsed"] == 12
    assert (summary, compared) == (1, 1)
    main(["check-log", str(path)])
    assert "were not read" in capsys.readouterr().out


def test_a_rank0_line_split_by_another_rank_keeps_its_nan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head, _, tail = tt(11, grad_norm="nan", rank=0).partition("  grad_norm:")
    split = f"{head}[rank1]:[W reducer.cpp:1] a warning\n[rank0]:  grad_norm:{tail}\n"
    path = tmp_path / "run.log"
    path.write_text(GOOD + split + tt(12) + "\n")
    code, checked, summary, compared = _three_tools(path, capsys)
    assert code == 1 and checked["first_bad"]["rank"] == 0, checked
    assert (summary, compared) == (1, 1)


@pytest.mark.parametrize("value", ["tensor(nan)", "1.#QNAN", "1.#INF", "nan%", "-", "NaN?"])
def test_a_loss_outside_the_number_grammar_mid_log_is_a_finding(
        tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.log"
    path.write_text(GOOD + tt(11, value) + "\n" + tt(12) + "\n")
    code, checked, summary, compared = _three_tools(path, capsys)
    assert code == 1, checked
    if not value.lower().startswith("nan"):  # "nan%" is read as the nan it starts with
        assert repr(value) in checked["verdict"]["reason"]
    assert (summary, compared) == (1, 1)


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[,;]?")
VALUES = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp"),
                               blacklist_characters="|\x85"), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=VALUES, name=st.sampled_from(["loss", "grad_norm"]),
       where=st.integers(min_value=1, max_value=10))
def test_no_unreadable_loss_or_grad_norm_is_ever_ok(value: str, name: str, where: int) -> None:
    """Property: a metric line whose loss or grad norm is anything but a finite number never
    gives ``ok`` (a finite number does)."""
    lines = GOOD.splitlines()
    kwargs = {"loss": value} if name == "loss" else {"grad_norm": value}
    lines[where - 1] = tt(where, **kwargs)
    result = check_parsed(parse_text("\n".join(lines) + "\n"))
    finite = bool(_NUMBER.fullmatch(value)) and math.isfinite(float(value.rstrip(",;")))
    if finite:
        assert result.verdict.status == "ok", (value, result.verdict.reason)
    else:
        assert result.verdict.status != "ok", value
        assert result.exit_code == 1


@pytest.mark.parametrize(("base", "other"), [("-1e308", "1e308"), ("-1e-300", "1e300"),
                                             ("1e-320", "1.0")])
def test_compare_json_survives_a_difference_that_overflows(
        tmp_path: Path, base: str, other: str, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("\n".join(tt(s, base) for s in range(1, 11)) + "\n")
    b.write_text("\n".join(tt(s, other) for s in range(1, 11)) + "\n")
    assert main(["compare", str(a), str(b), "--json"]) == 0  # without --noise: both valid
    out = capsys.readouterr().out
    json.loads(out)  # strict JSON: no Infinity
    assert "Infinity" not in out and "NaN" not in out
