"""What the stop tests of both TorchTitan generations check of a stopped run's processes
(tests/tt022/test_stop_exit_code.py, tests/tt030/test_tt030_stop.py): the sentence, the stop
line, no traceback, no process-group leak, torchrun's failure record, the checkpoints left."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from titan_rocm.exit_codes import stop_line

REPO = Path(__file__).resolve().parents[2]
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "GROUP_RANK", "ROLE_RANK")
LEAK_WARNING = "destroy_process_group() was not called"


def env(**extra: str) -> dict[str, str]:
    """This environment without torchrun's variables or titan-rocm's test hooks, the
    repository on ``PYTHONPATH``, and ``extra``."""
    clean = {k: v for k, v in os.environ.items()
             if k not in TORCHRUN_VARIABLES and not k.startswith("TITAN_ROCM_DEBUG_")}
    clean["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**clean, **extra}


def assert_stopped_cleanly(text: str, sentence: str) -> None:
    """One rank's whole output: the stop's sentence and line, no traceback, no leak."""
    assert sentence in text, text[-3000:]
    assert stop_line() in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert LEAK_WARNING not in text, text[-3000:]


def checkpoints(folder: Path) -> list[str]:
    """The checkpoint folders (``step-N``) written into ``folder``."""
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def torchrun(cwd: Path, port: int, nproc: int, environ: dict[str, str],
             *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """torchrun with each worker's output in its own files: torchrun's process, and each
    rank's output (stdout then stderr)."""
    logs = cwd / "torchrun-logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_port", str(port), "--redirects", "3", "--log-dir", str(logs), *args]
    proc = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=900,
                          cwd=cwd)
    ranks = []
    for rank in range(nproc):
        (folder,) = logs.glob(f"*/attempt_0/{rank}")
        ranks.append((folder / "stdout.log").read_text() + (folder / "stderr.log").read_text())
    return proc, ranks


def assert_torchrun_names_17(proc: subprocess.CompletedProcess[str], nproc: int) -> None:
    """torchrun exits with 1 (its ChildFailedError); its failure record's root cause is a
    worker's exit code 17, with no error file (the stop writes none: no worker traceback).
    torchrun sends SIGTERM to the workers still running once one has exited: a rank slower to
    leave is listed as -15, never as a crash."""
    own = proc.stdout + proc.stderr
    assert proc.returncode == 1, own[-3000:]
    root = own[own.index("Root Cause (first observed failure)"):]
    assert re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", root, re.M)[0] == "17", own[-3000:]
    codes = re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", own, re.M)
    assert len(codes) == nproc and set(codes) <= {"17", "-15"}, own[-3000:]
    files = re.findall(r"^\s*error_file\s*:\s*(\S+)", own, re.M)
    assert files == ["<N/A>"] * nproc, own[-3000:]
