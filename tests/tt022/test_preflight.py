"""``titan-rocm plan`` fails exactly the jobs TorchTitan 0.2.2 would stop at start-up.

The oracle is TorchTitan itself: tests/support/startup_oracle.py runs the real ``torchtitan.train``
(or titan-rocm's launcher) on CPU with a fake process group until the model's
``parallelize_fn``; plan's verdict must match it, per class of failure. Faster tests then
cover each class over many inputs: every field type of the config schema, every boolean
flag, the world-size arithmetic against TorchTitan's own device mesh.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from titan_rocm.adapters.tt022 import preflight
from titan_rocm.adapters.tt022.preflight import StartupError, WorldSize
from titan_rocm.adapters.tt022.preflight.parse_args import _fits
from titan_rocm.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
ORACLE = REPO / "tests" / "support" / "startup_oracle.py"


@pytest.fixture(autouse=True)
def job_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A job's own environment. Whether a job imports titan_rocm depends on it (a
    ``sitecustomize`` may), and tests that apply rocm.triton_war for real leave its
    bootstrap on PYTHONPATH with TITAN_ROCM_TRITON_WAR=1. A plan in this process patches
    TorchTitan's modules as it would in the job's: undone afterwards (as in test_plan)."""
    from tests.support.moe_test_models import clean_patches

    for name in [n for n in os.environ if n.startswith("TITAN_ROCM_")] + ["PYTHONPATH"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GPU_ARCHS", raising=False)
    with clean_patches():
        yield


def plan_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str) -> str:
    """plan's one-line reason (TorchTitan's own log lines may precede it)."""
    lines = [line for line in err.splitlines() if line.startswith("titan-rocm plan: ")]
    assert len(lines) == 1, err
    return lines[0]


def edited(tmp_path: Path, config: str, drop: tuple[str, ...] = (), add: str = "",
           replace: tuple[str, str] | None = None) -> Path:
    """A copy of configs/<config> without lines starting with ``drop``, with ``add``
    appended and ``replace`` = (old, new) done: the user's own variant of a shipped file."""
    text = (CONFIGS / config).read_text()
    lines = [line for line in text.splitlines() if not line.strip().startswith(drop)]
    text = "\n".join(lines) + "\n" + add
    if replace is not None:
        assert replace[0] in text
        text = text.replace(*replace)
    path = tmp_path / f"edited_{config}"
    path.write_text(text)
    return path


def without_rocm_section(text: str) -> str:
    return text.split("\n[rocm]")[0] + "\n"


# --- plan agrees with TorchTitan's real start-up, per class of failure -------------------------

def on(config: str, *flags: str) -> Any:
    """Arguments for a shipped config plus flags."""
    return lambda _tmp: ["--job.config_file", str(CONFIGS / config), *flags]


def on_edited(make: Any) -> Any:
    """Arguments for a config file ``make(tmp_path)`` writes."""
    return lambda tmp: ["--job.config_file", str(make(tmp))]


def _no_config_module(tmp: Path) -> Path:
    return edited(tmp, "llama3_debug.toml", drop=("custom_config_module",))


# (id, launcher, world size, arguments of tmp_path): one job per class of start-up failure.
CASES: list[tuple[str, str, int, Any]] = [
    ("clean", "torchtitan", 1, on("llama3_debug.toml")),
    ("clean-ep-tp", "torchtitan", 4, on("deepseek_v3_debug.toml",
                                        "--parallelism.expert_parallel_degree", "2",
                                        "--parallelism.tensor_parallel_degree", "2")),
    ("converter-typo", "torchtitan", 1, on("llama3_debug.toml", "--model.converters",
                                           "rocm.precision_cast")),
    ("converter-space", "torchtitan", 1, on("llama3_debug.toml", "--model.converters",
                                            "rocm, quantize.linear.float8")),
    ("converters-string", "torchtitan", 1, on_edited(lambda t: edited(
        t, "llama3_debug.toml", replace=('s = ["rocm"]', 's = "rocm"')))),
    ("degree-string", "torchtitan", 1, on_edited(lambda t: edited(
        t, "llama3_debug.toml",
        replace=("tensor_parallel_degree = 1", 'tensor_parallel_degree = "two"')))),
    ("custom-import-missing", "torchtitan", 1, on("llama3_debug.toml",
                                                  "--experimental.custom_import",
                                                  "no_such_module")),
    ("config-module-missing", "torchtitan", 1, on("llama3_debug.toml",
                                                  "--job.custom_config_module",
                                                  "no_such_module")),
    ("rocm-without-config-module", "torchtitan", 1, on_edited(_no_config_module)),
    ("rocm-without-config-module", "titan-rocm", 1, on_edited(_no_config_module)),
    ("rocm-without-import", "torchtitan", 1, on_edited(lambda t: _no_titan_rocm_lines(t))),
    ("rocm-without-import", "titan-rocm", 1, on_edited(lambda t: _no_titan_rocm_lines(t))),
    ("experts-do-not-fit", "torchtitan", 2, on("deepseek_v3_debug.toml",
                                               "--parallelism.expert_parallel_degree", "8")),
    ("batch-not-divisible", "torchtitan", 2, on("llama3_debug.toml",
                                                "--training.global_batch_size", "12")),
    ("pipelining-unsupported", "torchtitan", 2, on("qwen3_debug.toml",
                                                   "--parallelism.pipeline_parallel_degree",
                                                   "2")),
    ("bool-flag-with-value", "torchtitan", 1, on("llama3_debug.toml", "--compile.enable",
                                                 "true")),
]


