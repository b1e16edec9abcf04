"""Grouped-MM binding: point the live model's MoE experts at a chosen grouped-MM backend.

This package's face is the public API users extend (:func:`register_backend`) and read
(:func:`call_counts`, :func:`backend_names`), the same on every TorchTitan generation. The
workaround ``rocm.grouped_mm`` is :mod:`.workaround`; how the binding reaches what TorchTitan
really calls, its seams (:mod:`.seams_tt022`: the module global; :mod:`.seams_tt030`: the
experts' class), each with its own ``layer_backends``; the backends, :mod:`.backends`;
whether the bound function runs compiled (0.2.2), :mod:`.experts_compile`. Docs:
docs/grouped-mm.md.
"""

from titan_rocm.workarounds.grouped_mm.backends import (
    backend_names,
    call_counts,
    is_compilable,
    register_backend,
    reset_calls,
)
from titan_rocm.workarounds.grouped_mm.experts_compile import CompileRequest

__all__ = [
    "CompileRequest",
    "backend_names",
    "call_counts",
    "is_compilable",
    "register_backend",
    "reset_calls",
]
