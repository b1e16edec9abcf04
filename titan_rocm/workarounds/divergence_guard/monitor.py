"""The guard's per-process state: what it observed, when it checks, and the NaN test hook
(docs/divergence-detection.md gives when each mode checks and what it costs)."""

from __future__ import annotations

import logging
import math
import os
import sys
import typing
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from titan_rocm.guard_message import Divergence, message, short_message
from titan_rocm.log import log, log_once
from titan_rocm.settings import DivergenceCheck
from titan_rocm.workarounds.divergence_guard.record import NonFiniteRecord, Row
from titan_rocm.workarounds.divergence_guard.snapshot import Snapshot
from titan_rocm.workarounds.divergence_guard.verdict import DivergenceError, decide

INJECT_STEP_ENV = "TITAN_ROCM_DEBUG_INJECT_NAN_STEP"
INJECT_RANK_ENV = "TITAN_ROCM_DEBUG_INJECT_NAN_RANK"
CHECK_MODES: tuple[str, ...] = typing.get_args(DivergenceCheck)
LAGGED = "every_step"
"""Every step, one step late: the copy enqueued at the end of step N is read at the end of
step N+1 (or at a log step, a save or the end of training, whichever comes first)."""
EXACT = "every_step_exact"
"""Every step at its own end: one wait for the device per step."""


@dataclass(frozen=True)
class Injection:
    """Test hook: make the loss NaN at ``step`` (on ``rank`` only, or on every rank)."""

    step: int
    rank: int | None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Injection | None:
        """Read :data:`INJECT_STEP_ENV` / :data:`INJECT_RANK_ENV`; None when unset.

        Raises ValueError for a value that is not a non-negative integer (step: positive)."""
        env = os.environ if environ is None else environ
        step_text = env.get(INJECT_STEP_ENV, "").strip()
        if not step_text:
            return None
        rank_text = env.get(INJECT_RANK_ENV, "").strip()
        try:
            step = int(step_text)
            rank = int(rank_text) if rank_text else None
        except ValueError:
            step, rank = 0, None
        if step < 1 or (rank is not None and rank < 0):
            raise ValueError(
                f"{INJECT_STEP_ENV}={step_text!r} {INJECT_RANK_ENV}={rank_text!r} is not valid; "
                "accepted: a step >= 1, and optionally a rank >= 0 (unset: every rank)"
            )
        return cls(step, rank)


