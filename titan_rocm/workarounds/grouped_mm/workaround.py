"""``rocm.grouped_mm``: point the live model's MoE experts at a chosen grouped-MM backend.

The binding machinery is :mod:`.binding`; the backends and their registry :mod:`.backends`;
whether the bound function runs compiled :mod:`.experts_compile`. Docs: docs/grouped-mm.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.workarounds.base import Context, Workaround
from titan_rocm.workarounds.grouped_mm.backends import (
    AUTO,
    backend_names,
    primus_turbo_status,
    resolve,
    validate_name,
)
from titan_rocm.workarounds.grouped_mm.binding import call_counts

QUANTIZED_EXPERTS_CONVERTERS = ("quantize.grouped_mm.float8", "quantize.grouped_mm.mx")
"""TorchTitan converters that quantize the experts by swapping their weights for torchao
tensors that intercept ``torch._grouped_mm``: only the ``torch`` backend goes through it."""


def quantized_experts_converters(converters: Sequence[str]) -> list[str]:
    """Those of the job's ``converters`` that quantize the MoE experts."""
    return [name for name in converters if name in QUANTIZED_EXPERTS_CONVERTERS]


class GroupedMMSeam(Protocol):
    """Where one TorchTitan generation's experts meet a backend (``seams_tt022``/``_tt030``)."""

    counts_note: str
    """What the step-1 call counts leave out ("" for nothing), appended to their log line."""

    def check(self, model: nn.Module) -> str | None:
        """Why ``model``'s experts cannot be bound (None: they can)."""

    def bind(self, model: nn.Module, backend: str, why: str) -> list[str]:
        """Bind ``backend`` (chosen for ``why``) and log it; return where it was bound."""

    def layer_backends(self, model: nn.Module) -> dict[str, str]:
        """What each experts module calls."""

    def experts_compile(self, backend: str) -> str:
        """How the bound experts run (compiled or eager), for the plan."""


class GroupedMMBinding(Workaround):
    """Binds the MoE experts' ``_run_experts_grouped_mm`` to ``[rocm] grouped_mm_backend``."""

    name = "grouped_mm"
    has_seam = True
    seam: GroupedMMSeam

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.requested = ctx.settings.grouped_mm_backend
        validate_name(self.requested)  # ValueError names the value and accepted names
        self.backend, self.why = resolve(self.requested, ctx.platform.is_rocm, ctx.platform)
        quantized = quantized_experts_converters(ctx.converters)
        if quantized and self.requested != "torch" and self.mode != "off":
            self._choose_for_quantized(quantized)
        self._patched: list[str] = []
        self._logged_counts = False

    def _choose_for_quantized(self, quantized: list[str]) -> None:
        names = ", ".join(quantized)
        if self.requested == AUTO:
            self.backend, self.why = "torch", f"auto: {names} quantizes through torch._grouped_mm"
        elif self.requested in ("loop", "primus_turbo"):
            raise ValueError(
                f"[rocm] grouped_mm_backend = {self.requested!r} would bypass {names}, which "
                "quantizes the experts through torch._grouped_mm; accepted with it: torch, auto"
            )
        else:
            log.warning(
                "titan-rocm: grouped-MM backend %r receives the experts' weights as %s made "
                "them (torchao tensors); it must handle them itself", self.requested, names,
            )

    def unmet(self) -> str | None:
        if self.backend == "primus_turbo":
            missing = primus_turbo_status(self.ctx.platform)
            if missing:
                return f"[rocm] grouped_mm_backend = \"primus_turbo\" cannot be used: {missing}"
        return None

    def check(self, model: nn.Module) -> str | None:
        return self.seam.check(model)

    def apply(self, model: nn.Module) -> None:
        self._patched = self.seam.bind(model, self.backend, self.why)

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        # One line after the first step proves from the run log which backend really ran.
        if not self._logged_counts:
            self._logged_counts = True
            log.info(
                "titan-rocm: grouped-MM backend calls after step 1: %s%s", call_counts(),
                self.seam.counts_note,
            )

    def skipped_plan(self, model: nn.Module) -> dict[str, Any]:
        # What each experts module calls, left as it is.
        if self.seam_problem():
            return {}
        layers = self.seam.layer_backends(model)
        return {"layers": layers} if layers else {}

    def plan(self, model: nn.Module) -> dict[str, Any]:
        details: dict[str, Any] = {
            "requested": self.requested,
            "backend": self.backend,
            "why": self.why,
            "primus_turbo": primus_turbo_status(self.ctx.platform) or "available",
            "accepted": backend_names(),
            "bound_in": list(self._patched),
        }
        details["experts_compile"] = self.seam.experts_compile(self.backend)
        details["layers"] = self.seam.layer_backends(model)
        return details
