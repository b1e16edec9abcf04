"""``rocm.numerics_audit``: the numerics audit inside a real training run, before the optimizer
step (docs/numerics-audit.md).

Where it listens is the job's seam (:class:`AuditSeam`, ``ctx.seam("numerics_audit")``):
TorchTitan 0.2.2's (:mod:`titan_rocm.numerics.seams_tt022`, the patches below: the trainer runs
as ``__main__``, so its class cannot be patched) looks the seams up at call time as the
divergence guard's do: ``CheckpointManager.load`` (the first thing ``Trainer.train`` calls)
hands over the trainer (``states["train_state"]``), whose ``post_dataloading_process`` is then
wrapped on the instance to keep the step's first micro-batch; ``dist_utils.clip_grad_norm_``
(called after every micro-batch's backward and before ``optimizers.step``) runs the audit on
that micro-batch when one is due. TorchTitan 0.3.0's (:mod:`titan_rocm.numerics.seams_tt030`)
is a :class:`~titan_rocm.workarounds.base.TrainerSeam` the trainer adapter calls: ``attach``
wraps the same ``post_dataloading_process``, and the step's first ``forward_backward_step``
runs the audit when one is due.

The audit leaves the trajectory exactly as it was: the step's gradients are the same
tensors, every RNG stream and every buffer's value (MoE token counts feeding the expert-bias
update) are put back, the dataloader is not read and the step counter not touched.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import torch
import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.workarounds.base import TrainerSeam, Workaround

_WRAPPED = "__titan_rocm_numerics_audit__"


class AuditSeam(Protocol):
    """What the audit needs of one TorchTitan generation (:mod:`.seams`)."""

    def install(self, audit: NumericsAudit) -> TrainerSeam | None:
        """Make the generation call :meth:`NumericsAudit.attach` with the built trainer and
        :meth:`NumericsAudit.maybe_audit` after a step's first micro-batch's backward; return
        the trainer seam an adapter calls, if the generation has one."""

    def step(self, trainer: Any, labels: Any) -> Any:
        """The trainer's forward and backward of one micro-batch as a
        :data:`titan_rocm.numerics.audit.Step` (its loss denominator from ``labels``)."""


class NumericsAuditFlagged(RuntimeError):
    """``numerics_audit_policy = "stop"`` and the audit flagged: the run stops."""


class NumericsAudit(Workaround):
    """Audits the compiled gradients against eager references at the steps it is set to."""

    name = "numerics_audit"
    needs_rocm = False
    has_seam = True
    seam: AuditSeam

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.trainer: Any = None
        self.batch: tuple[dict[str, torch.Tensor], torch.Tensor] | None = None
        self.first_step: int | None = None
        self.auditing = False
        self.results: list[dict[str, Any]] = []
        """Every audit's ``to_dict`` (tests, and anyone holding the converter)."""

    def check(self, model: nn.Module) -> str | None:
        if self.ctx.parallel.pp_enabled:
            return ("pipeline parallelism is not audited (each stage holds other parameters "
                    "and its schedule splits the batch)")
        return None

    def apply(self, model: nn.Module) -> None:
        _audits[:] = [self]  # a new job in the same process: the newest audit listens
        self.trainer_seam = self.seam.install(self)

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

    def maybe_audit(self) -> None:
        """Once a step, after its first micro-batch's backward and before the gradients are
        clipped (where the seam calls it): audit that micro-batch if due."""
        trainer, batch, self.batch = self.trainer, self.batch, None
        if trainer is None or batch is None or self.auditing:
            return
        step = int(getattr(trainer, "step", 0))
        if not self.due(step):
            return
        from titan_rocm.numerics.audit import OUTSIDE, run_passes
        from titan_rocm.numerics.report import format_report
        from titan_rocm.numerics.stats import AuditSettings

        input_dict, labels = batch
        self.auditing = True
        try:
            # The divergence guard's loss wrapper sees the passes' losses too: it only asks
            # whether they are finite, as the step's own.
            result = run_passes(trainer, self.seam.step(trainer, labels), input_dict,
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


def install_tt022() -> None:
    """TorchTitan 0.2.2's seams (see the module docstring), patched once per process."""
    import torchtitan.distributed.utils as dist_utils
    from torchtitan.components.checkpoint import CheckpointManager

    _patch(CheckpointManager, "load", _wrap_load)
    _patch(dist_utils, "clip_grad_norm_", _wrap_clip)


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
            audit.maybe_audit()
        return original(*args, **kwargs)

    return clip_grad_norm_


def uninstall() -> None:
    """Restore the wrapped functions (tests)."""
    _audits.clear()
    while _originals:
        owner, attr, original = _originals.pop()
        setattr(owner, attr, original)
