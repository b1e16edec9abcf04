"""Grouped-MM binding: MoE experts on a chosen backend (docs/grouped-mm.md); the public API users
extend (:func:`register_backend`) and read, the same on every TorchTitan generation."""

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
