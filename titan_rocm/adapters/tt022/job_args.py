"""TorchTitan command-line arguments for titan-rocm's own entry points.

Ensures ``[rocm]`` and ``--rocm.*`` parse, and checks the TOML's ``[rocm]`` table with a
message listing the accepted keys and values, which TorchTitan's own check does not."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from titan_rocm.adapters.common import (  # noqa: F401 - names 0.2.2's callers import here
    CONFIG_FILE_FLAGS,
    JobArgsError,
    flag_value,
    module_and_config,
)
from titan_rocm.adapters.tt022.config import CONFIG_MODULE
from titan_rocm.files import TooLargeError, read_regular
from titan_rocm.settings import check_section

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CONFIG_MODULE_FLAGS = ("--job.custom_config_module", "--job.custom-config-module")
MAX_TOML_BYTES = 16 << 20
"""A bigger job TOML is refused before it is read: tomllib keeps the whole text and more."""


def load_toml(args: Sequence[str]) -> dict[str, Any]:
    """The job's TOML file as a dict (empty when no ``--job.config_file`` is given)."""
    path = flag_value(args, CONFIG_FILE_FLAGS)
    if path is None:
        return {}
    try:
        return tomllib.loads(read_regular(path, MAX_TOML_BYTES).decode("utf-8"))
    except TooLargeError as exc:
        raise JobArgsError(
            f"--job.config_file {path!r}: {exc.size} bytes, not a job file; accepted: a TOML "
            f"file of at most {MAX_TOML_BYTES >> 20} MiB") from None
    except RecursionError:  # tomllib recurses once per level of nesting
        raise JobArgsError(
            f"--job.config_file {path!r}: arrays or inline tables nested deeper than TOML "
            "readers accept (a job file nests a few levels)") from None
    except FileNotFoundError:
        raise JobArgsError(f"--job.config_file {path!r}: no such file") from None
    except OSError as exc:
        raise JobArgsError(f"--job.config_file {path!r}: cannot read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobArgsError(f"--job.config_file {path!r}: not valid TOML ({exc})") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 text; a binary file is not
        raise JobArgsError(
            f"--job.config_file {path!r}: not a TOML file (byte {exc.start} is not UTF-8 text)"
        ) from None


def config_module(args: Sequence[str], toml: dict[str, Any]) -> Any:
    """As TorchTitan 0.2.2 reads it: the flag, else the TOML's ``[job]`` value (None: neither)."""
    module = flag_value(args, CONFIG_MODULE_FLAGS)
    if module is None:
        job = toml.get("job")
        module = job.get("custom_config_module") if isinstance(job, dict) else None
    return module


def prepare(args: Sequence[str]) -> list[str]:
    """Arguments for TorchTitan's ConfigManager, with titan-rocm's config module ensured
    (JobArgsError)."""
    args = list(args)
    toml = load_toml(args)
    module = config_module(args, toml)
    if "rocm" in toml:
        try:
            check_section(toml["rocm"])
        except ValueError as exc:
            raise JobArgsError(str(exc)) from None
    if not module:
        # A job with its own config module keeps it; it must then carry the `rocm` field
        # itself (subclass titan_rocm.config.JobConfig) for [rocm] to parse.
        args += ["--job.custom_config_module", CONFIG_MODULE]
    return args
