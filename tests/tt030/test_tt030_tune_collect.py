"""``titan-rocm tune collect`` on TorchTitan 0.3.0 (docs/validated-tuning.md): the job named
as 0.3.0 names it (``--module M --config F``), collected from 0.3.0's own trainer on CPU
(tests/tt030/tt030_harness.py), then ``tune run``, ``tune table`` and ``titan-rocm plan
--tune-problems`` read the file as they read 0.2.2's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from titan_rocm.adapters.tt030.job import OVERRIDE_ENTRY
from titan_rocm.tuned_gemms import problems

TT030 = Path(__file__).parent
REPO = TT030.parents[1]
JOB = ["--module", "tt030_tune_job"]
TOKENS = 2 * 128
"""The harness's batch: 2 samples of 128 tokens (tt030_harness.cpu_config)."""


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=f"{REPO}:{TT030}",
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-cache"))
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                "LOCAL_WORLD_SIZE"):
        env.pop(key, None)  # a one-process run of its own, never an earlier test's rendezvous
    return env


def _titan_rocm(tmp_path: Path, *args: str, cpu_trainer: bool = True,
                timeout: int = 600) -> subprocess.CompletedProcess:
    """``titan-rocm ARGS`` in its own process, in ``tmp_path``; with ``cpu_trainer``, where
    0.3.0's trainer runs on CPU (tt030_cli_main.py), else as a user on this machine runs it."""
    head = [str(TT030 / "tt030_cli_main.py")] if cpu_trainer else ["-m", "titan_rocm.cli"]
    return subprocess.run([sys.executable, *head, *args], env=_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)


def _transposed(spec: Any) -> bool:
    """A 2-D matrix stored column-major (a ``.t()`` view of a row-major one)."""
    return spec.stride[0] == 1 and spec.shape[0] > 1


