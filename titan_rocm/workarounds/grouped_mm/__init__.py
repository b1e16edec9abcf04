"""Grouped-MM binding: point the live model's MoE experts at a chosen grouped-MM backend.

This package's face is the public API users extend (:func:`register_backend`) and read
(:func:`call_counts`, :func:`layer_backends`). The workaround ``rocm.grouped_mm`` is
:mod:`.workaround`; how the binding reaches the function TorchTitan really calls,
:mod:`.binding`; the backends, :mod:`.backends`; whether the bound function runs compiled,
:mod:`.experts_compile`. Docs: docs/grouped-mm.md.
"""

from titan_rocm.workarounds.grouped_mm.backends import (
    backend_names,
    is_compilable,
    register_backend,
    reset_calls,
)
from titan_rocm.workarounds.grouped_mm.binding import (
    bind,
    bound_runner,
    call_counts,
    find_grouped_experts,
    layer_backends,
    unbind_all,
)
from titan_rocm.workarounds.grouped_mm.experts_compile import CompileRequest

__all__ = [
    "CompileRequest",
    "backend_names",
    "bind",
    "bound_runner",
    "call_counts",
    "find_grouped_experts",
    "is_compilable",
    "layer_backends",
    "register_backend",
    "reset_calls",
    "unbind_all",
]
