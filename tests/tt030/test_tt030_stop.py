"""A stopped run ends as a stop, not a crash, on TorchTitan 0.3.0: its own
``torchtitan.train.main`` in processes (tests/tt030/tt030_main.py), RocmTrainer on CPU. The
divergence guard and the numerics audit's ``stop`` policy end every rank with the sentence, no
traceback, the process group destroyed and exit code 17 (titan_rocm/exit_codes.py), and no
checkpoint of the flagged step. The 0.2.2 twin is tests/tt022/test_stop_exit_code.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cpu_support import free_port
from tests.support.stop_checks import (
    assert_stopped_cleanly,
    assert_torchrun_names_17,
    checkpoints,
    env,
    torchrun,
)
from titan_rocm.exit_codes import FAILED_VALIDATION

HERE = Path(__file__).resolve().parent
MAIN = str(HERE / "tt030_main.py")


def _checkpoints(tmp_path: Path) -> list[str]:
    return checkpoints(tmp_path / "outputs" / "ckpt")


@pytest.mark.slow
def test_the_guard_ends_the_process_with_17_and_no_checkpoint_of_the_bad_step(
        tmp_path: Path) -> None:
    """One process, the guard's NaN test hook at step 3, a checkpoint every step: exit 17,
    steps 1 and 2 saved, step 3 not."""
    proc = subprocess.run(
        [sys.executable, MAIN, "--module", "tt030_stop_job", "--config", "llama3_guard"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env=env(TITAN_ROCM_DEBUG_INJECT_NAN_STEP="3"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == FAILED_VALIDATION == 17, out[-3000:]
    assert_stopped_cleanly(out, "titan-rocm divergence guard: training diverged at step 3")
    assert "Training completed" not in out
    assert _checkpoints(tmp_path) == ["step-1", "step-2"]


@pytest.mark.slow
def test_a_flagged_audit_ends_the_process_with_17_before_its_steps_checkpoint(
        tmp_path: Path) -> None:
    """One process, compiled, the audit spread from step 1 with ``policy = stop`` and 3 % of
    block 1's compiled backward corrupted: block 1's part (step 2) flags; exit 17 naming
    step 2 and block 1; step 1 saved, step 2 not."""
    proc = subprocess.run(
        [sys.executable, MAIN, "--module", "tt030_stop_job", "--config", "llama3_audit_stop"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env=env(TITAN_ROCM_DEBUG_CORRUPT="block=1,fraction=0.03"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 17, out[-3000:]
    assert_stopped_cleanly(out, "titan-rocm numerics audit flagged step 2 (first wrong in the "
                                 "backward: block 1)")
    assert _checkpoints(tmp_path) == ["step-1"]


@pytest.mark.slow
def test_under_torchrun_the_worker_exits_17_in_its_failure_record(tmp_path: Path) -> None:
    """torchrun, one gloo rank, the guard's NaN at step 3: the worker ends with 17 in
    torchrun's failure record (no error file: no worker traceback), its own log holds the
    sentence and no traceback; torchrun itself exits 1. (Two ranks run on 0.2.2,
    tests/tt022/test_stop_exit_code.py: on CPU, 0.3.0's fully_shard over two ranks refuses
    the model's plain parameters before training, with FSDP and with replicas alike.)"""
    proc, (worker,) = torchrun(
        tmp_path, free_port(), 1, env(TITAN_ROCM_DEBUG_INJECT_NAN_STEP="3"),
        MAIN, "--module", "tt030_stop_job", "--config", "llama3_guard")
    assert_torchrun_names_17(proc, 1)
    assert_stopped_cleanly(worker, "titan-rocm divergence guard: training diverged at step 3")
    assert _checkpoints(tmp_path) == ["step-1", "step-2"]
