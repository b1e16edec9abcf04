"""titan-rocm for TorchTitan 0.3.0: a trainer adapter (docs/torchtitan-0.3.md).

Importing this package with another TorchTitan installed raises
:class:`~titan_rocm.torchtitan_version.TorchTitanVersionError` naming the entry point that
fits it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from titan_rocm.torchtitan_version import require

require("0.3", "titan_rocm.torchtitan (the TorchTitan 0.3.0 adapter)")

if TYPE_CHECKING:
    from titan_rocm.adapters.tt030.trainer import (
        RocmTrainer,
        RocmTrainerMixin,
        rocm,
        rocm_trainer_class,
    )
    from titan_rocm.settings import RocmSettings

_HOMES = {"RocmSettings": "titan_rocm.settings", "RocmTrainer": "titan_rocm.adapters.tt030.trainer",
          "RocmTrainerMixin": "titan_rocm.adapters.tt030.trainer",
          "rocm": "titan_rocm.adapters.tt030.trainer",
          "rocm_trainer_class": "titan_rocm.adapters.tt030.trainer"}
"""Loaded on first use, so the ``commands`` module (and a plan's refusals) import no torch."""

__all__ = ["RocmSettings", "RocmTrainer", "RocmTrainerMixin", "rocm", "rocm_trainer_class"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
