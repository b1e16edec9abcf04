"""A loss is read only where a training metric line has it, and the in-training numerics audit
is reported as what it is: the three log tools agree on an audited run (docs/numerics-audit.md,
docs/divergence-detection.md).

TorchTitan's metric line (0.2.2 and 0.3.0, ``torchtitan/components/metrics.py``
``MetricsProcessor.log``) is ``step: N  loss: V  grad_norm: V  memory: ...``: a loss counts
right after ``step: N``, or, on a piece of the line another rank's output split off, right
before the grad norm; a Megatron-LM loss after its ``iteration N/ M |``. Any other line that
names a loss or a step (the audit's report, a user's print) is not a metric line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.log_tools import run_tools
from titan_rocm.cli import main
from titan_rocm.logs.check import EXIT_FLAGGED, CheckResult, combined_exit_code
from titan_rocm.logs.parse import parse_file, parse_text

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
CLEAN = FIXTURES / "tt_cpu_audit_first_step_clean.log"
FLAGGED = FIXTURES / "tt_cpu_audit_first_step_flagged.log"
STOPPED = FIXTURES / "tt_cpu_audit_first_step_stop.log"


def tt(step: int, loss: str = "5.0") -> str:
    return (f"[titan] - root - INFO - step: {step:2d}  loss: {loss}  grad_norm: 1.0  memory: "
            "3.00GiB(2.00%)  tps: 1,000  tflops: 10.00  mfu: 1.00%")


# Lines that name a loss or a step and are no metric line. Read as metric lines, nine of them
# make a clean log DIVERGED (a value that is no finite number) and one gives it a step it never
# trained (step 3 twice); the last two are kept as guards.
NOT_METRIC_LINES = [
    "loss: job 8.09  eager 8.09  reference 8.09  err_job 0  err_eager 0",  # the audit's report
    "loss: job nan  eager 8.09  reference 8.09  err_job nan  err_eager 0  FLAGGED",
    "  loss (job, eager, reference): nan",
    "[rank0]: the loss: tensor(nan) was dropped by the user's hook",
    "step: 5 done; the loss: NaN? (a user print)",
    "Profiling active at step: 5 (for the loss: see below)",
    "step: 3 of warm-up; lr: 1e-4 loss: 7.5",  # a step, then a loss that is not right after it
    "aux_loss: nan  router_loss: inf",
    "validation loss: nan on the held-out set",
    "| lm loss: nan | (a Megatron-looking field without its iteration)",
    "grad_norm: tensor(inf) in the clip hook",
    "loss:",
    "titan-rocm numerics audit begun at step 1 ended at step 3: 3 parts, every one ok",
    "  part 2 of 3 (numerics_audit_spread): block 1",
]


@pytest.mark.parametrize("line", NOT_METRIC_LINES)
def test_lines_that_only_name_a_loss_are_not_metric_lines(
        tmp_path: Path, line: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = "\n".join([tt(1), line, tt(2), line, tt(3)]) + "\n"
    log = parse_text(text)
    assert [(r.kind, r.step) for r in log.records] == [("train", 1), ("train", 2), ("train", 3)]
    path = tmp_path / "run.log"
    path.write_text(text)
    base = tmp_path / "base.log"
    base.write_text("\n".join(tt(s) for s in (1, 2, 3)) + "\n")
    tools = run_tools(path, base)
    assert tools.check_code == 0 and tools.check["verdict"]["status"] == "ok", tools.check
    assert tools.bench_code == 0 and tools.bench["valid"] is True
    assert tools.compare_code == 0 and tools.compare["compare_verdict"] == "unqualified"
    capsys.readouterr()


@pytest.mark.parametrize("line", [
    "step: 11  loss: tensor(nan)  grad_norm: 1.0",  # the whole line
    "[rank0]:  loss: nan  grad_norm: 1.0  memory: 3.00GiB(2.00%)",  # split off after the step
    "[rank0]:  grad_norm: nan  memory: 3.00GiB(2.00%)  tps: 1,000",  # split off after the loss
    " iteration       11/     100 | lm loss: tensor(nan) | grad norm: 1.0 |",
])
def test_a_metric_line_or_a_piece_of_one_still_counts(line: str) -> None:
    log = parse_text("\n".join([tt(10), line, tt(12)]) + "\n")
    assert any(not r.finite for r in log.records), log.records


# -- the in-training numerics audit's real output (tests/fixtures/logs: generate_torchtitan.sh:
# TorchTitan 0.2.2's trainer on CPU with [rocm] numerics_audit = "first_step") ----------------


def test_a_clean_audited_run_passes_every_tool() -> None:
    assert "numerics audit at step 1: OK" in CLEAN.read_text()  # the report, not a metric
    tools = run_tools(CLEAN, CLEAN)
    assert tools.check_code == 0 and tools.check["steps_parsed"] == 5, tools.check
    assert tools.bench_code == 0 and tools.bench["valid"] is True
    assert tools.compare_code == 0 and tools.compare["compare_verdict"] == "unqualified"
    assert parse_file(CLEAN).audits_ok == 3  # one per step the spread audit ran on


@pytest.mark.parametrize("path, steps", [(FLAGGED, 3), (STOPPED, 0)])
def test_a_flagged_audit_is_reported_as_flagged(path: Path, steps: int,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Policy "warn" (trains on, every value finite) and "stop" (the run ends at step 1 with
    the exception): check-log exits 4 naming the step, bench-summary refuses the figures,
    compare names the run flagged; none calls it diverged."""
    tools = run_tools(path, CLEAN)
    verdict = tools.check["verdict"]
    assert tools.check_code == EXIT_FLAGGED == 4 and tools.check["status"] == "flagged"
    assert verdict["status"] == "flagged" and verdict["step"] == 1, verdict
    assert verdict["label"] == "numerics audit flagged at step 1"
    assert verdict["audit_flagged"]["step"] == 1 and tools.check["steps_parsed"] == steps
    assert tools.bench_code == 1 and tools.bench["valid"] is False
    assert "numerics audit flagged step 1" in tools.bench["reason"]
    assert tools.compare_code == 1
    assert tools.compare["compare_verdict"] == "numerics audit flagged at step 1"
    main(["check-log", str(path)])
    out = capsys.readouterr().out
    assert "NUMERICS AUDIT FLAGGED" in out and "DIVERGED" not in out, out


