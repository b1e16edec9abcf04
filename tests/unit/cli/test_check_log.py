"""titan-rocm check-log: exit codes, reports and --json on real and written logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from titan_rocm.cli import main

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["check-log", *map(str, argv)])
    return code, capsys.readouterr().out


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code, out = run(capsys, "--json", *argv)
    return code, json.loads(out)


@pytest.mark.parametrize(
    "name", ["tt_cpu_clean.log", "tt_cpu_clean_nocolor.log", "megatron_clean.log"]
)
def test_clean_logs_pass(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out = run(capsys, FIXTURES / name)
    assert code == 0 and ": ok: every loss and grad norm is finite over" in out


def test_real_divergence_without_guard_fails_at_step_3(capsys) -> None:
    code, data = run_json(capsys, FIXTURES / "tt_cpu_diverged_no_guard.log")
    (f,) = data["files"]
    assert code == 1 == data["exit_code"] == f["exit_code"] and f["status"] == "nonfinite"
    assert f["format"] == "torchtitan" and f["steps_parsed"] == 12
    assert f["first_bad"]["step"] == 3 and f["first_bad"]["values"] == {
        "loss": "nan", "grad_norm": "nan"}
    assert f["nonfinite_count"] == 10 and f["nonfinite_steps"] == list(range(3, 13))


@pytest.mark.parametrize(
    "name", ["tt_cpu_guard_nan_step7.log", "h200_1gpu_guard_nan_step7.log",
             "h200_2gpu_fsdp_guard_nan_step7_rank1.log"],
)
def test_guard_stop_between_log_steps_fails(capsys, name: str) -> None:
    """The guard's message names step 7, whatever the metric lines of step 10 show."""
    code, out = run(capsys, FIXTURES / name)
    assert code == 1
    assert "diverged at step 7" in out and "the titan-rocm divergence guard stopped it" in out


def test_real_h200_fsdp_log(capsys) -> None:
    code, data = run_json(capsys, FIXTURES / "h200_2gpu_fsdp_guard_nan_step7_rank1.log")
    (f,) = data["files"]
    assert f["format"] == "torchtitan" and f["ranks"] == [0, 1] and f["steps_parsed"] == 2
    assert f["nonfinite_steps"] == [7, 10]


def test_two_rank_log_reports_per_rank(capsys) -> None:
    code, data = run_json(capsys, FIXTURES / "tt_cpu_2rank_guard_nan_step7_rank1.log")
    (f,) = data["files"]
    assert code == 1 and f["ranks"] == [0, 1]
    assert f["first_bad"]["step"] == 7 and f["first_bad"]["rank"] == 1
    assert set(f["first_bad_per_rank"]) >= {"0", "1"}
    code, out = run(capsys, FIXTURES / "tt_cpu_2rank_guard_nan_step7_rank1.log")
    assert "  rank 0: first non-finite step" in out and "  rank 1: first non-finite step" in out


def test_megatron_failures(capsys) -> None:
    code, data = run_json(capsys, FIXTURES / "megatron_nan.log",
                          FIXTURES / "megatron_moe_inf_aux_loss.log")
    nan, moe = data["files"]
    assert code == 1
    assert nan["first_bad"]["step"] == 30 and nan["first_bad"]["rank"] == 7
    assert nan["first_bad"]["bad"]["number of nan iterations"] == 1.0
    assert moe["first_bad"]["step"] == 20 and moe["first_bad"]["bad"] == {
        "load_balancing_loss": "inf"}


def test_messy_log(capsys) -> None:
    code, data = run_json(capsys, FIXTURES / "messy_torchtitan_crlf.log")
    (f,) = data["files"]
    assert code == 1 and f["first_bad"]["step"] == 20 and f["first_bad"]["rank"] == 1
    assert f["first_bad_per_rank"]["0"]["step"] == 30


