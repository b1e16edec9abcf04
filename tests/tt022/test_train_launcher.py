"""python -m titan_rocm.train: TorchTitan's own entry point, with titan-rocm set up first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "titan_rocm.train", *args],
        capture_output=True, text=True, timeout=180, cwd=REPO,
    )


@pytest.mark.slow
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

    from titan_rocm.adapters.tt022.train import main

    with pytest.raises(RuntimeError, match="before torchtitan.config is imported"):
        main(["--job.config_file", str(REPO / "configs" / "llama3_debug.toml")])


# --- one process without torchrun ------------------------------------------------------------

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "GROUP_RANK", "ROLE_RANK")


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}


@pytest.mark.slow
def test_single_process_trains_with_torchtitans_real_trainer() -> None:
    # The README's command, on CPU (tests/support/cpu_single_process.py points TorchTitan's device
    # at the CPU and changes nothing else): TorchTitan reads LOCAL_RANK, builds a gloo
    # process group from MASTER_ADDR/MASTER_PORT, and trains.
    out = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "cpu_single_process.py"),
         "--job.config_file", "configs/llama3_debug.toml", "--training.steps", "2",
         "--compile.no-enable", "--training.seq_len", "64", "--training.local_batch_size", "2",
         "--checkpoint.no-enable", "--metrics.log_freq", "1"],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=_plain_env(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "one process (RANK=0, WORLD_SIZE=1, MASTER_PORT=" in out.stderr
    assert re.search(r"step:\s+2\s+loss:", out.stdout) and "Training completed" in out.stdout


def test_single_process_environment_is_torchruns_for_one_worker() -> None:
    from titan_rocm.adapters.common import single_process_environment

    env: dict[str, str] = {"PATH": "/bin"}
    added = single_process_environment(env)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                 "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                                 "ROLE_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1"}
    assert set(added) == set(env) - {"PATH"}
    assert env["MASTER_PORT"] == "0"  # the store's own bind picks the port: nothing to race


def test_single_process_environment_keeps_what_is_set() -> None:
    from titan_rocm.adapters.common import LaunchError, single_process_environment

    torchrun = {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "MASTER_PORT": "29500"}
    env = dict(torchrun)
    assert single_process_environment(env) == {} and env == torchrun
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29511"}
    added = single_process_environment(env)
    assert "MASTER_PORT" not in added and env["MASTER_ADDR"] == "10.0.0.1"
    for partial in ({"RANK": "0"}, {"WORLD_SIZE": "8"}, {"RANK": "1", "WORLD_SIZE": "8"}):
        with pytest.raises(LaunchError, match="start the job with torchrun"):
            single_process_environment(dict(partial))


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--job.config_file", "BINARY"], {}, "not a TOML file (byte"),
        (["--job.config_file", str(REPO / "configs" / "llama3_debug.toml"),
          "--rocm.triton_war_strict", "true"], {},
         "write --rocm.triton_war_strict for true, --rocm.no-triton_war_strict for false"),
        (["--job.config_file", str(REPO / "configs" / "llama3_debug.toml")], {"WORLD_SIZE": "8"},
         "WORLD_SIZE=8 set but RANK, LOCAL_RANK not: start the job with torchrun"),
    ],
    ids=["binary-toml", "bool-with-value", "partial-torchrun-env"],
)
def test_launcher_refuses_bad_input_in_one_line(
    args: list[str], env: dict[str, str], message: str, tmp_path: Path
) -> None:
    binary = tmp_path / "job.toml"
    binary.write_bytes(bytes(range(256)))
    args = [str(binary) if a == "BINARY" else a for a in args]
    out = subprocess.run([sys.executable, "-m", "titan_rocm.train", *args], capture_output=True,
                         text=True, timeout=180, cwd=REPO, env={**_plain_env(), **env})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("titan-rocm: ") and message in lines[0]


def test_ctrl_c_in_the_launcher_prints_one_line_and_exits_130() -> None:
    code = (
        "import titan_rocm.train as t\n"
        "def interrupted(*args, **kwargs):\n    raise KeyboardInterrupt\n"
        "t.runpy.run_module = interrupted\n"
        "t.main(['--job.config_file', 'configs/llama3_debug.toml'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180, cwd=REPO, env=_plain_env())
    assert out.returncode == 130
    assert out.stderr.strip().splitlines()[-1] == "titan-rocm: interrupted"
    assert "Traceback" not in out.stderr
