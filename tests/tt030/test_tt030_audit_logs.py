"""The log tools on the numerics audit's real output, TorchTitan 0.3.0: the real trainer on CPU
(tests/tt030/tt030_harness.py) with ``rocm.numerics_audit = "first_step"``, its log written in
TorchTitan's format (as ``torchtitan.train``'s ``init_logger`` prints it). Nothing here depends
on the wording of the audit's report: a clean run must pass every tool whatever the report
says; a flagged one must be named flagged. The 0.2.2 twin is
tests/unit/logs/test_audit_logs_live.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_tt030_numerics_audit import _clean_state  # noqa: F401 - its autouse fixture

from tests.support.log_tools import run_tools, torchtitan_log
from titan_rocm.testing import corrupt


def _train(cpu_harness: Any, log: Path, steps: int, fault: str | None = None) -> Path:
    """llama3 debug (2 layers) compiled, ``steps`` steps, the audit before step 1's optimizer
    step, colours on as TorchTitan's default, the test fault ``fault`` installed on the built
    trainer; the log written to ``log``."""
    import torch
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from titan_rocm.adapters.tt030 import rocm

    config = cpu_harness.config(llama3_debugmodel(), layers=2, steps=steps, compile=True)
    config.training.mixed_precision_param = "float32"
    config.metrics.disable_color_printing = False
    with torchtitan_log(log):
        trainer = cpu_harness.build(rocm(config, numerics_audit="first_step"))
        if fault is not None:
            corrupt.install(trainer.model_parts, corrupt.parse(fault))
        cpu_harness.train(trainer)
    corrupt.uninstall()
    torch._dynamo.reset()
    assert "numerics audit" in log.read_text()  # the audit ran and reported
    return log


@pytest.mark.slow
def test_real_audited_runs_clean_and_flagged(cpu_harness: Any, tmp_path: Path) -> None:
    clean = _train(cpu_harness, tmp_path / "clean.log", steps=3)
    tools = run_tools(clean, clean)
    assert tools.check_code == 0 and tools.check["steps_parsed"] == 3, tools.check
    assert tools.bench_code == 0 and tools.bench["valid"] is True, tools.bench["reason"]
    assert tools.compare_code == 0 and tools.compare["compare_verdict"] == "unqualified"

    flagged = _train(cpu_harness, tmp_path / "flagged.log", steps=2,
                     fault="block=0,fraction=0.03")
    tools = run_tools(flagged, clean)
    assert tools.check_code == 4 and tools.check["verdict"]["step"] == 1, tools.check
    assert tools.check["verdict"]["status"] == "flagged" and tools.check["steps_parsed"] == 2
    assert tools.bench_code == 1 and tools.bench["verdict"]["status"] == "flagged"
    assert tools.compare["compare_verdict"] == "numerics audit flagged at step 1"


@pytest.mark.slow
def test_a_forward_flag_against_a_float32_reference_is_named_so(cpu_harness: Any,
                                                               tmp_path: Path) -> None:
    """A fault in block 0's compiled forward, the float32 reference: every reader names the
    block's output (the forward) and the float32 reference, not float64. Its log, paths
    replaced by <repo>, is tests/fixtures/logs/tt030_cpu_audit_forward_float32_flagged.log."""
    import torch
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from titan_rocm.adapters.tt030 import rocm

    log = tmp_path / "forward.log"
    config = cpu_harness.config(llama3_debugmodel(), layers=2, steps=3, compile=True)
    config.training.mixed_precision_param = "float32"
    with torchtitan_log(log):
        trainer = cpu_harness.build(rocm(config, numerics_audit="first_step",
                                         numerics_audit_reference="float32"))
        corrupt.install(trainer.model_parts,
                        corrupt.parse("block=0,graph=forward,fraction=0.05"))
        cpu_harness.train(trainer)
    corrupt.uninstall()
    torch._dynamo.reset()
    tools = run_tools(log, log)
    assert tools.check_code == 4 and tools.check["verdict"]["step"] == 1, tools.check
    reason = tools.check["verdict"]["reason"]
    assert "block 0's output (forward)" in reason and "float32 reference" in reason, reason
    assert "float64" not in reason, reason
    assert tools.bench["valid"] is False and tools.compare_code == 1
