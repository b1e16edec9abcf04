"""The TorchTitan adapters, one folder per generation (tt022: converters over the TOML
JobConfig; tt030: config functions and Trainer.Config). The command line asks the installed
generation's adapter (:func:`installed`) and holds no generation branch of its own."""

from __future__ import annotations

import importlib
from types import ModuleType

FOLDERS: dict[str, str] = {"0.2": "tt022", "0.3": "tt030"}
"""TorchTitan generation (its API shape) -> its adapter folder."""


class NoAdapter(RuntimeError):
    """No adapter fits the installed TorchTitan (the message is one sentence)."""


def installed(name: str) -> ModuleType:
    """Module ``name`` (``audit``, ``plan``, ...) of the installed TorchTitan's adapter.

    Raises:
        NoAdapter: TorchTitan is missing, or its API is neither generation's.
    """
    from titan_rocm import torchtitan_version

    found = torchtitan_version.detect()
    folder = FOLDERS.get(found.shape or "")
    if folder is None:
        raise NoAdapter(found.unsupported() or (
            f"{found.describe()} is installed; {torchtitan_version.SUPPORTED} (pip install "
            "torchtitan==0.2.2 or torchtitan==0.3.0)"))
    return importlib.import_module(f"titan_rocm.adapters.{folder}.{name}")
