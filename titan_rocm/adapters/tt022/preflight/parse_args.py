"""Check 1: the config, as TorchTitan 0.2.2's ``ConfigManager.parse_args`` reads it."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any, Literal

from titan_rocm.adapters.common import StartupError, prog_name
from titan_rocm.adapters.common import one_line as _one_line
from titan_rocm.adapters.tt022.config import CONFIG_MODULE
from titan_rocm.adapters.tt022.job_args import (
    JobArgsError,
    config_module,
    load_toml,
    prepare,
)
from titan_rocm.adapters.tt022.preflight.launchers import DEFAULT_LAUNCHER, LAUNCH_LINES, LAUNCHERS
from titan_rocm.settings import check_flags, check_section

_IMPORT_FLAGS = ("--experimental.custom_import", "--experimental.custom-import")
_ROCM_PREFIXES = ("--rocm.", "--rocm-")
_BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})




def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of: " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not type(None))
    if origin is list:
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" \
            if args else "a list"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _fits(value: Any, tp: Any) -> bool | None:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return None
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        verdicts = [_fits(value, a) for a in args if a is not type(None)]
        return None if None in verdicts else any(verdicts)
    if origin is list:
        if not isinstance(value, list):
            return False
        return all(_fits(v, args[0]) is not False for v in value) if args else True
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return None


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an extension with unresolvable annotations: take them as written
        return {f.name: f.type for f in dataclasses.fields(cls)}


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)


def check_toml_types(cls: type, table: dict[str, Any], section: str = "") -> None:
    """Check a TOML table against the (merged) JobConfig dataclass ``cls`` (StartupError).

    TorchTitan 0.2.2 passes TOML values on unconverted: a string for an integer fails later, and
    a string for a list is iterated letter by letter."""
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    where = f"[{section}] " if section else ""
    for key, value in table.items():
        if key not in names:
            raise StartupError(
                f"{where or 'the TOML '}has unknown key {key!r}, so TorchTitan 0.2.2 would stop "
                f"with 'Invalid field names'; accepted keys: {', '.join(names)}"
            )
        tp = hints.get(key)
        name = f"{section}.{key}" if section else key
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise StartupError(
                    f"[{name}] must be a table of settings, got {_type_name(value)} ({value!r})"
                )
            check_toml_types(tp, value, name)
            continue
        if _fits(value, tp) is not False:
            continue
        expected = _describe(tp)
        if isinstance(value, str) and typing.get_origin(tp) is list:
            letters = ", ".join(value[:8]) + (", ..." if len(value) > 8 else "")
            stop = (f" and stop with KeyError: {value[:1]!r} (no converter has that name)"
                    if name == "model.converters" else "")
            raise StartupError(
                f"{where}{key} = {value!r} is a string, but TorchTitan 0.2.2 expects {expected} "
                f"and would read it letter by letter ({letters}){stop}; write "
                f"{key} = [\"{value}\"]"
            )
        if isinstance(value, list) and typing.get_origin(tp) is list:
            bad = next(v for v in value if _fits(v, typing.get_args(tp)[0]) is False)
            raise StartupError(
                f"{where}{key} = {value!r}: {bad!r} is {_type_name(bad)}, but TorchTitan 0.2.2 "
                f"expects {expected}"
            )
        if typing.get_origin(tp) is Literal:
            raise StartupError(f"{where}{key} = {value!r} is not valid; accepted: "
                               + ", ".join(str(a) for a in typing.get_args(tp)))
        raise StartupError(
            f"{where}{key} = {value!r} is {_type_name(value)}, but TorchTitan 0.2.2 expects "
            f"{expected} (it passes TOML values to the trainer unconverted, which would fail "
            "or misread it)"
        )


def bool_flags(cls: type, prefix: str = "") -> set[str]:
    """Dotted names (``rocm.triton_war_strict``) of every boolean field under ``cls``."""
    found: set[str] = set()
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name)
        if dataclasses.is_dataclass(tp):
            found |= bool_flags(tp, f"{prefix}{f.name}.")
        elif tp is bool:
            found.add(f"{prefix}{f.name}")
    return found


def check_bool_flags(args: Sequence[str], flags: set[str]) -> None:
    """Refuse ``--x.flag true``: tyro's boolean flags take no value."""
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        key, sep, inline = arg.partition("=")
        dotted = key[2:].replace("-", "_")
        negated = dotted.split(".")[-1].startswith("no_")
        if negated:
            head, _, last = dotted.rpartition(".")
            dotted = f"{head}.{last[3:]}" if head else last[3:]
        if dotted not in flags:
            continue
        value = inline if sep else (args[i + 1] if i + 1 < len(args) else "")
        if sep or value.lower() in _BOOL_WORDS:
            head, _, last = dotted.rpartition(".")
            raise StartupError(
                f"{key} is a bare flag and takes no value (TorchTitan's parser would stop at "
                f"{value!r}): write --{dotted} for true, --{head}.no-{last} for false"
            )


