"""``titan-rocm tune collect`` under TorchTitan 0.3.0: its flags and trainer are 0.2.x's, so
it refuses in one sentence naming what is installed, before anything runs."""

from __future__ import annotations

from titan_rocm.cli import main


def test_tune_collect_says_it_needs_torchtitan_0_2(capsys, tmp_path) -> None:
    import torchtitan.config.manager  # noqa: F401 - as in the whole suite: the sentence first

    out = tmp_path / "problems.json"
    code = main(["tune", "collect", "-o", str(out), "--trainer",
                 "tests.support.cpu_trainer:CpuTrainer", "--job.config_file",
                 "configs/llama3_debug.toml"])
    err = capsys.readouterr().err
    assert code == 2
    assert ("tune collect is for TorchTitan 0.2.x, but torchtitan 0.3.0 is installed; run it "
            "in an environment with torchtitan 0.2.2") in err
    assert "Traceback" not in err
    assert not out.exists()
