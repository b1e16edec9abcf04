"""A stopped run ends as a stop, not a crash (TorchTitan 0.2.2's real trainer, CPU, processes):
the divergence guard and the numerics audit's ``stop`` policy end every rank with the
sentence, no traceback, the process group destroyed and exit code 17
(titan_rocm/exit_codes.py; docs/divergence-detection.md "Stop: exit code 17"), and no
checkpoint of the flagged step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cpu_support import free_port
from tests.support.stop_checks import (
    REPO,
    assert_stopped_cleanly,
    assert_torchrun_names_17,
    checkpoints,
    env,
    torchrun,
)
from titan_rocm.exit_codes import FAILED_VALIDATION


@pytest.mark.slow
def test_the_launcher_exits_with_17_at_a_nan_and_saves_no_checkpoint_of_it(
        tmp_path: Path) -> None:
    """``titan-rocm-train`` alone (no torchrun), the guard's NaN test hook at step 3, a
    checkpoint every step: the process exits with 17, steps 1 and 2 are saved, step 3 is
    not."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "cpu_single_process.py"),
         "--job.config_file", "configs/llama3_debug.toml", "--training.steps", "5",
         "--compile.no-enable", "--training.seq_len", "64", "--training.local_batch_size", "2",
         "--metrics.log_freq", "1", "--checkpoint.enable", "--checkpoint.interval", "1",
         "--checkpoint.folder", "ckpt", "--job.dump_folder", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env=env(TITAN_ROCM_DEBUG_INJECT_NAN_STEP="3"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == FAILED_VALIDATION == 17, out[-3000:]
    assert_stopped_cleanly(out, "titan-rocm divergence guard: training diverged at step 3")
    assert "Training completed" not in out
    assert checkpoints(tmp_path / "ckpt") == ["step-1", "step-2"]


@pytest.mark.slow
def test_two_ranks_stop_at_the_guard_with_17_each(tmp_path: Path) -> None:
    """torchrun, 2 gloo ranks, NaN on rank 1 at step 3: both ranks end with 17, rank 0 logs
    the full message, rank 1 the short one; no checkpoint of step 3."""
    port = free_port()
    proc, ranks = torchrun(
        tmp_path, port, 2,
        env(TITAN_ROCM_DEBUG_INJECT_NAN_STEP="3", TITAN_ROCM_DEBUG_INJECT_NAN_RANK="1"),
        str(REPO / "tests" / "support" / "cpu_trainer.py"),
        "--model.converters", "rocm.divergence_guard", "--training.steps", "5",
        "--metrics.log_freq", "1", "--checkpoint.enable", "--checkpoint.interval", "1",
        "--checkpoint.folder", "ckpt", "--job.dump_folder", str(tmp_path))
    assert_torchrun_names_17(proc, 2)
    assert_stopped_cleanly(ranks[0], "training diverged at step 3 on rank 1 of 2: loss = nan")
    assert_stopped_cleanly(ranks[1], "training diverged at step 3 (first seen on rank 1)")
    assert checkpoints(tmp_path / "ckpt") == ["step-1", "step-2"]


@pytest.mark.slow
def test_two_ranks_stop_at_a_flagged_audit_with_17_each(tmp_path: Path) -> None:
    """torchrun, 2 gloo ranks (FSDP), the audit spread over steps 1-3 with ``policy = stop``
    and 3 % of block 1's compiled backward corrupted: block 1's part, at step 2, flags; both
    ranks end with 17 naming step 2 and block 1, before step 2's optimizer step and
    checkpoint (step 1's is saved)."""
    port = free_port()
    proc, ranks = torchrun(
        tmp_path, port, 2, env(TITAN_ROCM_DEBUG_CORRUPT="block=1,fraction=0.03"),
        "-m", "tests.support.audit_train_main", "--model.converters", "rocm",
        "--compile.enable", "--activation_checkpoint.mode", "none",
        "--training.mixed_precision_param", "float32", "--training.steps", "4",
        "--metrics.log_freq", "1", "--rocm.numerics_audit", "first_step",
        "--rocm.numerics_audit_policy", "stop", "--checkpoint.enable",
        "--checkpoint.interval", "1", "--checkpoint.folder", "ckpt",
        "--job.dump_folder", str(tmp_path))
    assert_torchrun_names_17(proc, 2)
    for text in ranks:
        assert_stopped_cleanly(text, "titan-rocm numerics audit flagged step 2 (first wrong in "
                                     "the backward: block 1)")
    assert checkpoints(tmp_path / "ckpt") == ["step-1"]
