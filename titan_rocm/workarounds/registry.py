"""The workarounds, by name, in the order the umbrella converter applies them: process-wide settings
first, model rewrites next, the guard last.

The one list of them: every other list derives from it. Each is imported only when used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from titan_rocm.workarounds.base import Workaround
    from titan_rocm.workarounds.seams import Generation

WORKAROUNDS: dict[str, str] = {
    "precision_casts": "titan_rocm.workarounds.precision_casts:PrecisionCasts",
    "triton_war": "titan_rocm.workarounds.triton_war.workaround:TritonWar",
    "gemm_lookup": "titan_rocm.workarounds.gemm_lookup.workaround:GemmLookup",
    "grouped_mm": "titan_rocm.workarounds.grouped_mm.workaround:GroupedMMBinding",
    "moe_eager_compile": "titan_rocm.workarounds.moe_eager_compile.workaround:MoEEagerCompile",
    "mla_ck_backward": "titan_rocm.workarounds.mla_ck_backward.workaround:MLACKBackward",
    "numerics_audit": "titan_rocm.workarounds.numerics_audit.workaround:NumericsAudit",
    "divergence_guard": "titan_rocm.workarounds.divergence_guard.workaround:DivergenceGuard",
}


def workaround_classes() -> dict[str, type[Workaround]]:
    """Every registered workaround class by name, in apply order (each module imported)."""
    return {name: workaround_class(name) for name in WORKAROUNDS}


def seamed() -> dict[str, str]:
    """The workarounds that reach into TorchTitan's code, each with the package its seams sit in."""
    return {name: cls.seam_package()
            for name, cls in workaround_classes().items() if cls.has_seam}


def seam_targets(generation: Generation) -> dict[str, str]:
    """Workaround name -> ``"module:Class"`` of its seam in ``generation``, for every seamed
    workaround the generation has one for (plan, the tests that hold every seam to a module)."""
    return generation.targets(seamed())


def workaround_class(name: str) -> type[Workaround]:
    """The :class:`~titan_rocm.workarounds.base.Workaround` subclass called ``name``; ValueError
    lists the known ones."""
    try:
        target = WORKAROUNDS[name]
    except KeyError:
        raise ValueError(
            f"unknown titan-rocm workaround {name!r}; known: {', '.join(WORKAROUNDS)}"
        ) from None
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)
