"""Every stock TorchTitan 0.3.0 config, with titan-rocm: ``--module titan_rocm.torchtitan.configs``
(docs/torchtitan-0.3.md)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from titan_rocm.adapters.tt030.trainer import rocm


def _registries(name: str = "") -> list[Any]:
    from torchtitan.models import _supported_models

    order = sorted(_supported_models, key=lambda m: (not name.startswith(m + "_"), -len(m), m))
    modules = []
    for model in order:
        try:
            modules.append(importlib.import_module(f"torchtitan.models.{model}.config_registry"))
        except ImportError:  # a model whose optional dependencies are missing
            continue
    return modules


def _stock_names(module: Any) -> list[str]:
    return [n for n, v in vars(module).items()
            if callable(v) and not isinstance(v, type) and n[:1].islower()
            and getattr(v, "__module__", None) == module.__name__]


def stock_config(name: str) -> Callable[[], Any]:
    """TorchTitan's config function ``name`` (AttributeError: then TorchTitan lists this
    module's)."""
    for module in _registries(name):
        if name in _stock_names(module):
            return getattr(module, name)
    raise AttributeError(f"no TorchTitan 0.3.0 config function named {name!r}")


def __getattr__(name: str) -> Callable[[], Any]:
    if name.startswith("__"):
        raise AttributeError(name)
    stock = stock_config(name)

    def config() -> Any:
        return rocm(stock())

    config.__name__ = config.__qualname__ = name
    config.__doc__ = f"TorchTitan's {stock.__module__}.{name}() with titan-rocm."
    return config


def __dir__() -> list[str]:
    return sorted({n for module in _registries() for n in _stock_names(module)})
