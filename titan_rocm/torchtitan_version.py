"""Which TorchTitan is installed, read from package metadata: TorchTitan itself is never imported.

titan-rocm has one adapter per TorchTitan release line: model converters for 0.2.2
(``titan_rocm.converters``, ``[model] converters = ["rocm"]``) and a trainer adapter for 0.3.0
(``titan_rocm.torchtitan``). Each entry point asks :func:`require` first, so a user who calls
the one for the other release gets a sentence naming the installed version and the entry
point that fits it, instead of an ImportError from deep inside TorchTitan. Importing
TorchTitan costs seconds and, in 0.3.0, fixes its device type for the process: the answer
must come from ``importlib.metadata`` alone (also in pytest collection).
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Literal

Series = Literal["0.2", "0.3"]
"""The TorchTitan release lines titan-rocm has an adapter for."""

ENTRY_POINTS: dict[str, str] = {
    "0.2": (
        'the model converters: [model] converters = ["rocm"] with '
        '[experimental] custom_import = "titan_rocm", or python -m titan_rocm.train '
        "(README, 'Use it with TorchTitan 0.2.2')"
    ),
    "0.3": (
        "the trainer adapter: return rocm(cfg) from a config function, or "
        "python -m torchtitan.train --module titan_rocm.torchtitan.configs --config <name> "
        "(docs/torchtitan-0.3.md)"
    ),
}
"""What a user of each release line should use instead, for the error sentence."""

_VERSION = re.compile(r"^(\d+)\.(\d+)")


class TorchTitanVersionError(RuntimeError):
    """The installed TorchTitan is not the one this titan-rocm entry point is for.

    A RuntimeError, not an ImportError: TorchTitan 0.3.0's ``--module`` loader swallows
    ImportErrors and would replace this sentence with its own "cannot import module".
    """


def installed() -> str | None:
    """The installed ``torchtitan`` distribution's version, or None when it is not installed."""
    try:
        return importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        return None


def series(version: str | None = None) -> str | None:
    """``"major.minor"`` of ``version`` (default: the installed one); None if not installed
    or not a version number."""
    version = installed() if version is None else version
    if version is None:
        return None
    match = _VERSION.match(version)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def require(wanted: Series, entry: str, version: str | None = None) -> str:
    """Raise unless the installed TorchTitan is of release line ``wanted``; return its version.

    Args:
        wanted: the release line ``entry`` is written for.
        entry: what the user called, for the sentence (e.g. ``"titan_rocm.torchtitan"``).
        version: the version to judge (default: the installed one; tests pass their own).

    Raises:
        TorchTitanVersionError: naming ``entry``, the installed version and what to use.
    """
    version = installed() if version is None else version
    found = series(version)
    if found == wanted:
        assert version is not None
        return version
    have = "no torchtitan is installed" if version is None else f"torchtitan {version} is installed"
    advice = ENTRY_POINTS.get(found or "", f"install torchtitan {wanted}.x")
    if found in ENTRY_POINTS:
        advice = f"with it, use {advice}"
    raise TorchTitanVersionError(
        f"{entry} is for TorchTitan {wanted}.x, but {have}; {advice}"
    )