def _collect(tmp_path: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return _titan_rocm(tmp_path, "tune", "collect", "-o", str(out), *args)


@pytest.mark.slow
def test_a_0_3_0_jobs_problems_are_tuned_and_its_table_covers_them(tmp_path: Path) -> None:
    """rocm(cfg) job: one step of 0.3.0's trainer records llama3's GEMMs (forward, input and
    weight gradients), with the required table never read; tune run and tune table take the
    file as 0.2.2's; plan of the same job with the table covers every problem, job unchanged."""
    out = tmp_path / "problems.jsonl"
    done = _collect(tmp_path, out, *JOB, "--config", "llama3_rocm")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["output"] == str(out)
    found = problems.read(out)
    job = found.job
    assert (job["model"], job["flavor"], job["world_size"]) == ("llama3", "debugmodel", 1)
    assert (job["module"], job["config"]) == ("tt030_tune_job", "llama3_rocm")
    assert job["config_file"] == "--module tt030_tune_job --config llama3_rocm"
    assert found.settings["gemm_lookup"] == "off"  # the step never uses a table
    assert found.settings["gemm_lookup_table"] == "no-such-table.json"
    assert {p.op for p in found.problems} == {"mm"}
    # A linear's three GEMMs, told apart by their layouts: forward x @ W.T (W.T a transposed
    # view), input gradient g @ W (both row-major), weight gradient g.T @ x (g.T transposed);
    # the tokens (batch 2 x 128) are the rows of the first two and the reduction of the third.
    kinds: dict[str, list[Any]] = {"forward": [], "input_grad": [], "weight_grad": []}
    for p in found.problems:
        a, b = p.args
        kind = ("weight_grad" if _transposed(a) else
                "forward" if _transposed(b) else "input_grad")
        kinds[kind].append(p)
        assert (a.shape[1] if kind == "weight_grad" else a.shape[0]) == TOKENS, p.key
    assert all(len(found) >= 2 for found in kinds.values()), \
        {k: [p.key for p in v] for k, v in kinds.items()}
    assert sum(p.count for p in found.problems) > len(found.problems)  # the blocks share some
    assert all(t.uid == "aten::mm" for p in found.problems for c in p.calls for t in c.templates)
    assert not list(tmp_path.rglob("checkpoint"))

    results, table = tmp_path / "results.jsonl", tmp_path / "gemm_lookup.json"
    done = _titan_rocm(tmp_path, "tune", "run", str(out), "-o", str(results), "--backends",
                       "ATEN", "--timeout", "30", "--json", cpu_trainer=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["problems"] == len(found.problems)
    done = _titan_rocm(tmp_path, "tune", "table", str(results), "-o", str(table), "--check",
                       cpu_trainer=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])

    done = _titan_rocm(tmp_path, "plan", *JOB, "--config", "llama3_rocm", "--json",
                       "--rocm.gemm_lookup", "auto", "--rocm.gemm_lookup_table", str(table),
                       "--tune-problems", str(out), cpu_trainer=False)
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads(done.stdout)
    decision = next(d for d in plan["workarounds"] if d["workaround"] == "gemm_lookup")
    coverage = decision["details"]["coverage"]
    assert coverage["job_differs"] == [], coverage
    assert "is not this job's" not in done.stderr
    assert coverage["covered"] == coverage["problems"] == len(found.problems), coverage


@pytest.mark.slow
def test_a_job_with_the_override_entry_is_collected_with_its_settings(tmp_path: Path) -> None:
    """A stock trainer with titan-rocm through --override.imports: its JSON settings are the
    file's, gemm_lookup (on in the entry, with no table) off for the step."""
    out = tmp_path / "problems.jsonl"
    done = _collect(tmp_path, out, *JOB, "--config", "llama3_override")
    assert done.returncode == 0, done.stderr[-3000:]
    found = problems.read(out)
    assert found.settings["gemm_lookup"] == "off"
    assert found.settings["moe_eager_compile"] == "off"
    assert found.job["config"] == "llama3_override" and len(found.problems) >= 6


@pytest.mark.parametrize("args,sentence", [
    (["--job.config_file", "job.toml"], "--job.config_file is TorchTitan 0.2.2's; torchtitan "
     "0.3.0 is installed: collect a 0.3.0 job with --module M --config F"),
    ([*JOB, "--config", "llama3_rocm", "--trainer", "a:B"], "--trainer 'a:B' is TorchTitan "
     "0.2.2's; on 0.3.0 the config function's Trainer.Config builds its own trainer"),
    (["--training.steps", "2"], "name the job to collect: --module M --config F"),
    ([*JOB, "--config", "llama3_stock"], "titan-rocm is not attached to this job, so its "
     "training never reads [rocm] gemm_lookup_table"),
    ([*JOB, "--config", "llama3_rocm", "--compile.no-enable"], "compile.enable is false (or "
     "'model' is not in compile.components): the job compiles no GEMM, there is nothing to "
     "tune"),
    ([*JOB, "--config", "no_such_config"], "'no_such_config'"),  # TorchTitan's sentence
])
def test_bad_input_exits_2_with_one_sentence_before_the_step(
        tmp_path: Path, args: list[str], sentence: str) -> None:
    out = tmp_path / "problems.jsonl"
    done = _collect(tmp_path, out, *args)
    assert done.returncode == 2, (done.stdout[-1000:], done.stderr[-2000:])
    said = [line for line in done.stderr.splitlines() if line.startswith("titan-rocm tune: ")]
    assert len(said) == 1 and sentence in said[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not out.exists()
    assert "step:" not in done.stderr  # no training step ran


def test_tyros_box_names_a_command_that_exists(tmp_path: Path) -> None:
    """TorchTitan's parser (tyro) ends its box with "For full helptext, run PROG --help":
    PROG is a titan-rocm command, never the titan-rocm-tune-collect that does not exist."""
    done = _collect(tmp_path, tmp_path / "p.jsonl", *JOB, "--config", "llama3_rocm",
                    "--training.no_such_flag", "1")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "For full helptext, run titan-rocm plan --help" in done.stderr, done.stderr[-2000:]
    assert "titan-rocm-tune-collect" not in done.stderr
    assert "--help-torchtitan lists this job's flags" in done.stderr


def test_without_a_device_it_says_so_before_torchtitan_loads(tmp_path: Path) -> None:
    """Outside the CPU harness TorchTitan 0.3.0 would take "cuda" on this machine and fail in
    Trainer.__init__: collect refuses in one sentence first."""
    import torch

    if torch.accelerator.is_available():
        pytest.skip("this machine has a GPU: TorchTitan 0.3.0's trainer can run here")
    done = _titan_rocm(tmp_path, "tune", "collect", "-o", "p.jsonl", "--module",
                       "titan_rocm.torchtitan.configs", "--config", "llama3_debugmodel",
                       cpu_trainer=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert ("titan-rocm tune: this machine has no GPU (torch sees no accelerator), and "
            "TorchTitan 0.3.0's trainer trains on CUDA/ROCm: run tune collect on a GPU node "
            "of the cluster") in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "p.jsonl").exists()


def test_one_step_turns_the_table_off_wherever_the_settings_come_from() -> None:
    """rocm(cfg)'s field, or the override entry's JSON (other entries left as they are)."""
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from titan_rocm.adapters.tt030 import rocm
    from titan_rocm.adapters.tt030.tune import one_step
    from titan_rocm.settings import RocmSettings

    config: Any = rocm(llama3_debugmodel(), gemm_lookup="on", gemm_lookup_table="t.json")
    step = one_step(config, config.rocm)
    assert config.rocm == step and step.gemm_lookup == "off" and step.gemm_lookup_table == "t.json"
    assert config.training.steps == 1 and not config.checkpoint.enable

    stock: Any = llama3_debugmodel()
    stock.override.imports = ["other.module.fn", (OVERRIDE_ENTRY, {"moe_eager_compile": "off"})]
    step = one_step(stock, RocmSettings(moe_eager_compile="off"))
    assert stock.override.imports == [
        "other.module.fn", (OVERRIDE_ENTRY, {"moe_eager_compile": "off", "gemm_lookup": "off"})]
    assert step.gemm_lookup == "off" and step.moe_eager_compile == "off"
