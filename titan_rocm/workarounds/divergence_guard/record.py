"""A device-side, sticky record of the first step with a non-finite loss or grad norm: updates
never make the host wait; only :meth:`NonFiniteRecord.row` copies it, at check points."""

from __future__ import annotations

from dataclasses import dataclass

import torch

FIELDS: tuple[str, ...] = ("step", "loss", "grad_norm", "has_loss", "has_grad_norm")
CLEAN = -1.0
IGNORE_INDEX = -100  # torchtitan.components.loss.IGNORE_INDEX (kept here: no torchtitan import)


@dataclass(frozen=True)
class Row:
    """The host copy of a record row (one rank's first bad step)."""

    step: int | None
    """None while every step was finite."""
    loss: float | None
    """This rank's local mean loss at that step; None where this rank saw no loss (PP)."""
    grad_norm: float | None

    @classmethod
    def from_values(cls, values: list[float]) -> Row:
        """Decode a :data:`FIELDS` row."""
        step, loss, grad_norm, has_loss, has_grad_norm = values
        if step < 0:
            return cls(None, None, None)
        return cls(int(step), loss if has_loss else None, grad_norm if has_grad_norm else None)


class NonFiniteRecord:
    """Collects one step's loss and grad norm on the device; remembers the first bad step."""

    def __init__(self) -> None:
        self.device: torch.device | None = None
        self._row: torch.Tensor | None = None
        self._loss_sum: torch.Tensor | None = None
        self._tokens: torch.Tensor | None = None
        self._grad_norm: torch.Tensor | None = None
        self.steps_ended = 0
        """Host count of :meth:`end_step` calls."""
        self.last_step: int | None = None
        """Step number passed to the latest :meth:`end_step`."""
        self.saw_loss = False
        self.saw_grad_norm = False

    def _bind(self, tensor: torch.Tensor) -> None:
        if self.device is None:
            self.device = tensor.device

    def observe_loss(self, loss_sum: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        """Add one micro-batch's summed loss; with labels the step's value is the local mean (like
        TorchTitan's ``local_avg_loss``), without them the sum."""
        self._bind(loss_sum)
        loss = loss_sum.detach().to(torch.float64)
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        if labels is not None:
            tokens = (labels.detach() != IGNORE_INDEX).sum()
            self._tokens = tokens if self._tokens is None else self._tokens + tokens
        self.saw_loss = True

    def observe_grad_norm(self, grad_norm: torch.Tensor) -> None:
        """The step's total grad norm (the tensor ``clip_grad_norm_`` returned)."""
        self._bind(grad_norm)
        self._grad_norm = grad_norm.detach()
        self.saw_grad_norm = True

    def _scalar(self, value: float) -> torch.Tensor:
        # torch.full passes the value as a kernel argument: no host-to-device copy, no sync.
        return torch.full((), value, dtype=torch.float64, device=self.device)

    def end_step(self, step: int) -> None:
        """Fold the step's observations into the sticky record (device operations only)."""
        self.steps_ended += 1
        self.last_step = step
        loss, tokens, grad_norm = self._loss_sum, self._tokens, self._grad_norm
        self._loss_sum = self._tokens = self._grad_norm = None
        if self.device is None or (loss is None and grad_norm is None):
            return
        if self._row is None:
            self._row = torch.full((len(FIELDS),), CLEAN, dtype=torch.float64, device=self.device)
        if loss is not None and tokens is not None:
            loss = loss / tokens  # 0 valid tokens gives nan, as TorchTitan's own loss would
        candidate = torch.stack([
            self._scalar(float(step)),
            loss if loss is not None else self._scalar(0.0),
            grad_norm.to(torch.float64) if grad_norm is not None else self._scalar(0.0),
            self._scalar(1.0 if loss is not None else 0.0),
            self._scalar(1.0 if grad_norm is not None else 0.0),
        ])
        bad = torch.isfinite(candidate[1:3]).logical_not().any()
        first = bad & (self._row[0] < 0)
        self._row.copy_(torch.where(first, candidate, self._row))

    def row_tensor(self, device: torch.device | None = None) -> torch.Tensor:
        """The record row as a device tensor (a clean row if nothing was recorded yet)."""
        if self._row is not None:
            return self._row
        where = device or self.device or torch.device("cpu")
        return torch.full((len(FIELDS),), CLEAN, dtype=torch.float64, device=where)

    def row(self) -> Row:
        """Host copy of this rank's record: synchronises with the device."""
        return Row.from_values(self.row_tensor().tolist())
