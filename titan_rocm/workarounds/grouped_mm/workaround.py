"""``rocm.grouped_mm``: MoE experts on a chosen grouped-MM backend (docs/grouped-mm.md)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import torch.nn as nn

from titan_rocm.log import log, log_once
from titan_rocm.workarounds.base import Context, Workaround
from titan_rocm.workarounds.grouped_mm.backends import (
    AUTO,
    FP8,
    FP8_FORMS,
    backend_names,
    call_counts,
    primus_turbo_fp8_status,
    primus_turbo_status,
    resolve,
    validate_name,
)

QUANTIZED_EXPERTS_CONVERTERS = ("quantize.grouped_mm.float8", "quantize.grouped_mm.mx")
"""TorchTitan converters that quantize the experts by swapping their weights for torchao
tensors that intercept ``torch._grouped_mm``: only the ``torch`` backend goes through it."""


FLOAT8_EXPERTS = "quantize.grouped_mm.float8"
"""TorchTitan's float8 grouped-MM converter (0.3.0's ``Float8`` experts are named so too)."""
FP8_ROUTE = "Primus-Turbo's grouped_gemm_fp8 (E4M3, tensorwise dynamic scaling)"


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
    audit_shapes = "moe"

    @staticmethod
    def plan_line(details: dict[str, Any]) -> str:
        return f"MoE experts call the {details.get('backend', '?')} grouped-MM backend"
    seam: GroupedMMSeam

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.requested = ctx.settings.grouped_mm_backend
        validate_name(self.requested)  # ValueError names the value and accepted names
        self.backend, self.why = resolve(self.requested, ctx.platform.is_rocm, ctx.platform)
        self.precision, self.precision_why = "bf16", "BF16 GEMMs"
        self._fp8_unmet: str | None = None
        quantized = quantized_experts_converters(ctx.converters)
        if self.mode != "off":
            self._choose_precision(quantized)
            wanted_on = self._fp8_unmet is not None and self.mode == "on"  # unmet() says why
            if quantized and self.requested != "torch" and self.precision != "fp8" and not (
                    wanted_on):
                self._choose_for_quantized(quantized)
        self._patched: list[str] = []
        self._logged_counts = False

    @property
    def route(self) -> str:
        """What the experts are bound to: the backend, or ``<backend>:fp8``."""
        return self.backend + FP8 if self.precision == "fp8" else self.backend

    def _choose_precision(self, quantized: list[str]) -> None:
        """FP8 through Primus-Turbo where the experts are float8 or the setting asks and it is
        installed; otherwise why not."""
        asked = self.ctx.settings.grouped_mm_precision
        float8 = FLOAT8_EXPERTS in quantized
        if asked == "bf16" or (asked == "auto" and not float8):
            if float8:
                self.precision_why = "grouped_mm_precision = bf16"
            return
        because = (f"auto: {FLOAT8_EXPERTS} makes the experts float8" if asked == "auto"
                   else "grouped_mm_precision = fp8")
        others = [name for name in quantized if name != FLOAT8_EXPERTS]
        if self.backend not in FP8_FORMS:
            if self.requested not in (AUTO, *FP8_FORMS) and asked == "fp8":
                raise ValueError(
                    f"[rocm] grouped_mm_precision = 'fp8' runs {FP8_ROUTE} through the "
                    f"primus_turbo backend, but grouped_mm_backend = {self.requested!r}; "
                    "accepted with fp8: primus_turbo, auto")
            if asked == "fp8" or self.requested in FP8_FORMS:
                self._fp8_unmet = self.precision_why = (
                    f"{because}, but {self.why.removeprefix('auto: ')}")
            else:  # auto picked another backend: its own reason says why, nothing to require
                self.precision_why = f"{because}; the FP8 route needs primus_turbo ({self.why})"
            return
        missing = (f"{', '.join(others)} quantizes the experts itself" if others
                   else primus_turbo_fp8_status(self.ctx.platform))
        if missing is None:
            self.precision = "fp8"
            self.precision_why = f"{because}, and this Primus-Turbo has grouped_gemm_fp8"
        else:
            self._fp8_unmet = self.precision_why = f"{because}, but {missing}"

    def _precision_label(self) -> str:
        if self.precision == "fp8":
            return f"fp8: {FP8_ROUTE}"
        if self.backend == "torch" and FLOAT8_EXPERTS in self.ctx.converters:
            return "float8: torchao's, through torch._grouped_mm"
        return "bf16"

    def _say_fp8_fallback(self) -> None:
        """``auto``: the FP8 route was wanted but is not there; one line, what runs instead."""
        if self._fp8_unmet is None:
            return
        log_once("grouped_mm_fp8_unmet", logging.WARNING,
                 "titan-rocm: rocm.grouped_mm: no FP8 route through Primus-Turbo: %s; the "
                 "experts run backend %r (%s)", self._fp8_unmet, self.backend, self.why)

    def _choose_for_quantized(self, quantized: list[str]) -> None:
        names = ", ".join(quantized)
        if self.requested == AUTO:
            self.backend, self.why = "torch", f"auto: {names} quantizes through torch._grouped_mm"
        elif self.requested in ("loop", "primus_turbo"):
            no_fp8 = f" (its FP8 route is not there: {self._fp8_unmet})" if self._fp8_unmet else ""
            raise ValueError(
                f"[rocm] grouped_mm_backend = {self.requested!r} would bypass {names}, which "
                f"quantizes the experts through torch._grouped_mm{no_fp8}; accepted with it: "
                "torch, auto"
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
        if self._fp8_unmet is not None and self.mode == "on":
            # Under auto the binding applies what it would otherwise (_say_fp8_fallback).
            return f"the FP8 grouped GEMM ({FP8_ROUTE}) cannot be used: {self._fp8_unmet}"
        return None

    def check(self, model: nn.Module) -> str | None:
        return self.seam.check(model)

    def apply(self, model: nn.Module) -> None:
        self._say_fp8_fallback()
        self._patched = self.seam.bind(model, self.route, f"{self.why}; {self.precision_why}")

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
            "precision": self._precision_label(),
            "precision_why": self.precision_why,
            "primus_turbo_fp8": primus_turbo_fp8_status(self.ctx.platform) or "available",
            "accepted": backend_names(),
            "bound_in": list(self._patched),
        }
        details["experts_compile"] = self.seam.experts_compile(self.route)
        details["layers"] = self.seam.layer_backends(model)
        return details
