"""python -m titan_rocm.train: TorchTitan's own entry point, with titan-rocm set up first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "titan_rocm.train", *args],
        capture_output=True, text=True, timeout=180, cwd=REPO,
    )


def test_help_reaches_torchtitan_with_rocm_flags() -> None:
    out = _launch("--help")
    assert out.returncode == 0, out.stderr
    # tyro's help lists TorchTitan's own sections and, merged in, titan-rocm's.
    assert "--model.converters" in out.stdout
    assert "--rocm.triton-war" in out.stdout or "--rocm.triton_war" in out.stdout


def test_bad_rocm_value_fails_before_training(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[rocm]\ndivergence_check = "hourly"\n')
    out = _launch("--job.config_file", str(bad))
    assert out.returncode == 2
    assert "divergence_check = 'hourly' is not valid; accepted: log_steps, every_step" in out.stderr


def test_main_refuses_after_torchtitan_config_import() -> None:
    import torchtitan.config.manager  # noqa: F401

    from titan_rocm.train import main

    with pytest.raises(RuntimeError, match="before torchtitan.config is imported"):
        main(["--job.config_file", str(REPO / "configs" / "llama3_debug.toml")])