def test_no_training_step_is_not_a_pass(capsys, tmp_path: Path) -> None:
    log = tmp_path / "truncated.log"
    log.write_text("[titan] starting\nstep: 4  loss:\n")
    code, data = run_json(capsys, log)
    (f,) = data["files"]
    assert code == 2 and f["status"] == "error" and f["verdict"]["status"] == "incomplete"
    assert "1 truncated metric line(s)" in f["error"] and "no training step" in f["error"]
    assert f["truncated_lines"] == [2]
    empty = tmp_path / "zero.log"
    empty.write_bytes(b"")
    code, out = run(capsys, empty)
    assert code == 2 and f"{empty}: empty: {empty} is empty" in out


def test_binary_garbage_is_read_not_crashed(capsys, tmp_path: Path) -> None:
    log = tmp_path / "bin.log"
    log.write_bytes(b"\xff\xfe\x00step: 1  loss: 2.5  grad_norm: 1.0\n\x80\x81")
    assert run(capsys, log)[0] == 0


def test_wrong_format_names_the_format_found(capsys) -> None:
    code, out = run(capsys, "--format", "megatron", FIXTURES / "tt_cpu_clean.log")
    assert code == 2
    assert "no Megatron-LM metric line in" in out and "5 TorchTitan metric line(s)" in out
    assert "use --format torchtitan or --format auto (accepted: auto, torchtitan, megatron)" in out
    code, out = run(capsys, "--format", "torchtitan", FIXTURES / "megatron_clean.log")
    assert code == 2 and "it is a megatron log; use --format megatron" in out
    assert run(capsys, "--format", "torchtitan", FIXTURES / "tt_cpu_clean.log")[0] == 0


def test_bad_options(capsys) -> None:
    assert main(["check-log", "--format", "csv", str(FIXTURES / "tt_cpu_clean.log")]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main(["check-log"]) == 2


def test_several_files_divergence_wins_over_errors(capsys, tmp_path: Path) -> None:
    clean, bad = FIXTURES / "tt_cpu_clean.log", FIXTURES / "tt_cpu_diverged_no_guard.log"
    assert run(capsys, clean, clean)[0] == 0
    assert run(capsys, clean, tmp_path / "missing.log")[0] == 2
    assert run(capsys, clean, tmp_path / "missing.log", bad)[0] == 1


def test_json_is_strict(capsys) -> None:
    _, out = run(capsys, "--json", FIXTURES / "messy_torchtitan_crlf.log")
    assert "NaN" not in out and "Infinity" not in out  # json.dumps(allow_nan=False)


# -- a crashed run in CI (issue 25, item 6) -------------------------------------------------------

OOM_LOG = (FIXTURES / "tt_oom_after_step10.log").read_text()  # also docs/divergence-detection.md's


def test_a_crash_after_finite_steps_exits_3_only_when_completion_is_required(
        capsys, tmp_path: Path) -> None:
    crashed, clean = tmp_path / "oom.log", FIXTURES / "tt_cpu_clean.log"
    crashed.write_text(OOM_LOG)
    code, out = run(capsys, crashed)
    assert code == 0 and "incomplete" in out  # the documented default: the numbers are fine
    code, report = run_json(capsys, "--require-complete", crashed)
    assert code == report["exit_code"] == 3
    assert report["files"][0]["verdict"]["status"] == "incomplete"
    assert run(capsys, "--require-complete", clean)[0] == 0  # a finished run still passes
    # Several files: a divergence (1) and an unchecked log (2) outrank a crash (3).
    assert run(capsys, "--require-complete", crashed, clean)[0] == 3
    assert run(capsys, "--require-complete", crashed, FIXTURES / "megatron_nan.log")[0] == 1
    assert run(capsys, "--require-complete", crashed, tmp_path / "missing.log")[0] == 2


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_dash_says_standard_input_is_not_read(capsys, json_flag: list[str]) -> None:
    assert main(["check-log", "tests/fixtures/logs/tt_cpu_clean.log", "-", *json_flag]) == 2
    captured = capsys.readouterr()
    assert "LOG '-' is not valid: check-log does not read standard input; accepted: the path " \
        "of a log file" in captured.err
    assert "No such file" not in captured.err + captured.out
    if json_flag:
        assert json.loads(captured.out)["exit_code"] == 2
