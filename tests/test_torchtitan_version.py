"""Which TorchTitan is installed, from package metadata; the sentence for the wrong entry point."""

from __future__ import annotations

import sys

import pytest

from titan_rocm import torchtitan_version
from titan_rocm.torchtitan_version import TorchTitanVersionError, require, series


@pytest.mark.parametrize(
    ("version", "expected"),
    [("0.2.2", "0.2"), ("0.3.0", "0.3"), ("0.3.1.dev20261001+cu130", "0.3"), ("nightly", None)],
)
def test_series_is_major_minor(version, expected):
    assert series(version) == expected


def test_require_returns_the_version_of_the_right_line():
    assert require("0.2", "x", version="0.2.2") == "0.2.2"
    assert require("0.3", "x", version="0.3.0") == "0.3.0"


def test_the_0_3_entry_on_0_2_names_both_versions_and_the_converters():
    with pytest.raises(TorchTitanVersionError) as info:
        require("0.3", "titan_rocm.torchtitan", version="0.2.2")
    text = str(info.value)
    assert text.startswith("titan_rocm.torchtitan is for TorchTitan 0.3.x, but torchtitan 0.2.2")
    assert 'converters = ["rocm"]' in text


def test_the_0_2_entry_on_0_3_names_the_trainer_adapter():
    with pytest.raises(TorchTitanVersionError) as info:
        require("0.2", "python -m titan_rocm.train", version="0.3.0")
    assert "but torchtitan 0.3.0 is installed" in str(info.value)
    assert "--module titan_rocm.torchtitan.configs" in str(info.value)


def test_an_unknown_line_or_none_installed_says_what_to_install(monkeypatch):
    with pytest.raises(TorchTitanVersionError, match="0.9.0 is installed; install torchtitan 0.2"):
        require("0.2", "x", version="0.9.0")
    monkeypatch.setattr(torchtitan_version, "installed", lambda: None)
    with pytest.raises(TorchTitanVersionError, match="no torchtitan is installed"):
        require("0.3", "x")


def test_detection_never_imports_torchtitan():
    # Run in a fresh interpreter: this test process may have imported TorchTitan already.
    import subprocess

    code = (
        "import sys, titan_rocm.torchtitan_version as v; v.series(); "
        "print(any(m == 'torchtitan' or m.startswith('torchtitan.') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_launcher_on_the_wrong_torchtitan_exits_2_with_the_sentence(monkeypatch, capsys):
    from titan_rocm import train

    monkeypatch.setattr(torchtitan_version, "installed", lambda: "0.3.0")
    with pytest.raises(SystemExit) as info:
        train.main(["--job.config_file", "configs/deepseek_v3_debug.toml"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("titan-rocm: python -m titan_rocm.train is for TorchTitan 0.2.x")


def test_the_0_3_adapter_on_0_2_raises_the_sentence_at_import():
    import subprocess

    code = "import titan_rocm.torchtitan"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("titan_rocm.torchtitan_version.TorchTitanVersionError: "
                           "titan_rocm.torchtitan (the TorchTitan 0.3.0 adapter) is for "
                           "TorchTitan 0.3.x, but torchtitan 0.2.2 is installed")
