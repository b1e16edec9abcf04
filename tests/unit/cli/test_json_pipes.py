"""Every ``--json`` command prints one JSON object on every exit path, and a closed pipe ends
quietly (issue 25, item 4): both kept once, in ``titan_rocm.cli.main``."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from titan_rocm.cli import BROKEN_PIPE, INTERRUPTED, JSON_SCHEMA, SUBCOMMANDS, main

REPO = Path(__file__).resolve().parents[3]
LOG = "tests/fixtures/logs/tt_cpu_clean.log"

# One refusal per subcommand, each of a class the command has: a bad value, a missing file,
# too few inputs. Every one must still answer in JSON.
ERRORS: dict[str, list[list[str]]] = {
    "plan": [["--world-size", "0", "--job.config_file", "configs/llama3_debug.toml"],
             ["--job.config_file", "nope.toml"],
             []],
    "scan": [["/nope"]],
    "check-log": [["/nope.log"], ["--format", "nope", LOG]],
    "bench-summary": [["/nope.log"], ["--warmup", "-1", LOG]],
    "compare": [[LOG], [LOG, "/nope.log"], [LOG, LOG, "--plot", "x.gif"]],
    "gemm-tables": [["capture-safe", "/nope.csv", "--check"], ["capture-safe"]],
    "audit": [["--tokens", "0", "--job.config_file", "configs/llama3_debug.toml"],
              ["--job.config_file", "nope.toml"], ["--plot"]],
    "tune": [["table", "/nope.jsonl", "--check"], ["table", "r.jsonl"],
             ["run", "/nope.jsonl", "-o", "r.jsonl", "--timeout", "0"]],
}

AUDIT_SCHEMA = 2
"""The audit's error object is its report with every key empty (numerics/result.py's
``error_dict``), under the report's schema; every other command's is the shared envelope."""
AUDIT_KEYS = {"verdict", "world_size", "tokens", "tensors", "segments", "first_wrong"}


def test_every_command_has_error_cases() -> None:
    assert set(ERRORS) == set(SUBCOMMANDS)


def _one_object(out: str) -> dict:
    """stdout is exactly one JSON object (json.loads refuses trailing text)."""
    value = json.loads(out)
    assert isinstance(value, dict), out
    return value


@pytest.mark.parametrize(("command", "argv"),
                         [(c, a) for c, cases in ERRORS.items() for a in cases],
                         ids=lambda x: x if isinstance(x, str) else " ".join(x) or "no-args")
def test_an_error_under_json_is_one_json_object(command: str, argv: list[str],
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.chdir(REPO)
    code = main([command, *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    report = _one_object(out)
    assert report["exit_code"] == code
    assert "Traceback" not in err
    if "error" in report:  # the shared envelope; commands with their own report keep it
        schema = AUDIT_SCHEMA if command == "audit" else JSON_SCHEMA
        assert report["command"] == command and report["schema"] == schema and report["error"]
        assert report["error"] in err, "the same sentence is on stderr"
    if command == "audit":  # bad flags too: the audit's keys, as when it cannot run
        assert AUDIT_KEYS <= set(report) and report["verdict"] == "error", report


def test_ctrl_c_under_json_is_one_json_object(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(SUBCOMMANDS["check-log"])

    def interrupted(_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "run", interrupted)
    assert main(["check-log", "--json", LOG]) == INTERRUPTED
    out, err = capsys.readouterr()
    assert _one_object(out) == {"schema": 1, "command": "check-log", "exit_code": 130,
                                "error": "interrupted"}
    assert err == "titan-rocm check-log: interrupted\n"


def test_without_json_an_error_prints_nothing_on_stdout(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "table", "/nope.jsonl", "--check"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "titan-rocm tune: /nope.jsonl: no such file\n"


@pytest.mark.parametrize("command", [
    ["check-log", *[LOG] * 3000],
    ["check-log", "--json", *[LOG] * 3000],
], ids=["check-log", "check-log --json"])
def test_a_closed_pipe_ends_quietly(command: list[str]) -> None:
    """``titan-rocm check-log *.log | head -1``: the reader leaves after one line; the command
    ends with 141 (128 + SIGPIPE) and says nothing, no BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "titan_rocm.cli", *command], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()  # as head -1 does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == BROKEN_PIPE, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
