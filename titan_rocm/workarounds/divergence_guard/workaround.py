"""The ``rocm.divergence_guard`` workaround: one :class:`~.monitor.Monitor`, fed by TorchTitan
0.2.2's hooks (:mod:`.hooks`) or by the 0.3.0 trainer adapter's calls (:mod:`.tt030`)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from titan_rocm.workarounds.base import TORCHTITAN_030, Context, Workaround
from titan_rocm.workarounds.divergence_guard import hooks, tt030
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


class DivergenceGuard(Workaround):
    """Stops training at the first non-finite loss or grad norm, on every rank."""

    name = "divergence_guard"
    needs_rocm = False

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        # Read (and validate) the test hook at converter init, so a typo fails at start-up.
        self.injection = Injection.from_env()
        self.monitor: Monitor | None = None

    def apply(self, model: nn.Module) -> None:
        self.monitor = Monitor(self.ctx.settings.divergence_check, self.injection)
        if self.ctx.framework == TORCHTITAN_030:
            self.trainer_seam = tt030.TrainerGuard(self.monitor)
        else:
            hooks.install(self.monitor)

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        if self.monitor is not None:
            self.monitor.on_step_end()

    def plan(self, model: nn.Module) -> dict[str, Any]:
        check = self.ctx.settings.divergence_check
        details: dict[str, Any] = {
            "check": check,
            "checked_at": CHECKED_AT[check],
            "observes": [
                "Trainer.forward_backward_step's loss (each micro-batch)"
                if self.ctx.framework == TORCHTITAN_030 else
                "torchtitan.components.loss.cross_entropy_loss (each micro-batch's loss)",
                "torchtitan.distributed.utils.clip_grad_norm_ (the step's grad norm)",
            ],
        }
        if self.injection is not None:
            details["test_hook"] = {
                INJECT_STEP_ENV: self.injection.step,
                INJECT_RANK_ENV: self.injection.rank,
            }
        return details
