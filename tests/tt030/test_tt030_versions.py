"""With TorchTitan 0.3.0 installed, titan-rocm's 0.2.2 registration stays idle and says so."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_import_titan_rocm_arms_no_converter_hook_on_0_3():
    # A fresh interpreter: whether the hook is armed is decided at `import titan_rocm`.
    code = (
        "import sys, titan_rocm; from titan_rocm.adapters.tt022 import registration as r; "
        "print(r._hook.waiting, r._registered)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_registering_the_0_2_converters_on_0_3_raises_the_sentence():
    from titan_rocm import register_converters
    from titan_rocm.torchtitan_version import TorchTitanVersionError

    with pytest.raises(TorchTitanVersionError) as info:
        register_converters()
    text = str(info.value)
    assert "is for TorchTitan 0.2.x, but torchtitan 0.3.0 is installed" in text
    assert "--module titan_rocm.torchtitan.configs" in text


def test_the_0_2_launcher_on_0_3_exits_2_before_touching_torchtitan():
    out = subprocess.run(
        [sys.executable, "-m", "titan_rocm.train", "--job.config_file", "x.toml"],
        capture_output=True, text=True,
    )
    assert out.returncode == 2
    assert "python -m titan_rocm.train is for TorchTitan 0.2.x" in out.stderr
    assert "Traceback" not in out.stderr