def rank() -> int:
    """This process's global rank (0 without a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class Monitor:
    """Observes loss and grad norm on the device; checks at synchronisation points."""

    def __init__(self, check: str = "log_steps", injection: Injection | None = None) -> None:
        if check not in CHECK_MODES:
            raise ValueError(
                f"[rocm] divergence_check = {check!r} is not valid; accepted: "
                f"{', '.join(CHECK_MODES)}"
            )
        self.check_mode = check
        self.injection = injection
        self.record = NonFiniteRecord()
        self.train_state: Any = None
        """The Trainer, whose ``step`` numbers the steps; bound by ``CheckpointManager.load``."""
        self.checked_through = 0
        """``record.steps_ended`` at the latest check."""
        self.checks = 0
        """Check points run."""
        self.waits = 0
        """Check points that waited for the device (a sync the trainer did not already make)."""
        self.pending: Snapshot | None = None
        """The rows' copy enqueued at the current log step's ``should_log``."""
        self.lagged: Snapshot | None = None
        """``every_step``: the rows' copy enqueued at the end of the latest step, not read yet."""
        self.divergence: Divergence | None = None

    # -- step numbers ------------------------------------------------------------------------
    def current_step(self) -> int:
        """The step in progress: the trainer's ``step``, else steps ended so far + 1."""
        step = getattr(self.train_state, "step", None)
        if isinstance(step, int) and not isinstance(step, bool):
            return step
        return self.record.steps_ended + 1

    def _warn_once(self, key: str, text: str) -> None:
        # Once per monitor (one per training run), not once per process: tests and
        # notebooks run several.
        log_once(f"divergence_guard:{id(self)}:{key}", logging.WARNING, "%s", text)

    # -- observations (device ops only) ------------------------------------------------------
    def injecting(self, step: int | None = None) -> bool:
        """The test hook makes this rank's loss NaN at ``step`` (default: the current one)."""
        inj = self.injection
        step = self.current_step() if step is None else step
        return inj is not None and inj.step == step and inj.rank in (None, rank())

    def note_injection(self) -> None:
        """Say once that the test hook made the loss NaN."""
        assert self.injection is not None
        self._warn_once(
            "inject", f"titan-rocm: {INJECT_STEP_ENV}: loss set to NaN at step "
            f"{self.injection.step} on rank {rank()} (test hook; unset it for real training)",
        )

    def on_loss(self, loss: torch.Tensor, labels: torch.Tensor | None,
                inject: bool = True) -> torch.Tensor:
        """A micro-batch's summed loss, returned; NaN at the injected step unless ``inject`` is
        False (a trainer that observes the loss after its backward injects in the loss itself)."""
        if not torch.is_grad_enabled() or self.divergence is not None:
            return loss  # validation runs under no_grad: not a training step
        if inject and self.injecting():
            # Multiply, not add: the gradients become NaN too, as in a real divergence (adding
            # a constant would leave them finite). A device op: nothing reaches the host.
            loss = loss * float("nan")
            self.note_injection()
        self.record.observe_loss(loss, labels)
        return loss

    def on_grad_norm(self, grad_norm: torch.Tensor) -> None:
        """The step's total grad norm from ``clip_grad_norm_``."""
        if self.divergence is None:
            self.record.observe_grad_norm(grad_norm)

    def on_step_end(self) -> None:
        """End of an optimizer step: fold it into the record (device ops only).

        ``every_step`` reads the previous step's copy, so it never waits; the record keeps the step
        number, so a NaN at step 7 is still named step 7."""
        if self.divergence is not None:
            return
        if not self.record.saw_grad_norm:
            self._warn_once(
                "no-grad-norm", "titan-rocm: divergence guard saw no grad norm this step "
                "(the trainer does not call torchtitan.distributed.utils.clip_grad_norm_); "
                "only the loss is checked between log steps",
            )
        step = self.current_step()
        self.record.end_step(step)
        if self.check_mode == EXACT:
            self.check(f"the end of step {step} (divergence_check = every_step_exact)")
        elif self.check_mode == LAGGED:
            previous, self.lagged = self.lagged, None
            if previous is not None:
                # Enqueued at the end of step ``previous.step``; this step's launches went in
                # behind it, so on a device at most a step behind the host it has landed.
                self.check(
                    f"the end of step {step} (divergence_check = every_step reads each step's "
                    "record at the end of the next)", snapshot=previous,
                )
            self.lagged = Snapshot.take(self.record, step, _collective_device(self.record.device))

    def _take_lagged(self) -> Snapshot | None:
        """``every_step``: the latest step's copy if it covers every step ended (consumed)."""
        snapshot, self.lagged = self.lagged, None
        if snapshot is not None and snapshot.steps_ended == self.record.steps_ended:
            return snapshot
        return None

    # -- check points (host reads: only where TorchTitan synchronises anyway) ---------------
    def on_should_log(self, step: int) -> None:
        """This step will be logged: enqueue the rows' copy before TorchTitan's ``.item()``."""
        if self.divergence is not None or self.check_mode != "log_steps":
            return  # every_step: the end of this step enqueued it (or read it: _exact)
        device = _collective_device(self.record.device)
        self.pending = Snapshot.take(self.record, step, device)

    def on_log(self, step: int, loss: float, grad_norm: float) -> None:
        """``MetricsProcessor.log`` ran (host already synchronised for these values)."""
        if self.divergence is not None:
            return
        host = None
        if not (_finite(loss) and _finite(grad_norm)):
            host = (step, loss, grad_norm)
        snapshot, self.pending = self.pending, None
        if self.check_mode == EXACT:
            # The device record was read at the end of this step; only the printed values
            # are new (a loss the guard does not observe).
            if host is not None:
                self._decide([_host_row(host)] * _world_size(), f"log step {step}")
            return
        if self.check_mode == LAGGED:
            # This step's copy, enqueued at its end: TorchTitan's .item() has waited for it.
            snapshot = self._take_lagged()
            if snapshot is None and self.record.steps_ended == self.checked_through:
                if host is not None:
                    self._decide([_host_row(host)] * _world_size(), f"log step {step}")
                return
        elif snapshot is not None and snapshot.step != step:
            snapshot = None  # taken for another step (a trainer that skipped its log)
        self.check(f"log step {step}", host=host, snapshot=snapshot)

    def on_save(self, step: int) -> None:
        """A checkpoint is about to be written: never save one from a non-finite step."""
        if self.divergence is None and self.record.steps_ended > self.checked_through:
            self.check(f"the checkpoint save at step {step}", snapshot=self._take_lagged())

    def on_close(self) -> None:
        """Training ended normally: check steps after the last check point."""
        if self.divergence is not None or sys.exc_info()[0] is not None:
            return  # another error is on its way out; a collective now could hang
        if self.record.steps_ended > self.checked_through:
            self.check("the end of training", snapshot=self._take_lagged())
        log.info(
            "titan-rocm: divergence guard: %d check(s), %d of them waited for the device "
            "(divergence_check = %s)", self.checks, self.waits, self.check_mode,
        )

    def check(self, where: str, host: tuple[int, float, float] | None = None,
              snapshot: Snapshot | None = None) -> None:
        """Read every rank's record; raise :class:`DivergenceError` if any step was bad. Collective.

        ``host``: TorchTitan's non-finite (step, loss, grad_norm), used if every device record is
        clean. ``snapshot``: the rows enqueued at ``should_log``; None gathers now (one wait)."""
        self.checks += 1
        if snapshot is None:
            snapshot = Snapshot.take(self.record, self.record.steps_ended,
                                     _collective_device(self.record.device))
        rows = snapshot.rows()
        self.waits += snapshot.waited
        self.checked_through = snapshot.steps_ended
        if host is not None and all(r.step is None for r in rows):
            rows = [_host_row(host)] * len(rows)
        self._decide(rows, where)

    def _decide(self, rows: list[Row], where: str) -> None:
        divergence = decide(rows, where)
        if divergence is None:
            return
        self.divergence = divergence
        error = DivergenceError(short_message(divergence), divergence)
        if rank() == 0:
            log.error(message(divergence))
            error.logged = True  # the stop logs the short message on the other ranks only
        raise error


def _host_row(host: tuple[int, float, float]) -> Row:
    step, loss, grad_norm = host
    return Row(step, _num(loss), _num(grad_norm))


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True  # not a number we can judge (e.g. a tensor placeholder): not evidence


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _collective_device(device: torch.device | None) -> torch.device:
    """Where a row must live for the process group's backend (NCCL/RCCL: the GPU)."""
    if device is not None:
        return device
    if (
        dist.is_available() and dist.is_initialized()
        and dist.get_backend() not in ("gloo",) and torch.cuda.is_available()
    ):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
