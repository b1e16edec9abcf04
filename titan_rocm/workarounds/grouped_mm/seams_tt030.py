"""TorchTitan 0.3.0's seam of the grouped-MM binding: each experts module's class swapped for a
cached subclass, as 0.3.0 has no module global to patch (docs/grouped-mm.md)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.workarounds.grouped_mm.backends import (
    CALLS,
    GEMM_FORMS,
    experts_function,
    is_compilable,
)
from titan_rocm.workarounds.moe_blocks import is_moe_block, mark_eager

EXPERTS_CLASS = "GroupedExperts"
BACKEND_ATTR = "_titan_rocm_backend"
"""Instance attribute of a bound experts module: the backend name."""
SEAM_ATTR = "_titan_rocm_seam"
"""Class attribute of a binding subclass: ``forward``, ``_grouped_mm`` or ``counted``."""
TRACES_IN_BLOCK = frozenset({"loop"})
"""Backends not compilable alone that still trace in a 0.3.0 block: ``capture_scalar_outputs``
turns ``loop``'s host read into unbacked sizes."""

_subclasses: dict[tuple[type, str], type] = {}


def _stock_experts_class(module: nn.Module) -> type | None:
    """TorchTitan's ``GroupedExperts`` in ``module``'s MRO (matched by name), or None."""
    for cls in type(module).__mro__:
        if cls.__name__ == EXPERTS_CLASS and cls.__module__.startswith("torchtitan."):
            return cls
    return None


