"""``job_args.flag_value`` reads ``--job.config_file`` and ``--job.custom_config_module`` as
TorchTitan 0.2.2's own ``ConfigManager`` does (issue 25, item 8): on generated command lines,
whenever TorchTitan finds a value, flag_value finds the same one. It is kept by hand only
because asking ConfigManager imports torch, which plan's quick refusals must not."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from titan_rocm.adapters.tt022.job_args import (
    CONFIG_FILE_FLAGS,
    CONFIG_MODULE_FLAGS,
    JobArgsError,
    flag_value,
)

manager = pytest.importorskip("torchtitan.config.manager", reason="TorchTitan 0.2.2's parser")

TOKENS = ["--job.config_file", "--job.config-file", "--job.config_file=a.toml",
          "--job.config-file=b.toml", "a.toml", "b.toml", "--x", "1",
          "--job.custom_config_module", "--job.custom-config-module=m2", "m1", "m3",
          "--job.custom_config_module=", "--job.config_file="]


class _Imported(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _torchtitans_toml(args: list[str], folder: Path) -> str | None:
    """Which file TorchTitan's ``_maybe_load_toml`` opens (None: it looks for none)."""
    with contextlib.chdir(folder):
        try:
            found = manager.ConfigManager()._maybe_load_toml(args)
        except FileNotFoundError as exc:  # it opened a name that is not one of ours
            return str(exc.filename)
    return None if found is None else found["which"]


def _torchtitans_module(args: list[str], monkeypatch: pytest.MonkeyPatch) -> str | None:
    """Which module TorchTitan's ``_maybe_add_custom_config`` imports (None: none)."""
    def imported(name: str) -> Any:
        raise _Imported(name)

    monkeypatch.setattr(manager.importlib, "import_module", imported)
    try:
        manager.ConfigManager()._maybe_add_custom_config(args, None)
    except _Imported as exc:
        return exc.name
    except IndexError:  # a trailing flag without its value
        return "<error>"
    return None


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(TOKENS), max_size=6))
def test_flag_value_finds_what_torchtitan_0_2_2_finds(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     args: list[str]) -> None:
    for name in ("a.toml", "b.toml"):
        (tmp_path / name).write_text(f'which = "{name}"\n')
    theirs = _torchtitans_toml(args, tmp_path)
    try:
        ours = flag_value(args, CONFIG_FILE_FLAGS)
    except JobArgsError:
        ours = "<error>"
    if theirs is not None:
        assert ours == theirs, args
    else:  # TorchTitan reads no TOML: we name none, or refuse a flag left without a value
        assert ours in (None, "<error>"), args
    with monkeypatch.context() as m:
        theirs = _torchtitans_module(args, m)
    try:
        ours = flag_value(args, CONFIG_MODULE_FLAGS)
    except JobArgsError:
        ours = "<error>"
    if ours == "":
        ours = None  # "--job.custom_config_module=": empty, which both treat as none
    assert ours == theirs, args
