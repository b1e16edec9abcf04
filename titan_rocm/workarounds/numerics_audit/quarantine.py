"""``numerics_audit_policy = "quarantine"``: undo the flagged micro-batch and rerun its segments
eager (docs/numerics-audit.md).

Segments go eager by patching the modules as registered, so FSDP's and TP's hooks and parameters
stay where they are."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch._dynamo.eval_frame import OptimizedModule

from titan_rocm.numerics.attribution import compiled_in_place
from titan_rocm.numerics.state import RngState

COST_STEPS = 5
"""Unaudited steps measured on each side of a quarantine for its cost line."""
BY = "numerics_audit.quarantine"
"""Who the quarantine's patches are ``by``."""


class Undo:
    """The state the audited micro-batch starts from; calling it puts that state back."""

    def __init__(self, model_parts: list[nn.Module], device: torch.device,
                 extra: Callable[[], None] | None = None) -> None:
        params = [p for m in model_parts for p in m.parameters()]
        # At a step's first micro-batch the gradients are usually None (zero_grad sets them
        # so): then nothing is copied.
        self.grads = [(p, None if p.grad is None else p.grad.detach().clone())
                      for p in params]
        self.buffers = [(b, b.detach().clone()) for m in model_parts for b in m.buffers()]
        self.rng = RngState(device)
        self.extra = extra

    def __call__(self) -> None:
        for p, g in self.grads:
            p.grad = None
            p.grad = g
        with torch.no_grad():
            for b, value in self.buffers:
                b.copy_(value)
        self.rng.restore()
        if self.extra is not None:
            self.extra()


@dataclass(frozen=True)
class Switch:
    """One patch that makes compiled code of a segment run eager."""

    owner: Any
    name: str
    make: Callable[[Any], Any]
    what: str
    """The compiled thing, for the log (``layers.3``, ``loss_fn``)."""


def _module_switches(prefix: str, module: nn.Module) -> list[Switch]:
    found: list[Switch] = []
    for name, m in module.named_modules(prefix=prefix):
        if isinstance(m, OptimizedModule):
            found.append(Switch(m, "forward", lambda _orig, m=m: m._orig_mod.__call__, name))
        elif compiled_in_place(m):
            found.append(Switch(m, "_compiled_call_impl", lambda _orig: None, name))
    return found


def _compiled_function(fn: Any) -> Any:
    return getattr(fn, "_torchdynamo_orig_callable", None)


def eager_switches(model_parts: list[nn.Module], trainer: Any, segment: str) -> list[Switch]:
    """The patches that make ``segment`` (a ``model.layers`` key, ``embedding`` or ``head``) eager;
    empty when nothing of it is compiled."""
    found: list[Switch] = []
    for part in model_parts:
        children = list(part.named_children())
        names = [n for n, _ in children]
        if "layers" not in names:
            continue
        at = names.index("layers")
        if segment in ("embedding", "head"):
            side = children[:at] if segment == "embedding" else children[at + 1:]
            for name, child in side:
                found += _module_switches(name, child)
        else:
            layers = part.get_submodule("layers")
            if segment in layers._modules:
                found += _module_switches(f"layers.{segment}", layers._modules[segment])
    if segment == "head" and trainer is not None:
        loss_fn = getattr(trainer, "loss_fn", None)
        eager = _compiled_function(loss_fn)
        if eager is not None:  # TorchTitan 0.2.2: trainer.loss_fn = torch.compile(fn)
            found.append(Switch(trainer, "loss_fn", lambda _orig, e=eager: e, "loss_fn"))
        inner = getattr(loss_fn, "fn", None)
        eager = _compiled_function(inner)
        if eager is not None:  # TorchTitan 0.3.0: BaseLoss.fn = torch.compile(fn)
            found.append(Switch(loss_fn, "fn", lambda _orig, e=eager: e, "loss_fn.fn"))
    return found


def label(segment: str) -> str:
    """``block 3`` for a ``model.layers`` key, ``embedding`` / ``head`` as they are."""
    return segment if segment in ("embedding", "head") else f"block {segment}"


@dataclass
class StepClock:
    """Each step's wall time (from one step's first micro-batch to the next's), and whether
    an audit or a redo touched it: the cost line compares unaudited steps only."""

    before: deque[float] = field(default_factory=lambda: deque(maxlen=COST_STEPS))
    after: list[float] = field(default_factory=list)
    started: float | None = None
    touched: bool = False
    measuring: list[str] = field(default_factory=list)
    """The segments quarantined whose cost is still being measured."""
    frozen: list[float] | None = None
    """``before`` as it stood at the first quarantine being measured."""

    def step_begins(self) -> None:
        """A step's first micro-batch begins: the previous step has ended."""
        now = time.perf_counter()
        if self.started is not None and not self.touched:
            (self.after if self.measuring else self.before).append(now - self.started)
        self.started = now
        self.touched = False

    def quarantined(self, segment: str) -> None:
        """``segment`` was quarantined in the step under way."""
        self.touched = True
        if not self.measuring:
            self.frozen = list(self.before)
            self.after = []
        self.measuring.append(segment)

    def measured(self) -> tuple[list[str], list[float], list[float]] | None:
        """Once enough unaudited steps ran after the quarantine: the segments, the step
        times before and after (then measuring stops); None before that."""
        if not self.measuring or len(self.after) < COST_STEPS:
            return None
        segments, before, after = self.measuring, self.frozen or [], self.after
        self.measuring, self.frozen, self.after = [], None, []
        self.before.clear()
        self.before.extend(after[-COST_STEPS:])
        return segments, before, after


def mean(values: list[float]) -> float:
    """The mean of ``values`` (0 for none)."""
    return sum(values) / len(values) if values else 0.0


def synchronize(device: torch.device) -> None:
    """Wait for the device (a timed pass measures its kernels, not their launch)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