def _no_titan_rocm_lines(tmp_path: Path) -> Path:
    path = edited(tmp_path, "llama3_debug.toml", drop=("custom_config_module", "custom_import"))
    path.write_text(without_rocm_section(path.read_text()))
    return path


def oracle(launcher: str, world: int, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run([sys.executable, str(ORACLE), launcher, str(world), *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=env)


@pytest.mark.slow
@pytest.mark.parametrize(("case", "launcher", "world", "make_args"), CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_plan_fails_exactly_where_torchtitan_startup_fails(
    case: str, launcher: str, world: int, make_args: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(REPO)  # the debug configs name their assets relative to the root
    args = make_args(tmp_path)
    code, _, err = plan_cli(capsys, "--launcher", launcher, "--world-size", str(world), *args)
    real = oracle(launcher, world, args)
    started = "STARTUP-OK" in real.stdout
    assert started == (real.returncode == 0), real.stderr[-3000:]
    assert (code == 0) == started, (
        f"plan exit {code}, TorchTitan {'started' if started else 'failed'}:\n"
        f"plan: {err[-1500:]}\nTorchTitan: {real.stderr[-1500:]}"
    )
    assert "Traceback" not in err
    if not started:
        assert code == 2
        line = error_line(err)
        # The line names what TorchTitan stopped on: its exception's key value where the
        # reason is a lookup (KeyError 'x', the module), else the flag or setting.
        key = re.search(r"KeyError: ('[^']*')", real.stderr)
        if key:
            assert f"KeyError: {key.group(1)}" in line


# --- the converter registry ----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("converters", "hint"),
    [
        ("rocm.precision_cast", "is not a registered model converter"),
        ("", "an empty name"),
        ("rocm,", "an empty name"),
        ("rocm, quantize.linear.float8", "splits on commas only"),
        ("quantize.linear.float8 ", "splits on commas only"),
        ("Rocm", "is not a registered model converter"),
    ],
)
def test_unregistered_converter_names_fail_with_torchtitans_keyerror(
    converters: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = plan_cli(capsys, "--job.config_file", str(CONFIGS / "llama3_debug.toml"),
                              "--model.converters", converters)
    assert code == 2 and out == ""
    line = error_line(err)
    bad = next(n for n in converters.split(",") if n not in ("rocm", "quantize.linear.float8"))
    assert f"KeyError: {bad!r}" in line and hint in line
    assert "registered: quantize.grouped_mm.float8" in line and "rocm.triton_war" in line


def test_registry_counts_titan_rocm_only_when_the_job_imports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = tmp_path / "bare.toml"
    bare.write_text('[model]\nname = "llama3"\nflavor = "debugmodel"\nconverters = ["rocm"]\n')
    code, _, err = plan_cli(capsys, "--job.config_file", str(bare))
    line = error_line(err)
    assert code == 2 and "KeyError: 'rocm'" in line
    assert 'custom_import = "titan_rocm"' in line and "--launcher titan-rocm" in line
    # Each way a job imports titan_rocm registers the converters.
    for extra in (["--experimental.custom_import", "titan_rocm"],
                  ["--job.custom_config_module", "titan_rocm.config"],
                  ["--launcher", "titan-rocm"]):
        assert plan_cli(capsys, "--job.config_file", str(bare), *extra)[0] == 0, extra
    # A module of the user's that imports titan_rocm does too; one that does not, does not.
    (tmp_path / "with_tr.py").write_text("import titan_rocm  # noqa\n")
    (tmp_path / "without_tr.py").write_text("VALUE = 1\n")
    monkeypatch.chdir(tmp_path)
    assert plan_cli(capsys, "--job.config_file", str(bare),
                    "--experimental.custom_import", "with_tr")[0] == 0
    code, _, err = plan_cli(capsys, "--job.config_file", str(bare),
                            "--experimental.custom_import", "without_tr")
    assert code == 2 and "KeyError: 'rocm'" in error_line(err)
    # So does the environment itself (a sitecustomize, as rocm.triton_war's bootstrap is).
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import titan_rocm  # noqa\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    assert plan_cli(capsys, "--job.config_file", str(bare))[0] == 0


# --- imports and the launcher -----------------------------------------------------------------

@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--experimental.custom_import", "no_such_module"],
         "custom_import = 'no_such_module' cannot be imported (ModuleNotFoundError"),
        (["--job.custom_config_module", "no_such_module"],
         "custom_config_module 'no_such_module' cannot be imported (ModuleNotFoundError"),
        (["--job.custom_config_module", "json"], "'json' has no JobConfig dataclass"),
    ],
)
def test_modules_that_do_not_import_fail(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = plan_cli(capsys, "--job.config_file", str(CONFIGS / "llama3_debug.toml"), *flags)
    assert code == 2 and expected in error_line(err)


@pytest.mark.parametrize("use", ["section", "flag"])
def test_rocm_settings_need_the_config_module_under_torchtitans_launcher(
    use: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = edited(tmp_path, "llama3_debug.toml", drop=("custom_config_module",))
    if use == "flag":
        toml.write_text(without_rocm_section(toml.read_text()))
    flags = ["--rocm.triton_war", "off"] if use == "flag" else []
    code, _, err = plan_cli(capsys, "--job.config_file", str(toml), *flags)
    line = error_line(err)
    assert code == 2
    assert ("a [rocm] section" if use == "section" else "the flag --rocm.triton_war") in line
    assert 'custom_config_module = "titan_rocm.config"' in line and "titan_rocm.train" in line
    assert plan_cli(capsys, "--launcher", "titan-rocm", "--job.config_file", str(toml),
                    *flags)[0] == 0


# --- config types: every field type of TorchTitan's schema (and [rocm]'s) ---------------------

def _merged_config_class() -> type:
    from torchtitan.config import ConfigManager

    return ConfigManager()._maybe_add_custom_config(
        ["--job.custom_config_module", "titan_rocm.config"], None)


def _leaf_fields(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            found += _leaf_fields(tp, f"{prefix}{f.name}.")
        else:
            found.append((f"{prefix}{f.name}", tp))
    return found


def _wrong_value(tp: Any) -> Any:
    """A TOML value of another type than ``tp`` accepts."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        origin = typing.get_origin(tp)
    if origin is list or tp in (int, float, bool) or origin is typing.Literal:
        return "not-a-" + ("list" if origin is list else "number")
    return [1, 2]  # for str


def _as_table(dotted: str, value: Any) -> dict[str, Any]:
    table: dict[str, Any] = {}
    *sections, key = dotted.split(".")
    node = table
    for s in sections:
        node = node.setdefault(s, {})
    node[key] = value
    return table


FIELDS = [(name, tp) for name, tp in _leaf_fields(_merged_config_class())
          if _fits(_wrong_value(tp), tp) is False]


def test_every_checked_field_type_is_covered() -> None:
    kinds = {typing.get_origin(tp) or tp for _, tp in FIELDS}
    assert {int, float, bool, str, list, typing.Literal} <= kinds | {
        typing.get_origin(a) or a for _, tp in FIELDS for a in typing.get_args(tp)}
    assert len(FIELDS) > 150


@pytest.mark.parametrize(("name", "tp"), FIELDS, ids=[n for n, _ in FIELDS])
def test_a_toml_value_of_the_wrong_type_is_refused_with_its_key(name: str, tp: Any) -> None:
    value = _wrong_value(tp)
    with pytest.raises(StartupError) as info:
        preflight.check_toml_types(_merged_config_class(), _as_table(name, value))
    message = str(info.value)
    section, _, key = name.rpartition(".")
    assert message.startswith(f"[{section}] {key} = {value!r}"), message
    assert "\n" not in message


def test_right_types_pass_and_unknown_keys_are_named() -> None:
    cls = _merged_config_class()
    import tomllib

    for config in sorted(CONFIGS.glob("*.toml")):
        preflight.check_toml_types(cls, tomllib.loads(config.read_text()))
    with pytest.raises(StartupError, match=r"\[model\] has unknown key 'nmae', so TorchTitan "
                       r"0.2.2 would stop with 'Invalid field names'; accepted keys: name, "):
        preflight.check_toml_types(cls, {"model": {"nmae": "llama3"}})
    with pytest.raises(StartupError, match=r"\[model\] must be a table of settings, got a string"):
        preflight.check_toml_types(cls, {"model": "llama3"})
    with pytest.raises(StartupError, match=r"letter by letter \(r, o, c, m\) and stop with "
                       r"KeyError: 'r' \(no converter has that name\); write converters"):
        preflight.check_toml_types(cls, {"model": {"converters": "rocm"}})
    with pytest.raises(StartupError, match=r"converters = \[3\]: 3 is an integer"):
        preflight.check_toml_types(cls, {"model": {"converters": [3]}})
    # An integer is a number: TOML users write lr = 1 as well as 1.0.
    preflight.check_toml_types(cls, {"optimizer": {"lr": 1}})


# --- boolean flags are bare ---------------------------------------------------------------------

def test_every_boolean_flag_given_a_value_is_refused_with_the_bare_forms() -> None:
    from torchtitan.config import ConfigManager

    cls = _merged_config_class()
    flags = preflight.bool_flags(cls)
    assert {"rocm.triton_war_strict", "compile.enable", "checkpoint.enable"} <= flags
    suggested = []
    for flag in sorted(flags):
        dashed = f"--{flag.replace('_', '-')}"
        for form in ([f"--{flag}", "true"], [f"--{flag}=false"], [dashed, "0"]):
            with pytest.raises(StartupError) as info:
                preflight.check_bool_flags(form, flags)
            message = str(info.value)
            bare = re.findall(r"write (\S+) for true, (\S+) for false", message)
            assert bare, message
            suggested += bare[0]
    # What the message suggests is what TorchTitan's parser (tyro) accepts, every one.
    ConfigManager().parse_args(["--job.custom_config_module", "titan_rocm.config",
                                *sorted(set(suggested))])
    preflight.check_bool_flags(["--compile.enable", "--model.converters", "rocm"], flags)


def test_tyro_errors_point_at_plans_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = plan_cli(capsys, "--job.config_file", str(CONFIGS / "llama3_debug.toml"),
                            "--parallelism.tensor_parallel_degree", "two")
    assert code == 2
    assert "titan-rocm plan --help" in err
    assert "titan-rocm plan --help-torchtitan lists every TorchTitan" in error_line(err)


def test_a_rejected_flag_under_audit_points_at_the_command_that_lists_the_flags(
    capsys: pytest.CaptureFixture[str]
) -> None:
    """titan-rocm audit reads the job with the same parser but has no --help-torchtitan."""
    with pytest.raises(StartupError) as info:
        preflight.parse_config(["--job.config_file", str(CONFIGS / "llama3_debug.toml"),
                                "--training.bogus", "1"], prog="titan-rocm audit")
    assert "titan-rocm plan --help-torchtitan lists every TorchTitan" in str(info.value)
    assert "For full helptext, run titan-rocm audit --help" in capsys.readouterr().err


def test_plan_help_shows_the_config_file_and_how_to_list_torchtitans_flags(
    capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--job.config_file FILE" in out and "--help-torchtitan" in out
    # tyro's box sends a rejected flag here: the first lines say where TorchTitan's flags are
    description = " ".join(out.split("\n\n")[1].split())
    assert description.startswith("The options below are plan's own; `titan-rocm plan "
                                  "--help-torchtitan` lists TorchTitan's flags")
    assert "--rocm.no-triton_war_strict" in out  # boolean flags are bare
    assert main(["plan", "--help-torchtitan"]) == 0
    out = capsys.readouterr().out
    assert "--job.config-file" in out and "--rocm.triton-war-strict" in out
    assert "--parallelism.tensor-parallel-degree" in out


# --- unreadable TOML files ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["binary", "latin-1", "directory", "missing", "not-toml"])
def test_unreadable_config_files_fail_in_one_line(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.toml"
    if kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "latin-1":
        path.write_bytes('[job]\ndescription = "caf\xe9"\n'.encode("latin-1"))
    elif kind == "directory":
        path.mkdir()
    elif kind == "not-toml":
        path.write_text("[job\n")
    code, out, err = plan_cli(capsys, "--job.config_file", str(path))
    assert code == 2 and out == "" and "Traceback" not in err
    assert str(path) in error_line(err)


def test_a_fifo_as_config_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "job.toml"
    os.mkfifo(fifo)
    out = subprocess.run([sys.executable, "-m", "titan_rocm.cli", "plan", "--job.config_file",
                          str(fifo)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "is a named pipe (FIFO), not a regular file" in out.stderr


# --- world size -------------------------------------------------------------------------------

def _degrees(**kw: int) -> dict[str, int]:
    return {"dp_replicate": 1, "dp_shard": -1, "cp": 1, "tp": 1, "pp": 1, "ep": 1, "etp": 1,
            **kw}


def test_world_size_sources() -> None:
    d = _degrees(tp=2)
    assert preflight.world_size(d, 16).to_dict() == {
        "size": 16, "source": "--world-size", "detail": "16 rank(s), given with --world-size"}
    w = preflight.world_size(d, nnodes=2, nproc_per_node=8)
    assert (w.size, w.source) == (16, "--nnodes x --nproc-per-node")
    assert preflight.world_size(d, 16, nnodes=2, nproc_per_node=8).size == 16
    assert preflight.world_size(d, nproc_per_node=8).size == 8  # one node, as torchrun
    w = preflight.world_size(_degrees(ep=8, tp=2))
    assert (w.size, w.source) == (8, "derived")
    assert "dp_shard 4" in w.detail and "no --world-size" in w.detail


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--world-size", "0"], "--world-size: '0' is not valid; accepted: an integer >= 1 and "
                                "<= 1048576"),
        (["--world-size", "-8"], "--world-size: '-8' is not valid; accepted: an integer >= 1"),
        (["--world-size", "1" + "0" * 20], "--world-size: '100000000000000000000' is not valid"),
        (["--world-size", "nan"], "--world-size: 'nan' is not valid; accepted: an integer"),
        (["--nnodes", "0", "--nproc-per-node", "8"], "--nnodes: '0' is not valid"),
        (["--nproc_per_node", "0"], "--nproc-per-node/--nproc_per_node: '0' is not valid"),
        (["--world-size", "8", "--nnodes", "2", "--nproc-per-node", "8"],
         "--world-size 8 disagrees with --nnodes 2 x --nproc-per-node 8 = 16"),
    ],
)
def test_bad_world_size_flags_name_the_accepted_range(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = plan_cli(capsys, "--job.config_file", str(CONFIGS / "llama3_debug.toml"), *flags)
    assert code == 2 and message in error_line(err)


@pytest.mark.parametrize("value", ["0", "-3", "1000000001"])
def test_a_local_batch_size_out_of_range_names_the_range(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = plan_cli(capsys, "--job.config_file", str(CONFIGS / "llama3_debug.toml"),
                            "--training.local_batch_size", value)
    assert code == 2 and error_line(err).endswith(
        f"[training] local_batch_size = {value} is not valid; accepted: an integer >= 1 and "
        "<= 1000000000")


@pytest.mark.parametrize(
    ("world", "degrees", "message"),
    [
        (2, _degrees(ep=8), "expert_parallel_degree 8 x expert_tensor_parallel_degree 1 = 8 "
                            "does not divide dp_shard 2"),
        (3, _degrees(dp_shard=1, tp=2), "dp_replicate(1) * dp_shard(1) * cp(1) * tp(2) * pp(1) "
                                        "= 2, and TorchTitan 0.2.2 requires it to equal"),
        (2, _degrees(tp=4), "data_parallel_shard_degree = -1 leaves 2 // (dp_replicate 1 x cp 1 "
                            "x tp 4 x pp 1) = 0 ranks"),
        (4, _degrees(ep=2, etp=2), "supports only ETP = TP (1) or ETP = 1"),
        (1, _degrees(cp=0), "[parallelism] context_parallel_degree = 0 is not valid; accepted: "
                            "an integer >= 1 and <= 1048576"),
        (1, _degrees(dp_shard=0), "[parallelism] data_parallel_shard_degree = 0 is not valid; "
                                  "accepted: -1 or an integer >= 1 and <= 1048576"),
        (1, _degrees(tp="2"), "[parallelism] tensor_parallel_degree = '2' is not valid"),
        (1, _degrees(pp=True), "[parallelism] pipeline_parallel_degree = True is not valid"),
    ],
)
def test_degrees_that_do_not_fit_name_the_reason(
    world: int, degrees: dict[str, int], message: str
) -> None:
    with pytest.raises(StartupError) as info:
        preflight.check_parallelism(degrees, WorldSize(world, "--world-size", ""))
    text = str(info.value)
    assert message in text
    if not any(w in text for w in ("ETP", "is not valid")):  # world-free
        assert f"world size {world} (--world-size)" in text  # the size and its source


def _mesh_cases(n: int) -> list[tuple[int, dict[str, int]]]:
    rng = random.Random(17)
    cases = [(2, _degrees(ep=8)), (8, _degrees(ep=8)), (1, _degrees()), (6, _degrees(ep=4)),
             (4, _degrees(ep=2, etp=2, tp=2)), (4, _degrees(ep=4, etp=2, tp=2))]
    for _ in range(n):
        cases.append((rng.choice([1, 2, 3, 4, 6, 8, 12, 16]), {
            "dp_replicate": rng.choice([1, 1, 2]), "dp_shard": rng.choice([-1, -1, 1, 2, 4]),
            "cp": rng.choice([1, 1, 2]), "tp": rng.choice([1, 2, 4]), "pp": rng.choice([1, 1, 2]),
            "ep": rng.choice([1, 2, 4, 8]), "etp": rng.choice([1, 1, 2])}))
    return cases


@pytest.mark.slow
def test_degree_checks_agree_with_torchtitans_device_mesh() -> None:
    cases = _mesh_cases(150)
    real = subprocess.run([sys.executable, str(ORACLE), "meshes"], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=600, check=True)
    verdicts = json.loads(real.stdout.strip().splitlines()[-1])
    assert any(verdicts) and not all(verdicts)
    for (world, degrees), builds in zip(cases, verdicts, strict=True):
        try:
            preflight.check_parallelism(degrees, WorldSize(world, "--world-size", ""))
            ours = True
        except StartupError:
            ours = False
        assert ours == builds, (world, degrees)


def test_derived_world_size_is_the_smallest_that_fits() -> None:
    for _, degrees in _mesh_cases(400):
        world = preflight.world_size(degrees)
        fits = []
        for size in range(1, world.size + 1):
            try:
                preflight.check_parallelism(degrees, WorldSize(size, "derived", ""))
                fits.append(size)
            except StartupError:
                pass
        if fits:  # some degrees fit no world (an explicit dp_shard that EP does not divide)
            assert fits[0] == world.size, degrees


def test_plan_prints_the_world_size_and_its_source(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(CONFIGS / "deepseek_v3_16b_bf16.toml")
    code, out, _ = plan_cli(capsys, "--job.config_file", cfg, "--arch", "gfx942")
    assert code == 0 and re.search(r"^world: +8 rank\(s\), derived: 8 = ", out, re.M)
    code, out, _ = plan_cli(capsys, "--job.config_file", cfg, "--arch", "gfx942", "--json",
                            "--nnodes", "2", "--nproc_per_node", "8")
    plan = json.loads(out)
    assert plan["world_size"]["size"] == 16
    assert plan["world_size"]["source"] == "--nnodes x --nproc-per-node"
    assert plan["launcher"] == "torchtitan"


def test_mixed_quantization_types_fail_as_torchtitans_converters_would(
    capsys: pytest.CaptureFixture[str]
) -> None:
    fp8 = str(CONFIGS / "deepseek_v3_debug_fp8.toml")
    assert plan_cli(capsys, "--job.config_file", fp8)[0] == 0
    code, _, err = plan_cli(capsys, "--job.config_file", fp8, "--model.converters",
                            "rocm,quantize.linear.float8,quantize.grouped_mm.mx")
    assert code == 2
    assert "Cannot combine model converters with different quantization types: 'mx' and " \
           "'float8'" in error_line(err)
