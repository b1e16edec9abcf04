"""``titan-rocm plan --module M --config F`` on TorchTitan 0.3.0: whatever the user's config
module does wrong ends in one sentence and exit 2, never a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from titan_rocm.cli import main

MODULES = {
    "syntax": ("def job(:\n    pass\n", "the module does not compile: "),
    "forty_two": ("def job():\n    return 42\n", "the config function returned 42 (int); "
                  "accepted: a Trainer.Config"),
    "recurses": ("def job():\n    return job()\n", "recursed without end"),
    "exits": ("import sys\n\ndef job():\n    sys.exit(0)\n", "called sys.exit(0) instead of "
              "returning a config"),
    "raises": ("def job():\n    raise KeyError('lr')\n",
               "the config function raised KeyError: 'lr'"),
    "exits_on_import": ("import sys\nsys.exit(3)\n", "called sys.exit(3)"),
    # The user's own ValueError is not one of TorchTitan's messages: module, function, class.
    "raises_value": ("def job():\n    raise ValueError('config function blew up')\n",
                     "the config function raised ValueError: config function blew up"),
    # An import inside the module fails: the real error, not "cannot import module".
    "imports_missing": ("import no_such_package_xyz\n\ndef job():\n    pass\n",
                        "importing robust_cfg_imports_missing failed with "
                        "ModuleNotFoundError: No module named 'no_such_package_xyz'; install "
                        "what it names or fix that import"),
    "not_a_function": ("job = 3\n\ndef other():\n    pass\n",
                       "robust_cfg_not_a_function.job is int 3, not a function; accepted: a "
                       "config function of robust_cfg_not_a_function (other)"),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_broken_config_module_is_one_sentence(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    source, said = MODULES[name]
    module = f"robust_cfg_{name}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    assert main(["plan", "--module", module, "--config", "job"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
    assert err.startswith(f"titan-rocm plan: --module {module} --config job: ")


@pytest.mark.parametrize("flags", [["--module", "", "--config", "x"],
                                   ["--module=", "--config", "x"],
                                   ["--module", "llama3", "--config", " "]])
def test_an_empty_module_or_config_names_what_is_accepted(
        flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *flags]) == 2
    err = capsys.readouterr().err
    assert "is not valid; accepted: " in err and "package" not in err, err