def test_a_divergence_outranks_a_flagged_audit(tmp_path: Path) -> None:
    """A NaN after a flagged audit is the run's verdict (exit 1); with several files, 1 wins
    over 4 and 4 over 2."""
    path = tmp_path / "run.log"
    path.write_text(FLAGGED.read_text() + tt(4, "nan") + "\n")
    tools = run_tools(path, CLEAN)
    assert tools.check_code == 1 and tools.check["verdict"]["status"] == "diverged"

    def result(code: int) -> CheckResult:
        return CheckResult("x.log", code)

    assert combined_exit_code([result(1), result(4), result(2)]) == 1
    assert combined_exit_code([result(2), result(4), result(0)]) == 4
    assert combined_exit_code([result(0), result(4)], require_complete=True) == 4


def test_an_audit_verdict_without_its_header_is_not_an_audit(tmp_path: Path) -> None:
    """The verdict counts only on the audit's own verdict line, which names its step: a line
    that says "numerics audit: FLAGGED" (a comment, a doc quote: no step) flags nothing."""
    log = parse_text("\n".join([tt(1), "numerics audit: FLAGGED (quoted)", tt(2)]) + "\n")
    assert log.audits_flagged == [] and log.audits_ok == 0
    out = json.dumps([m.to_dict() for m in parse_file(FLAGGED).audits_flagged])
    assert '"step": 1' in out
