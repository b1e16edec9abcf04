"""The ``rocm.divergence_guard`` workaround: one :class:`~.monitor.Monitor`, fed through the
job's seam (:class:`GuardSeam`)."""

from __future__ import annotations

import json
from typing import Any, Protocol

import torch.nn as nn

from titan_rocm.workarounds.base import Context, TrainerSeam, Workaround
from titan_rocm.workarounds.divergence_guard.monitor import (
    INJECT_RANK_ENV,
    INJECT_STEP_ENV,
    Injection,
    Monitor,
)

CHECKED_AT = {
    "log_steps": "log steps, checkpoint saves and the end of training (no extra sync)",
    "every_step": (
        "every optimizer step, one step late: each step's record is read at the end of the "
        "next step (or at a log step, a checkpoint save or the end of training, if sooner), "
        "once it has landed (no wait in steady state); names the first bad step exactly"
    ),
    "every_step_exact": "every optimizer step at its own end (one device sync per step)",
}
"""The plan's ``checked_at`` for each ``[rocm] divergence_check``."""


class GuardSeam(Protocol):
    """Where one TorchTitan generation lets the guard observe the loss and the grad norm."""

    loss_observed: str
    """What the plan names as the observed loss."""

    def install(self, monitor: Monitor) -> TrainerSeam | None:
        """Feed ``monitor``; return the trainer seam an adapter calls, if the generation has one."""


class DivergenceGuard(Workaround):
    """Stops training at the first non-finite loss or grad norm, on every rank."""

    name = "divergence_guard"
    needs_rocm = False
    has_seam = True
    seam: GuardSeam

    @staticmethod
    def plan_line(details: dict[str, Any]) -> str:
        return ("stops at the first non-finite loss or grad norm "
                f"(divergence_check = {json.dumps(details.get('check'))})")

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        # Read (and validate) the test hook at converter init, so a typo fails at start-up.
        self.injection = Injection.from_env()
        self.monitor: Monitor | None = None

    def apply(self, model: nn.Module) -> None:
        self.monitor = Monitor(self.ctx.settings.divergence_check, self.injection)
        self.trainer_seam = self.seam.install(self.monitor)

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        if self.monitor is not None:
            self.monitor.on_step_end()

    def plan(self, model: nn.Module) -> dict[str, Any]:
        check = self.ctx.settings.divergence_check
        details: dict[str, Any] = {
            "check": check,
            "checked_at": CHECKED_AT[check],
            "observes": [
                self.seam.loss_observed,
                "torchtitan.distributed.utils.clip_grad_norm_ (the step's grad norm)",
            ],
        }
        if self.injection is not None:
            details["test_hook"] = {
                INJECT_STEP_ENV: self.injection.step,
                INJECT_RANK_ENV: self.injection.rank,
            }
        return details
