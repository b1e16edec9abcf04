"""The workarounds, by name. Each lives in its own module and is imported only when used.

The order here is the order the umbrella converter ``rocm`` applies them in: process-wide
settings that must precede any compile first, model rewrites next, the guard last.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from titan_rocm.converters.base import Workaround

WORKAROUNDS: dict[str, str] = {
    "precision_casts": "titan_rocm.workarounds.precision_casts:PrecisionCasts",
    "triton_war": "titan_rocm.workarounds.triton_war.workaround:TritonWar",
    "grouped_mm": "titan_rocm.workarounds.grouped_mm:GroupedMMBinding",
    "moe_eager_compile": "titan_rocm.workarounds.moe_compile:MoEEagerCompile",
    "mla_ck_backward": "titan_rocm.workarounds.mla_attention.workaround:MLACKBackward",
    "divergence_guard": "titan_rocm.workarounds.divergence_guard:DivergenceGuard",
}


def workaround_class(name: str) -> type[Workaround]:
    """The :class:`~titan_rocm.converters.base.Workaround` subclass called ``name``.

    Raises:
        ValueError: ``name`` is not a titan-rocm workaround (lists the known ones).
    """
    try:
        target = WORKAROUNDS[name]
    except KeyError:
        raise ValueError(
            f"unknown titan-rocm workaround {name!r}; known: {', '.join(WORKAROUNDS)}"
        ) from None
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)