def find_experts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of every TorchTitan 0.3.0 grouped-experts module."""
    return [(name, m) for name, m in model.named_modules() if _stock_experts_class(m) is not None]


def _local(param: torch.Tensor) -> torch.Tensor:
    # As the stock forward: DTensor weights (FSDP, EP, TP) run as their local shard.
    to_local = getattr(param, "to_local", None)
    return to_local() if callable(to_local) else param


def seam_for(module: nn.Module, backend: str) -> str | None:
    """Where ``backend`` goes in ``module``: ``counted``, ``forward``, ``_grouped_mm``, or None."""
    stock = _stock_experts_class(module)
    if stock is None:
        return None
    base = _unbound_class(module)
    if backend == "torch":
        return "counted"
    if base.forward is stock.forward and base._grouped_mm is stock._grouped_mm:
        return "forward"
    if backend in GEMM_FORMS and base._grouped_mm is stock._grouped_mm:
        return "_grouped_mm"
    return None


def _unbound_class(module: nn.Module) -> type:
    cls = type(module)
    while getattr(cls, SEAM_ATTR, None) is not None:
        cls = cls.__mro__[1]
    return cls


def _count(backend: str) -> None:
    """Count in eager code only: in a compiled block Dynamo guards on the count and recompiles
    until a fullgraph block fails the run."""
    if not torch.compiler.is_compiling():
        CALLS[backend] += 1


def _binding_class(base: type, seam: str) -> type:
    key = (base, seam)
    if key in _subclasses:
        return _subclasses[key]

    if seam == "forward":
        def forward(self: Any, x_RD: torch.Tensor,
                    num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
            name = self.__dict__[BACKEND_ATTR]
            _count(name)
            return experts_function(name)(_local(self.w1_EFD), _local(self.w2_EDF),
                                     _local(self.w3_EFD), x_RD, num_tokens_per_expert_E)
        body: dict[str, Any] = {"forward": forward}
    else:
        def counted_forward(self: Any, x_RD: torch.Tensor,
                            num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
            _count(self.__dict__[BACKEND_ATTR])
            return base.forward(self, x_RD, num_tokens_per_expert_E)
        body = {"forward": counted_forward}
        if seam == "_grouped_mm":
            def _grouped_mm(self: Any, *, A: torch.Tensor, B_t: torch.Tensor,
                            offs: torch.Tensor) -> torch.Tensor:
                return GEMM_FORMS[self.__dict__[BACKEND_ATTR]](A, B_t, offs)
            body["_grouped_mm"] = _grouped_mm
    # Not a new Configurable: no nested Config, so TorchTitan's checks leave it alone.
    cls = type(f"Rocm{base.__name__}", (base,), {**body, SEAM_ATTR: seam,
                                                 "__module__": __name__})
    _subclasses[key] = cls
    return cls


def bind(model: nn.Module, backend: str) -> dict[str, str]:
    """Bind every grouped-experts module to ``backend``; per module, the seam used or why not."""
    experts_function(backend)  # ValueError names the accepted backends
    done: dict[str, str] = {}
    for name, module in find_experts(model):
        seam = seam_for(module, backend)
        base = _unbound_class(module)
        if seam is None:
            module.__class__ = base
            module.__dict__.pop(BACKEND_ATTR, None)
            done[name] = (f"not covered ({base.__name__} has its own forward; backend "
                          f"{backend!r} has no one-GEMM form)")
            continue
        module.__class__ = _binding_class(base, seam)
        module.__dict__[BACKEND_ATTR] = backend
        done[name] = seam
    return done


def bound_backend(module: nn.Module) -> str | None:
    """The backend ``module`` is bound to, or None."""
    if getattr(type(module), SEAM_ATTR, None) is None:
        return None
    return module.__dict__.get(BACKEND_ATTR)


def layer_backends(model: nn.Module) -> dict[str, str]:
    """Per experts module: what it runs, read from the live modules."""
    result = {}
    for name, module in find_experts(model):
        backend = bound_backend(module)
        cls = _unbound_class(module).__name__
        if backend is None:
            result[name] = f"stock {cls}.forward (not bound)"
        else:
            seam = getattr(type(module), SEAM_ATTR)
            result[name] = backend if seam != "_grouped_mm" else f"{backend} ({cls}._grouped_mm)"
    return result


def mark_untraceable_blocks(model: nn.Module, backend: str) -> list[str]:
    """Mark eager each MoE block whose experts run ``backend`` when it cannot be traced with
    ``fullgraph=True``; return their layer ids (none for a traceable backend)."""
    if is_compilable(backend) or backend in TRACES_IN_BLOCK:
        return []
    marked = []
    why = f"grouped-MM backend {backend!r} cannot be traced inside a fullgraph block"
    for layer_id, block in getattr(model, "layers", nn.ModuleDict()).named_children():
        if not is_moe_block(block):
            continue
        if any(bound_backend(m) == backend for _, m in find_experts(block)):
            mark_eager(block, why)
            marked.append(layer_id)
    return marked


def check(model: nn.Module) -> str | None:
    """Why the binding does not fit ``model`` on 0.3.0 (None: it does)."""
    if not find_experts(model):
        return "model has no MoE blocks"
    return None


class Seam:
    """:class:`~.workaround.GroupedMMSeam` for TorchTitan 0.3.0."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    @property
    def counts_note(self) -> str:
        """What the step-1 call counts leave out."""
        return ("; calls inside compiled blocks (TorchTitan 0.3.0 compiles MoE blocks whole "
                "here) are not counted" if self.ctx.compile.model else "")

    def check(self, model: nn.Module) -> str | None:
        """Why ``model``'s experts cannot be bound (None: they can)."""
        return check(model)

    def bind(self, model: nn.Module, backend: str, why: str) -> list[str]:
        """Swap each experts module's class for a binding subclass; return the seams used."""
        patched = sorted(set(bind(model, backend).values()))
        eager = mark_untraceable_blocks(model, backend) if self.ctx.compile.model else []
        log.info(
            "titan-rocm: MoE grouped MM bound to backend %r (%s) through the experts' "
            "class (%s)%s", backend, why, ", ".join(patched),
            f"; MoE blocks {', '.join(eager)} will run eager" if eager else "",
        )
        return patched

    def layer_backends(self, model: nn.Module) -> dict[str, str]:
        """What each experts module calls."""
        return layer_backends(model)

    def experts_compile(self, backend: str) -> str:
        """How the bound experts run, for the plan."""
        return ("with their block (torchtitan 0.3.0 compiles whole blocks; a backend that "
                "cannot be traced runs its blocks eager)")
