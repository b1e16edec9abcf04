"""The log tools on the numerics audit's real output, TorchTitan 0.2.2: the real trainer
(tests/support/audit_trainer.py through ``torchrun -m tests.support.audit_train_main``, one
gloo rank on CPU) with ``[rocm] numerics_audit = "first_step"``, its log as torchrun prints it.
Nothing here depends on the wording of the audit's report: a clean run must pass every tool
whatever the report says; a flagged one must be named flagged (its verdict line under its
header; docs/numerics-audit.md). The 0.3.0 twin is tests/tt030/test_tt030_audit_logs.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cpu_support import free_port
from tests.support.log_tools import run_tools

ROOT = Path(__file__).resolve().parents[3]


def _train(tmp_path: Path, name: str, steps: int, corrupt: str | None = None) -> Path:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]))
    env.pop("TITAN_ROCM_DEBUG_CORRUPT", None)
    if corrupt:
        env["TITAN_ROCM_DEBUG_CORRUPT"] = corrupt
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
           "--master_port", str(free_port()),
           "-m", "tests.support.audit_train_main", "--model.converters", "rocm",
           "--compile.enable", "--activation_checkpoint.mode", "none", "--training.steps",
           str(steps), "--metrics.log_freq", "1", "--rocm.numerics_audit", "first_step"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                          cwd=tmp_path)
    log = tmp_path / name
    log.write_text(done.stdout + done.stderr)
    assert done.returncode == 0, log.read_text()[-3000:]
    assert "numerics audit" in log.read_text()  # the audit ran and reported
    return log


@pytest.mark.slow
def test_real_audited_runs_clean_and_flagged(tmp_path: Path) -> None:
    clean = _train(tmp_path, "clean.log", steps=5)
    tools = run_tools(clean, clean)
    assert tools.check_code == 0 and tools.check["steps_parsed"] == 5, tools.check
    assert tools.bench_code == 0 and tools.bench["valid"] is True, tools.bench["reason"]
    assert tools.compare_code == 0 and tools.compare["compare_verdict"] == "unqualified"

    flagged = _train(tmp_path, "flagged.log", steps=3, corrupt="block=0,fraction=0.03")
    tools = run_tools(flagged, clean)
    assert tools.check_code == 4 and tools.check["verdict"]["step"] == 1, tools.check
    assert tools.check["verdict"]["status"] == "flagged" and tools.check["steps_parsed"] == 3
    assert tools.bench_code == 1 and tools.bench["verdict"]["status"] == "flagged"
    assert tools.compare["compare_verdict"] == "numerics audit flagged at step 1"