def _arguments(args: Sequence[str], launcher: str) -> tuple[list[str], dict[str, Any]]:
    try:
        toml = load_toml(args)
        prepared = prepare(args) if launcher == "titan-rocm" else list(args)
    except JobArgsError as exc:
        raise StartupError(str(exc)) from None
    try:
        check_flags(prepared)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    if launcher == "torchtitan":
        module = config_module(prepared, toml)
        rocm_flags = [a.split("=")[0] for a in prepared if a.startswith(_ROCM_PREFIXES)]
        if not module and ("rocm" in toml or rocm_flags):
            used = "a [rocm] section" if "rocm" in toml else f"the flag {rocm_flags[0]}"
            raise StartupError(
                f"the job sets {used} but names no job.custom_config_module, so TorchTitan "
                "0.2.2's parser would reject it: add custom_config_module = "
                f"\"{CONFIG_MODULE}\" under [job] (or --job.custom_config_module "
                f"{CONFIG_MODULE}), or launch with {LAUNCH_LINES['titan-rocm']} "
                "(plan --launcher titan-rocm)"
            )
        if module == CONFIG_MODULE and "rocm" in toml:
            try:
                check_section(toml["rocm"])
            except ValueError as exc:
                raise StartupError(str(exc)) from None
    return prepared, toml


def _import(name: str) -> Any:
    """As the launched job would: ``python -m`` (torchrun's way) puts the working directory first on
    ``sys.path``; a console script does not."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def _config_class(manager: Any, args: list[str], toml: dict[str, Any]) -> type:
    module = config_module(args, toml)
    if module is not None and not isinstance(module, str):
        raise StartupError(
            f"[job] custom_config_module = {module!r} is {_type_name(module)}; expected the "
            f"name of a Python module (e.g. \"{CONFIG_MODULE}\")"
        )
    if module:
        try:
            extension = _import(module)
        except Exception as exc:
            raise StartupError(
                f"job.custom_config_module {module!r} cannot be imported ({_one_line(exc)}); "
                "TorchTitan 0.2.2 imports it while parsing the config"
            ) from None
        if not dataclasses.is_dataclass(getattr(extension, "JobConfig", None)):
            raise StartupError(
                f"job.custom_config_module {module!r} has no JobConfig dataclass, which "
                "TorchTitan 0.2.2 merges into its own"
            )
    return manager._maybe_add_custom_config(args, toml)


def parse_config(args: Sequence[str], launcher: str = DEFAULT_LAUNCHER,
                 prog: str = "titan-rocm plan") -> Any:
    """The JobConfig TorchTitan 0.2.2's ConfigManager makes of ``args`` under ``launcher``
    (StartupError for anything it would stop on, or a wrong-typed TOML value it would pass)."""
    from torchtitan.config import ConfigManager

    if launcher not in LAUNCHERS:
        raise StartupError(f"unknown launcher {launcher!r}; accepted: {', '.join(LAUNCHERS)}")
    prepared, toml = _arguments(args, launcher)
    manager = ConfigManager()
    cls = _config_class(manager, prepared, toml)
    check_toml_types(cls, toml)
    check_bool_flags(prepared, bool_flags(cls))
    try:
        with prog_name(prog):
            return manager.parse_args(prepared)
    except SystemExit as exc:  # tyro printed its box (which flag, what it accepts) above
        raise StartupError(
            f"TorchTitan's parser rejected the arguments (exit {exc.code}; the box above says "
            "which); titan-rocm plan --help-torchtitan lists every TorchTitan and --rocm.* flag"
        ) from None
    except Exception as exc:
        raise StartupError(f"TorchTitan 0.2.2 would stop reading the config: {_one_line(exc)}"
                           ) from None
