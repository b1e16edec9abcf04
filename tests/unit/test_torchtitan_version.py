"""Which TorchTitan is installed, from the API its files have; the sentence for the wrong entry
point; stand-in TorchTitan packages of each shape, and one whose version string lies."""

from __future__ import annotations

import json
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
    monkeypatch.setattr(torchtitan_version, "_package_dir", lambda: None)
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
    from titan_rocm.adapters.tt022 import train

    monkeypatch.setattr(torchtitan_version, "detect",
                        lambda: torchtitan_version.Installed("0.3.0", "/stand-in", "0.3"))
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


# -- stand-in TorchTitan packages: detection reads their files, never imports them ----------

SHAPE_FILES = {
    "0.2": ("protocols/model_converter.py", "config/job_config.py"),
    "0.3": ("config/configurable.py", "trainer.py", "config/configs.py",
            "models/common/moe.py"),
}
FILE_TEXT = {"models/common/moe.py": "class GroupedExperts(Module):\n    pass\n"}
"""What 0.3.0 and main at b5bcd76c have where titan-rocm's seams look."""
FOLDED_CONFIGS = "class Training:\n    num_tokens_per_microbatch_per_dp_rank: int = 8\n"
"""A ``config/configs.py`` with #4121's field (pytorch/torchtitan b5bcd76c)."""


def stand_in(root, version: str, files=(), configs_text: str = "") -> str:
    """A ``torchtitan`` package at ``root`` (importing it raises) with ``files`` and the
    distribution metadata of ``version``; returns the directory to put on sys.path."""
    package = root / "torchtitan"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('stand-in imported')\n")
    for name in files:
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(FILE_TEXT.get(name, "") if name != "config/configs.py"
                                    else configs_text)
    info = root / f"torchtitan-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchtitan\nVersion: {version}\n")
    return str(root)


def detect_in(path: str, code: str) -> str:
    """Run ``code`` (with ``v`` = torchtitan_version) where ``path`` comes first on sys.path."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, os.environ.get("PYTHONPATH", "")])}
    script = ("import sys; import titan_rocm.torchtitan_version as v; " + code +
              "; assert not any(m.split('.')[0] == 'torchtitan' for m in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("shape", ["0.2", "0.3"])
def test_each_api_shape_is_detected_from_its_files(tmp_path, shape):
    path = stand_in(tmp_path, {"0.2": "0.2.2", "0.3": "0.3.0"}[shape], SHAPE_FILES[shape])
    assert detect_in(path, "print(v.detect().shape, v.series(), dict(v.detect().moved))") == \
        f"{shape} {shape} {{}}"


def test_a_version_string_that_lies_is_not_believed(tmp_path):
    # TorchTitan main: assets/version.txt says 0.2.2 (b5bcd76c), its API is 0.3's; its batch
    # folded into the tokens (#4121) is a variant, no moved seam.
    path = stand_in(tmp_path, "0.2.2", SHAPE_FILES["0.3"], FOLDED_CONFIGS)
    out = detect_in(path, (
        "i = v.detect(); print(i.shape); print(sorted(i.moved)); print(v.require('0.3', 'e'))\n"
        "try:\n    v.require('0.2', 'python -m titan_rocm.train')\n"
        "except v.TorchTitanVersionError as e:\n    print(e)"
    ).replace("; print(v.require", "\nprint(v.require"))
    shape, moved, version, sentence = out.splitlines()
    assert (shape, moved, version) == ("0.3", "[]", "0.2.2")
    assert sentence.startswith("python -m titan_rocm.train is for TorchTitan 0.2.x, but "
                               "torchtitan 0.2.2 (with TorchTitan 0.3's API) is installed; "
                               "with it, use the trainer adapter")


def test_main_s_folded_tokens_are_a_variant_of_the_0_3_shape(tmp_path):
    main = stand_in(tmp_path / "main", "0.2.2", SHAPE_FILES["0.3"], FOLDED_CONFIGS)
    release = stand_in(tmp_path / "release", "0.3.0", SHAPE_FILES["0.3"])
    code = "i = v.detect(); print(i.shape, i.variants, dict(i.moved))"
    assert detect_in(main, code) == "0.3 ('folded_tokens',) {}"
    assert detect_in(release, code) == "0.3 () {}"


# Each change main has not made at b5bcd76c, made in a stand-in: (the file it adds or
# empties, the workaround whose seam moves, the reason's words).
UNREAD = [
    ("models/common/attention/__init__.py", "", "mla_ck_backward",
     "this TorchTitan's attention is a package (torchtitan/models/common/attention/, "
     "pytorch/torchtitan #4164)"),
    ("models/common/moe.py", "class RoutedExperts(Module):\n    pass\n", "grouped_mm",
     "this TorchTitan's torchtitan/models/common/moe.py defines no GroupedExperts, the experts "
     "class titan-rocm's grouped-MM seam binds (pytorch/torchtitan #4539"),
]


@pytest.mark.parametrize(("path", "text", "workaround", "reason"), UNREAD)
def test_a_change_main_has_not_made_moves_that_seam_with_one_sentence(tmp_path, path, text,
                                                                     workaround, reason):
    root = stand_in(tmp_path, "0.2.2", SHAPE_FILES["0.3"], FOLDED_CONFIGS)
    changed = tmp_path / "torchtitan" / path
    changed.parent.mkdir(parents=True, exist_ok=True)
    changed.write_text(text)
    out = detect_in(root, "import json; i = v.detect(); print(i.variants); "
                          "print(json.dumps(dict(i.moved)))")
    variants, moved = out.splitlines()
    assert variants == "('folded_tokens',)"
    moved = json.loads(moved)
    assert list(moved) == [workaround] and moved[workaround].startswith(reason)
    assert moved[workaround].endswith("left as TorchTitan built them" if workaround ==
                                      "grouped_mm" else "left as TorchTitan built it")


def test_the_experts_marker_is_the_class_grouped_mm_binds():
    from titan_rocm.workarounds.grouped_mm.seams_tt030 import EXPERTS_CLASS

    experts = next(s for s in torchtitan_version.UNREAD_SHAPES if s.workaround == "grouped_mm")
    assert experts.lacks == f"class {EXPERTS_CLASS}("


def test_a_torchtitan_of_neither_shape_gets_one_sentence(tmp_path):
    path = stand_in(tmp_path, "0.9.0", ["trainer.py"])
    out = detect_in(path, (
        "print(v.detect().shape)\n"
        "try:\n    v.require('0.3', 'titan_rocm.torchtitan')\n"
        "except v.TorchTitanVersionError as e:\n    print(e)"
    ))
    shape, sentence = out.splitlines()
    assert shape == "None"
    assert sentence.startswith("titan_rocm.torchtitan is for TorchTitan 0.3.x, but torchtitan "
                               "0.9.0 at ")
    assert "has neither API titan-rocm knows (found trainer.py; looked for 0.2: " in sentence
    assert sentence.endswith("titan-rocm supports TorchTitan 0.2.2 (converters) and 0.3.0 "
                             "(config functions)")
