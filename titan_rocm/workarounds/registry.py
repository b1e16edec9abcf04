"""The workarounds, by name, in the order the umbrella converter applies them.

Process-wide settings that must precede any compile come first, model rewrites next, the
guard last. Each workaround lives in its own package (or module) and is imported only when
used, so listing them costs nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from titan_rocm.workarounds.base import Workaround

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


def workaround_class(name: str) -> type[Workaround]:
    """The :class:`~titan_rocm.workarounds.base.Workaround` subclass called ``name``.

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
