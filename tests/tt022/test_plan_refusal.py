"""``titan-rocm plan`` refuses a bad flag or file before torch loads (issue 25, item 2), and
without a job prints its usage (item 1). The speed itself is benchmarks/plan_refusal_time.py's;
here: the refusal path never imports torch, and the benchmark's cases and analysis are right."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import plan_refusal_time as bench
from titan_rocm.cli import main

REPO = Path(__file__).resolve().parents[2]
REFUSALS = {name: case for name, case in bench.CASES.items() if case[1] == 2}

PROBE = (
    "import json, sys; from titan_rocm.cli import main; code = main(sys.argv[1:]); "
    "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules, "
    "'torchtitan': 'torchtitan' in sys.modules}))"
)


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_a_refusal_never_imports_torch(name: str) -> None:
    args, expect = REFUSALS[name]
    proc = subprocess.run([sys.executable, "-c", PROBE, "plan", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result == {"code": expect, "torch": False, "torchtitan": False}, proc.stderr
    assert proc.stderr.strip() and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["--job.config_file", "nope.toml"], "--job.config_file 'nope.toml': no such file"),
    # A number out of range is argparse's (titan_rocm.numbers: usage, then the accepted range).
    (["--world-size", "0", "--job.config_file", "x.toml"],
     "argument --world-size: '0' is not valid; accepted: an integer >= 1 and <= 1048576"),
    (["--world-size", "8", "--nnodes", "2", "--nproc-per-node", "8", "--job.config_file",
      "x.toml"], "--world-size 8 disagrees with --nnodes 2 x --nproc-per-node 8 = 16"),
    (["--arch", "gfx9000", "--job.config_file", "x.toml"],
     "unknown AMD GPU architecture 'gfx9000'"),
    (["--tune-problems", "nope.jsonl", "--job.config_file", "configs/llama3_debug.toml"],
     "--tune-problems 'nope.jsonl': no such file"),
])
def test_each_early_refusal_gives_the_full_plans_reason(args, says, capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    assert main(["plan", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and says in err, err
    # One line, or argparse's usage and then one line that says it all.
    assert err.count("\n") == 1 or (err.startswith("usage:") and
                                     err.splitlines()[-1].endswith(says)), err


def test_no_job_prints_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: titan-rocm plan --job.config_file")
    assert "--module M --config F" in err
    assert err.rstrip().endswith("titan-rocm plan --help lists plan's own options, titan-rocm "
                                 "plan --help-torchtitan TorchTitan's")
    assert main(["plan", "--arch", "gfx942"]) == 2  # a machine but no job is no job either


def test_the_benchmark_times_every_refusal_against_the_full_plan() -> None:
    assert bench.CASES["full plan"][1] == 0 and len(REFUSALS) >= 5
    assert bench.command(["--x"])[-3:] == ["titan_rocm.cli", "plan", "--x"]
    figures = bench.analyse({"full plan": [10.0, 12.0, 11.0], "no job": [0.3, 0.2, 0.25],
                             "slow": [3.0]})
    assert figures["full plan"] == {"median_s": 11.0, "over_full_plan": 1.0, "met": None}
    assert figures["no job"] == {"median_s": 0.25, "over_full_plan": 0.0227, "met": True}
    assert figures["slow"]["met"] is False


def test_docs_quote_the_current_verdict(capsys, monkeypatch) -> None:
    """docs/plan.md's verdict block is what plan prints today for the command in its marker."""
    import re
    import shlex

    monkeypatch.chdir(REPO)
    doc = (REPO / "docs" / "plan.md").read_text()
    m = re.search(r"<!-- plan-verdict: (.*?) -->\n```\n(.*?)\n```", doc, re.S)
    assert m, "docs/plan.md lost its plan-verdict block"
    assert main(["plan", *shlex.split(m.group(1))]) == 0
    out = capsys.readouterr().out.splitlines()
    end = next(i for i, line in enumerate(out) if line.startswith("not simulated:"))
    assert "\n".join(out[:end + 1]) == m.group(2)
