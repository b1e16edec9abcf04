"""Grouped-MM binding: point the live model's MoE experts at a chosen grouped-MM backend
(docs/grouped-mm.md).

This package's face is the public API users extend (:func:`register_backend`) and read
(:func:`call_counts`, :func:`backend_names`), the same on every TorchTitan generation.
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
