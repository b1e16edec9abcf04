"""``rocm.numerics_audit``: the numerics audit inside a real training run, before the optimizer
step (docs/numerics-audit.md).

TorchTitan 0.2.2 seams, looked up at call time as the divergence guard's are (the trainer
runs as ``__main__``, so its class cannot be patched): ``CheckpointManager.load`` (the first
thing ``Trainer.train`` calls) hands over the trainer (``states["train_state"]``), whose
``post_dataloading_process`` is then wrapped on the instance to keep the step's first
micro-batch; ``dist_utils.clip_grad_norm_`` (called after every micro-batch's backward and
before ``optimizers.step``) runs the audit on that micro-batch when one is due.

The audit leaves the trajectory exactly as it was: the step's gradients are the same
tensors, every RNG stream and every buffer's value (MoE token counts feeding the expert-bias
update) are put back, the dataloader is not read and the step counter not touched.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.workarounds.base import TORCHTITAN_030, Workaround

_WRAPPED = "__titan_rocm_numerics_audit__"


class NumericsAuditFlagged(RuntimeError):
    """``numerics_audit_policy = "stop"`` and the audit flagged: the run stops."""


class NumericsAudit(Workaround):
    """Audits the compiled gradients against eager references at the steps it is set to."""

    name = "numerics_audit"
    needs_rocm = False

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.trainer: Any = None
        self.batch: tuple[dict[str, torch.Tensor], torch.Tensor] | None = None
        self.first_step: int | None = None
        self.auditing = False
        self.results: list[dict[str, Any]] = []
        """Every audit's ``to_dict`` (tests, and anyone holding the converter)."""

    def check(self, model: nn.Module) -> str | None:
        if self.ctx.framework == TORCHTITAN_030:
            return "the in-training audit is TorchTitan 0.2.2 only for now; run titan-rocm audit"
        if self.ctx.parallel.pp_enabled:
            return ("pipeline parallelism is not audited (each stage holds other parameters "
                    "and its schedule splits the batch)")
        return None

    def apply(self, model: nn.Module) -> None:
        import torchtitan.distributed.utils as dist_utils
        from torchtitan.components.checkpoint import CheckpointManager

        _audits[:] = [self]  # a new job in the same process: the newest audit listens
        _patch(CheckpointManager, "load", _wrap_load)
        _patch(dist_utils, "clip_grad_norm_", _wrap_clip)

    def plan(self, model: nn.Module) -> dict[str, Any]:
        s = self.ctx.settings
        when = ("before the first optimizer step" if s.numerics_audit == "first_step" else
                f"before the first optimizer step and every {s.numerics_audit_every} steps")
        return {"when": when, "policy": s.numerics_audit_policy}

    # -- the seams ----------------------------------------------------------------------

    def attach(self, trainer: Any) -> None:
        """Keep ``trainer`` and the first micro-batch of each of its steps."""
        if self.trainer is trainer:
            return
        self.trainer = trainer
        original = trainer.post_dataloading_process

        @functools.wraps(original)
        def post_dataloading_process(input_dict: Any, labels: Any) -> Any:
            if not self.auditing and self.batch is None:
                self.batch = (dict(input_dict), labels)
            return original(input_dict, labels)

        trainer.post_dataloading_process = post_dataloading_process

    def due(self, step: int) -> bool:
        """Whether the step ``step`` is audited."""
        s = self.ctx.settings
        if self.first_step is None:
            self.first_step = step
        if step == self.first_step:
            return True
        return s.numerics_audit == "every_n_steps" and step % s.numerics_audit_every == 0

    def before_clip(self) -> None:
        """At ``clip_grad_norm_``: audit the step's first micro-batch if due."""
        trainer, batch, self.batch = self.trainer, self.batch, None
        if trainer is None or batch is None or self.auditing:
            return
        step = int(getattr(trainer, "step", 0))
        if not self.due(step):
            return
        from titan_rocm.numerics.audit import OUTSIDE, run_passes, trainer_step
        from titan_rocm.numerics.report import format_report
        from titan_rocm.numerics.stats import AuditSettings

        input_dict, labels = batch
        self.auditing = True
        try:
            # The divergence guard's loss wrapper sees the passes' losses too: it only asks
            # whether they are finite, as the step's own.
            result = run_passes(trainer, trainer_step(trainer, labels), input_dict,
                                labels, AuditSettings.of(self.ctx.settings)).to_dict()
        finally:
            self.auditing = False
        result["step"] = step
        self.results.append(result)
        text = format_report(result)
        if result["verdict"] == "ok":
            log.info("titan-rocm numerics audit at step %d:\n%s", step, text)
            return
        log.warning("titan-rocm numerics audit at step %d:\n%s", step, text)
        if self.ctx.settings.numerics_audit_policy == "stop":
            origin = result.get("origin")
            where = (f"block {origin}" if origin and origin != OUTSIDE
                     else origin or "the loss")
            raise NumericsAuditFlagged(
                f"titan-rocm numerics audit flagged step {step} "
                f"({where} first wrong in the backward) and "
                '[rocm] numerics_audit_policy = "stop"'
            )


_audits: list[NumericsAudit] = []
_originals: list[tuple[Any, str, Any]] = []


def _patch(owner: Any, attr: str, make: Any) -> None:
    original = getattr(owner, attr)
    if getattr(original, _WRAPPED, False):
        return
    wrapper = make(original)
    setattr(wrapper, _WRAPPED, True)
    _originals.append((owner, attr, original))
    setattr(owner, attr, wrapper)


def _wrap_load(original: Any) -> Any:
    @functools.wraps(original)
    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        trainer = (getattr(self, "states", None) or {}).get("train_state")
        for audit in _audits:
            if trainer is not None and hasattr(trainer, "forward_backward_step"):
                audit.attach(trainer)
        return result

    return load


def _wrap_clip(original: Any) -> Any:
    @functools.wraps(original)
    def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
        for audit in _audits:
            audit.before_clip()
        return original(*args, **kwargs)

    return clip_grad_norm_


def uninstall() -> None:
    """Restore the wrapped functions (tests)."""
    _audits.clear()
    while _originals:
        owner, attr, original = _originals.pop()
        setattr(owner, attr, original)
