"""``titan-rocm``'s front door: Ctrl-C in every command is one line and exit 130."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from titan_rocm.cli import INTERRUPTED, SUBCOMMANDS, main

REPO = Path(__file__).resolve().parents[3]

ARGS = {
    "plan": ["--job.config_file", "configs/llama3_debug.toml"],
    "scan": ["tests/corpus/amdgcn"],
    "check-log": ["tests/fixtures/logs/tt_cpu_clean.log"],
    "bench-summary": ["tests/fixtures/logs/tt_cpu_clean.log"],
    "compare": ["tests/fixtures/logs/tt_cpu_clean.log", "tests/fixtures/logs/tt_cpu_clean.log"],
    "gemm-tables": ["capture-safe", "x.csv", "--check"],
    "tune": ["table", "results.jsonl", "--check"],
    "audit": ["--job.config_file", "configs/llama3_debug.toml"],
}


def test_every_command_has_an_interrupt_case() -> None:
    assert set(ARGS) == set(SUBCOMMANDS)


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_ctrl_c_in_any_command_is_one_line_and_exit_130(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = importlib.import_module(SUBCOMMANDS[command])

    def interrupted(_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "run", interrupted)
    assert main([command, *ARGS[command]]) == INTERRUPTED == 130
    out, err = capsys.readouterr()
    assert out == "" and err == f"titan-rocm {command}: interrupted\n"


def test_a_real_sigint_midway(tmp_path: Path) -> None:
    """SIGINT while gemm-tables judges a large table (pure Python: the signal lands
    between bytecodes): one line, exit 130, nothing written, no traceback.

    The child says when it is midway (tests/support/paused_reader.py: a file it creates
    after row 10,000 of 20,000, where its read waits), so the signal lands mid-read however
    busy the machine is."""
    from tests.support.gemm_table_maker import make_table

    table = tmp_path / "big_bf16_tuned_gemm.csv"
    make_table(table, {("gfx950", "opus", "splitk"): 2_000, ("gfx950", "asm", "-"): 18_000})
    out_dir = tmp_path / "out"
    midway, row = tmp_path / "midway", 10_000
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.paused_reader", str(midway), str(row),
         "gemm-tables", "capture-safe", str(table), "-o", str(out_dir)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    until = time.monotonic() + 120
    while not midway.exists() and proc.poll() is None and time.monotonic() < until:
        time.sleep(0.01)  # polling for the child's own word, not hoping
    if not midway.exists():
        proc.kill()
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"the child never reached row {row} (exit {proc.returncode}): {err[-2000:]}")
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert err == "titan-rocm gemm-tables: interrupted; nothing written\n" and out == ""
    assert not out_dir.exists() or not any(out_dir.iterdir())


def test_plan_keeps_torchtitans_warnings_and_hands_on_the_rest(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without any other handler (a user's shell), TorchTitan's warnings are kept, each once,
    and every other warning is printed as Python prints it without a handler."""
    import logging
    import os

    from titan_rocm.cli import plan

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # no pytest handler: as in a user's shell

    def record(path: str, message: str) -> logging.LogRecord:
        return logging.LogRecord("x", logging.WARNING, path, 1, message, None, None)

    tt = f"{os.sep}site-packages{os.sep}torchtitan{os.sep}config{os.sep}manager.py"
    warned: list[str] = []
    with plan.torchtitan_warnings(warned):
        for r in (record(tt, "odd default"), record(tt, "odd default"),
                  record(f"{os.sep}titan_rocm{os.sep}log.py", "titan-rocm's own")):
            root.handle(r)
    assert warned == ["odd default"] and root.handlers == []
    assert capsys.readouterr().err == "titan-rocm's own\n"


def test_the_command_list_describes_the_audit_as_its_own_help_does() -> None:
    from titan_rocm.cli import _HELP
    from titan_rocm.cli.audit import HELP

    # The audit compares blocks, forward and backward, not parameters one by one.
    assert "block by block" in _HELP["audit"] and "block by block" in HELP
    assert "per parameter" not in _HELP["audit"]
