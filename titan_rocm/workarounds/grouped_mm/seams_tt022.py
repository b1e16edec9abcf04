"""TorchTitan 0.2.2's seam of the grouped-MM binding: the module global
``_run_experts_grouped_mm`` the experts call (:mod:`.binding`), compiled on its own
(:mod:`.experts_compile`)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.workarounds.grouped_mm.binding import (
    bind,
    find_gpt_oss_experts,
    find_grouped_experts,
    layer_backends,
)
from titan_rocm.workarounds.grouped_mm.experts_compile import CompileRequest, static_reason


class Seam:
    """:class:`~.workaround.GroupedMMSeam` for TorchTitan 0.2.2."""

    counts_note = ""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def check(self, model: nn.Module) -> str | None:
        """Why ``model``'s experts cannot be bound (None: they can)."""
        experts = find_grouped_experts(model)
        if not experts:
            if find_gpt_oss_experts(model):
                return "gpt_oss experts have their own grouped-MM function (not covered)"
            return "model has no MoE blocks"
        if not any(m.use_grouped_mm for _, m in experts):
            return (
                "MoE experts use TorchTitan's for-loop path (moe_args.use_grouped_mm = false; "
                "TorchTitan sets it on devices below CUDA capability 9.0)"
            )
        return None

    def compile_request(self) -> CompileRequest:
        """How the experts function should run, from the job (after its decisions)."""
        return CompileRequest.from_context(self.ctx)

    def bind(self, model: nn.Module, backend: str, why: str) -> list[str]:
        """Bind ``backend`` in every experts module's globals; return the names patched."""
        patched = bind(model, backend, self.compile_request())
        log.info("titan-rocm: MoE grouped MM bound to backend %r (%s) in %s",
                 backend, why, ", ".join(patched))
        return patched

    def layer_backends(self, model: nn.Module) -> dict[str, str]:
        """What each experts module calls."""
        return layer_backends(model)

    def experts_compile(self, backend: str) -> str:
        """How the bound experts function runs, for the plan."""
        request = self.compile_request()
        reason = static_reason(backend, request)
        return (
            f"eager: {reason}" if reason is not None else
            f"compiled with fullgraph (backend {request.backend!r}) at the first call, as "
            "stock apply_compile compiles TorchTitan's own"
        )
