"""The [rocm] section and converter lists, parsed by TorchTitan 0.2.2's own ConfigManager."""

from __future__ import annotations

from pathlib import Path

import pytest
from torchtitan.config import ConfigManager

import titan_rocm
from titan_rocm.adapters.tt022.config import settings_from
from titan_rocm.adapters.tt022.job_args import JobArgsError, prepare
from titan_rocm.settings import MODES, RocmSettings, check_flags, check_section, mode_fields


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def test_defaults_when_rocm_section_absent() -> None:
    job = ConfigManager().parse_args([])
    assert not hasattr(job, "rocm")
    assert settings_from(job) == RocmSettings()


def test_toml_section_and_converters(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[job]\ncustom_config_module = "titan_rocm.config"\n'
        '[experimental]\ncustom_import = "titan_rocm"\n'
        '[model]\nconverters = ["rocm", "quantize.linear.float8"]\n'
        '[rocm]\ntriton_war = "off"\ntriton_war_rule = "conservative"\n',
    )
    job = ConfigManager().parse_args(["--job.config_file", path])
    assert job.model.converters == ["rocm", "quantize.linear.float8"]
    assert job.rocm.triton_war == "off"
    assert job.rocm.triton_war_rule == "conservative"
    assert job.rocm.precision_casts == "auto"


def test_cli_flags_override_toml(tmp_path: Path) -> None:
    path = _write(tmp_path, '[job]\ncustom_config_module = "titan_rocm.config"\n'
                  '[rocm]\ntriton_war = "off"\n')
    job = ConfigManager().parse_args(
        ["--job.config_file", path, "--rocm.triton_war", "on",
         "--model.converters", "rocm.grouped_mm,quantize.linear.float8,rocm"]
    )
    assert job.rocm.triton_war == "on"
    # 0.2.2 splits --model.converters on commas
    assert job.model.converters == ["rocm.grouped_mm", "quantize.linear.float8", "rocm"]


def test_bad_toml_value_names_key_value_and_choices(tmp_path: Path) -> None:
    path = _write(tmp_path, '[job]\ncustom_config_module = "titan_rocm.config"\n'
                  '[rocm]\nmla_ck_backward = "yes"\n')
    with pytest.raises(ValueError) as info:
        ConfigManager().parse_args(["--job.config_file", path])
    message = str(info.value)
    assert "mla_ck_backward" in message and "'yes'" in message
    assert "auto, on, off" in message


def test_bad_cli_value_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        ConfigManager().parse_args(
            ["--job.custom_config_module", "titan_rocm.config", "--rocm.triton_war", "maybe"]
        )
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "maybe" in err and "auto" in err


@pytest.mark.parametrize(
    ("section", "needle"),
    [
        ({"tritonwar": "on"}, "unknown key 'tritonwar'"),
        ({"triton_war_strict": "yes"}, "accepted: true, false"),
        ({"divergence_check": "sometimes"}, "log_steps, every_step"),
        ({"grouped_mm_backend": ""}, "non-empty string"),
        ("on", "must be a table"),
    ],
)
def test_check_section_messages(section: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        check_section(section)


@pytest.mark.parametrize("args,needle", [
    (["--rocm.numerics_audit_outlier_quantile", "1.5"],
     "numerics_audit_outlier_quantile = 1.5 is not valid; accepted: a number > 0 and < 1"),
    (["--rocm.numerics_audit_every=0"], "numerics_audit_every = 0 is not valid"),
    (["--rocm.grouped_mm_backend="],
     "grouped_mm_backend = '' is not valid; accepted: a non-empty string"),
])
def test_check_flags_names_the_bad_value(args: list[str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        check_flags(args)


@pytest.mark.parametrize("args", [
    ["--rocm.numerics_audit_outlier_quantile", "0.99", "--rocm.triton_war", "off"],
    ["--rocm.triton_war_strict", "--training.steps", "2"],  # a bare boolean flag
    ["--rocm.numerics_audit_every", "x"],  # tyro's own box says a word is not an int
    ["--rocm-triton-war", "maybe"],  # tyro's own box names the flag and its choices
    ["--training.steps", "0"],  # not ours
])
def test_check_flags_leaves_the_rest_to_tyro(args: list[str]) -> None:
    check_flags(args)


def test_every_mode_field_accepts_every_mode() -> None:
    names = mode_fields()
    assert {"precision_casts", "moe_eager_compile", "grouped_mm", "triton_war",
            "mla_ck_backward", "divergence_guard"} <= set(names)
    for name in names:
        for mode in MODES:
            assert getattr(RocmSettings(**{name: mode}), name) == mode


def test_prepare_adds_config_module_only_when_missing(tmp_path: Path) -> None:
    assert prepare([])[-2:] == ["--job.custom_config_module", "titan_rocm.config"]
    own = _write(tmp_path, '[job]\ncustom_config_module = "my.module"\n')
    assert "--job.custom_config_module" not in prepare(["--job.config_file", own])
    explicit = ["--job.custom_config_module=titan_rocm.config"]
    assert prepare(explicit) == explicit


def test_prepare_reports_unknown_rocm_key_with_accepted_keys(tmp_path: Path) -> None:
    path = _write(tmp_path, '[rocm]\nprecision_cast = "on"\n')
    with pytest.raises(JobArgsError) as info:
        prepare(["--job.config_file", path])
    assert "precision_cast" in str(info.value) and "precision_casts" in str(info.value)


@pytest.mark.parametrize(
    ("content", "needle"),
    [(None, "no such file"), ("[rocm\n", "not valid TOML")],
)
def test_prepare_bad_toml(tmp_path: Path, content: str | None, needle: str) -> None:
    path = tmp_path / "x.toml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(JobArgsError, match=needle):
        prepare(["--job.config_file", str(path)])


def test_package_import_is_light_and_registers_later() -> None:
    import subprocess
    import sys

    code = (
        "import sys, titan_rocm\n"
        "assert 'torch' not in sys.modules, 'titan_rocm imported torch'\n"
        "from torchtitan.protocols.model_converter import _registry_model_converter_cls as r\n"
        "print(sorted(k for k in r if k.startswith('rocm')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names = eval(out.stdout.strip())  # noqa: S307 - our own printed list
    assert "rocm" in names and "rocm.precision_casts" in names
    assert titan_rocm.__version__
