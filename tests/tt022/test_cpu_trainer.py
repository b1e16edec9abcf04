"""``titan-rocm audit --trainer cpu`` / ``cpu-tiny`` (titan_rocm/adapters/tt022/cpu_trainer.py):
the first builds the config's own model on the CPU, the second its architecture cut small."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchtitan")

ROOT = Path(__file__).resolve().parents[2]

ARGS = ["--job.config_file", "configs/llama3_debug.toml", "--job.custom_config_module",
        "titan_rocm.config", "--training.local_batch_size", "2", "--training.seq_len", "16",
        "--checkpoint.no-enable", "--activation_checkpoint.mode", "none"]


def _build(cls: type, monkeypatch: pytest.MonkeyPatch) -> Any:
    from torchtitan.config import ConfigManager

    from titan_rocm.adapters.tt022 import cpu_trainer

    cpu_trainer.cpu_patches(monkeypatch.setattr)
    monkeypatch.setattr(cls, "patch_for_cpu", False)
    return cls(ConfigManager().parse_args(ARGS))


def test_cpu_keeps_the_configs_model_and_cpu_tiny_cuts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from torchtitan.protocols.train_spec import get_train_spec

    from titan_rocm.adapters.tt022.cpu_trainer import TINY, CpuTrainer, TinyCpuTrainer

    stock = get_train_spec("llama3").model_args["debugmodel"]
    own = _build(CpuTrainer, monkeypatch)
    own.close()  # the job's teardown: its workarounds' patches put back
    assert (own.model_args.dim, own.model_args.n_layers, own.model_args.vocab_size) == (
        stock.dim, stock.n_layers, stock.vocab_size)
    assert len(own.model_parts[0].layers) == stock.n_layers
    input_dict, labels = next(iter(own.dataloader))
    assert input_dict["input"].shape == (2, 16) and int(labels.max()) < stock.vocab_size
    tiny = _build(TinyCpuTrainer, monkeypatch)
    tiny.close()
    assert (tiny.model_args.dim, len(tiny.model_parts[0].layers)) == (TINY["dim"],
                                                                      TINY["n_layers"])
    assert stock.dim != TINY["dim"]  # the two are told apart


_MEASURED = re.compile(r"\d+\.\d+e[-+]\d+|\b\d\.\d{2,}\b|\b\d{2,}\.\d+\b")
"""A measured number (``5.03e-08``, ``0.153``, ``6.16``), not a setting (``1.2 x``, ``64``):
the last digits of a CPU's float32 rounding can differ from one CPU to another."""


def _shape(lines: list[str]) -> list[str]:
    return [_MEASURED.sub("N", line.rstrip()) for line in lines
            if line.strip() and not line.startswith("  time:")]


@pytest.mark.slow
def test_the_docs_example_report_is_what_its_command_prints() -> None:
    """docs/numerics-audit.md's example report and the command above it: the same verdicts,
    segments, tensors, multipliers and wording, measured numbers aside."""
    docs = (ROOT / "docs" / "numerics-audit.md").read_text()
    command = re.search(r"```bash\n(TITAN_ROCM_DEBUG_CORRUPT=\S+) titan-rocm audit \\\n"
                        r"\s+(.+?) \\\n\s+(.+?)\s+#", docs)
    assert command, "the example's command moved"
    env_var, value = command.group(1).split("=", 1)
    args = [*command.group(2).split(), *command.group(3).split()]
    report = re.search(r"## Reading the report\n\n```\n(.+?)```", docs, re.S).group(1)
    done = subprocess.run([sys.executable, "-m", "titan_rocm.cli", "audit", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, env_var: value})
    assert done.returncode == 1, done.stderr[-2000:]
    assert _shape(done.stdout.splitlines()) == _shape(report.splitlines())
