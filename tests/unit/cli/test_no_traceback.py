"""Odd input ends in one sentence and exit 2, never a traceback, and nothing is lost: deeply
nested or huge TOML (plan, tune collect), an output that cannot be written (checked before the
training step), tune collect on a machine without a GPU, 0.3.0's flags under 0.2.2, a truncated
or huge AMDGCN file (scan)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from titan_rocm.adapters.tt022.job_args import MAX_TOML_BYTES
from titan_rocm.cli import main

REPO = Path(__file__).resolve().parents[3]
CORPUS = REPO / "tests" / "corpus" / "amdgcn"

DEEP = {
    "array": "x = " + "[" * 5000 + "]" * 5000 + "\n",
    "inline table": "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n",
    "mixed": "[job]\nx = " + "[{a = " * 1500 + "1" + "}]" * 1500 + "\n",
}


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_plan_refuses_deeply_nested_toml(kind: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(DEEP[kind])
    assert main(["plan", "--job.config_file", str(path)]) == 2
    err = capsys.readouterr().err
    assert "nested deeper than TOML readers accept" in err and "Traceback" not in err


def test_plan_refuses_a_huge_toml_before_reading_it(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "comments.toml"
    with path.open("w") as f:
        line = "# a comment\n" * 4096
        while f.tell() <= MAX_TOML_BYTES:
            f.write(line)
    assert main(["plan", "--job.config_file", str(path)]) == 2
    assert "accepted: a TOML file of at most 16 MiB" in capsys.readouterr().err


def test_plan_on_0_2_2_names_0_3_0s_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--module", "llama3", "--config=llama3_debugmodel"]) == 2
    err = capsys.readouterr().err
    assert "--config and --module are TorchTitan 0.3.0's flags" in err
    assert "--job.config_file FILE" in err


def _collect(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "titan_rocm.cli", "tune", "collect", *args],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_tune_collect_refuses_bad_input_before_the_training_step(tmp_path: Path) -> None:
    config = tmp_path / "job.toml"
    config.write_text('[model]\nname = "llama3"\n')
    (tmp_path / "dir").mkdir()
    deep = tmp_path / "deep.toml"
    deep.write_text(DEEP["array"])
    cases = [
        (["-o", "dir", "--job.config_file", str(config)], "is a directory, not a regular file"),
        (["-o", "nowhere/p.jsonl", "--job.config_file", str(config)], "does not exist"),
        (["-o", "/proc/p.jsonl", "--job.config_file", str(config)], "cannot write there"),
        (["-o", str(config), "--job.config_file", str(config)], "(the same file)"),
        (["-o", "p.jsonl", "--job.config_file", str(deep)], "nested deeper"),
        (["-o", "p.jsonl", "--module", "llama3", "--config", "llama3_debugmodel"],
         "--module is TorchTitan 0.3.0's; torchtitan 0.2.2 is installed: collect a 0.2.2 job "
         "with --job.config_file X.toml"),
        (["-o", "p.jsonl", "--trainer", "no_colon", "--job.config_file",
          str(REPO / "configs" / "llama3_debug.toml")], "--trainer 'no_colon' is not MODULE:CLASS"),
    ]
    for args, said in cases:
        done = _collect(tmp_path, *args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr[-2000:])
        assert "Traceback" not in done.stderr
    assert config.read_text() == '[model]\nname = "llama3"\n'


def test_tune_collect_without_a_gpu_names_the_trainer_flag(tmp_path: Path) -> None:
    """TorchTitan's own trainer needs CUDA/ROCm: on a CPU machine collect says so in one
    sentence (and how to go on) before TorchTitan loads, instead of its set_device traceback."""
    import torch

    if torch.accelerator.is_available():
        pytest.skip("this machine has a GPU: TorchTitan's trainer can run here")
    done = _collect(tmp_path, "-o", "p.jsonl", "--job.config_file",
                    str(REPO / "configs" / "llama3_debug.toml"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "this machine has no GPU" in done.stderr and "--trainer MODULE:CLASS" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "p.jsonl").exists()
    assert "torchtitan version" not in done.stdout + done.stderr  # refused before it loads


def test_tune_collects_parser_box_names_a_command_that_exists(tmp_path: Path) -> None:
    """TorchTitan's parser (tyro) ends its box with "For full helptext, run PROG --help":
    PROG is the command that ran, never the titan-rocm-tune-collect that does not exist; the
    sentence after it names the command that lists TorchTitan's flags."""
    done = _collect(tmp_path, "-o", "p.jsonl", "--trainer", "tests.support.tune_trainer:X",
                    "--job.config_file", str(REPO / "configs" / "llama3_debug.toml"),
                    "--training.no_such_flag", "1")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "For full helptext, run titan-rocm tune collect --help" in done.stderr
    assert "titan-rocm-tune-collect" not in done.stderr
    assert "titan-rocm plan --help-torchtitan lists every TorchTitan and --rocm.* flag" in \
        done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "p.jsonl").exists()


def test_scan_says_a_file_ends_before_its_kernel(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    whole = (CORPUS / "matmul-gfx942-nobuf.amdgcn").read_bytes()
    cut = tmp_path / "cut.amdgcn"
    cut.write_bytes(whole[: len(whole) // 3])
    assert main(["scan", str(cut)]) == 0
    out, err = capsys.readouterr()
    assert f"{cut} ends before its kernel matmul does" in err
    assert "1 file(s) end before their kernel does" in out
    assert main(["scan", str(CORPUS / "matmul-gfx942-nobuf.amdgcn")]) == 0
    assert "ends before" not in "".join(capsys.readouterr())


def test_scan_refuses_a_file_larger_than_it_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from titan_rocm.cli import scan

    monkeypatch.setattr(scan, "MAX_FILE_BYTES", 1 << 10)
    big = CORPUS / "matmul-gfx942-nobuf.amdgcn"
    assert main(["scan", str(big)]) == 2
    assert "not scanned: " in capsys.readouterr().err
